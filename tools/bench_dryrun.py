"""Dry-run time and job count of the paper study's DAG (config/paper.yaml pointed at the test fixtures).

    .venv/bin/python tools/bench_dryrun.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from paper_fixtures import write_paper_overlay  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    with tempfile.TemporaryDirectory() as folder:
        overlay = write_paper_overlay(Path(folder))
        command = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory",
                   folder, "--configfile", str(REPO / "config" / "paper.yaml"), str(overlay), "-n", "--quiet",
                   "rules", "--cores", "2"]
        seconds, output = [], ""
        for _ in range(args.repeats):
            began = time.perf_counter()
            run = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
            seconds.append(time.perf_counter() - began)
            output = run.stdout + run.stderr
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", output, re.M)}
    counts.pop("total", None)  # Snakemake's own total line
    for rule, count in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"{rule:24s} {count:6d}")
    print(f"{'total':24s} {sum(counts.values()):6d}")
    print(f"dry-run wall time: median {statistics.median(seconds):.2f} s over {args.repeats} runs "
          f"({', '.join(f'{s:.2f}' for s in seconds)})")


if __name__ == "__main__":
    main()
