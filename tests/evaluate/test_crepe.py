"""CREPE-Productivity (compo.evaluate.crepe, issue 47): its annotations could not be copied, so it is tested on a
fixture in the release's layout (tests/fixtures/raw, make_raw_fixtures.py), with its scoring checked against scores
computed by hand, and vl_compo's crepe column reproduced."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from benchmark_helpers import RAW, image_text_cosines, vl_compo_rows
from PIL import Image

from compo.evaluate import BenchmarkError, benchmark_files, crepe, run_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")


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
    scores = image_text_cosines(loaded, crop, [caption, caption.replace("red", "blue"), caption.replace("cup", "dog"),
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
    scores = image_text_cosines(loaded, image, ["a small red cup on a table", "a small red table on a cup"])
    assert row["score_pos"] == pytest.approx(scores[0], abs=1e-6)
    assert result.metrics["swap/5"].n == 1


def test_vl_compo_crepe_column_is_the_mean_of_the_three_types() -> None:
    from test_real_benchmarks import REAL

    if REAL is None:
        pytest.skip("the released benchmark files (shared/benchmarks) are absent")
    pairs = vl_compo_rows()
    assert len(pairs) == 201
    for result, parts in pairs:
        values = {kind: float(parts[f"crepe::{kind}"]) for kind in ("atom", "swap", "negate")}
        assert crepe.type_mean(values) == pytest.approx(float(result["crepe"]), abs=1e-6)
