"""Snakemake executor `compo-slurm` (issue 44): the SLURM executor plugin, with preempted jobs brought back.

snakemake-executor-plugin-slurm 2.8.0 counts a job SLURM reports PREEMPTED as still running ("we leave it to SLURM
to resume"). That holds where the cluster's PreemptMode is REQUEUE: SLURM puts the job back in the queue itself.
Where it is CANCEL, PREEMPTED is final: the run would wait for that job forever. This executor is the plugin
(same options, prefixed `compo-slurm-` instead of `slurm-`) plus one step after each status check:

- the jobs the plugin still counts as active are looked up once more (one `sacct`, `squeue` without accounting);
- a PREEMPTED one is put back with `scontrol requeue <id>`: it keeps its job id, so the plugin follows it as
  before, no retry is spent, and it starts again as soon as SLURM allows (a training job resumes from its last
  checkpoint, train.checkpoint_every);
- if SLURM cannot requeue it (its record purged after MinJobAge, requeueing refused) and has not requeued it
  itself, the job is reported failed and Snakemake's `--retries` submit it again.

Why this and not the alternatives: reporting every PREEMPTED job as failed would, under PreemptMode=REQUEUE, run
the job twice (SLURM's requeued copy and Snakemake's resubmission writing the same outputs); `scontrol requeue`
of a job SLURM has already requeued is refused, so requeueing cannot duplicate. A watcher process started beside
Snakemake (`scontrol requeue` in a loop) is one more thing to start, keep alive and point at this run's jobs;
here the process that waits on the jobs is the one that brings them back, whatever the cluster's PreemptMode.
Snakemake finds executor plugins by module name (snakemake_executor_plugin_*) on the path: this package sits
beside `compo` (workflow/), which `pip install` (editable or not) and PYTHONPATH=workflow both put there; a
Snakemake in another environment (conda, a cluster module) gets it alone from `pip install executor/` (a package of
its own linking to this folder).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncGenerator, Iterable

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings, common_settings
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

__all__ = ["Executor", "ExecutorSettings", "common_settings", "preempted", "requeue"]

PREEMPTED = "PREEMPTED"
TIMEOUT_S = 60  # a slurmctld busy scheduling answers late; one that does not answer at all must not stall the run


class SlurmToolMissing(RuntimeError):
    """A SLURM client command (sacct, squeue, scontrol) is not on the PATH of the host running Snakemake."""


def _run(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError as error:
        raise SlurmToolMissing(f"{command[0]} is not on the PATH of this host ({error.strerror}): the SLURM client "
                               "commands sacct, squeue and scontrol must be") from error


def preempted(job_ids: Iterable[str]) -> set[str]:
    """Those of `job_ids` that SLURM reports PREEMPTED (sacct, else squeue); none when neither answers, so a
    failed query leaves the jobs to the next status check."""
    ids = sorted(set(job_ids))
    if not ids:
        return set()
    queries = [["squeue", "-h", "-t", "all", "-o", "%i|%T", "-j", ",".join(ids)]]
    if shutil.which("sacct"):  # first: it still knows a job slurmctld forgot (MinJobAge)
        queries.insert(0, ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids)])
    for command in queries:  # sacct fails where accounting is off: then squeue
        try:
            result = _run(command)
        except (subprocess.TimeoutExpired, SlurmToolMissing):
            continue
        if result.returncode == 0:
            break
    else:
        return set()
    states = (line.split("|", 1) for line in result.stdout.splitlines() if "|" in line)
    return {job for job, state in states if job in ids and state.split()[:1] == [PREEMPTED]}


def controller_state(job_id: str) -> str | None:
    """The job's state as slurmctld holds it now, or None once it no longer knows the job."""
    try:
        result = _run(["squeue", "-h", "-t", "all", "-o", "%T", "-j", job_id])
    except (subprocess.TimeoutExpired, SlurmToolMissing):
        return None
    state = result.stdout.strip()
    return state if result.returncode == 0 and state else None


def requeue_needed(accounting: str, controller: str | None) -> bool:
    """Whether a job that accounting (sacct) reports `accounting` must be requeued, given what the controller
    (squeue) holds now: only when the controller too says PREEMPTED, or no longer knows it. Accounting lags the
    controller: a job SLURM already put back and restarted can still read PREEMPTED there, and requeueing it
    would kill it."""
    return accounting == PREEMPTED and controller in (None, PREEMPTED)


def requeue(job_id: str) -> bool:
    """Put a preempted job back in SLURM's queue under the same id. True when it is queued (or running) again,
    by this requeue or SLURM's own (PreemptMode=REQUEUE); False when it is gone and must be submitted anew.
    Without scontrol on PATH: SlurmToolMissing."""
    try:
        if _run(["scontrol", "requeue", job_id]).returncode == 0:
            return True
    except subprocess.TimeoutExpired:
        pass
    return controller_state(job_id) not in (None, PREEMPTED)


class Executor(SlurmExecutor):
    """The slurm plugin's executor; a job it would wait on as PREEMPTED is requeued, or failed for a retry."""

    async def check_active_jobs(
        self, active_jobs: list[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        still_active = [job async for job in super().check_active_jobs(active_jobs)]
        if not still_active:
            # The interface starts the polling thread before it sets status_rate_limiter; the first checks find
            # no job (none is submitted before the constructor returns), and touching the limiter there killed
            # the thread under load: the run then waited forever (CI, b36ff32).
            return
        async with self.status_rate_limiter:
            stopped = preempted(job.external_jobid for job in still_active)
        for job in still_active:
            if job.external_jobid not in stopped or not requeue_needed(PREEMPTED, controller_state(job.external_jobid)):
                yield job  # running, or already back in the queue (the controller knows better than accounting)
                continue
            try:
                again = requeue(job.external_jobid)
            except SlurmToolMissing as error:
                self.report_job_error(job, msg=f"SLURM job {job.external_jobid} ({job.job}) was preempted and "
                                               f"cannot be requeued: {error}",
                                      aux_logs=[str(job.aux.get("slurm_logfile"))])
                continue
            if again:
                self.logger.warning(f"SLURM job {job.external_jobid} ({job.job}) was preempted: requeued it "
                                    "(scontrol requeue); it runs again under the same id when SLURM allows.")
                yield job
            else:
                self.report_job_error(job, msg=f"SLURM job {job.external_jobid} was preempted and SLURM cannot "
                                               "requeue it: Snakemake's --retries submit it again.",
                                      aux_logs=[str(job.aux.get("slurm_logfile"))])
