"""ImageCoDe (compo.evaluate.imagecode, issue 47): the loader on the released files in ../shared/benchmarks (item
counts as its README states them), the frame ranking and its released tie rule on small fixtures, and an index of
other digits named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_real_benchmarks import REAL, needs_real, placeholders

from compo.evaluate import BenchmarkError, benchmark_files, imagecode, run_benchmark
from compo.models import encode_images, encode_texts

pytestmark = [needs_real,
              pytest.mark.usefixtures("one_thread")]


def test_imagecode_release_counts() -> None:
    items = imagecode.load_descriptions(REAL / "imagecode" / "valid_data.json")
    sets = {s for s, _, _ in items}
    static = [s for s, _, _ in items if imagecode.subset_of(s) == "static"]
    assert (len(sets), len(items)) == (1039, 2302)
    assert (len(static), len(set(static))) == (430, 155) and len(items) - len(static) == 1872
    assert benchmark_files("imagecode", "b", {}) == ["b/valid_data.json"]


def write_set(folder: Path, numbers: list[int], seeds: list[int]) -> None:
    folder.mkdir(parents=True)
    for number, seed in zip(numbers, seeds, strict=True):
        pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{number}.jpg", "PNG")  # a PNG under the release's name


@pytest.mark.parametrize("index", ["²", "٣", "３", "1²"])
def test_an_imagecode_index_of_other_digits_names_the_file_set_and_index(tmp_path: Path, index: str) -> None:
    """Issue 59: "²".isdigit() is true, so int() raised a bare ValueError; "٣" (Arabic-Indic) and "３" (full-width)
    were read as 3. Each is now an error naming the file, the set and the index."""
    path = tmp_path / "valid_data.json"
    path.write_text(json.dumps({"video-set": {"0": "a description", index: "another"}}, ensure_ascii=False),
                    encoding="utf-8")
    with pytest.raises(BenchmarkError, match=rf"{path}: set 'video-set': target index '{index}' is not 0-9 "
                                             r"\(ASCII digits\)"):
        imagecode.load_descriptions(path)


def test_imagecode_ranks_frames_by_number_and_breaks_ties_as_released(tmp_path: Path, loaded) -> None:
    frames = [3, 12, 100, 7, 45, 9, 2000, 31, 5, 64]  # numeric order differs from name order
    write_set(tmp_path / "images" / "open-images-1_a", list(range(10)), list(range(10)))
    write_set(tmp_path / "images" / "MSR-VTT-video1", frames, list(range(10, 20)))
    write_set(tmp_path / "images" / "open-images-2_b", list(range(10)), [99] * 10)  # ten equal images: all tie
    data = {"open-images-1_a": {"2": "a red ball on grass", "5": "two dogs"},
            "MSR-VTT-video1": {"4": "the man turns left"},
            "open-images-2_b": {"0": "a wall", "4": "a wall again"},
            "YouCook-absent": {"1": "oil in a pan"}}
    (tmp_path / "valid_data.json").write_text(json.dumps(data))
    result = run_benchmark(loaded, {"kind": "imagecode", "source": "files"}, tmp_path)
    assert result.skipped == {"missing_image": 1}
    rows = result.predictions.set_index("item")

    for image_set, target, text in (("open-images-1_a", 2, data["open-images-1_a"]["2"]),
                                    ("MSR-VTT-video1", 4, data["MSR-VTT-video1"]["4"])):
        names = sorted((p.name for p in (tmp_path / "images" / image_set).iterdir()), key=lambda n: int(n[3:-4]))
        v = encode_images(loaded, [Image.open(tmp_path / "images" / image_set / n).convert("RGB")
                                   for n in names]).double()
        scores = (v @ encode_texts(loaded, [text]).double()[0]).numpy()
        row = rows.loc[f"{image_set}/{target}"]
        assert row["score_pos"] == pytest.approx(scores[target], abs=1e-6)
        assert bool(row["correct"]) == (int(np.argmax(scores)) == target)
    assert names[:5] == ["img3.jpg", "img5.jpg", "img7.jpg", "img9.jpg", "img12.jpg"]  # by frame number, not name
    # all ten tie: the released argsort puts image 0 first, the strict rule counts every tie as wrong
    assert rows.loc["open-images-2_b/0", "rank"] == 10 and not rows.loc["open-images-2_b/0", "correct"]
    assert result.metrics["static"].n == 4 and result.metrics["videos"].n == 1
    static = rows[rows["subset"] == "static"]
    assert result.metrics["static_strict"].value == pytest.approx(static["correct"].mean())
    assert result.metrics["static"].value == pytest.approx((static["correct"].sum() + 1) / 4)  # + the tie at 0
    assert result.metrics["overall"].n == 5 and result.headline == "overall"

    (tmp_path / "images" / "MSR-VTT-video1" / "img3.jpg").unlink()
    with pytest.raises(BenchmarkError, match="MSR-VTT-video1: expected 10 images"):
        run_benchmark(loaded, {"kind": "imagecode", "source": "files"}, tmp_path)
    (tmp_path / "valid_data.json").write_text(json.dumps({"open-images-1_a": {"10": "x"}}))
    with pytest.raises(BenchmarkError, match="target index '10'"):
        run_benchmark(loaded, {"kind": "imagecode", "source": "files"}, tmp_path)


@pytest.mark.slow  # ~1,000 placeholder images encoded
def test_imagecode_runs_on_the_release(tmp_path: Path, loaded) -> None:
    """Images for every 10th set (all ten would take minutes here); the other sets' descriptions are skipped as
    missing, so scored + skipped is the release's 2,302, split as its videos and static subsets."""
    items = imagecode.load_descriptions(REAL / "imagecode" / "valid_data.json")
    sets = list(dict.fromkeys(s for s, _, _ in items))[::10]
    placeholders(tmp_path, {f"{s}/img{k}.jpg" for s in sets for k in range(10)})
    result = run_benchmark(loaded, {"kind": "imagecode", "source": "files", "image_root": str(tmp_path)},
                           REAL / "imagecode")
    scored = [(s, t) for s, t, _ in items if s in set(sets)]
    static = sum(imagecode.subset_of(s) == "static" for s, _ in scored)
    assert {k: result.metrics[k].n for k in ("overall", "videos", "static")} == {
        "overall": len(scored), "videos": len(scored) - static, "static": static}
    assert result.metrics["overall"].n + result.skipped["missing_image"] == 2302 and static > 0
    assert sorted(result.predictions["item"]) == sorted(f"{s}/{t}" for s, t in scored)
