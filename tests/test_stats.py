"""Aggregation of evaluation JSONs and correlations across models, checked against hand computations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import scipy.stats

from compo.io import ContractError
from compo.layout import EVAL_INDEX, eval_result_paths
from compo.stats import (
    aggregate,
    correlation_table,
    load_results,
    markdown_table,
    percent,
    results_table,
)

SCORED = "0" * 64  # a checkpoint sha256 (these results lie outside results/eval/: no model folder to check it)


def write_result(folder: Path, model: str, benchmark: str, metrics: dict[str, float],
                 headline: str, kind: str = "sugarcrepe") -> str:
    path = folder / model.replace("/", "_") / f"{benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"model": model, "benchmark": benchmark, "kind": kind, "protocol": f"{kind}-protocol",
              "headline": headline, "metrics": {k: {"value": v, "n": 10} for k, v in metrics.items()},
              "skipped": {}, "checkpoint_sha256": SCORED}
    path.write_text(json.dumps(record))
    return str(path)


SCORES = {  # model -> (sugarcrepe overall, sugarcrepe add, zeroshot top1)
    "negclip/coco/seed0": (0.70, 0.60, 0.30),
    "clip-ft/coco/seed0": (0.55, 0.50, 0.42),
    "clip-ft/coco/seed1": (0.60, 0.65, 0.35),
    "negclip/coco/seed1": (0.72, 0.70, 0.20),
    "degla/long/seed2": (0.65, 0.40, 0.38),
}


def write_study(folder: Path) -> list[str]:
    paths = []
    for model, (overall, add, top1) in SCORES.items():
        paths.append(write_result(folder, model, "sugarcrepe", {"overall": overall, "add": add}, "overall"))
        paths.append(write_result(folder, model, "zeroshot-shape", {"top1": top1}, "top1", kind="zeroshot"))
    return paths


def test_flatten_one_row_per_model(tmp_path: Path) -> None:
    paths = write_study(tmp_path)
    paths.append(write_result(tmp_path, "clip-ft/coco/seed0", "retrieval", {"mean_recall": 0.25},
                              "mean_recall"))
    wide = results_table(load_results(paths))
    assert list(wide.columns) == ["model", "method", "dataset", "seed", "retrieval/mean_recall",
                                  "sugarcrepe/overall", "sugarcrepe/add", "zeroshot-shape/top1"]
    assert list(wide["model"]) == ["clip-ft/coco/seed0", "clip-ft/coco/seed1", "degla/long/seed2",
                                   "negclip/coco/seed0", "negclip/coco/seed1"]
    row = wide.set_index("model").loc["degla/long/seed2"]
    assert (row["method"], row["dataset"], row["seed"]) == ("degla", "long", 2)
    for model, (overall, add, top1) in SCORES.items():
        got = wide.set_index("model").loc[model]
        assert got["sugarcrepe/overall"] == overall and got["sugarcrepe/add"] == add
        assert got["zeroshot-shape/top1"] == top1
    assert math.isnan(wide.set_index("model").loc["negclip/coco/seed0", "retrieval/mean_recall"])


def test_a_models_evaluation_index_stands_for_its_results(tmp_path: Path) -> None:
    """What the tables read through the DAG (one `_evaluated.json` a model, compo.layout.EVAL_INDEX) gives the same
    rows as the result JSONs it lists; an index listing a missing result, or not an index, is named."""
    paths = write_study(tmp_path)
    indexes = []
    for folder in sorted({Path(p).parent for p in paths}):
        index = folder / EVAL_INDEX
        index.write_text(json.dumps({"model": folder.name, "results": sorted(p.name for p in folder.glob("*.json"))}))
        indexes.append(str(index))
    assert len(eval_result_paths(indexes)) == len(paths)
    by_index, by_file = load_results(indexes), load_results(paths)
    columns = ["model", "benchmark", "metric", "value"]
    key = columns[:3]
    pd.testing.assert_frame_equal(by_index[columns].sort_values(key).reset_index(drop=True),
                                  by_file[columns].sort_values(key).reset_index(drop=True))
    Path(paths[0]).unlink()
    with pytest.raises(ValueError, match=rf"{EVAL_INDEX}: lists 1 result\(s\) that are missing"):
        load_results(indexes)
    Path(indexes[1]).write_text("[]")
    with pytest.raises(ValueError, match=rf"{EVAL_INDEX}: not an evaluation index"):
        eval_result_paths(indexes[1:2])


def test_markdown_table_and_percent() -> None:
    frame = pd.DataFrame({"model": ["a/b/seed0", "c|d/e/seed1"], "x/acc": [0.12345, math.nan]})
    text = markdown_table(frame, {"x/acc": percent})
    assert text == ("| model | x/acc |\n|---|---|\n| a/b/seed0 | 12.3 |\n| c\\|d/e/seed1 | n/a |\n")
    assert percent(0.9996) == "100.0" and percent(0.0) == "0.0"


def hand_spearman(x: list[float], y: list[float]) -> tuple[float, float]:
    """Pearson correlation of ranks (no ties here), two-sided p-value from the t distribution."""
    def ranks(values: list[float]) -> list[float]:
        return [1 + sum(1 for w in values if w < v) for v in values]
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    rho = cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    t = rho * math.sqrt((n - 2) / (1 - rho**2))
    return rho, 2 * scipy.stats.t.sf(abs(t), n - 2)


def hand_kendall(x: list[float], y: list[float]) -> float:
    pairs = [(i, j) for i in range(len(x)) for j in range(i + 1, len(x))]
    sign = [math.copysign(1, (x[i] - x[j]) * (y[i] - y[j])) for i, j in pairs]
    return sum(sign) / len(pairs)


def test_correlations_match_hand_computation(tmp_path: Path) -> None:
    wide = results_table(load_results(write_study(tmp_path)))
    columns = ["sugarcrepe/overall", "sugarcrepe/add", "zeroshot-shape/top1"]
    table = correlation_table(wide, columns)
    assert list(zip(table["metric_a"], table["metric_b"], strict=True)) == [
        (columns[0], columns[1]), (columns[0], columns[2]), (columns[1], columns[2])]
    for row in table.itertuples():
        rho, p = hand_spearman(list(wide[row.metric_a]), list(wide[row.metric_b]))
        assert row.rho == pytest.approx(rho) and row.p_value == pytest.approx(p)
        assert row.n == 5 and row.note == "" and row.method == "spearman"
    assert table.loc[1, "rho"] == pytest.approx(-0.9)  # overall vs top1: ranks 1..5 vs 5,3,4,2,1
    kendall = correlation_table(wide, columns, method="kendall")
    for row in kendall.itertuples():
        assert row.rho == pytest.approx(hand_kendall(list(wide[row.metric_a]), list(wide[row.metric_b])))


def test_degenerate_correlations_are_nan_with_a_note() -> None:
    frame = pd.DataFrame({"a": [0.1, 0.2, 0.3, 0.4], "b": [0.5, 0.5, 0.5, 0.5],
                          "c": [0.3, math.nan, 0.1, math.nan]})
    table = correlation_table(frame, ["a", "b", "c"]).set_index(["metric_a", "metric_b"])
    assert math.isnan(table.loc[("a", "b"), "rho"])
    assert table.loc[("a", "b"), "note"] == "constant across models: b"
    assert math.isnan(table.loc[("a", "c"), "p_value"]) and table.loc[("a", "c"), "n"] == 2
    assert table.loc[("a", "c"), "note"] == "fewer than 3 models with both scores (n=2)"
    with pytest.raises(ValueError, match="unknown correlation method 'pearsonish'"):
        correlation_table(frame, ["a", "b"], method="pearsonish")


def test_aggregate_writes_tables_even_with_two_models(tmp_path: Path) -> None:
    paths = [write_result(tmp_path, "clip-ft/coco/seed0", "sugarcrepe", {"overall": 0.5}, "overall"),
             write_result(tmp_path, "clip-ft/coco/seed1", "sugarcrepe", {"overall": 0.7}, "overall"),
             write_result(tmp_path, "negclip/coco/seed0", "sugarcrepe", {"overall": 0.75}, "overall"),
             write_result(tmp_path, "clip-ft/coco/seed0", "zs", {"top1": 0.25}, "top1", kind="zeroshot"),
             write_result(tmp_path, "clip-ft/coco/seed1", "zs", {"top1": 0.35}, "top1", kind="zeroshot"),
             write_result(tmp_path, "negclip/coco/seed0", "zs", {"top1": 0.125}, "top1", kind="zeroshot")]
    out = tmp_path / "tables"
    aggregate(paths, out, composites={"both": ["sugarcrepe/overall", "zs/top1"]})
    summary = pd.read_csv(out / "results.csv").set_index(["method", "benchmark", "metric"])
    # clip-ft over two seeds: mean 0.6, sd 0.1414, t(0.975, 1) = 12.706 -> half width 12.706 * 0.1 = 1.2706
    row = summary.loc[("clip-ft", "sugarcrepe", "overall")]
    assert row["mean"] == pytest.approx(0.6) and row["n_seeds"] == 2
    assert row["ci_high"] - row["mean"] == pytest.approx(1.270620, abs=1e-5)
    # the composite is the per-seed mean of its metrics: (0.5 + 0.25) / 2 and (0.7 + 0.35) / 2
    assert summary.loc[("clip-ft", "composite", "both"), "mean"] == pytest.approx((0.375 + 0.525) / 2)
    assert summary.loc[("negclip", "composite", "both"), "mean"] == pytest.approx((0.75 + 0.125) / 2)
    markdown = (out / "results.md").read_text()
    assert "| clip-ft | coco | 2 | 45.0 ± 95.3 | 60.0 ± 127.1 | 30.0 ± 63.5 |" in markdown
    assert "| negclip | coco | 1 | 43.8 | 75.0 | 12.5 |" in markdown
    correlations = pd.read_csv(out / "correlations.csv")
    assert len(correlations) == 1 and math.isnan(correlations.loc[0, "rho"])
    assert correlations.loc[0, "note"].startswith("fewer than 3 models")
    assert len(pd.read_csv(out / "results_long.csv")) == 6 + 3  # every seed, plus the composite per model
    assert "No reported numbers" in (out / "reproduction.md").read_text()  # none declared: a header-only table
    assert pd.read_csv(out / "reproduction.csv").empty

    reported = [{"source": "seed 000 Table 3", "metrics": ["sugarcrepe/overall", "composite/both"],
                 "rows": [{"row": "NegCLIP", "method": "negclip", "values": [80.0, 40.0]}]}]
    aggregate(paths, out, composites={"both": ["sugarcrepe/overall", "zs/top1"]}, reported=reported)
    reproduction = pd.read_csv(out / "reproduction.csv").set_index("metric")
    assert reproduction.loc["sugarcrepe/overall", "reproduced"] == pytest.approx(0.75)
    assert reproduction.loc["sugarcrepe/overall", "difference"] == pytest.approx(0.75 - 0.80)
    assert reproduction.loc["composite/both", "reproduced"] == pytest.approx((0.75 + 0.125) / 2)

    # an ablation's model (DeGLA's Table 7 rows): bound in the reproduction table, left out of the study's tables
    ablated = [write_result(tmp_path, "degla-igc/coco/seed0", "sugarcrepe", {"overall": 0.8}, "overall")]
    reported[0]["rows"].append({"row": "+ IGC", "method": "degla-igc", "values": [81.0, None]})
    aggregate(paths, out, composites={"both": ["sugarcrepe/overall", "zs/top1"]}, reported=reported,
              reproduction_jsons=ablated)
    reproduction = pd.read_csv(out / "reproduction.csv").set_index(["method", "metric"])
    assert reproduction.loc[("degla-igc", "sugarcrepe/overall"), "reproduced"] == pytest.approx(0.8)
    assert reproduction.loc[("degla-igc", "sugarcrepe/overall"), "status"] == "reproduced"
    assert "degla-igc" not in set(pd.read_csv(out / "results.csv")["method"])


def test_bad_inputs_name_the_file(tmp_path: Path) -> None:
    bad_id = write_result(tmp_path, "just-a-name", "sugarcrepe", {"overall": 0.5}, "overall")
    with pytest.raises(ContractError, match=r"just-a-name.*not of the form method/dataset/seedN"):
        load_results([bad_id])
    good = write_result(tmp_path, "a/b/seed0", "sugarcrepe", {"overall": 0.5}, "overall")
    with pytest.raises(ContractError, match="already read from"):
        load_results([good, good])
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"model": "a/b/seed0", "benchmark": "x", "kind": "k", "protocol": "p",
                                  "metrics": {"acc": {"value": "high", "n": 3}}}))
    with pytest.raises(ContractError, match=r"broken\.json: metrics\.acc must be"):
        load_results([str(broken)])


# --- uncertainty ------------------------------------------------------------------------------------------

from itertools import product  # noqa: E402

import numpy as np  # noqa: E402

from compo.stats import (  # noqa: E402
    ItemScores,
    bootstrap_p,
    holm,
    mean_ci,
    paired_difference,
    seed_summary,
)


def test_mean_ci_is_the_t_interval() -> None:
    # mean 2, sd 1, t(0.975, df=2) = 4.302653 -> half width 4.302653 / sqrt(3) = 2.484138
    summary = mean_ci([1.0, 2.0, 3.0])
    assert summary["mean"] == 2.0 and summary["sd"] == pytest.approx(1.0) and summary["n_seeds"] == 3
    assert summary["ci_low"] == pytest.approx(2 - 2.484138, abs=1e-6)
    assert summary["ci_high"] == pytest.approx(2 + 2.484138, abs=1e-6)
    one = mean_ci([0.4])
    assert one["mean"] == 0.4 and math.isnan(one["ci_low"]) and one["n_seeds"] == 1
    same = mean_ci([0.5, 0.5, 0.5])
    assert same["ci_low"] == same["ci_high"] == 0.5


def test_seed_summary_groups_seeds_of_a_method() -> None:
    long = pd.DataFrame({
        "method": ["a", "a", "a", "b"], "dataset": "coco", "benchmark": "sc", "metric": "overall",
        "headline": True, "value": [1.0, 2.0, 3.0, 0.25], "seed": [0, 1, 2, 0]})
    summary = seed_summary(long).set_index("method")
    assert summary.loc["a", "mean"] == 2.0 and summary.loc["a", "n_seeds"] == 3
    assert summary.loc["a", "ci_high"] == pytest.approx(4.484138, abs=1e-6)
    assert summary.loc["b", "mean"] == 0.25 and math.isnan(summary.loc["b", "ci_low"])


def test_seed_summary_reads_each_group_in_the_tables_order_and_leaves_out_a_missing_key() -> None:
    """Groups come out sorted by key whatever the rows' order, each group's values in the table's order (the mean's
    float sum depends on it), a row without a dataset left out as groupby leaves it."""
    long = pd.DataFrame({
        "method": ["b", "a", "a", "b", "a", "a"], "dataset": ["coco", "coco", None, "coco", "coco", "coco"],
        "benchmark": "sc", "metric": ["overall", "overall", "overall", "overall", "add", "overall"],
        "headline": [True, True, True, True, False, True], "value": [0.1, 0.7, 9.0, 0.2, 0.5, 0.3],
        "seed": [0, 0, 1, 1, 0, 2]})
    summary = seed_summary(long)
    assert list(zip(summary["method"], summary["metric"], strict=True)) == [("a", "add"), ("a", "overall"),
                                                                           ("b", "overall")]
    assert list(summary["n_seeds"]) == [1, 2, 2] and list(summary["headline"]) == [False, True, True]
    assert summary.loc[1, "mean"] == np.mean([0.7, 0.3]) and summary.loc[2, "mean"] == np.mean([0.1, 0.2])


def test_holm_textbook_example() -> None:
    # sorted p: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, max(0.04*1, 0.06) = 0.06
    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    with_nan = holm([0.01, math.nan, 0.02])
    assert with_nan[0] == pytest.approx(0.02) and math.isnan(with_nan[1]) and with_nan[2] == pytest.approx(0.02)


def test_macro_is_the_mean_of_strata_means() -> None:
    scores = ItemScores(np.array([[1.0, 1.0, 1.0, 0.0]]), np.array([0, 0, 0, 1]), macro=True, items="x")
    assert scores.value() == pytest.approx([0.5])
    micro = ItemScores(np.array([[1.0, 1.0, 1.0, 0.0]]), np.array([0, 0, 0, 1]), items="x")
    assert micro.value() == pytest.approx([0.75])


def test_bootstrap_ci_of_a_paired_proportion_difference() -> None:
    # one seed, 4000 items: a right on the first 2800, b on the first 2000, so d = a - b is 1 on 20 % of the
    # items: the CI of the mean difference is 0.2 +- 1.96 * sqrt(0.2 * 0.8 / 4000) = [0.1876, 0.2124]
    n = 4000
    a = (np.arange(n) < 2800).astype(float)[None]
    b = (np.arange(n) < 2000).astype(float)[None]
    strata = np.zeros(n, dtype=int)
    result = paired_difference([ItemScores(a, strata, items="x")], [ItemScores(b, strata, items="x")],
                               seeds=1, draws=4000, seed=1)
    assert result["effect"] == pytest.approx(0.2)
    assert result["ci_low"] == pytest.approx(0.1876, abs=0.002)
    assert result["ci_high"] == pytest.approx(0.2124, abs=0.002)
    assert result["p"] == pytest.approx(2 / 4001)


def test_identical_methods_tie_on_every_item() -> None:
    rng = np.random.default_rng(0)
    a = (rng.random((3, 50)) < 0.6).astype(float)
    strata = np.repeat([0, 1], 25)
    result = paired_difference([ItemScores(a, strata, items="x")], [ItemScores(a.copy(), strata, items="x")],
                               seeds=3, draws=500)
    assert result["effect"] == 0.0 and result["ci_low"] == 0.0 and result["ci_high"] == 0.0
    assert result["p"] == 1.0


def test_seed_level_resampling_matches_exact_enumeration() -> None:
    # every item of seed s scores x_s (items then add no noise): the bootstrap distribution of the mean over
    # 3 seeds drawn with replacement is the mean over the 27 equally likely ordered draws
    x = np.array([0.0, 0.3, 0.6])
    a = np.repeat(x[:, None], 20, axis=1)
    zero = np.zeros((3, 20))
    strata = np.zeros(20, dtype=int)
    result = paired_difference([ItemScores(a, strata, items="x")], [ItemScores(zero, strata, items="x")],
                               seeds=3, draws=20000, seed=3)
    exact = np.sort([np.mean(draw) for draw in product(x, repeat=3)])
    assert result["effect"] == pytest.approx(0.3)
    assert result["draws"].mean() == pytest.approx(exact.mean(), abs=0.01)
    # P(mean == 0) = 1/27 > 2.5 %: the lower 95 % bound is the smallest mean, 0
    assert result["ci_low"] == pytest.approx(0.0) and result["ci_high"] == pytest.approx(0.6)
    assert np.mean(result["draws"] <= 0.1 + 1e-12) == pytest.approx(np.mean(exact <= 0.1 + 1e-12), abs=0.01)


def test_single_seed_base_is_the_same_model_at_every_drawn_seed() -> None:
    base = ItemScores(np.full((1, 10), 0.5), np.zeros(10, dtype=int), items="x")
    tuned = ItemScores(np.array([[1.0] * 10, [0.0] * 10]), np.zeros(10, dtype=int), items="x")
    result = paired_difference([tuned], [base], seeds=2, draws=2000)
    assert result["effect"] == 0.0  # mean of 1 and 0, minus 0.5
    assert set(np.round(result["draws"], 6)) == {-0.5, 0.0, 0.5}


def test_bootstrap_p_inverts_the_percentile_interval() -> None:
    assert bootstrap_p(np.ones(999)) == pytest.approx(2 / 1000)
    assert bootstrap_p(np.r_[np.ones(500), -np.ones(499)]) == pytest.approx(1.0)
    # 101 of the 1001 draws are <= 0 (-1.00 ... 0.00): p = 2 * (101 + 1) / (1001 + 1)
    assert bootstrap_p(np.linspace(-1, 9, 1001)) == pytest.approx(2 * 102 / 1002)


# --- several pretrained bases: seeds within each (or bases, then seeds within them), then items ------------

def test_one_base_is_the_plain_seed_bootstrap_draw_for_draw() -> None:
    from compo.stats import Bootstrap

    plain = Bootstrap(4, draws=300, seed=5).seed_draw
    assert np.array_equal(Bootstrap(4, draws=300, seed=5, bases=[7, 7, 7, 7]).seed_draw, plain)


def test_bootstrap_draws_bases_then_seeds_within_them() -> None:
    from compo.stats import Bootstrap

    labels = np.array([0, 1, 0, 1])  # seeds 0..3 alternate over two bases, as study.base_seeds lays them out
    boot = Bootstrap(4, draws=4000, seed=0, bases=labels, resample_bases=True)
    blocks = labels[boot.seed_draw.reshape(4000, 2, 2)]  # [replicate, drawn base, its drawn seeds]
    assert (blocks[..., 0] == blocks[..., 1]).all()  # a block holds the seeds of one base
    same_base_twice = np.mean(blocks[:, 0, 0] == blocks[:, 1, 0])
    assert same_base_twice == pytest.approx(0.5, abs=0.03)  # two bases drawn with replacement
    with pytest.raises(ValueError, match="unequal numbers of seeds"):
        Bootstrap(3, draws=10, bases=[0, 1, 0])


def test_the_claims_bootstrap_keeps_the_bases_and_draws_seeds_within_each() -> None:
    from compo.stats import Bootstrap

    labels = np.array([0, 1, 0, 1])
    boot = Bootstrap(4, draws=4000, seed=0, bases=labels)
    blocks = labels[boot.seed_draw.reshape(4000, 2, 2)]
    assert (blocks[:, 0] == 0).all() and (blocks[:, 1] == 1).all()  # every replicate holds both bases
    assert len(np.unique(boot.seed_draw[:, :2], axis=0)) == 4  # base 0's two seeds drawn with replacement
    with pytest.raises(ValueError, match="unequal numbers of seeds"):
        Bootstrap(3, draws=10, bases=[0, 1, 0])


def test_base_variation_widens_the_interval_over_bases_and_not_the_effect_on_them() -> None:
    # 2 bases x 4 seeds, every item of a seed scoring its base's effect (0.1 or 0.3): seeds and items add no
    # noise, so resampling bases gives the mean of two drawn bases, 0.1, 0.2 or 0.3 (1/4, 1/2, 1/4): the 95 %
    # interval over bases is [0.1, 0.3]. The effect on these two bases (the claims') is 0.2 with no uncertainty.
    # Treating the 8 seeds as independent draws the mean of 8 from {0.1, 0.3}, whose interval is far narrower
    # than over bases (P(all eight at 0.1) = 1/256) and wider than on them.
    labels = np.array([0, 1] * 4)
    effect = np.where(labels == 0, 0.1, 0.3)
    a = np.repeat(effect[:, None], 20, axis=1)
    zero = np.zeros((8, 20))
    strata = np.zeros(20, dtype=int)
    nested = paired_difference([ItemScores(a, strata, items="x")], [ItemScores(zero, strata, items="x")],
                               seeds=8, draws=4000, seed=2, bases=labels, resample_bases=True)
    assert set(np.round(nested["draws"], 6)) == {0.1, 0.2, 0.3}
    assert nested["effect"] == pytest.approx(0.2)
    assert (nested["ci_low"], nested["ci_high"]) == pytest.approx((0.1, 0.3))
    fixed = paired_difference([ItemScores(a, strata, items="x")], [ItemScores(zero, strata, items="x")],
                              seeds=8, draws=4000, seed=2, bases=labels)
    assert (fixed["ci_low"], fixed["ci_high"]) == pytest.approx((0.2, 0.2))
    flat = paired_difference([ItemScores(a, strata, items="x")], [ItemScores(zero, strata, items="x")],
                             seeds=8, draws=4000, seed=2)
    assert 0.1 < flat["ci_low"] and flat["ci_high"] < 0.3


def test_seed_summary_over_bases_is_the_t_interval_of_the_base_means() -> None:
    # seeds 0..3 over base seeds [0, 1]: base 0 started seeds 0 and 2 (values 1, 3: mean 2), base 1 seeds 1 and
    # 3 (5, 7: mean 6). Mean 4, sd of (2, 6) = 2.828427, t(0.975, df=1) = 12.706205 -> half 12.706205 * 2 = 25.41
    long = pd.DataFrame({
        "method": ["a"] * 4 + ["base-clip"] * 2, "dataset": "coco", "benchmark": "sc", "metric": "overall",
        "headline": True, "value": [1.0, 5.0, 3.0, 7.0, 0.5, 0.7], "seed": [0, 1, 2, 3, 0, 1]})
    summary = seed_summary(long, base_seeds=[0, 1]).set_index("method")
    assert summary.loc["a", "mean"] == 4.0 and summary.loc["a", "sd"] == pytest.approx(2.828427, abs=1e-6)
    assert summary.loc["a", "ci_high"] == pytest.approx(4 + 25.41241, abs=1e-4)
    assert summary.loc["a", "n_seeds"] == 4 and summary.loc["a", "n_bases"] == 2
    assert summary.loc["base-clip", "mean"] == pytest.approx(0.6) and summary.loc["base-clip", "n_bases"] == 2
    flat = seed_summary(long).set_index("method")  # one base: the four seeds are the units
    assert flat.loc["a", "sd"] == pytest.approx(np.std([1, 5, 3, 7], ddof=1)) and flat.loc["a", "n_bases"] == 1


# --- the claims' interval and its minimum detectable effect -------------------------------------------------

def test_t_interval_of_seed_means_when_items_add_nothing() -> None:
    # every item of seed s scores x_s (0, 0.3, 0.6) against 0: the units are the three seeds, the items add no
    # variance: se = sd(x) / sqrt(3) = 0.3 / sqrt(3), df = 2; the 95 % interval 0.3 -+ t(0.975, 2) * se; the MDE
    # (80 % power, two-sided 5 %) is (t(0.975, 2) + t(0.8, 2)) * se = (4.302653 + 1.060660) * 0.173205
    from compo.stats import t_difference

    x = np.array([0.0, 0.3, 0.6])
    strata = np.zeros(20, dtype=int)
    result = t_difference([ItemScores(np.repeat(x[:, None], 20, axis=1), strata, items="x")],
                          [ItemScores(np.zeros((3, 20)), strata, items="x")], seeds=3, draws=500)
    se = 0.3 / math.sqrt(3)
    assert (result.effect, result.se, result.df) == pytest.approx((0.3, se, 2.0))
    assert (result.low, result.high) == pytest.approx((0.3 - 4.302653 * se, 0.3 + 4.302653 * se))
    assert result.mde() == pytest.approx((4.302653 + 1.060660) * se, rel=1e-5)
    assert result.p() == pytest.approx(2 * scipy.stats.t.sf(0.3 / se, 2))


def test_minimum_detectable_effect_of_a_paired_proportion_difference() -> None:
    # one seed, 4000 items, a - b is 1 on 20 % of them: se = sqrt(0.2 * 0.8 / 4000) = 0.0063246, normal reference:
    # MDE = (z(0.975) + z(0.8)) * se = 2.80159 * 0.0063246 = 0.017719, the interval 0.2 -+ 1.95996 * se
    from compo.stats import t_difference

    n = 4000
    strata = np.zeros(n, dtype=int)
    a = ItemScores((np.arange(n) < 2800).astype(float)[None], strata, items="x")
    b = ItemScores((np.arange(n) < 2000).astype(float)[None], strata, items="x")
    result = t_difference([a], [b], seeds=1, draws=4000, seed=1)
    assert result.effect == pytest.approx(0.2) and math.isinf(result.df)
    assert result.se == pytest.approx(0.0063246, rel=0.03)
    assert result.mde() == pytest.approx(0.017719, rel=0.03)
    assert result.high - result.effect == pytest.approx(1.959964 * result.se)


def test_the_items_a_seed_alone_gets_wrong_are_counted_once() -> None:
    # three seeds that each get a different third of 300 items wrong (a's own noise, no item is hard for every
    # seed): the spread of the seeds is zero and the seeds share no item-level difference, so the interval is a
    # point; counting each seed's own noise again as item variance would widen it
    from compo.stats import t_difference

    a = np.ones((3, 300))
    for s in range(3):
        a[s, s * 100:(s + 1) * 100] = 0
    strata = np.zeros(300, dtype=int)
    result = t_difference([ItemScores(a, strata, items="x")], [ItemScores(np.zeros((3, 300)), strata, items="x")],
                          seeds=3, draws=2000)
    assert result.effect == pytest.approx(2 / 3) and result.se < 0.01


def test_spearman_ci_equals_one_scipy_call_a_draw() -> None:
    """The vectorised bootstrap equals the plain loop (one rng.integers and one scipy.stats.spearmanr a draw, draws
    with a constant column left out), ties and near-constant columns included."""
    import scipy.stats

    from compo.stats import percentile_ci, spearman_ci

    def loop(x, y, draws=2000, seed=0):  # noqa: ANN001, ANN202
        rng, rhos = np.random.default_rng(seed), []
        for _ in range(draws):
            pick = rng.integers(len(x), size=len(x))
            if np.ptp(x[pick]) > 0 and np.ptp(y[pick]) > 0:
                rhos.append(scipy.stats.spearmanr(x[pick], y[pick])[0])
        return percentile_ci(np.array(rhos))

    rng = np.random.default_rng(3)
    for x, y in ((rng.random(12), rng.random(12)), (np.array([0.1, 0.1, 0.2, 0.3, 0.3, 0.5]),
                                                     np.array([1.0, 2.0, 2.0, 2.0, 3.0, 1.0])),
                 (np.array([0.5, 0.5, 0.5, 0.6]), np.array([0.1, 0.2, 0.3, 0.4]))):
        assert spearman_ci(x, y) == pytest.approx(loop(x, y), abs=1e-12)
    x, y = rng.random(12), rng.random(12)  # the draws of 12 points again, from the cache
    assert spearman_ci(x, y) == pytest.approx(loop(x, y), abs=1e-12)


def test_long_caption_r1_is_recomputed_from_the_predictions(tmp_path: Path, loaded, tiny_world) -> None:
    """LSS's claims read long-caption retrieval's `r1` (the two directions' mean R@1): the claims rule stopped with
    "metric 'r1' cannot be recomputed from its per-item predictions" (found by the whole paper study)."""
    from compo.evaluate import result_record, run_benchmark
    from compo.stats import metric_scores
    from compo.world import generate_benchmarks

    generate_benchmarks(tiny_world, seed=0, out_dir=tmp_path / "bench")
    result = run_benchmark(loaded, {"kind": "long_retrieval", "source": "world"}, tmp_path / "bench" / "long_retrieval")
    record = result_record(result, "m/d/seed0", "urban1k", "long_retrieval")
    measure = metric_scores([record], [result.predictions], "r1", "test")  # equal to the JSON's, or an error
    assert [part.items for part in measure] == ["urban1k:i2t", "urban1k:t2i"]
