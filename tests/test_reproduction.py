"""The seeds' reported numbers beside the reproduced ones (compo.reproduction, config `reported`)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from compo.config import load_config
from compo.reproduction import (
    NO_METHOD,
    NOT_MEASURED,
    NOT_RUN,
    REPRODUCED,
    check_reported,
    reported_cells,
    reproduction_markdown,
    reproduction_table,
)

BLOCK = {"source": "seed 000 Table 3", "metrics": ["sugarcrepe/replace", "sugarcrepe/swap", "composite/comp"],
         "rows": [{"row": "CLIP [52]", "method": "base-clip", "values": [80.2, 64.0, None]},
                  {"row": "NegCLIP [63]", "method": "negclip", "values": [85.0, 75.4, 70.0]},
                  {"row": "CE-CLIP [68]", "method": None, "values": [87.0, 74.9, None]},
                  {"row": "DeGLA (ours)", "method": "degla", "values": [90.5, 81.9, None]}]}


def summary_rows() -> pd.DataFrame:
    rows = [("base-clip", "openai", "sugarcrepe", "replace", 0.79, 0.79, 0.79, 1),
            ("base-clip", "openai", "sugarcrepe", "swap", 0.65, math.nan, math.nan, 1),
            ("negclip", "coco", "sugarcrepe", "replace", 0.86, 0.85, 0.87, 3),
            ("negclip", "coco", "sugarcrepe", "swap", 0.74, 0.72, 0.76, 3),
            ("negclip", "coco", "composite", "comp", 0.71, 0.70, 0.72, 3)]
    return pd.DataFrame([{"method": m, "dataset": d, "benchmark": b, "metric": x, "headline": False, "mean": v,
                          "sd": 0.0, "ci_low": lo, "ci_high": hi, "n_seeds": n, "n_bases": 1}
                         for m, d, b, x, v, lo, hi, n in rows])


def test_cells_skip_nulls_and_hold_fractions():
    cells = reported_cells([BLOCK])
    assert len(cells) == 9  # 12 values, 3 null
    row = cells[(cells["method"] == "negclip") & (cells["metric"] == "sugarcrepe/swap")].iloc[0]
    assert row["reported"] == pytest.approx(0.754)
    assert row["source"] == "seed 000 Table 3" and row["row"] == "NegCLIP [63]"


def test_table_sets_each_cell_beside_the_seed_mean_and_says_why_when_it_cannot():
    table = reproduction_table(summary_rows(), reported_cells([BLOCK]))
    assert len(table) == 9  # nothing declared is dropped
    negclip_swap = table[(table["method"] == "negclip") & (table["metric"] == "sugarcrepe/swap")].iloc[0]
    assert negclip_swap["status"] == REPRODUCED
    assert negclip_swap["difference"] == pytest.approx(0.74 - 0.754)
    assert (negclip_swap["ci_low"], negclip_swap["n_seeds"], negclip_swap["dataset"]) == (0.72, 3, "coco")
    composite = table[(table["method"] == "negclip") & (table["metric"] == "composite/comp")].iloc[0]
    assert composite["status"] == REPRODUCED and composite["reproduced"] == pytest.approx(0.71)
    statuses = dict(zip(table["row"] + " " + table["metric"], table["status"], strict=True))
    assert statuses["CE-CLIP [68] sugarcrepe/replace"] == NO_METHOD
    assert statuses["DeGLA (ours) sugarcrepe/swap"] == NOT_RUN
    clip_only = summary_rows().iloc[:1]
    table = reproduction_table(clip_only, reported_cells([BLOCK]))
    statuses = dict(zip(table["row"] + " " + table["metric"], table["status"], strict=True))
    assert statuses["CLIP [52] sugarcrepe/swap"] == NOT_MEASURED


def test_a_cell_naming_its_dataset_reads_that_dataset_only():
    block = {**BLOCK, "rows": [{"row": "NegCLIP", "method": "negclip", "dataset": "laion", "values": [85, 75, 70]}]}
    table = reproduction_table(summary_rows(), reported_cells([block]))
    assert set(table["status"]) == {NOT_MEASURED}


def test_markdown_names_sources_and_counts():
    text = reproduction_markdown(reproduction_table(summary_rows(), reported_cells([BLOCK])))
    assert "## seed 000 Table 3" in text and "| NegCLIP [63] | negclip | coco | sugarcrepe/swap | 75.4 | 74.0 [72.0, " \
                                            "76.0] | -1.4 | reproduced |" in text
    assert "5 reproduced, 2 method not run, 2 no method." in text
    assert "| DeGLA (ours) | degla |  | sugarcrepe/swap | 81.9 |  |  | method not run |" in text
    assert "No reported numbers" in reproduction_markdown(reproduction_table(summary_rows(), reported_cells([])))


def test_check_names_the_key():
    problems = check_reported([{**BLOCK, "rows": [{"row": "x", "method": "nope", "values": [1, 2]}]}],
                              ["negclip", "base-clip"], ["sugarcrepe"], [])
    keys = [key for key, _ in problems]
    assert "reported[0] (seed 000 Table 3).metrics" in keys  # composite comp is not defined
    assert "reported[0] (seed 000 Table 3).rows[0].values" in keys
    assert "reported[0] (seed 000 Table 3).rows[0].method" in keys


def test_paper_config_declares_reported_cells_that_check(repo):
    config = load_config(repo / "config" / "paper.yaml")
    cells = reported_cells(config["reported"])
    assert len(cells) > 100
    assert {s[:8] for s in cells["source"]} >= {"seed 000", "seed 001", "seed 002", "seed 003",
                                                "seed 004"}


def test_reported_blocks_accumulate_over_config_files(repo):
    """config/released.yaml's blocks (rows mapped to the released checkpoints) come after paper.yaml's 14 tables,
    not instead of them (a list given by a later file replaced the earlier one's); a block given twice is kept once."""
    from compo.reproduction import accumulated_reported

    paper = load_config(repo / "config" / "paper.yaml")["reported"]
    released = yaml.safe_load((repo / "config" / "released.yaml").read_text())["reported"]
    both = load_config(repo / "config" / "paper.yaml", repo / "config" / "released.yaml")["reported"]
    assert both == paper + released
    assert accumulated_reported([[BLOCK], None, [BLOCK]]) == [BLOCK] and accumulated_reported([None, None]) is None


def test_released_checkpoints_rows_are_the_paper_rows_they_copy(repo):
    """config/released.yaml sets the seeds' NegCLIP, DeGLA, CLIP and LongCLIP rows beside the released checkpoints
    (issue 57): each row's numbers are those of the row of the same name in paper.yaml's block of the same source,
    under the same metrics (a copy that drifts is caught), and every released base a row names is evaluated."""
    paper = {b["source"]: b for b in load_config(repo / "config" / "paper.yaml")["reported"]}
    config = load_config(repo / "config" / "paper.yaml", repo / "config" / "released.yaml")
    released = yaml.safe_load((repo / "config" / "released.yaml").read_text())["reported"]
    bound = set()
    for block in released:
        if block["source"] not in paper:
            continue  # FSC-CLIP's released CSV rows: no paper.yaml row of that name
        rows = {r["row"]: r for r in paper[block["source"]]["rows"]}
        assert block["metrics"] == paper[block["source"]]["metrics"], block["source"]
        for row in block["rows"]:
            assert row["values"] == rows[row["row"]]["values"], (block["source"], row["row"])
            bound.add(row["method"])
    assert {"base-negclip-released", "base-degla-released", "base-longclip-b", "base-clip"} <= bound
    assert {m.removeprefix("base-") for m in bound} <= set(config["study"]["bases"])
