"""compo.models: trimmed text encoding equals open_clip's full-context encoding."""

from __future__ import annotations

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


def test_last_token_pooled_towers_are_left_alone() -> None:
    # the tiny SigLIP-style tower pools the last position: trimming would change what it pools
    model = create_model("compo-tiny-sigmoid", "scratch", seed=0)
    assert model.text_pool_type == "last"
    assert "encode_text" not in vars(model)


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
