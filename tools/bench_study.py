"""Cost of a whole study from a clean results folder, and what its controls measured.

    .venv/bin/python tools/bench_study.py [--configfile config/quick.yaml] [--cores 2]
        [--results /tmp/study-results] [--keep]

Runs `snakemake --workflow-profile workflow/profiles/local --cores N` (what scripts/study.sh runs: its memory
cap included) under `/usr/bin/time -v` in a fresh results folder (config key `results` pointed there, so the
checkout's own results/ are untouched) and prints: wall time, the peak RSS of the largest process (GNU time's
"Maximum resident set size" covers the waited-for children; a job forked from a fork server, compo.forkserver, is
not one of them: its own resource record counts), the peaks of the RSS and of the PSS summed over every process of
the run, its fork servers' and their jobs included (sampled each second; the RSS sum counts a shared page once per
process, the PSS sum splits it: the memory the run held at once) with the processes at the RSS peak, the CPU time
per rule summed from the jobs' resource records (cpu_time column, compo.resource_use) with the job count, and the
controls' rows of the claims table (the positive control's effect is reported here, never asserted in a test).

    .venv/bin/python tools/bench_study.py --summarize results

prints the same figures for a results folder that is already there (a study run in several sittings,
resumed by Snakemake): the span from the first job's start to the last job's end, the time some job
was running (the span less the pauses), the CPU time per rule, the largest job's peak RSS and an upper
bound on the peak RSS of the jobs that ran at once (their peaks summed, from each record's
wall time and modification time).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import psutil  # a dependency of snakemake

from compo.forkserver import OWNER_FILE, SERVE_FLAG
from compo_tools.timing import read_resource_records

REPO = Path(__file__).resolve().parents[1]


def rule_cpu(jobs: pd.DataFrame) -> pd.DataFrame:
    """CPU seconds and wall seconds per rule, from the jobs of `read_resource_records`."""
    summary = jobs.groupby("rule").agg(jobs=("cpu_s", "size"), cpu_s=("cpu_s", "sum"), wall_s=("wall_s", "sum"),
                                         max_job_wall_s=("wall_s", "max"))
    return summary.sort_values("cpu_s", ascending=False)


def busy_seconds(jobs: pd.DataFrame) -> float:
    """Seconds during which at least one job ran (the union of the jobs' intervals)."""
    busy, reached = 0.0, float("-inf")
    for start, end in sorted(zip(jobs["start"], jobs["end"], strict=True)):
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return busy


def concurrent_rss_bound(jobs: pd.DataFrame) -> float:
    """The largest sum of peak RSS (MB) over jobs running at the same moment: an upper bound on the
    study's peak memory (each job's peak is counted for its whole run)."""
    rss = jobs["max_rss_mb"]
    # (time, 0 = ends / 1 = starts, MB): on a tie a job that ends is counted out before one that starts
    events = sorted([(t, 1, m) for t, m in zip(jobs["start"], rss, strict=True)]
                    + [(t, 0, m) for t, m in zip(jobs["end"], rss, strict=True)])
    running = peak = 0.0
    for _, starts, mb in events:
        running += mb if starts else -mb
        peak = max(peak, running)
    return peak


class MemoryPeaks(NamedTuple):
    rss_bytes: int  # the RSS summed over the processes at its peak: shared pages counted once per process
    pss_bytes: int  # the PSS summed at its peak: each shared page split among its processes (the memory in use)
    at_rss_peak: list[tuple[str, int]]  # (command, RSS bytes) of each process at the RSS peak, largest first


def _command(process: psutil.Process) -> str:
    """The program and the `compo` subcommand or rule a process runs, for the breakdown at the peak."""
    words = [Path(w).name if i == 0 or w.startswith("/") else w for i, w in enumerate(process.cmdline())]
    return " ".join(words[:3])[:60] or process.name()


def run_processes(root: psutil.Process) -> list[psutil.Process]:
    """`root`, its descendants, and each fork server one of them owns with the server's descendants: a local run's
    jobs are its servers' children, not Snakemake's (compo.forkserver). Each process once (a forked job keeps
    its server's command line)."""
    processes = {process.pid: process for process in [root, *root.children(recursive=True)]}
    owners = set(processes)
    for server in psutil.process_iter(["cmdline"]):
        words = server.info["cmdline"] or []
        if SERVE_FLAG in words[:-1]:
            with contextlib.suppress(OSError, ValueError, psutil.Error):  # a server or folder gone meanwhile
                if int(Path(words[words.index(SERVE_FLAG) + 1], OWNER_FILE).read_text()) in owners:
                    processes |= {process.pid: process for process in [server, *server.children(recursive=True)]}
    return list(processes.values())


class TreeMemorySampler(threading.Thread):
    """The peaks of the RSS and of the PSS summed over a run's processes (`run_processes`), sampled every
    `every` seconds.

    GNU time reports the largest single process only; jobs that run at once hold the sum. A page two
    processes share (torch's libraries, a forked worker's copy-on-write heap) counts in both RSS sums, so
    the RSS sum is an upper bound; the PSS sum splits it among them and is the memory the run held."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.root, self.every = psutil.Process(pid), every
        self.peaks = MemoryPeaks(0, 0, [])
        self._done = threading.Event()

    def sample(self) -> tuple[int, int, list[tuple[str, int]]]:
        try:
            processes = run_processes(self.root)
        except psutil.NoSuchProcess:
            return 0, 0, []
        rss = pss = 0
        listing = []
        for process in processes:
            try:
                memory = process.memory_full_info()
                listing.append((_command(process), memory.rss))
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended meanwhile (a zombie is a NoSuchProcess)
                continue
            rss, pss = rss + memory.rss, pss + memory.pss
        return rss, pss, sorted(listing, key=lambda item: -item[1])

    def run(self) -> None:
        while True:  # at least one sample, however soon `stop` comes
            rss, pss, listing = self.sample()
            peaks = self.peaks
            self.peaks = MemoryPeaks(max(peaks.rss_bytes, rss), max(peaks.pss_bytes, pss),
                                     listing if rss > peaks.rss_bytes else peaks.at_rss_peak)
            if self._done.wait(self.every):
                return

    def stop(self) -> MemoryPeaks:
        """Stop sampling; the peaks."""
        self._done.set()
        self.join()
        return self.peaks


def print_summary(results: Path) -> None:
    """Span, busy time, CPU per rule, peak RSS and the controls' rows of a results folder."""
    jobs = read_resource_records(results)
    if jobs.empty:
        raise SystemExit(f"{results}/timing holds no resource records: is {results} a study's results folder?")
    span = jobs["end"].max() - jobs["start"].min()
    print(f"results {results}: {len(jobs)} jobs with resource records")
    print(f"span {span / 60:.1f} min from the first job's start to the last job's end; "
          f"some job running for {busy_seconds(jobs) / 60:.1f} min of it")
    print(f"largest job peak RSS {jobs['max_rss_mb'].max() / 1e3:.2f} GB "
          f"({Path(jobs.loc[jobs['max_rss_mb'].idxmax(), 'job']).relative_to(results)}); jobs at once: "
          f"at most {concurrent_rss_bound(jobs) / 1e3:.2f} GB (their peaks summed)")
    print_rules_and_controls(results, jobs)


def print_rules_and_controls(results: Path, jobs: pd.DataFrame) -> None:
    """CPU time per rule and the controls' rows of the claims table."""
    rules = rule_cpu(jobs)
    print(f"CPU time in jobs with resource records: {rules['cpu_s'].sum() / 60:.1f} min")
    print(rules.round(1).to_string())
    claims = results / "tables" / "claims.csv"
    if claims.exists():
        table = pd.read_csv(claims)
        controls = table[table["role"] == "control"]
        print("\ncontrols (effect in points, 95 % CI, Holm p):")
        for row in controls.itertuples():
            print(f"  {row.id}: {row.comparison} on {row.metric}: {row.effect:+.1f} [{row.ci_low:+.1f}, "
                  f"{row.ci_high:+.1f}] p={row.p_holm:.3g} -> {row.verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", nargs="*", default=[], help="config files (default: the embedded default)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--results", default=None, help="results folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the results folder")
    parser.add_argument("--summarize", metavar="RESULTS", default=None,
                        help="print the figures of a results folder that is already there; run nothing")
    args = parser.parse_args()
    if args.summarize:
        print_summary(Path(args.summarize).resolve())
        return
    results = Path(args.results or tempfile.mkdtemp(prefix="compo-study-")).resolve()
    if results.exists() and any(results.iterdir()):
        raise SystemExit(f"{results} is not empty: the benchmark starts from a clean results folder")
    results.mkdir(parents=True, exist_ok=True)
    # the overlay naming the results folder, in a folder of its own (beside `results` it was left in the checkout)
    overlay = Path(tempfile.mkdtemp(prefix="compo-bench-")) / "results.yaml"
    overlay.write_text(f"results: {results}\n")
    configs = args.configfile or [str(REPO / "config" / "config.yaml")]
    bin_dir = Path(sys.executable).parent
    profile = REPO / "workflow" / "profiles" / "local"
    command = ["/usr/bin/time", "-v", str(bin_dir / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory",
               str(REPO), "--workflow-profile", str(profile), "--cores", str(args.cores), "--configfile", *configs,
               str(overlay), "--quiet", "all"]
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    began = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as run:
        sampler = TreeMemorySampler(run.pid)
        sampler.start()
        stdout, stderr = run.communicate()
    memory = sampler.stop()
    wall = time.perf_counter() - began
    if run.returncode != 0:
        sys.stderr.write(stdout[-5000:] + stderr[-5000:])
        raise SystemExit(f"the study failed (exit {run.returncode}); results kept in {results}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr).group(1))
    jobs = read_resource_records(results)
    # GNU time sees Snakemake and the processes it waited for; a forked job's own record says its peak
    largest_gb = max(peak_kb / 1e6, jobs["max_rss_mb"].max() / 1e3 if not jobs.empty else 0.0)
    print(f"study: {' '.join(configs)}, --cores {args.cores}, results {results}")
    print(f"wall time {wall / 60:.1f} min ({wall:.0f} s); peak RSS of the largest process {largest_gb:.2f} GB; "
          f"summed over the processes running at once (sampled each second): RSS {memory.rss_bytes / 1e9:.2f} GB, "
          f"PSS {memory.pss_bytes / 1e9:.2f} GB (shared pages split); jobs at once: at most "
          f"{concurrent_rss_bound(jobs) / 1e3:.2f} GB (their peaks summed)")
    print("processes at the summed RSS peak: " + "; ".join(
        f"{command} {rss / 1e6:.0f} MB" for command, rss in memory.at_rss_peak if rss >= 50e6))
    print_rules_and_controls(results, jobs)
    if not args.keep and args.results is None:
        shutil.rmtree(results)
    overlay.unlink()


if __name__ == "__main__":
    main()
