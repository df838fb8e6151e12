"""The trainer on a tiny manifest of PIL-drawn images with the tiny open_clip config."""

from __future__ import annotations

import csv
import math
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image, ImageDraw

from compo.batches import TrainingData, TrainingDataError, epoch_order, nearest_rows, paired_order
from compo.io import write_table
from compo.models import create_model, get_tokenizer, image_transform, load_model, open_clip
from compo.provenance import file_sha256
from compo.train import TrainingError, resume_dir, train

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
    assert list(rows[0]) == ["step", "epoch", "lr", "i2t", "t2i", "loss"]
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert [int(r["epoch"]) for r in rows] == [0, 0, 1, 1]  # 10 captions, batch 4: 2 steps per epoch
    assert all(abs(float(r["i2t"]) + float(r["t2i"]) - float(r["loss"])) < 1e-5 for r in rows)
    assert float(rows[0]["lr"]) == pytest.approx(1e-3)
    # 1 warm-up step of 4, then cosine: steps 1..3 are 0, 1/3, 2/3 of the way, 0.5 (1 + cos(pi x)) = 1, 0.75, 0.25
    assert [float(r["lr"]) for r in rows] == pytest.approx([1e-3, 1e-3, 0.75e-3, 0.25e-3])
    assert not resume_dir(out).exists()
    with open(out / "timings.csv") as handle:
        timings = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in timings] == [1, 2, 3, 4]
    assert all(0 <= float(r["data_seconds"]) <= float(r["seconds"]) for r in timings)

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


@pytest.mark.parametrize("hard_images", [None, 3, "random"])
def test_resumed_run_equals_uninterrupted_run(data, tmp_path, hard_images):
    """Also with NegCLIP's hard images: the resumed run finds the same neighbours (from the base, not the
    saved state) and draws the same images."""
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]), settings=SETTINGS)
    recipe = {**_method_recipe(steps=4), **({"hard_images": hard_images} if hard_images else {})}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(recipe, out_dir=str(straight), **args)
    with pytest.raises(_Crash):
        train(recipe, out_dir=str(resumed), on_step=_crash_after(3), **args)
    assert (resume_dir(resumed) / "state.pt").exists() and not resumed.exists()  # no partial model folder
    train(recipe, out_dir=str(resumed), **args)  # continues from step 2
    assert not resume_dir(resumed).exists()

    a, b = _state(straight), _state(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    rows_a, rows_b = _losses(straight), _losses(resumed)
    assert rows_a == rows_b
    assert list(rows_a[0]) == ["step", "epoch", "lr", "i2t", "t2i", "stat_negatives", "loss"]


def test_resume_state_of_another_seed_is_set_aside_and_the_run_starts_over(data, tmp_path, caplog):
    args = dict(manifest=str(data["manifest"]), init_dir=str(data["base"]), negatives=str(data["negatives"]),
                settings=SETTINGS)
    with pytest.raises(_Crash):
        train(_method_recipe(steps=4), seed=1, out_dir=str(tmp_path / "run"), on_step=_crash_after(2), **args)
    with caplog.at_level("WARNING", logger="compo.train"):
        train(_method_recipe(steps=4), seed=2, out_dir=str(tmp_path / "run"), **args)
    assert "saved by a run with other seed; starting over from step 0" in caplog.text
    train(_method_recipe(steps=4), seed=2, out_dir=str(tmp_path / "fresh"), **args)
    a, b = _state(tmp_path / "run"), _state(tmp_path / "fresh")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert _losses(tmp_path / "run") == _losses(tmp_path / "fresh")


def test_a_manifest_changed_at_the_same_path_starts_over(data, tmp_path, caplog, write_manifest):
    frame = pd.read_parquet(data["manifest"])[["image_id", "image_path", "caption_id", "caption", "dataset"]]
    manifest = write_manifest(frame.to_dict("records"), tmp_path / "manifest.parquet")
    args = dict(manifest=str(manifest), init_dir=str(data["base"]), negatives=str(data["negatives"]),
                settings=SETTINGS, seed=1)
    with pytest.raises(_Crash):
        train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), on_step=_crash_after(2), **args)
    frame["caption"] = frame["caption"].str.replace("on white", "on a white table")
    write_manifest(frame.to_dict("records"), manifest)  # new contents, same path
    with caplog.at_level("WARNING", logger="compo.train"):
        train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), **args)
    assert "saved by a run with other inputs.manifest; starting over from step 0" in caplog.text
    train(_method_recipe(steps=4), out_dir=str(tmp_path / "fresh"), **args)
    assert _losses(tmp_path / "run") == _losses(tmp_path / "fresh")
    assert [int(r["step"]) for r in _losses(tmp_path / "run")] == [1, 2, 3, 4]


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


def _negatives_data(data, k: int, recipe: dict | None = None, path: Path | None = None) -> TrainingData:
    model = create_model(MODEL, "scratch", 0)
    return TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model), frozenset({"negatives"}),
                        negatives=path or data["negatives"], k=k, recipe=recipe)


def test_a_caption_with_more_negatives_than_k_draws_k_afresh_each_step(data):
    # c0 has two usable negatives (slots 0 and 2); with k=1 NegCLIP loads one of them each time
    training = _negatives_data(data, k=1)
    tokenizer = get_tokenizer(MODEL)
    options = {tuple(tokenizer([text])[0].tolist()) for text in ("a blue circle on white", "white on a red circle")}
    drawn = [tuple(training.batch([0, 5], step)["negatives"][0, 0].tolist()) for step in range(40)]
    assert set(drawn) == options  # both, over the steps
    # the draw is a function of (seed, step, manifest row) only: not of the batch's other captions
    assert all(torch.equal(training.batch([0, 5], step)["negatives"][0], training.batch([0, 3, 7], step)
                           ["negatives"][0]) for step in range(10))
    assert torch.equal(training.batch([0], 3)["negatives"], _negatives_data(data, k=1).batch([0], 3)["negatives"])


def test_negatives_proven_true_of_their_image_are_dropped_when_the_recipe_says_so(data, tmp_path, caplog):
    table = pd.read_parquet(data["negatives"])
    table.loc[(table["caption_id"] == "c0") & (table["slot"] == 0), "truth"] = "true"  # c0 keeps slot 2 only
    table.loc[(table["caption_id"] == "c3") & (table["slot"] == 2), "truth"] = "true"  # c3 keeps none
    path = tmp_path / "negatives.parquet"
    write_table(table, path, "negatives")
    kept = _negatives_data(data, k=2, recipe={"drop_true_negatives": False}, path=path)
    assert len(kept.negatives["c0"]) == 2 and "c3" in kept.negatives
    with caplog.at_level("INFO", logger="compo.batches"):
        dropped = _negatives_data(data, k=2, recipe={"drop_true_negatives": True}, path=path)
    assert [n.text for n in dropped.negatives["c0"]] == ["white on a red circle"]
    assert "c3" not in dropped.negatives
    assert "2 valid negatives dropped as true of their own image" in caplog.text
    assert dropped.batch([0, 3])["negative_mask"].tolist() == [[True, False], [False, False]]


def test_data_order_depends_only_on_seed_and_epoch():
    assert torch.equal(epoch_order(10, 0, 1), epoch_order(10, 0, 1))
    assert not torch.equal(epoch_order(10, 0, 1), epoch_order(10, 0, 2))
    assert not torch.equal(epoch_order(10, 0, 1), epoch_order(10, 1, 1))
    assert sorted(epoch_order(10, 5, 0).tolist()) == list(range(10))


@pytest.mark.parametrize("batch_size", [4, 5, 8])
def test_binding_twins_share_a_batch_and_every_row_is_seen_once(batch_size):
    n = 41
    partners = np.full(n, -1)
    for a, b in [(0, 1), (5, 30), (7, 8), (12, 40), (20, 21), (33, 2)]:
        partners[a], partners[b] = b, a
    for epoch in range(20):
        order = epoch_order(n, 3, epoch)
        rows = paired_order(order, partners, batch_size)
        assert sorted(rows) == list(range(n))
        batches = [set(rows[i:i + batch_size]) for i in range(0, n - n % batch_size, batch_size)]
        for batch in batches:
            assert all(partners[r] in batch for r in batch if partners[r] >= 0)
    # without pairs the order is the permutation itself
    assert paired_order(epoch_order(n, 3, 0), np.full(n, -1), 4) == epoch_order(n, 3, 0).tolist()


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


def test_an_image_past_pils_pixel_limit_names_file_caption_and_limit(data, tmp_path, write_manifest, monkeypatch):
    """PIL's DecompressionBombError named no item; the limit is lowered so a 2,000 px square passes it."""
    from PIL import Image

    large = tmp_path / "large.png"
    Image.new("RGB", (2000, 2000), "red").save(large)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)
    manifest = _broken_manifest(data, tmp_path, large, write_manifest)
    with pytest.raises(TrainingDataError, match=r"caption_id 'c5'.*image .*large\.png has more pixels than PIL's "
                                                r"decompression limit \(2 x Image.MAX_IMAGE_PIXELS = 2,000,000\)"):
        train(_base_recipe(), str(manifest), str(tmp_path / "out"), seed=0, settings=SETTINGS)


def test_same_seed_and_inputs_give_byte_identical_checkpoint_and_losses(data, tmp_path):
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]), settings=SETTINGS)
    train(_method_recipe(steps=3), out_dir=str(tmp_path / "a"), **args)
    train(_method_recipe(steps=3), out_dir=str(tmp_path / "b"), **args)
    for name in ("checkpoint.pt", "losses.csv", "model.json", "config.yaml"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # torch.save's zip names its root folder after the file it writes to: not after a temporary name
    with zipfile.ZipFile(tmp_path / "a" / "checkpoint.pt") as archive:
        assert {name.split("/")[0] for name in archive.namelist()} == {"archive"}


def test_dataloader_workers_build_the_same_batches(data, tmp_path):
    """Batches built in 2 worker processes (decoding, tokenising, caching images there) train exactly
    what the main process builds: the same weights, the same losses.csv bytes."""
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]))
    train(_method_recipe(steps=5), out_dir=str(tmp_path / "main"), settings={**SETTINGS, "workers": 0}, **args)
    train(_method_recipe(steps=5), out_dir=str(tmp_path / "workers"), settings={**SETTINGS, "workers": 2}, **args)
    for name in ("checkpoint.pt", "losses.csv"):
        assert (tmp_path / "main" / name).read_bytes() == (tmp_path / "workers" / name).read_bytes(), name


def test_the_image_cache_returns_the_decoded_transformed_image(data):
    model = create_model(MODEL, "scratch", 0)
    cached = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model), cache_bytes=1 << 20)
    plain = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model))
    for _ in range(2):  # the second pass reads the cache
        assert torch.equal(cached.batch([0, 3, 9])["images"], plain.batch([0, 3, 9])["images"])
    # 3 images of 3 x 64 x 64 float32 (49,152 bytes each) fit in the budget; none is cached without one
    assert len(cached._cache) == 3 and cached._cached_bytes == 3 * 3 * 64 * 64 * 4 and not plain._cache
    small = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model), cache_bytes=100_000)
    small.batch([0, 1, 2])
    assert len(small._cache) == 2  # the budget holds two: the third is decoded, not kept


def test_grad_checkpointing_recomputes_the_same_step(data, tmp_path):
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]))
    train(_method_recipe(steps=2), out_dir=str(tmp_path / "plain"), settings=SETTINGS, **args)
    train(_method_recipe(steps=2), out_dir=str(tmp_path / "ckpt"), settings={**SETTINGS, "grad_checkpointing": True},
          **args)
    a, b = _state(tmp_path / "plain"), _state(tmp_path / "ckpt")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert _losses(tmp_path / "plain") == _losses(tmp_path / "ckpt")


def test_channels_last_changes_the_layout_not_what_is_learned(data, tmp_path):
    """NHWC convolution weights take other oneDNN kernels: the same step up to float rounding, and an
    exported checkpoint loads into a plain (contiguous) open_clip model."""
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]))
    recipe = _method_recipe(steps=2)
    for layout in ("nchw", "nhwc"):
        train(recipe, out_dir=str(tmp_path / layout),
              settings={**SETTINGS, "channels_last": layout == "nhwc"}, **args)
    nchw, nhwc = _state(tmp_path / "nchw"), _state(tmp_path / "nhwc")
    convolutions = [name for name, weight in nhwc.items() if weight.ndim == 4]
    assert convolutions and all(nhwc[name].is_contiguous(memory_format=torch.channels_last) for name in convolutions)
    assert not all(nchw[name].is_contiguous(memory_format=torch.channels_last) for name in convolutions)  # 1x1: both
    assert any(not torch.equal(nchw[name], nhwc[name]) for name in convolutions)  # other kernels ran
    # Adam moves a weight by about lr a step whatever the gradient's size, so a near-zero gradient whose
    # rounding differs can move it the other way: the runs stay within 2 lr per step of each other
    bound = 2 * recipe["train"]["lr"] * recipe["train"]["steps"]
    assert all((nchw[name] - nhwc[name]).abs().max() <= bound for name in nchw)
    for a, b in zip(_losses(tmp_path / "nchw"), _losses(tmp_path / "nhwc"), strict=True):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-4)
    loaded = load_model(tmp_path / "nhwc")
    assert torch.equal(loaded.model.state_dict()["visual.conv1.weight"], nhwc["visual.conv1.weight"])


@pytest.mark.parametrize("precision", ["amp_bf16", "amp"])
def test_mixed_precision_trains_float32_weights_close_to_fp32(data, tmp_path, precision):
    """bf16 autocast; amp = float16 autocast with open_clip's gradient scaler (on the CPU here, the same
    code path as on a GPU). Losses within half-precision rounding of fp32's; weights stay float32.
    On a ViT base: the ResNet towers' stem gradients (~15 at loss scale 1) overflow float16 at open_clip's
    initial scale 2**16 until the scaler has halved it about five times, skipping every step of a short run."""
    base = tmp_path / "vit-base"
    train({**_base_recipe(steps=0), "model": "compo-tiny-vit-clip"}, None, str(base), seed=0, settings=SETTINGS)
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]), init_dir=str(base))
    train(_method_recipe(steps=3), out_dir=str(tmp_path / "fp32"), settings=SETTINGS, **args)
    with pytest.raises(_Crash):  # the scaler's state is resumed with the rest
        train(_method_recipe(steps=3), out_dir=str(tmp_path / "mixed"), on_step=_crash_after(2),
              settings={**SETTINGS, "precision": precision}, **args)
    state = torch.load(resume_dir(tmp_path / "mixed") / "state.pt", weights_only=True)
    assert bool(state["scaler"]) == (precision == "amp")
    train(_method_recipe(steps=3), out_dir=str(tmp_path / "mixed"), settings={**SETTINGS, "precision": precision},
          **args)
    reference, mixed = _losses(tmp_path / "fp32"), _losses(tmp_path / "mixed")
    for row, expected in zip(mixed, reference, strict=True):
        assert float(row["loss"]) == pytest.approx(float(expected["loss"]), rel=0.03)
    weights = _state(tmp_path / "mixed")
    assert all(t.dtype == torch.float32 for t in weights.values() if t.is_floating_point())
    assert not torch.equal(weights["text_projection"], _state(base)["text_projection"])


@pytest.mark.parametrize(("own", "machine", "scaler"), [("amp", "fp32", True), ("amp_bf16", "amp", False)])
def test_a_methods_own_precision_wins_over_the_studys(data, tmp_path, own, machine, scaler):
    """methods.<m>.train.precision (C2LIP's bf16) reaches the trainer over train.precision: the run's saved
    identity holds it and amp's gradient scaler is there exactly when the method's precision is amp."""
    recipe = _method_recipe(steps=3)
    recipe["train"]["precision"] = own
    with pytest.raises(_Crash):
        train(recipe, str(data["manifest"]), str(tmp_path / "run"), seed=1, negatives=str(data["negatives"]),
              init_dir=str(data["base"]), settings={**SETTINGS, "precision": machine}, on_step=_crash_after(2))
    state = torch.load(resume_dir(tmp_path / "run") / "state.pt", weights_only=False)
    assert state["identity"]["precision"] == own and bool(state["scaler"]) == scaler


def test_unknown_precision_and_setting_are_errors_naming_the_key(data, tmp_path):
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]), out_dir=str(tmp_path / "x"))
    with pytest.raises(ValueError, match="train.precision: 'fp16' is not a precision"):
        train(_method_recipe(), settings={**SETTINGS, "precision": "fp16"}, **args)
    own = _method_recipe()
    own["train"]["precision"] = "bf16"
    with pytest.raises(ValueError, match=r"methods\.negclip\.train\.precision: 'bf16' is not a precision"):
        train(own, settings=SETTINGS, **args)
    with pytest.raises(TrainingError, match="train.prefetch: unknown setting"):
        train(_method_recipe(), settings={**SETTINGS, "prefetch": 4}, **args)
    with pytest.raises(ValueError, match="train.shapes: 'fixed' is not a shapes setting"):
        train(_method_recipe(), settings={**SETTINGS, "shapes": "fixed"}, **args)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("hard_images", [False, True])
def test_static_shapes_train_what_dynamic_shapes_train(data, tmp_path, hard_images):
    """train.shapes static (a GPU's default: one text pass per batch, its token ids cut to a multiple of 16 in the
    DataLoader, every negative slot encoded and masked) learns what dynamic (the CPU's) learns, to float rounding."""
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]))
    recipe = {**_method_recipe(steps=3), **({"hard_images": "random"} if hard_images else {})}
    for shapes in ("dynamic", "static"):
        train(recipe, out_dir=str(tmp_path / shapes), settings={**SETTINGS, "shapes": shapes, "workers": 1}, **args)
    dynamic, static = _state(tmp_path / "dynamic"), _state(tmp_path / "static")
    bound = 2 * recipe["train"]["lr"] * recipe["train"]["steps"]  # Adam: see the channels_last test
    assert all((dynamic[name] - static[name]).abs().max() <= bound for name in dynamic)
    assert any(not torch.equal(dynamic[name], static[name]) for name in dynamic)  # another path ran
    for a, b in zip(_losses(tmp_path / "dynamic"), _losses(tmp_path / "static"), strict=True):
        assert a.keys() == b.keys()
        for column in a:
            assert float(a[column]) == pytest.approx(float(b[column]), rel=1e-4, abs=1e-6), column


def test_a_loss_that_is_not_finite_stops_the_run_naming_the_step_and_its_terms(data, tmp_path, monkeypatch):
    from compo.losses.clip import NegCLIPLoss

    forward, calls = NegCLIPLoss.forward, []

    def diverging(self, model, batch):
        terms = forward(self, model, batch)
        calls.append(1)
        return {**terms, "loss": terms["loss"] * (math.inf if len(calls) == 2 else 1)}

    monkeypatch.setattr(NegCLIPLoss, "forward", diverging)
    out = tmp_path / "diverged"
    with pytest.raises(TrainingError, match=r"step 2: loss is not finite \(i2t=.*, loss=inf\)"):
        train(_method_recipe(steps=3), manifest=str(data["manifest"]), out_dir=str(out), seed=1,
              negatives=str(data["negatives"]), init_dir=str(data["base"]), settings=SETTINGS)
    assert not out.exists() and not (resume_dir(out) / "state.pt").exists()  # nothing recorded after step 1


def test_fused_adamw_takes_the_foreach_step_to_float_rounding():
    """The fused AdamW a GPU run uses (compo.devices.fused_optimizer) against the CPU's foreach update, both
    on the CPU: the same weights after several steps, to float32 rounding."""
    from compo.train import build_optimizer

    hp = {"lr": 1e-3, "weight_decay": 0.1}
    models = [create_model(MODEL, "scratch", 0) for _ in range(2)]
    optimizers = [build_optimizer(m.named_parameters(), hp, fused=fused)
                  for m, fused in zip(models, (False, True), strict=True)]
    assert optimizers[0].defaults["foreach"] and not optimizers[0].defaults["fused"]
    assert optimizers[1].defaults["fused"]
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        grads = {n: torch.randn(p.shape, generator=generator) for n, p in models[0].named_parameters()}
        for model, optimizer in zip(models, optimizers, strict=True):
            for name, parameter in model.named_parameters():
                parameter.grad = grads[name].clone()
            optimizer.step()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_compiled_training_takes_the_eager_steps(data, tmp_path):
    """train.compile: torch.compile of the loss with the model (inductor, here on the CPU) trains what eager does."""
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]))
    recipe = _method_recipe(steps=2)
    for name, compiled in (("eager", False), ("compiled", True)):
        train(recipe, out_dir=str(tmp_path / name), settings={**SETTINGS, "shapes": "static", "compile": compiled},
              **args)
    for a, b in zip(_losses(tmp_path / "eager"), _losses(tmp_path / "compiled"), strict=True):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-4)
    eager, compiled = _state(tmp_path / "eager"), _state(tmp_path / "compiled")
    bound = 2 * recipe["train"]["lr"] * recipe["train"]["steps"]
    assert all((eager[name] - compiled[name]).abs().max() <= bound for name in eager)


# --- NegCLIP's hard images (compo.batches.hard_images) ----------------------------------------------------

def test_nearest_rows_known_answer_across_chunks():
    embeddings = torch.nn.functional.normalize(
        torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [-1.0, 0.0]]), dim=1)
    # worked by hand from the dot products; an image is never its own neighbour, also in the second chunk
    assert nearest_rows(embeddings, 2, chunk=2).tolist() == [[1, 3], [0, 3], [3, 1], [2, 1], [2, 3]]


def _hard_image_data(data, tmp_path: Path, write_manifest, setting: int | str) -> tuple[TrainingData, torch.nn.Module]:
    """The tiny manifest plus a second caption of img0 (c10), with one negative per caption and step."""
    frame = pd.read_parquet(data["manifest"])
    extra = {**frame.iloc[0].to_dict(), "caption_id": "c10", "caption": "a second caption of the first image"}
    manifest = write_manifest([*frame.to_dict("records"), extra], tmp_path / "manifest.parquet")
    model = create_model(MODEL, "scratch", 0).eval()
    training = TrainingData(manifest, get_tokenizer(MODEL), image_transform(model),
                            frozenset({"negatives", "hard_images"}), negatives=data["negatives"], k=1,
                            recipe={"hard_images": setting}, seed=0)
    return training, model


def _hard_rows(batch: dict[str, torch.Tensor], drawn: int) -> dict[str, torch.Tensor]:
    """The rows hard_images appends after the `drawn` captions' rows, by batch key."""
    return {key: batch[key][drawn:] for key in ("images", "texts", "negatives", "negative_mask") if key in batch}


def _row_of(training: TrainingData, images: torch.Tensor) -> list[str]:
    """The image path of each [3, H, W] tensor in `images` (the tiny images are all distinct)."""
    paths = training.image_paths()
    stacked = torch.stack([training.image(p, "test") for p in paths])
    return [paths[int((stacked - image).abs().flatten(1).sum(1).argmin())] for image in images]


def test_hard_images_are_nearest_neighbours_with_a_caption_of_theirs_and_its_negative(data, tmp_path, write_manifest):
    training, model = _hard_image_data(data, tmp_path, write_manifest, 3)
    with pytest.raises(TrainingDataError, match="find_image_neighbours"):
        training.batch([0, 1])
    training.find_image_neighbours(model.encode_image, 3)
    paths = training.image_paths()
    with torch.no_grad():
        embedded = torch.nn.functional.normalize(
            model.encode_image(torch.stack([training.image(p, "test") for p in paths])), dim=1)
    similarity = embedded @ embedded.T
    for i, path in enumerate(paths):  # the 3 neighbours: other images, none less similar than a non-neighbour
        chosen = [paths.index(p) for p in training.image_neighbours[path]]
        others = [j for j in range(len(paths)) if j != i and j not in chosen]
        assert len(set(chosen)) == 3 and i not in chosen
        assert similarity[i, chosen].min() >= similarity[i, others].max()
    tokenizer = get_tokenizer(MODEL)
    captions = training.rows.groupby("image_path")["caption"].apply(list).to_dict()
    negatives = pd.read_parquet(data["negatives"])
    for step in range(6):
        batch = training.batch([0, 3, 5, 10], step)
        assert batch["images"].shape == (8, 3, 64, 64) and batch["texts"].shape == (8, 77)
        assert batch["negatives"].shape[0] == batch["negative_mask"].shape[0] == 8
        hard = _hard_rows(batch, 4)
        for position, (row, image) in enumerate(zip([0, 3, 5, 10], _row_of(training, hard["images"]), strict=True)):
            assert image in training.image_neighbours[training.rows.at[row, "image_path"]]
            texts = [tuple(tokenizer([c])[0].tolist()) for c in captions[image]]
            assert tuple(hard["texts"][position].tolist()) in texts
            caption = next(c for c in captions[image]
                           if tuple(tokenizer([c])[0].tolist()) == tuple(hard["texts"][position].tolist()))
            caption_id = training.rows.loc[training.rows["caption"] == caption, "caption_id"].iloc[0]
            valid = negatives[(negatives["caption_id"] == caption_id) & negatives["valid"]]["negative"].tolist()
            assert bool(hard["negative_mask"][position, 0]) == bool(valid)
            if valid:
                assert tuple(hard["negatives"][position, 0].tolist()) in {
                    tuple(tokenizer([v])[0].tolist()) for v in valid}
        # a caption's draw depends on (seed, step, row) only, not on the batch's other captions
        again = _hard_rows(training.batch([5, 7], step), 2)
        assert torch.equal(again["images"][0], hard["images"][2])
        assert torch.equal(again["texts"][0], hard["texts"][2])


def test_nearest_image_search_is_gradient_free_and_the_same_with_decoding_workers(data, tmp_path, write_manifest):
    training, model = _hard_image_data(data, tmp_path, write_manifest, 3)
    grad_enabled = []

    def encode(images: torch.Tensor) -> torch.Tensor:
        grad_enabled.append(torch.is_grad_enabled())
        return model.encode_image(images)

    training.find_image_neighbours(encode, 3, batch_size=4)
    in_process = training.image_neighbours
    training.find_image_neighbours(encode, 3, batch_size=4, workers=2)
    assert training.image_neighbours == in_process
    # autograd off (the method's no_grad): a graph per chunk would keep every image's activations alive
    assert len(grad_enabled) == 2 * math.ceil(len(training.image_paths()) / 4) and not any(grad_enabled)


def test_random_hard_images_are_any_other_image_and_any_of_its_captions(data, tmp_path, write_manifest):
    training, _ = _hard_image_data(data, tmp_path, write_manifest, "random")
    own = training.rows.at[0, "image_path"]
    drawn = [image for step in range(150)
             for image in _row_of(training, _hard_rows(training.batch([0, 10], step), 2)["images"])]
    assert own not in drawn  # rows 0 and 10 share img0: neither draws it
    assert set(drawn) == set(training.image_paths()) - {own}  # every other image, over the steps
    texts_with_img0 = set()
    for step in range(200):
        hard = _hard_rows(training.batch([1, 2, 3], step), 3)
        texts_with_img0 |= {tuple(text.tolist()) for text, image in
                            zip(hard["texts"], _row_of(training, hard["images"]), strict=True) if image == own}
    assert len(texts_with_img0) == 2  # img0 comes with either of its two captions


def test_live_metrics_hold_the_steps_done_while_the_run_goes(data, tmp_path):
    """issue 44: losses.csv and the TensorBoard events grow during training (read from inside the run), and a
    resumed run's live files hold exactly its rows (no step twice)."""
    from helpers import read_scalars

    from compo.monitor import LIVE_LOSSES

    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]), settings=SETTINGS)
    live, seen = tmp_path / "live", {}

    def peek(step: int) -> None:
        if step == 2:
            seen["scalars"] = read_scalars(live)
            seen["rows"] = _losses_file(live / LIVE_LOSSES)
        if step == 3 and "crashed" not in seen:
            seen["crashed"] = True
            raise _Crash("after step 3")

    with pytest.raises(_Crash):
        train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), on_step=peek, live=str(live), **args)
    assert [step for step, _ in seen["scalars"]["train/loss"]] == [1, 2]
    assert {"train/lr", "train/i2t", "train/stat_negatives", "train/samples_per_s", "train/logit_scale"} \
        <= set(seen["scalars"])
    assert [row["step"] for row in seen["rows"]] == ["1", "2"]
    train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), on_step=peek, live=str(live), **args)
    # the resumed run (from the state after step 2) rewrote the live table: the model folder's rows, once each
    assert _losses_file(live / LIVE_LOSSES) == _losses(tmp_path / "run")
    assert [step for step, _ in read_scalars(live)["train/loss"]] == [1, 2, 3, 4]


def test_weights_and_biases_writes_an_offline_run_and_sends_nothing(data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]), settings={**SETTINGS, "report_to": ["wandb"]})
    train(_method_recipe(steps=2), out_dir=str(tmp_path / "run"), live=str(tmp_path / "live"), **args)
    runs = list((tmp_path / "live" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert not (tmp_path / "live" / "tensorboard").exists()


def test_an_unknown_reporter_is_an_error_naming_the_key(data, tmp_path):
    with pytest.raises(ValueError, match="train.report_to: 'mlflow'"):
        train(_method_recipe(steps=2), manifest=str(data["manifest"]), seed=1, out_dir=str(tmp_path / "run"),
              negatives=str(data["negatives"]), init_dir=str(data["base"]),
              settings={**SETTINGS, "report_to": ["mlflow"]})


def _losses_file(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_resume_state_damaged_after_it_was_saved_is_set_aside(data, tmp_path, caplog):
    """A corrupted resume state was resumed silently (the final checkpoint differed from an uninterrupted run's and
    its hash was recorded as sound): its bytes are checked against the sha256 saved with it, and a damaged one is
    set aside, the run starting over and ending as an uninterrupted one."""
    args = dict(manifest=str(data["manifest"]), init_dir=str(data["base"]), negatives=str(data["negatives"]),
                settings=SETTINGS, seed=1)
    with pytest.raises(_Crash):
        train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), on_step=_crash_after(2), **args)
    state = resume_dir(tmp_path / "run") / "state.pt"
    assert (state.parent / "state.sha256").read_text().strip() == file_sha256(state)
    damaged = bytearray(state.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01  # one bit inside a tensor: still a loadable state
    state.write_bytes(bytes(damaged))
    with caplog.at_level("WARNING", logger="compo.train"):
        train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), **args)
    assert "state.pt: its bytes are not those saved (state.sha256 records another)" in caplog.text
    train(_method_recipe(steps=4), out_dir=str(tmp_path / "fresh"), **args)
    a, b = _state(tmp_path / "run"), _state(tmp_path / "fresh")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_a_job_killed_between_placing_its_state_and_its_hash_resumes(data, tmp_path, monkeypatch, caplog):
    """A SLURM requeue under load (CI) killed a job after its first state.pt was in place and before its hash
    was: the sound state was disowned and the job started over. It resumes, and ends as an uninterrupted run."""
    import os

    args = dict(manifest=str(data["manifest"]), init_dir=str(data["base"]), negatives=str(data["negatives"]),
                settings=SETTINGS, seed=1)
    replace = os.replace

    def killed_after_the_state(src, dst):
        replace(src, dst)
        if Path(dst).name == "state.pt":
            raise _Crash("killed between the state's rename and its hash's")

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", killed_after_the_state)
        with pytest.raises(_Crash):
            train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), **args)
    folder = resume_dir(tmp_path / "run")
    assert not (folder / "state.sha256").exists() and (folder / "state.sha256.next").exists()
    with caplog.at_level("INFO", logger="compo.train"):
        train(_method_recipe(steps=4), out_dir=str(tmp_path / "run"), **args)
    assert "resuming" in caplog.text and "from step 2" in caplog.text and "not those saved" not in caplog.text
    train(_method_recipe(steps=4), out_dir=str(tmp_path / "fresh"), **args)
    a, b = _state(tmp_path / "run"), _state(tmp_path / "fresh")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_the_train_settings_and_the_schemas_train_block_declare_the_same_keys_and_defaults():
    """`train:` is read by compo.train.Settings and checked by the config schema: one set of keys, and every default
    the schema states is the one the trainer applies (threads, checkpoint_every, log_every are required there)."""
    import dataclasses

    from compo.config import config_schema
    from compo.train import Settings

    block = config_schema()["properties"]["train"]
    fields = {f.name: f.default for f in dataclasses.fields(Settings)}
    assert set(block["properties"]) == set(fields)
    for key, schema in block["properties"].items():
        if "default" in schema:
            default = fields[key]
            assert (list(default) if isinstance(default, tuple) else default) == schema["default"], key
        else:
            assert key in block["required"], f"train.{key}: the schema states no default and does not require it"


# --- unreadable checkpoints and resume states ----------------------------------------------------------


BASE_RECIPE = {"model": "compo-tiny-clip", "init": "scratch", "dataset": "tiny",
               "train": {"steps": 4, "batch_size": 4, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}}


def test_a_corrupt_resume_state_is_set_aside_and_training_starts_over(tiny_training: dict, tmp_path: Path,
                                                                       caplog) -> None:
    from compo.train import resume_dir, train

    settings = {"threads": 1, "checkpoint_every": 2}
    out = tmp_path / "model"

    def crash(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(BASE_RECIPE, tiny_training["manifest"], str(out), seed=0, settings=settings, on_step=crash)
    state = resume_dir(out) / "state.pt"
    truncated = state.read_bytes()[:1000]
    state.write_bytes(truncated)
    with caplog.at_level("WARNING", logger="compo.train"):
        train(BASE_RECIPE, tiny_training["manifest"], str(out), seed=0, settings=settings)
    aside = sorted(out.parent.glob(f".{out.name}.resume.unreadable*"))
    assert len(aside) == 1 and (aside[0] / "state.pt").read_bytes() == truncated
    assert f"{state}: its bytes are not those saved" in caplog.text and f"set aside as {aside[0]}" in caplog.text, (
        caplog.text)
    assert "starting over from step 0" in caplog.text
    assert len(pd.read_csv(out / "losses.csv")) == 4
