"""The seed papers' claims as data: each declared claim is measured on the study's results and gets a verdict.

A claim (config `claims:`, schema-validated) names what it compares and how it is expected to come out:

    - id: 000-hn-swap                       # unique, safe name
      role: claim                           # or control (the testbed's positive / negative controls), or
                                            # hypothesis (the study's own test of a seed's explanation: a
                                            # comparison the seed does not report; a table of its own)
      source: "seed 000, Table 1"
      statement: "hard negatives raise SugarCrepe swap over plain fine-tuning"
      kind: difference                      # difference (default) | correlation | trajectory
      compare: [degla-cn, clip-ft]          # a minus b
      metric: sugarcrepe/swap               # see below
      expected: "+"                         # "+", "-", ">=" (no worse than), "<=" (no better than)
      margin: 0                             # in the effect's unit (points for accuracies)

Metrics: `<benchmark>/<metric>` (a metric of an evaluation result), `composite/<name>` (the mean of the
metrics listed under `composites.<name>`), `training/<column>` (a per-step column of the models'
`losses.csv`, e.g. Cement's gradient shares), `concreteplant/<i2t|t2i>` (the base model's accuracy on
ConcretePlant's caption / hard-negative pairs; `compare` names two policies, e.g. [hc, lc]).

A benchmark metric is recomputed from the evaluation's per-item predictions, so the bootstrap resamples its items
(`compo.stats.metric_scores`). One rule for every kind covers a metric the predictions do not give (ELEVATER's
ROC AUC and 11-point mAP, a kind whose metrics hook groups its subsets, a released tie rule the predictions do not
carry): it is read as each seed's value in its result JSON, its items not resampled, and the claim's note and `why`
name it (`stored_note`): its interval has those members' seed spread, not their test items' sampling.

Kinds:
- difference: a - b, paired on the same items (and seeds where both have the same seeds; a fine-tuned
  model against the base it started from), CI and p from the seeds-then-items bootstrap of `compo.stats`
  (seeds within each base when the study pretrains several: `study.base_seeds`; the effect on these bases).
  `compare: [a, <number>]` compares with a reference value.
- correlation: Spearman across the compared methods (`compare: study` = every method of the study and its
  bases) between the seed means of two metrics (`metric: [x, y]`); CI from resampling methods.
- trajectory: along WiSE-FT, the mean vertical gap between two methods' curves of metric y against metric x
  (`metric: [x, y]`) over the x range both cover, per seed; the seeds-then-items bootstrap again.

Verdicts, with p adjusted by Holm across the claims (controls and hypotheses each form their own family) at
alpha = 0.05:
- "+" / "-": holds when p_holm < alpha and the effect has the expected sign; reversed when p_holm < alpha
  and the opposite sign; equivalent when not significant and the CI lies inside (-margin, margin) (margin
  > 0: the effect is measured precisely and is negligible); otherwise not detected.
- ">=" / "<=" (non-inferiority by `margin`): holds when the CI's lower (upper) bound clears -margin
  (+margin), i.e. p_holm < alpha for H0 "worse by at least the margin"; reversed when the whole CI is
  beyond the margin the wrong way; otherwise not detected.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats

from compo.claim_specs import Claim, claim_kinds
from compo.io import ContractError, read_json, read_table, write_text
from compo.layout import base_seed_for, eval_result_paths, is_base, is_wiseft, predictions_path, wiseft_name
from compo.provenance import check_result_checkpoint
from compo.stats import (
    Bootstrap,
    Interval,
    ItemScores,
    Measure,
    bootstrap_interval,
    difference_interval,
    fixed_items,
    holm,
    markdown_table,
    measure_value,
    metric_scores,
    parse_model_id,
    scale_interval,
    shift_interval,
    spearman_ci,
)

log = logging.getLogger(__name__)

ALPHA = 0.05
DRAWS = 2000
CLAIM_COLUMNS = ["id", "role", "source", "statement", "comparison", "metric", "expected", "margin", "effect",
                 "ci_low", "ci_high", "p", "p_holm", "verdict", "unit", "n_seeds", "mde", "kinds", "why", "note"]
UNTESTABLE = "untestable here"
VERDICTS = ("holds", "not detected", "reversed", "equivalent", UNTESTABLE)
KIND_COLUMNS = ["kind", "what", "passes", "positive", "negative", "mde", "reads", "why"]
HYPOTHESIS = "hypothesis"  # the study's own test of a seed's explanation, reported apart from the seeds' claims
ROLE_ORDER = {"control": 0, "claim": 1, HYPOTHESIS: 2}  # the order of the claims table's rows


class ClaimError(ValueError):
    """A claim cannot be measured (unknown method or metric, missing results); names the claim."""


@dataclass
class Measured:
    """A claim's effect, its 95 % interval, the interval it was read from (p-values against any null, the
    minimum detectable effect) and, for a correlation, scipy's p."""

    effect: float
    ci_low: float
    ci_high: float
    p: float
    unit: str
    n_seeds: int
    interval: Interval | None = None  # in the effect's unit
    note: str = ""

    @classmethod
    def of(cls, interval: Interval, scale: float, unit: str, n_seeds: int, note: str = "") -> Measured:
        scaled = scale_interval(interval, scale)
        return cls(scaled.effect, scaled.low, scaled.high, math.nan, unit, n_seeds, scaled, note)

    def p_against(self, null: float) -> float:
        return self.p if self.interval is None else self.interval.p(null)

    def mde(self) -> float:
        return math.nan if self.interval is None else self.interval.mde()


# --- reading the study's results ------------------------------------------------------------------------


class StudyResults:
    """Every evaluated model's result records and per-item predictions, by method, dataset and seed.

    eval_jsons: result JSONs (their predictions beside them: compo.layout.predictions_path), or models' evaluation
    indexes standing for their results (compo.layout.eval_result_paths). losses: the models'
    `losses.csv` by model id. pairs: ConcretePlant's per-pair table of the base model (or None).
    base_seeds: the config's study.base_seeds (fine-tuning seed s started from base_seeds[s mod n]); None:
    every fine-tuned model started from the one base.
    """

    def __init__(self, eval_jsons: list[str], composites: dict[str, list[str]],
                 losses: dict[str, str] | None = None, pairs: str | None = None,
                 base_seeds: list[int] | None = None) -> None:
        self.base_seeds = base_seeds
        self.records: dict[tuple[str, str, int, str], tuple[dict[str, Any], str]] = {}
        for path in eval_result_paths(eval_jsons):
            record = read_json(path, "evaluation result")
            check_result_checkpoint(record, path)  # scored the model folder's bytes (compo.provenance)
            ids = parse_model_id(record["model"], path)
            self.records[(ids["method"], ids["dataset"], ids["seed"], record["benchmark"])] = (record, path)
        # each model's seeds once: asked for every metric of every claim (the paper study's ~1,700 questions each
        # scanned every record, ~3 s of its claims job)
        self._seeds: dict[tuple[str, str], set[int]] = {}
        for method, dataset, seed, _ in self.records:
            self._seeds.setdefault((method, dataset), set()).add(seed)
        self.composites = composites
        self.losses = losses or {}
        self.pairs_path = pairs
        self._predictions: dict[str, pd.DataFrame] = {}

    def methods(self) -> list[str]:
        return sorted({method for method, _, _, _ in self.records})

    def datasets(self, method: str) -> list[str]:
        return sorted({d for m, d, _, _ in self.records if m == method})

    def dataset_of(self, method: str, claim: Claim) -> str:
        datasets = self.datasets(method)
        if not datasets:
            raise ClaimError(f"claim {claim.id}: no evaluation results of method {method!r} (is it in "
                             f"study.methods, with its WiSE-FT models where the claim needs them?)")
        if claim.dataset is not None:
            if claim.dataset not in datasets:
                raise ClaimError(f"claim {claim.id}: method {method!r} has no results on dataset {claim.dataset!r}")
            return claim.dataset
        if len(datasets) > 1:
            raise ClaimError(f"claim {claim.id}: method {method!r} has results on {datasets}: set the claim's dataset")
        return datasets[0]

    def seeds(self, method: str, dataset: str) -> list[int]:
        return sorted(self._seeds.get((method, dataset), ()))

    def base_labels(self, method: str, seeds: list[int]) -> list[int]:
        """The base each of `seeds` started from (a base model is its own), the bootstrap's top level."""
        if is_base(method):
            return list(seeds)
        return [0 if self.base_seeds is None else base_seed_for(s, self.base_seeds) for s in seeds]

    def on_seeds(self, measure: Measure, base_method: str, base_seeds: list[int], method: str,
                 seeds: list[int], claim: Claim) -> Measure:
        """A base model's `measure` (one row per base seed) laid out on another method's seeds: each seed's
        row is the base that seed started from, so the two are paired base by base."""
        if self.base_seeds is None:  # one base, whatever its seed: every fine-tuning seed started from it
            if len(base_seeds) != 1:
                raise ClaimError(f"claim {claim.id}: {base_method} has seeds {base_seeds}, but no base_seeds say "
                                 f"which of them each seed of {method} started from")
            started = base_seeds * len(seeds)
        else:
            started = self.base_labels(method, seeds)
        rows = []
        for seed, wanted in zip(seeds, started, strict=True):
            if wanted not in base_seeds:
                raise ClaimError(f"claim {claim.id}: {method} seed {seed} started from {base_method} seed "
                                 f"{wanted}, which has no results (it has seeds {base_seeds})")
            rows.append(base_seeds.index(wanted))
        return [replace(s, values=s.values[rows]) for s in measure]

    def _table(self, path: str) -> pd.DataFrame:
        if path not in self._predictions:
            self._predictions[path] = read_table(predictions_path(path), "predictions")
        return self._predictions[path]

    def measure(self, method: str, dataset: str, metric: str, claim: Claim) -> Measure:
        """Per-item scores of `metric` for the method's models (one row per seed)."""
        family, _, name = metric.partition("/")
        if family == "composite":
            if name not in self.composites:
                raise ClaimError(f"claim {claim.id}: composite {name!r} is not defined under composites")
            parts = [self.measure(method, dataset, m, claim) for m in self.composites[name]]
            # each metric counts once, however many components it has (retrieval's mean recall has six)
            return [replace(s, weight=s.weight / sum(x.weight for x in part))
                    for part in parts for s in part]
        if family == "training":
            return [self._training(method, dataset, name, claim)]
        seeds = self.seeds(method, dataset)
        found = [self.records.get((method, dataset, seed, family)) for seed in seeds]
        if not seeds or any(entry is None for entry in found):
            raise ClaimError(f"claim {claim.id}: method {method!r} on {dataset} has no results on benchmark "
                             f"{family!r} for every seed {seeds}")
        records = [record for record, _ in found]
        if name not in records[0]["metrics"]:
            raise ClaimError(f"claim {claim.id}: benchmark {family!r} has no metric {name!r} "
                             f"(has: {', '.join(records[0]['metrics'])})")
        tables = [self._table(path) for _, path in found]
        return metric_scores(records, tables, name, f"claim {claim.id}")

    def _training(self, method: str, dataset: str, column: str, claim: Claim) -> ItemScores:
        seeds = self.seeds(method, dataset)
        rows = []
        for seed in seeds:
            model = f"{method}/{dataset}/seed{seed}"
            if model not in self.losses:
                raise ClaimError(f"claim {claim.id}: the training log of {model} was not given")
            table = pd.read_csv(self.losses[model])
            if column not in table.columns:
                raise ClaimError(f"claim {claim.id}: {self.losses[model]} has no column {column!r}")
            rows.append(table[column].to_numpy(dtype=float))
        if len({len(r) for r in rows}) != 1:
            raise ClaimError(f"claim {claim.id}: the seeds of {method} logged different numbers of steps")
        steps = len(rows[0])
        # steps play the role of items: resampled within the run, paired by step number across methods
        return ItemScores(np.stack(rows), np.zeros(steps, dtype=int), items=f"training:{steps}")

    def pairs(self, policy: str, metric: str, claim: Claim) -> pd.Series:
        if self.pairs_path is None:
            raise ClaimError(f"claim {claim.id}: needs ConcretePlant's per-pair table (no concrete-* negatives?)")
        table = pd.read_csv(self.pairs_path)
        column = f"{metric}_correct"
        if column not in table.columns:
            raise ClaimError(f"claim {claim.id}: {self.pairs_path} has no column {column!r} (metric i2t or t2i)")
        rows = table[table["policy"] == policy]
        if rows.empty:
            raise ClaimError(f"claim {claim.id}: {self.pairs_path} has no pairs of policy {policy!r}")
        return rows.set_index("caption_id")[column].astype(float)


# --- measuring ------------------------------------------------------------------------------------------


def _unit(metric: str) -> tuple[str, float]:
    """The effect's unit and the factor from the stored value (fractions become percentage points)."""
    family = metric.partition("/")[0]
    return ("ratio", 1.0) if family == "training" else ("points", 100.0)


def _difference(claim: Claim, results: StudyResults, draws: int, seed: int) -> Measured:
    a, b = claim.compare
    metric = str(claim.metric)
    unit, scale = _unit(metric)
    if metric.startswith("concreteplant/"):
        return _pairs_difference(claim, results, a, b, metric.split("/", 1)[1], draws, seed)
    data_a = results.dataset_of(a, claim)
    measure_a = results.measure(a, data_a, metric, claim)
    seeds_a = results.seeds(a, data_a)
    if isinstance(b, int | float):
        reference = float(b) / scale  # the reference is given in the effect's unit
        zero = [replace(s, values=np.zeros((1, len(s.strata)))) for s in measure_a]
        interval = difference_interval(measure_a, zero, len(seeds_a), draws, seed, results.base_labels(a, seeds_a))
        interval = shift_interval(interval, -reference)
        seeds = len(seeds_a)
    else:
        data_b = results.dataset_of(b, claim)
        measure_b = results.measure(b, data_b, metric, claim)
        seeds_b = results.seeds(b, data_b)
        based_a, based_b = is_base(a), is_base(b)
        if based_b and not based_a:
            measure_b, seeds_b = results.on_seeds(measure_b, b, seeds_b, a, seeds_a, claim), seeds_a
        elif based_a and not based_b:
            measure_a, seeds_a = results.on_seeds(measure_a, a, seeds_a, b, seeds_b, claim), seeds_b
        elif 1 not in (len(seeds_a), len(seeds_b)) and len(seeds_a) != len(seeds_b):
            raise ClaimError(f"claim {claim.id}: {a} has {len(seeds_a)} seeds, {b} has {len(seeds_b)}")
        design_method, design_seeds = (a, seeds_a) if len(seeds_a) >= len(seeds_b) else (b, seeds_b)
        seeds = len(design_seeds)
        interval = difference_interval(measure_a, measure_b, seeds, draws, seed,
                                       results.base_labels(design_method, design_seeds))
    return Measured.of(interval, scale, unit, seeds, note=stored_note(measure_a))


STORED = "items not resampled for"  # a note's part naming the members read as stored (`stored_note`)


def stored_note(measure: Measure) -> str:
    """Which members of a claim's measure are each seed's stored value (`compo.stats.stored_scores`: their
    predictions do not give them), so their items are not in its interval; empty when none is."""
    names = fixed_items(measure)
    if not names:
        return ""
    return (f"{STORED} {', '.join(names)} (each seed's value as its result states it: the interval has their "
            f"seeds' spread, not their test items' sampling)")


def _pairs_difference(claim: Claim, results: StudyResults, a: str, b: str, metric: str, draws: int,
                      seed: int) -> Measured:
    """Policy a vs policy b on the base model's caption/negative pairs, paired by caption."""
    both = pd.concat([results.pairs(a, metric, claim), results.pairs(b, metric, claim)], axis=1,
                     join="inner").dropna()
    if both.empty:
        raise ClaimError(f"claim {claim.id}: no caption has a pair under both {a} and {b}")
    strata = np.zeros(len(both), dtype=int)
    scores_a = ItemScores(both.iloc[:, 0].to_numpy()[None], strata, items="concreteplant")
    scores_b = ItemScores(both.iloc[:, 1].to_numpy()[None], strata, items="concreteplant")
    interval = difference_interval([scores_a], [scores_b], 1, draws, seed)
    return Measured.of(interval, 100, "points", 1, note=f"{len(both)} captions with a pair under both policies")


def _seed_means(results: StudyResults, methods: list[str], metric: str, claim: Claim) -> np.ndarray:
    return np.array([measure_value(results.measure(m, results.dataset_of(m, claim), metric, claim)).mean()
                     for m in methods])


def _correlation(claim: Claim, results: StudyResults, draws: int, seed: int) -> Measured:
    x_metric, y_metric = claim.metric
    methods = results.methods() if claim.compare == "study" else list(claim.compare)
    methods = [m for m in methods if not is_wiseft(m)]
    x, y = _seed_means(results, methods, x_metric, claim), _seed_means(results, methods, y_metric, claim)
    if len(methods) < 3:
        raise ClaimError(f"claim {claim.id}: a correlation needs at least 3 methods, got {methods}")
    rho, p = scipy.stats.spearmanr(x, y)
    low, high = spearman_ci(x, y, draws, seed)
    return Measured(float(rho), low, high, float(p), "rho", 0,
                    note=f"{len(methods)} methods: {', '.join(methods)}")


def _curve_gap(x_a: np.ndarray, y_a: np.ndarray, x_b: np.ndarray, y_b: np.ndarray) -> float:
    """Mean of y_a(x) - y_b(x) over the x range both curves cover (each curve linearly interpolated)."""
    low, high = max(x_a.min(), x_b.min()), min(x_a.max(), x_b.max())
    if not high > low:
        return math.nan
    grid = np.linspace(low, high, 101)
    order_a, order_b = np.argsort(x_a), np.argsort(x_b)
    return float(np.mean(np.interp(grid, x_a[order_a], y_a[order_a]) - np.interp(grid, x_b[order_b], y_b[order_b])))


def _trajectory(claim: Claim, results: StudyResults, draws: int, seed: int) -> Measured:
    x_metric, y_metric = claim.metric
    a, b = claim.compare
    curves = {}
    seeds = None
    for method in (a, b):
        prefix = wiseft_name(method, "")
        alphas = sorted(m for m in results.methods() if m.startswith(prefix))
        if len(alphas) < 2:
            raise ClaimError(f"claim {claim.id}: needs WiSE-FT models of {method} (wiseft.methods)")
        dataset = results.dataset_of(alphas[0], claim)
        these = results.seeds(alphas[0], dataset)
        if seeds not in (None, these):
            raise ClaimError(f"claim {claim.id}: {a} and {b} have WiSE-FT models over different seeds")
        seeds = these
        curves[method] = [(results.measure(m, dataset, x_metric, claim), results.measure(m, dataset, y_metric, claim))
                          for m in alphas]
    assert seeds is not None

    def gaps(values: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> np.ndarray:
        """Per drawn seed (last axis), the gap between the two curves at that seed."""
        xa, ya = (np.stack([p[i] for p in values[a]]) for i in (0, 1))  # [alphas, ..., seeds]
        xb, yb = (np.stack([p[i] for p in values[b]]) for i in (0, 1))
        flat = [arr.reshape(len(arr), -1) for arr in (xa, ya, xb, yb)]
        out = [_curve_gap(*(arr[:, k] for arr in flat)) for k in range(flat[0].shape[1])]
        return np.array(out).reshape(xa.shape[1:])

    point = {m: [(measure_value(x), measure_value(y)) for x, y in curve] for m, curve in curves.items()}
    point_gaps = gaps(point)
    note = f"mean gap in {y_metric} at equal {x_metric}"
    if not np.isfinite(point_gaps).any():
        # the two curves span disjoint x ranges: there is no "equal x" to compare at
        return Measured(math.nan, math.nan, math.nan, math.nan, "points", len(seeds),
                        note=f"{note}: the curves share no {x_metric} range")
    # the claims' bootstrap (seeds within each base, then items), built from the seeds' gaps on resampled items
    boot = Bootstrap(len(seeds), draws, seed, results.base_labels(a, seeds))
    sampled = {m: [(boot.values(x), boot.values(y)) for x, y in curve] for m, curve in curves.items()}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # resamples where the curves do not overlap are left out
        resampled = gaps(sampled)
    interval = bootstrap_interval(float(np.nanmean(point_gaps)), np.nanmean(resampled, axis=1))
    stored = stored_note([s for curve in curves.values() for x, y in curve[:1] for s in (*x, *y)])
    return Measured.of(interval, 100, "points", len(seeds), note="; ".join(n for n in (note, stored) if n))


KINDS = {"difference": _difference, "correlation": _correlation, "trajectory": _trajectory}


def _p_value(claim: Claim, measured: Measured) -> float:
    """Two-sided p of 'no effect' for directional claims, of 'worse by the margin' for >= / <=; from the
    claim's interval (so p < 0.05 exactly when the 95 % CI clears the null)."""
    if claim.expected in ("+", "-"):
        return measured.p_against(0.0)
    return measured.p_against(-claim.margin if claim.expected == ">=" else claim.margin)


def verdict(expected: str, effect: float, ci_low: float, ci_high: float, p_holm: float, margin: float,
            alpha: float = ALPHA) -> str:
    """The verdict of one claim (see the module docstring)."""
    if any(math.isnan(v) for v in (effect, ci_low, ci_high)):
        return "not detected"
    if expected in ("+", "-"):
        sign = 1 if expected == "+" else -1
        if p_holm < alpha:
            return "holds" if sign * effect > 0 else "reversed"
        if margin > 0 and -margin < ci_low and ci_high < margin:
            return "equivalent"
        return "not detected"
    if expected == ">=":
        if p_holm < alpha and ci_low > -margin:
            return "holds"
        return "reversed" if ci_high < -margin else "not detected"
    if expected == "<=":
        if p_holm < alpha and ci_high < margin:
            return "holds"
        return "reversed" if ci_low > margin else "not detected"
    raise ValueError(f"unknown expected direction {expected!r}")


def measure_claims(claims: list[Claim], results: StudyResults, draws: int = DRAWS, seed: int = 0,
                   effects: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per claim (CLAIM_COLUMNS), controls first, with Holm-adjusted p, the minimum detectable effect,
    the kinds of effect it reads (config `effects`) and its verdict: `untestable here` (with why) where a kind
    it reads has not passed its controls (`kind_table`)."""
    effects = effects or {}
    rows = []
    for claim in claims:
        measured = KINDS[claim.kind](claim, results, draws, seed)
        metric = claim.metric if isinstance(claim.metric, str) else " vs ".join(claim.metric)
        kinds = [] if claim.role == "control" else claim_kinds(claim, effects, results.composites)
        rows.append({"id": claim.id, "role": claim.role, "source": claim.source, "statement": claim.statement,
                     "comparison": claim.comparison(), "metric": metric, "expected": claim.expected,
                     "margin": claim.margin, "effect": measured.effect, "ci_low": measured.ci_low,
                     "ci_high": measured.ci_high, "p": _p_value(claim, measured), "unit": measured.unit,
                     "n_seeds": measured.n_seeds, "mde": measured.mde(), "kinds": ", ".join(kinds), "why": "",
                     "note": measured.note})
        log.info("claim %s: %s %.3g [%.3g, %.3g] %s", claim.id, claim.comparison(), measured.effect,
                 measured.ci_low, measured.ci_high, measured.unit)
    table = pd.DataFrame(rows, columns=[c for c in CLAIM_COLUMNS if c not in ("p_holm", "verdict")])
    table["p_holm"] = np.nan
    for role in table["role"].unique():  # the controls are their own family
        family = table["role"] == role
        table.loc[family, "p_holm"] = holm(table.loc[family, "p"])
    table["verdict"] = [verdict(r.expected, r.effect, r.ci_low, r.ci_high, r.p_holm, r.margin)
                        for r in table.itertuples()]
    table = gate(table, kind_table(table, effects))
    table = table.sort_values("role", key=lambda s: s.map(ROLE_ORDER).fillna(len(ROLE_ORDER)),
                              kind="stable").reset_index(drop=True)
    return table[CLAIM_COLUMNS]


# --- kinds of effect: does this testbed see an effect of the kind a claim reads? ---------------------------


def control_passes(side: str, row_verdict: str) -> bool:
    """A positive control passes when it holds (its effect detected, in its direction); a negative control
    unless it is reversed (its CI wholly beyond its margin: an effect the recipe should not have, invented).
    A negative control that `holds` shows the absence within the margin, which 3 seeds at these item counts
    rarely can; one that is not detected has invented nothing beyond its margin either."""
    return row_verdict == "holds" if side == "positive" else row_verdict != "reversed"


def control_word(side: str | None, row_verdict: str) -> str:
    """What a control's verdict means, in the words the tables show: `passes` (a positive control that holds, a
    negative control not reversed) or `fails (<verdict>)`; a claim (side None) keeps its verdict. The verdict
    itself (claims.csv) is unchanged: "not detected" is right for a claim and misleading for a negative control,
    whose point is to detect nothing."""
    if side is None:
        return row_verdict
    return "passes" if control_passes(side, row_verdict) else f"fails ({row_verdict})"


def control_sides(kinds: pd.DataFrame | None) -> dict[str, str]:
    """{control id: "positive" or "negative"} read back from the kinds table's control cells (`kind_table`
    writes each as "<id>: <effect [CI]>, <verdict>", "; " between them)."""
    sides: dict[str, str] = {}
    if kinds is None:
        return sides
    for row in kinds.itertuples():
        for side in ("positive", "negative"):
            for cell in str(getattr(row, side)).split("; "):
                name, colon, _ = cell.partition(": ")
                if colon:
                    sides[name] = side
    return sides


def holm_note(p: float, p_holm: float, alpha: float = ALPHA) -> str:
    """Why a 95 % CI that clears the null can come with a verdict that does not count it: the CI is the raw
    one (Holm's step-down has no matching interval), the verdict reads the Holm-adjusted p. Empty otherwise."""
    if any(pd.isna(v) for v in (p, p_holm)) or not float(p) < alpha <= float(p_holm):
        return ""
    return (f"the raw 95 % CI clears the null (p {float(p):.3g}), but not after Holm's correction (p_Holm "
            f"{float(p_holm):.3g}): not counted")


def _bounds(row: Any) -> str:
    """A row's effect and 95 % CI as the tables show them."""
    return (f"{effect_number(row.effect, row.unit)} [{effect_number(row.ci_low, row.unit)}, "
            f"{effect_number(row.ci_high, row.unit)}]")


def kind_table(claims: pd.DataFrame, effects: dict[str, Any]) -> pd.DataFrame:
    """One row per kind of effect (KIND_COLUMNS): whether it passes its controls, each control's effect [CI] and
    verdict, the largest minimum detectable effect of its positive controls (`mde`, points: the smallest effect
    of this kind it sees with 80 % power), the claims that read it, and in one line why it does not pass."""
    by_id = claims.set_index("id")
    rows = []
    for kind, spec in effects.items():
        readers = [str(r.id) for r in claims.itertuples() if kind in str(r.kinds).split(", ")]
        row = {"kind": kind, "what": spec["what"], "positive": "", "negative": "", "mde": math.nan,
               "reads": ", ".join(readers), "why": ""}
        if "direct" in spec:
            rows.append({**row, "passes": True, "positive": "none needed", "negative": "none needed",
                         "why": f"read directly: {spec['direct']}"})
            continue
        reasons = []
        for side in ("positive", "negative"):
            cells = []
            for name in spec[side]:
                if name not in by_id.index:
                    cells.append(f"{name}: not measured")
                    reasons.append(f"its {side} control {name} is not measured in this study")
                    continue
                control = by_id.loc[name]
                cells.append(f"{name}: {_bounds(control)}, {control.verdict}")
                if not control_passes(side, str(control.verdict)):
                    reasons.append(f"its {side} control {name} is {control.verdict} ({_bounds(control)})")
            row[side] = "; ".join(cells)
        measured = [float(by_id.loc[n, "mde"]) for n in spec["positive"] if n in by_id.index]
        row["mde"] = max(measured) if measured else math.nan
        rows.append({**row, "passes": not reasons, "why": "; ".join(reasons)})
    return pd.DataFrame(rows, columns=KIND_COLUMNS)


def gate(claims: pd.DataFrame, kinds: pd.DataFrame) -> pd.DataFrame:
    """Each claim's verdict where every kind it reads passes its controls, else `untestable here` with why (its
    effect and CI stay as measured). Controls are not gated: they are what decides."""
    status = kinds.set_index("kind")
    verdicts, whys = [], []
    for row in claims.itertuples():
        failing = [k for k in str(row.kinds).split(", ") if k and k in status.index and not status.loc[k, "passes"]]
        verdicts.append(UNTESTABLE if failing and row.role != "control" else row.verdict)
        whys.append("; ".join(f"{k}: {status.loc[k, 'why']}" for k in failing) if row.role != "control" else "")
    return claims.assign(verdict=verdicts, why=whys)


def kind_detects(row: Any) -> str:
    """One kind of effect (a kinds table row) in a sentence: whether this testbed detects it, down to how much."""
    if str(row.positive) == "none needed":
        return f"read directly: {str(row.why).removeprefix('read directly: ')}"
    if bool(row.passes):
        return f"can detect effects of this kind, down to {float(row.mde):.1f} points"
    return f"cannot detect effects of this kind: {row.why}"


def kinds_markdown(kinds: pd.DataFrame) -> str:
    """What this testbed can detect, kind by kind: its controls' results and one sentence."""
    lines = []
    for row in kinds.itertuples():
        if str(row.positive) == "none needed":
            sentence = f"read directly ({str(row.why).removeprefix('read directly: ')}); each claim's MDE is its power"
        elif row.passes:
            sentence = f"this testbed **can** detect effects of this kind, down to {row.mde:.1f} points"
        else:
            down = f"; with 80 % power it would see {row.mde:.1f} points" if not math.isnan(row.mde) else ""
            sentence = f"this testbed **cannot** detect effects of this kind: {row.why}{down}"
        lines.append({"kind": row.kind, "what it reads": row.what, "positive control": row.positive,
                      "negative control": row.negative, "verdict": sentence})
    intro = ("Kinds of effect (config `effects`): each kind's positive control (NegCLIP against plain fine-tuning, "
             "an effect the literature reports) and negative control (the same recipe with random captions in the "
             "negative slot); a claim's verdict is evidence only where every kind it reads passes both. MDE: the "
             "smallest effect detected with 80 % power at this study's seeds and items.\n\n")
    return intro + markdown_table(pd.DataFrame(lines))


def effect_number(value: float, unit: str) -> str:
    """An effect or CI bound as every table shows it: points to 0.1, ratios and rho to 0.001 (a gradient
    share differs in the third decimal)."""
    if math.isnan(float(value)):
        return "n/a"
    return f"{float(value):+.1f}" if unit == "points" else f"{float(value):+.3f}"


def claims_markdown(table: pd.DataFrame, bases: int = 1, kinds: pd.DataFrame | None = None) -> str:
    """What a person reads: the kinds of effect and whether this testbed detects them (`kinds_markdown`), then
    per claim its effect with its CI, Holm-adjusted p, minimum detectable effect and verdict (`untestable here`
    with why where a kind it reads fails its controls); `bases`: how many pretrained bases the fine-tuning seeds
    are spread over (study.base_seeds). Hypotheses (the study's own tests of a seed's explanation) follow in a
    table of their own."""
    own = table[table["role"] == HYPOTHESIS]
    table = table[table["role"] != HYPOTHESIS]
    sides = control_sides(kinds)
    shown = _claim_rows(table, sides)
    seeds = sorted({int(n) for n in pd.concat([table["n_seeds"], own["n_seeds"]]) if n})
    # a claim on the base's ConcretePlant pairs reads one model: say so rather than list "1, 3" seeds
    fewer = "; fewer where a claim reads a single model, n_seeds in claims.csv" if len(seeds) > 1 else ""
    spread = f" over {bases} pretrained bases" if bases > 1 else ""
    interval = (f"a {'seeds-within-bases-then-items' if bases > 1 else 'seeds-then-items'} bootstrap "
                f"(the effect on {'these bases' if bases > 1 else 'this base'})")
    intro = (f"Claims of the seed papers measured on this study ({seeds[-1] if seeds else 'no'} fine-tuning "
             f"seed(s) per method{spread}{fewer}; effects in percentage points unless marked; 95 % CIs from "
             f"{interval}; MDE: the smallest effect detected with 80 % power; p adjusted by Holm across the claims, "
             f"controls separately; the CIs are the raw ones: where one clears the null and the Holm p does not, "
             f"`why` says so; a control's verdict reads passes or fails, what it means for its kind).\n\n")
    opening = "" if kinds is None or kinds.empty else kinds_markdown(kinds) + "\n"
    text = opening + intro + markdown_table(shown)
    if not own.empty:
        text += ("\nThe study's own tests of the seeds' explanations (role hypothesis: comparisons no seed reports; "
                 "Holm across these separately).\n\n"
                 + markdown_table(_claim_rows(own, sides)))
    return text


def claim_why(row: Any) -> str:
    """A claims table row's `why`: the gate's reason (a kind it reads fails its controls) and the Holm note."""
    why = "" if pd.isna(getattr(row, "why", "")) else str(getattr(row, "why", ""))
    note = "" if pd.isna(getattr(row, "note", "")) else str(getattr(row, "note", ""))
    stored = [part for part in note.split("; ") if part.startswith(STORED)]
    return "; ".join(w for w in (why, holm_note(getattr(row, "p", math.nan), row.p_holm), *stored) if w)


def _claim_rows(table: pd.DataFrame, sides: dict[str, str] | None = None) -> pd.DataFrame:
    """The claims table's columns for people, one row per claim (a control's verdict in `control_word`s)."""
    sides = sides or {}
    return pd.DataFrame({
        "claim": [f"{r.id}{' (control)' if r.role == 'control' else ''}" for r in table.itertuples()],
        "statement": table["statement"],
        "comparison": table["comparison"],
        "metric": table["metric"],
        "expected": [f"{r.expected}{f' (margin {r.margin:g})' if r.margin else ''}" for r in table.itertuples()],
        "effect [95% CI]": [f"{_bounds(r)} {r.unit}" for r in table.itertuples()],
        "MDE": [effect_number(r.mde, r.unit).lstrip("+") for r in table.itertuples()],
        "p (Holm)": [("n/a" if math.isnan(p) else f"{p:.3g}") for p in table["p_holm"]],
        "verdict": [control_word(sides.get(str(r.id)) if r.role == "control" else None, str(r.verdict))
                    for r in table.itertuples()],
        "why": [claim_why(r) for r in table.itertuples()],
    })


def write_claims(claims: list[dict[str, Any]], composites: dict[str, list[str]], eval_jsons: list[str],
                 out_dir: str | Path, losses: dict[str, str] | None = None, pairs: str | None = None,
                 draws: int = DRAWS, seed: int = 0, base_seeds: list[int] | None = None,
                 effects: dict[str, Any] | None = None) -> pd.DataFrame:
    """Measure `claims` (config entries) on the results and write claims.csv, effects.csv (the kinds of effect
    and their controls) and claims.md (both, for people) to out_dir."""
    if not claims:
        raise ContractError("no claims to measure (config key claims is empty)")
    results = StudyResults(eval_jsons, composites, losses, pairs, base_seeds)
    table = measure_claims([Claim.from_config(c) for c in claims], results, draws, seed, effects)
    kinds = kind_table(table, effects or {})
    out_dir = Path(out_dir)
    write_text(table.to_csv(index=False, na_rep="NaN"), out_dir / "claims.csv")
    write_text(kinds.to_csv(index=False, na_rep="NaN"), out_dir / "effects.csv")
    write_text(claims_markdown(table, len(base_seeds) if base_seeds else 1, kinds), out_dir / "claims.md")
    return table
