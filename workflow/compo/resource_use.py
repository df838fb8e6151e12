"""What a job used, recorded by the job itself: wall seconds, CPU seconds and peak resident memory, one TSV per
job under `{results}/timing/` (the rule's `log.timing`, passed as `compo ... --timing`), read back per rule by
`compo plan` (measured figures) and the bench tools.

Why not Snakemake's `benchmark:` directive, which wrote these files before: it samples the job's process tree
with psutil (once a second for 30 s, then every 30 s), so a process's CPU counts as of its last sample (an
evaluation job of the stand-in study read 8.0 of its 18.5 CPU-s), and the sampling cost CPU of its own (the whole
stand-in study: 2,733 CPU-s with it, 2,379 without; docs/ci-time.md, eighth round). `getrusage` at the command's
exit is exact and costs nothing:
- CPU: user and system seconds of the process and of every child it waited for (decode workers, solvers);
- peak memory: the largest resident set one process of the job reached, a true peak, not a sample: the process's
  own `VmHWM` (/proc/self/status) or its largest child's `ru_maxrss`. Not its own `ru_maxrss`: Linux carries that
  across exec from the memory of the process it was spawned from, so a job started by Snakemake (or pytest)
  would report at least the spawner's resident set (the test suite's pytest: 5.5 GB for a 0.2 GB job). Children
  that run beside it are not added (no counter sums a process tree); Snakemake's sampled sum counted their shared
  pages once per process instead.
Under torchrun each rank records itself (`<file>.rank<r>` beside rank 0's `<file>`, as its log); a job's CPU and
memory are its ranks' summed (they share the host) and its wall time the longest rank's (a rank file older than
rank 0's start is a former run's, with more GPUs, and is left out).

A job forked from a local run's fork server (compo.forkserver) counts from its fork: its wall and CPU time leave out
the imports it did not pay; its resident set starts with the server's memory it shares (~0.4 GB of imported
modules), so a small job's peak reads as a fresh process's that imported them all (the stand-in study's dataset
jobs: 421 MB, 133 MB as their own processes).

The columns keep Snakemake's names (`s`, `cpu_time` in seconds, `max_rss` in MB) so the benchmark files of a run
measured by earlier versions still read.
"""

from __future__ import annotations

import csv
import glob
import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from compo.layout import TIMING_DIR, rank_path, timing_rule

COLUMNS = ("s", "cpu_time", "max_rss")


def process_age_s() -> float:
    """Seconds since this process started (Linux's /proc), so a record's wall time counts the interpreter's start
    and imports, as Snakemake's did."""
    with open("/proc/self/stat") as handle:
        after_name = handle.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
    started_ticks = int(after_name[19])  # field 22, starttime: clock ticks after boot
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")


def own_peak_kb() -> int:
    """This process's peak resident set since its exec, in kB (`VmHWM`; see the module's note on `ru_maxrss`)."""
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:"))


def write_use(path: str | Path) -> None:
    """Record the use of this process since it started, with its waited-for children's, at `path` (its rank's)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    peak_mb = max(own_peak_kb(), children.ru_maxrss) / 1024
    out = rank_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\t".join(COLUMNS) + "\n" + f"{process_age_s():.4f}\t{cpu:.2f}\t{peak_mb:.2f}\n")


@dataclass(frozen=True)
class JobUse:
    """One job's record (its ranks' together)."""

    rule: str
    job: str           # the record's path (rank 0's)
    wall_s: float
    cpu_s: float
    max_rss_mb: float
    end: float         # epoch seconds: when the record was written (the job's end)


def _row(path: Path) -> dict[str, float]:
    """The record's figures; a figure Snakemake's benchmark files hold as NA (a job too short to sample) is 0."""
    with path.open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    missing = set(COLUMNS) - set(rows[0] if rows else {})
    if missing:
        raise ValueError(f"{path}: not a job's resource record (expected the columns {', '.join(COLUMNS)} and a row;"
                         f" missing {sorted(missing)})")

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            return 0.0
        return value if math.isfinite(value) else 0.0

    return {column: number(rows[-1][column]) for column in COLUMNS}  # the last row: a `repeat()` benchmark's


def read_uses(results: str | Path) -> list[JobUse]:
    """Every job's record under `{results}/timing/`, in path order (empty when the folder is absent)."""
    timing = Path(results) / TIMING_DIR
    uses = []
    for path in sorted(timing.rglob("*.tsv")) if timing.is_dir() else []:
        ranks = sorted(path.parent.glob(f"{glob.escape(path.name)}.rank*"))
        rows, end = [_row(path)], path.stat().st_mtime
        started = end - rows[0]["s"]  # rank 0's start: a rank file older is a former run's
        rows += [_row(rank) for rank in ranks if rank.stat().st_mtime >= started]
        uses.append(JobUse(rule=timing_rule(path.relative_to(timing).parts), job=str(path),
                           wall_s=max(row["s"] for row in rows), cpu_s=sum(row["cpu_time"] for row in rows),
                           max_rss_mb=sum(row["max_rss"] for row in rows), end=end))
    return uses
