"""The study's figures: matplotlib, a PNG for the report and a PDF for papers, drawn only from the tables
the workflow writes (no statistic is recomputed here: means and CIs come from `compo.stats`).

Inputs (`FigureInputs`; every one optional, a figure whose input the study did not produce is written
as a notice image that says why, and the reason is logged):
  summary          results/tables/results.csv (`compo.stats.seed_summary`): mean, sd, 95 % CI over seeds
                   per (method, dataset, benchmark, metric) and the headline flag; composites have
                   benchmark "composite" and metric = their name (config `composites`)
  claims           results/tables/claims.csv: effect, CI, Holm p and verdict per claim (`compo.claims`)
  effects          results/tables/effects.csv: the kinds of effect and their controls (a control's verdict
                   reads passes / fails: `compo.claims.control_word`)
  kinds            {benchmark: kind} of the config's benchmarks (which subsets and chance levels apply)
  correlations     results/tables/correlations.csv: Spearman across models (ci_low / ci_high if present)
  losses           results/models/{method}/{dataset}/seed{N}/losses.csv: loss terms, stat_* per step
  quality          results/tables/negatives/{dataset}/quality.csv: truth shares by concreteness bin
  pairs            results/tables/concreteplant/{dataset}.pairs.csv: the base model's per-pair scores
  attributes       results/tables/datasets/{dataset}.csv: dataset attributes (seed 004)

`FIGURES` lists the figures, each with the seed figure it reproduces; `draw_figures` (`compo figures`)
writes `{name}.png` and `{name}.pdf` for every one of them. A malformed input (a required column
missing) is an error naming the file and the column, never a notice.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from compo.claims import KIND_COLUMNS, control_sides, control_word  # noqa: E402
from compo.evaluate.kinds import declared, kind_of  # noqa: E402
from compo.io import atomic_path  # noqa: E402
from compo.layout import WISEFT_METHOD, is_base  # noqa: E402

log = logging.getLogger(__name__)

# Okabe & Ito (2008), the colour-blind safe qualitative palette (yellow left out: unreadable on white).
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]
BASE_COLOUR = "#555555"
VERDICT_STYLE = {  # colour and marker: the verdict reads from the shape and the legend too
    "holds": ("#0072B2", "o"),
    "equivalent": ("#009E73", "D"),
    "not detected": ("#888888", "s"),
    "reversed": ("#D55E00", "X"),
    "untestable here": ("#CC79A7", "P"),  # a kind it reads fails its controls (compo.claims.gate)
}
TRUTH_STYLE = {  # negative quality: share of valid negatives by the world's verdict
    "false": ("truly false (a real negative)", "#0072B2", ""),
    "true": ("accidentally true (a hard positive)", "#D55E00", "//"),
    "unknown": ("unknown (no ground truth)", "#BBBBBB", ".."),
}
POLICY_STYLE = {  # ConcretePlant's sampling policies (seed 002: D_hc, D_lc, D_wo)
    "hc": ("D_hc: high concreteness", "#0072B2"),
    "lc": ("D_lc: low concreteness", "#D55E00"),
    "wo": ("D_wo: concreteness ignored", "#009E73"),
}
GRADIENT_SHARES = {  # Cement's logged Eq. 3 shares (compo.losses.cement)
    "stat_pull": ("pull (1 - p_ii)", "#000000", "-"),
    "stat_hard_push": ("hard-negative push (p_ii')", "#D55E00", "-"),
    "stat_easy_push": ("easy-negative push (sum of p_ij)", "#0072B2", "--"),
}
LOSS_LOG_COLUMNS = {"step", "epoch", "lr", "seconds", "loss"}  # losses.csv columns that are not loss terms
MODEL_DIR = re.compile(r"(?P<method>[^/]+)/(?P<dataset>[^/]+)/seed(?P<seed>\d+)/losses\.csv$")

SUMMARY_COLUMNS = ["method", "dataset", "benchmark", "metric", "mean", "ci_low", "ci_high", "n_seeds"]
CLAIMS_COLUMNS = ["id", "role", "statement", "comparison", "metric", "effect", "ci_low", "ci_high", "p_holm",
                  "verdict", "unit"]
CORRELATION_COLUMNS = ["metric_a", "metric_b", "rho", "n"]
QUALITY_COLUMNS = ["negatives", "group", "valid", "false_rate", "true_rate", "unknown_rate"]
PAIRS_COLUMNS = ["policy", "concreteness", "score_pos", "score_neg"]


class FigureUnavailable(Exception):
    """The figure cannot be drawn from what the study produced (the message says why)."""


@dataclass
class FigureInputs:
    summary: Path | None = None
    claims: Path | None = None
    effects: Path | None = None                        # effects.csv: which controls are negative (their words)
    kinds: dict[str, str] = field(default_factory=dict)
    correlations: Path | None = None
    losses: list[Path] = field(default_factory=list)
    quality: list[Path] = field(default_factory=list)
    pairs: list[Path] = field(default_factory=list)
    attributes: list[Path] = field(default_factory=list)
    order: list[str] = field(default_factory=list)   # method order of the config (bases first otherwise)
    compositional: str = "compositional"               # composite names (config `composites`)
    zero_shot: str = "zero-shot"


# --- reading -----------------------------------------------------------------------------------------
def read_csv(path: Path | None, columns: Sequence[str], what: str) -> pd.DataFrame:
    """A table the study wrote; FigureUnavailable when the study did not write it, ValueError naming the
    file and column when it lacks a required column."""
    if path is None:
        raise FigureUnavailable(f"the study wrote no {what}")
    path = Path(path)
    if not path.exists():
        raise FigureUnavailable(f"{path} ({what}) does not exist")
    frame = pd.read_csv(path)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} of the {what} (expected {list(columns)})")
    return frame


def read_many(paths: Iterable[Path], columns: Sequence[str], what: str) -> list[tuple[Path, pd.DataFrame]]:
    tables = [(Path(p), read_csv(Path(p), columns, what)) for p in paths]
    if not tables:
        raise FigureUnavailable(f"the study wrote no {what}")
    return tables


def dataset_of(path: Path) -> str:
    """The dataset a per-dataset table belongs to: `{dataset}.csv`, `{dataset}.pairs.csv` or `{dataset}/x.csv`."""
    if path.name.endswith(".pairs.csv"):
        return path.name.removesuffix(".pairs.csv")
    if path.name == "quality.csv":
        return path.parent.name
    return path.stem


def model_of(path: Path) -> tuple[str, str, int]:
    """(method, dataset, seed) of a model's losses.csv."""
    match = MODEL_DIR.search(Path(path).as_posix())
    if match is None:
        raise ValueError(f"{path}: expected results/models/<method>/<dataset>/seed<N>/losses.csv")
    return match["method"], match["dataset"], int(match["seed"])


# --- styles ------------------------------------------------------------------------------------------
def ordered_methods(methods: Iterable[str], order: Sequence[str] = ()) -> list[str]:
    """Bases first, then the config's order, then the rest by name."""
    rank = {m: i for i, m in enumerate(order)}
    return sorted(set(methods), key=lambda m: (not is_base(m), rank.get(m, len(rank)), m))


def method_styles(methods: Sequence[str]) -> dict[str, dict[str, object]]:
    """One colour and marker per method, the same in every figure: colours cycle through 7 and markers
    through 10, so no two of the first 70 methods share both; bases are grey stars."""
    styles: dict[str, dict[str, object]] = {}
    i = 0
    for method in methods:
        if is_base(method):
            styles[method] = {"color": BASE_COLOUR, "marker": "*"}
            continue
        styles[method] = {"color": OKABE_ITO[i % len(OKABE_ITO)], "marker": MARKERS[i % len(MARKERS)]}
        i += 1
    return styles


def model_labels(frame: pd.DataFrame) -> pd.Series:
    """'method', or 'method (dataset)' where the method appears with several datasets."""
    datasets = frame.groupby("method")["dataset"].nunique()
    several = frame["method"].map(datasets) > 1
    return frame["method"].where(~several, frame["method"] + " (" + frame["dataset"] + ")")


def percent(values: pd.Series | np.ndarray | float) -> pd.Series | np.ndarray | float:
    return values * 100


def _style() -> None:
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
                         "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 100})


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)


def _errors(frame: pd.DataFrame, mean: str = "mean", low: str = "ci_low", high: str = "ci_high") -> np.ndarray:
    """Asymmetric error bar lengths [below, above] in percent (0 where the CI is missing: one seed)."""
    below = (frame[mean] - frame[low]).fillna(0).clip(lower=0)
    above = (frame[high] - frame[mean]).fillna(0).clip(lower=0)
    return percent(np.vstack([below.to_numpy(), above.to_numpy()]))


# --- 1. compositional vs zero-shot trade-off (FSC-CLIP Figure 1) ---------------------------------------
def composite_points(summary: pd.DataFrame, x: str, y: str, wiseft: bool) -> pd.DataFrame:
    """One row per (method, dataset) with x_/y_ mean and CI of two composites (WiSE-FT models or not)."""
    composites = summary[summary["benchmark"] == "composite"]
    composites = composites[composites["method"].str.match(WISEFT_METHOD) == wiseft]
    missing = [name for name in (x, y) if name not in set(composites["metric"])]
    if missing:
        kind = "WiSE-FT models'" if wiseft else "methods'"
        raise FigureUnavailable(f"results.csv has no {kind} composite(s) {', '.join(missing)} "
                                f"(benchmark 'composite'; config `composites`)")
    keys = ["method", "dataset"]
    columns = ["mean", "ci_low", "ci_high", "n_seeds"]
    a = composites[composites["metric"] == x].set_index(keys)[columns].add_prefix("x_")
    b = composites[composites["metric"] == y].set_index(keys)[columns].add_prefix("y_")
    points = a.join(b, how="inner").reset_index()
    return points.dropna(subset=["x_mean", "y_mean"])


def tradeoff_points(inputs: FigureInputs, wiseft: bool) -> tuple[pd.DataFrame, str, str]:
    """The zero-shot (x) and compositional (y) composites of the study's methods or its WiSE-FT models."""
    summary = read_csv(inputs.summary, SUMMARY_COLUMNS, "summary table (mean and CI over seeds)")
    x, y = inputs.zero_shot, inputs.compositional
    points = composite_points(summary, x, y, wiseft=wiseft)
    if points.empty:
        raise FigureUnavailable(f"no {'WiSE-FT model' if wiseft else 'method'} has both the {x} and the {y} composite")
    return points, x, y


def figure_tradeoff(inputs: FigureInputs) -> Figure:
    points, x, y = tradeoff_points(inputs, wiseft=False)
    methods = ordered_methods(points["method"], inputs.order)
    styles = method_styles(methods)
    points = points.assign(label=model_labels(points), rank=points["method"].map(methods.index))
    points = points.sort_values(["rank", "dataset"])
    fig, ax = plt.subplots(figsize=(8.5, 5.6))
    for base in points[points["method"].map(is_base)].itertuples():
        ax.axvline(percent(base.x_mean), color=BASE_COLOUR, lw=0.8, ls=":", zorder=0)
        ax.axhline(percent(base.y_mean), color=BASE_COLOUR, lw=0.8, ls=":", zorder=0)
    for row in points.itertuples():
        one = pd.DataFrame([row._asdict()])
        style = styles[row.method]
        ax.errorbar(percent(row.x_mean), percent(row.y_mean),
                    xerr=_errors(one, "x_mean", "x_ci_low", "x_ci_high"),
                    yerr=_errors(one, "y_mean", "y_ci_low", "y_ci_high"),
                    fmt=style["marker"], color=style["color"], ms=14 if is_base(row.method) else 8,
                    mec="white", mew=0.6, elinewidth=1, capsize=2.5, label=row.label, alpha=0.95)
    ax.set_xlabel(f"Zero-shot accuracy: '{x}' composite (%)")
    ax.set_ylabel(f"Compositional accuracy: '{y}' composite (%)")
    ax.set_title(f"Compositionality vs zero-shot per method (mean over seeds, 95 % CI)\n"
                 f"dotted lines: the base model{'s' if points['method'].map(is_base).sum() > 1 else ''}; "
                 f"up is more compositional, right keeps more zero-shot")
    ax.grid(True, alpha=0.3)
    ax.margins(0.08)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="method", borderaxespad=0)
    return fig


# --- 2. WiSE-FT trajectories (FSC-CLIP Figure 4) ---------------------------------------------------------
def figure_wiseft(inputs: FigureInputs) -> Figure:
    points, x, y = tradeoff_points(inputs, wiseft=True)
    parsed = points["method"].str.extract(WISEFT_METHOD)
    points = points.assign(finetuned=parsed["method"], alpha=parsed["alpha"].astype(float))
    methods = ordered_methods(points["finetuned"], inputs.order)
    styles = method_styles(ordered_methods(set(methods) | set(inputs.order), inputs.order))
    fig, ax = plt.subplots(figsize=(8.5, 5.6))
    for (method, dataset), path in points.groupby(["finetuned", "dataset"]):
        path = path.sort_values("alpha")
        style = styles[method]
        label = method if points.loc[points["finetuned"] == method, "dataset"].nunique() == 1 \
            else f"{method} ({dataset})"
        ax.errorbar(percent(path["x_mean"]), percent(path["y_mean"]),
                    xerr=_errors(path, "x_mean", "x_ci_low", "x_ci_high"),
                    yerr=_errors(path, "y_mean", "y_ci_low", "y_ci_high"),
                    fmt="-" + str(style["marker"]), color=style["color"], ms=6, lw=1.5, elinewidth=0.7,
                    capsize=2, label=label)
        for end in (path.iloc[0], path.iloc[-1]):
            ax.annotate(f"α={end['alpha']:g}", (percent(end["x_mean"]), percent(end["y_mean"])),
                        textcoords="offset points", xytext=(6, 4), fontsize=8, color=style["color"])
    ax.set_xlabel(f"Zero-shot accuracy: '{x}' composite (%)")
    ax.set_ylabel(f"Compositional accuracy: '{y}' composite (%)")
    ax.set_title("WiSE-FT trajectories: base (α=0) to fine-tuned (α=1) weights, per method\n"
                 "mean over seeds with 95 % CI; a trajectory further up-right is the better trade-off")
    ax.grid(True, alpha=0.3)
    ax.margins(0.08)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="fine-tuned method",
              borderaxespad=0)
    return fig


# --- 3. per-benchmark subset scores ---------------------------------------------------------------------
def benchmark_panels(summary: pd.DataFrame, kinds: dict[str, str]) -> list[tuple[str, str, str]]:
    """(benchmark, kind, metric) of every compositional subset the study evaluated: the benchmarks in `kinds`' order
    (the rule passes them sorted by name), each kind's subsets in its declaration's order (`compo.evaluate.kinds`)."""
    metrics = summary.groupby("benchmark")["metric"].agg(set)
    declarations = declared()
    panels = []
    for benchmark, kind in kinds.items():
        if kind in declarations and benchmark in metrics.index:
            panels += [(benchmark, kind, m) for m in declarations[kind].subsets if m in metrics[benchmark]]
    return panels


def chance_level(kind: str, metric: str) -> float | None:
    """The subset's chance level where the protocol fixes it (its kind's declaration), else None."""
    return kind_of(kind).chance_of(metric)


def figure_benchmarks(inputs: FigureInputs) -> Figure:
    summary = read_csv(inputs.summary, SUMMARY_COLUMNS, "summary table (mean and CI over seeds)")
    panels = benchmark_panels(summary, inputs.kinds)
    if not panels:
        compositional = [kind for kind, benchmark in declared().items() if benchmark.compositional]
        raise FigureUnavailable(f"the study evaluated none of the compositional benchmarks "
                                f"({', '.join(compositional)})")
    rows = summary[~summary["method"].str.match(WISEFT_METHOD) & (summary["benchmark"] != "composite")]
    rows = rows.assign(label=model_labels(rows))
    methods = ordered_methods(rows["method"], inputs.order)
    labels = list(dict.fromkeys(rows.assign(r=rows["method"].map(methods.index))
                                .sort_values(["r", "dataset"])["label"]))
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    height = 1.1 + 0.24 * len(labels)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.5 * ncols + 1.4, height * nrows + 0.8), sharey=True,
                             squeeze=False)
    positions = np.arange(len(labels))
    for ax, (benchmark, kind, metric) in zip(axes.flat, panels, strict=False):
        cell = rows[(rows["benchmark"] == benchmark) & (rows["metric"] == metric)].set_index("label")
        cell = cell.reindex(labels)
        colours = [BASE_COLOUR if isinstance(m, str) and is_base(m) else OKABE_ITO[0] for m in cell["method"]]
        ax.barh(positions, percent(cell["mean"].fillna(0)), xerr=_errors(cell), color=colours,
                height=0.7, error_kw={"elinewidth": 0.8, "capsize": 1.5})
        for i in np.flatnonzero(cell["mean"].isna().to_numpy()):
            ax.text(1, positions[i], "not evaluated", va="center", fontsize=7, color=BASE_COLOUR)
        for i in np.flatnonzero((cell["mean"] == 0).to_numpy()):  # a zero-width bar would read as missing
            ax.text(1, positions[i], "0 %", va="center", fontsize=7)
        chance = chance_level(kind, metric)
        if chance is not None:
            ax.axvline(percent(chance), color="#D55E00", ls="--", lw=1)
        ax.set_xlim(0, 100)
        ax.set_title(f"{benchmark}\n{metric}", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
        ax.tick_params(axis="y", length=0)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_yticks(positions, labels)
        ax.invert_yaxis()
    for ax in axes[-1, :]:
        ax.set_xlabel("accuracy (%)")
    fig.suptitle("Compositional benchmarks, subset by subset: every method's accuracy (mean over seeds, "
                 "95 % CI)\ngrey: base model; dashed: chance level", y=1.0)
    fig.tight_layout()
    return fig


# --- 4. concreteness vs logit gap (Concrete Jungle Figure 5) --------------------------------------------
def figure_concreteness_gap(inputs: FigureInputs) -> Figure:
    from statsmodels.nonparametric.smoothers_lowess import lowess

    tables = read_many(inputs.pairs, PAIRS_COLUMNS, "ConcretePlant per-pair table (no ConcretePlant negatives "
                                                    "in the config)")
    policies = [p for p in POLICY_STYLE if any(p in set(t["policy"]) for _, t in tables)]
    per_dataset = math.ceil((len(policies) + 1) / 2)  # rows of two panels: each policy, then the fits compared
    fig, axes = plt.subplots(per_dataset * len(tables), 2, figsize=(10.5, 3.4 * per_dataset * len(tables)),
                             sharey=True, squeeze=False)
    for d, (path, table) in enumerate(tables):
        dataset = dataset_of(path)
        panels = list(axes[d * per_dataset:(d + 1) * per_dataset].flat)
        for ax in panels[len(policies) + 1:]:
            ax.set_visible(False)
        compared = panels[len(policies)]
        table = table.assign(gap=table["score_pos"] - table["score_neg"])
        for policy, ax in zip(policies, panels, strict=False):
            label, colour = POLICY_STYLE[policy]
            pairs = table[table["policy"] == policy]
            rated = pairs.dropna(subset=["concreteness"])
            unrated = len(pairs) - len(rated)
            if unrated:
                log.info("%s %s: %d of %d pairs have no rated keyword and are left out", path, policy,
                         unrated, len(pairs))
            ax.scatter(rated["concreteness"], rated["gap"], s=10, alpha=0.35, color=colour, lw=0)
            title = f"{dataset} · {label}\n{len(rated)} pairs" + (f" ({unrated} unrated left out)" if unrated else "")
            ax.set_title(title, fontsize=9)
            if rated["concreteness"].nunique() >= 3 and len(rated) >= 5:
                fit = lowess(rated["gap"], rated["concreteness"], frac=0.6, return_sorted=True)
                ax.plot(fit[:, 0], fit[:, 1], color="black", lw=2, label="LOESS")
                compared.plot(fit[:, 0], fit[:, 1], color=colour, lw=2, label=label)
                ax.legend(loc="best", frameon=False)
            else:
                ax.text(0.5, 0.05, "too few rated pairs for a LOESS fit", transform=ax.transAxes,
                        ha="center", fontsize=8)
        compared.set_title(f"{dataset} · LOESS fits compared", fontsize=9)
        if compared.lines:
            compared.legend(loc="best", frameon=False, fontsize=8)
        for ax in panels[:len(policies) + 1]:
            ax.axhline(0, color=BASE_COLOUR, lw=0.8, ls=":")
            ax.set_xlim(1, 5)
            ax.set_xlabel("keyword concreteness (Brysbaert, 1-5)")
            ax.grid(True, alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("score(caption) - score(negative)\n(cosine similarity)")
    fig.suptitle("Base model's score gap between a caption and its ConcretePlant negative\nvs the changed "
                 "keyword's concreteness (above 0: the base tells them apart; a point per negative)", y=1.0)
    fig.tight_layout()
    return fig


# --- 5. gradient shares over training (Concrete Jungle Figures 3 and 6) --------------------------------
def read_losses(paths: Sequence[Path]) -> pd.DataFrame:
    """Every losses.csv in one long frame with method, dataset and seed columns."""
    frames = []
    for path in paths:
        method, dataset, seed = model_of(path)
        table = read_csv(Path(path), ["step"], "training log (losses.csv)")
        frames.append(table.assign(method=method, dataset=dataset, seed=seed))
    if not frames:
        raise FigureUnavailable("the study wrote no training logs (losses.csv)")
    return pd.concat(frames, ignore_index=True)


def smoothing_window(steps: int) -> int:
    """Rolling-mean window: about 50 points per curve, none for short runs."""
    return max(1, steps // 50)


def seed_band(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per step: mean, min and max over seeds of `column` (rolling-mean smoothed per seed first)."""
    window = smoothing_window(int(frame["step"].nunique()))
    smoothed = frame.sort_values("step").groupby("seed")[column].transform(
        lambda s: s.rolling(window, min_periods=1).mean())
    grouped = frame.assign(value=smoothed).groupby("step")["value"]
    return pd.DataFrame({"mean": grouped.mean(), "low": grouped.min(), "high": grouped.max()}).reset_index()


def _grid(n: int, ncols: int, width: float, height: float, **kwargs) -> tuple[Figure, np.ndarray]:
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kwargs)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def figure_gradient_shares(inputs: FigureInputs) -> Figure:
    logs = read_losses(inputs.losses)
    shares = [c for c in GRADIENT_SHARES if c in logs.columns]
    if len(shares) < len(GRADIENT_SHARES):
        raise FigureUnavailable("no training log has Cement's gradient shares (stat_pull, stat_hard_push, "
                                "stat_easy_push): the study trains no method with loss: cement")
    logs = logs.dropna(subset=shares)
    models = logs[["method", "dataset"]].drop_duplicates()
    models = models.assign(label=model_labels(models))
    order = ordered_methods(models["method"], inputs.order)
    models = models.assign(r=models["method"].map(order.index)).sort_values(["r", "dataset"])
    fig, axes = _grid(len(models) + 1, 3, 3.6, 3.2)
    window = smoothing_window(int(logs["step"].nunique()))
    smoothed = f"; rolling mean of {window} steps" if window > 1 else ""
    styles = method_styles(order)
    last = axes.flat[len(models)]
    for ax, model in zip(axes.flat, models.itertuples(), strict=False):
        if ax is not axes.flat[0]:
            ax.sharey(axes.flat[0])
        runs = logs[(logs["method"] == model.method) & (logs["dataset"] == model.dataset)]
        for column in shares:
            label, colour, ls = GRADIENT_SHARES[column]
            band = seed_band(runs, column)
            ax.plot(band["step"], band["mean"], color=colour, ls=ls, lw=1.5, label=label)
            ax.fill_between(band["step"], band["low"], band["high"], color=colour, alpha=0.15, lw=0)
        ax.set_title(f"{model.label} ({runs['seed'].nunique()} seeds)", fontsize=10)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("gradient share (probability mass)")
        ax.grid(True, alpha=0.3)
        ratio = runs.assign(ratio=runs["stat_hard_push"] / runs["stat_pull"])
        band = seed_band(ratio, "ratio")
        style = styles[model.method]
        last.plot(band["step"], band["mean"], color=style["color"], marker=style["marker"], markevery=0.1,
                  lw=1.5, label=model.label)
        last.fill_between(band["step"], band["low"], band["high"], color=style["color"], alpha=0.12, lw=0)
    last.set_title("hard-negative push as a share of the pull", fontsize=10)
    last.set_xlabel("training step")
    last.set_ylabel("hard push / pull (ratio)")
    last.grid(True, alpha=0.3)
    last.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=8, borderaxespad=0)
    fig.suptitle("Where the contrastive gradient goes (seed 002, Eq. 3; pull = hard push + easy push per query)\n"
                 f"line: mean over seeds, band: min-max over seeds{smoothed}", y=1.0)
    fig.tight_layout()
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="upper center", ncol=3, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    return fig


# --- 6. benchmark correlations (Long Story Short) ------------------------------------------------------
def short_metric(column: str) -> str:
    benchmark, _, metric = column.partition("/")
    return f"{benchmark}\n{metric}"


# An annotated cell needs ~0.7 in: past this many metrics the heatmap shows the compositional benchmarks' (the
# paper study's 87 headline metrics made a 70 x 60 in figure of 3,741 cells, 60 Mpx and a minute to draw)
MAX_CORRELATION_METRICS = 20


def correlation_metrics(table: pd.DataFrame, kinds: dict[str, str]) -> tuple[list[str], str]:
    """The metrics the heatmap shows, and a note when they are a part of the table's: every metric up to
    MAX_CORRELATION_METRICS, else those of compositional kinds (`compo.evaluate.kinds`: a kind with subsets)."""
    names = list(dict.fromkeys(list(table["metric_a"]) + list(table["metric_b"])))
    if len(names) <= MAX_CORRELATION_METRICS:
        return names, ""
    declarations = declared()
    kept = [n for n in names if getattr(declarations.get(metric_kind(n, kinds)), "compositional", False)]
    return kept, f"the {len(kept)} compositional of {len(names)} metrics (every pair: tables/correlations.csv)"


def metric_kind(metric: str, kinds: dict[str, str]) -> str:
    """The kind of a `benchmark/metric` column (the benchmark's name when the config does not say)."""
    benchmark = metric.split("/")[0]
    return kinds.get(benchmark, benchmark)


def figure_correlations(inputs: FigureInputs) -> Figure:
    table = read_csv(inputs.correlations, CORRELATION_COLUMNS, "correlation table")
    if table.empty:
        raise FigureUnavailable("the correlation table has no pairs (fewer than two benchmarks)")
    names, part = correlation_metrics(table, inputs.kinds)
    if len(names) < 2:
        raise FigureUnavailable(f"{part}: fewer than two to draw")
    table = table[table["metric_a"].isin(names) & table["metric_b"].isin(names)]
    index = {n: i for i, n in enumerate(names)}
    size = len(names)
    rho = np.full((size, size), np.nan)
    text = [["" for _ in names] for _ in names]
    with_ci = {"ci_low", "ci_high"} <= set(table.columns)
    for row in table.itertuples():
        i, j = sorted((index[row.metric_a], index[row.metric_b]), reverse=True)  # lower triangle
        rho[i, j] = row.rho
        cell = "n/a" if pd.isna(row.rho) else f"{row.rho:+.2f}"
        if with_ci and not pd.isna(row.rho) and not pd.isna(row.ci_low):
            cell += f"\n[{row.ci_low:+.2f}, {row.ci_high:+.2f}]"
        text[i][j] = cell
    # rows 1.., columns ..n-2: the lower triangle without the empty first row and last column
    shown = rho[1:, :-1]
    fig, ax = plt.subplots(figsize=(0.78 * (size - 1) + 3.0, 0.66 * (size - 1) + 2.4))
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#FFFFFF")
    image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, vmin=-1, vmax=1)
    for i in range(1, size):
        for j in range(i):
            value = rho[i, j]
            if np.isnan(value):
                ax.add_patch(Rectangle((j - 0.5, i - 1.5), 1, 1, color="#E8E8E8", zorder=0))
            colour = "white" if not np.isnan(value) and abs(value) > 0.6 else "black"
            ax.text(j, i - 1, text[i][j], ha="center", va="center", fontsize=7.5, color=colour)
    kinds = inputs.kinds
    highlighted = 0
    for row in table.itertuples():
        pair = {metric_kind(c, kinds) for c in (row.metric_a, row.metric_b)}
        if any(k.startswith("aro") for k in pair) and "sugarcrepe_pp" in pair:
            i, j = sorted((index[row.metric_a], index[row.metric_b]), reverse=True)
            ax.add_patch(Rectangle((j - 0.5, i - 1.5), 1, 1, fill=False, ec="black", lw=2.5))
            highlighted += 1
    ax.set_xticks(range(size - 1), [short_metric(n) for n in names[:-1]], rotation=90, fontsize=8)
    ax.set_yticks(range(size - 1), [short_metric(n) for n in names[1:]], fontsize=8)
    ax.spines[["left", "bottom"]].set_visible(False)
    fig.colorbar(image, ax=ax, shrink=0.7, label="Spearman ρ across models")
    notes = ["95 % bootstrap CI in brackets" if with_ci else "no CI in the correlation table",
             "grey n/a: undefined (constant or too few models)"]
    if highlighted:
        notes.append("black frame: ARO vs SugarCrepe++")
    ax.set_title(f"Do the benchmarks rank models alike? Spearman ρ of headline metrics across up to "
                 f"{int(table['n'].max())} models\n" + "; ".join(notes) + (f"\n{part}" if part else ""), fontsize=10)
    fig.tight_layout()
    return fig


def figure_dataset_attributes(inputs: FigureInputs) -> Figure:
    tables = read_many(inputs.attributes, [], "dataset attribute table")
    summary = read_csv(inputs.summary, SUMMARY_COLUMNS, "summary table (mean and CI over seeds)")
    attributes = pd.concat([t.assign(dataset=t.get("dataset", dataset_of(p))) for p, t in tables],
                           ignore_index=True)
    scores = summary[(summary["benchmark"] == "composite") & (summary["metric"] == inputs.compositional)]
    if scores.empty:  # e.g. config/quick.yaml declares no compositional composite
        raise FigureUnavailable(f"the summary table has no '{inputs.compositional}' composite (config composites)")
    trained = scores[~scores["method"].map(is_base) & ~scores["method"].str.match(WISEFT_METHOD)]
    several = trained.groupby("method")["dataset"].nunique()
    several = several[several >= 2].index
    if len(several) == 0:
        raise FigureUnavailable("every method of this study trains on one dataset: attributes vs scores needs "
                                "a method trained on several datasets (config study.datasets)")
    numeric = [c for c in attributes.columns if c != "dataset" and pd.api.types.is_numeric_dtype(attributes[c])
               and attributes[c].nunique() > 1]
    if not numeric:
        raise FigureUnavailable("the dataset attribute tables have no attribute that varies between datasets")
    joined = trained[trained["method"].isin(several)].merge(attributes, on="dataset")
    styles = method_styles(ordered_methods(several, inputs.order))
    fig, axes = _grid(len(numeric), 3, 3.6, 3.2, sharey=True)
    for ax, attribute in zip(axes.flat, numeric, strict=False):
        for method, group in joined.groupby("method"):
            style = styles[method]
            ax.errorbar(group[attribute], percent(group["mean"]), yerr=_errors(group), fmt=str(style["marker"]),
                        color=style["color"], label=method, capsize=2)
        ax.set_xlabel(attribute)
        ax.grid(True, alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"'{inputs.compositional}' composite (%)")
    axes.flat[0].legend(frameon=False, fontsize=8)
    fig.suptitle("Dataset attributes vs compositional accuracy of methods trained on several datasets "
                 "(Long Story Short)", y=1.0)
    fig.tight_layout()
    return fig


# --- 7. training curves ------------------------------------------------------------------------------
def loss_terms(frame: pd.DataFrame) -> list[str]:
    """The loss terms of a log: every column but the step bookkeeping and stat_* diagnostics, with a value."""
    return [c for c in frame.columns if c not in LOSS_LOG_COLUMNS | {"method", "dataset", "seed"}
            and not c.startswith("stat_") and frame[c].notna().any()]


def figure_training_curves(inputs: FigureInputs) -> Figure:
    logs = read_losses(inputs.losses)
    models = logs[["method", "dataset"]].drop_duplicates()
    models = models.assign(label=model_labels(models))
    order = ordered_methods(models["method"], inputs.order)
    models = models.assign(r=models["method"].map(order.index)).sort_values(["r", "dataset"])
    fig, axes = _grid(len(models), 3, 3.6, 2.9)
    # one style per term across panels; the colours cycle through the palette (black is the total) and
    # the line style changes each cycle, so a study with many distinct terms still tells them apart
    terms_seen: dict[str, dict[str, str]] = {"loss": {"color": "#000000", "ls": "-"}}
    colours, dashes = OKABE_ITO[:-1], ["-", "--", ":", "-."]
    for ax, model in zip(axes.flat, models.itertuples(), strict=False):
        runs = logs[(logs["method"] == model.method) & (logs["dataset"] == model.dataset)].dropna(axis=1, how="all")
        terms = ["loss", *loss_terms(runs)] if "loss" in runs else loss_terms(runs)
        if len(terms) == 2 and runs[terms[0]].equals(runs[terms[1]]):
            terms = terms[:1]  # a one-term loss: the total is that term
        for term in terms:
            k = len(terms_seen) - 1
            style = terms_seen.setdefault(term, {"color": colours[k % len(colours)],
                                                 "ls": dashes[(k // len(colours)) % len(dashes)]})
            band = seed_band(runs, term)
            ax.plot(band["step"], band["mean"], **style, lw=2 if term == "loss" else 1.2, label=term)
            ax.fill_between(band["step"], band["low"], band["high"], color=style["color"], alpha=0.15, lw=0)
        positive = all((runs[t].dropna() > 0).all() for t in terms)
        if positive:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{model.label} ({runs['seed'].nunique()} seed{'s' if runs['seed'].nunique() > 1 else ''})",
                     fontsize=10)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=7, frameon=False, loc="best")
    for ax in axes.flat[:len(models)]:
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (nats)")
    window = smoothing_window(int(logs["step"].nunique()))
    fig.suptitle("Training curves: every loss term per method (line: mean over seeds, band: min-max over "
                 f"seeds{f'; rolling mean of {window} steps' if window > 1 else ''})\n"
                 "log scale where every value is positive", y=1.0)
    fig.tight_layout()
    return fig


# --- 8. negative quality --------------------------------------------------------------------------------
def figure_negative_quality(inputs: FigureInputs) -> Figure:
    tables = read_many(inputs.quality, QUALITY_COLUMNS, "negative quality table")
    panels = [(dataset_of(p), name, group) for p, t in tables for name, group in t.groupby("negatives", sort=True)]
    fig, axes = _grid(len(panels), 3, 3.6, 3.4, sharey=True)
    for ax, (dataset, name, table) in zip(axes.flat, panels, strict=False):
        rows = table[(table["group"] == "all")
                     | (table["group"].str.startswith("concreteness:") & (table["valid"].fillna(0) > 0))]
        labels = ["all" if g == "all" else g.removeprefix("concreteness:") for g in rows["group"]]
        positions = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for truth, (label, colour, hatch) in TRUTH_STYLE.items():
            share = percent(rows[f"{truth}_rate"].fillna(0).to_numpy())
            ax.bar(positions, share, bottom=bottom, color=colour, hatch=hatch, ec="white", lw=0.5, label=label)
            bottom += share
        for x, valid in zip(positions, rows["valid"], strict=True):
            ax.text(x, 101, f"n={int(valid) if not pd.isna(valid) else 0}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(positions, labels, rotation=30, fontsize=8)
        ax.set_ylim(0, 112)
        ax.set_title(f"{dataset} · {name}", fontsize=10)
        ax.set_xlabel("concreteness of the changed words\n(Brysbaert; bins without negatives left out)")
    for ax in axes[:, 0]:
        ax.set_ylabel("share of valid negatives (%)")
    handles = [Patch(facecolor=c, hatch=h, label=label, edgecolor="white") for label, c, h in TRUTH_STYLE.values()]
    fig.suptitle("Negative quality per generator: is the generated negative really false for its image? "
                 "(synthetic world's ground truth, by concreteness bin)", y=1.0)
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return fig


# --- 9. claims forest plot ----------------------------------------------------------------------------
UNIT_LABELS = {"points": "effect (percentage points)", "rho": "Spearman ρ", "ratio": "ratio"}


ROLE_TAGS = {"control": "[control] ", "hypothesis": "[hypothesis] "}  # claims' roles marked on the plot
FOREST_LABEL_PT = 11  # at PNG_DPI and FOREST_WIDTH_IN the labels stay >= 11 px wherever the report shows it >= 880 px
FOREST_LABEL_CHARS = 34  # a label wraps at this many characters (never cut)
FOREST_WIDTH_IN = 11


def figure_claims(inputs: FigureInputs) -> Figure:
    claims = read_csv(inputs.claims, CLAIMS_COLUMNS, "claims table")
    if claims.empty:
        raise FigureUnavailable("the claims table has no rows (config `claims` is empty)")
    unknown = sorted(set(claims["verdict"]) - set(VERDICT_STYLE))
    if unknown:
        raise ValueError(f"{inputs.claims}: column 'verdict' has {unknown}; expected one of {list(VERDICT_STYLE)}")
    sides = control_sides(read_csv(inputs.effects, KIND_COLUMNS, "kinds-of-effect table")
                          if inputs.effects is not None else None)
    claims = claims.assign(controls_first=claims["role"] != "control").reset_index(drop=True)
    # whole labels, wrapped (never cut), at a size that stays readable where the report shrinks the figure
    claims["label"] = [_wrap(f"{ROLE_TAGS.get(r.role, '')}{r.id} ({r.comparison})", FOREST_LABEL_CHARS)
                       for r in claims.itertuples()]
    units = list(dict.fromkeys(claims.sort_values("controls_first", kind="stable")["unit"]))
    line = FOREST_LABEL_PT * 1.25 / 72  # inches per label line
    row = {u: max(0.42, line * claims.loc[claims["unit"] == u, "label"].str.count("\n").add(1).max() + 0.15)
           for u in units}
    heights = [max(1.2, row[u] * (claims["unit"] == u).sum() + 0.9) for u in units]
    fig, axes = plt.subplots(len(units), 1, figsize=(FOREST_WIDTH_IN, sum(heights) + 0.8), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, unit in zip(axes[:, 0], units, strict=True):
        rows = claims[claims["unit"] == unit].sort_values("controls_first", kind="stable")
        y = np.arange(len(rows))
        for yi, row in zip(y, rows.itertuples(), strict=True):
            colour, marker = VERDICT_STYLE[row.verdict]
            low = row.ci_low if not pd.isna(row.ci_low) else row.effect
            high = row.ci_high if not pd.isna(row.ci_high) else row.effect
            ax.plot([low, high], [yi, yi], color=colour, lw=2)
            ax.plot([row.effect], [yi], marker=marker, color=colour, ms=9, mec="white")
            for bound in margin_bounds(getattr(row, "expected", ""), getattr(row, "margin", float("nan"))):
                ax.plot([bound], [yi], marker="|", color="black", ms=14, mew=2)
        ax.axvline(0.0, color="black", lw=0.8)  # no effect: every claim is a difference or a correlation
        # the id and what is compared: the statements are in the claims table (long ones would squeeze the plot)
        ax.set_yticks(y, list(rows["label"]), fontsize=FOREST_LABEL_PT)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        right = ax.twinx()
        right.set_ylim(ax.get_ylim())
        words = [control_word(sides.get(str(r.id)) if r.role == "control" else None, str(r.verdict))
                 for r in rows.itertuples()]
        right.set_yticks(y, [f"{w} (p_Holm {_p(r.p_holm)})" for w, r in zip(words, rows.itertuples(), strict=True)],
                         fontsize=FOREST_LABEL_PT)
        right.spines[["top", "right", "left"]].set_visible(False)
        right.tick_params(axis="y", length=0)
        for label, row in zip(right.get_yticklabels(), rows.itertuples(), strict=True):
            label.set_color(VERDICT_STYLE[row.verdict][0])
        ax.set_xlabel(UNIT_LABELS.get(unit, unit))
        ax.grid(True, axis="x", alpha=0.3)
        ax.tick_params(axis="y", length=0)
    handles = [plt.Line2D([], [], color=c, marker=m, lw=2, label=v) for v, (c, m) in VERDICT_STYLE.items()]
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", ncol=5, frameon=False, bbox_to_anchor=(0.5, 0.0),
               title="verdict")
    fig.suptitle("The seed papers' claims as measured: effect with raw 95 % CI, coloured by verdict (from the "
                 "Holm-adjusted p; controls first; | marks a claim's margin)", y=1.02)
    return fig


def margin_bounds(expected: str, margin: float) -> list[float]:
    """Where a claim's margin lies on its effect axis: -margin for "no worse than" (>=), +margin for "no
    better than" (<=), both for an equivalence margin around a directional claim; none without a margin."""
    if not isinstance(margin, int | float) or pd.isna(margin) or margin == 0:
        return []
    margin = abs(float(margin))
    return {">=": [-margin], "<=": [margin]}.get(str(expected), [-margin, margin])


def _p(value: float) -> str:
    if pd.isna(value):
        return "n/a"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


# --- the figure list and the entry point -----------------------------------------------------------------
@dataclass(frozen=True)
class FigureSpec:
    draw: Callable[[FigureInputs], Figure]
    title: str
    reproduces: str


FIGURES: dict[str, FigureSpec] = {
    "claims_forest": FigureSpec(figure_claims, "Claims: effects with 95 % CI by verdict", "the claims table"),
    "tradeoff": FigureSpec(figure_tradeoff, "Compositionality vs zero-shot trade-off", "FSC-CLIP Figure 1"),
    "wiseft": FigureSpec(figure_wiseft, "WiSE-FT trajectories", "FSC-CLIP Figure 4"),
    "benchmarks": FigureSpec(figure_benchmarks, "Compositional benchmarks by subset",
                             "the seeds' per-benchmark tables (DeGLA Tables 1-3, FSC-CLIP Table 1)"),
    "correlations": FigureSpec(figure_correlations, "Benchmark correlations across models",
                               "Long Story Short's ARO vs SugarCrepe++ analysis"),
    "dataset_attributes": FigureSpec(figure_dataset_attributes, "Dataset attributes vs scores",
                                     "Long Story Short's dataset-attribute analysis"),
    "concreteness_gap": FigureSpec(figure_concreteness_gap, "Concreteness vs score gap",
                                   "Concrete Jungle Figure 5"),
    "gradient_shares": FigureSpec(figure_gradient_shares, "Gradient shares over training",
                                  "Concrete Jungle Figures 3 and 6"),
    "training_curves": FigureSpec(figure_training_curves, "Training curves", "the methods' loss logs"),
    "negative_quality": FigureSpec(figure_negative_quality, "Negative quality", "ConcretePlant's validity checks"),
}


def notice_figure(title: str, reason: str) -> Figure:
    """The image written in place of a figure the study cannot draw: its title and why."""
    fig = plt.figure(figsize=(9, 1.8))
    fig.text(0.02, 0.7, f"{title}: not drawn for this study", fontsize=13, weight="bold")
    fig.text(0.02, 0.3, _wrap(f"Why: {reason}.", 110), fontsize=10, va="center")
    return fig


PNG_DPI = 120  # figures are at most ~11.5 in wide: ~1400 px, shown near 1:1 at the report's width


def save_figure(fig: Figure, png: Path, pdf: Path) -> None:
    for path, kwargs in ((png, {"dpi": PNG_DPI}), (pdf, {})):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix[1:], bbox_inches="tight", **kwargs)
    plt.close(fig)


def draw_figures(inputs: FigureInputs, out_dir: str | Path, names: Sequence[str] | None = None,
                 shown_dir: str | Path | None = None) -> dict[str, str]:
    """Write `{name}.png` and `{name}.pdf` of every figure (default: all of FIGURES) under `out_dir`;
    returns {name: "drawn" or the reason it was not}. With `shown_dir`, also `{shown_dir}/{name}/`
    for every figure, holding a copy of `{name}.png` only if it was drawn: the report shows what
    these folders hold, so a notice is never shown as a figure."""
    _style()
    out_dir = Path(out_dir)
    outcome = {}
    for name in names or list(FIGURES):
        if name not in FIGURES:
            raise ValueError(f"unknown figure {name!r} (known: {', '.join(FIGURES)})")
        spec = FIGURES[name]
        try:
            fig = spec.draw(inputs)
            outcome[name] = "drawn"
            log.info("figure %s (%s): drawn", name, spec.reproduces)
        except FigureUnavailable as why:
            plt.close("all")
            fig = notice_figure(spec.title, str(why))
            outcome[name] = str(why)
            log.warning("figure %s not drawn: %s", name, why)
        save_figure(fig, out_dir / f"{name}.png", out_dir / f"{name}.pdf")
        if shown_dir is not None:
            shown = Path(shown_dir) / name
            shown.mkdir(parents=True, exist_ok=True)
            if outcome[name] == "drawn":
                with atomic_path(shown / f"{name}.png") as tmp:
                    shutil.copyfile(out_dir / f"{name}.png", tmp)
            else:
                (shown / f"{name}.png").unlink(missing_ok=True)  # drawn by an earlier run
    return outcome
