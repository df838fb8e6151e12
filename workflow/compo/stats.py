"""Aggregating evaluations: flatten the per-model result JSONs into tables, and correlate benchmark
scores across models.

The building blocks are kept separate so later statistics reuse them:
- `load_results` -> long table, one row per (model, benchmark, metric) with value and n;
- `results_table` -> wide table, one row per model, one column per `benchmark/metric`;
- `correlation_table(frame, columns, method)` -> one row per pair of columns (Spearman or Kendall);
- `markdown_table` -> a plain Markdown rendering of any frame.
`aggregate` (the entry point of `compo aggregate`) writes results.{csv,md}, results_long.csv and
correlations.{csv,md}. CSVs hold the metric values as stored (fractions in [0, 1]); the Markdown shows
them as percentages with one decimal.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats

from compo.composites import COMPOSITE, composite_order
from compo.evaluate.kinds import Selection, kind_of
from compo.io import ContractError, read_json, write_text
from compo.layout import BASE_PREFIX, base_seed_for, eval_result_paths, is_base
from compo.layout import parse_model_id as split_model_id
from compo.provenance import check_result_checkpoint
from compo.reproduction import reported_cells, reproduction_markdown, reproduction_table

ID_COLUMNS = ["model", "method", "dataset", "seed"]
log = logging.getLogger(__name__)

CONFIDENCE = 0.95  # of every interval in the tables
MIN_MODELS = 3  # fewer points make a rank correlation meaningless (and scipy's p-value undefined)
CORRELATIONS: dict[str, Callable[..., Any]] = {
    "spearman": scipy.stats.spearmanr,
    "kendall": scipy.stats.kendalltau,
}
CORRELATION_COLUMNS = ["metric_a", "metric_b", "method", "rho", "p_value", "n", "note"]  # + ci_low, ci_high


def parse_model_id(model_id: str, where: str) -> dict[str, Any]:
    parts = split_model_id(model_id)
    if parts is None:
        raise ContractError(f"{where}: model id {model_id!r} is not of the form method/dataset/seedN")
    return {"model": model_id, "method": parts.method, "dataset": parts.dataset, "seed": parts.seed}


def _check_record(record: Any, path: str) -> None:
    if not isinstance(record, dict):
        raise ContractError(f"{path}: expected an evaluation result object")
    for key in ("model", "benchmark", "kind", "protocol", "metrics"):
        if key not in record:
            raise ContractError(f"{path}: missing key {key!r}")
    if not isinstance(record["metrics"], dict) or not record["metrics"]:
        raise ContractError(f"{path}: 'metrics' must be a non-empty object")
    for name, metric in record["metrics"].items():
        if not isinstance(metric, dict) or not isinstance(metric.get("value"), int | float) \
                or not isinstance(metric.get("n"), int):
            raise ContractError(f"{path}: metrics.{name} must be {{'value': number, 'n': integer}}")


def load_results(eval_jsons: list[str | Path]) -> pd.DataFrame:
    """Long table of every metric in every result JSON (one row per model, benchmark and metric; a model's
    evaluation index stands for its results, compo.layout.eval_result_paths, which refuses a result edited after
    its index). A result without a checkpoint sha256, or whose checkpoint sha256 is not its model folder's, is
    refused (compo.provenance.check_result_checkpoint)."""
    eval_jsons = eval_result_paths(eval_jsons)
    if not eval_jsons:
        raise ValueError("no evaluation results to aggregate")
    rows = []
    seen: dict[tuple[str, str], str] = {}
    unchecked = 0
    for path in map(str, eval_jsons):
        record = read_json(path, "evaluation result")
        _check_record(record, path)
        unchecked += not check_result_checkpoint(record, path)
        key = (record["model"], record["benchmark"])
        if key in seen:
            raise ContractError(
                f"{path}: model {key[0]!r} on benchmark {key[1]!r} already read from {seen[key]}")
        seen[key] = path
        ids = parse_model_id(record["model"], path)
        for metric, entry in record["metrics"].items():
            rows.append({**ids, "benchmark": record["benchmark"], "kind": record["kind"],
                         "protocol": record["protocol"], "metric": metric, "value": float(entry["value"]),
                         "n": entry["n"], "headline": metric == record.get("headline"), "source": path})
    if unchecked:
        log.warning("%d of %d evaluation results lie outside results/eval/<model>/ and name no model folder: their "
                    "checkpoint sha256 is not checked against one", unchecked, len(eval_jsons))
    return pd.DataFrame(rows)


def column_name(benchmark: str, metric: str) -> str:
    return f"{benchmark}/{metric}"


def results_table(long: pd.DataFrame) -> pd.DataFrame:
    """Wide table: one row per model (sorted by method, dataset, seed), one column per benchmark/metric
    (benchmarks sorted; within one, its headline metric first, then the others by name). A model
    lacking a benchmark gets NaN."""
    names = [column_name(b, m) for b, m in zip(long["benchmark"], long["metric"], strict=True)]
    long = long.assign(column=names, other=~long["headline"])
    order = list(long.sort_values(["benchmark", "other", "metric"])["column"].drop_duplicates())
    wide = long.pivot(index=ID_COLUMNS, columns="column", values="value").reset_index()
    wide = wide.sort_values(["method", "dataset", "seed"], kind="stable").reset_index(drop=True)
    wide.columns.name = None
    return wide[ID_COLUMNS + order]


def headline_columns(long: pd.DataFrame) -> list[str]:
    """The summary metric of each benchmark (the JSON's `headline`), e.g. sugarcrepe/overall."""
    heads = long.loc[long["headline"], ["benchmark", "metric"]].drop_duplicates().sort_values("benchmark")
    return [column_name(b, m) for b, m in zip(heads["benchmark"], heads["metric"], strict=True)]


def paired(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two score columns over the models that have both."""
    both = ~(np.isnan(x) | np.isnan(y))
    return x[both], y[both]


def correlation(x: np.ndarray, y: np.ndarray, names: tuple[str, str], method: str = "spearman") -> dict[str, Any]:
    """Rank correlation of two score columns (float arrays over the same models, NaN where a model lacks the
    score) over the models that have both; NaN and a note when it is undefined (fewer than MIN_MODELS models,
    or a constant column, named by `names`)."""
    if method not in CORRELATIONS:
        raise ValueError(f"unknown correlation method {method!r} (known: {', '.join(CORRELATIONS)})")
    x, y = paired(x, y)
    n = len(x)
    result = {"method": method, "rho": math.nan, "p_value": math.nan, "n": n, "note": ""}
    if n < MIN_MODELS:
        result["note"] = f"fewer than {MIN_MODELS} models with both scores (n={n})"
        return result
    constant = [name for name, column in zip(names, (x, y), strict=True) if np.unique(column).size == 1]
    if constant:
        result["note"] = f"constant across models: {', '.join(constant)}"
        return result
    statistic = CORRELATIONS[method](x, y)
    result["rho"], result["p_value"] = float(statistic[0]), float(statistic[1])
    return result


def correlation_table(frame: pd.DataFrame, columns: list[str], method: str = "spearman") -> pd.DataFrame:
    """One row per pair of `columns` (each row of `frame` is one model): metric_a, metric_b, method,
    rho, p_value, n, note."""
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise KeyError(f"no column(s) {', '.join(missing)} to correlate")
    # numpy columns, not pandas pairs: the paper study's ~3,700 pairs spent ~5 ms each in pandas' concat and
    # dropna (a whole-study ablation table: half of its aggregate job)
    scores = {column: frame[column].to_numpy(dtype=float) for column in columns}
    rows = [{"metric_a": a, "metric_b": b, **correlation(scores[a], scores[b], (a, b), method)}
            for a, b in combinations(columns, 2)]
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)


def percent(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.1f}"


def _plain(value: Any) -> str:
    if isinstance(value, float | np.floating):
        return "n/a" if math.isnan(value) else f"{value:.3g}"
    return str(value).replace("|", "\\|")


def markdown_table(frame: pd.DataFrame, formats: dict[str, Callable[[Any], str]] | None = None) -> str:
    """GitHub Markdown table; `formats` maps a column to its cell formatter (default: 3 significant
    digits for floats, str otherwise)."""
    formats = formats or {}
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    lines = [header, rule]
    for row in frame.itertuples(index=False):
        cells = [formats.get(column, _plain)(value) for column, value in zip(frame.columns, row, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def with_composites(long: pd.DataFrame, composites: dict[str, list[str]]) -> pd.DataFrame:
    """`long` plus one row per model and composite (benchmark "composite", metric = its name): the mean
    of the listed `benchmark/metric` values (a `composite/<name>` member: that composite's value, so a nested
    composite is a mean of means; compo.composites), for models that have all of them."""
    if not composites:
        return long
    values = long.set_index(["model", "benchmark", "metric"])["value"].to_dict()
    firsts = long.drop_duplicates("model").set_index("model")
    rows = []
    for name in composite_order(composites):
        members = composites[name]
        parts = [tuple(m.split("/", 1)) for m in members]
        lacking = 0
        for model, first in firsts.iterrows():
            if not all((model, b, m) in values for b, m in parts):
                lacking += 1
                continue
            value = float(np.mean([values[(model, b, m)] for b, m in parts]))
            values[(model, COMPOSITE, name)] = value  # for the composites that list this one
            rows.append({"model": model, **{c: first[c] for c in ID_COLUMNS[1:]}, "benchmark": COMPOSITE,
                         "kind": COMPOSITE, "protocol": "mean of " + ", ".join(members), "metric": name,
                         "value": value, "n": len(parts), "headline": True, "source": ""})
        if lacking:
            log.info("composite %s: not computed for %d model(s) lacking one of %s", name, lacking, members)
    return pd.concat([long, pd.DataFrame(rows, columns=long.columns)], ignore_index=True) if rows else long


@functools.lru_cache(maxsize=16)
def bootstrap_picks(n: int, draws: int, seed: int) -> np.ndarray:
    """The resampled indexes of `draws` bootstrap draws of `n` points: one rng.integers call a draw, in order.
    They depend on (n, draws, seed) only, so every pair of an aggregate with as many models shares them (the
    2,000 calls a pair were 70 % of an aggregate job; one call of shape (draws, n) draws other numbers)."""
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.integers(n, size=n) for _ in range(draws)])
    picks.flags.writeable = False
    return picks


def spearman_ci(x: Any, y: Any, draws: int = 2000, seed: int = 0,
                confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap CI of Spearman's rho, resampling the paired points (models); draws where
    either column is constant are left out. NaN when fewer than MIN_MODELS points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < MIN_MODELS:
        return math.nan, math.nan
    # every draw at once: Spearman's rho is the Pearson correlation of the average ranks. One scipy call a draw
    # cost ~0.2 s a pair: the paper study's ~3,700 benchmark pairs took ~12 minutes of the aggregate job
    picks = bootstrap_picks(len(x), draws, seed)
    xs, ys = x[picks], y[picks]
    kept = (np.ptp(xs, axis=1) > 0) & (np.ptp(ys, axis=1) > 0)
    if not kept.any():
        return math.nan, math.nan
    rx = scipy.stats.rankdata(xs[kept], axis=1)
    ry = scipy.stats.rankdata(ys[kept], axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    rhos = (rx * ry).sum(axis=1) / np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    return percentile_ci(rhos, confidence)


def headline_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Wide table for people: one row per method and dataset, one column per headline metric (composites
    first), cells 'mean ± CI half-width' in percent over the seeds."""
    heads = summary[summary["headline"]].copy()
    heads["column"] = [m if b == "composite" else column_name(b, m) for b, m in zip(heads["benchmark"],
                                                                                     heads["metric"], strict=True)]
    heads["cell"] = [_mean_ci_cell(r.mean, r.ci_low, r.ci_high) for r in heads.itertuples()]
    order = list(heads.sort_values(["benchmark"], key=lambda b: b != "composite", kind="stable")["column"]
                 .drop_duplicates())
    wide = heads.pivot(index=["method", "dataset"], columns="column", values="cell").reset_index()
    seeds = summary.groupby(["method", "dataset"])["n_seeds"].max().rename("seeds").reset_index()
    wide = wide.merge(seeds, on=["method", "dataset"])
    wide.columns.name = None
    return wide[["method", "dataset", "seeds", *order]].fillna("n/a")


def _mean_ci_cell(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(low):
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} ± {100 * (high - low) / 2:.1f}"


def aggregate(eval_jsons: list[str], out_dir: str | Path, composites: dict[str, list[str]] | None = None,
              base_seeds: list[int] | None = None, reported: list[dict[str, Any]] | None = None,
              reproduction_jsons: list[str] | None = None) -> None:
    """Write results_long.csv (every model and seed), results.csv (mean, sd and CI over seeds per method,
    dataset, benchmark and metric, composites included; over the bases' means with several `base_seeds`),
    results.md (the headline metrics, mean ± CI), correlations.{csv,md} (Spearman across methods between
    the headline metrics' seed means, bootstrap CI) and reproduction.{csv,md} (the seeds' `reported` numbers
    beside the reproduced ones, compo.reproduction, which also reads the models of `reproduction_jsons`: the
    ablations' models, which the study's own tables leave out)."""
    out_dir = Path(out_dir)
    long = with_composites(load_results(eval_jsons), composites or {})
    write_text(long.to_csv(index=False), out_dir / "results_long.csv")
    summary = seed_summary(long, base_seeds=base_seeds)
    write_text(summary.to_csv(index=False, na_rep="NaN"), out_dir / "results.csv")
    if reproduction_jsons:
        every = pd.concat([long, with_composites(load_results(reproduction_jsons), composites or {})],
                          ignore_index=True)
        reproduced = reproduction_table(seed_summary(every, base_seeds=base_seeds), reported_cells(reported or []))
    else:
        reproduced = reproduction_table(summary, reported_cells(reported or []))
    write_text(reproduced.to_csv(index=False, na_rep="NaN"), out_dir / "reproduction.csv")
    write_text(reproduction_markdown(reproduced), out_dir / "reproduction.md")
    seeds = sorted(int(s) for s in long.loc[~long["method"].str.startswith(BASE_PREFIX), "seed"].unique())
    over = f"the seeds ({len(seeds)} fine-tuning seed(s)"
    if base_seeds is not None and len(base_seeds) > 1:
        over = (f"the per-base means ({len(base_seeds)} pretrained bases; fine-tuning seeds "
                f"{', '.join(map(str, seeds))} alternate over them; a base model: one per base")
    write_text(f"Scores in percent: mean ± half-width of the 95 % t interval over {over}; one number: a "
               f"single model). Every seed: results_long.csv.\n\n"
               + markdown_table(headline_table(summary)), out_dir / "results.md")

    columns = [c for c in headline_columns(long) if not c.startswith("composite/")]
    means = summary.assign(column=[column_name(b, m) for b, m in zip(summary["benchmark"], summary["metric"],
                                                                        strict=True)])
    wide = means.pivot(index=["method", "dataset"], columns="column", values="mean")
    correlations = correlation_table(wide.reset_index(), columns)
    scores = {column: wide[column].to_numpy(dtype=float) for column in columns}
    bounds = [spearman_ci(*paired(scores[a], scores[b])) for a, b in
              zip(correlations["metric_a"], correlations["metric_b"], strict=True)]
    correlations["ci_low"] = [low for low, _ in bounds]
    correlations["ci_high"] = [high for _, high in bounds]
    write_text(correlations.to_csv(index=False, na_rep="NaN"), out_dir / "correlations.csv")
    intro = (f"Spearman correlation across methods between the seed means of each benchmark's headline metric "
             f"({', '.join(columns) or 'none'}); 95 % CI from resampling methods.\n\n")
    if correlations.empty:
        intro += "Fewer than two benchmarks: no pairs to correlate.\n\n"
    shown = correlations[["metric_a", "metric_b", "rho", "ci_low", "ci_high", "p_value", "n", "note"]]
    write_text(intro + markdown_table(shown, {"rho": _signed, "ci_low": _signed, "ci_high": _signed,
                                              "p_value": _plain}), out_dir / "correlations.md")


def _signed(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"


# --- uncertainty: seeds, items, multiple claims --------------------------------------------------------
#
# A study model is trained once per fine-tuning seed and scored on fixed benchmark items, so a method's
# score varies with the seed (training noise) and with the sample of items (benchmark noise). Summaries
# over seeds use a t interval; comparisons between methods use a hierarchical bootstrap that resamples
# seeds and then items within each benchmark subset, with the same draws for both methods (paired). When the
# study pretrains several bases (study.base_seeds), the seeds nest in them and the bases are the top level.

SUMMARY_COLUMNS = ["method", "dataset", "benchmark", "metric", "headline", "mean", "sd", "ci_low", "ci_high",
                   "n_seeds", "n_bases"]


@functools.lru_cache(maxsize=256)
def t_quantile(q: float, df: int) -> float:
    """Student's t quantile: one scipy call per degrees of freedom (a summary asks it once per group)."""
    return float(scipy.stats.t.ppf(q, df))


def mean_ci(values: Any, confidence: float = CONFIDENCE) -> dict[str, float]:
    """Mean, sample sd and the two-sided t confidence interval of the mean over seeds (NaN CI for one
    seed; a zero-width CI when every seed agrees)."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "sd": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n_seeds": 0}
    mean = float(x.mean())
    if n == 1:
        return {"mean": mean, "sd": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n_seeds": 1}
    sd = float(x.std(ddof=1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half, "n_seeds": n}


def seed_summary(long: pd.DataFrame, confidence: float = CONFIDENCE, base_seeds: list[int] | None = None
                 ) -> pd.DataFrame:
    """One row per (method, dataset, benchmark, metric): mean, sd and CI over the seeds (see mean_ci).

    With several `base_seeds` (config study.base_seeds) a fine-tuned method's seeds nest in the bases they
    started from, so its mean, sd and CI are those of the per-base means (the bases are the independent
    units; n_bases of them), while n_seeds still counts its models. A base model is one per base seed."""
    keys = ["method", "dataset", "benchmark", "metric"]
    nested = base_seeds is not None and len(base_seeds) > 1
    grouped = long.groupby(keys, sort=True)
    # each group's rows as slices of numpy columns, in the table's order (what iterating the groupby yields, without
    # a sub-frame per group: the paper study's ~50,000 groups spent ~20 CPU-s making them)
    number = grouped.ngroup().to_numpy(dtype=float)  # NaN: a row with a missing key, which groupby leaves out
    order = np.argsort(number, kind="stable")
    order = order[~np.isnan(number[order])]
    starts = np.searchsorted(number[order], np.arange(grouped.ngroups + 1))
    value, seed, headline = (long[column].to_numpy()[order] for column in ("value", "seed", "headline"))
    rows = []
    for i, key in enumerate(grouped.size().index):
        rows_of = slice(starts[i], starts[i + 1])
        values, bases = value[rows_of], 1
        if is_base(str(key[0])):
            bases = len(values)
        elif nested:
            by_base = pd.Series(values).groupby([base_seed_for(s, base_seeds) for s in seed[rows_of]]).mean()
            values, bases = by_base, len(by_base)
        rows.append({**dict(zip(keys, key, strict=True)), "headline": bool(headline[rows_of].any()),
                     **mean_ci(values, confidence), "n_seeds": int(starts[i + 1] - starts[i]), "n_bases": bases})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def holm(p_values: Any) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values (NaN entries are left out and stay NaN)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p_values, dtype=float)
    adjusted = np.full_like(p, np.nan)
    present = ~np.isnan(p)
    if present.any():
        adjusted[present] = multipletests(p[present], method="holm")[1]
    return adjusted


@dataclass(frozen=True)
class ItemScores:
    """Per-item scores of one metric for one model family (one row per seed, same items for every
    method): values [S, N]; items are resampled within their stratum (a benchmark subset); the metric is
    the mean over items (micro) or the mean of the strata means (macro, e.g. ARO's per-relation macro)."""

    values: np.ndarray
    strata: np.ndarray
    macro: bool = False
    items: str = ""  # names the item set (e.g. "sugarcrepe/swap"): scores on the same items share draws
    weight: float = 1.0  # its weight in a composite measure
    # False: one value per seed as its result JSON states it (`stored_scores`): the items are not resampled
    from_items: bool = True

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[1] != len(self.strata) or not len(self.strata):
            raise ValueError(f"ItemScores: values {self.values.shape} do not match {len(self.strata)} strata labels")

    def value(self) -> np.ndarray:
        """The metric per seed [S] on the full item set."""
        return _aggregate(self.values, self.strata, self.macro)


def _aggregate(values: np.ndarray, strata: np.ndarray, macro: bool) -> np.ndarray:
    if not macro:
        return values.mean(axis=-1)
    return np.stack([values[..., strata == s].mean(axis=-1) for s in np.unique(strata)]).mean(axis=0)


# A measure is one metric or a composite: the weighted mean of several ItemScores, each over its own items
# (e.g. retrieval's mean recall over R@1/5/10 of both directions, or "compositional" = the mean of several
# benchmarks' headline metrics).
Measure = list[ItemScores]


def _weights(measure: Measure) -> np.ndarray:
    weights = np.array([scores.weight for scores in measure], dtype=float)
    return weights / weights.sum()


class Bootstrap:
    """Seeds-then-items bootstrap draws shared by every model scored on the same items (paired).

    `draws` replicates; each draws `seeds` seed indices with replacement, and for every drawn seed one
    resample of the items of each benchmark component within its strata. `values(measure)` gives the
    measure per replicate and drawn seed [R, seeds]; a model with a single seed (a base) uses it for
    every drawn seed.

    `items_only`: every replicate keeps the seeds as they are and resamples the items once, the same draw for
    every seed: the item-sampling variance of a seed mean alone (`t_difference`'s item term).

    `bases` (one label per seed index, e.g. the base seed each fine-tuning seed started from) keeps the bases
    fixed: each replicate draws every base's seeds from that base's own, with replacement (the claims' interval:
    the effect on the study's own bases). `resample_bases` adds them as a top level instead: each replicate first
    draws as many bases as there are, with replacement, then for each drawn base as many of its seeds (a
    two-stage cluster bootstrap, for an effect over a population of bases; the coverage simulation compares it).
    Either way the bases must have equally many seeds. With one base both are the plain seeds-then-items
    bootstrap, draw for draw.
    """

    def __init__(self, seeds: int, draws: int = 2000, seed: int = 0, bases: Any = None,
                 items_only: bool = False, resample_bases: bool = False) -> None:
        self.seeds, self.draws, self.items_only = seeds, draws, items_only
        self.rng = np.random.default_rng(seed)
        labels = np.zeros(seeds, dtype=int) if bases is None else np.asarray(bases)
        if len(labels) != seeds:
            raise ValueError(f"Bootstrap: {len(labels)} base labels for {seeds} seeds")
        clusters = [np.flatnonzero(labels == label) for label in np.unique(labels)]
        if items_only:  # every replicate keeps every seed and resamples the items once, for all of them
            self.seed_draw = np.tile(np.arange(seeds), (draws, 1))
        elif len(clusters) > 1:
            self.seed_draw = self._cluster_draw(clusters, resample_bases)
        else:
            self.seed_draw = self.rng.integers(seeds, size=(draws, seeds)) if seeds > 1 else np.zeros(
                (draws, 1), dtype=int)
        self._items: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def _cluster_draw(self, clusters: list[np.ndarray], resample_bases: bool) -> np.ndarray:
        """[R, seeds] seed indices: seeds drawn within each base, the bases kept or (`resample_bases`) drawn
        with replacement first."""
        sizes = {len(members) for members in clusters}
        if len(sizes) != 1:
            raise ValueError(f"Bootstrap: the bases have unequal numbers of seeds {sorted(sizes)}; the "
                             f"two-stage bootstrap needs a balanced design")
        size = sizes.pop()
        members = np.stack(clusters)  # [bases, seeds per base]
        chosen = (self.rng.integers(len(clusters), size=(self.draws, len(clusters))) if resample_bases
                  else np.tile(np.arange(len(clusters)), (self.draws, 1)))
        within = self.rng.integers(size, size=(self.draws, len(clusters), size))
        return members[chosen[..., None], within].reshape(self.draws, -1)

    def _item_draw(self, items: str, strata: np.ndarray) -> np.ndarray:
        """[R, seeds, N] item indices, resampled within strata; shared by every model with these items."""
        if items in self._items:
            known, draw = self._items[items]
            if not np.array_equal(known, strata):
                raise ValueError(f"item set {items!r}: two measures disagree on its items")
            return draw
        drawn_seeds = 1 if self.items_only else self.seed_draw.shape[1]  # items_only: one draw broadcast to all
        draw = np.empty((self.draws, drawn_seeds, len(strata)), dtype=np.int32)
        for stratum in np.unique(strata):
            where = np.flatnonzero(strata == stratum)
            draw[..., where] = where[self.rng.integers(len(where), size=(*draw.shape[:2], len(where)))]
        self._items[items] = (strata, draw)
        return draw

    def values(self, measure: Measure) -> np.ndarray:
        out = np.zeros(self.seed_draw.shape, dtype=float)
        for scores, weight in zip(measure, _weights(measure), strict=True):
            items = self._item_draw(scores.items, scores.strata)
            if scores.values.shape[0] not in (1, self.seeds):
                raise ValueError(f"scores over {scores.values.shape[0]} seeds, the comparison has {self.seeds}")
            seeds = self.seed_draw if scores.values.shape[0] > 1 else np.zeros_like(self.seed_draw)
            sampled = scores.values[seeds[..., None], items]  # [R, S, N]
            # items are resampled within strata, so strata keep their positions: aggregate as on the full set
            out += weight * _aggregate(sampled, scores.strata, scores.macro)
        return out


def measure_value(measure: Measure) -> np.ndarray:
    """The measure per seed on the full item sets [S] (a single-seed component broadcasts)."""
    values = np.broadcast_arrays(*[scores.value() for scores in measure])
    return np.tensordot(_weights(measure), np.stack(values), axes=1)


def bootstrap_p(draws: np.ndarray, null: float = 0.0) -> float:
    """Two-sided bootstrap p-value of H0: effect == null, by inverting the percentile interval: the
    smallest alpha at which the (1 - alpha) interval excludes `null` (so p < 0.05 exactly when the 95 %
    percentile CI excludes it). The +1 terms keep it above zero for a finite number of draws."""
    draws = np.asarray(draws, dtype=float)
    below = (np.sum(draws <= null) + 1) / (len(draws) + 1)
    above = (np.sum(draws >= null) + 1) / (len(draws) + 1)
    return float(min(1.0, 2 * min(below, above)))


def percentile_ci(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of the finite draws; (nan, nan) when no draw is finite."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return math.nan, math.nan
    low, high = np.quantile(draws, [0.5 - confidence / 2, 0.5 + confidence / 2])
    return float(low), float(high)


def paired_difference(a: Measure, b: Measure, seeds: int, draws: int = 2000, seed: int = 0,
                      confidence: float = CONFIDENCE, bases: Any = None, resample_bases: bool = False
                      ) -> dict[str, float]:
    """mean_seeds(a) - mean_seeds(b) on the same items, its bootstrap CI and two-sided p (seeds, then
    items within strata, resampled with the same draws for both). `seeds` is the number of seeds of the
    comparison; a measure with one seed (a base model) is the same model at every drawn seed. `bases`
    labels each seed with the base it started from (see Bootstrap)."""
    effect = float(measure_value(a).mean() - measure_value(b).mean())
    boot = Bootstrap(seeds, draws, seed, bases, resample_bases=resample_bases)
    deltas = boot.values(a).mean(axis=1) - boot.values(b).mean(axis=1)
    low, high = percentile_ci(deltas, confidence)
    return {"effect": effect, "ci_low": low, "ci_high": high, "p": bootstrap_p(deltas), "draws": deltas}


# --- the claims' interval, its p-value and its minimum detectable effect --------------------------------
#
# The claims estimate the effect on the study's own pretrained base(s), over fine-tuning seeds and benchmark items:
# seeds are resampled within each base, then items. A 2-core study pretrains one or two bases, and no interval from
# two bases covers an effect over a population of bases at a usable width (the coverage of each interval here,
# simulated at the study's design: `compo_tools.power`, tools/interval_coverage.py, docs/intervals.md).

POWER = 0.8  # of the minimum detectable effect


@dataclass(frozen=True)
class Interval:
    """A difference's estimate and its uncertainty: `effect` with its 95 % interval [low, high], the standard
    error `se` on which the interval is built, the degrees of freedom `df` of its t reference (inf: normal)
    and, for a bootstrap interval, the draws it was read from."""

    effect: float
    low: float
    high: float
    se: float
    df: float
    draws: np.ndarray = field(default_factory=lambda: np.empty(0))

    def p(self, null: float = 0.0) -> float:
        """Two-sided p of H0 "the difference is `null`": below 0.05 exactly when the 95 % interval excludes it."""
        if len(self.draws):
            return bootstrap_p(self.draws, null)
        if not self.se > 0:
            return 1.0 if self.effect == null else 0.0
        return float(2 * scipy.stats.t.sf(abs(self.effect - null) / self.se, self.df))

    def mde(self, alpha: float = 1 - CONFIDENCE, power: float = POWER) -> float:
        """The minimum detectable effect: the smallest true difference this design detects with probability
        `power` in a two-sided test at `alpha`, (t_{1-alpha/2} + t_{power}) x se at the interval's df."""
        quantile = scipy.stats.t.ppf if math.isfinite(self.df) else (lambda q, _df: scipy.stats.norm.ppf(q))
        return float((quantile(1 - alpha / 2, self.df) + quantile(power, self.df)) * self.se)


def percentile_difference(a: Measure, b: Measure, seeds: int, draws: int = 2000, seed: int = 0,
                          bases: Any = None, confidence: float = CONFIDENCE, resample_bases: bool = False
                          ) -> Interval:
    """mean_seeds(a) - mean_seeds(b) with the percentile interval of the seeds(-within-bases)-then-items
    bootstrap (`paired_difference`; `resample_bases`: bases, then seeds within them, then items)."""
    result = paired_difference(a, b, seeds, draws, seed, confidence, bases, resample_bases)
    return bootstrap_interval(result["effect"], result["draws"], confidence)


def bootstrap_interval(effect: float, draws: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The percentile interval of bootstrap `draws` of an effect; its se is the draws' sd (normal reference)."""
    finite = np.asarray(draws, dtype=float)
    finite = finite[np.isfinite(finite)]
    low, high = percentile_ci(finite, confidence)
    se = float(np.std(finite, ddof=1)) if len(finite) > 1 else math.nan
    return Interval(effect, low, high, se, math.inf, finite)


def t_difference(a: Measure, b: Measure, seeds: int, draws: int = 2000, seed: int = 0, bases: Any = None,
                 confidence: float = CONFIDENCE) -> Interval:
    """mean_seeds(a) - mean_seeds(b) with the t interval of `t_interval` over the seeds' differences, each
    also on item resamples (`Bootstrap(items_only=True)`: the same items for every seed). A measure with one
    seed (a base model) is the same model at every seed."""
    per_seed = np.broadcast_to(measure_value(a) - measure_value(b), (seeds,)).astype(float)
    boot = Bootstrap(seeds, draws, seed, items_only=True)
    return t_interval(per_seed, boot.values(a) - boot.values(b), bases, confidence)


def t_interval(per_seed: np.ndarray, resampled: np.ndarray, bases: Any = None,
               confidence: float = CONFIDENCE) -> Interval:
    """A t interval over the independent units that carries the item variance. `per_seed` [seeds]: a quantity
    per fine-tuning seed on the full items; `resampled` [draws, seeds]: the same on item resamples that draw the
    same items for every seed. The units are the seeds (the bases' means of their seeds when `bases` labels
    several), whose spread gives var_units / n; the items add the part of the mean's variance over item
    resamples that the seeds share (the mean covariance of two seeds' values over the resamples; a seed's own
    item-level noise is already in the units' spread); the t reference has the Welch-Satterthwaite degrees of
    freedom of the two terms (n - 1 when the units dominate, large when the items do). With one unit the items
    alone give the interval."""
    seeds = len(per_seed)
    labels = np.arange(seeds) if bases is None or len(np.unique(bases)) == 1 else np.asarray(bases)
    units = np.array([per_seed[labels == label].mean() for label in np.unique(labels)])
    effect = float(units.mean())
    between = float(units.var(ddof=1)) / len(units) if len(units) > 1 else 0.0
    resampled = resampled[np.isfinite(resampled).all(axis=1)]
    if seeds == 1:
        items = float(np.var(resampled, ddof=1))
    else:  # the part the seeds share: the items' own difference
        covariance = np.cov(resampled, rowvar=False)
        items = max(0.0, float(covariance[~np.eye(seeds, dtype=bool)].mean()))
    variance = between + items
    df = variance**2 / (between**2 / (len(units) - 1)) if between > 0 else math.inf
    se = math.sqrt(variance)
    quantile = scipy.stats.t.ppf(0.5 + confidence / 2, df) if math.isfinite(df) else scipy.stats.norm.ppf(
        0.5 + confidence / 2)
    return Interval(effect, effect - float(quantile) * se, effect + float(quantile) * se, se, df)


def scale_interval(interval: Interval, factor: float) -> Interval:
    """The interval in another unit (e.g. fractions to points)."""
    return Interval(factor * interval.effect, factor * interval.low, factor * interval.high, abs(factor) * interval.se,
                    interval.df, factor * interval.draws)


def shift_interval(interval: Interval, offset: float) -> Interval:
    """The interval of the effect + offset (e.g. against a reference value)."""
    return Interval(interval.effect + offset, interval.low + offset, interval.high + offset, interval.se, interval.df,
                    interval.draws + offset)


INTERVALS: dict[str, Callable[..., Interval]] = {
    "percentile": percentile_difference,  # seeds within the fixed bases, then items
    "percentile over bases": functools.partial(percentile_difference, resample_bases=True),
    "t": t_difference,  # over the seeds, or the bases' means when there are several
}
CLAIM_INTERVAL = "percentile"  # the claims' interval for a difference (coverage: docs/intervals.md)


def difference_interval(a: Measure, b: Measure, seeds: int, draws: int = 2000, seed: int = 0,
                        bases: Any = None) -> Interval:
    """The interval every difference claim reports (`CLAIM_INTERVAL`); the coverage simulation builds this one."""
    return INTERVALS[CLAIM_INTERVAL](a, b, seeds, draws, seed, bases)


# --- per-item scores from the predictions every evaluation writes -----------------------------------------

def _selections(record: dict[str, Any], metric: str) -> list[Selection] | None:
    """How `metric` of this evaluation record is computed from its per-item predictions, as its kind declares it
    (compo.evaluate.kinds: `selections`); None where they do not give it."""
    return kind_of(record["kind"]).selections(metric, record["metrics"])


def stored_scores(records: list[dict[str, Any]], metric: str) -> ItemScores:
    """`metric` per seed as the result JSONs state it, one fixed "item" each (records in seed order, one
    benchmark): the seeds are resampled, its items are not, so its test-set sampling is not in an interval. The
    one rule, for every kind, for a metric its predictions do not give (`_selections`)."""
    values = np.array([[record["metrics"][metric]["value"]] for record in records], dtype=float)
    return ItemScores(values, np.zeros(1, dtype=int), items=f"{records[0]['benchmark']}/{metric}:stored",
                      from_items=False)


def fixed_items(measure: Measure) -> list[str]:
    """The members of `measure` read as stored per seed (`stored_scores`), as <benchmark>/<metric>."""
    return list(dict.fromkeys(s.items.removesuffix(":stored") for s in measure if not s.from_items))


def metric_scores(records: list[dict[str, Any]], predictions: list[pd.DataFrame], metric: str,
                  where: str) -> Measure:
    """The per-item scores behind `metric` for one model per seed (records and predictions in seed
    order, one benchmark): each component [S, N] over the same items in every seed. The recomputed value
    must equal the one in the result JSON (else the two computations have drifted apart: an error). A metric
    the predictions do not give is read as stored (`stored_scores`)."""
    selections = _selections(records[0], metric)
    if selections is None:
        return [stored_scores(records, metric)]
    measure = []
    benchmark = records[0]["benchmark"]
    for selection in selections:
        rows, keys = [], None
        for record, table in zip(records, predictions, strict=True):
            chosen = table if selection.subsets is None else table[table["subset"].isin(selection.subsets)]
            chosen = chosen.sort_values(["subset", "item"], kind="stable")
            these = list(zip(chosen["subset"], chosen["item"], strict=True))
            if keys is None:
                keys = these
            elif these != keys:
                raise ContractError(f"{where}: {record['model']} was scored on other items of {benchmark} than "
                                    f"{records[0]['model']}")
            if selection.column not in chosen:
                raise ContractError(f"{where}: {record['model']}'s predictions of {benchmark} have no column "
                                    f"{selection.column!r} (needed for {metric!r}; re-evaluate the model)")
            rows.append((chosen[selection.column].to_numpy() <= selection.at_k).astype(float))
        if not keys:
            raise ContractError(f"{where}: no predictions of {benchmark} behind metric {metric!r}")
        strata = pd.factorize(pd.Series([subset for subset, _ in keys]))[0]
        name = f"{benchmark}:{','.join(selection.subsets or ('*',))}"
        measure.append(ItemScores(np.stack(rows), strata, selection.macro, name, selection.weight))
    recomputed = measure_value(measure)
    stored = np.array([record["metrics"][metric]["value"] for record in records])
    if not np.allclose(recomputed, stored, atol=1e-6):
        raise ContractError(f"{where}: {benchmark}/{metric} recomputed from the predictions ({recomputed}) differs "
                            f"from the result JSON ({stored})")
    return measure
