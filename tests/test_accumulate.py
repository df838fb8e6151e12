"""Gradient accumulation (`compo.accumulate`, recipe `train.accum_freq`): the step of accum_freq micro-batches
is the big batch's step, for every family of loss (InfoNCE, NegCLIP, DeGLA with its EMA teacher, FSC-CLIP's
online hard negatives, SigLIP's sigmoid, C2LIP's phrases and XAC), and gradient checkpointing recomputes the
same gradients under autocast.

One step's comparison runs in float64 (model and images), so any difference beyond ~1e-12 is a wrong term,
not rounding. What stays equal only because it is deterministic: FSC-CLIP's online negatives are drawn per
caption from `caption_rng(seed, step, row)`, so a micro-batch draws its rows' negatives as the big batch
does; the towers have no dropout and no BatchNorm (a ResNet tower normalises each micro-batch by its own
statistics: close to, not equal to, the big batch, as under torchrun).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from helpers import perturb_teacher, tiny_training_data

from compo.accumulate import AccumulationError, accumulated_step, split_rows
from compo.batches import TrainingData, epoch_order
from compo.losses import TOTAL, get_loss, needs_of
from compo.models import get_tokenizer, image_transform, load_model, set_static_shapes
from compo.train import TrainingError, train

SEED = 0
BATCH = 8  # every caption of the tiny set: micro-batches of 4 and 2
SETTINGS = {"threads": 1, "checkpoint_every": 10, "log_every": 1}
HP = {"steps": 3, "batch_size": BATCH, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1, "grad_clip": None,
      "eps": 1e-3}  # eps 1e-3: Adam's update proportional to the gradient (a sharp weight check, test_distributed)
ONLINE = {"swap": {"generator": "negclip-swap", "k": 1, "kinds": ["noun_chunk", "noun", "adjective"]},
          "replace": {"generator": "wordnet-replace", "k": 1}}
CASES = {
    "clip-ft": {"name": "clip-ft", "base": "clip", "loss": "infonce", "train": HP},
    "negclip": {"name": "negclip", "base": "clip", "loss": "negclip", "negatives": "swap", "k": 2, "train": HP},
    # NegCLIP's extra hard-image rows: each micro-batch brings its own after its rows (another row order than
    # the big batch's [rows, hard rows]; the loss does not depend on the order)
    "negclip-hard-images": {"name": "negclip-hard-images", "base": "clip", "loss": "negclip", "negatives": "swap",
                            "k": 2, "hard_images": "random", "train": HP},
    "degla": {"name": "degla", "base": "clip", "loss": "degla", "negatives": "swap", "k": 2, "ema": 0.9,
              "weights": {"igc": 0.2, "tgc": 0.2, "distill": 0.05}, "train": HP},
    "fsc-clip": {"name": "fsc-clip", "base": "clip", "loss": "fsc-clip", "online_negatives": list(ONLINE),
                 "online_negative_specs": ONLINE, "k": 1, "weights": {"global": 0.5, "local": 0.2},
                 "focal_gamma": 2.0, "label_smoothing": 0.02, "train": HP},
    "siglip": {"name": "siglip", "base": "sigmoid", "loss": "siglip", "train": HP},
    "c2lip": {"name": "c2lip", "base": "sigmoid", "loss": "c2lip", "weights": {"npc": 1.0, "xac": 0.1}, "train": HP},
}
BASE_MODELS = {"clip": "compo-tiny-vit-clip", "sigmoid": "compo-tiny-vit-sigmoid"}


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict[str, str]:
    root = tmp_path_factory.mktemp("accumulate")
    found = tiny_training_data(root, write_manifest)
    for base, model in BASE_MODELS.items():
        recipe = {"model": model, "init": "scratch", "dataset": "tiny", "train": {**HP, "steps": 0}}
        train(recipe, None, str(root / f"base-{base}"), seed=SEED, settings=SETTINGS)
    return found


def _setup(data: dict[str, str], recipe: dict) -> tuple[torch.nn.Module, torch.nn.Module, TrainingData]:
    """The base model in float64 (train mode), the recipe's loss set up on it, and its training data."""
    loaded = load_model(Path(data["root"]) / f"base-{recipe['base']}")
    model = loaded.model.double().train()
    loss = get_loss(recipe["loss"]).build(recipe)
    loss.setup(model)
    perturb_teacher(loss)  # a teacher unlike the student, so distill has a gradient
    training = TrainingData(data["manifest"], get_tokenizer(loaded.model_name), image_transform(model),
                            needs_of(recipe), negatives=data["negatives"] if recipe.get("negatives")
                            else None, k=recipe.get("k"), recipe=recipe, seed=SEED, parse=data["parse"])
    return model, loss, training


def _double(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.double() if t.is_floating_point() else t for name, t in batch.items()}


def one_step(model: torch.nn.Module, loss: torch.nn.Module, training: TrainingData,
             parts: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The loss terms and parameter gradients of the first batch's step in `parts` micro-batches."""
    rows = epoch_order(len(training), SEED, 0)[:BATCH].tolist()
    micro = [_double(training.batch(part, step=0)) for part in split_rows(rows, parts)]
    model.zero_grad(set_to_none=True)
    terms = accumulated_step(lambda batch: loss(model, batch), micro, model, lambda total: total.backward(), TOTAL)
    return ({name: value.item() for name, value in terms.items()},
            {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})


# fsc-clip's online WordNet negatives load WordNet (~6 s on an idle core): slow-marked; degla is the fast seed case
@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name == "fsc-clip" else [])
                                  for name in CASES])
def test_accumulated_gradients_equal_the_big_batchs(data, name):
    """accum_freq 2 and 4 give the loss terms and every parameter gradient of the one batch of 8 (float64)."""
    model, loss, training = _setup(data, CASES[name])
    reference_terms, reference = one_step(model, loss, training, 1)
    assert len(reference) > 10 and reference_terms[TOTAL] > 0
    for parts in (2, 4):
        terms, grads = one_step(model, loss, training, parts)
        assert terms.keys() == reference_terms.keys()
        for term, value in reference_terms.items():
            assert terms[term] == pytest.approx(value, rel=1e-10, abs=1e-12), (parts, term)
        assert grads.keys() == reference.keys()
        for parameter, gradient in reference.items():  # none lost, none counted twice (e.g. the logit scale)
            torch.testing.assert_close(grads[parameter], gradient, rtol=1e-9, atol=1e-12,
                                       msg=lambda m, p=parameter, n=parts: f"{name} accum {n} {p}: {m}")


@pytest.mark.parametrize("name", ["negclip", "c2lip"])
def test_accumulation_with_static_shapes_equals_the_big_batch(data, name):
    """Static shapes (the GPU default: every slot encoded and masked, no boolean indexing) accumulate alike."""
    model, loss, training = _setup(data, CASES[name])
    set_static_shapes(model, True)
    reference_terms, reference = one_step(model, loss, training, 1)
    terms, grads = one_step(model, loss, training, 2)
    assert terms == pytest.approx(reference_terms, rel=1e-10, abs=1e-12)
    for parameter, gradient in reference.items():
        torch.testing.assert_close(grads[parameter], gradient, rtol=1e-9, atol=1e-12)


def test_terms_that_couple_micro_batches_are_really_exercised(data):
    """The coupled terms are non-trivial in the comparison above (a term that is 0 would compare trivially)."""
    got = {name: one_step(*_setup(data, CASES[name]), 2)[0] for name in ("degla", "c2lip")}
    assert got["degla"]["distill"] > 0 and got["degla"]["tgc"] > 0 and got["degla"]["stat_negatives"] > 0
    assert got["c2lip"]["xac"] > 0 and got["c2lip"]["stat_phrases"] > 0 and got["c2lip"]["npc"] > 0


@pytest.mark.slow
def test_fsc_clips_online_hard_negative_terms_are_really_exercised(data):
    got = one_step(*_setup(data, CASES["fsc-clip"]), 2)[0]
    assert got["global_hn"] > 0 and got["local_hn"] > 0 and got["stat_negatives"] > 0


def test_the_teacher_encodes_each_micro_batch_once(data, monkeypatch):
    """DeGLA's EMA teacher runs in the first pass only: as many teacher passes as without accumulation."""
    model, loss, training = _setup(data, CASES["degla"])
    calls = []
    encode = loss.teacher.encode_image
    monkeypatch.setattr(loss.teacher, "encode_image", lambda *a, **k: calls.append(1) or encode(*a, **k))
    one_step(model, loss, training, 4)
    assert len(calls) == 4


def test_a_loss_whose_gathers_change_between_the_passes_is_refused(data):
    model, loss, training = _setup(data, CASES["clip-ft"])
    rows = epoch_order(len(training), SEED, 0)[:BATCH].tolist()
    micro = [_double(training.batch(part)) for part in split_rows(rows, 2)]
    passes = []

    def forward(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        passes.append(1)
        if len(passes) > 2:  # the second pass sees other rows than the first
            batch = {**batch, "images": batch["images"][:1], "texts": batch["texts"][:1]}
        return loss(model, batch)

    with pytest.raises(AccumulationError, match="gathered tensor 0 is"):
        accumulated_step(forward, micro, model, lambda total: total.backward(), TOTAL)


def test_a_batch_that_does_not_split_is_refused():
    with pytest.raises(AccumulationError, match="6 captions of a step .* do not split into 4"):
        split_rows(list(range(6)), 4)


def _trained(data: dict[str, str], out: Path, recipe: dict, **settings) -> dict[str, torch.Tensor]:
    train(recipe, data["manifest"], str(out), seed=SEED, negatives=data["negatives"] if recipe.get("negatives")
          else None, init_dir=str(Path(data["root"]) / f"base-{recipe['base']}"),
          settings={**SETTINGS, **settings}, parse=data["parse"])
    return torch.load(out / "checkpoint.pt", weights_only=True)


def test_training_with_accum_freq_2_gives_the_weights_of_the_big_batch(data, tmp_path):
    """3 steps of DeGLA (teacher, EMA after each optimizer step) with accum_freq 2: the same weights (float32,
    to rounding) and the same losses.csv as accum_freq 1; batch 8 with accum_freq 3 is refused."""
    recipe = CASES["degla"]
    big = _trained(data, tmp_path / "big", recipe)
    accumulated = _trained(data, tmp_path / "accum", {**recipe, "train": {**HP, "accum_freq": 2}})
    difference = max(float((accumulated[k] - big[k]).abs().max()) for k in big)
    moved = max(float((big[k] - v).abs().max()) for k, v in load_model(
        Path(data["root"]) / "base-clip").model.state_dict().items())
    assert moved > 1e-3 and difference < 1e-5, (moved, difference)
    rows = [(tmp_path / name / "losses.csv").read_text().splitlines() for name in ("big", "accum")]
    assert rows[0][0] == rows[1][0] and len(rows[0]) == len(rows[1]) == 4
    for a, b in zip(rows[0][1:], rows[1][1:], strict=True):
        assert [float(x) for x in a.split(",")] == pytest.approx([float(x) for x in b.split(",")], rel=1e-5)
    with pytest.raises(TrainingError, match="does not split into train.accum_freq 3"):
        _trained(data, tmp_path / "odd", {**recipe, "train": {**HP, "accum_freq": 3}})


def test_accumulation_under_amp_with_the_gradient_scaler_trains_as_the_big_batch(data, tmp_path):
    """float16 autocast with open_clip's GradScaler (each micro-batch's loss scaled, unscaled once before the
    clip and the step): the big batch's losses and weights to half-precision rounding."""
    recipe = {**CASES["negclip"], "train": {**HP, "steps": 2, "grad_clip": 1.0}}
    big = _trained(data, tmp_path / "big", recipe, precision="amp")
    accumulated = _trained(data, tmp_path / "accum", {**recipe, "train": {**recipe["train"], "accum_freq": 4}},
                           precision="amp")
    start = load_model(Path(data["root"]) / "base-clip").model.state_dict()
    moved = max(float((big[k] - start[k]).abs().max()) for k in big)
    difference = max(float((accumulated[k] - big[k]).abs().max()) for k in big)
    assert moved > 1e-3 and difference < 0.05 * moved, (moved, difference)
    losses = [[float(r.split(",")[-1]) for r in (tmp_path / n / "losses.csv").read_text().splitlines()[1:]]
              for n in ("big", "accum")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)


def _saved_bytes(step, model: torch.nn.Module) -> int:  # noqa: ANN001
    """The largest total of tensors autograd holds for backward at once during `step(reset)` (the activations;
    each storage once, the model's own weights not counted); `reset()` after a backward frees the graph."""
    held, peak, seen = [0], [0], set()

    def reset() -> None:
        held[0] = 0
        seen.clear()
        seen.update(p.data_ptr() for p in model.parameters())

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            held[0] += tensor.numel() * tensor.element_size()
            peak[0] = max(peak[0], held[0])
        return tensor

    reset()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step(reset)
    return peak[0]


@pytest.mark.parametrize("base", list(BASE_MODELS))
def test_grad_checkpointing_gives_the_same_gradients_under_autocast_with_fewer_saved_tensors(data, base):
    """train.grad_checkpointing on both towers (open_clip's set_grad_checkpointing): the same gradients under
    bfloat16 autocast (the paper's amp runs autocast too) and fewer activations held for the backward."""
    recipe = CASES["negclip" if base == "clip" else "c2lip"]
    results = {}
    for checkpointing in (False, True):
        model, loss, training = _setup(data, recipe)
        model.float().set_grad_checkpointing(checkpointing)
        rows = epoch_order(len(training), SEED, 0)[:BATCH].tolist()
        batch = training.batch(rows)

        def step(reset, model=model, loss=loss, batch=batch) -> None:  # noqa: ANN001
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                total = loss(model, batch)[TOTAL]
            total.backward()

        held = _saved_bytes(step, model)
        results[checkpointing] = held, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    (plain_bytes, plain), (ckpt_bytes, ckpt) = results[False], results[True]
    assert plain.keys() == ckpt.keys() and len(plain) > 10
    for name, gradient in plain.items():
        torch.testing.assert_close(ckpt[name], gradient, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    image_blocks = [n for n in plain if n.startswith("visual.") and (".resblocks." in n or ".blocks." in n)]
    assert image_blocks  # the image tower's blocks train too (its checkpointing is exercised)
    assert ckpt_bytes < 0.7 * plain_bytes, (ckpt_bytes, plain_bytes)


def test_accumulation_bounds_the_activations_held_at_once(data):
    """The measurement behind config/README's accum_freq row: the activations autograd holds at once (the
    step's peak beyond weights) at accum_freq 1 and 4, and the time of each."""
    model, loss, training = _setup(data, CASES["negclip"])
    model.float()
    rows = epoch_order(len(training), SEED, 0)[:BATCH].tolist()
    figures = {}
    for parts in (1, 4):
        micro = [training.batch(part) for part in split_rows(rows, parts)]

        def step(reset, micro=micro) -> None:  # noqa: ANN001
            def backward(total: torch.Tensor) -> None:
                total.backward()
                reset()

            model.zero_grad(set_to_none=True)
            accumulated_step(lambda batch: loss(model, batch), micro, model, backward, TOTAL)

        began = time.perf_counter()
        figures[parts] = _saved_bytes(step, model), time.perf_counter() - began
    print(f"saved tensors at once: accum 1 {figures[1][0] / 2**20:.2f} MiB, accum 4 {figures[4][0] / 2**20:.2f} MiB;"
          f" time ratio {figures[4][1] / figures[1][1]:.2f}")
    assert figures[4][0] < 0.4 * figures[1][0]

