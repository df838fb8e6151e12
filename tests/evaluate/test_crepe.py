"""CREPE-Productivity, EqBen and COCO-Counterfactuals (issue 47): their annotations could not be copied, so each is
tested on a fixture in the release's layout (tests/fixtures/raw, make_raw_fixtures.py, written from
../shared/benchmarks/README.md and the released readers), with its scoring checked against scores computed by hand."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from compo.evaluate import BenchmarkError, benchmark_files, crepe, eqben, run_benchmark
from compo.evaluate import coco_counterfactuals as coco_cf
from compo.images import open_image
from compo.models import encode_images, encode_texts

RAW = Path(__file__).resolve().parent / "fixtures" / "raw"
pytestmark = pytest.mark.usefixtures("one_thread")


def cosine(loaded, image: Image.Image, texts: list[str]) -> np.ndarray:
    return (encode_texts(loaded, texts).double() @ encode_images(loaded, [image]).double()[0]).numpy()


# --- CREPE ------------------------------------------------------------------------------------------------------


def test_crepe_files_and_items() -> None:
    files = benchmark_files("crepe", "b", {})
    assert len(files) == 27 and files[0] == "b/prod_hard_negatives/atom/prod_vg_hard_negs_atom_complexity_4.csv"
    rows = crepe.load_rows(RAW / "crepe" / Path(files[-3]).relative_to("b"))  # negate, complexity 10
    assert len(rows) == 1 and rows[0]["box"] == (2, 4, 22, 20) and len(rows[0]["negatives"]) == 3
    assert rows[0]["caption"] == "a small small small small small small red cup on a table"
    assert sum(len(crepe.load_rows(RAW / "crepe" / Path(f).relative_to("b"))) for f in files) == 29


def test_crepe_scores_the_cropped_region_and_counts_ties_against_the_model(tmp_path: Path, loaded) -> None:
    shutil.copytree(RAW / "crepe", tmp_path, dirs_exist_ok=True)
    result = run_benchmark(loaded, {"kind": "crepe", "source": "files"}, tmp_path)
    assert result.skipped == {"missing_image": 1}  # image 3 of atom/4 is in neither VG_100K nor VG_100K_2
    assert result.metrics["atom"].n == 10 and result.metrics["atom/4"].n == 2 and result.headline == "mean"
    row = result.predictions.set_index("item").loc["prod_vg_hard_negs_negate_complexity_6/2"]
    crop = Image.open(tmp_path / "images" / "VG_100K" / "1.jpg").convert("RGB").crop((2, 4, 22, 20))
    caption = "a small small red cup on a table"
    scores = cosine(loaded, crop, [caption, caption.replace("red", "blue"), caption.replace("cup", "dog"),
                                   caption.replace("on a table", "not on a table")])
    assert row["score_pos"] == pytest.approx(scores[0], abs=1e-6)
    assert row["rank"] == 1 + (scores[1:] >= scores[0]).sum()
    means = [result.metrics[k].value for k in ("atom", "swap", "negate")]
    assert result.metrics["mean"].value == pytest.approx(sum(means) / 3)

    # a hard negative equal to the caption ties it: the release's argsort leaves the order undefined, the
    # project's rule counts it wrong
    path = tmp_path / "prod_hard_negatives" / "swap" / "prod_vg_hard_negs_swap_complexity_5.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([crepe.COLUMNS, [2, 0, 0, 8, 8, "a cup", repr(["a cup", "a dog"])]])
    tied = run_benchmark(loaded, {"kind": "crepe", "source": "files"}, tmp_path).predictions
    assert tied.set_index("subset").loc["swap/5", "rank"] >= 2

    path.write_text("image_id,x,y,width,height,caption,hard_negs\n2,0,0,8,8,a cup,__import__('os')\n")
    with pytest.raises(BenchmarkError, match="complexity_5.csv: line 2: hard_negs is not a Python-literal list"):
        run_benchmark(loaded, {"kind": "crepe", "source": "files"}, tmp_path)


def test_crepe_regions_of_inf_nan_or_far_larger_than_the_image_are_clipped_or_skipped_and_counted(
        tmp_path: Path, loaded, caplog) -> None:
    """Issue 59: a coordinate of inf ended in int()'s OverflowError, a region far larger than its image in PIL's
    decompression-bomb error (ARO's boxes were clipped, CREPE's were not). Now inf/NaN skip the item
    (`box_not_finite`), a region far larger than the image is clipped to it (logged with a count) and scored as
    that crop, a region beside the image (at a coordinate PIL cannot address) is skipped (`box_outside_image`)."""
    shutil.copytree(RAW / "crepe", tmp_path, dirs_exist_ok=True)
    path = tmp_path / "prod_hard_negatives" / "swap" / "prod_vg_hard_negs_swap_complexity_5.csv"
    negatives = repr(["a small red table on a cup"])
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([crepe.COLUMNS,
                                      [2, "inf", 4, 20, 16, "a small red cup on a table", negatives],
                                      [2, 2, 4, "nan", 16, "a small red cup on a table", negatives],
                                      [2, -5, -5, 1_000_000, 1_000_000, "a small red cup on a table", negatives],
                                      [2, 10**13, 0, 5, 5, "a small red cup on a table", negatives]])
    with caplog.at_level("WARNING", logger="compo.evaluate.scoring"):
        result = run_benchmark(loaded, {"kind": "crepe", "source": "files"}, tmp_path)
    assert result.skipped == {"missing_image": 1, "box_not_finite": 2, "box_outside_image": 1}
    assert "1 crop box(es) larger than their image clipped to it" in caplog.text
    row = result.predictions.set_index("item").loc["prod_vg_hard_negs_swap_complexity_5/4"]
    image = Image.open(tmp_path / "images" / "VG_100K_2" / "2.jpg").convert("RGB")  # the whole image: clipped
    scores = cosine(loaded, image, ["a small red cup on a table", "a small red table on a cup"])
    assert row["score_pos"] == pytest.approx(scores[0], abs=1e-6)
    assert result.metrics["swap/5"].n == 1


def test_vl_compo_crepe_column_is_the_mean_of_the_three_types() -> None:
    from test_imagecode_vl_checklist import REAL, vl_compo_rows

    if REAL is None:
        pytest.skip("the released benchmark files (shared/benchmarks) are absent")
    pairs = vl_compo_rows()
    assert len(pairs) == 201
    for result, parts in pairs:
        values = {kind: float(parts[f"crepe::{kind}"]) for kind in ("atom", "swap", "negate")}
        assert crepe.type_mean(values) == pytest.approx(float(result["crepe"]), abs=1e-6)


# --- EqBen ------------------------------------------------------------------------------------------------------


def test_eqben_reads_nested_winoground_style_pairs_and_caps_each_subset() -> None:
    file = RAW / "eqben" / "eqben_annotation.json"
    pairs = eqben.load_pairs(file)
    assert [eqben.subset_of(p[1]) for p in pairs] == ["eqbenkubric_loc"] * 3 + ["eqbensd", "eqbenyoucook2"]
    assert pairs[-1][2] == "cut the onion"  # a caption list counts by its first entry, as EqBenAG reads it
    kept = eqben.capped(pairs, 2, seed=0)
    assert len(kept) == 4 and kept == eqben.capped(pairs, 2, seed=0)  # 2 of kubric's 3, the other subsets whole
    assert kept == [p for p in pairs if p in kept]  # file order
    assert benchmark_files("eqben", "b", {"file": "ann.json"}) == ["b/ann.json"]
    with pytest.raises(BenchmarkError, match="eqben: set 'file'"):
        benchmark_files("eqben", "b", {})


def test_eqben_scores_winoground_strictly_per_subset(tmp_path: Path, loaded) -> None:
    shutil.copytree(RAW / "eqben", tmp_path, dirs_exist_ok=True)
    spec = {"kind": "eqben", "source": "files", "file": "eqben_annotation.json"}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.skipped == {} and result.headline == "group"  # the .npy YouCook2 frames are read
    assert result.metrics["eqbenkubric_loc/group"].n == 3 and result.metrics["eqbenyoucook2/text"].n == 1
    images = [open_image(tmp_path / "images" / "eqbensd" / f"cat_{k}.png") for k in (0, 1)]
    s = np.stack([cosine(loaded, image, ["a black cat", "a white cat"]) for image in images], axis=1)  # [c, i]
    text = s[0, 0] > s[1, 0] and s[1, 1] > s[0, 1]
    image = s[0, 0] > s[0, 1] and s[1, 1] > s[1, 0]
    assert result.metrics["eqbensd/text"].value == float(text)
    assert result.metrics["eqbensd/group"].value == float(text and image)
    subsets = [k for k in result.metrics if k.endswith("/image")]
    assert result.metrics["image"].value == pytest.approx(np.mean([result.metrics[k].value for k in subsets]))

    # one image under both names: every image comparison ties, and a tie is wrong (strict >, as released)
    shutil.copy(tmp_path / "images" / "eqbensd" / "cat_0.png", tmp_path / "images" / "eqbensd" / "cat_1.png")
    assert run_benchmark(loaded, spec, tmp_path).metrics["eqbensd/image"].value == 0.0

    (tmp_path / "random.json").write_text(json.dumps([{"image": "eqbensd/cat_0.png", "caption": "a cat"}]))
    with pytest.raises(BenchmarkError, match=r"random.json: \[0\]: a single \{image, caption\} pair"):
        run_benchmark(loaded, {**spec, "file": "random.json"}, tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps([{"image0": "eqbensd/cat_0.png", "caption0": "a cat"}]))
    with pytest.raises(BenchmarkError, match=r"bad.json: \[0\]: missing field\(s\) image1, caption1"):
        run_benchmark(loaded, {**spec, "file": "bad.json"}, tmp_path)


def test_an_eqben_pair_given_twice_is_scored_once_and_counted(tmp_path: Path, loaded) -> None:
    """Issue 59: a pair the annotation gives twice was scored twice. Now the repeat is left out, counted as
    `repeated_item`, and every metric equals the file's without it, to the digit."""
    shutil.copytree(RAW / "eqben", tmp_path, dirs_exist_ok=True)
    spec = {"kind": "eqben", "source": "files", "file": "eqben_annotation.json"}
    before = run_benchmark(loaded, spec, tmp_path)
    annotation = json.loads((tmp_path / "eqben_annotation.json").read_text())
    annotation["list"].append(dict(annotation["list"][3]))  # eqbensd's pair again, at the end of the list
    (tmp_path / "eqben_annotation.json").write_text(json.dumps(annotation))
    after = run_benchmark(loaded, spec, tmp_path)
    assert before.skipped == {} and after.skipped == {"repeated_item": 1}
    assert after.metrics == before.metrics


# --- COCO-Counterfactuals -----------------------------------------------------------------------------------------


def test_coco_counterfactuals_sample_is_fsc_clips_thirty_percent() -> None:
    examples = coco_cf.load_examples(RAW / "coco_counterfactuals" / "data" / "examples.jsonl")
    assert len(examples) == 10 and benchmark_files("coco_counterfactuals", "b", {}) == ["b/data/examples.jsonl"]
    drawn = coco_cf.sample(examples, 0.3, seed=0)
    assert len(drawn) == 3 and drawn == coco_cf.sample(examples, 0.3, seed=0) != coco_cf.sample(examples, 0.3, 1)
    assert len(coco_cf.sample([{}] * 17_410, 0.3, seed=0)) == 5_223  # FSC-CLIP: 5,223 of 17,410


def test_coco_counterfactuals_retrieval_r1(tmp_path: Path, loaded) -> None:
    shutil.copytree(RAW / "coco_counterfactuals", tmp_path, dirs_exist_ok=True)
    spec = {"kind": "coco_counterfactuals", "source": "files", "fraction": 1.0}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.metrics["i2t_r1"].n == 20 and result.metrics["t2i_r1"].n == 20 and result.headline == "r1_mean"
    records = [json.loads(line) for line in (tmp_path / "data" / "examples.jsonl").read_text().splitlines()]
    captions = [r[f"caption_{k}"] for r in records for k in (0, 1)]
    images = [open_image(tmp_path / "images" / f"{r[f'image_{k}']}.jpg") for r in records for k in (0, 1)]
    s = (encode_images(loaded, images).double() @ encode_texts(loaded, captions).double().T).numpy()
    i2t = np.mean([(np.delete(s[i], i) < s[i, i]).all() for i in range(20)])
    t2i = np.mean([(np.delete(s[:, j], j) < s[j, j]).all() for j in range(20)])
    assert result.metrics["i2t_r1"].value == pytest.approx(i2t) and result.metrics["t2i_r1"].value == pytest.approx(t2i)
    assert result.metrics["r1_mean"].value == pytest.approx((i2t + t2i) / 2)

    # example 0's two images made identical: each ties the other's caption, so neither is a strict top-1 hit
    shutil.copy(tmp_path / "images" / "0_0.jpg", tmp_path / "images" / "0_1.jpg")
    ranks = run_benchmark(loaded, spec, tmp_path).predictions.set_index(["subset", "item"])["rank"]
    assert ranks[("i2t", "0/0")] >= 2 and ranks[("i2t", "0/1")] >= 2

    (tmp_path / "data" / "examples.jsonl").write_text(json.dumps({"id": 1, "image_0": "a", "image_1": "b"}) + "\n")
    with pytest.raises(BenchmarkError, match=r"examples.jsonl: line 1: missing field\(s\) caption_0, caption_1"):
        run_benchmark(loaded, spec, tmp_path)
