"""What's Up, SPEC and SVO-Probes (issue 47): the loaders on fixtures in the releases' layouts (tests/fixtures/
benchmarks, written from ../shared/benchmarks/README.md; placeholder images at the paths the items name), the scoring
rules on known similarity matrices, the released tie rule beside the strict one, malformed files' errors, and
vl_compo's averaging of the What's Up and SVO-Probes columns."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from test_real_benchmarks import REAL, needs_real, placeholders

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark, spec_benchmark, svo_probes, whatsup
from compo.evaluate.files import SPEC_SUBSETS, WHATSUP_FILES
from compo.models import encode_images, encode_texts

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"


def cosine(loaded, image: Path, text: str) -> float:
    v = encode_images(loaded, [Image.open(image).convert("RGB")]).double()[0]
    return float(v @ encode_texts(loaded, [text]).double()[0])


# --- What's Up --------------------------------------------------------------------------------------------------

def whatsup_images(folder: Path) -> set[str]:
    """Every image path the fixture's items name, relative to the image root."""
    return {str(item.images[0].relative_to(folder)) for subset, name in WHATSUP_FILES.items()
            for item in whatsup.load_subset(FIXTURES / "whatsup" / name, subset, folder)}


def test_whatsup_files_counts_and_image_paths() -> None:
    root = Path("/images")
    counts = {s: len(whatsup.load_subset(FIXTURES / "whatsup" / f, s, root)) for s, f in WHATSUP_FILES.items()}
    assert counts == {"WhatsUp_A": 8, "WhatsUp_B": 4, "COCO_QA_ONE": 2, "COCO_QA_TWO": 2, "VG_QA_ONE": 2,
                      "VG_QA_TWO": 2}
    a = whatsup.load_subset(FIXTURES / "whatsup" / WHATSUP_FILES["WhatsUp_A"], "WhatsUp_A", root)
    assert (a[0].images, a[0].tags) == ((root / "controlled_images/mug_left_of_table.jpeg",),
                                        {"group": "mug|table", "preposition": "left"})
    b = whatsup.load_subset(FIXTURES / "whatsup" / WHATSUP_FILES["WhatsUp_B"], "WhatsUp_B", root)
    assert [item.tags["preposition"] for item in b] == ["left", "right", "in-front", "behind"]
    coco = whatsup.load_subset(FIXTURES / "whatsup" / "coco_qa_one_obj.json", "COCO_QA_ONE", root)
    assert coco[0].images == (root / "val2017/000000000139.jpg",) and coco[0].texts[0].endswith("on the left")
    vg = whatsup.load_subset(FIXTURES / "whatsup" / "vg_qa_two_obj.json", "VG_QA_TWO", root)
    assert vg[0].images == (root / "vg_images/1592.jpg",)
    assert benchmark_files("whatsup", "b", {}) == [f"b/{name}" for name in WHATSUP_FILES.values()]


def test_whatsup_pair_and_set_accuracy() -> None:
    items = whatsup.load_subset(FIXTURES / "whatsup" / WHATSUP_FILES["WhatsUp_A"], "WhatsUp_A", Path("/i"))
    # mug/table: all four right (2 pairs, 1 set); beer-bottle/armchair: left right, right wrong, on and under right
    correct = [True, True, True, True, True, False, True, True]
    assert whatsup.pair_and_set(items, correct, "WhatsUp_A") == (3 / 4, 1 / 2)


def test_whatsup_runs_on_the_fixture(tmp_path: Path, loaded) -> None:
    folder = tmp_path / "whatsup"
    shutil.copytree(FIXTURES / "whatsup", folder)
    names = whatsup_images(folder / "images")
    placeholders(folder / "images", names - {"vg_images/3001.jpg"})
    controlled = json.loads((folder / WHATSUP_FILES["WhatsUp_A"]).read_text())
    controlled[0]["caption_options"] = [controlled[0]["caption_options"][0]] * 4  # four equal captions: all tie
    (folder / WHATSUP_FILES["WhatsUp_A"]).write_text(json.dumps(controlled))

    result = run_benchmark(loaded, {"kind": "whatsup", "source": "files"}, folder)
    assert result.skipped == {"missing_image": 1} and result.headline == "mean"
    assert {s: result.metrics[s].n for s in WHATSUP_FILES} == {
        "WhatsUp_A": 8, "WhatsUp_B": 4, "COCO_QA_ONE": 2, "COCO_QA_TWO": 2, "VG_QA_ONE": 2, "VG_QA_TWO": 1}
    assert len(result.predictions) == 19
    rows = result.predictions.set_index(["subset", "item"])
    tie = rows.loc[("WhatsUp_A", "mug_left_of_table.jpeg")]
    assert tie["rank"] == 4 and not tie["correct"]  # strict: every tie counts against the model
    # released: the tie is right; no other item has equal captions, so the two rules differ by that item only
    assert result.metrics["WhatsUp_A"].value == pytest.approx(result.metrics["WhatsUp_A_strict"].value + 1 / 8)
    assert result.metrics["mean"].value == pytest.approx(np.mean([result.metrics[s].value for s in WHATSUP_FILES]))
    strict = rows.loc["WhatsUp_A"]["correct"].tolist()
    items = whatsup.load_subset(folder / WHATSUP_FILES["WhatsUp_A"], "WhatsUp_A", folder / "images")
    assert result.metrics["WhatsUp_A_pair_strict"].value == whatsup.pair_and_set(items, strict, "WhatsUp_A")[0]
    assert result.metrics["WhatsUp_B_set"].n == 1
    row = rows.loc[("COCO_QA_ONE", "139")]
    expected = cosine(loaded, folder / "images/val2017/000000000139.jpg", "A photo of a dog on the left")
    assert row["score_pos"] == pytest.approx(expected, abs=1e-6)


def test_whatsup_malformed_files_name_file_and_item(tmp_path: Path) -> None:
    path = tmp_path / "controlled_images_dataset.json"
    path.write_text(json.dumps([{"image_path": "data/controlled_images/mug_on_table.jpeg",
                                 "caption_options": ["a", "b", "c"]}]))
    with pytest.raises(BenchmarkError, match=r"controlled_images_dataset.json: item 0: 'caption_options' must be"):
        whatsup.load_subset(path, "WhatsUp_A", tmp_path)
    path.write_text(json.dumps([{"image_path": "mug_beside_table.jpeg", "caption_options": ["a", "b", "c", "d"]}]))
    with pytest.raises(BenchmarkError, match="item 0: image file name 'mug_beside_table.jpeg'"):
        whatsup.load_subset(path, "WhatsUp_A", tmp_path)
    path.write_text(json.dumps([[139, "a dog on the left"]]))
    with pytest.raises(BenchmarkError, match=r"item 0: expected \[image_id, right caption, wrong caption\]"):
        whatsup.load_subset(path, "COCO_QA_ONE", tmp_path)


# --- SPEC -------------------------------------------------------------------------------------------------------

def test_spec_files_counts_and_summary() -> None:
    for subset in SPEC_SUBSETS:
        i2t = spec_benchmark.load_file(FIXTURES / "spec" / subset / "image2text.json", "i2t", Path("/s"))
        t2i = spec_benchmark.load_file(FIXTURES / "spec" / subset / "text2image.json", "t2i", Path("/s"))
        assert (len(i2t), len(t2i)) == (2, 2)
    assert i2t[1].images == (Path("/s/images/1_0.jpg"),) and len(i2t[1].texts) == 3
    assert t2i[0].images[2] == Path("/s/images/0_2.jpg") and t2i[0].right == (2,) and t2i[0].subset == "s/t2i"
    assert len(benchmark_files("spec", "b", {})) == 12 and "b/count/text2image.json" in benchmark_files("spec", "b")
    assert spec_benchmark.summary({"count/i2t": 0.5, "existence/i2t": 1.0, "count/t2i": 0.25}) == {
        "i2t": 0.75, "t2i": 0.25, "mean": 0.5}


def test_spec_runs_on_the_fixture(tmp_path: Path, loaded) -> None:
    folder = tmp_path / "spec"
    shutil.copytree(FIXTURES / "spec", folder)
    placeholders(folder, {f"{s}/images/{k}_{j}.jpg" for s in SPEC_SUBSETS for k in (0, 1) for j in (0, 1, 2)}
                 - {"count/images/1_2.jpg"})
    t2i = json.loads((folder / "existence/text2image.json").read_text())
    t2i[0]["keys"], t2i[0]["label"] = ["images/0_1.jpg"] * 3, 0  # one image three times: all tie
    (folder / "existence/text2image.json").write_text(json.dumps(t2i))

    result = run_benchmark(loaded, {"kind": "spec", "source": "files"}, folder)
    assert result.skipped == {"missing_image": 1}  # count/t2i item 1 names 1_2.jpg
    assert result.metrics["count/t2i"].n == 1 and result.metrics["count/i2t"].n == 2
    assert len(result.predictions) == 23 and result.headline == "mean"
    rows = result.predictions.set_index(["subset", "item"])
    assert rows.loc[("existence/t2i", "0"), "rank"] == 3 and not rows.loc[("existence/t2i", "0"), "correct"]
    gap = result.metrics["existence/t2i"].value - result.metrics["existence/t2i_strict"].value
    assert gap == pytest.approx(0.5)  # the released first-maximum rule counts the tie right
    i2t = np.mean([result.metrics[f"{s}/i2t"].value for s in SPEC_SUBSETS])
    t2i_mean = np.mean([result.metrics[f"{s}/t2i"].value for s in SPEC_SUBSETS])
    assert result.metrics["mean"].value == pytest.approx((i2t + t2i_mean) / 2)
    item = json.loads((folder / "count/image2text.json").read_text())[1]
    expected = cosine(loaded, folder / "count" / item["query"], item["keys"][item["label"]])
    assert rows.loc[("count/i2t", "1"), "score_pos"] == pytest.approx(expected, abs=1e-6)


def test_spec_malformed_file(tmp_path: Path) -> None:
    items = json.loads((FIXTURES / "spec/count/image2text.json").read_text())
    items[1]["label"] = 3
    (tmp_path / "image2text.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"image2text.json: item 1: 'label' must be an index into its 3 keys"):
        spec_benchmark.load_file(tmp_path / "image2text.json", "i2t", tmp_path)
    items[1]["label"], items[1]["keys"] = 0, items[1]["keys"][:2]
    (tmp_path / "image2text.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match="item 1: 2 keys, but item 0 has 3"):
        spec_benchmark.load_file(tmp_path / "image2text.json", "i2t", tmp_path)


# --- SVO-Probes -------------------------------------------------------------------------------------------------

def test_svo_probes_runs_on_the_fixture(tmp_path: Path, loaded) -> None:
    rows = svo_probes.load_rows(FIXTURES / "svo_probes" / "svo_probes.csv")
    assert len(rows) == 5 and [sum(r[n] for r in rows) for n in svo_probes.NEGATIVES] == [1, 2, 2]
    assert benchmark_files("svo_probes", "b", {}) == ["b/svo_probes.csv"]
    placeholders(tmp_path, {f"{k}.jpg" for k in range(1, 10)})  # 10.jpg (the last row's negative) is missing
    shutil.copy(tmp_path / "1.jpg", tmp_path / "2.jpg")  # line 2's negative is its positive's copy: a tie
    result = run_benchmark(loaded, {"kind": "svo_probes", "source": "files", "image_root": str(tmp_path)},
                           FIXTURES / "svo_probes")
    assert result.skipped == {"missing_image": 1}
    assert {n: result.metrics[n].n for n in svo_probes.NEGATIVES} == {"subj_neg": 1, "verb_neg": 2, "obj_neg": 1}
    assert result.metrics["mean"].value == pytest.approx(np.mean([result.metrics[n].value
                                                                  for n in svo_probes.NEGATIVES]))
    rows = result.predictions.set_index("item")
    assert rows.loc["2", "rank"] == 2 and not rows.loc["2", "correct"] and result.metrics["subj_neg"].value == 0
    assert (rows["correct"] == (rows["score_pos"] > rows["score_neg"] + 1e-9)).all()
    row = rows.loc["3"]  # line 3: "A girl walks a dog.", images 3 and 4
    pos, neg = (cosine(loaded, tmp_path / f"{k}.jpg", "A girl walks a dog.") for k in (3, 4))
    assert (row["score_pos"], row["score_neg"]) == (pytest.approx(pos, abs=1e-6), pytest.approx(neg, abs=1e-6))
    assert bool(row["correct"]) == (pos > neg) and row["subset"] == "verb_neg"


def test_svo_probes_malformed_file(tmp_path: Path) -> None:
    with open(FIXTURES / "svo_probes" / "svo_probes.csv", newline="") as handle:
        table = list(csv.reader(handle))
    table[2][table[0].index("verb_neg")] = "yes"
    with open(tmp_path / "svo_probes.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(table)
    with pytest.raises(BenchmarkError, match="svo_probes.csv: line 3: verb_neg must be True or False, got 'yes'"):
        svo_probes.load_rows(tmp_path / "svo_probes.csv")
    with open(tmp_path / "svo_probes.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([row[:-1] for row in table])
    with pytest.raises(BenchmarkError, match="missing column"):
        svo_probes.load_rows(tmp_path / "svo_probes.csv")


# --- vl_compo's averages ----------------------------------------------------------------------------------------

@needs_real
# --- repeated items (issue 59) ------------------------------------------------------------------------------------

def _repeat_first_item(path: Path) -> None:
    """The release file `path` with its first item given again at its end."""
    if path.suffix == ".csv":
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join([*lines, lines[1] if lines[-1].endswith("\n") else "\n" + lines[1]]))
    else:
        items = json.loads(path.read_text())
        path.write_text(json.dumps([*items, items[0]]))


@pytest.mark.parametrize("kind, repeated", [("whatsup", WHATSUP_FILES["WhatsUp_A"]), ("whatsup", WHATSUP_FILES[
    "COCO_QA_ONE"]), ("spec", "count/image2text.json"), ("spec", "existence/text2image.json"),
    ("svo_probes", "svo_probes.csv")])
def test_an_item_given_twice_is_scored_once_and_counted(tmp_path: Path, loaded, kind: str, repeated: str) -> None:
    """Issue 59: an item a release file gives twice was scored twice (an extra item in its accuracy). Now the repeat
    is left out, counted as `repeated_item`: every metric equals the file's without the repeat, to the digit."""
    folder = tmp_path / kind
    shutil.copytree(FIXTURES / kind, folder)
    spec = {"kind": kind, "source": "files"}
    if kind == "whatsup":
        placeholders(folder / "images", whatsup_images(folder / "images"))
    elif kind == "spec":
        placeholders(folder, {f"{s}/images/{k}_{j}.jpg" for s in SPEC_SUBSETS for k in (0, 1) for j in (0, 1, 2)})
    else:
        placeholders(tmp_path / "images", {f"{k}.jpg" for k in range(1, 11)})
        spec["image_root"] = str(tmp_path / "images")
    before = run_benchmark(loaded, spec, folder)
    _repeat_first_item(folder / repeated)
    after = run_benchmark(loaded, spec, folder)
    assert before.skipped == {} and after.skipped == {"repeated_item": 1}
    assert after.metrics == before.metrics
    pd.testing.assert_frame_equal(after.predictions, before.predictions)


def test_vl_compo_whatsup_and_svo_columns_are_plain_means() -> None:
    """results.csv's whatsup and svo_probes columns are the plain means of individual_results.csv's subtasks (the
    rule the loaders' `mean` follows)."""
    import pandas as pd

    results = pd.read_csv(REAL / "vl_compo" / "results.csv")
    parts = pd.read_csv(REAL / "vl_compo" / "individual_results.csv")
    both = results.merge(parts, on=["arch", "pretrained", "family"])
    assert len(both) >= 200
    for column, names in (("whatsup", WHATSUP_FILES), ("svo_probes", svo_probes.NEGATIVES)):
        mean = both[[f"{column}::{name}" for name in names]].mean(axis=1)
        assert (mean - both[column]).abs().max() < 1e-6, column


@needs_real
def test_the_plans_whatsup_counts_make_vl_compos_accuracies_whole() -> None:
    """compo.plan sizes What's Up by item counts inferred from vl_compo's accuracies: each count n turns every one
    of the 202 checkpoints' accuracies into a whole number of items, and no smaller n does."""
    import pandas as pd

    from compo.evaluate.whatsup import RELEASED_SUBSETS as WHATSUP_SUBSETS

    def whole(accuracy, count: int) -> bool:  # noqa: ANN001 - a numpy array
        return bool((abs(accuracy * count - (accuracy * count).round()) < 1e-3).all())

    parts = pd.read_csv(REAL / "vl_compo" / "individual_results.csv")
    for subset, (n, _) in WHATSUP_SUBSETS.items():
        accuracy = parts[f"whatsup::{subset}"].dropna().to_numpy() / 100
        assert len(accuracy) == 202 and whole(accuracy, n), subset
        assert not any(whole(accuracy, m) for m in range(50, n)), subset
