"""compo.models: trimmed text encoding equals open_clip's full-context encoding."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from compo.models import create_model, get_tokenizer, text_token_features


def test_trimmed_text_encoding_matches_full_context_values_and_gradients() -> None:
    torch.manual_seed(0)
    model = create_model("compo-tiny-clip", "scratch", seed=1)
    tokens = get_tokenizer("compo-tiny-clip")(
        ["a red circle", "a small blue striped square to the left of a large yellow star on the sand", "x"]
    )
    assert "encode_text" in vars(model)  # the instance uses the trimmed encoder
    full_model = type(model).encode_text  # open_clip's own method, over all 77 positions
    trimmed = model.encode_text(tokens, normalize=True)
    trimmed.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    full = full_model(model, tokens, normalize=True)
    full.square().sum().backward()
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-6)
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-4, atol=1e-6, msg=name)


def _assert_matches_open_clip(model: torch.nn.Module, tokens: torch.Tensor) -> None:
    """model.encode_text equals open_clip's own (full-context, every position through every block) in values
    and in every parameter's gradient (float32 sums in another order: gradients relative to the largest)."""
    ours = model.encode_text(tokens, normalize=True)
    weights = torch.linspace(-1, 1, ours.shape[1])
    (ours * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    full = type(model).encode_text(model, tokens, normalize=True)
    (full * weights).sum().backward()
    torch.testing.assert_close(ours, full, rtol=1e-5, atol=1e-6)
    assert grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert (grads[name] - parameter.grad).abs().max() <= 1e-5 * parameter.grad.abs().max(), name


def test_last_token_pooled_tower_keeps_its_context_and_runs_its_last_block_at_the_last_position() -> None:
    # the tiny SigLIP-style tower (no mask) pools the last position, which sees every pad: no trimming, but
    # its last block need only run there
    model = create_model("compo-tiny-sigmoid", "scratch", seed=0)
    assert model.text_pool_type == "last" and model.attn_mask is None
    assert "encode_text" in vars(model)
    tokens = get_tokenizer("compo-tiny-sigmoid")(["a red circle", "the grass", "a large blue star left of a tree"])
    _assert_matches_open_clip(model, tokens)


def test_pooled_encoding_honours_gradient_checkpointing(monkeypatch) -> None:
    import compo.models

    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return torch.utils.checkpoint.checkpoint(*args, **kwargs)

    monkeypatch.setattr(compo.models, "checkpoint", counted)
    for name in ("compo-tiny-clip", "compo-tiny-sigmoid"):
        model = create_model(name, "scratch", seed=4)
        model.set_grad_checkpointing(True)
        calls.clear()
        _assert_matches_open_clip(model, get_tokenizer(name)(["a red circle above a blue star", "a square"]))
        assert len(calls) == len(model.transformer.resblocks) - 1  # every block but the pooled-only last one


def test_trimmed_token_features_match_open_clip_intermediates() -> None:
    model = create_model("compo-tiny-clip", "scratch", seed=2)
    tokens = get_tokenizer("compo-tiny-clip")(["a red circle above a blue star", "a square"])
    pooled, features, mask = text_token_features(model, tokens)
    length = features.shape[1]
    assert length == int((tokens != 0).sum(1).max()) and mask.shape == (2, length)
    out = model.forward_intermediates(text=tokens, text_indices=1, normalize_intermediates=True)
    full = out["text_intermediates"][-1] @ model.text_projection
    torch.testing.assert_close(pooled, out["text_features"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(features[mask], full[:, :length][mask], rtol=1e-5, atol=1e-5)


def test_length_groups_pad_each_text_by_at_most_the_slack() -> None:
    from compo.models import BUCKET_SLACK, MIN_BUCKET, length_buckets

    assert (BUCKET_SLACK, MIN_BUCKET) == (0.3, 32)
    # 40 texts of 20 tokens, 40 of 12, 40 of 4: 12 <= 0.7 * 20 and 4 <= 0.7 * 12, so three groups
    lengths = [20] * 40 + [12] * 40 + [4] * 40
    tokens = torch.zeros(len(lengths), 77, dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens[row, :length] = 5
    groups = length_buckets(tokens)
    assert [sorted(g.tolist()) for g in groups] == [list(range(0, 40)), list(range(40, 80)), list(range(80, 120))]
    # a last group smaller than MIN_BUCKET joins the one before it
    groups = length_buckets(tokens[:100])
    assert [len(g) for g in groups] == [40, 60]


def test_texts_encoded_in_length_groups_match_full_context_values_and_gradients() -> None:
    """Enough texts of varied length for several groups: each text's embedding (and every gradient) is
    open_clip's full-context one."""
    from compo.models import length_buckets

    torch.manual_seed(0)
    model = create_model("compo-tiny-clip", "scratch", seed=3)
    words = "a small blue striped square to the left of a large yellow star on the sand near a tree".split()
    texts = [" ".join(words[: 1 + (7 * i) % len(words)]) for i in range(96)]
    tokens = get_tokenizer("compo-tiny-clip")(texts)
    assert len(length_buckets(tokens)) >= 2
    _assert_matches_open_clip(model, tokens)
    pooled, features, mask = text_token_features(model, tokens)
    out = model.forward_intermediates(text=tokens, text_indices=1, normalize_intermediates=True)
    length = int((tokens != 0).sum(1).max())
    assert features.shape[1] == length and torch.equal(mask, tokens[:, :length] != 0)
    torch.testing.assert_close(pooled, out["text_features"], rtol=1e-5, atol=1e-6)
    reference = out["text_intermediates"][-1] @ model.text_projection
    torch.testing.assert_close(features[mask], reference[:, :length][mask], rtol=1e-5, atol=1e-5)


def test_distinct_texts_are_encoded_once_with_the_gradient_of_every_use() -> None:
    from compo.losses import encode_distinct_texts

    model = create_model("compo-tiny-sigmoid", "scratch", seed=0)
    tokens = get_tokenizer("compo-tiny-sigmoid")(["the grass", "a red circle", "the grass", "the grass", "a dog"])
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0])[:, None]
    once = encode_distinct_texts(model, tokens)
    (once * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    every = model.encode_text(tokens, normalize=True)
    (every * weights).sum().backward()
    torch.testing.assert_close(once, every, rtol=1e-5, atol=1e-6)
    assert torch.equal(once[0], once[2]) and torch.equal(once[0], once[3])
    for name, parameter in model.named_parameters():  # float32 sums in another order: relative to the largest
        if parameter.grad is not None:
            assert (grads[name] - parameter.grad).abs().max() <= 1e-5 * parameter.grad.abs().max(), name


def test_resnet_cells_read_the_attention_pool_value_path():
    """CLIP ResNet's per-cell features (MaskCLIP): with one cell (32 px / 32) and the pool's positional
    embedding zeroed, every key and value the pool sees is that cell, so its attention-weighted output
    equals the cell's value path exactly: the cell feature is the unnormalised pooled feature."""
    from compo.models import image_patch_features, model_config, register_model_config

    config = model_config("compo-tiny-clip")
    register_model_config("compo-tiny-clip-32px", {**config, "vision_cfg": {**config["vision_cfg"], "image_size": 32}})
    model = create_model("compo-tiny-clip-32px", "scratch", seed=3).eval()
    with torch.no_grad():
        model.visual.attnpool.positional_embedding.zero_()
        images = torch.randn(3, 3, 32, 32)
        pooled, cells = image_patch_features(model, images)
        unnormalised = model.visual(images)
    assert cells.shape == (3, 1, 128)
    torch.testing.assert_close(cells[:, 0], unnormalised, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pooled, torch.nn.functional.normalize(unnormalised, dim=-1))


def test_a_token_id_0_inside_a_text_is_a_token_not_padding() -> None:
    """Id 0 is the token "!" as well as the padding: a text's length runs to its last non-zero id (its end
    token), so a 0 inside a text is encoded, in length groups and in the token mask, as open_clip encodes it."""
    from compo.models import real_tokens, token_lengths

    model = create_model("compo-tiny-clip", "scratch", seed=1)
    tokens = get_tokenizer("compo-tiny-clip")(["a red circle on the sand", "a blue star"])
    tokens[0, 2] = 0  # "a ! circle on the sand"
    assert token_lengths(tokens).tolist() == [8, 5]
    assert real_tokens(tokens)[0, :8].all() and not real_tokens(tokens)[0, 8:].any()
    _assert_matches_open_clip(model, tokens)
    assert text_token_features(model, tokens)[2][0].sum() == 8


def test_building_a_model_for_its_weight_names_leaves_the_root_logger_alone() -> None:
    """The DAG build's LoRA-target check builds open_clip models on the meta device; open_clip logs through the
    root logger's functions, which gave a root logger without handlers one (logging.basicConfig), and every line
    Snakemake logged then printed twice (issue 58: 463 extra lines on a first dry run)."""
    code = ("import logging; from compo.architectures import _meta_model_shapes; "
            "shapes = _meta_model_shapes('compo-tiny-clip'); "
            "print(len(shapes) > 0, logging.getLogger().handlers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True []"


# --- names read from files ----------------------------------------------------------------------------


def test_model_json_name_cannot_write_outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model_name of '../../escape/y' once made `register_model_config` write escape/y.json outside its
    temporary folder; now it is refused before anything is written, naming model.json."""
    from compo.models import create_model, load_model, save_checkpoint

    model_dir = tmp_path / "model"
    save_checkpoint(create_model("compo-tiny-clip"), "compo-tiny-clip", model_dir)
    meta = json.loads((model_dir / "model.json").read_text())
    meta["model_config"]["embed_dim"] = 64  # a config open_clip does not know yet: it gets registered
    meta["model_name"] = "../../escape/y"
    (model_dir / "model.json").write_text(json.dumps(meta))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "escape").mkdir()
    with pytest.raises(ValueError) as caught:
        load_model(model_dir)
    assert list((tmp_path / "escape").iterdir()) == []
    assert str(caught.value).startswith(f"{model_dir / 'model.json'}: model_name '../../escape/y' is not a name"), \
        caught.value


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_unreadable_checkpoint_is_named_with_what_to_do(tmp_path: Path, damage: str) -> None:
    from compo.models import create_model, load_model, save_checkpoint

    model_dir = tmp_path / "model"
    save_checkpoint(create_model("compo-tiny-clip"), "compo-tiny-clip", model_dir)
    checkpoint = model_dir / "checkpoint.pt"
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(b"not a checkpoint" * 10 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the message is what is tested
        load_model(model_dir)
    message = str(caught.value)
    assert message.startswith(f"{checkpoint}: cannot be read as a checkpoint"), message
    assert f"delete {model_dir} and rerun" in message and "weights_only=False" not in message, message


def test_weights_holding_code_are_named_without_torchs_advice(tmp_path) -> None:
    """A base's weights file and an LLM's weights that are pickles with code: one line naming the file (or the
    model folder), never torch's suggestion to set weights_only=False."""
    import os

    import torch
    from artifact_fixtures import build_tiny_lm

    from compo.llm import LLMSettings
    from compo.llm.backends import import_transformers, load_backend
    from compo.models import CheckpointError, create_base

    class Code:
        def __reduce__(self):  # unpickling would call os.system
            return (os.system, ("echo unpickled",))

    torch.save({"weights": Code()}, tmp_path / "weights.pt")
    with pytest.raises(CheckpointError) as error:
        create_base({"model": "compo-tiny-clip", "init": "released", "weights": str(tmp_path / "weights.pt")})
    assert str(tmp_path / "weights.pt") in str(error.value) and "weights_only" not in str(error.value)

    folder = tmp_path / "lm"
    build_tiny_lm(folder, ["a", "red", "cube"])
    import_transformers().AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, safe_serialization=False)
    for file in folder.glob("*.safetensors"):
        file.unlink()
    torch.save({"weights": Code()}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError) as error:
        load_backend(LLMSettings.from_options(model=str(folder), backend="transformers", device="cpu"))
    assert str(folder) in str(error.value) and "weights_only" not in str(error.value)
