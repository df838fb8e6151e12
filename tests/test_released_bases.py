"""Released checkpoints as bases (issue 46): a base's weights in open_clip's layout, in open_clip_train's
training-checkpoint layout (`state_dict`, `module.` prefixes) and in Long-CLIP's own, from a local file or from a
hub repository's named file through the model cache; each built here on the tiny model in that layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compo.artifacts import CACHE_ENV
from compo.config import ConfigError, load_config
from compo.models import (
    LONGCLIP_KEEP,
    CheckpointError,
    create_base,
    get_tokenizer,
    load_model,
    open_clip,
    save_checkpoint,
)
from compo.prefetch import config_artifacts, prefetch

MODEL = "compo-tiny-clip"
REPO = Path(__file__).resolve().parents[1]


def _tiny_state(seed: int = 5) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return open_clip().create_model(MODEL).state_dict()


def _equal(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    mine = model.state_dict()
    return mine.keys() == state.keys() and all(torch.equal(mine[k], v) for k, v in state.items())


def test_open_clip_layout_from_a_local_file(tmp_path):
    state = _tiny_state()
    torch.save(state, tmp_path / "weights.pt")
    model, name = create_base({"model": MODEL, "init": "released", "weights": str(tmp_path / "weights.pt")})
    assert name == MODEL and _equal(model, state)


def test_an_open_clip_train_checkpoint_with_module_prefixes(tmp_path):
    """open_clip_train (and the seeds' forks) save {epoch, name, state_dict, optimizer}, keys prefixed
    `module.` under DistributedDataParallel."""
    state = _tiny_state()
    checkpoint = {"epoch": 5, "name": "fsc-clip-coco", "state_dict": {f"module.{k}": v for k, v in state.items()},
                  "optimizer": {"state": {}, "param_groups": [{"lr": 5e-6}]}}
    torch.save(checkpoint, tmp_path / "epoch_5.pt")
    model, _ = create_base({"model": MODEL, "init": "released", "weights": str(tmp_path / "epoch_5.pt")})
    assert _equal(model, state)


@pytest.mark.slow
def test_degla_released_layout_loads_as_configured(tmp_path):
    """config/released.yaml's DeGLA base read from a checkpoint made here in its release's layout (the real file
    cannot be downloaded here): its training code's {epoch, name, state_dict, optimizer, scaler} with every key of
    OpenAI's QuickGELU ViT-B/32 prefixed `module.` (DistributedDataParallel)."""
    config = load_config(REPO / "config" / "paper.yaml", REPO / "config" / "released.yaml")
    base = config["bases"]["degla-released"]
    assert base["model"] == "ViT-B-32-quickgelu" and "degla-released" in config["study"]["bases"]
    assert "siglip" in config["study"]["bases"] and config["bases"]["siglip"]["model"] == "ViT-B-16-SigLIP"
    torch.manual_seed(3)
    state = open_clip().create_model(base["model"]).state_dict()
    checkpoint = {"epoch": 5, "name": "DeGLA", "state_dict": {f"module.{k}": v for k, v in state.items()},
                  "optimizer": {"state": {}, "param_groups": [{"lr": 1e-6}]}, "scaler": {"scale": 65536.0}}
    torch.save(checkpoint, tmp_path / "degla.pt")
    model, name = create_base({**base, "weights": str(tmp_path / "degla.pt")}, name="degla-released")
    assert name == "ViT-B-32-quickgelu" and _equal(model, state)


def _longclip_checkpoint(state: dict[str, torch.Tensor], context: int) -> dict[str, torch.Tensor]:
    """The tiny model's weights as Long-CLIP's own model saves them: two [context, D] text position tables
    (the first 20 rows used from one, the rest from the other) and OpenAI's extra entries."""
    width = state["positional_embedding"].shape[1]
    generator = torch.Generator().manual_seed(1)
    saved = {k: v for k, v in state.items() if k != "positional_embedding"}
    saved["positional_embedding"] = torch.randn(context, width, generator=generator)
    saved["positional_embedding_res"] = torch.randn(context, width, generator=generator)
    saved["context_length"] = torch.tensor(context)
    return saved


def test_a_longclip_checkpoint_becomes_an_open_clip_model_with_its_context(tmp_path):
    saved = _longclip_checkpoint(_tiny_state(), 248)
    torch.save(saved, tmp_path / "longclip-B.pt")
    model, name = create_base({"model": MODEL, "init": "released", "weights": str(tmp_path / "longclip-B.pt"),
                               "format": "longclip"})
    assert name == f"{MODEL}-ctx248"
    expected = torch.cat([saved["positional_embedding"][:LONGCLIP_KEEP],
                          saved["positional_embedding_res"][LONGCLIP_KEEP:]])
    assert torch.equal(model.positional_embedding, expected)
    assert torch.equal(model.visual.conv1.weight, saved["visual.conv1.weight"])
    tokens = get_tokenizer(name)(["a " * 150 + "red cube"])
    assert tokens.shape == (1, 248) and model.encode_text(tokens).shape[0] == 1  # a text past 77 tokens
    # exported as any model: plain open_clip loads it back under its derived config
    save_checkpoint(model, name, tmp_path / "folder")
    loaded = load_model(tmp_path / "folder")
    assert loaded.model_name == name and torch.equal(loaded.model.positional_embedding, expected)


# The parameters Long-CLIP's model_longclip.convert_weights makes float16 before training (Conv/Linear weights and
# biases, attention projections, text_projection, visual.proj); LayerNorms, embeddings and logit_scale stay float32
HALF = (".conv1.weight", ".in_proj_weight", ".in_proj_bias", ".out_proj.weight", ".out_proj.bias", ".c_fc.weight",
        ".c_fc.bias", ".c_proj.weight", ".c_proj.bias")


@pytest.mark.slow
def test_longclip_b_released_layout_loads_as_configured(tmp_path):
    """config/released.yaml's LongCLIP-B read from a checkpoint made here in its release's layout (the file cannot
    be downloaded here): Long-CLIP's train/train.py saves `self.model.module.state_dict()` (line 277: no `module.`
    prefix) of its model_longclip.CLIP over OpenAI's ViT-B/16: OpenAI's keys, `positional_embedding` and
    `positional_embedding_res` both [248, 512], the weights convert_weights halves in float16."""
    config = load_config(REPO / "config" / "paper.yaml", REPO / "config" / "released.yaml")
    base = config["bases"]["longclip-b"]
    assert (base["model"], base["format"], base["file"]) == ("ViT-B-16-quickgelu", "longclip", "longclip-B.pt")
    assert "longclip-b" in config["study"]["bases"]
    torch.manual_seed(4)
    state = open_clip().create_model(base["model"]).state_dict()
    saved = {k: (v.half() if k.endswith(HALF) or k in ("text_projection", "visual.proj") else v)
             for k, v in state.items() if k != "positional_embedding"}
    generator = torch.Generator().manual_seed(2)
    saved["positional_embedding"] = torch.randn(248, 512, generator=generator)
    saved["positional_embedding_res"] = torch.randn(248, 512, generator=generator)
    assert saved["visual.conv1.weight"].dtype == torch.float16 and saved["ln_final.weight"].dtype == torch.float32
    torch.save(saved, tmp_path / "longclip-B.pt")
    released = {k: v for k, v in base.items() if k not in ("hub", "file")}
    model, name = create_base({**released, "weights": str(tmp_path / "longclip-B.pt")}, name="longclip-b")
    assert name == "ViT-B-16-quickgelu-ctx248"
    expected = torch.cat([saved["positional_embedding"][:LONGCLIP_KEEP],
                          saved["positional_embedding_res"][LONGCLIP_KEEP:]])
    assert torch.equal(model.positional_embedding, expected)
    mine = model.state_dict()
    assert all(torch.equal(mine[k], v.float()) for k, v in saved.items() if k in mine and k != "positional_embedding")
    assert set(mine) - set(saved) == set() and set(saved) - set(mine) == {"positional_embedding_res"}
    tokens = get_tokenizer(name)(["a " * 150 + "red cube"])
    with torch.no_grad():
        assert tokens.shape == (1, 248) and model.encode_text(tokens).shape == (1, 512)


def test_a_file_that_is_not_longclip_is_named(tmp_path):
    torch.save(_tiny_state(), tmp_path / "plain.pt")
    with pytest.raises(ValueError, match=r"plain\.pt \(config key bases\.<name>\.weights\): not a Long-CLIP"):
        create_base({"model": MODEL, "init": "released", "weights": str(tmp_path / "plain.pt"), "format": "longclip"})


def test_a_hub_file_is_prefetched_and_exported_as_the_base(tmp_path):
    """bases.<name>.hub + file: the prefetch copies that file (from a folder laid out as the hub repository) into
    the cache, and the base's pretrain job exports exactly those weights, offline."""
    state = _tiny_state()
    repo = tmp_path / "shared" / "org" / "released"
    repo.mkdir(parents=True)
    torch.save({"epoch": 5, "state_dict": {f"module.{k}": v for k, v in state.items()}},
               repo / "coco_fsc-clip-ViT-B-32.pt")
    torch.save({"other": torch.zeros(1)}, repo / "cc3m_fsc-clip-ViT-B-32.pt")  # another file of the repository
    base = {"model": MODEL, "init": "released-coco", "hub": "org/released", "file": "coco_fsc-clip-ViT-B-32.pt"}
    config = {"bases": {"fsc": base}, "negatives": {}, "concreteness": {"norms": None}}
    assert [a.id for a in config_artifacts(config)] == ["open_clip:org/released/coco_fsc-clip-ViT-B-32.pt"]
    prefetch(config, tmp_path / "cache", source_dir=tmp_path / "shared", log=lambda line: None)
    run = subprocess.run([sys.executable, "-m", "compo", "train", "--recipe", json.dumps(base), "--seed", "0",
                          "--out", str(tmp_path / "base")], capture_output=True, text=True, check=False,
                         env={**os.environ, CACHE_ENV: str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    exported = torch.load(tmp_path / "base" / "checkpoint.pt", weights_only=True)
    assert exported.keys() == state.keys() and all(torch.equal(exported[k], v) for k, v in state.items())


def test_released_config_checks_and_names_its_weights():
    config = load_config(REPO / "config" / "paper.yaml", REPO / "config" / "released.yaml")
    assert "longclip-b" in config["study"]["bases"] and config["study"]["methods"] == []
    ids = {a.id for a in config_artifacts(config)}
    assert {"open_clip:ytaek-oh/fsc-clip/coco_fsc-clip-ViT-B-32.pt",
            "open_clip:BeichenZhang/LongCLIP-B/longclip-B.pt"} <= ids


@pytest.mark.parametrize(("base", "key"), [
    ({"model": MODEL, "init": "x", "file": "a.pt"}, "bases.b.file"),
    ({"model": MODEL, "init": "x", "weights": "/w.pt", "hub": "o/r"}, "bases.b.weights"),
    ({"model": MODEL, "init": "scratch", "format": "longclip", "dataset": "coco",
      "train": {"steps": 1, "batch_size": 2, "lr": 1e-3}}, "bases.b.init"),
])
def test_inconsistent_weights_keys_are_errors_naming_the_key(tmp_path, base, key):
    import yaml

    overlay = tmp_path / "bad.yaml"
    overlay.write_text(yaml.safe_dump({"bases": {"b": base}}))
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(REPO / "config" / "config.yaml", overlay)


def _bad(state: dict[str, torch.Tensor], how: str) -> dict[str, torch.Tensor]:
    keys = list(state)
    if how == "module-on-some":
        return {(f"module.{k}" if i % 2 else k): state[k] for i, k in enumerate(keys)}
    if how == "module-module-on-some":
        return {(f"module.module.{k}" if i == 0 else f"module.{k}"): state[k] for i, k in enumerate(keys)}
    if how == "wrong-shape":
        return {**state, "visual.conv1.weight": state["visual.conv1.weight"][:, :, :1]}
    if how == "lora-keys":
        return {**state, "visual.transformer.resblocks.0.attn.out_proj.lora_A": torch.zeros(4, 8),
                "visual.transformer.resblocks.0.attn.out_proj.lora_B": torch.zeros(8, 4)}
    assert how == "missing-key"
    return {k: v for k, v in state.items() if k != "text_projection"}


@pytest.mark.parametrize(("how", "named"), [
    ("module-on-some", r"different depths \(\d+ with 0 x 'module\.' \(e\.g\. .*\); \d+ with 1 x 'module\.'"),
    ("module-module-on-some", r"different depths \(\d+ with 1 x 'module\.' .*; 1 with 2 x 'module\.' "
                              r"\(e\.g\. module\.module\.\w"),
    ("wrong-shape", r"1 of another shape \(e\.g\. visual\.conv1\.weight \(\d+, 3, 1, \d+\) \(the model's: "),
    ("lora-keys", r"2 unexpected \(e\.g\. visual\.transformer\.resblocks\.0\.attn\.out_proj\.lora_A, .*2 unexpected "
                  r"keys are LoRA adapters: merge them"),
    ("missing-key", r"1 missing \(e\.g\. text_projection\)"),
])
def test_a_released_state_dict_that_does_not_fit_names_file_key_and_keys(tmp_path, how, named):
    """Issue 59: each of these ended in torch's RuntimeError naming no file or config key (or, `module.` on some
    keys, in open_clip's cutting 7 characters off every key). Now: the file, the base's config key, the first
    offending keys, before any weight is loaded."""
    torch.save({"epoch": 5, "state_dict": _bad(_tiny_state(), how)}, tmp_path / "epoch_5.pt")
    with pytest.raises(CheckpointError, match=rf"epoch_5\.pt \(config key bases\.fsc\.weights\): .*{named}"):
        create_base({"model": MODEL, "init": "released", "weights": str(tmp_path / "epoch_5.pt")}, name="fsc")


@pytest.mark.parametrize("depth", [2, 3])
def test_a_ddp_prefix_at_any_depth_is_stripped(tmp_path, depth):
    """A model saved from inside DDP twice wrapped (`module.module.`): open_clip strips one level and the load
    failed; the prefix on every key is stripped at any depth."""
    state = _tiny_state()
    torch.save({"state_dict": {"module." * depth + k: v for k, v in state.items()}}, tmp_path / "w.pt")
    model, _ = create_base({"model": MODEL, "init": "released", "weights": str(tmp_path / "w.pt")})
    assert _equal(model, state)


def test_the_pretrain_job_names_the_bases_config_key(tmp_path):
    """Through `python -m compo train` as the workflow runs a base's pretrain job: the name comes from its folder."""
    torch.save({"state_dict": _bad(_tiny_state(), "missing-key")}, tmp_path / "w.pt")
    base = {"model": MODEL, "init": "released", "weights": str(tmp_path / "w.pt")}
    out = tmp_path / "models" / "base-fsc-coco" / "pretrained" / "seed0"
    run = subprocess.run([sys.executable, "-m", "compo", "train", "--recipe", json.dumps(base), "--seed", "0",
                          "--out", str(out)], capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert "w.pt (config key bases.fsc-coco.weights): the state dict does not fit open_clip model " \
           "'compo-tiny-clip': 1 missing (e.g. text_projection)" in run.stderr, run.stderr[-2000:]
