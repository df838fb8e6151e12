"""Validation during training (issue 44 item 2): recipe keys train.val_every, val_holdout, val_benchmark."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers import read_scalars
from PIL import Image, ImageDraw

from compo.batches import StepSampler, TrainingData
from compo.config import validate_config
from compo.models import LoadedModel, create_model, get_tokenizer, image_transform
from compo.train import TrainingError, train
from compo.validation import VALIDATION_CSV, ValidationError, Validator, holdout_images, split_holdout, val_every

MODEL = "compo-tiny-clip"
SETTINGS = {"threads": 1, "checkpoint_every": 2, "log_every": 1}
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange"]
SHAPES = ["circle", "square"]
TEMPLATES = ["a photo of a {c} shape."]


def _draw(colour: str, shape: str, i: int, path: Path) -> Path:
    image = Image.new("RGB", (64, 64), "white")
    draw = ImageDraw.Draw(image)
    (draw.ellipse if shape == "circle" else draw.rectangle)([8 + i, 10, 54, 54 - i], fill=colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict:
    """12 images (the first three with a second caption) and a two-class ImageFolder zero-shot benchmark."""
    root = tmp_path_factory.mktemp("val")
    rows = []
    for i, (colour, shape) in enumerate([(c, s) for c in COLOURS for s in SHAPES]):
        path = _draw(colour, shape, i % 6, root / f"img{i}.png")
        for j, caption in enumerate([f"a {colour} {shape}", f"a {shape} coloured {colour}"][: 2 if i < 3 else 1]):
            rows.append({"image_id": f"i{i}", "image_path": str(path), "caption_id": f"c{i}-{j}",
                         "caption": caption, "dataset": "tiny"})
    manifest = write_manifest(rows, root / "manifest.parquet")
    bench = root / "zs"
    for shape in SHAPES:
        for i, colour in enumerate(COLOURS[:3]):
            _draw(colour, shape, i, bench / shape / f"{colour}.png")
    (bench / "classnames.json").write_text(json.dumps({s: s for s in SHAPES}))
    benchmark = {"name": "zs", "spec": {"kind": "zeroshot", "source": "files", "path": str(bench)},
                 "dir": str(bench), "templates": TEMPLATES}
    return {"manifest": manifest, "benchmark": benchmark, "rows": len(rows)}


def _recipe(steps: int = 5, every: int | str = 2, holdout: int = 3, benchmark: str | None = "zs") -> dict:
    hp = {"steps": steps, "batch_size": 4, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1,
          "val_every": every, "val_holdout": holdout}
    if benchmark:
        hp["val_benchmark"] = benchmark
    return {"model": MODEL, "init": "scratch", "dataset": "tiny", "train": hp}


def _run(data: dict, out: Path, recipe: dict, **kwargs) -> None:
    train(recipe, str(data["manifest"]), str(out / "model"), seed=0, settings=SETTINGS, live=str(out / "live"),
          val_benchmark=data["benchmark"], **kwargs)


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_validation_rows_at_the_expected_steps_in_csv_and_tensorboard(data, tmp_path):
    _run(data, tmp_path, _recipe(steps=5, every=2))
    rows = _csv(tmp_path / "live" / VALIDATION_CSV)
    assert [row["step"] for row in rows] == ["2", "4", "5"]  # every 2 steps, and after the last
    assert list(rows[0]) == ["step", "epoch", "i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5", "zs_top1"]
    for row in rows:
        values = [float(row[key]) for key in list(row)[2:]]
        assert all(0.0 <= value <= 1.0 for value in values), row
        assert float(row["i2t_r1"]) <= float(row["i2t_r5"]) and float(row["t2i_r1"]) <= float(row["t2i_r5"])
    # 3 held-out images: R@5 ranks among 3, so every image and caption is found
    assert float(rows[0]["i2t_r5"]) == 1.0 and float(rows[0]["t2i_r5"]) == 1.0
    scalars = read_scalars(tmp_path / "live")
    assert {"val/i2t_r1", "val/i2t_r5", "val/t2i_r1", "val/t2i_r5", "val/zs_top1"} <= set(scalars)
    assert [step for step, _ in scalars["val/zs_top1"]] == [2, 4, 5]
    assert [value for _, value in scalars["val/t2i_r1"]] == pytest.approx([float(r["t2i_r1"]) for r in rows])
    config = yaml.safe_load((tmp_path / "model" / "config.yaml").read_text())
    held = config["holdout"]
    assert held["images"] == 3 and held["training_captions"] + held["captions"] == data["rows"]


def test_validation_leaves_the_trajectory_byte_identical(data, tmp_path):
    """With the same holdout, validation on (every step, the zero-shot set too) or off trains the same weights."""
    _run(data, tmp_path / "on", _recipe(steps=4, every=1))
    _run(data, tmp_path / "off", _recipe(steps=4, every=0, benchmark=None))
    for name in ("checkpoint.pt", "losses.csv"):
        assert (tmp_path / "on" / "model" / name).read_bytes() == (tmp_path / "off" / "model" / name).read_bytes()
    assert not (tmp_path / "off" / "live" / VALIDATION_CSV).exists()
    assert len(_csv(tmp_path / "on" / "live" / VALIDATION_CSV)) == 4


def test_a_validation_restores_module_modes_and_the_random_state(data):
    model = create_model(MODEL)
    model.train()
    model.visual.eval()  # a frozen tower kept in eval mode (as a loss may): it stays so
    modes = {name: module.training for name, module in model.named_modules()}
    loaded = LoadedModel(model, MODEL, get_tokenizer(MODEL), image_transform(model))
    frame = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model)).rows
    validator = Validator(1, loaded, holdout_images(split_holdout(frame, 3, 0, "m")[1]), None, "m")
    before = torch.get_rng_state()
    row = validator(1, 0)
    assert torch.equal(torch.get_rng_state(), before)
    assert {name: module.training for name, module in model.named_modules()} == modes
    assert set(row) == {"step", "epoch", "i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5"}


def test_held_out_images_and_captions_are_never_in_a_batch(data):
    model = create_model(MODEL)
    full = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model))
    held = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model), holdout=3, seed=7)
    out_images = set(held.held_out["image_path"])
    assert len(out_images) == 3 and len(held) + len(held.held_out) == len(full)
    seen = set()
    for _, rows in StepSampler(len(held), 4, seed=7, start=0, stop=20):  # 5 epochs of the kept captions
        seen |= set(held.rows["caption_id"].iloc[rows])
    assert seen == set(full.rows["caption_id"]) - set(held.held_out["caption_id"])  # the others all train
    assert not out_images & set(held.rows["image_path"])  # every caption of a held-out image is out
    # the holdout depends on the seed only: the same images again, others under another seed
    again = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model), holdout=3, seed=7)
    assert set(again.held_out["image_path"]) == out_images
    others = [set(split_holdout(full.rows, 3, seed, "m")[1]["image_path"]) for seed in range(8)]
    assert any(other != out_images for other in others)


def test_resumed_run_keeps_one_validation_row_per_step(data, tmp_path):
    class Crash(RuntimeError):
        pass

    def crash_at_3(step: int) -> None:
        if step == 3:
            raise Crash

    with pytest.raises(Crash):  # validated at 1, 2, 3; the resume state saved at step 2
        _run(data, tmp_path, _recipe(steps=4, every=1, benchmark=None), on_step=crash_at_3)
    assert [row["step"] for row in _csv(tmp_path / "live" / VALIDATION_CSV)] == ["1", "2", "3"]
    _run(data, tmp_path, _recipe(steps=4, every=1, benchmark=None))
    assert [row["step"] for row in _csv(tmp_path / "live" / VALIDATION_CSV)] == ["1", "2", "3", "4"]
    assert [step for step, _ in read_scalars(tmp_path / "live")["val/i2t_r1"]] == [1, 2, 3, 4]


def test_val_every_epoch_and_bad_values():
    assert val_every({"val_every": "epoch"}, 7) == 7 and val_every({}, 7) == 0 and val_every({"val_every": 3}, 7) == 3
    with pytest.raises(ValidationError, match="train.val_every"):
        val_every({"val_every": "often"}, 7)


def test_a_holdout_too_small_or_too_large_names_the_key(data):
    model = create_model(MODEL)
    frame = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model)).rows
    for n in (1, 12):
        with pytest.raises(ValidationError, match="train.val_holdout"):
            split_holdout(frame, n, 0, "m")


def test_a_configured_validation_is_valid(config):
    good = copy.deepcopy(config)
    good["methods"]["clip-ft"]["train"].update(val_every="epoch", val_holdout=50, val_benchmark="zeroshot-shape")
    good["methods"]["negclip"]["train"] = {"val_every": 10, "val_benchmark": "sugarcrepe"}  # FSC-CLIP's choice
    validate_config(good)


def test_a_recipe_naming_another_benchmark_than_the_run_was_given_is_refused(data, tmp_path):
    with pytest.raises(TrainingError, match="train.val_benchmark names 'imagenet'"):
        _run(data, tmp_path, _recipe(steps=2, every=1, benchmark="imagenet"))
