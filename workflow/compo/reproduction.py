"""The seeds' reported numbers beside the study's reproduced ones (config `reported`).

A seed's number is data, not prose: config `reported` holds the seeds' tables block by block, each with its
source (seed, table), the study's metric of every column (`benchmark/metric`, or `composite/<name>` for an
average the config defines) and its rows (the seed's row label, the study's method that reproduces it, the
values in percent, null where the seed prints none). `reproduction_table` sets each cell beside the study's
seed mean and 95 % interval of that method and metric (results.csv, `compo.stats.seed_summary`), with the
difference; a cell whose method the study does not run, or whose metric it does not measure, stays in the
table with that status, so nothing declared is silently dropped.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from compo.layout import BASE_PREFIX

COMPOSITE = "composite"
CELL_COLUMNS = ["source", "row", "method", "dataset", "metric", "reported"]
TABLE_COLUMNS = [*CELL_COLUMNS, "reproduced", "ci_low", "ci_high", "difference", "n_seeds", "status"]
REPRODUCED, NOT_RUN, NOT_MEASURED, NO_METHOD = "reproduced", "method not run", "metric not measured", "no method"


def reported_cells(blocks: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per declared cell: source, row, method (None: a row the study has no method for), dataset (None:
    any the method trains on), metric and the reported value as a fraction (the config holds percent)."""
    rows = []
    for block in blocks:
        for row in block["rows"]:
            for metric, value in zip(block["metrics"], row["values"], strict=True):
                if value is None:
                    continue
                rows.append({"source": block["source"], "row": row["row"], "method": row.get("method"),
                             "dataset": row.get("dataset"), "metric": metric, "reported": float(value) / 100})
    return pd.DataFrame(rows, columns=CELL_COLUMNS)


def accumulated_reported(per_file: list[Any]) -> list[dict[str, Any]] | None:
    """`reported` over config files loaded in order: each file's blocks are appended to the earlier ones' (a
    block repeated whole is kept once), where a plain merge lets the last file's list replace the others'
    (config/released.yaml's rows for the released checkpoints dropped paper.yaml's 14 tables). None when no file
    has `reported`."""
    blocks: list[Any] = []
    seen = False
    for reported in per_file:
        if reported is None:
            continue
        seen = True
        blocks += [block for block in (reported if isinstance(reported, list) else [reported]) if block not in blocks]
    return blocks if seen else None


def check_reported(blocks: list[dict[str, Any]], methods: list[str], benchmarks: list[str],
                   composites: list[str]) -> list[tuple[str, str]]:
    """(config key, problem) for every block whose rows do not match its metrics, or that names a method, a
    benchmark or a composite the config does not define (`methods` include the bases as `base-<name>`)."""
    problems = []
    for i, block in enumerate(blocks):
        where = f"reported[{i}] ({block['source']})"
        for metric in block["metrics"]:
            benchmark, _, name = metric.partition("/")
            if benchmark == COMPOSITE and name not in composites:
                problems.append((f"{where}.metrics", f"{metric!r}: no composite {name!r} under composites"))
            elif benchmark != COMPOSITE and benchmark not in benchmarks:
                problems.append((f"{where}.metrics", f"{metric!r}: benchmark {benchmark!r} is not defined under "
                                                     f"benchmarks"))
        for j, row in enumerate(block["rows"]):
            if len(row["values"]) != len(block["metrics"]):
                problems.append((f"{where}.rows[{j}].values", f"{len(row['values'])} values for "
                                                              f"{len(block['metrics'])} metrics ({row['row']!r})"))
            method = row.get("method")
            if method is not None and method not in methods:
                problems.append((f"{where}.rows[{j}].method", f"{method!r} is not a method (or {BASE_PREFIX}<base>)"))
    return problems


def _fraction(value: Any) -> float:
    return math.nan if value is None or pd.isna(value) else float(value)


def reproduction_table(summary: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Each reported cell beside the study's mean and CI over seeds (`summary`: results.csv's rows) for its
    method, dataset (every dataset the method ran on, when the cell names none) and metric; difference =
    reproduced - reported (fractions). Status says why a cell has no reproduced value."""
    columns = summary.assign(metric=[f"{b}/{m}" if b != COMPOSITE else f"{COMPOSITE}/{m}"
                                     for b, m in zip(summary["benchmark"], summary["metric"], strict=True)])
    ran = set(columns["method"])
    rows = []
    for cell in cells.astype(object).where(cells.notna(), None).itertuples(index=False):
        base = cell._asdict()
        match = columns[(columns["method"] == cell.method) & (columns["metric"] == cell.metric)]
        if cell.dataset is not None:
            match = match[match["dataset"] == cell.dataset]
        if match.empty:
            status = NO_METHOD if cell.method is None else NOT_RUN if cell.method not in ran else NOT_MEASURED
            rows.append({**base, "reproduced": math.nan, "ci_low": math.nan, "ci_high": math.nan,
                         "difference": math.nan, "n_seeds": 0, "status": status})
            continue
        for found in match.itertuples(index=False):
            mean = _fraction(found.mean)
            rows.append({**base, "dataset": found.dataset, "reproduced": mean, "ci_low": _fraction(found.ci_low),
                         "ci_high": _fraction(found.ci_high), "difference": mean - cell.reported,
                         "n_seeds": int(found.n_seeds), "status": REPRODUCED})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _percent(value: float) -> str:
    return "" if math.isnan(value) else f"{100 * value:.1f}"


def reproduction_markdown(table: pd.DataFrame) -> str:
    """The table for people: reported, reproduced [95 % CI] and difference in points, per source."""
    if table.empty:
        return ("No reported numbers are declared (config `reported`): nothing to set beside the reproduced "
                "ones.\n")
    counts = table["status"].value_counts()
    lines = ["Each number a seed reports (config `reported`, percent) beside this study's mean over seeds with "
             "its 95 % t interval, and the difference in points (reproduced - reported). "
             + ", ".join(f"{counts[s]} {s}" for s in (REPRODUCED, NOT_MEASURED, NOT_RUN, NO_METHOD) if s in counts)
             + ".", ""]
    for source, block in table.groupby("source", sort=False):
        lines += [f"## {source}", "", "| row | method | dataset | metric | reported | reproduced [95 % CI] | "
                                      "difference | status |", "|---|---|---|---|---|---|---|---|"]
        for r in block.itertuples(index=False):
            interval = "" if math.isnan(r.ci_low) else f" [{_percent(r.ci_low)}, {_percent(r.ci_high)}]"
            difference = "" if math.isnan(r.difference) else f"{100 * r.difference:+.1f}"
            lines.append(f"| {r.row} | {_text(r.method)} | {_text(r.dataset)} | {r.metric} | {_percent(r.reported)} | "
                         f"{_percent(r.reproduced)}{interval} | {difference} | {r.status} |")
        lines.append("")
    return "\n".join(lines)
