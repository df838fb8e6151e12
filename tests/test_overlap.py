"""The benchmark-image guard (compo.overlap, issue 46): COCO ids and content hashes, accepting a named overlap,
the CLI's stop before training, and the real Karpathy split lists against SugarCrepe's released files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from test_real_benchmarks import REAL, needs_real  # the released files, found as that module finds them

from compo.overlap import OverlapError, benchmark_images, check_overlap, coco_id, compare
from compo.report import write_report_tables


def _image(path: Path, colour: tuple[int, int, int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)
    return path


def test_coco_ids_from_both_namings() -> None:
    assert coco_id("data/coco/train2014/COCO_train2014_000000057870.jpg") == 57870
    assert coco_id("COCO_val2014_000000391895.jpg") == 391895
    assert coco_id("val2017/000000391895.jpg") == 391895  # 2017 names: the 2014 ids
    assert coco_id("images/sugarcrepe-0001.png") is None and coco_id("123456.jpg") is None


@pytest.fixture()
def fixture_study(tmp_path: Path, write_manifest) -> dict:
    """A training set of 4 images (one a COCO val2014 file, one a byte copy of a world-style benchmark image under
    another name) and a SugarCrepe-format benchmark of 3 images (the same COCO id by its 2017 name, the copy, a new
    one)."""
    train = tmp_path / "train"
    rows = []
    names = ["COCO_val2014_000000000042.jpg", "a.png", "b.png", "c.png"]
    for i, name in enumerate(names):
        _image(train / name, (40 * i, 10, 200 - 40 * i))
        rows.append({"image_id": str(i), "image_path": str(train / name), "caption_id": f"{i}-0",
                     "caption": "a photo", "dataset": "d"})
    manifest = write_manifest(rows, tmp_path / "manifest.parquet")
    bench = tmp_path / "sugarcrepe"
    shutil.copy(train / "b.png", _image(bench / "images" / "swap-0001.png", (0, 0, 0)))  # same bytes, new name
    _image(bench / "images" / "000000000042.jpg", (1, 2, 3))  # another file, the same COCO id
    _image(bench / "images" / "new.png", (9, 9, 9))
    files = {"replace_obj": ["000000000042.jpg", "swap-0001.png"], "swap_att": ["new.png", "swap-0001.png"]}
    for subset in ("replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att"):
        items = {str(k): {"filename": f, "caption": "c", "negative_caption": "n"}
                 for k, f in enumerate(files.get(subset, ["new.png"]))}
        (bench / f"{subset}.json").write_text(json.dumps(items))
    benchmarks = {"sugarcrepe": {"spec": {"kind": "sugarcrepe", "source": "files"}, "dir": str(bench)},
                  "imagenet": {"spec": {"kind": "zeroshot", "source": "files"}, "dir": str(tmp_path / "none")}}
    return {"manifest": manifest, "benchmarks": benchmarks, "out": tmp_path / "overlap" / "d.csv"}


def test_guard_finds_coco_ids_and_copies_and_stops(fixture_study: dict) -> None:
    with pytest.raises(OverlapError) as error:
        check_overlap("d", fixture_study["manifest"], fixture_study["benchmarks"], fixture_study["out"])
    message = str(error.value)
    assert "dataset d" in message and "sugarcrepe: 2 of its 3 images (1 by COCO id, 1 by content" in message
    assert "overlap: {accept: [{dataset: d, benchmark: sugarcrepe}]}" in message
    assert not fixture_study["out"].exists()  # no table: training cannot start


def test_an_accepted_overlap_is_written_and_reported(fixture_study: dict) -> None:
    accept = [{"dataset": "d", "benchmark": "sugarcrepe", "why": "the seed trained on it"}]
    check_overlap("d", fixture_study["manifest"], fixture_study["benchmarks"], fixture_study["out"], accept=accept)
    table = pd.read_csv(fixture_study["out"]).set_index("benchmark")
    row = table.loc["sugarcrepe"]
    assert (row["overlap"], row["by_coco_id"], row["by_content"], row["benchmark_images"]) == (2, 1, 1, 3)
    assert bool(row["accepted"]) and row["training_images"] == 4 and "swap-0001.png" in row["examples"]
    assert table.loc["imagenet", "overlap"] == 0 and "not compared" in table.loc["imagenet", "examples"]
    # the report's data page prints it
    (page,) = write_report_tables(fixture_study["out"].parent / "report", tables={"overlap": [fixture_study["out"]]})
    assert page.name == "d.html" and "<th>accepted</th>" in page.read_text() and "swap-0001.png" in page.read_text()
    # another pair accepted does not accept this one
    with pytest.raises(OverlapError):
        check_overlap("d", fixture_study["manifest"], fixture_study["benchmarks"], fixture_study["out"],
                      accept=[{"dataset": "other", "benchmark": "sugarcrepe"}])


@pytest.mark.slow  # a subprocess: imports torch and open_clip
def test_cli_exits_with_the_dataset_benchmark_and_count(fixture_study: dict, tmp_path: Path, repo: Path) -> None:
    command = [sys.executable, "-m", "compo", "overlap", "--name", "d", "--manifest", str(fixture_study["manifest"]),
               "--benchmarks", json.dumps(fixture_study["benchmarks"]), "--out", str(fixture_study["out"])]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(repo / "workflow"), "PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 1
    assert "compo overlap:" in done.stderr and "sugarcrepe: 2 of its 3 images" in done.stderr


@pytest.mark.slow
@needs_real
def test_real_karpathy_splits_against_sugarcrepe() -> None:
    """The released split lists (names only) against SugarCrepe's released files: train+restval holds 1,200 of
    its 1,560 val2017 images (all restval), Karpathy train (= train2014, DeGLA's split) none."""
    images = benchmark_images("sugarcrepe", {"kind": "sugarcrepe", "image_root": "val2017"}, REAL / "sugarcrepe")
    assert len(images) == 7511 and len(set(images)) == 1560
    train_restval = (REAL / "karpathy_coco" / "coco_train.txt").read_text().split()
    train = [name for name in train_restval if name.startswith("COCO_train2014_")]
    assert (len(train_restval), len(train)) == (113287, 82783)
    counts = {split: len(compare(names, images)[0]) for split, names in
              {"train+restval": train_restval, "train": train,
               "val": (REAL / "karpathy_coco" / "coco_val.txt").read_text().split(),
               "test": (REAL / "karpathy_coco" / "coco_test.txt").read_text().split()}.items()}
    assert counts == {"train+restval": 1200, "train": 0, "val": 177, "test": 183}


def test_the_worlds_new_kinds_list_existing_images(tmp_path: Path) -> None:
    """The world's What's Up, EqBen and COCO-Counterfactuals (config/config.yaml), as a study adding them reads."""
    from compo.world.benchmarks import _coco_counterfactuals, _eqben, _whatsup, world_benchmarks

    world = {"image_size": 32, "max_objects": 4, "ungrounded_rate": 0.35,
             "benchmarks": {"sugarcrepe_per_subset": 3, "whatsup_groups": 2, "eqben_items": 4,
                            "coco_counterfactuals_items": 4}}
    for write, kind in ((_whatsup, "whatsup"), (_eqben, "eqben"), (_coco_counterfactuals, "coco_counterfactuals")):
        write(world, 0, tmp_path / kind)
        images = benchmark_images(kind, world_benchmarks()[kind], tmp_path / kind)
        assert images and all(path.is_file() for path in images), kind
