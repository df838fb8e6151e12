"""The one way the tests run the workflow: this venv's Snakemake CLI on the repository's Snakefile, in a folder of
the test's, with the config files given in order (the first is the study: config/config.yaml or config/paper.yaml).
Import as `from workflow_runner import snakemake` (pytest puts tests/ on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
DEFAULT = REPO / "config" / "config.yaml"
PAPER = REPO / "config" / "paper.yaml"
LOCAL_JOBS_PER_TIMESPAN = yaml.safe_load((REPO / "workflow" / "profiles" / "local" / "config.yaml").read_text())[
    "max-jobs-per-timespan"]


def snakemake(workdir: Path, *args: str, configs: Sequence[Path | str] = (DEFAULT,), cores: int | None = 2,
              env: dict[str, str] | None = None, timeout: float | None = None, background: bool = False,
              cwd: Path | None = None, output: Path | None = None) -> subprocess.CompletedProcess | subprocess.Popen:
    """Run Snakemake on the workflow in `workdir`: `args` (targets, options) first, then `--cores` (None: leave
    it to the profile or executor) and the config files; `env` adds to this process's environment, whose PATH
    starts with the venv's bin (jobs find `snakemake` and `python` there). `background`: a Popen whose stdout holds
    both streams, or that writes them to `output` (a run nobody reads while it goes: a pipe would fill and stall
    it). `cwd`: where Snakemake is started (default this process's)."""
    # a local run's job-start rate as workflow/profiles/local sets it (there: why); a cluster run keeps its profile's
    local = ["--cores", str(cores), "--max-jobs-per-timespan", LOCAL_JOBS_PER_TIMESPAN] if cores else []
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(workdir), *args, *local,
               "--configfile", *map(str, configs)]
    full_env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}", **(env or {})}
    if background:
        if output is None:
            return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=full_env, cwd=cwd)
        with open(output, "w") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=full_env, cwd=cwd)
    return subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=timeout, check=False,
                          cwd=cwd)
