"""Model adaptation: LoRA (freezing, merge equivalence) and LongCLIP's positional stretch and freeze."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image, ImageDraw

from compo.adapt import AdaptError, LoRA, adapt_model, export_model, stretch_positions
from compo.losses import get_loss
from compo.models import create_model, get_tokenizer, load_model, open_clip, save_checkpoint
from compo.train import build_optimizer, train

MODEL = "compo-tiny-vit-clip"  # the ViT tower: LoRA on its transformer blocks
LORA_TARGET_SUFFIXES = ("attn.in_proj_weight", "attn.out_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
TRAIN = {"steps": 3, "batch_size": 4, "lr": 1e-2, "warmup": 1, "weight_decay": 0.1}


# --- the stretch formula against hand computation ----------------------------------------------------


def test_stretch_small_case_by_hand():
    old = torch.tensor([[0.0], [10.0], [20.0], [40.0], [80.0]])  # L = 5, keep 2 -> 2 + 4 * 3 = 14 rows
    new = stretch_positions(old, 14, keep=2)
    expected = [0, 10,                      # kept
                20, 25, 30, 35,             # 20 -> 40 in quarters
                40, 50, 60, 70,             # 40 -> 80
                80, 90, 100, 110]           # past the last row: the last slope (40 per row) extrapolated
    assert new.squeeze(1).tolist() == expected


def test_stretch_77_to_248_keeps_20_and_interpolates_4x():
    old = torch.randn(77, 8, dtype=torch.float64)
    new = stretch_positions(old, 248, keep=20)
    assert new.shape == (248, 8)
    assert torch.equal(new[:20], old[:20])
    for i in range(56):  # new 20 + 4i + r = (1 - r/4) old[20 + i] + r/4 old[21 + i]
        for r in range(4):
            hand = (4 - r) / 4 * old[20 + i] + r / 4 * old[21 + i]
            assert torch.allclose(new[20 + 4 * i + r], hand, atol=1e-12)
    for r in range(4):  # the last four: old[76] + r/4 (old[76] - old[75])
        assert torch.allclose(new[244 + r], old[76] + r / 4 * (old[76] - old[75]), atol=1e-12)


def test_stretch_rejects_bad_lengths():
    with pytest.raises(AdaptError, match="text.context_length"):
        stretch_positions(torch.zeros(77, 2), 77, keep=20)
    with pytest.raises(AdaptError, match="text.keep_positions"):
        stretch_positions(torch.zeros(77, 2), 248, keep=76)


# --- LoRA ---------------------------------------------------------------------------------------------


def test_lora_starts_equal_to_base_and_trains_only_adapters():
    torch.set_num_threads(1)
    base = create_model(MODEL, "scratch", 0)
    initial = {k: v.clone() for k, v in base.state_dict().items()}
    model, name = adapt_model(base, MODEL, {"lora": {"rank": 4, "alpha": 8}})
    assert name == MODEL
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.rsplit(".", 1)[-1] in ("lora_A", "lora_B") for n in trainable)
    adapted = {n.split(".parametrizations.")[0] + "." + n.split(".parametrizations.")[1].split(".")[0]
               for n in trainable}
    assert len(adapted) == 2 * 4 * len(LORA_TARGET_SUFFIXES)  # both towers, 4 blocks, 4 linear layers each
    assert all(n.endswith(LORA_TARGET_SUFFIXES) for n in adapted)
    assert any(n.startswith("visual.") for n in adapted) and any(n.startswith("transformer.") for n in adapted)

    images, texts = torch.randn(4, 3, 64, 64), get_tokenizer(MODEL)(["a red cube", "a cat", "b", "c d"])
    fresh = create_model(MODEL, "scratch", 0)
    assert torch.allclose(model.encode_image(images), fresh.encode_image(images))  # B = 0 at start

    loss = get_loss("infonce").build({})
    optimizer = build_optimizer(loss.trainable_parameters(model), TRAIN)
    for _ in range(3):
        optimizer.zero_grad()
        loss(model, {"images": images, "texts": texts})["loss"].backward()
        optimizer.step()
    state = model.state_dict()
    for key, value in initial.items():  # every base weight bit-identical, adapted ones under ".original"
        stored = key if key in state else key.rsplit(".", 1)[0] + ".parametrizations." + key.rsplit(".", 1)[1] \
            + ".original"
        assert torch.equal(state[stored], value), key
    assert any(state[k].abs().sum() > 0 for k in state if k.endswith("lora_B"))  # the adapters did train


def test_lora_merge_gives_a_plain_open_clip_checkpoint_with_the_same_embeddings(tmp_path):
    torch.set_num_threads(1)
    model, name = adapt_model(create_model(MODEL, "scratch", 0), MODEL, {"lora": {"rank": 4, "alpha": 4}}, seed=3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRA):
                module.lora_B.normal_()  # as if trained
    model.eval()
    images, texts = torch.randn(3, 3, 64, 64), get_tokenizer(MODEL)(["a red cube", "two blue balls", "grass"])
    with torch.no_grad():
        expected = model.encode_image(images, normalize=True), model.encode_text(texts, normalize=True)
    adapter = model.transformer.resblocks[0].mlp.c_fc.parametrizations.weight[0]
    base_weight = model.transformer.resblocks[0].mlp.c_fc.parametrizations.weight.original.clone()
    delta = (adapter.lora_B @ adapter.lora_A).detach() * 4 / 4

    merged, merged_name = export_model(model, name, {"lora": {"rank": 4, "alpha": 4}})
    assert torch.allclose(merged.transformer.resblocks[0].mlp.c_fc.weight, base_weight + delta)
    save_checkpoint(merged, merged_name, tmp_path)
    plain = open_clip().create_model(MODEL, pretrained=str(tmp_path / "checkpoint.pt"))
    plain.eval()
    assert set(plain.state_dict()) == set(create_model(MODEL).state_dict())
    with torch.no_grad():
        assert torch.allclose(plain.encode_image(images, normalize=True), expected[0], atol=1e-5)
        assert torch.allclose(plain.encode_text(texts, normalize=True), expected[1], atol=1e-5)


def test_lora_on_the_patch_embedding_is_loralibs_conv2d_form():
    """FSC-CLIP's released LoRA also adapts the patch embedding (a Conv2d): A [r k, in k], B [out k, r k],
    delta = (alpha / r) (B @ A) reshaped to [out, in, k, k]; checked against a hand-built loralib delta."""
    torch.set_num_threads(1)
    model, _ = adapt_model(create_model(MODEL, "scratch", 0), MODEL,
                           {"lora": {"rank": 4, "alpha": 1, "targets": ["visual.conv1.weight"]}})
    conv = model.visual.conv1
    adapter = conv.parametrizations.weight[0]
    out_channels, in_channels, k, _ = conv.parametrizations.weight.original.shape
    assert adapter.lora_A.shape == (4 * k, in_channels * k) and adapter.lora_B.shape == (out_channels * k, 4 * k)
    images = torch.randn(2, 3, 64, 64)
    fresh = create_model(MODEL, "scratch", 0).encode_image(images)
    assert torch.allclose(model.encode_image(images), fresh, atol=1e-5)  # B = 0: the base model
    with torch.no_grad():
        adapter.lora_B.normal_()
    hand = conv.parametrizations.weight.original + 0.25 * (adapter.lora_B @ adapter.lora_A).view(out_channels,
                                                                                                  in_channels, k, k)
    assert torch.allclose(conv.weight, hand)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"visual.conv1.parametrizations.weight.0.lora_{m}" for m in "AB"}
    merged, _ = export_model(model, MODEL, {})
    assert torch.allclose(merged.visual.conv1.weight, hand.detach())


def test_the_default_configs_lora_adapts_every_linear_and_conv_of_the_resnet_study_model():
    """config.yaml's LoRA targets on the study's towers (text transformer, CLIP ResNet image tower): every
    pattern matches and together they reach every weight matrix and kernel FSC-CLIP's code adapts
    (each Linear and Conv2d), leaving embeddings, projections and norms frozen; the model starts as the base."""
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    recipe = {"lora": config["methods"]["fsc-clip-lora"]["lora"]}
    model, _ = adapt_model(create_model("compo-tiny-clip", "scratch", 0), "compo-tiny-clip", recipe)
    adapted = {n.split(".parametrizations.")[0] for n, p in model.named_parameters() if p.requires_grad}
    convs = {n for n, m in model.visual.named_modules() if isinstance(m, torch.nn.Conv2d)}
    linears = {n for n, m in model.visual.attnpool.named_children() if isinstance(m, torch.nn.Linear)}
    text = {f"transformer.resblocks.{b}.{part}" for b in range(4) for part in ("attn", "attn.out_proj",
                                                                                "mlp.c_fc", "mlp.c_proj")}
    assert adapted == {f"visual.{n}" for n in convs} | {f"visual.attnpool.{n}" for n in linears} | text
    assert len(convs) == 3 + 4 * 4 and sorted(linears) == ["c_proj", "k_proj", "q_proj", "v_proj"]
    images = torch.randn(2, 3, 64, 64)
    model.eval()
    assert torch.allclose(model.encode_image(images),
                          create_model("compo-tiny-clip", "scratch", 0).eval().encode_image(images), atol=1e-5)


def test_lora_targets_must_match():
    with pytest.raises(AdaptError, match="lora.targets"):
        adapt_model(create_model(MODEL), MODEL, {"lora": {"rank": 4, "targets": ["*no_such_layer*"]}})


# --- training end to end: LoRA and LongCLIP ------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapt")
    rows = []
    for i in range(8):
        image = Image.new("RGB", (64, 64), "white")
        ImageDraw.Draw(image).rectangle([4 + 5 * i, 8, 60, 60 - 4 * i], fill=["red", "blue"][i % 2])
        image.save(root / f"img{i}.png")
        colour = ["red", "blue"][i % 2]
        caption = " ".join([f"a {colour} square number {i} on white."] * (1 + 3 * i))  # up to ~200 tokens
        rows.append({"image_id": f"i{i}", "image_path": str(root / f"img{i}.png"), "caption_id": f"c{i}",
                     "caption": caption, "dataset": "tiny"})
    frame = pd.DataFrame(rows)
    write_manifest(frame, root / "manifest.parquet")
    base = root / "base"
    train({"model": MODEL, "init": "scratch", "dataset": "tiny", "train": {**TRAIN, "steps": 0}}, None, str(base),
          seed=0, settings={"threads": 1})
    return {"manifest": root / "manifest.parquet", "base": base}


def _train(data, out: Path, **recipe) -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    full = {"name": "m", "base": "clip", "loss": "infonce", "negatives": None, "train": TRAIN, **recipe}
    train(full, str(data["manifest"]), str(out), seed=0, init_dir=str(data["base"]), settings={"threads": 1})
    return torch.load(out / "checkpoint.pt", weights_only=True)


def test_lora_training_changes_only_adapted_weights_by_rank_4(data, tmp_path):
    base = torch.load(data["base"] / "checkpoint.pt", weights_only=True)
    trained = _train(data, tmp_path / "lora", lora={"rank": 4, "alpha": 4})
    assert set(trained) == set(base)  # merged: a plain open_clip state dict
    changed = [k for k in base if not torch.equal(base[k], trained[k])]
    assert changed and all(k.endswith(LORA_TARGET_SUFFIXES) for k in changed)
    for key in changed:  # W' - W = (alpha/r) B A has rank <= 4
        assert torch.linalg.matrix_rank((trained[key] - base[key]).double(), atol=1e-6) <= 4
    load_model(tmp_path / "lora")  # plain open_clip loads it


def test_longclip_stretch_freezes_first_rows_and_saves_a_248_config(data, tmp_path):
    base = torch.load(data["base"] / "checkpoint.pt", weights_only=True)
    text = {"context_length": 248, "keep_positions": 20, "freeze_positions": 20}
    trained = _train(data, tmp_path / "long", text=text)
    stretched = stretch_positions(base["positional_embedding"], 248, keep=20)
    assert trained["positional_embedding"].shape == (248, 128)
    assert torch.equal(trained["positional_embedding"][:20], stretched[:20])  # frozen rows bit-identical
    assert not torch.equal(trained["positional_embedding"][20:], stretched[20:])  # the rest trained
    assert not torch.equal(trained["text_projection"], base["text_projection"])

    meta = json.loads((tmp_path / "long" / "model.json").read_text())
    assert meta["model_name"] == f"{MODEL}-ctx248" and meta["model_config"]["text_cfg"]["context_length"] == 248
    loaded = load_model(tmp_path / "long")
    assert loaded.tokenizer(["a red square"]).shape == (1, 248)
    assert loaded.model.positional_embedding.shape[0] == 248


def test_frozen_rows_survive_weight_decay_on_every_parameter():
    # An optimizer that decays everything (the trainer never decays embeddings, but the pin must not rely on it)
    torch.set_num_threads(1)
    model, _ = adapt_model(create_model(MODEL), MODEL, {"text": {"freeze_positions": 5}})
    before = model.positional_embedding.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    texts = get_tokenizer(MODEL)(["a red cube on the grass", "two balls"])
    for _ in range(3):
        optimizer.zero_grad()
        model.encode_text(texts).square().sum().backward()
        optimizer.step()
    after, _ = export_model(model, MODEL, {"text": {"freeze_positions": 5}})
    assert set(after.state_dict()) == set(create_model(MODEL).state_dict())
    assert torch.equal(after.positional_embedding[:5], before[:5])
    assert not torch.equal(after.positional_embedding[5:], before[5:])


def test_longclip_70_truncates_evaluation_texts_by_the_recipe(tmp_path):
    """The evaluation rule passes the recipe's `text.truncate_words` (compo evaluate --truncate-words)."""
    from compo.evaluate.text import protocol_suffix, truncate_words, with_text_protocol

    model = create_model(MODEL)
    save_checkpoint(model, MODEL, tmp_path)
    loaded = load_model(tmp_path)
    assert with_text_protocol(loaded, None) is loaded and protocol_suffix(None) == ""  # no text protocol
    truncated = with_text_protocol(loaded, 3)
    text = "a  red\tcube on the green grass"
    assert truncate_words(text, 3) == "a red cube"
    assert torch.equal(truncated.tokenizer([text]), loaded.tokenizer(["a red cube"]))
    assert not torch.equal(loaded.tokenizer([text]), loaded.tokenizer(["a red cube"]))
    assert protocol_suffix(3) == "+truncate3"
    with pytest.raises(ValueError, match="truncate_words must be a positive integer"):
        with_text_protocol(loaded, 0)
