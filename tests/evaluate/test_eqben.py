"""EqBen (compo.evaluate.eqben, issue 47): a fixture in the release's layout (tests/fixtures/raw), Winoground-style
scoring per subset checked by hand, and a repeated pair scored once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from benchmark_helpers import RAW, image_text_cosines

from compo.evaluate import BenchmarkError, benchmark_files, eqben, run_benchmark
from compo.images import open_image

pytestmark = pytest.mark.usefixtures("one_thread")


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
    s = np.stack([image_text_cosines(loaded, image, ["a black cat", "a white cat"]) for image in images],
                 axis=1)  # [c, i]
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
