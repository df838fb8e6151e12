"""Static shapes (`train.shapes`, compo.models.set_static_shapes): one text pass per batch cut on the CPU, masks
of fixed shape, no host read mid-step, one graph; the same losses and gradients as the dynamic path."""

from __future__ import annotations

import copy

import pytest
import torch

from compo.batches import TOKEN_KEYS, cut_token_width
from compo.devices import DeviceError, static_shapes
from compo.losses import TOTAL, get_loss
from compo.models import (
    PAD_MULTIPLE,
    create_model,
    get_tokenizer,
    set_static_shapes,
    text_token_features,
    text_width_multiple,
)
from compo_tools.opcount import OpCounter

CAPTIONS = ["a red circle", "a small blue striped square to the left of a large yellow star on the sand",
            "two green triangles", "a purple star above an orange square", "x", "a tree"]
NEGATIVES = [["a blue circle", "a circle red"], ["a large blue striped square to the left of a small yellow star",
                                                  None], [None, None], ["an orange star above a purple square",
                                                                        "a square above a star"],
             ["y", None], ["a bush", "a tree tree"]]
PHRASES = [["a red circle"], ["a small blue striped square", "a large yellow star", "the sand"], [],
           ["a purple star", "an orange square"], [], ["a tree"]]
RECIPES = {
    "infonce": {},
    "negclip": {"negatives": "swap"},
    "degla": {"negatives": "swap", "weights": {"igc": 0.2, "tgc": 0.2, "distill": 0.05}, "ema": 0.9},
    "fsc-clip": {"weights": {"global": 0.5, "local": 0.2}, "focal_gamma": 2.0, "label_smoothing": 0.02,
                 "online_negatives": ["swap"]},
    "c2lip": {"weights": {"npc": 1.0, "xac": 0.1}},
    "cement": {"negatives": "swap", "k": 1,
               "margin": {"kind": "fermi-dirac", "m_min": -2.0, "m_max": 2.0, "c_tilde": 4.0, "tau_m": 0.15}},
}
# cement: each caption's first negative; rows 0 and 3 with a negative image, row 4's concreteness unknown
CEMENT_IMAGES = [True, False, False, True, False, False]
CEMENT_CONCRETENESS = [4.5, 3.0, float("nan"), 4.1, float("nan"), 2.0]


def _batch(model_name: str) -> dict[str, torch.Tensor]:
    tokenize = get_tokenizer(model_name)
    generator = torch.Generator().manual_seed(0)
    k = len(NEGATIVES[0])
    negatives = torch.zeros(len(CAPTIONS), k, 77, dtype=torch.long)
    mask = torch.zeros(len(CAPTIONS), k, dtype=torch.bool)
    for row, texts in enumerate(NEGATIVES):
        for slot, text in enumerate(texts):
            if text is not None:
                negatives[row, slot], mask[row, slot] = tokenize([text])[0], True
    phrases = [(row, text) for row, texts in enumerate(PHRASES) for text in texts]
    image_mask = torch.tensor(CEMENT_IMAGES).unsqueeze(1)
    return {"images": torch.randn(len(CAPTIONS), 3, 64, 64, generator=generator), "texts": tokenize(CAPTIONS),
            "negatives": negatives, "negative_mask": mask, "phrases": tokenize([t for _, t in phrases]),
            "phrase_owner": torch.tensor([row for row, _ in phrases]),
            "negative_image_mask": image_mask & mask[:, :1],
            "negative_images": torch.randn(int((image_mask & mask[:, :1]).sum()), 3, 64, 64, generator=generator),
            "negative_concreteness": torch.tensor(CEMENT_CONCRETENESS).unsqueeze(1)}


def _model_and_loss(loss_name: str, static: bool) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
    model_name = "compo-tiny-sigmoid" if loss_name == "c2lip" else "compo-tiny-clip"
    model = set_static_shapes(create_model(model_name, "scratch", seed=0), static).train()
    loss = get_loss(loss_name).build(RECIPES[loss_name])
    loss.setup(model)
    batch = _batch(model_name)
    if loss_name == "cement":  # one negative slot per caption
        batch["negatives"], batch["negative_mask"] = batch["negatives"][:, :1], batch["negative_mask"][:, :1]
    if text_width_multiple(model):  # as the trainer's batches: a causal tower's texts cut on the CPU
        cut_token_width(batch, text_width_multiple(model))
    return model, loss, batch


def _step(loss_name: str, static: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    model, loss, batch = _model_and_loss(loss_name, static)
    terms = loss(model, batch)
    terms[TOTAL].backward()
    return ({name: value.detach() for name, value in terms.items()},
            {name: p.grad for name, p in model.named_parameters() if p.grad is not None})


def test_cut_token_width_keeps_every_end_token_in_one_width_of_a_multiple_of_16() -> None:
    batch = _batch("compo-tiny-clip")
    original = copy.deepcopy(batch)
    cut_token_width(batch, PAD_MULTIPLE)
    longest = max(int(original[key].argmax(-1).max()) + 1 for key in TOKEN_KEYS if key in original)
    widths = {batch[key].shape[-1] for key in TOKEN_KEYS if key in batch}
    assert widths == {16 * -(-longest // 16)} and longest > 16  # the long caption needs a second 16
    for key in ("texts", "negatives", "phrases"):  # nothing but padding was cut
        assert torch.equal(batch[key], original[key][..., : batch[key].shape[-1]])
        assert not original[key][..., batch[key].shape[-1]:].any()
    assert torch.equal(batch["negative_mask"], original["negative_mask"])
    full = {"texts": get_tokenizer("compo-tiny-clip")(["word " * 90])}
    cut_token_width(full, PAD_MULTIPLE)
    assert full["texts"].shape[-1] == 77  # never wider than the context


def test_static_text_path_is_one_pass_with_open_clips_values_and_gradients() -> None:
    model = set_static_shapes(create_model("compo-tiny-clip", "scratch", seed=1), True)
    batch = _batch("compo-tiny-clip")
    cut_token_width(batch, PAD_MULTIPLE)
    tokens = batch["texts"]
    calls = []
    model.transformer.resblocks[0].register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    ours = model.encode_text(tokens, normalize=True)
    assert calls == [torch.Size([len(CAPTIONS), tokens.shape[1], 128])]  # one pass at the cut width
    weights = torch.linspace(-1, 1, ours.shape[1])
    (ours * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    full = type(model).encode_text(model, get_tokenizer("compo-tiny-clip")(CAPTIONS), normalize=True)
    (full * weights).sum().backward()
    torch.testing.assert_close(ours, full, rtol=1e-5, atol=1e-6)
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert (grads[name] - parameter.grad).abs().max() <= 1e-5 * parameter.grad.abs().max(), name
    pooled, features, mask = text_token_features(model, tokens)
    torch.testing.assert_close(pooled, full.detach(), rtol=1e-5, atol=1e-6)
    assert features.shape[1] == mask.shape[1] == tokens.shape[1]


@pytest.mark.parametrize("loss_name", list(RECIPES))
def test_static_shapes_give_the_dynamic_losses_and_gradients(loss_name: str) -> None:
    dynamic_terms, dynamic_grads = _step(loss_name, static=False)
    static_terms, static_grads = _step(loss_name, static=True)
    assert static_terms.keys() == dynamic_terms.keys()
    for name in dynamic_terms:
        torch.testing.assert_close(static_terms[name], dynamic_terms[name], rtol=1e-5, atol=1e-6, msg=name)
    assert static_grads.keys() == dynamic_grads.keys()
    largest = max(grad.abs().max() for grad in dynamic_grads.values())  # float32 sums in another order
    for name, grad in dynamic_grads.items():
        assert (static_grads[name] - grad).abs().max() <= 1e-4 * max(grad.abs().max(), 1e-3 * largest), name


@pytest.mark.parametrize("loss_name", list(RECIPES))
def test_a_static_step_reads_nothing_back_from_the_device(loss_name: str) -> None:
    counts = {}
    for static in (False, True):
        model, loss, batch = _model_and_loss(loss_name, static)
        with OpCounter(proxy=True) as counter:
            loss(model, batch)[TOTAL].backward()
        counts[static] = sum(counter.steps[-1].sync_sites.values())
    assert counts[True] == 0
    if loss_name != "infonce":  # the dynamic path reads lengths, mask counts or distinct rows back
        assert counts[False] > 0


@pytest.mark.parametrize("loss_name", ["infonce", "negclip", *(pytest.param(name, marks=pytest.mark.slow) for name in
                                                               ("degla", "fsc-clip", "c2lip", "cement"))])
def test_every_loss_is_one_graph_with_static_shapes(loss_name: str) -> None:
    for static, breaks in ((True, 0), (False, None)):
        model, loss, batch = _model_and_loss(loss_name, static)
        explained = torch._dynamo.explain(loss)(model, batch)
        if breaks is not None:
            assert explained.graph_break_count == breaks, explained.break_reasons
        else:  # the dynamic path's host reads break the graph (the test can fail)
            assert explained.graph_break_count > 0
        torch._dynamo.reset()


def test_shapes_setting_defaults_by_device_and_names_its_key() -> None:
    assert static_shapes("auto", torch.device("cuda")) and not static_shapes("auto", torch.device("cpu"))
    assert static_shapes("static", torch.device("cpu")) and not static_shapes("dynamic", torch.device("cuda"))
    with pytest.raises(DeviceError, match="train.shapes.*'fixed'"):
        static_shapes("fixed", torch.device("cpu"))
