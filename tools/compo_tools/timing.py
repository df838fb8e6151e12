"""The jobs' resource records of a run (`{results}/timing/`, compo.resource_use) as one table: what the bench
scripts (`tools/bench_memory.py`, `bench_study.py`) summarise per rule."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from compo.resource_use import read_uses


def read_resource_records(results: str | Path) -> pd.DataFrame:
    """One row per job with a record under `{results}/timing/`: the rule, the record's path, wall and CPU seconds,
    peak RSS (MB) and start/end (epoch seconds; the end is when the job wrote its record)."""
    table = pd.DataFrame([asdict(use) for use in read_uses(results)],
                         columns=["rule", "job", "wall_s", "cpu_s", "max_rss_mb", "end"])
    table.insert(len(table.columns) - 1, "start", table["end"] - table["wall_s"])
    return table
