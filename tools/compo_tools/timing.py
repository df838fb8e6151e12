"""The Snakemake benchmark files of a run (`{results}/timing/`, each rule's `benchmark:`) as one table: what
the bench scripts (`tools/bench_memory.py`, `bench_study.py`) summarise per rule."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from compo.io import ContractError
from compo.layout import TIMING_DIR, timing_rule


def read_benchmark_files(results: str | Path) -> pd.DataFrame:
    """One row per job with a Snakemake `benchmark:` file under `{results}/timing/`: the rule that wrote it,
    the file, wall and CPU seconds, peak RSS (MB) and start/end (epoch seconds; the end is the file's
    modification time, since Snakemake writes the file when the job ends)."""
    timing = Path(results) / TIMING_DIR
    rows = []
    for path in sorted(timing.rglob("*.tsv")):
        table = pd.read_csv(path, sep="\t")
        missing = {"s", "cpu_time", "max_rss"} - set(table.columns)
        if missing or table.empty:
            raise ContractError(f"{path}: not a Snakemake benchmark file (expected columns s, cpu_time, max_rss "
                                f"and one row per run; missing {sorted(missing)})")
        end = path.stat().st_mtime
        wall = float(table["s"].iloc[-1])  # the last row (a `repeat()` benchmark writes one per run)
        rows.append({"rule": timing_rule(path.relative_to(timing).parts), "job": str(path), "wall_s": wall,
                     "cpu_s": float(table["cpu_time"].iloc[-1]), "max_rss_mb": float(table["max_rss"].iloc[-1]),
                     "start": end - wall, "end": end})
    return pd.DataFrame(rows, columns=["rule", "job", "wall_s", "cpu_s", "max_rss_mb", "start", "end"])
