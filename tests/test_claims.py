"""Claims: verdicts, the config checks, and measuring claims from evaluation files (hand-computed cases)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from compo.claim_specs import check_claims
from compo.claims import verdict, write_claims
from compo.config import ConfigError, validate_config
from compo.io import write_table
from compo.layout import predictions_path


@pytest.mark.parametrize("expected, effect, low, high, p_holm, margin, want", [
    ("+", 5.0, 2.0, 8.0, 0.01, 0, "holds"),
    ("+", -5.0, -8.0, -2.0, 0.01, 0, "reversed"),
    ("+", 0.2, -0.5, 0.9, 0.60, 1, "equivalent"),
    ("+", 0.2, -1.5, 1.9, 0.60, 1, "not detected"),
    ("+", 3.0, 0.5, 5.5, 0.08, 0, "not detected"),      # significant alone, not after Holm
    ("-", -4.0, -6.0, -2.0, 0.001, 0, "holds"),
    (">=", -0.3, -0.8, 0.2, 0.002, 1, "holds"),           # whole CI above -margin
    (">=", -0.3, -1.4, 0.8, 0.2, 1, "not detected"),
    (">=", -3.0, -4.0, -2.0, 0.9, 1, "reversed"),         # whole CI below -margin
    ("<=", 0.5, -0.5, 1.5, 0.01, 2, "holds"),
    ("<=", 5.0, 3.0, 7.0, 0.9, 2, "reversed"),
    ("+", math.nan, math.nan, math.nan, math.nan, 0, "not detected"),
])
def test_verdicts(expected, effect, low, high, p_holm, margin, want) -> None:
    assert verdict(expected, effect, low, high, p_holm, margin) == want


def test_default_claims_are_valid_and_cover_every_seed(config) -> None:
    config = validate_config(config)
    assert check_claims(config) == []
    ids = [c["id"] for c in config["claims"]]
    roles = [c.get("role", "claim") for c in config["claims"]]
    assert roles == sorted(roles, key=lambda role: role != "control")  # the controls come first
    for kind, spec in config["effects"].items():  # every kind has both controls, or says why it needs none
        assert ("positive" in spec and "negative" in spec) != ("direct" in spec), kind
    for seed in ("000", "001", "002", "003", "004"):
        assert any(i.startswith(seed) for i in ids), seed


@pytest.mark.parametrize("mutate, key, message", [
    (lambda c: c["claims"].append(dict(c["claims"][0])), "claims[42].id", "duplicate claim id"),
    (lambda c: c["claims"][0].update(compare=["nonesuch", "clip-ft"]), "claims[0].compare",
     "'nonesuch' is not a study method"),
    (lambda c: c["claims"][0].update(metric="composite/nonesuch"), "claims[0].metric",
     "composite 'nonesuch' is not defined"),
    (lambda c: c["claims"][0].update(metric="imagenet/top1"), "claims[0].metric", "not in study.benchmarks"),
    (lambda c: c["claims"][0].update(compare=[0.5, "clip-ft"]), "claims[0].compare", "must name a method"),
    (lambda c: c["claims"][0].update(expected="maybe"), "claims.0.expected", "is not one of"),
    (lambda c: c["claims"][0].update(role="guess"), "claims.0.role", "is not one of"),
    (lambda c: c["claims"][0].pop("statement"), "claims.0", "'statement' is a required property"),
    (lambda c: c["study"].update(claims=["control-negative", "nope"]), "study.claims", "'nope' is not the id"),
    # kinds of effect: a claim reads only declared kinds, every metric is in one, a kind's controls are controls
    (lambda c: c["claims"][12].update(reads=["bindng"]), "claims[12].reads", "'bindng' is not a kind of effect"),
    (lambda c: c["effects"]["word-order"].update(metrics=["aro_relation"]), "claims[11].metric",
     "'aro_order/precision_at_1' is in no kind of effect"),
    (lambda c: c["effects"]["binding"].update(positive=["000-hn-aro"]), "effects.binding.positive",
     "'000-hn-aro' is not a claim of role control"),
    (lambda c: c["effects"]["binding"].update(negative=["nope"]), "effects.binding.negative", "'nope' is not the id"),
    (lambda c: c["effects"]["binding"].update(direct="why not"), "effects.binding", "not both"),
    (lambda c: c["effects"]["binding"]["metrics"].append("sugarcrep/swap"), "effects.binding.metrics",
     "'sugarcrep' is not a benchmark"),
    (lambda c: c["wiseft"].update(benchmarks=["sugarcrepe"]), "claims[33].metric",
     r"'composite/zero-shot' needs \['zeroshot-colour', 'zeroshot-shape'\] in wiseft.benchmarks"),
])
def test_bad_claims_name_the_key(config, mutate, key, message) -> None:
    config = validate_config(config)
    mutate(config)
    with pytest.raises(ConfigError, match=f"config key {re.escape(key)}.*{message}"):
        validate_config(config)


def _write_eval(folder: Path, model: str, benchmark: str, kind: str, table: pd.DataFrame,
                metrics: dict[str, float], headline: str) -> str:
    out = folder / model / f"{benchmark}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_table(table, predictions_path(out), "predictions")
    out.write_text(json.dumps({"model": model, "benchmark": benchmark, "kind": kind, "protocol": "p",
                               "headline": headline, "skipped": {}, "checkpoint_sha256": "0" * 64,
                               "metrics": {k: {"value": v, "n": len(table)} for k, v in metrics.items()}}))
    return str(out)


def _sugarcrepe(correct: list[int]) -> pd.DataFrame:
    """Ten swap_att then ten swap_obj items."""
    return pd.DataFrame({"subset": ["swap_att"] * 10 + ["swap_obj"] * 10, "item": [str(i % 10) for i in range(20)],
                         "correct": [bool(c) for c in correct], "score_pos": 0.0, "score_neg": 0.0,
                         "rank": [1 if c else 2 for c in correct]})


def test_claims_measured_from_prediction_files(tmp_path: Path) -> None:
    # two seeds of two methods on 20 SugarCrepe swap items: a is right on 15 / 16 items, b on 10 / 10
    right = {("a", 0): 15, ("a", 1): 16, ("b", 0): 10, ("b", 1): 10}
    paths = []
    for (method, seed), n_right in right.items():
        correct = [1] * n_right + [0] * (20 - n_right)
        swap_att, swap_obj = np.mean(correct[:10]), np.mean(correct[10:])
        paths.append(_write_eval(tmp_path, f"{method}/coco/seed{seed}", "sugarcrepe", "sugarcrepe",
                                 _sugarcrepe(correct), {"swap": n_right / 20, "swap_att": swap_att,
                                                        "swap_obj": swap_obj, "overall": n_right / 20},
                                 "overall"))
    claims = [{"id": "a-beats-b", "statement": "a beats b on swap", "compare": ["a", "b"],
               "metric": "sugarcrepe/swap", "expected": "+"},
              {"id": "a-no-worse", "role": "control", "statement": "b no worse than a", "compare": ["b", "a"],
               "metric": "sugarcrepe/swap", "expected": ">=", "margin": 1},
              {"id": "a-beats-b-own", "role": "hypothesis", "statement": "the study's test: a beats b on swap-att",
               "compare": ["a", "b"], "metric": "sugarcrepe/swap_att", "expected": "+"}]
    table = write_claims(claims, {}, paths, tmp_path / "tables", draws=1000).set_index("id")
    # effect: mean over seeds (75 %, 80 %) - 50 % = 27.5 points
    assert table.loc["a-beats-b", "effect"] == pytest.approx(27.5)
    assert table.loc["a-beats-b", "ci_low"] > 0 and table.loc["a-beats-b", "verdict"] == "holds"
    assert table.loc["a-no-worse", "verdict"] == "reversed" and table.loc["a-no-worse", "role"] == "control"
    assert list(table.index) == ["a-no-worse", "a-beats-b", "a-beats-b-own"]  # controls first, hypotheses last
    assert table.loc["a-beats-b", "unit"] == "points" and table.loc["a-beats-b", "n_seeds"] == 2
    # a hypothesis is its own Holm family: alone in it, its p is not adjusted for the claims
    assert table.loc["a-beats-b-own", "p_holm"] == table.loc["a-beats-b-own", "p"]
    markdown = (tmp_path / "tables" / "claims.md").read_text()
    assert "| a-no-worse (control) |" in markdown and "+27.5 [" in markdown and "| holds |" in markdown
    claims_part, own_part = markdown.split("The study's own tests of the seeds' explanations")
    assert "| a-beats-b |" in claims_part and "a-beats-b-own" not in claims_part
    assert "| a-beats-b-own |" in own_part and "| a-beats-b |" not in own_part
    # a kind of effect whose positive control is that reversed one: the claim reading it is untestable here
    effects = {"swap": {"what": "w", "metrics": ["sugarcrepe"], "positive": ["a-no-worse"],
                        "negative": ["a-no-worse"]}}
    gated = write_claims(claims, {}, paths, tmp_path / "gated", draws=1000, effects=effects).set_index("id")
    assert gated.loc["a-beats-b", "verdict"] == "untestable here"
    assert gated.loc["a-beats-b", "effect"] == pytest.approx(27.5)  # still shown
    assert "positive control a-no-worse is reversed" in gated.loc["a-beats-b", "why"]
    gated_md = (tmp_path / "gated" / "claims.md").read_text()
    assert gated_md.index("this testbed **cannot** detect effects of this kind") < gated_md.index("| a-beats-b |")
    assert (tmp_path / "gated" / "effects.csv").is_file()


def test_a_stored_metric_that_the_predictions_do_not_give_is_an_error(tmp_path: Path) -> None:
    correct = [1] * 12 + [0] * 8
    paths = [_write_eval(tmp_path, f"{m}/coco/seed0", "sugarcrepe", "sugarcrepe", _sugarcrepe(correct),
                         {"swap": 0.9, "overall": 0.6}, "overall") for m in ("a", "b")]
    claim = {"id": "x", "statement": "s", "compare": ["a", "b"], "metric": "sugarcrepe/swap", "expected": "+"}
    with pytest.raises(Exception, match=r"swap recomputed from the predictions .* differs from the result JSON"):
        write_claims([claim], {}, paths, tmp_path / "t", draws=10)


def test_a_metric_the_predictions_do_not_give_is_read_per_seed_as_stored(tmp_path: Path) -> None:
    """FSC-CLIP's composites (fsc-zs, fsc-comp) hold metrics no rule recomputes from per-item predictions (ROC AUC,
    a candidate kind's grouped mean): one rule for every kind reads them as each seed's stored value. Their seeds
    are resampled, their items are not, and the claim says which members were read so."""
    zeroshot = pd.DataFrame({"subset": ["0", "0", "1", "1"], "item": ["a", "b", "c", "d"], "correct": True,
                             "score_pos": 0.3, "score_neg": 0.2, "rank": 1})
    crepe = pd.DataFrame({"subset": "swap", "item": ["a", "b"], "correct": [True, False], "score_pos": 0.0,
                          "score_neg": 0.0, "rank": [1, 2]})
    # a: ROC AUC 0.70 / 0.80 over seeds 0 / 1, CREPE's mean 0.5 / 0.5; b: 0.60 / 0.60 and 0.40 / 0.20
    stored = {("a", 0): (0.7, 0.5), ("a", 1): (0.8, 0.5), ("b", 0): (0.6, 0.4), ("b", 1): (0.6, 0.2)}
    paths = []
    for (method, seed), (auc, mean) in stored.items():
        model = f"{method}/coco/seed{seed}"
        paths.append(_write_eval(tmp_path, model, "memes", "zeroshot", zeroshot,
                                 {"top1": 1.0, "mean_per_class": 1.0, "roc_auc": auc}, "roc_auc"))
        paths.append(_write_eval(tmp_path, model, "crepe", "crepe", crepe, {"swap": 0.5, "mean": mean}, "mean"))
    composites = {"mixed": ["memes/top1", "memes/roc_auc", "crepe/mean"]}
    claims = [{"id": "auc", "statement": "s", "compare": ["a", "b"], "metric": "memes/roc_auc", "expected": "+"},
              {"id": "mixed", "statement": "s", "compare": ["a", "b"], "metric": "composite/mixed",
               "expected": ">=", "margin": 1.2},
              {"id": "items", "statement": "s", "compare": ["a", "b"], "metric": "memes/top1", "expected": "+"}]
    table = write_claims(claims, composites, paths, tmp_path / "t", draws=2000).set_index("id")
    assert table.loc["auc", "effect"] == pytest.approx(15.0)  # (75 - 60) points
    # the seeds' spread alone: a's two seeds drawn with replacement give 70, 75 or 80 against b's 60
    assert (table.loc["auc", "ci_low"], table.loc["auc", "ci_high"]) == pytest.approx((10.0, 20.0))
    assert table.loc["auc", "note"].startswith("items not resampled for memes/roc_auc (")
    # the composite: the mean of its three members, top1 from the items (equal), AUC and CREPE as stored
    assert table.loc["mixed", "effect"] == pytest.approx((0 + 15.0 + 20.0) / 3)
    assert "items not resampled for memes/roc_auc, crepe/mean" in table.loc["mixed", "note"]
    assert table.loc["items", "note"] == ""  # top1 is recomputed from the items
    markdown = (tmp_path / "t" / "claims.md").read_text()
    assert markdown.count("items not resampled for memes/roc_auc") == 2  # both claims' why say so
    # a stored metric that no result of the benchmark has is still named as missing
    missing = [{"id": "x", "statement": "s", "compare": ["a", "b"], "metric": "memes/map_11point", "expected": "+"}]
    with pytest.raises(Exception, match=r"benchmark 'memes' has no metric 'map_11point'"):
        write_claims(missing, {}, paths, tmp_path / "u", draws=10)


def test_sugarcrepe_groups_are_macro_and_aro_order_has_both_tie_rules(tmp_path: Path) -> None:
    """The seeds' readings recomputed from the predictions: SugarCrepe's groups as the mean of their sub-tasks
    (micro as `<group>_micro`), ARO Order's headline under the released argmax (column rank) and the strict
    reading (column rank_strict)."""
    # swap_att 4 / 4 right, swap_obj 1 / 2: macro (1 + 0.5) / 2 = 0.75, micro 5 / 6
    table = pd.DataFrame({"subset": ["swap_att"] * 4 + ["swap_obj"] * 2, "item": [str(i) for i in range(6)],
                          "correct": [True] * 5 + [False], "score_pos": 0.0, "score_neg": 0.0,
                          "rank": [1] * 5 + [2]})
    order = pd.DataFrame({"subset": "order", "item": [str(i) for i in range(4)], "correct": [True] * 3 + [False],
                          "score_pos": 0.0, "score_neg": 0.0, "rank": [1, 1, 1, 2], "rank_strict": [1, 2, 2, 2]})
    paths = []
    for method in ("a", "b"):
        paths.append(_write_eval(tmp_path, f"{method}/coco/seed0", "sugarcrepe", "sugarcrepe", table,
                                 {"swap": 0.75, "swap_micro": 5 / 6, "overall": 0.75, "overall_micro": 5 / 6},
                                 "overall"))
        paths.append(_write_eval(tmp_path, f"{method}/coco/seed0", "coco_order", "aro_order", order,
                                 {"precision_at_1": 0.75, "precision_at_1_strict": 0.25}, "precision_at_1"))
    claims = [{"id": f"c{i}", "statement": "s", "compare": ["a", "b"], "metric": metric, "expected": "+"}
              for i, metric in enumerate(["sugarcrepe/swap", "sugarcrepe/swap_micro", "sugarcrepe/overall",
                                          "sugarcrepe/overall_micro", "coco_order/precision_at_1",
                                          "coco_order/precision_at_1_strict"])]
    table_out = write_claims(claims, {}, paths, tmp_path / "t", draws=10).set_index("id")
    assert list(table_out["effect"]) == [0.0] * 6  # every stored value equals its recomputation
    # the micro value stored as the group's headline is an error: the two computations would have drifted
    wrong = _write_eval(tmp_path / "w", "a/coco/seed0", "sugarcrepe", "sugarcrepe", table, {"swap": 5 / 6}, "swap")
    other = _write_eval(tmp_path / "w", "b/coco/seed0", "sugarcrepe", "sugarcrepe", table, {"swap": 5 / 6}, "swap")
    with pytest.raises(Exception, match=r"swap recomputed from the predictions .* differs from the result JSON"):
        write_claims([claims[0]], {}, [wrong, other], tmp_path / "w" / "t", draws=10)


def test_reference_value_and_training_statistic(tmp_path: Path) -> None:
    paths, losses = [], {}
    for seed, share in ((0, 0.10), (1, 0.20)):
        model = f"infonce/coco/seed{seed}"
        paths.append(_write_eval(tmp_path, model, "sugarcrepe", "sugarcrepe", _sugarcrepe([1] * 20),
                                 {"overall": 1.0}, "overall"))
        log = tmp_path / f"losses{seed}.csv"
        pd.DataFrame({"step": [1, 2, 3, 4], "stat_hard_share": [share] * 4}).to_csv(log, index=False)
        losses[model] = str(log)
    claim = {"id": "share", "statement": "small share", "compare": ["infonce", 0.28],
             "metric": "training/stat_hard_share", "expected": "-"}
    row = write_claims([claim], {}, paths, tmp_path / "t", losses=losses, draws=500).iloc[0]
    assert row["effect"] == pytest.approx(0.15 - 0.28) and row["unit"] == "ratio"
    assert row["ci_high"] == pytest.approx(0.20 - 0.28)  # the larger seed, drawn twice


def test_markdown_intro_names_the_seed_count_once() -> None:
    """A study of 3 seeds whose ConcretePlant claim reads the one base model: '3 ... seeds per method',
    not a list of counts."""
    from compo.claims import CLAIM_COLUMNS, claims_markdown

    rows = [dict.fromkeys(CLAIM_COLUMNS, "x") | {"id": name, "role": "claim", "margin": 0.0, "effect": 1.0,
                                                  "ci_low": 0.5, "ci_high": 1.5, "p": 0.01, "p_holm": 0.02,
                                                  "verdict": "holds", "unit": "points", "n_seeds": seeds,
                                                  "mde": 2.0, "why": ""}
            for name, seeds in (("on-three", 3), ("on-the-base", 1))]
    intro = claims_markdown(pd.DataFrame(rows, columns=CLAIM_COLUMNS)).split("\n\n")[0]
    assert "(3 fine-tuning seed(s) per method; fewer where a claim reads a single model, n_seeds in claims.csv;" \
        in intro


def test_a_method_is_paired_with_the_base_each_seed_started_from(tmp_path: Path) -> None:
    # study.base_seeds [0, 1]: fine-tuning seeds 0, 2, 4, 6 started from base seed 0 (wrong on all 20 items),
    # seeds 1, 3, 5, 7 from base seed 1 (right on all). Every fine-tune is right on all 20, so the gain over
    # its own base is 100 points on base 0 and 0 on base 1, item by item: effect 50 points on these two bases,
    # and resampling seeds within each base or items changes nothing (the claims keep the bases).
    paths = [_write_eval(tmp_path, f"base-clip/pretrain/seed{seed}", "sugarcrepe", "sugarcrepe",
                         _sugarcrepe([seed] * 20), {"overall": float(seed)}, "overall") for seed in (0, 1)]
    paths += [_write_eval(tmp_path, f"ft/coco/seed{seed}", "sugarcrepe", "sugarcrepe", _sugarcrepe([1] * 20),
                          {"overall": 1.0}, "overall") for seed in range(8)]
    claim = {"id": "ft-over-base", "statement": "s", "compare": ["ft", "base-clip"], "metric": "sugarcrepe/overall",
             "expected": "+"}
    row = write_claims([claim], {}, paths, tmp_path / "t", draws=2000, base_seeds=[0, 1]).iloc[0]
    assert row["effect"] == pytest.approx(50.0) and row["n_seeds"] == 8
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((50.0, 50.0))
    assert "over 2 pretrained bases" in (tmp_path / "t" / "claims.md").read_text()
    with pytest.raises(Exception, match=r"ft seed 2 started from base-clip seed 2, which has no results"):
        write_claims([claim], {}, paths, tmp_path / "u", draws=10, base_seeds=[0, 1, 2])


# --- kinds of effect: a verdict is evidence only where every kind it reads passes its controls ---------------


def _row(name: str, role: str, verdict_: str, kinds: str = "", effect: float = 1.0) -> dict:
    return {"id": name, "role": role, "verdict": verdict_, "kinds": kinds, "effect": effect, "ci_low": effect - 1,
            "ci_high": effect + 1, "unit": "points", "mde": 3.0, "why": ""}


def test_a_claim_is_untestable_where_a_kind_it_reads_fails_its_controls() -> None:
    from compo.claims import UNTESTABLE, gate, kind_table

    effects = {
        "order": {"what": "w", "metrics": ["aro_order"], "positive": ["pos-order"], "negative": ["neg-order"]},
        "binding": {"what": "w", "metrics": ["sugarcrepe"], "positive": ["pos-att", "pos-obj"],
                    "negative": ["neg-bind"]},
        "invented": {"what": "w", "metrics": ["valse"], "positive": ["pos-valse"], "negative": ["neg-valse"]},
        "recognition": {"what": "w", "metrics": ["zeroshot"], "direct": "the accuracy itself"},
    }
    table = pd.DataFrame([
        _row("pos-order", "control", "holds"), _row("neg-order", "control", "not detected"),  # order passes
        _row("pos-att", "control", "holds"), _row("pos-obj", "control", "not detected"),  # binding: one fails
        _row("neg-bind", "control", "holds"),
        _row("pos-valse", "control", "holds"), _row("neg-valse", "control", "reversed"),  # an invented effect
        _row("on-order", "claim", "holds", "order"),
        _row("on-binding", "claim", "not detected", "binding"),
        _row("on-both", "claim", "holds", "order, binding"),  # needs both kinds: binding fails
        _row("on-valse", "claim", "holds", "invented"),
        _row("on-order-and-recognition", "claim", "reversed", "order, recognition"),
    ])
    kinds = kind_table(table, effects).set_index("kind")
    assert kinds["passes"].to_dict() == {"order": True, "binding": False, "invented": False, "recognition": True}
    assert kinds.loc["binding", "mde"] == 3.0 and kinds.loc["binding", "reads"] == "on-binding, on-both"
    gated = gate(table, kind_table(table, effects)).set_index("id")
    assert gated.loc["on-order", "verdict"] == "holds" and gated.loc["on-order", "why"] == ""
    assert gated.loc["on-order-and-recognition", "verdict"] == "reversed"  # a direct kind needs no control
    for name in ("on-binding", "on-both", "on-valse"):
        assert gated.loc[name, "verdict"] == UNTESTABLE, name
    assert gated.loc["on-both", "why"] == "binding: its positive control pos-obj is not detected (+1.0 [+0.0, +2.0])"
    assert "negative control neg-valse is reversed" in gated.loc["on-valse", "why"]
    assert gated.loc["on-both", "effect"] == 1.0  # the effect and CI are still shown
    # the controls themselves are never gated: they decide
    assert gated.loc["pos-obj", "verdict"] == "not detected" and gated.loc["neg-valse", "verdict"] == "reversed"
    # a control the study did not measure leaves its kind untestable, and says so
    kinds = kind_table(table[table["id"] != "neg-order"], effects).set_index("kind")
    assert not kinds.loc["order", "passes"] and "neg-order is not measured" in kinds.loc["order", "why"]
