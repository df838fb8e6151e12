"""What the negatives tables share: how a table's rows split into shard jobs, and the quality report of a table
(validity and the world's truth verdicts, overall, per negative type and per concreteness bin)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

TRUTH_VALUES = ("false", "true", "unknown")
# Concreteness bins of the quality rows: [1,2), [2,3), [3,4), [4,5] (Brysbaert's scale is 1..5).
CONCRETENESS_BINS = ((1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0))


def shard_bounds(n_rows: int, shard: int, n_shards: int) -> tuple[int, int]:
    """Row range [start, end) of shard `shard` of `n_shards` contiguous blocks."""
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is not in [0, {n_shards})")
    return n_rows * shard // n_shards, n_rows * (shard + 1) // n_shards


def _concreteness_groups(valid: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    rating = valid["concreteness"]
    groups = []
    for low, high in CONCRETENESS_BINS:
        inside = (rating >= low) & ((rating < high) if high < 5 else (rating <= high))
        groups.append((f"concreteness:[{low:g},{high:g}{']' if high == 5 else ')'}", valid[inside]))
    groups.append(("concreteness:unrated", valid[rating.isna()]))
    return groups


def negatives_report(table: pd.DataFrame, rejected: Counter[str] | None = None) -> pd.DataFrame:
    """Validity and truth counts and rates overall and per negative type (columns: module docstring)."""
    valid = table[table["valid"]]
    per_caption_valid = table.groupby("caption_id")["valid"].any()

    def truth_columns(group: pd.DataFrame) -> dict[str, float]:
        counts = group["truth"].value_counts()
        out: dict[str, float] = {}
        for value in TRUTH_VALUES:
            out[f"truth_{value}"] = int(counts.get(value, 0))
        for value in TRUTH_VALUES:
            out[f"{value}_rate"] = out[f"truth_{value}"] / len(group) if len(group) else math.nan
        return out

    overall: dict[str, Any] = {
        "group": "all",
        "captions": int(per_caption_valid.size),
        "captions_without_valid_negative": int((~per_caption_valid).sum()),
        "slots": len(table),
        "valid": len(valid),
        "valid_rate": len(valid) / len(table) if len(table) else math.nan,
        **truth_columns(valid),
    }
    for reason, count in sorted(table["reason"].value_counts().items()):
        overall[f"slots_{reason}"] = int(count)
    for reason, count in sorted((rejected or Counter()).items()):
        overall[f"rejected_{reason}"] = int(count)
    records = [overall]
    for kind, group in sorted(valid.groupby("type")):
        records.append({
            "group": kind,
            "captions": int(group["caption_id"].nunique()),
            "slots": len(group),
            "valid": len(group),
            "valid_rate": len(group) / len(valid),
            **truth_columns(group),
        })
    for group, members in _concreteness_groups(valid):
        records.append({"group": group, "captions": int(members["caption_id"].nunique()),
                        "slots": len(members), "valid": len(members),
                        "valid_rate": len(members) / len(valid) if len(valid) else math.nan,
                        **truth_columns(members)})
    summary = pd.DataFrame.from_records(records)
    counts = [c for c in summary.columns if c not in ("group", "valid_rate") and not c.endswith("_rate")]
    return summary.astype({c: "Int64" for c in counts})  # integer counts, empty where a row has none


def combine_reports(reports: dict[str, str | Path], out: str | Path) -> None:
    """One quality table over generators: every generator's report rows with a `negatives` column
    (the config name) first; written to `out` (results/tables/negatives/{dataset}/quality.csv)."""
    frames = [pd.read_csv(path).assign(negatives=name) for name, path in sorted(reports.items())]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["negatives", "group"])
    table = table[["negatives", *[c for c in table.columns if c != "negatives"]]]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
