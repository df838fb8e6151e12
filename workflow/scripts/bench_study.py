"""Cost of a whole study from a clean results folder, and what its controls measured.

    .venv/bin/python workflow/scripts/bench_study.py [--configfile config/quick.yaml] [--cores 2]
        [--results /tmp/study-results] [--keep]

Runs `snakemake --cores N` under `/usr/bin/time -v` in a fresh results folder (config key `results`
pointed there, so the checkout's own results/ are untouched) and prints: wall time, the peak RSS of the
largest process (GNU time's "Maximum resident set size" covers the waited-for children), the CPU time per
rule summed from the `benchmark:` files (cpu_time column) with the job count, and the controls' rows of
the claims table (the positive control's effect is reported here, never asserted in a test).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]


def stage_cpu(results: Path) -> pd.DataFrame:
    """CPU seconds and wall seconds per rule, from every benchmark TSV under results/timing/."""
    rows = []
    for path in sorted((results / "timing").rglob("*.tsv")):
        rule = path.relative_to(results / "timing").parts[0]
        table = pd.read_csv(path, sep="\t")
        rows.append({"stage": rule, "cpu_s": float(table["cpu_time"].iloc[-1]), "wall_s": float(table["s"].iloc[-1])})
    frame = pd.DataFrame(rows, columns=["stage", "cpu_s", "wall_s"])
    summary = frame.groupby("stage").agg(jobs=("cpu_s", "size"), cpu_s=("cpu_s", "sum"), wall_s=("wall_s", "sum"),
                                         max_job_wall_s=("wall_s", "max"))
    return summary.sort_values("cpu_s", ascending=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", nargs="*", default=[], help="config files (default: the embedded default)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--results", default=None, help="results folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the results folder")
    args = parser.parse_args()
    results = Path(args.results or tempfile.mkdtemp(prefix="compo-study-")).resolve()
    if results.exists() and any(results.iterdir()):
        raise SystemExit(f"{results} is not empty: the benchmark starts from a clean results folder")
    results.mkdir(parents=True, exist_ok=True)
    overlay = results.parent / f"{results.name}.results.yaml"
    overlay.write_text(f"results: {results}\n")
    configs = args.configfile or [str(REPO / "config" / "config.yaml")]
    bin_dir = Path(sys.executable).parent
    command = ["/usr/bin/time", "-v", str(bin_dir / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory",
               str(REPO), "--cores", str(args.cores), "--configfile", *configs, str(overlay), "--quiet", "all"]
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    began = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-5000:] + run.stderr[-5000:])
        raise SystemExit(f"the study failed (exit {run.returncode}); results kept in {results}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr).group(1))
    stages = stage_cpu(results)
    print(f"study: {' '.join(configs)}, --cores {args.cores}, results {results}")
    print(f"wall time {wall / 60:.1f} min ({wall:.0f} s); peak RSS of the largest process {peak_kb / 1e6:.2f} GB")
    print(f"CPU time in jobs with benchmark files: {stages['cpu_s'].sum() / 60:.1f} min")
    print(stages.round(1).to_string())
    claims = results / "tables" / "claims.csv"
    if claims.exists():
        table = pd.read_csv(claims)
        controls = table[table["role"] == "control"]
        print("\ncontrols (effect in points, 95 % CI, Holm p):")
        for row in controls.itertuples():
            print(f"  {row.id}: {row.comparison} on {row.metric}: {row.effect:+.1f} [{row.ci_low:+.1f}, "
                  f"{row.ci_high:+.1f}] p={row.p_holm:.3g} -> {row.verdict}")
    if not args.keep and args.results is None:
        shutil.rmtree(results)
    overlay.unlink()


if __name__ == "__main__":
    main()
