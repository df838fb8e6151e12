"""open_clip model configs by name, read without importing torch (the DAG build stays fast).

The configs open_clip ships (its package's `model_configs/` folder, found without importing it) and
compo's own (`compo/model_configs/`, registered after open_clip's: `compo.models.open_clip`), as open_clip
lists them: one JSON file per model, named after it. `weight_shapes` alone may import torch and open_clip
(once per model config and version: the result is cached).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from compo.compat import import_open_clip

COMPO_CONFIGS = Path(__file__).resolve().parent / "model_configs"
DEFAULT_CONTEXT_LENGTH = 77  # open_clip's text_cfg default


def _open_clip_configs() -> Path | None:
    spec = importlib.util.find_spec("open_clip")  # finds the package without importing it (and torch)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model_configs"


@functools.cache
def config_files() -> dict[str, Path]:
    """{model name: its config JSON}, open_clip's then compo's (a compo config of the same name wins)."""
    files: dict[str, Path] = {}
    for folder in (_open_clip_configs(), COMPO_CONFIGS):
        if folder is not None and folder.is_dir():
            files.update({path.stem: path for path in sorted(folder.glob("*.json"))})
    return files


def model_config(name: str) -> dict[str, Any]:
    return json.loads(config_files()[name].read_text())


def hf_tokenizer_of(config: dict[str, Any]) -> str | None:
    """The Hugging Face tokenizer an open_clip model config names (SigLIP's text_cfg.hf_tokenizer_name), or None."""
    return config.get("text_cfg", {}).get("hf_tokenizer_name") or None


def text_context_length(name: str) -> int:
    """The number of text positions of model `name` (its text_cfg.context_length)."""
    return int(model_config(name).get("text_cfg", {}).get("context_length", DEFAULT_CONTEXT_LENGTH))


class _WithoutRandomInitWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "No pretrained weights loaded" not in record.getMessage()


@functools.cache
def weight_shapes(name: str) -> dict[str, tuple[int, ...]]:
    """The parameter names and shapes of open_clip model `name`, from the cache (`CACHE`, keyed by the
    config's text and the open_clip and torch versions: what decides the names) or built on PyTorch's meta
    device: no memory, no weights, no download, ~0.1 s, but importing torch and open_clip takes seconds, so
    the result is cached and only the checks that need the names (LoRA targets) call this."""
    versions = [_version(package) for package in ("open_clip_torch", "torch")]
    key = hashlib.sha256(json.dumps([name, config_files()[name].read_text(), versions]).encode()).hexdigest()
    cached = _cache_dir() / f"{name}-{key[:16]}.json"
    try:
        return {parameter: tuple(shape) for parameter, shape in json.loads(cached.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        pass
    shapes = _meta_model_shapes(name)
    try:  # a cache that cannot be written only costs the next run the import
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cached.parent, delete=False, suffix=".tmp") as handle:
            json.dump(shapes, handle)
        os.replace(handle.name, cached)
    except OSError:
        pass
    return shapes


def _cache_dir() -> Path:
    """Where weight_shapes keeps what it built: $XDG_CACHE_HOME/compo-study (default ~/.cache/compo-study)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compo-study" / "weight-shapes"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


_open_clip = None


def open_clip():  # noqa: ANN201 - the module
    """open_clip with compo's model configs registered (imported once: a plain global read afterwards, which
    torch.compile traces through without a graph break). Here, beside the configs' folder, so that compo.models
    (which re-exports it) and this module do not import each other."""
    global _open_clip
    if _open_clip is None:
        module = import_open_clip()
        module.add_model_config(COMPO_CONFIGS)
        _open_clip = module
    return _open_clip


def _meta_model_shapes(name: str) -> dict[str, tuple[int, ...]]:
    import torch

    quiet = _WithoutRandomInitWarning()
    root = logging.getLogger()
    root.addFilter(quiet)  # open_clip warns that no weights were loaded: none are wanted
    # open_clip logs through the root logger's functions (logging.info), which add a handler to a root logger that
    # has none (logging.basicConfig): Snakemake's own messages, which propagate to the root, then print twice
    handlers = list(root.handlers)
    offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # a Hugging Face text tower's config: from the cache or not at all
    try:
        with torch.device("meta"):
            model = open_clip().create_model(name, device="meta")
    finally:
        root.removeFilter(quiet)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        if offline is None:
            os.environ.pop("HF_HUB_OFFLINE")
        else:
            os.environ["HF_HUB_OFFLINE"] = offline
    return {parameter: tuple(value.shape) for parameter, value in model.named_parameters()}
