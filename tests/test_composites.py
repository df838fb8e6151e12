"""Composites (compo.composites, compo.stats.with_composites): nested composites are means of means, checked
against the released averages of vl_compo (individual_results.csv -> results.csv) and FSC-CLIP
(extended_results.csv's Comp), and bad nesting is refused by the config check."""

from __future__ import annotations

import csv

import pandas as pd
import pytest
from test_real_benchmarks import REAL, needs_real

from compo.composites import check_composites, composite_order, leaf_members
from compo.stats import with_composites


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
