"""What's Up (compo.evaluate.whatsup, issue 47): the loader on the fixture in the release's layout (placeholder
images at the paths the items name), pair and set accuracy, malformed files' errors, the subsets a spec may name, and
vl_compo's averaging of its columns (and SVO-Probes')."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchmark_helpers import FIXTURES, cosine, whatsup_images
from test_real_benchmarks import REAL, needs_real, placeholders

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark, svo_probes, whatsup
from compo.evaluate.files import WHATSUP_FILES, whatsup_subsets

pytestmark = pytest.mark.usefixtures("one_thread")


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


@needs_real  # vl_compo's results files
def test_vl_compo_whatsup_and_svo_columns_are_plain_means() -> None:
    """results.csv's whatsup and svo_probes columns are the plain means of individual_results.csv's subtasks (the
    rule the loaders' `mean` follows)."""

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

    from compo.evaluate.whatsup import RELEASED_SUBSETS as WHATSUP_SUBSETS

    def whole(accuracy, count: int) -> bool:  # noqa: ANN001 - a numpy array
        return bool((abs(accuracy * count - (accuracy * count).round()) < 1e-3).all())

    parts = pd.read_csv(REAL / "vl_compo" / "individual_results.csv")
    for subset, (n, _) in WHATSUP_SUBSETS.items():
        accuracy = parts[f"whatsup::{subset}"].dropna().to_numpy() / 100
        assert len(accuracy) == 202 and whole(accuracy, n), subset
        assert not any(whole(accuracy, m) for m in range(50, n)), subset


def test_whatsup_subsets_must_be_known_names() -> None:
    assert whatsup_subsets({}) == ["WhatsUp_A", "WhatsUp_B", "COCO_QA_ONE", "COCO_QA_TWO", "VG_QA_ONE", "VG_QA_TWO"]
    with pytest.raises(BenchmarkError, match=r"whatsup: 'subsets' must be .* got \['WhatsUp_C'\]"):
        benchmark_files("whatsup", "b", {"subsets": ["WhatsUp_C"]})
