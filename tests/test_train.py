"""The trainer on a tiny manifest of PIL-drawn images with the tiny open_clip config."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from PIL import Image, ImageDraw

from compo.batches import TrainingData, TrainingDataError, epoch_order
from compo.io import write_table
from compo.models import create_model, get_tokenizer, image_transform, open_clip
from compo.train import TrainingError, train

MODEL = "compo-tiny-clip"
SETTINGS = {"threads": 1, "checkpoint_every": 2, "log_every": 1}
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange"]
SHAPES = ["circle", "square"]


def _base_recipe(steps: int = 4) -> dict:
    return {"model": MODEL, "init": "scratch", "dataset": "tiny",
            "train": {"steps": steps, "batch_size": 4, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}}


def _method_recipe(steps: int = 3, k: int = 2) -> dict:
    return {"name": "negclip", "base": "clip", "loss": "negclip", "negatives": "swap", "k": k,
            "train": {"steps": steps, "batch_size": 4, "lr": 1e-4, "warmup": 1, "weight_decay": 0.1,
                      "grad_clip": 1.0}}


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    rows, negatives = [], []
    for i, (colour, shape) in enumerate([(c, s) for c in COLOURS for s in SHAPES][:10]):
        image = Image.new("RGB", (64, 64), "white")
        draw = ImageDraw.Draw(image)
        (draw.ellipse if shape == "circle" else draw.rectangle)([12 + i, 12, 50, 50 - i], fill=colour)
        path = root / f"img{i}.png"
        image.save(path)
        cid = f"c{i}"
        rows.append({"image_id": f"i{i}", "image_path": str(path), "caption_id": cid,
                     "caption": f"a {colour} {shape} on white", "dataset": "tiny"})
        other = COLOURS[(i + 1) % len(COLOURS)]
        # slot 0 valid for even captions; slot 1 invalid for every third; caption c9 has no valid slot
        for slot, text in enumerate([f"a {other} {shape} on white", f"a {shape} {colour} on white",
                                     f"white on a {colour} {shape}"]):
            valid = not (i == 9 or (slot == 0 and i % 2) or (slot == 1 and i % 3 == 0))
            negatives.append({"caption_id": cid, "slot": slot, "negative": text if valid else None,
                              "type": "swap", "keyword": None, "concreteness": None, "generator": "test",
                              "valid": valid, "reason": "ok" if valid else "no span", "truth": "unknown",
                              "negative_image": None})
    manifest = write_manifest(rows, root / "manifest.parquet")
    negatives_path = root / "negatives.parquet"
    write_table(pd.DataFrame(negatives), negatives_path, "negatives")
    # the base a method starts from: the scratch model exported as is
    base_dir = root / "base"
    train(_base_recipe(steps=0), None, str(base_dir), seed=0, settings=SETTINGS)
    return {"root": root, "manifest": manifest, "negatives": negatives_path, "base": base_dir}


def _losses(path: Path) -> list[dict[str, str]]:
    with open(path / "losses.csv") as handle:
        return list(csv.DictReader(handle))


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path / "checkpoint.pt", weights_only=True)


def test_base_training_outputs(data, tmp_path):
    out = tmp_path / "model"
    train(_base_recipe(), str(data["manifest"]), str(out), seed=3, settings=SETTINGS)
    rows = _losses(out)
    assert list(rows[0]) == ["step", "epoch", "lr", "i2t", "t2i", "loss", "seconds"]
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert [int(r["epoch"]) for r in rows] == [0, 0, 1, 1]  # 10 captions, batch 4: 2 steps per epoch
    assert all(abs(float(r["i2t"]) + float(r["t2i"]) - float(r["loss"])) < 1e-5 for r in rows)
    assert float(rows[0]["lr"]) == pytest.approx(1e-3)
    # 1 warm-up step of 4, then cosine: steps 1..3 are 0, 1/3, 2/3 of the way, 0.5 (1 + cos(pi x)) = 1, 0.75, 0.25
    assert [float(r["lr"]) for r in rows] == pytest.approx([1e-3, 1e-3, 0.75e-3, 0.25e-3])
    assert not (out / "_resume").exists()

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["recipe"] == _base_recipe() and config["seed"] == 3 and config["settings"] == SETTINGS
    assert config["inputs"] == {"manifest": str(data["manifest"]), "negatives": None, "init_dir": None,
                                "parse": None, "concreteness": None}
    assert config["model_name"] == MODEL and config["versions"]["compo-study"] != "unknown"

    # plain open_clip loads the checkpoint, and it holds trained (not initial) weights
    loaded = open_clip().create_model(MODEL, pretrained=str(out / "checkpoint.pt"))
    initial = create_model(MODEL, "scratch", 3)
    trained = _state(out)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, trained[name])
    assert not torch.equal(initial.state_dict()["text_projection"], trained["text_projection"])


def test_zero_steps_exports_the_initial_model(data):
    exported = _state(data["base"])
    for name, tensor in create_model(MODEL, "scratch", 0).state_dict().items():
        assert torch.equal(tensor, exported[name])
    assert _losses(data["base"]) == []


class _Crash(RuntimeError):
    pass


def _crash_after(n: int):
    def hook(step: int) -> None:
        if step == n:
            raise _Crash(f"simulated crash after step {n}")
    return hook


def test_resumed_run_equals_uninterrupted_run(data, tmp_path):
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]), settings=SETTINGS)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(_method_recipe(steps=4), out_dir=str(straight), **args)
    with pytest.raises(_Crash):
        train(_method_recipe(steps=4), out_dir=str(resumed), on_step=_crash_after(3), **args)
    assert (resumed / "_resume" / "state.pt").exists() and not (resumed / "checkpoint.pt").exists()
    train(_method_recipe(steps=4), out_dir=str(resumed), **args)  # continues from step 2
    assert not (resumed / "_resume").exists()

    a, b = _state(straight), _state(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    rows_a, rows_b = _losses(straight), _losses(resumed)
    for row in rows_a + rows_b:
        del row["seconds"]
    assert rows_a == rows_b
    assert list(rows_a[0]) == ["step", "epoch", "lr", "i2t", "t2i", "stat_negatives", "loss", "seconds"][:-1]


def test_resume_state_of_another_run_is_refused(data, tmp_path):
    args = dict(manifest=str(data["manifest"]), out_dir=str(tmp_path), init_dir=str(data["base"]),
                negatives=str(data["negatives"]), settings=SETTINGS)
    with pytest.raises(_Crash):
        train(_method_recipe(steps=4), seed=1, on_step=_crash_after(2), **args)
    with pytest.raises(TrainingError, match="saved by a different run"):
        train(_method_recipe(steps=4), seed=2, **args)


def test_negatives_attached_up_to_k_in_slot_order_and_masked(data):
    model = create_model(MODEL, "scratch", 0)
    tokenizer = get_tokenizer(MODEL)
    training = TrainingData(data["manifest"], tokenizer, image_transform(model), frozenset({"negatives"}),
                            negatives=data["negatives"], k=2)
    batch = training.batch([0, 1, 3, 9])
    assert batch["images"].shape == (4, 3, 64, 64) and batch["texts"].shape == (4, 77)
    # c0: slot 0 valid, slot 1 invalid, slot 2 valid -> first two valid in slot order: slots 0 and 2
    # c1: slots 1, 2; c3: slot 2 only; c9: none
    assert batch["negative_mask"].tolist() == [[True, True], [True, True], [True, False], [False, False]]
    assert torch.equal(batch["negatives"][0, 1], tokenizer(["white on a red circle"])[0])
    assert torch.equal(batch["negatives"][1, 0], tokenizer(["a square red on white"])[0])
    assert torch.all(batch["negatives"][3] == 0)


def test_data_order_depends_only_on_seed_and_epoch():
    assert torch.equal(epoch_order(10, 0, 1), epoch_order(10, 0, 1))
    assert not torch.equal(epoch_order(10, 0, 1), epoch_order(10, 0, 2))
    assert not torch.equal(epoch_order(10, 0, 1), epoch_order(10, 1, 1))
    assert sorted(epoch_order(10, 5, 0).tolist()) == list(range(10))


def test_negclip_needs_a_negatives_table(data, tmp_path):
    with pytest.raises(TrainingDataError, match="no negatives table"):
        train(_method_recipe(), str(data["manifest"]), str(tmp_path), seed=0, init_dir=str(data["base"]),
              settings=SETTINGS)


def _broken_manifest(data, tmp_path: Path, image_path: Path, write_manifest) -> Path:  # noqa: ANN001
    frame = pd.read_parquet(data["manifest"])[["image_id", "image_path", "caption_id", "caption", "dataset"]]
    frame.loc[5, "image_path"] = str(image_path)
    return write_manifest(frame, tmp_path / "manifest.parquet")


def test_missing_image_names_file_and_caption(data, tmp_path, write_manifest):
    manifest = _broken_manifest(data, tmp_path, tmp_path / "gone.png", write_manifest)
    with pytest.raises(TrainingDataError, match=r"caption_id 'c5'.*gone\.png not found"):
        train(_base_recipe(), str(manifest), str(tmp_path / "out"), seed=0, settings=SETTINGS)


def test_corrupt_image_names_file_and_caption(data, tmp_path, write_manifest):
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n not really an image")
    manifest = _broken_manifest(data, tmp_path, corrupt, write_manifest)
    with pytest.raises(TrainingDataError, match=r"caption_id 'c5'.*cannot read image .*corrupt\.png"):
        train(_base_recipe(), str(manifest), str(tmp_path / "out"), seed=0, settings=SETTINGS)
    assert not (tmp_path / "out" / "checkpoint.pt").exists()
