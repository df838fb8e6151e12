"""The rules' resources and command arguments, read from the default study's dry run (conftest's
`default_dry_run`), and the DAG built without torch (what each job reads: compo.study, tests/test_study.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # dry runs of the real Snakemake


def test_a_fine_tuning_job_asks_for_its_methods_memory(default_dry_run: subprocess.CompletedProcess,
                                                      repo: Path) -> None:
    import yaml

    memory = yaml.safe_load((repo / "config" / "config.yaml").read_text())["memory_mb"]["train"]
    run = default_dry_run
    assert run.returncode == 0, run.stderr[-2000:]
    jobs = [job for job in run.stdout.split("\nrule ") if job.startswith("train:")]
    blocks = {job.split("output: ")[1].split("/checkpoint.pt")[0]: job for job in jobs}
    assert f"mem_mb={memory['c2lip']}," in blocks["results/models/c2lip/coco/seed0"]
    assert "clip-ft" not in memory and f"mem_mb={memory['default']}," in blocks["results/models/clip-ft/coco/seed0"]


def test_the_claims_job_gets_the_kinds_of_effect_in_the_configs_order(default_dry_run: subprocess.CompletedProcess,
                                                                        repo: Path) -> None:
    """effects.csv and claims.md list the kinds as the config does (binding first), not sorted by name."""
    import json
    import shlex

    import yaml

    kinds = list(yaml.safe_load((repo / "config" / "config.yaml").read_text())["effects"])
    run = default_dry_run
    assert run.returncode == 0, run.stderr[-2000:]
    command = shlex.split(next(line for line in run.stdout.splitlines() if "compo claims" in line))
    given = json.loads(command[command.index("--effects") + 1])
    assert [kind for kind, _ in given] == kinds and kinds != sorted(kinds)


def test_building_the_dag_imports_no_torch(repo: Path) -> None:
    """What common.smk imports and runs while Snakemake parses the workflow: neither torch nor scipy (the
    claims' numerics), each about a second to import, paid by every dry run and every cluster job; compo.study
    answers it all without Snakemake."""
    code = ("import sys; from compo.config import load_config; import compo.layout, compo.losses, "
            "compo.evaluate.files, compo.claim_specs, compo.data; from compo.study import Study; "
            "study = Study(load_config('config/config.yaml')); study.study_outputs(); study.figure_inputs(); "
            "study.train_inputs('fsc-clip', 'coco', 0); study.world_benchmark_outputs(); "
            "print(sorted(m for m in ('torch', 'scipy', 'snakemake') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
