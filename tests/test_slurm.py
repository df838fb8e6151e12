"""SLURM dispatch: the workflow profiles parse, and jobs really run on the localhost test cluster.

The cluster test needs the single-node cluster from ``scripts/slurm/up.sh`` and runs only with
``COMPO_TEST_SLURM=1`` (CI sets it after running up.sh). The profile dry-runs need no cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from workflow_runner import DEFAULT, SNAKEMAKE, snakemake

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "workflow" / "profiles"
MINI_WORKFLOW = Path(__file__).resolve().parent / "slurm_mini"
# The venv's snakemake: the plugin starts each job with this same interpreter.

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
    result = _snakemake(workdir, "--executor", "compo-slurm", "--workflow-profile", str(PROFILES / "slurm-test"))
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


def _study(workdir: Path, *args: str, configs: list[Path], env: dict | None = None,
           background: bool = False) -> subprocess.CompletedProcess | subprocess.Popen:
    """The workflow's Snakemake on the embedded default plus `configs`, in `workdir`."""
    return snakemake(workdir, *args, configs=[DEFAULT, *configs], cores=None, env=env, timeout=900,
                     background=background)


REQUEUE_CONFIG = """\
methods:
  clip-ft:
    train: {steps: 120, batch_size: 16, warmup: 2}
train:
  threads: 1
  checkpoint_every: 8
  log_every: 8
"""
TRAIN_TARGET = "results/models/clip-ft/coco/seed0/checkpoint.pt"


NEEDS_CLUSTER = pytest.mark.skipif(os.environ.get("COMPO_TEST_SLURM") != "1",
                                   reason="needs the localhost SLURM cluster: run scripts/slurm/up.sh as root, "
                                          "then set COMPO_TEST_SLURM=1")
# scripts/slurm/common.sh: the partition whose jobs preempt (PreemptMode=CANCEL) those of the default one
URGENT_PARTITION = os.environ.get("COMPO_SLURM_URGENT_PARTITION", "urgent")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    """The configs of the interrupted-training tests and the folder of their train job run locally without
    interruption: what a resumed run on the cluster must equal byte for byte."""
    root = tmp_path_factory.mktemp("uninterrupted")
    overlay = root / "requeue.yaml"
    overlay.write_text(REQUEUE_CONFIG)
    configs = [REPO / "tests" / "e2e" / "config.yaml", overlay]
    local = _study(root / "local", TRAIN_TARGET, "--cores", "1", configs=configs)
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    return configs, root / "local"


def _train_job_with_a_checkpoint(cluster: Path, configs: list[Path]) -> tuple[subprocess.Popen, str]:
    """The study's train job started through the workflow's executor; returned once it runs with a resume state.
    Its inputs (world, dataset, overlap, pretrain: a minute of SLURM jobs, run on the cluster by the other tests)
    are copied from the uninterrupted run, so only the train job goes through SLURM."""
    shutil.copytree(configs[-1].parent / "local", cluster, ignore=shutil.ignore_patterns("clip-ft", "locks"))
    run = _study(cluster, TRAIN_TARGET, "--executor", "compo-slurm", "--workflow-profile",
                 str(PROFILES / "slurm-test"), configs=configs, background=True)
    state = cluster / "results" / "models" / "clip-ft" / "coco" / ".seed0.resume" / "state.pt"
    deadline, job = time.monotonic() + 600, None
    while time.monotonic() < deadline and run.poll() is None:
        if state.exists():
            listed = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %k"], capture_output=True, text=True,
                                    check=True).stdout.split("\n")
            job = next((line.split()[0] for line in listed if "rule_train" in line), None)
            if job:
                break
        time.sleep(0.5)
    assert job, f"the train job was not seen running with a resume state: {run.communicate()[0][-3000:]}"
    return run, job


def _ends_as_the_uninterrupted_run(run: subprocess.Popen, job: str, cluster: Path, local: Path) -> str:
    """The workflow finishes by itself; the train job ran again under its id (requeued), resumed from its
    checkpoint, and its model equals the uninterrupted run's. Returns Snakemake's output."""
    try:
        output = run.communicate(timeout=900)[0]
    except subprocess.TimeoutExpired:  # stopped, with what it printed (an executor error goes there)
        run.kill()
        output = run.communicate()[0] or ""  # all of it: the part read before the timeout is kept
        raise AssertionError(f"the workflow did not finish in 900 s; it printed:\n{output[-5000:]}") from None
    assert run.returncode == 0, output[-5000:]
    restarts = subprocess.run(["sacct", "-j", job, "-X", "-D", "-n", "-P", "-o", "State"], capture_output=True,
                              text=True, check=True).stdout.split()
    assert "REQUEUED" in restarts and restarts[-1] == "COMPLETED", restarts
    log = (cluster / "results" / "logs" / "train" / "clip-ft" / "coco" / "seed0.log").read_text()
    assert re.search(r"resuming .*state\.pt from step [1-9]\d*", log), log[-2000:]
    model = Path(TRAIN_TARGET).parent
    for name in ("checkpoint.pt", "losses.csv"):
        assert (cluster / model / name).read_bytes() == (local / model / name).read_bytes(), name
    return output


@pytest.mark.slurm
@NEEDS_CLUSTER
def test_a_requeued_training_job_resumes_and_ends_as_an_uninterrupted_run(
        uninterrupted: tuple[list[Path], Path], tmp_path: Path) -> None:
    """`scontrol requeue` of a running train job (what SLURM does to a preempted job with --requeue where
    PreemptMode=REQUEUE): the job runs again under the same id, resumes from its checkpoint, the workflow
    finishes, and the model equals an uninterrupted local run's byte for byte."""
    configs, local = uninterrupted
    run, job = _train_job_with_a_checkpoint(tmp_path / "cluster", configs)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    _ends_as_the_uninterrupted_run(run, job, tmp_path / "cluster", local)


@pytest.mark.slurm
@NEEDS_CLUSTER
def test_a_preempted_training_job_comes_back_and_ends_as_an_uninterrupted_run(
        uninterrupted: tuple[list[Path], Path], tmp_path: Path) -> None:
    """Preemption with PreemptMode=CANCEL (scripts/slurm/slurm.conf.in): a job on the higher-priority partition
    needing the whole node cancels the running train job (PREEMPTED, final for SLURM). The workflow's executor
    (snakemake_executor_plugin_compo_slurm) requeues it, it resumes from its checkpoint, the run finishes without
    anyone's help, and the model equals an uninterrupted run's."""
    configs, local = uninterrupted
    run, job = _train_job_with_a_checkpoint(tmp_path / "cluster", configs)
    urgent = subprocess.run(["sbatch", "--parsable", "-p", URGENT_PARTITION, "--exclusive", "--mem=0",
                             "-o", str(tmp_path / "urgent.log"), "--wrap", "sleep 1"],
                            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    output = _ends_as_the_uninterrupted_run(run, job, tmp_path / "cluster", local)
    # the executor logs this when sacct shows the job PREEMPTED and `scontrol requeue` took it back
    assert re.search(rf"SLURM job {job} .*was preempted: requeued it", output), output[-3000:]
    assert _sacct([urgent])[urgent][0] == "COMPLETED"


@pytest.mark.slurm
@NEEDS_CLUSTER
def test_the_executor_finds_and_requeues_a_preempted_job_once(tmp_path: Path) -> None:
    """compo-slurm's two SLURM calls on a job the urgent partition preempted: found PREEMPTED, requeued under its
    id; asking again once it is queued (what SLURM's own requeue leaves under PreemptMode=REQUEUE) adds no copy;
    a job SLURM does not know cannot be requeued (the executor fails it for a retry)."""
    from snakemake_executor_plugin_compo_slurm import controller_state, preempted, requeue

    def submit(*args: str) -> str:
        return subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "%j.log"), *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()

    job = submit("-p", "main", "--requeue", "--mem=100", "--wrap", "sleep 60")
    try:
        deadline = time.monotonic() + 30
        while controller_state(job) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        submit("-p", URGENT_PARTITION, "--exclusive", "--mem=0", "--wrap", "sleep 1")
        deadline = time.monotonic() + 30
        while not preempted([job, "99999999"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert preempted([job, "99999999"]) == {job}, controller_state(job)
        assert requeue(job) and controller_state(job) == "PENDING"
        assert requeue(job) and not preempted([job])
        listed = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i", "-j", job], capture_output=True,
                                text=True, check=True).stdout.split()
        assert listed == [job]
        assert not requeue("99999999")
    finally:
        subprocess.run(["scancel", job], check=False, timeout=30)


def _offline_paper_study(root: Path) -> tuple[list[str], Path]:
    """config/paper.yaml reduced to a few jobs of every kind that needs an external model, on the stand-ins of
    `paper_fixtures.write_stand_in_study`. Returns the config files and the cache."""
    from paper_fixtures import write_stand_in_study

    # paper.yaml's claims compare methods this reduced study does not train (its controls need negclip)
    study = {"methods": ["clip-ft", "degla"], "benchmarks": ["sugarcrepe"], "ablations": [], "claims": []}
    configs = write_stand_in_study(root, study, methods=["clip-ft"])
    reduced = root / "reduced.yaml"
    reduced.write_text(yaml.safe_dump({"wiseft": {"methods": ["clip-ft"], "alphas": [0.0, 1.0],
                                                  "benchmarks": ["sugarcrepe"]}}))
    return [*configs, str(reduced)], root / "cache"


# One training job's kinds of job (the whole study, every kind of job, runs offline in tests/test_whole_study.py on
# the local executor; the SDXL image shards were here too)
OFFLINE_TARGETS = [
    "results/eval/degla/coco/seed0/sugarcrepe.json",                 # a base from the cache, LLM negatives
    "results/eval/wiseft-clip-ft-a0.0/coco/seed0/sugarcrepe.json",   # a WiSE-FT group job
    "results/eval/wiseft-clip-ft-a1.0/coco/seed0/sugarcrepe.json",
]


@pytest.mark.slurm
@pytest.mark.skipif(os.environ.get("COMPO_TEST_SLURM") != "1",
                    reason="needs the localhost SLURM cluster: run scripts/slurm/up.sh as root, then set "
                           "COMPO_TEST_SLURM=1")
def test_the_paper_study_runs_offline_on_slurm_from_the_prefetched_cache(tmp_path: Path) -> None:
    """Every job of the reduced paper study runs on the cluster with the network refused (any connection or
    lookup beyond this machine raises and is logged, in every Python process the jobs start) and reads its
    models from the cache `compo prefetch` laid out; the WiSE-FT interpolations and their evaluations run as one
    group job."""
    configs, cache = _offline_paper_study(tmp_path)
    from paper_fixtures import offline_env

    attempts, env = tmp_path / "network-attempts.log", offline_env(tmp_path)
    run = snakemake(tmp_path, *OFFLINE_TARGETS, "--executor", "compo-slurm", "--workflow-profile",
                    str(PROFILES / "slurm-test"), configs=configs, cores=None, env=env, timeout=1500)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert not attempts.exists(), attempts.read_text()
    assert not (tmp_path / "empty-hf-home").exists()  # no hub library made a cache of its own
    # the base was exported from the prefetched weights, the LLM and the pipeline read from the cache
    from compo.artifacts import read_manifest

    manifest = read_manifest(cache)["artifacts"]
    weights = cache / manifest["open_clip:compo-test/tiny-clip"]["path"]
    from safetensors.torch import load_file

    base = torch.load(tmp_path / "results" / "models" / "base-clip" / "tiny" / "seed0" / "checkpoint.pt",
                      weights_only=True)
    assert all(torch.equal(base[k], v) for k, v in load_file(str(weights)).items())
    for target in OFFLINE_TARGETS[:3]:
        assert json.loads((tmp_path / target).read_text())["metrics"], target
    assert re.search(r"Group job wiseft|group_wiseft", output + "".join(
        p.name for p in (tmp_path / ".snakemake" / "slurm_logs").glob("*"))), "no WiSE-FT group job was submitted"


def test_the_executor_requeues_only_what_the_controller_also_holds_preempted() -> None:
    """Accounting (sacct) lags the controller: a job SLURM already restarted can still read PREEMPTED there, and
    requeueing it would kill it. Only a job the controller too holds PREEMPTED, or no longer knows, is requeued."""
    from snakemake_executor_plugin_compo_slurm import PREEMPTED, requeue_needed

    assert requeue_needed(PREEMPTED, PREEMPTED) and requeue_needed(PREEMPTED, None)
    assert not requeue_needed(PREEMPTED, "RUNNING") and not requeue_needed(PREEMPTED, "PENDING")
    assert not requeue_needed("RUNNING", None)


def test_without_the_slurm_commands_the_executor_names_the_one_missing(tmp_path: Path, monkeypatch) -> None:
    from snakemake_executor_plugin_compo_slurm import SlurmToolMissing, controller_state, preempted, requeue

    monkeypatch.setenv("PATH", str(tmp_path))  # a host without the SLURM client commands
    assert preempted(["12345"]) == set() and controller_state("12345") is None  # queries: left to the next check
    with pytest.raises(SlurmToolMissing, match="scontrol is not on the PATH of this host"):
        requeue("12345")


def test_the_executors_first_status_check_finds_no_job_and_needs_no_rate_limiter() -> None:
    """The executor interface starts its polling thread before it sets `status_rate_limiter`; a check that finds
    no active job (the first ones: nothing is submitted before the constructor returns) must not use it. It did,
    and under load the thread died on the missing attribute, leaving the run waiting forever (CI on b36ff32)."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from snakemake_executor_plugin_compo_slurm import Executor

    executor = object.__new__(Executor)  # as the polling thread sees it, before the constructor's end
    executor.workflow = SimpleNamespace(executor_settings=SimpleNamespace(init_seconds_before_status_checks=1))
    executor.logger = logging.getLogger("compo-slurm-test")
    assert not hasattr(executor, "status_rate_limiter")

    async def check() -> list:
        return [job async for job in executor.check_active_jobs([])]

    assert asyncio.run(check()) == []
