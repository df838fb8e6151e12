"""Composites (compo.composites, compo.stats.with_composites): nested composites are means of means, checked
against the released averages of vl_compo (individual_results.csv -> results.csv) and FSC-CLIP
(extended_results.csv's Comp), and bad nesting is refused by the config check."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from test_real_benchmarks import REAL, needs_real

from compo.composites import check_composites, composite_order, leaf_members
from compo.config import load_config
from compo.evaluate.files import SUGARCREPE_GROUPS, SUGARCREPE_SUBSETS
from compo.stats import with_composites

REPO = Path(__file__).resolve().parents[1]


def _long(rows: list[dict[str, str]], columns: dict[str, str]) -> pd.DataFrame:
    """One model per row; `columns` maps a CSV column to its `benchmark/metric`."""
    return pd.DataFrame([{"model": str(i), "method": r["arch"], "dataset": r["pretrained"], "seed": 0,
                          "benchmark": bm.split("/", 1)[0], "kind": "", "protocol": "", "metric": bm.split("/", 1)[1],
                          "value": float(r[c]), "n": 1, "headline": True, "source": ""}
                         for i, r in enumerate(rows) for c, bm in columns.items()])


def _composite(out: pd.DataFrame, name: str) -> pd.Series:
    return out[(out["benchmark"] == "composite") & (out["metric"] == name)].set_index("model")["value"]


@needs_real
def test_nested_composites_reproduce_vl_compo_columns_from_its_subtasks() -> None:
    """vl_compo's aro, crepe, svo_probes, whatsup and 21_tasks_avg columns are plain means of their subtasks
    in individual_results.csv; a composite of those composites (plus winoground's group) is their mean."""
    with open(REAL / "vl_compo" / "individual_results.csv", newline="") as handle:
        parts = {(r["arch"], r["pretrained"], r["family"]): r for r in csv.DictReader(handle)}
    with open(REAL / "vl_compo" / "results.csv", newline="") as handle:
        results = list(csv.DictReader(handle))
    header = next(iter(parts.values()))
    groups = {b: [c for c in header if c.startswith(f"{b}::")] for b in ("aro", "crepe", "svo_probes", "whatsup",
                                                                           "elevator")}
    assert [len(g) for g in groups.values()] == [4, 3, 3, 6, 21]
    pairs = [(r, parts[k]) for r in results if (k := (r["arch"], r["pretrained"], r["family"])) in parts]
    columns = {c: c.replace("::", "/", 1) for g in groups.values() for c in g}
    columns["winoground::group"] = "winoground/group"
    composites = {b: [columns[c] for c in g] for b, g in groups.items()}
    composites["nested"] = [f"composite/{b}" for b in ("aro", "crepe", "svo_probes", "whatsup")] + ["winoground/group"]
    out = with_composites(_long([p for _, p in pairs], columns), composites)
    for name, column in [("aro", "aro"), ("crepe", "crepe"), ("svo_probes", "svo_probes"), ("whatsup", "whatsup"),
                         ("elevator", "21_tasks_avg")]:
        got = _composite(out, name)
        assert len(got) == len(pairs) == 201
        for i, (result, _) in enumerate(pairs):
            assert got[str(i)] == pytest.approx(float(result[column]), abs=1e-6), (name, i)
    nested = _composite(out, "nested")
    for i, (result, _) in enumerate(pairs):
        expected = sum(float(result[c]) for c in ("aro", "crepe", "svo_probes", "whatsup", "winoground")) / 5
        assert nested[str(i)] == pytest.approx(expected, abs=1e-6)
    # a flat mean over the same subtasks weights each benchmark by its subtask count: not the same number
    flat = with_composites(_long([pairs[0][1]], columns), {"flat": leaf_members("nested", composites)})
    assert _composite(flat, "flat")["0"] != pytest.approx(nested["0"], abs=1e-3)


@needs_real
def test_fsc_comp_is_the_mean_of_its_eleven_benchmark_columns() -> None:
    """FSC-CLIP's released Comp (extended_results.csv) is the plain mean of its 11 per-benchmark columns, as
    paper.yaml's fsc-comp lists them."""
    columns = ["aro", "crepe", "eqben", "imagecode", "sugarcrepe", "svo_probes", "valse", "vl_checklist", "whatsup",
               "winoground", "spec"]
    with open(REAL / "fsc_clip" / "extended_results.csv", newline="") as handle:
        rows = [{**r, "arch": r["CLIP"], "pretrained": r["Pretrained_Finetined"]} for r in csv.DictReader(handle)]
    out = with_composites(_long(rows, {c: f"{c}/value" for c in columns}),
                          {"comp": [f"composite/{c}" for c in columns],
                           **{c: [f"{c}/value"] for c in columns}})
    got = _composite(out, "comp")
    assert len(got) == len(rows) == 12
    for i, row in enumerate(rows):
        assert got[str(i)] == pytest.approx(float(row["Comp"]), abs=1e-6)


def test_composite_order_and_bad_nesting() -> None:
    composites = {"outer": ["composite/inner", "b/x"], "inner": ["a/x", "a/y"]}
    assert composite_order(composites) == ["inner", "outer"]
    assert leaf_members("outer", composites) == ["a/x", "a/y", "b/x"]
    assert check_composites(composites) == []
    assert check_composites({"c": ["composite/missing"]}) == [
        ("composites.c", "'composite/missing': no composite 'missing' is defined")]
    (key, message), = check_composites({"a": ["composite/b"], "b": ["composite/a"]})
    assert key == "composites" and "cycle: a -> b -> a" in message
    # a member naming no defined benchmark would be computed for no model and vanish from the tables
    assert check_composites({"c": ["sugarcrep/overall", "valse"]}, ["sugarcrepe", "valse"]) == [
        ("composites.c", "'sugarcrep/overall': no benchmark 'sugarcrep' is defined under benchmarks"),
        ("composites.c", "'valse': expected benchmark/metric or composite/<name>")]


@needs_real
def test_paper_vl_compo_composites_reproduce_its_released_columns(repo) -> None:
    """paper.yaml's vl_compo averages (sugarcrepe-vl-compo, valse-vl-compo, eqben-vl-compo, as fsc-comp reads
    them), computed by compo.stats from vl_compo's released per-subset columns (individual_results.csv), give its
    released sugarcrepe, valse and eqben columns (results.csv) for every model: SugarCrepe's groups item-weighted
    as the scorer's `<group>_micro` (the item counts of the released files), VALSE's pieces and EqBen's group
    scores as they are. The study's headlines (the mean of 7 sub-tasks, of 11 pieces, of 7 subsets) do not."""
    composites = load_config(repo / "config" / "paper.yaml")["composites"]
    assert {"composite/sugarcrepe-vl-compo", "composite/valse-vl-compo", "composite/eqben-vl-compo"} <= set(
        composites["fsc-comp"])
    with open(REAL / "vl_compo" / "individual_results.csv", newline="") as handle:
        parts = {(r["arch"], r["pretrained"], r["family"]): r for r in csv.DictReader(handle)}
    with open(REAL / "vl_compo" / "results.csv", newline="") as handle:
        pairs = [(r, parts[k]) for r in csv.DictReader(handle) if (k := (r["arch"], r["pretrained"], r["family"]))
                 in parts]
    items = {s: len(json.loads((REAL / "sugarcrepe" / f"{s}.json").read_text())) for s in SUGARCREPE_SUBSETS}
    rows = []
    for _, part in pairs:
        row = {**part}
        for group, subsets in SUGARCREPE_GROUPS.items():  # the scorer's <group>_micro: the mean over its items
            row[f"sugarcrepe/{group}_micro"] = (sum(float(part[f"sugarcrepe::{s}"]) * items[s] for s in subsets)
                                                / sum(items[s] for s in subsets))
        rows.append(row)
    header = next(iter(parts.values()))
    columns = {c: c.replace("::", "/") for c in header if c.startswith("valse::")
               or (c.startswith("eqben::") and c.endswith("::group"))}
    columns |= {f"sugarcrepe/{g}_micro": f"sugarcrepe/{g}_micro" for g in SUGARCREPE_GROUPS}
    out = with_composites(_long(rows, columns), composites)
    worst = {}
    for name, column in [("sugarcrepe-vl-compo", "sugarcrepe"), ("valse-vl-compo", "valse"),
                         ("eqben-vl-compo", "eqben")]:
        got = _composite(out, name)
        assert len(got) == len(pairs) == 201
        worst[column] = max(abs(got[str(i)] - float(result[column])) for i, (result, _) in enumerate(pairs))
    print(f"vl_compo columns recomputed over {len(pairs)} models, max abs difference: {worst}")
    assert max(worst.values()) <= 1e-8  # results.csv is printed to 8 decimals
    # the study's own headlines average every sub-task, piece or subset alike: up to points away
    flat = {"valse": [f"valse/{p}" for p in (c.split("::")[1] for c in header if c.startswith("valse::"))]}
    plain = _composite(with_composites(_long(rows, columns), flat), "valse")
    assert max(abs(plain[str(i)] - float(r["valse"])) for i, (r, _) in enumerate(pairs)) > 1


def test_concrete_jungle_m_avg_reproduces_its_twelve_printed_values(repo) -> None:
    """Seed 002 Table 2's M.Avg, paper.yaml's composite concrete-mavg-seed (the mean of SugarCrepe, SugarCrepe++'s
    two columns' mean and Winoground's three columns' mean), computed from the table's own printed columns
    (paper.yaml's `reported`), gives the printed M.Avg of each of its 12 rows to 0.03; the mean of the six
    columns does not."""
    config = load_config(repo / "config" / "paper.yaml")
    block, = [b for b in config["reported"] if b["source"].startswith("seed 002 Table 2")]
    printed = block["metrics"].index("composite/concrete-mavg-seed")
    columns = {m: m for m in block["metrics"] if m != "composite/concrete-mavg-seed"}
    rows = [{"arch": r["row"], "pretrained": "", **dict(zip(block["metrics"], r["values"], strict=True))}
            for r in block["rows"]]
    got = _composite(with_composites(_long(rows, columns), config["composites"]), "concrete-mavg-seed")
    assert len(got) == len(rows) == 12
    differences = [got[str(i)] - r["values"][printed] for i, r in enumerate(block["rows"])]
    assert max(map(abs, differences)) <= 0.03, differences
    six = [sum(r["values"][:printed]) / printed - r["values"][printed] for r in block["rows"]]
    assert max(map(abs, six)) > 1
