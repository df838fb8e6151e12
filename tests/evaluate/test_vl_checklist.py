"""VL-CheckList (compo.evaluate.vl_checklist, issue 47): the loader on the released files in ../shared/benchmarks
(item counts as its README states them; placeholder images at the paths the items name), the scoring rules by hand
on small fixtures in the release's layout, and vl_compo's averaging rules (its vl_checklist, imagecode and comp_avg
columns) reproduced from its results tables."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchmark_helpers import vl_compo_rows
from PIL import Image
from test_real_benchmarks import REAL, needs_real, placeholders

from compo.evaluate import BenchmarkError, benchmark_files, imagecode, run_benchmark, vl_checklist
from compo.evaluate.files import VL_CHECKLIST_SUBTASKS
from compo.models import encode_images, encode_texts
from compo.stats import ID_COLUMNS, with_composites

pytestmark = [needs_real,
              pytest.mark.usefixtures("one_thread")]


# ../shared/benchmarks/README.md, "VL-CheckList": items per copied file
VL_COUNTS = {
    "Attribute/vaw/action": 3039, "Attribute/vaw/material": 11835, "Attribute/vaw/size": 15321,
    "Attribute/vaw/state": 4939, "Attribute/vg/action": 1892, "Attribute/vg/color": 11569,
    "Attribute/vg/material": 2470, "Attribute/vg/size": 2695, "Attribute/vg/state": 941,
    "Object/Location/hake_location/hake_obj_margin": 10062,
    "Object/Location/swig_location/swig_agent/swig_agent_margin": 260,
    **{f"Object/Location/swig_location/swig_destination/swig_destination_{k}": n
       for k, n in (("center", 1063), ("margin", 45), ("mid", 530))},
    **{f"Object/Location/swig_location/swig_item/swig_item_{k}": n for k, n in (("margin", 88), ("mid", 1715))},
    **{f"Object/Location/swig_location/swig_tool/swig_tool_{k}": n for k, n in (("margin", 121), ("mid", 2226))},
    "Object/Location/vg_location/vg_obj_margin": 8291,
    **{f"Object/Location/vg_location/vg_subj_{k}": n for k, n in (("center", 25383), ("margin", 5974), ("mid", 26294))},
    "Object/Size/hake_size/hake_obj_small": 6210,
    **{f"Object/Size/swig_size/swig_agent/swig_agent_{k}": n for k, n in (("medium", 442), ("small", 48))},
    **{f"Object/Size/swig_size/swig_destination/swig_destination_{k}": n
       for k, n in (("large", 1520), ("medium", 109), ("small", 9))},
    **{f"Object/Size/swig_size/swig_item/swig_item_{k}": n for k, n in (("medium", 742), ("small", 154))},
    **{f"Object/Size/swig_size/swig_place/swig_place_{k}": 0 for k in ("large", "medium", "small")},
    **{f"Object/Size/swig_size/swig_tool/swig_tool_{k}": n for k, n in (("medium", 1452), ("small", 308))},
    "Object/Size/vg_size/vg_obj_small": 13702,
    **{f"Object/Size/vg_size/vg_subj_{k}": n for k, n in (("large", 26167), ("medium", 20930), ("small", 10554))},
    "Relation/vg/action": 12733, "Relation/vg/spatial": 30650,
}


@pytest.mark.slow  # 27 MB of JSON read through the checked reader: ~12 s on the busy 2-core machine
def test_vl_checklist_release_counts_and_corpus() -> None:
    files = sorted((REAL / "vl_checklist" / "data").rglob("*.json"))
    counts = {str(p.relative_to(REAL / "vl_checklist" / "data").with_suffix("")): len(vl_checklist.load_items(p))
              for p in files}
    assert counts == VL_COUNTS and sum(counts.values()) == 262483
    listed = benchmark_files("vl_checklist", str(REAL / "vl_checklist"), {})
    assert sorted(listed) == sorted(map(str, (REAL / "vl_checklist" / "corpus").rglob("*.yaml"))) and len(listed) == 56
    assert len(VL_CHECKLIST_SUBTASKS) == 13
    referenced = {vl_checklist.read_corpus(Path(p))["ANNO_PATH"] for p in listed}
    assert len(referenced) == 56 and sum((REAL / "vl_checklist" / a).is_file() for a in referenced) == 38


@pytest.mark.slow  # reads every copied file twice
def test_vl_checklist_on_the_release_first_items(tmp_path: Path, loaded) -> None:
    """max_num 20: the first 10 items of each source with an image; placeholders for the first 12 of each file, so
    the two after them are dropped as missing before the cut, as the release's loader does."""
    names = set()
    for yaml_file in (REAL / "vl_checklist" / "corpus").rglob("*.yaml"):
        corpus = vl_checklist.read_corpus(yaml_file)
        if (REAL / "vl_checklist" / corpus["ANNO_PATH"]).is_file():
            items = vl_checklist.load_items(REAL / "vl_checklist" / corpus["ANNO_PATH"])
            names |= {f"{corpus['IMG_ROOT'].strip('/')}/{image}" for image, _, _ in items[:12]}
    placeholders(tmp_path, names)
    spec = {"kind": "vl_checklist", "source": "files", "image_root": str(tmp_path), "max_num": 20}
    with pytest.raises(BenchmarkError, match="hake_obj_center.json: VL-CheckList annotation file not found"):
        run_benchmark(loaded, spec, REAL / "vl_checklist")
    result = run_benchmark(loaded, {**spec, "allow_missing_sources": True}, REAL / "vl_checklist")
    assert result.skipped["missing_annotation_file"] == 18
    sources = [m for m in result.metrics if "/" in m]
    assert len(sources) == 38
    assert all(result.metrics[m].n == 10 for m in sources if m != "Object_Size_small/swig_destination")
    assert result.metrics["Object_Size_small/swig_destination"].n == 9  # the file has 9 items
    subtasks = {s: result.metrics[s].value for s in VL_CHECKLIST_SUBTASKS}
    assert subtasks["Relation_action"] == result.metrics["Relation_action/vg"].value
    means = {c: np.mean([v for s, v in subtasks.items() if s.startswith(c)]) for c in vl_checklist.CATEGORIES}
    assert result.metrics["mean"].value == pytest.approx(np.mean(list(means.values())))
    row = result.predictions.set_index(["subset", "item"]).loc[("Attribute_color/vg", "0")]
    image, pos, neg = vl_checklist.load_items(REAL / "vl_checklist" / "data/Attribute/vg/color.json")[0]
    v = encode_images(loaded, [Image.open(tmp_path / "vg" / image).convert("RGB")])[0].double()
    t = encode_texts(loaded, [pos, neg]).double()
    assert (row["score_pos"], row["score_neg"]) == (pytest.approx(float(v @ t[0]), abs=1e-6),
                                                    pytest.approx(float(v @ t[1]), abs=1e-6))


def test_vl_checklist_repeats_are_scored_as_released_unless_skip_repeats(tmp_path: Path, loaded, caplog) -> None:
    """Issue 59: an item given twice was scored twice. The release itself gives 9,746 items twice or more (614 within
    max_num 2000's cut), which the published numbers count: so by default each copy is scored, the count logged;
    with skip_repeats each is scored once, the repeat left out before max_num's cut and counted as repeated_item."""
    corpus = tmp_path / "corpus/v1/Relation/spatial"
    corpus.mkdir(parents=True)
    (corpus / "vg.yaml").write_text('ANNO_PATH: "data/Relation/vg/spatial.json"\nIMG_ROOT: "vg/"\nTYPE: "TUPLE_JSON"')
    (tmp_path / "data/Relation/vg").mkdir(parents=True)
    items = [["VG_100K/1.jpg", {"POS": ["a cup on a table"], "NEG": ["a table on a cup"]}],
             ["VG_100K/2.jpg", {"POS": ["a cat on a mat"], "NEG": ["a mat on a cat"]}],
             ["VG_100K/3.jpg", {"POS": ["a dog by a car"], "NEG": ["a car by a dog"]}]]
    placeholders(tmp_path / "photos", {"VG_100K/1.jpg", "VG_100K/2.jpg", "VG_100K/3.jpg"})
    spec = {"kind": "vl_checklist", "source": "files", "subtasks": ["Relation_spatial"],
            "image_roots": {"vg": str(tmp_path / "photos")}, "max_num": 6}
    annotation = tmp_path / "data/Relation/vg/spatial.json"
    annotation.write_text(json.dumps(items))
    once = run_benchmark(loaded, spec, tmp_path)
    annotation.write_text(json.dumps([items[0], items[0], items[1], items[2]]))  # item 0 given twice
    with caplog.at_level("WARNING", logger="compo.evaluate.vl_checklist"):
        released = run_benchmark(loaded, spec, tmp_path)
    assert "1 item(s) repeat an earlier one of their source" in caplog.text and "scored each time" in caplog.text
    assert released.skipped == {} and released.metrics["Relation_spatial/vg"].n == 3  # max_num 6: the first 3
    assert released.predictions["item"].tolist() == ["0", "1", "2"]
    skipping = run_benchmark(loaded, {**spec, "skip_repeats": True}, tmp_path)
    assert skipping.skipped == {"repeated_item": 1} and skipping.metrics == once.metrics


def test_vl_checklist_strict_tie_and_bad_files(tmp_path: Path, loaded) -> None:
    corpus = tmp_path / "corpus/v1/Relation/spatial"
    corpus.mkdir(parents=True)
    (corpus / "vg.yaml").write_text('ANNO_PATH: "data/Relation/vg/spatial.json"\nIMG_ROOT: "vg/"\nTYPE: "TUPLE_JSON"')
    (tmp_path / "data/Relation/vg").mkdir(parents=True)
    items = [["VG_100K/1.jpg", {"POS": ["a cup on a table", "x"], "NEG": ["a cup on a table", "y"]}],  # a tie
             ["VG_100K/2.jpg", {"POS": ["a cat on a mat"], "NEG": ["a mat on a cat"]}]]
    (tmp_path / "data/Relation/vg/spatial.json").write_text(json.dumps(items))
    placeholders(tmp_path / "photos", {"VG_100K/1.jpg", "VG_100K/2.jpg"})
    spec = {"kind": "vl_checklist", "source": "files", "subtasks": ["Relation_spatial"],
            "image_roots": {"vg": str(tmp_path / "photos")}}
    result = run_benchmark(loaded, spec, tmp_path)
    rows = result.predictions.set_index("item")
    assert not rows.loc["0", "correct"] and rows.loc["0", "rank"] == 2  # equal captions: a tie is wrong
    assert result.metrics["Relation"].value == result.metrics["mean"].value == result.metrics["Relation_spatial"].value
    items[1][1]["NEG"] = []
    (tmp_path / "data/Relation/vg/spatial.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match="spatial.json: item 1: 'NEG' must be a non-empty list"):
        run_benchmark(loaded, spec, tmp_path)
    with pytest.raises(BenchmarkError, match="'subtasks' must be"):
        run_benchmark(loaded, {**spec, "subtasks": ["Relation_size"]}, tmp_path)


def test_vl_checklist_corpus_files_cannot_point_outside_the_benchmark(tmp_path: Path, loaded) -> None:
    """A corpus yaml's ANNO_PATH or IMG_ROOT leaving its root ("..") was read and scored from outside the
    benchmark folder (issue 59): refused, naming the corpus file and the key, by the scorer and the overlap guard."""
    from compo.evaluate.kinds import benchmark_images
    from compo.paths import OutsideRootError

    bench = tmp_path / "bench"
    corpus = bench / "corpus/v1/Relation/spatial"
    corpus.mkdir(parents=True)
    (tmp_path / "outside_anno.json").write_text(json.dumps([["VG_100K/1.jpg", {"POS": ["a"], "NEG": ["b"]}]]))
    spec = {"kind": "vl_checklist", "source": "files", "subtasks": ["Relation_spatial"]}
    for anno, img_root, key in (("../../../../../outside_anno.json", "vg/", "ANNO_PATH"),
                                ("data/spatial.json", "../../outside/", "IMG_ROOT")):
        (bench / "data").mkdir(exist_ok=True)
        (bench / "data/spatial.json").write_text((tmp_path / "outside_anno.json").read_text())
        (corpus / "vg.yaml").write_text(f'ANNO_PATH: "{anno}"\nIMG_ROOT: "{img_root}"\nTYPE: "TUPLE_JSON"')
        for read in (lambda: run_benchmark(loaded, spec, bench), lambda: benchmark_images("vl_checklist", spec, bench)):
            with pytest.raises(OutsideRootError, match=rf"vg\.yaml: {key}: path .* outside .*refused"):
                read()


def test_vl_compo_vl_checklist_and_imagecode_columns_reproduce() -> None:
    """vl_checklist = the mean of the Object / Attribute / Relation means of the 13 subtasks (vl_checklist.summary);
    imagecode = the item-level accuracy over the release's 1,872 video and 430 static descriptions."""
    pairs = vl_compo_rows()
    assert len(pairs) == 201  # one of 202 (ALIP yfcc15m) has a different family in the two files
    items = imagecode.load_descriptions(REAL / "imagecode" / "valid_data.json")
    static = sum(imagecode.subset_of(s) == "static" for s, _, _ in items)
    for result, parts in pairs:
        subtasks = {name: float(parts[f"vl_checklist::{name}"]) for name in VL_CHECKLIST_SUBTASKS}
        assert vl_checklist.summary(subtasks)["mean"] == pytest.approx(float(result["vl_checklist"]), abs=1e-6)
        overall = ((len(items) - static) * float(parts["imagecode::videos"])
                   + static * float(parts["imagecode::static"])) / len(items)
        assert overall == pytest.approx(float(result["imagecode"]), abs=1e-6)


def test_vl_compo_comp_avg_is_the_plain_mean_of_its_twelve_columns() -> None:
    """comp_avg as the project's composite (compo.stats.with_composites) of vl_compo's 12 benchmark columns."""
    columns = ["aro", "colorswap", "crepe", "eqben", "imagecode", "mmvp_vlm", "sugarcrepe", "svo_probes", "valse",
               "vl_checklist", "whatsup", "winoground"]
    with open(REAL / "vl_compo" / "results.csv", newline="") as handle:
        results = list(csv.DictReader(handle))
    long = pd.DataFrame([{"model": f"{i}", "method": r["arch"], "dataset": r["pretrained"], "seed": 0,
                          "benchmark": c, "kind": c, "protocol": "", "metric": "value", "value": float(r[c]),
                          "n": 1, "headline": True, "source": ""} for i, r in enumerate(results) for c in columns])
    assert set(ID_COLUMNS) <= set(long.columns)
    out = with_composites(long, {"comp_avg": [f"{c}/value" for c in columns]})
    composite = out[out["benchmark"] == "composite"].set_index("model")["value"]
    assert len(composite) == len(results) == 202
    for i, row in enumerate(results):
        assert composite[str(i)] == pytest.approx(float(row["comp_avg"]), abs=1e-6)
