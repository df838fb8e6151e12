"""External models: the config's list, `compo prefetch --from` laying out the cache, and jobs resolving every
artifact from it with no network (sockets refused), the tokenizer and the weights' preprocessing included."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from artifact_fixtures import build_tiny_lm, build_tiny_open_clip

from compo.artifacts import CACHE_ENV, MANIFEST, OFFLINE_ENV, ArtifactMissing, resolve
from compo.config import load_config
from compo.llm import LLMSettings, vllm_engine_args
from compo.models import (
    create_model,
    get_tokenizer,
    image_transform,
    load_model,
    model_config,
    register_model_config,
    save_checkpoint,
    tag_preprocess,
)
from compo.prefetch import config_artifacts, prefetch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every socket connection and name lookup fails (and is recorded): what an offline GPU node does."""
    attempts: list[str] = []

    def refuse(*args, **kwargs):
        attempts.append(repr(args[:2]))
        raise OSError("network access refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def test_the_paper_config_needs_these_models() -> None:
    found = {a.id: a.keys for a in config_artifacts(load_config(REPO / "config" / "paper.yaml"))}
    assert found == {
        "open_clip:timm/vit_base_patch32_clip_224.openai": ("bases.clip.init",),
        "open_clip:timm/ViT-B-16-SigLIP": ("bases.siglip.init",),
        "tokenizer:timm/ViT-B-16-SigLIP": ("bases.siglip.model",),
        "llm:meta-llama/Llama-3.1-8B-Instruct": ("negatives.degla-llm.model",),
        "llm:Qwen/Qwen3-32B": ("negatives.concrete-hc.model", "negatives.concrete-lc.model",
                               "negatives.concrete-wo.model"),
        "diffusion:stabilityai/sdxl-turbo": ("negatives.concrete-hc.images.model",
                                             "negatives.concrete-lc.images.model",
                                             "negatives.concrete-wo.images.model"),
        # data released on the hub (issues 46, 47; tests/test_prefetch_data.py)
        "dataset:ytaek-oh/cc3m-subset-100k": ("datasets.cc3m-100k.hub",),
        "dataset:ytaek-oh/laioncoco-subset-100k": ("datasets.laion-coco-100k.hub",),
        "dataset:wjpoom/SPEC": ("benchmarks.spec.hub",),
        "dataset:MichiganNLP/svo_probes": ("benchmarks.svo_probes.hub",),
        "dataset:Intel/COCO-Counterfactuals": ("benchmarks.coco_counterfactuals.hub",),
        "dataset:wsdwJohn1231/DeGLA": ("negatives.degla-released.hub",),
        # issue 58: Winoground, Urban1k and CLIP_benchmark's zero-shot test sets (tests/test_prefetch_benchmarks.py)
        "dataset:facebook/winoground": ("benchmarks.winoground.hub",),
        "dataset:BeichenZhang/Urban1k": ("benchmarks.urban1k.hub",),
        **{f"dataset:clip-benchmark/wds_{repo}": (f"benchmarks.{name}.hub",) for name, repo in (
            ("imagenet", "imagenet1k"), ("cifar10", "vtab-cifar10"), ("cifar100", "vtab-cifar100"),
            ("food101", "food101"), ("pets", "vtab-pets"), ("flowers", "vtab-flowers"), ("cars", "cars"),
            ("dtd", "vtab-dtd"), ("fgvc_aircraft", "fgvc_aircraft"))},
    }


def test_the_embedded_default_needs_none() -> None:
    assert config_artifacts(load_config(REPO / "config" / "config.yaml")) == []


def tiny_tokenizer(folder: Path) -> int:
    """A word-level Hugging Face tokenizer saved in `folder`; returns its vocabulary size."""
    build_tiny_lm(folder, ["a", "red", "cube", "blue", "ball", "."])
    for weights in folder.glob("model.safetensors"):
        weights.unlink()  # a tokenizer repository: no model weights
    return len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """The models as a cluster's shared model folder holds them: <org>/<name>/ each."""
    root = tmp_path / "shared-models"
    build_tiny_open_clip(root / "compo-test" / "tiny-clip", "compo-tiny-clip", seed=3)
    build_tiny_lm(root / "compo-test" / "tiny-lm", ["a", "red", "cube"])
    tiny_tokenizer(root / "compo-test" / "tiny-tokenizer")
    return root


def tiny_config(tmp_path: Path) -> dict:
    return {
        "bases": {"clip": {"model": "compo-tiny-clip", "init": "tiny", "hub": "compo-test/tiny-clip"}},
        "negatives": {"llm": {"generator": "degla-llm", "backend": "transformers", "model": "compo-test/tiny-lm"},
                      "swap": {"generator": "negclip-swap"}},
        "concreteness": {"norms": None},
    }


def test_prefetch_from_a_folder_then_every_job_resolves_offline(tmp_path, source, no_network, monkeypatch) -> None:
    cache = tmp_path / "cache"
    config = tiny_config(tmp_path)
    manifest = prefetch(config, cache, source_dir=source, log=lambda line: None)
    assert set(manifest["artifacts"]) == {"open_clip:compo-test/tiny-clip", "llm:compo-test/tiny-lm"}
    recorded = json.loads((cache / MANIFEST).read_text())["artifacts"]["llm:compo-test/tiny-lm"]
    assert recorded["keys"] == ["negatives.llm.model"] and recorded["bytes"] > 0
    assert "model.safetensors" in recorded["files"] and not Path(recorded["path"]).is_absolute()

    monkeypatch.setenv(CACHE_ENV, str(cache))
    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    weights = resolve("open_clip", "compo-test/tiny-clip")
    assert weights.name == "open_clip_model.safetensors" and weights.is_relative_to(cache)
    model = create_model("compo-tiny-clip", "tiny", seed=0, hub="compo-test/tiny-clip")
    expected = build_tiny_open_clip(tmp_path / "again", "compo-tiny-clip", seed=3)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())  # the prefetched weights
    from compo.llm.backends import load_backend

    backend = load_backend(LLMSettings.from_options(model="compo-test/tiny-lm", backend="transformers",
                                                    device="cpu"))
    assert backend.generate(["a red cube"], 1, 2, 0.0, [0])  # the cached LM generates
    assert no_network == []  # nothing reached for the network

    # a second prefetch keeps what is there; an artifact missing from the cache names itself and the command
    assert prefetch(config, cache, source_dir=tmp_path / "nowhere", log=lambda line: None) == manifest
    with pytest.raises(ArtifactMissing, match=r"llm:org/absent is not in the model cache .*compo prefetch"):
        resolve("llm", "org/absent")
    monkeypatch.delenv(CACHE_ENV)
    with pytest.raises(ArtifactMissing, match="jobs never download"):
        resolve("llm", "compo-test/tiny-lm")


def test_a_pretrained_base_is_exported_from_the_cache(tmp_path, source, no_network, monkeypatch) -> None:
    """The pretrain job of a base given by pretrained weights: a recipe without `train` (0 steps) exports them
    (config/paper.yaml's bases are such recipes)."""
    from safetensors.torch import load_file

    prefetch(tiny_config(tmp_path), tmp_path / "cache", source_dir=source, log=lambda line: None)
    recipe = {"model": "compo-tiny-clip", "init": "tiny", "hub": "compo-test/tiny-clip"}
    run = subprocess.run([sys.executable, "-m", "compo", "train", "--recipe", json.dumps(recipe), "--seed", "0",
                          "--out", str(tmp_path / "base")], capture_output=True, text=True, check=False,
                         env={**os.environ, CACHE_ENV: str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-2000:]
    exported = torch.load(tmp_path / "base" / "checkpoint.pt", weights_only=True)
    weights = load_file(str(source / "compo-test" / "tiny-clip" / "open_clip_model.safetensors"))
    assert all(torch.equal(exported[k], v) for k, v in weights.items())


def test_prefetch_names_a_folder_without_the_files_it_needs(tmp_path, source) -> None:
    (source / "compo-test" / "tiny-clip" / "open_clip_model.safetensors").unlink()
    with pytest.raises(ArtifactMissing, match=r"open_clip:compo-test/tiny-clip: .*holds none of the files"):
        prefetch(tiny_config(tmp_path), tmp_path / "cache", source_dir=source, log=lambda line: None)


def test_a_huggingface_tokenizer_comes_from_the_cache(tmp_path, source, no_network, monkeypatch) -> None:
    """SigLIP's tokenizer is a Hugging Face one (text_cfg.hf_tokenizer_name): read from the cache, never fetched."""
    vocab = len(json.loads((source / "compo-test" / "tiny-tokenizer" / "tokenizer.json").read_text())["model"]["vocab"])
    config = copy.deepcopy(model_config("compo-tiny-sigmoid"))
    config["text_cfg"].update(hf_tokenizer_name="compo-test/tiny-tokenizer", vocab_size=vocab)
    register_model_config("compo-test-hf-tokenizer", config)
    needs = {"bases": {"b": {"model": "compo-test-hf-tokenizer", "init": "t", "hub": "compo-test/tiny-clip"}}}
    assert [a.id for a in config_artifacts(needs)] == ["open_clip:compo-test/tiny-clip",
                                                       "tokenizer:compo-test/tiny-tokenizer"]
    cache = tmp_path / "cache"
    prefetch(needs, cache, source_dir=source, log=lambda line: None)
    monkeypatch.setenv(CACHE_ENV, str(cache))
    tokens = get_tokenizer("compo-test-hf-tokenizer")(["a red cube"])
    assert tokens.shape == (1, config["text_cfg"]["context_length"]) and int(tokens.max()) < vocab
    assert no_network == []


def test_the_weights_image_preprocessing_is_kept(tmp_path) -> None:
    """SigLIP's WebLI weights expect mean and std 0.5 and a squashed resize, not CLIP's defaults: create_model
    takes them from the tag, model.json keeps them, and load_model and image_transform use them."""
    siglip = tag_preprocess("ViT-B-16-SigLIP", "webli")
    assert siglip["mean"] == (0.5, 0.5, 0.5) and siglip["resize_mode"] == "squash"
    model = create_model("compo-tiny-sigmoid")
    model.visual.preprocess_cfg = {**model.visual.preprocess_cfg, **siglip}
    save_checkpoint(model, "compo-tiny-sigmoid", tmp_path / "m")
    assert json.loads((tmp_path / "m" / "model.json").read_text())["preprocess_cfg"]["std"] == [0.5, 0.5, 0.5]
    loaded = load_model(tmp_path / "m")
    normalize = image_transform(loaded.model).transforms[-1]
    assert list(normalize.mean) == [0.5, 0.5, 0.5] and list(normalize.std) == [0.5, 0.5, 0.5]
    assert "Resize(size=(64, 64)" in repr(image_transform(loaded.model))  # squash: no centre crop


def test_readmes_snippet_loads_a_checkpoint_with_plain_open_clip(tmp_path, monkeypatch) -> None:
    """README's "A model checkpoint loads with plain open_clip" block, run as written from the repository root
    (only the model folder replaced by one saved here): open_clip builds the model from model.json's name and
    preprocessing, and holds the checkpoint's weights. In this process open_clip is already imported (through
    compo.compat: a CPU torch beside PyPI's CUDA torchvision needs it); tests/test_envs.py's
    test_a_venv_from_setup_venv_imports_open_clip_and_runs_torchvision_ops checks the bare import."""
    readme = (REPO / "README.md").read_text()
    snippet = readme.split("A model checkpoint loads with plain open_clip:")[1].split("```python\n")[1].split("```")[0]
    folder = "results/models/negclip/coco/seed0"
    assert snippet.count(folder) == 2, snippet
    model = create_model("compo-tiny-sigmoid")
    model.visual.preprocess_cfg = {**model.visual.preprocess_cfg, **tag_preprocess("ViT-B-16-SigLIP", "webli")}
    save_checkpoint(model, "compo-tiny-sigmoid", tmp_path / "m")
    monkeypatch.chdir(REPO)  # the snippet names compo's model configs relative to the checkout
    namespace: dict = {}
    exec(snippet.replace(folder, str(tmp_path / "m")), namespace)
    loaded = namespace["model"]
    assert list(loaded.visual.preprocess_cfg["std"]) == [0.5, 0.5, 0.5]
    saved = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_a_registered_tag_gives_its_repository_and_preprocessing(tmp_path, source, no_network, monkeypatch) -> None:
    """A base named by an open_clip tag (no `hub`): the registry names the repository, and the tag's mean, std
    and resize travel with the model (open_clip applies them only when it downloads the weights itself)."""
    from compo.models import open_clip

    build_tiny_open_clip(source / "compo-test" / "tiny-sigmoid", "compo-tiny-sigmoid", seed=1)
    registry = open_clip().pretrained._PRETRAINED
    monkeypatch.setitem(registry, "compo-tiny-sigmoid", {"webli_test": {
        "hf_hub": "compo-test/tiny-sigmoid/", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
        "interpolation": "bicubic", "resize_mode": "squash"}})
    config = {"bases": {"siglip": {"model": "compo-tiny-sigmoid", "init": "webli_test"}}}
    assert [a.id for a in config_artifacts(config)] == ["open_clip:compo-test/tiny-sigmoid"]
    prefetch(config, tmp_path / "cache", source_dir=source, log=lambda line: None)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    model = create_model("compo-tiny-sigmoid", "webli_test")
    save_checkpoint(model, "compo-tiny-sigmoid", tmp_path / "base")
    normalize = image_transform(load_model(tmp_path / "base").model).transforms[-1]
    assert list(normalize.mean) == [0.5, 0.5, 0.5] and no_network == []


def test_vllm_engine_settings_are_checked_and_sized() -> None:
    assert vllm_engine_args(None) == {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9,
                                      "max_model_len": 2048, "dtype": "auto", "max_num_seqs": 256}
    settings = LLMSettings.from_options(model="Qwen/Qwen3-32B", vllm={"tensor_parallel_size": 2, "dtype": "bfloat16"})
    assert settings.engine_args["tensor_parallel_size"] == 2 and settings.gpus == 2
    assert settings.engine_args["dtype"] == "bfloat16" and settings.engine_args["max_num_seqs"] == 256
    for bad, message in (({"tensor_parallel": 2}, "vllm.tensor_parallel: unknown"),
                         ({"gpu_memory_utilization": 1.5}, "vllm.gpu_memory_utilization"),
                         ({"max_model_len": 0}, "vllm.max_model_len"), ({"dtype": "int8"}, "vllm.dtype")):
        with pytest.raises(ValueError, match=message):
            LLMSettings.from_options(model="m", vllm=bad)
    with pytest.raises(ValueError, match="backend vllm only"):
        LLMSettings.from_options(model="m", backend="transformers", vllm={"tensor_parallel_size": 2})


def test_compo_prefetch_lays_out_the_cache_from_a_folder(tmp_path, source) -> None:
    overlay = tmp_path / "models.yaml"
    overlay.write_text(json.dumps({"bases": {"clip": {"model": "compo-tiny-clip", "init": "tiny",
                                                      "hub": "compo-test/tiny-clip", "dataset": "pretrain",
                                                      "train": {"steps": 0, "warmup": 0}}}}))
    run = subprocess.run([sys.executable, "-m", "compo", "prefetch", "--configfile",
                          str(REPO / "config" / "config.yaml"), str(overlay), "--cache", str(tmp_path / "cache"),
                          "--from", str(source)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fetched  open_clip:compo-test/tiny-clip" in run.stdout and "1 artifacts" in run.stdout


def test_a_manifest_without_artifacts_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`KeyError: 'artifacts'` from a manifest of another shape."""
    (tmp_path / MANIFEST).write_text(json.dumps({"llm:org/m": {"path": "x"}}))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(ArtifactMissing, match=rf"^{tmp_path / MANIFEST}: expected a prefetch manifest .*no key "
                                              "artifacts; run compo prefetch"):
        resolve("llm", "org/m")
    (tmp_path / MANIFEST).write_text(json.dumps({"artifacts": {"llm:org/m": {"bytes": 3}}}))
    with pytest.raises(ArtifactMissing, match=r"artifact 'llm:org/m': expected an entry with a 'path'"):
        resolve("llm", "org/m")
