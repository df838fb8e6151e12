"""Small literal tables in the formats the workflow writes, for the figure and report tests.

The per-seed values are literal; the summary (mean and t-interval over seeds) is computed here with scipy
the way the study's results.csv (`compo.stats.seed_summary`) holds it, so the figures get the contract's
columns without the study.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats

from compo.figures import FigureInputs

SEEDS = (0, 1, 2)
# (method, dataset): per benchmark/metric the three seeds' values (fractions)
SCORES = {
    ("base-clip", "pretrain"): {"sugarcrepe/swap_att": [0.55], "sugarcrepe/replace_obj": [0.80],
                                "sugarcrepe/overall": [0.70], "winoground/text": [0.30], "winoground/group": [0.10],
                                "zeroshot-shape/top1": [0.92]},
    ("clip-ft", "coco"): {"sugarcrepe/swap_att": [0.56, 0.58, 0.57], "sugarcrepe/replace_obj": [0.82, 0.84, 0.83],
                          "sugarcrepe/overall": [0.72, 0.74, 0.73], "winoground/text": [0.31, 0.29, 0.30],
                          "winoground/group": [0.12, 0.10, 0.11], "zeroshot-shape/top1": [0.90, 0.91, 0.89]},
    ("negclip", "coco"): {"sugarcrepe/swap_att": [0.70, 0.74, 0.72], "sugarcrepe/replace_obj": [0.84, 0.83, 0.85],
                          "sugarcrepe/overall": [0.80, 0.79, 0.81], "winoground/text": [0.33, 0.35, 0.34],
                          "winoground/group": [0.13, 0.12, 0.14], "zeroshot-shape/top1": [0.86, 0.88, 0.87]},
}
HEADLINE = {"sugarcrepe": "overall", "winoground": "group", "zeroshot-shape": "top1"}
KIND = {"sugarcrepe": "sugarcrepe", "winoground": "winoground", "zeroshot-shape": "zeroshot"}
# composites per seed: compositional = mean of sugarcrepe/overall and winoground/group; zero-shot = shape top1
WISEFT = {("wiseft-negclip-a0.0", "coco"): ([0.40, 0.40, 0.40], [0.92, 0.92, 0.92]),
          ("wiseft-negclip-a0.5", "coco"): ([0.45, 0.46, 0.44], [0.91, 0.90, 0.92]),
          ("wiseft-negclip-a1.0", "coco"): ([0.47, 0.455, 0.475], [0.86, 0.88, 0.87])}

CLAIMS = pd.DataFrame({
    "id": ["control-positive", "control-negative", "degla-hn", "lss-rank"],
    "role": ["control", "control", "claim", "claim"],
    "source": ["DESIGN 8", "DESIGN 8", "seed 000 Table 7", "seed 004 Sec. 5"],
    "statement": ["swap negatives teach binding", "random negatives do not", "hard negatives raise compositionality",
                  "ARO and SugarCrepe++ rank models differently"],
    "comparison": ["negclip vs clip-ft", "negclip-random vs clip-ft", "degla-cn vs clip-ft", "spearman"],
    "metric": ["sugarcrepe/swap_att", "sugarcrepe/swap_att", "compositional", "aro vs sugarcrepe_pp"],
    "expected": ["+", "+", "+", "-"],
    "margin": [0.0, 0.0, 0.0, 0.0],
    "effect": [15.0, 0.4, -2.0, 0.35],
    "ci_low": [11.0, -1.5, -3.5, -0.2],
    "ci_high": [19.0, 2.1, -0.5, 0.8],
    "p": [0.0001, 0.6, 0.01, 0.3],
    "p_holm": [0.0004, 1.0, 0.03, 0.6],
    "verdict": ["holds", "not detected", "reversed", "not detected"],
    "unit": ["points", "points", "points", "rho"],
    "n_seeds": [3, 3, 3, 3],
})

# the kinds of effect (compo.claims.kind_table): binding fails its negative control, recognition is read directly
EFFECTS = pd.DataFrame({
    "kind": ["binding", "recognition"],
    "what": ["which attribute goes with which object", "zero-shot classification"],
    "passes": [False, True],
    "positive": ["control-positive: +15.0 [+11.0, +19.0], holds", "none needed"],
    "negative": ["control-negative: +0.4 [-1.5, +2.1], not detected", "none needed"],
    "mde": [5.6, float("nan")],
    "reads": ["degla-hn", ""],
    "why": ["its negative control control-negative is reversed (+4.0 [+3.0, +5.0])",
            "read directly: the claim is about this accuracy itself"],
})

CORRELATIONS = pd.DataFrame({
    "metric_a": ["aro_relation/macro", "aro_relation/macro", "sugarcrepe/overall"],
    "metric_b": ["sugarcrepe/overall", "sugarcrepe_pp/itt_overall", "sugarcrepe_pp/itt_overall"],
    "method": ["spearman"] * 3,
    "rho": [0.5, -0.37, float("nan")],
    "p_value": [0.2, 0.4, float("nan")],
    "n": [8, 8, 8],
    "note": ["", "", "constant across models: sugarcrepe/overall"],
    "ci_low": [-0.1, -0.8, float("nan")],
    "ci_high": [0.9, 0.2, float("nan")],
})

QUALITY = pd.DataFrame({
    "negatives": ["swap"] * 3 + ["concrete-hc"] * 3,
    "group": ["all", "concreteness:[3,4)", "concreteness:unrated", "all", "concreteness:[3,4)", "concreteness:[4,5]"],
    "valid": [100, 0, 100, 60, 20, 40],
    "false_rate": [0.9, float("nan"), 0.9, 0.5, 0.25, 0.625],
    "true_rate": [0.05, float("nan"), 0.05, 0.1, 0.25, 0.025],
    "unknown_rate": [0.05, float("nan"), 0.05, 0.4, 0.5, 0.35],
})


def long_table() -> pd.DataFrame:
    rows = []
    for (method, dataset), metrics in SCORES.items():
        for column, values in metrics.items():
            benchmark, metric = column.split("/")
            seeds = SEEDS if len(values) > 1 else (0,)
            for seed, value in zip(seeds, values, strict=True):
                rows.append({"model": f"{method}/{dataset}/seed{seed}", "method": method, "dataset": dataset,
                             "seed": seed, "benchmark": benchmark, "kind": KIND[benchmark], "protocol": "p",
                             "metric": metric, "value": value, "n": 100, "headline": HEADLINE[benchmark] == metric,
                             "source": "x.json"})
    return pd.DataFrame(rows)


def mean_ci(values: list[float]) -> dict[str, float]:
    x = np.asarray(values, dtype=float)
    if len(x) == 1:
        return {"mean": x[0], "sd": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n_seeds": 1}
    half = scipy.stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return {"mean": x.mean(), "sd": x.std(ddof=1), "ci_low": x.mean() - half, "ci_high": x.mean() + half,
            "n_seeds": len(x)}


def summary_table() -> pd.DataFrame:
    long = long_table()
    rows = []
    for (method, dataset, benchmark, metric), group in long.groupby(["method", "dataset", "benchmark", "metric"]):
        rows.append({"method": method, "dataset": dataset, "benchmark": benchmark, "metric": metric,
                     "headline": bool(group["headline"].any()), **mean_ci(list(group["value"]))})
    for (method, dataset), metrics in SCORES.items():
        compositional = np.mean([metrics["sugarcrepe/overall"], metrics["winoground/group"]], axis=0)
        for name, values in (("compositional", compositional), ("zero-shot", metrics["zeroshot-shape/top1"])):
            rows.append({"method": method, "dataset": dataset, "benchmark": "composite", "metric": name,
                         "headline": True, **mean_ci(list(values))})
    for (method, dataset), (compositional, zero_shot) in WISEFT.items():
        for name, values in (("compositional", compositional), ("zero-shot", zero_shot)):
            rows.append({"method": method, "dataset": dataset, "benchmark": "composite", "metric": name,
                         "headline": True, **mean_ci(values)})
    return pd.DataFrame(rows)


def losses_table(method: str, seed: int, steps: int = 12, cement: bool = False) -> pd.DataFrame:
    step = np.arange(1, steps + 1)
    frame = pd.DataFrame({"step": step, "epoch": 0, "lr": 1e-4, "i2t": 2.0 / step + 0.1 * seed,
                          "t2i": 2.2 / step + 0.1 * seed})
    frame["loss"] = frame["i2t"] + frame["t2i"]
    frame["seconds"] = 0.5
    if cement:
        hard = np.full(steps, 0.1 + 0.01 * seed)
        easy = np.full(steps, 0.5)
        frame["stat_pull"] = hard + easy
        frame["stat_hard_push"] = hard
        frame["stat_easy_push"] = easy
    return frame


def pairs_table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for policy, centre in (("hc", 4.5), ("lc", 2.5), ("wo", 3.5)):
        concreteness = np.clip(rng.normal(centre, 0.4, 30), 1, 5)
        gap = 0.02 * (concreteness - 3) + rng.normal(0, 0.01, 30)
        for i, (c, g) in enumerate(zip(concreteness, gap, strict=True)):
            rows.append({"policy": policy, "caption_id": f"c{i}", "slot": 0, "keyword": "red|blue",
                         "concreteness": c if i else float("nan"), "score_pos": 0.3 + g, "score_neg": 0.3,
                         "i2t_correct": g > 0, "t2i_correct": g > 0})
    return pd.DataFrame(rows)


MODELS = [f"{method}/coco/seed{seed}" for method in ("clip-ft", "cement", "cement-none") for seed in SEEDS]


def write_inputs(root: Path, models: list[str] = MODELS) -> FigureInputs:
    """Write every table under `root` in the workflow's layout, and a training log for each of `models`
    (ids method/dataset/seedN; Cement's gradient shares for methods named cement*); the figures' inputs."""
    tables = root / "results" / "tables"
    for folder in ("negatives/coco", "concreteplant", "datasets", "parse", "overlap"):
        (tables / folder).mkdir(parents=True)
    summary_table().to_csv(tables / "results.csv", index=False)
    CLAIMS.to_csv(tables / "claims.csv", index=False)
    EFFECTS.to_csv(tables / "effects.csv", index=False)
    CORRELATIONS.to_csv(tables / "correlations.csv", index=False)
    QUALITY.to_csv(tables / "negatives" / "coco" / "quality.csv", index=False)
    pairs_table().to_csv(tables / "concreteplant" / "coco.pairs.csv", index=False)
    pd.DataFrame({"dataset": ["coco"], "images": [60], "mean_caption_words": [9.5]}).to_csv(
        tables / "datasets" / "coco.csv", index=False)
    pd.DataFrame({"group": ["all"], "captions": [180], "np_precision": [0.64], "np_recall": [0.97],
                  "np_f1": [0.77]}).to_csv(tables / "parse" / "coco.csv", index=False)
    pd.DataFrame({"policy": ["hc", "lc", "wo"], "with_keyword": [180, 170, 180], "mean_c": [4.6, 2.4, 3.4],
                  "i2t": [0.8, 0.6, 0.7], "n_i2t": [180, 170, 180]}).to_csv(tables / "concreteplant" / "coco.csv",
                                                                           index=False)
    from compo.overlap import COLUMNS as OVERLAP_COLUMNS

    pd.DataFrame([{"dataset": "coco", "benchmark": "sugarcrepe", "kind": "sugarcrepe", "training_images": 60,
                   "benchmark_images": 20, "by_coco_id": 0, "by_content": 0, "by_perceptual_hash": 0, "overlap": 0,
                   "accepted": False, "training_unhashed": 0, "benchmark_unhashed": 0,
                   "examples": ""}], columns=OVERLAP_COLUMNS).to_csv(tables / "overlap" / "coco.csv", index=False)
    losses = []
    for model in models:
        method, _, seed = model.split("/")
        folder = root / "results" / "models" / model
        folder.mkdir(parents=True)
        losses_table(method, int(seed.removeprefix("seed")), cement=method.startswith("cement")).to_csv(
            folder / "losses.csv", index=False)
        losses.append(folder / "losses.csv")
    return FigureInputs(summary=tables / "results.csv", claims=tables / "claims.csv", effects=tables / "effects.csv",
                        kinds=dict(KIND),
                        correlations=tables / "correlations.csv",
                        losses=losses, quality=[tables / "negatives" / "coco" / "quality.csv"],
                        pairs=[tables / "concreteplant" / "coco.pairs.csv"],
                        attributes=[tables / "datasets" / "coco.csv"], order=["clip-ft", "negclip", "cement-none",
                                                                             "cement"])
