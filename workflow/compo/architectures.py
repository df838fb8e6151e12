"""open_clip model configs by name, read without importing torch (the DAG build stays fast).

The configs open_clip ships (its package's `model_configs/` folder, found without importing it) and
compo's own (`compo/model_configs/`, registered after open_clip's: `compo.models.open_clip`), as open_clip
lists them: one JSON file per model, named after it. `weight_shapes` alone imports torch and open_clip.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

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


def text_context_length(name: str) -> int:
    """The number of text positions of model `name` (its text_cfg.context_length)."""
    return int(model_config(name).get("text_cfg", {}).get("context_length", DEFAULT_CONTEXT_LENGTH))


class _WithoutRandomInitWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "No pretrained weights loaded" not in record.getMessage()


@functools.cache
def weight_shapes(name: str) -> dict[str, tuple[int, ...]]:
    """The parameter names and shapes of open_clip model `name`, built on PyTorch's meta device: no
    memory, no weights, no download, ~0.1 s. It imports torch and open_clip (a few seconds), so only the
    checks that need the parameter names (LoRA targets) call it."""
    import torch

    from compo.models import open_clip

    quiet = _WithoutRandomInitWarning()
    logging.getLogger().addFilter(quiet)  # open_clip warns that no weights were loaded: none are wanted
    try:
        with torch.device("meta"):
            model = open_clip().create_model(name, device="meta")
    finally:
        logging.getLogger().removeFilter(quiet)
    return {parameter: tuple(value.shape) for parameter, value in model.named_parameters()}
