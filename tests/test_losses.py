"""Losses against direct per-sample implementations of the paper equations (DeGLA Eq. 1-5)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import TinyTextImageModel, embeddings, grads, loop_infonce, loop_negclip

from compo.losses import (
    LOSS_KEYS,
    LOSSES,
    DeclarationError,
    check_recipe,
    discover,
    get_loss,
    loss_keys_table,
    needs_of,
    with_total,
)
from compo.losses.clip import NegCLIPLoss, infonce_terms, negclip_terms


def test_infonce_matches_loop_values_and_gradients():
    v, t = embeddings(6, 8, seed=0), embeddings(6, 8, seed=1)
    scale = torch.tensor(7.5, dtype=torch.float64, requires_grad=True)
    i2t, t2i = infonce_terms(v, t, scale)
    ref_i2t, ref_t2i = loop_infonce(v, t, scale)
    torch.testing.assert_close(i2t, ref_i2t)
    torch.testing.assert_close(t2i, ref_t2i)
    inputs = [v, t, scale]
    expected = grads(0.5 * (ref_i2t + ref_t2i), inputs)
    for got, ref in zip(grads(0.5 * (i2t + t2i), inputs), expected, strict=True):
        torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("k", [1, 3])
def test_negclip_matches_loop_with_missing_negatives_masked(k):
    n, d = 5, 8
    v, t, neg = embeddings(n, d, seed=2), embeddings(n, d, seed=3), embeddings(n, k, d, seed=4)
    mask = torch.ones(n, k, dtype=torch.bool)
    mask[1] = False  # a caption with no valid negative at all
    mask[3, -1] = False  # a caption with a missing last slot
    scale = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    i2t, t2i = negclip_terms(v, t, neg, mask, scale)
    ref_i2t, ref_t2i = loop_negclip(v, t, neg, mask, scale)
    torch.testing.assert_close(i2t, ref_i2t)
    torch.testing.assert_close(t2i, ref_t2i)
    inputs = [v, t, neg, scale]
    for got, ref in zip(grads(i2t + t2i, inputs), grads(ref_i2t + ref_t2i, inputs), strict=True):
        torch.testing.assert_close(got, ref)
    # a masked slot is not a (zero or any) fake negative: its embedding gets no gradient at all
    neg_grad = grads(i2t, [neg])[0]
    assert torch.all(neg_grad[~mask] == 0) and torch.all(neg_grad[mask].abs().sum(-1) > 0)


def test_negclip_without_any_negative_is_infonce():
    v, t, neg = embeddings(4, 8, seed=5), embeddings(4, 8, seed=6), embeddings(4, 2, 8, seed=7)
    scale = torch.tensor(10.0, dtype=torch.float64)
    got = negclip_terms(v, t, neg, torch.zeros(4, 2, dtype=torch.bool), scale)
    ref = infonce_terms(v, t, scale)
    torch.testing.assert_close(got, ref)
    # with negatives the image->text loss can only grow (more terms in every denominator)
    with_negatives = negclip_terms(v, t, neg, torch.ones(4, 2, dtype=torch.bool), scale)
    assert with_negatives[0] > ref[0] and math.isclose(with_negatives[1].item(), ref[1].item())


@pytest.mark.parametrize("static", [False, True])
def test_negclip_online_keeps_an_absent_negative_as_a_zero_logit_column_as_released(static):
    """NegCLIP‡ (seed 003; fsc-clip's ClipLoss fills an absent negative's slot with zero features): every
    masked slot adds exp(0) to every image's denominator; `mask` gives negclip's softmax."""
    n, k = 4, 2
    v, t, neg = embeddings(n, 8, seed=8), embeddings(n, 8, seed=9), embeddings(n, k, 8, seed=10)
    mask = torch.tensor([[True, False], [False, False], [True, True], [False, True]])
    scale = torch.tensor(6.0, dtype=torch.float64)
    zeroed = torch.where(mask.unsqueeze(-1), neg, torch.zeros_like(neg))  # the released zero features
    got = negclip_terms(v, t, neg, mask, scale, static=static, absent="zero-logit")
    torch.testing.assert_close(got, loop_negclip(v, t, zeroed, torch.ones(n, k, dtype=torch.bool), scale))
    torch.testing.assert_close(negclip_terms(v, t, neg, mask, scale, static=static, absent="mask"),
                               loop_negclip(v, t, neg, mask, scale))
    assert got[0] > negclip_terms(v, t, neg, mask, scale)[0]  # 4 absent slots: 4 more columns of logit 0
    with pytest.raises(ValueError, match="absent_negatives 'drop'"):
        negclip_terms(v, t, neg, mask, scale, absent="drop")


def test_negclip_online_builds_from_its_recipe_and_refuses_hard_images():
    recipe = {"loss": "negclip-online", "online_negatives": ["swap"], "k": 1}
    assert check_recipe(recipe) == []
    assert get_loss("negclip-online").build(recipe).absent == "zero-logit"
    assert get_loss("negclip-online").build({**recipe, "absent_negatives": "mask"}).absent == "mask"
    assert [key for key, _ in check_recipe({**recipe, "hard_images": 3})] == ["hard_images"]
    assert [key for key, _ in check_recipe({k: v for k, v in recipe.items() if k != "online_negatives"})] == [
        "online_negatives"]


def test_total_sums_terms_but_not_statistics():
    terms = with_total({"a": torch.tensor(1.0), "b": torch.tensor(2.5), "stat_n": torch.tensor(100.0)})
    assert terms["loss"].item() == 3.5


def test_negclip_module_encodes_only_valid_negatives_with_the_models_logit_scale():
    torch.manual_seed(0)
    model = TinyTextImageModel()
    batch = {
        "images": torch.randn(3, 3, 2, 2),
        "texts": torch.randint(1, 50, (3, 5)),
        "negatives": torch.randint(1, 50, (3, 2, 5)),
        "negative_mask": torch.tensor([[True, False], [False, False], [True, True]]),
    }
    out = NegCLIPLoss()(model, batch)
    v = model.encode_image(batch["images"])
    t = model.encode_text(batch["texts"])
    neg = model.encode_text(batch["negatives"].flatten(0, 1)).view(3, 2, -1)
    i2t, t2i = loop_negclip(v.double(), t.double(), neg.double(), batch["negative_mask"], 5.0)
    torch.testing.assert_close(out["loss"].double(), 0.5 * (i2t + t2i))
    assert out["stat_negatives"].item() == 3
    assert set(out) == {"i2t", "t2i", "stat_negatives", "loss"}
    out["loss"].backward()
    assert model.logit_scale.grad is not None and model.logit_scale.grad != 0


def test_registry_contract():
    assert get_loss("negclip").needs == {"negatives"} and get_loss("infonce").needs == set()
    assert set(LOSSES) == {"infonce", "negclip", "negclip-online", "degla", "cement", "fsc-clip", "siglip", "c2lip"}
    assert get_loss("negclip-online").needs == {"online_negatives"}
    assert LOSSES["degla"].module == "degla" and LOSSES["siglip"].builder == "build_siglip"
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        get_loss("nope")


def test_every_need_of_the_registry_is_a_batch_part_of_compo_batches():
    """The registry names the batch parts; compo.batches is where each is built (one home, no drift)."""
    from compo.batches import BATCH_PARTS

    needs = set().union(*(spec.needs for spec in LOSSES.values()))
    assert needs == {"negatives", "cement_pairs", "noun_phrases", "online_negatives"}
    # "negatives": TrainingData reads the offline table; "hard_images": a recipe's, not a loss's (needs_of)
    assert needs - {"negatives"} | {"hard_images"} == set(BATCH_PARTS)
    assert needs_of({"loss": "degla", "hard_images": 3}) == {"negatives", "hard_images"}
    assert needs_of({"loss": "negclip"}) == {"negatives"}


def test_a_module_of_the_package_registers_its_losses_by_declaring_them(tmp_path):
    """Discovery: every module's top-level LOSSES, read as plain data (never run); a loss declared twice
    or a declaration that is not literal is an error naming the file."""
    (tmp_path / "mine.py").write_text('import torch\nLOSSES = {"mine": {"build": "build", "needs": ["negatives"], '
                                      '"keys": {"m": {"required": True, "schema": {"type": "number"}}}}}\n')
    (tmp_path / "helpers.py").write_text("X = 1\n")
    found = discover(tmp_path)
    assert list(found) == ["mine"] and found["mine"].needs == {"negatives"} and found["mine"].module == "mine"
    (tmp_path / "other.py").write_text('LOSSES = {"mine": {"build": "b"}}\n')
    with pytest.raises(DeclarationError, match=r"other.py: loss 'mine' is also declared in compo/losses/mine.py"):
        discover(tmp_path)
    (tmp_path / "other.py").write_text('NAME = "x"\nLOSSES = {NAME: {"build": "b"}}\n')
    with pytest.raises(DeclarationError, match=r"other.py:2: LOSSES must be plain data"):
        discover(tmp_path)
    (tmp_path / "other.py").write_text('LOSSES = {"x": {"builder": "b"}}\n')
    with pytest.raises(DeclarationError, match=r"needs 'build'"):
        discover(tmp_path)


def test_recipe_keys_come_from_the_declarations(repo):
    """LOSS_KEYS, the config schema's method keys and config/README's table are the declarations' keys."""
    from compo.config import config_schema

    declared = {key for spec in LOSSES.values() for key in spec.keys}
    assert set(LOSS_KEYS) == declared
    assert declared <= set(config_schema()["properties"]["methods"]["additionalProperties"]["properties"])
    readme = (repo / "config" / "README.md").read_text()
    assert "\n".join(loss_keys_table()) in readme, "run: compo loss-keys --write config/README.md"


def test_hard_images_go_with_any_loss_whose_batch_parts_are_rows():
    degla = {"loss": "degla", "negatives": "swap", "k": 4, "ema": 0.9,
             "weights": {"igc": 0.1, "tgc": 0.1, "distill": 0.005}}
    assert check_recipe({**degla, "hard_images": 3}) == []
    assert check_recipe({"loss": "infonce", "hard_images": "random"}) == []
    cement = {"loss": "cement", "negatives": "swap", "k": 1, "margin": {"kind": "none"}, "hard_images": 3}
    assert check_recipe(cement) == [("hard_images", "loss cement needs batch parts the hard-image rows do not "
                                     "carry (cement_pairs): hard_images adds rows of images, captions and their "
                                     "offline negatives only")]


# --- every registered loss keeps the module contract (compo.losses) -----------------------------------------


def _config_recipe(loss: str) -> tuple[dict, str]:
    """The recipe of the first method of config/config.yaml that trains with `loss`, and its base's model."""
    from compo.config import load_config, resolve_method

    config = load_config("config/config.yaml")
    method = next((m for m in config["methods"] if resolve_method(config, m)["loss"] == loss), None)
    if method is None:
        pytest.fail(f"loss {loss} is registered but no method of config/config.yaml uses it")
    recipe = resolve_method(config, method)
    return recipe, config["bases"][recipe["base"]]["model"]


@pytest.mark.parametrize("loss_name", sorted(LOSSES))
def test_every_registered_loss_returns_named_scalar_terms_summed_into_loss(loss_name, tiny_training, repo, one_thread,
                                                                         monkeypatch):
    """On a tiny batch of what its declaration needs (its config recipe, hard images included): a dict of
    finite scalars whose "loss" is the sum of the other terms but the `stat_` ones, which carry no gradient;
    "loss" reaches the trained parameters."""
    from compo.batches import TrainingData, epoch_order
    from compo.models import create_model, get_tokenizer, image_transform
    from compo.train import find_image_neighbours

    monkeypatch.chdir(repo)
    recipe, model_name = _config_recipe(loss_name)
    torch.manual_seed(0)
    model = create_model(model_name, "scratch", 0).train()
    data = TrainingData(tiny_training["manifest"], get_tokenizer(model_name), image_transform(model),
                        needs_of(recipe), negatives=tiny_training["negatives"] if recipe.get("negatives") else None,
                        k=recipe.get("k"), recipe=recipe, seed=0, parse=tiny_training["parse"])
    find_image_neighbours(data, model, recipe)
    loss = get_loss(loss_name).build(recipe)
    loss.setup(model)
    out = loss(model, data.batch(epoch_order(len(data), 0, 0)[:4].tolist(), step=0))
    assert isinstance(out, dict) and "loss" in out
    for name, value in out.items():
        assert value.dim() == 0 and torch.isfinite(value), name
        assert not (name.startswith("stat_") and value.requires_grad), f"{name} is a diagnostic: detach it"
    terms = [value for name, value in out.items() if name != "loss" and not name.startswith("stat_")]
    torch.testing.assert_close(out["loss"], torch.stack(terms).sum())
    out["loss"].backward()
    trained = [p for _, p in loss.trainable_parameters(model)]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trained)
