"""SLURM dispatch: the workflow profiles parse, and jobs really run on the localhost test cluster.

The cluster test needs the single-node cluster from ``scripts/slurm/up.sh`` and runs only with
``COMPO_TEST_SLURM=1`` (CI sets it after running up.sh). The profile dry-runs need no cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "workflow" / "profiles"
MINI_WORKFLOW = Path(__file__).resolve().parent / "slurm_mini"
# The venv's snakemake: the plugin starts each job with this same interpreter.
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
RUN_TIMEOUT_S = 240


def _copy_mini_workflow(tmp_path: Path) -> Path:
    workdir = tmp_path / "mini"
    shutil.copytree(MINI_WORKFLOW, workdir)
    return workdir


def _snakemake(workdir: Path, *args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(SNAKEMAKE), *args], cwd=workdir, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["local", "slurm", "slurm-test"])
def test_profile_is_accepted_by_snakemake_and_plugin(profile: str, tmp_path: Path) -> None:
    # A dry-run parses every profile key as a command-line option of the installed Snakemake and
    # slurm plugin, so a misspelled or renamed option fails here ("unrecognized arguments").
    workdir = _copy_mini_workflow(tmp_path)
    result = _snakemake(workdir, "-n", "--workflow-profile", str(PROFILES / profile), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    gpu_job = re.search(r"rule gpu_check:.*?resources: ([^\n]*)", result.stdout, re.S)
    assert gpu_job, result.stdout
    assert "gpu=1" in gpu_job.group(1)
    if profile != "local":
        assert "slurm_partition=" in gpu_job.group(1) and "slurm_account=" in gpu_job.group(1)


def _job_id(text: str) -> str:
    ids = re.findall(r"^job=(\d+)$", text, re.M) or re.findall(r"job=(\d+) ", text)
    assert ids, f"no SLURM job id recorded in {text!r}: the job did not run inside SLURM"
    return ids[-1]


def _sacct(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """JobID -> (State, AllocTRES) for the given allocations, from the accounting database."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,AllocTRES"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return {job_id: (state, tres) for job_id, state, tres in rows}


@pytest.mark.slurm
@pytest.mark.skipif(
    os.environ.get("COMPO_TEST_SLURM") != "1",
    reason="needs the localhost SLURM cluster: run scripts/slurm/up.sh as root, then set COMPO_TEST_SLURM=1",
)
def test_mini_workflow_runs_on_slurm_with_a_gpu_job(tmp_path: Path) -> None:
    if shutil.which("sbatch") is None or shutil.which("sacct") is None:
        pytest.fail("COMPO_TEST_SLURM=1 but sbatch/sacct are not installed: run scripts/slurm/up.sh first")
    # Fail fast with the reason, rather than letting sbatch retry an absent controller.
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("sinfo timed out: the SLURM controller is not answering; run scripts/slurm/up.sh")
    if not re.search(r"^(idle|mixed|allocated)", states.stdout, re.M):
        pytest.fail(
            f"no usable SLURM node (sinfo: {states.stdout.strip()!r} {states.stderr.strip()!r}); "
            "run scripts/slurm/up.sh"
        )
    workdir = _copy_mini_workflow(tmp_path)
    result = _snakemake(workdir, "--executor", "slurm", "--workflow-profile", str(PROFILES / "slurm-test"))
    log = result.stdout + result.stderr
    assert result.returncode == 0, log

    numbers = (workdir / "results" / "numbers.txt").read_text()
    gpu = (workdir / "results" / "gpu.txt").read_text()
    summary = (workdir / "results" / "summary.txt").read_text()
    assert [int(x) for x in numbers.split() if x.isdigit()] == list(range(1, 11))
    assert "sum=55" in summary and gpu.strip() in summary  # summary really read both upstream outputs
    # Slurm exports CUDA_VISIBLE_DEVICES only to a job that was allocated the GPU gres.
    assert re.search(r"cuda=\d", gpu), f"gpu_check ran without an allocated GPU: {gpu!r}"

    ids = {"numbers": _job_id(numbers), "gpu_check": _job_id(gpu), "summary": _job_id(summary)}
    assert len(set(ids.values())) == 3, ids
    # slurmctld hands finished jobs to slurmdbd asynchronously: allow it a few seconds.
    deadline = time.monotonic() + 20
    while True:
        accounting = _sacct(list(ids.values()))
        if all(accounting.get(i, ("",))[0] == "COMPLETED" for i in ids.values()):
            break
        assert time.monotonic() < deadline, f"jobs {ids} not all COMPLETED in sacct: {accounting}"
        time.sleep(1)
    assert "gres/gpu=1" in accounting[ids["gpu_check"]][1], accounting
    assert "gres/gpu" not in accounting[ids["numbers"]][1], accounting
