"""Environment shims that must run before third-party imports.

The PyPI torchvision wheel is CUDA-linked (0.28.0 is 0.28.0+cu130: its `_C.so` needs libtorch_cuda.so);
on the CPU torch build its `_C` extension fails to load, so the `torchvision::nms`/`qnms` operators it
registers fake kernels for do not exist and `import torchvision` (hence `import open_clip`) raises.
scripts/setup-venv.sh installs the matching +cpu torchvision from PyTorch's CPU index, which PyPI does not
carry; where that index cannot be reached (a closed network with a PyPI mirror), the CUDA wheel arrives
and this shim stays needed. Declaring the two schemas first lets it import; the operators stay
unimplemented, and compo never calls them.

open_clip imports timm, whose `timm.utils` imports wandb whenever it is installed (for timm's own training
script's logging, which compo never calls): ~0.3 CPU-s of every job that imports open_clip (docs/ci-time.md).
It is imported with wandb hidden; compo.monitor imports wandb itself when `train.report_to` asks for it.

open_clip.hf_model imports transformers (~1.6 CPU-s) for one use: a text tower that is a Hugging Face model
(`text_cfg.hf_model_name`: roberta-ViT-B-32, nllb-clip-..., none of the seeds'). It is imported with transformers
hidden too, and the class that builds such a tower is replaced by one that imports open_clip.hf_model again, now
with transformers, at its first call: the same tower, built by the same code, paid for only by the jobs that build
one. SigLIP's tokenizer (open_clip's HFTokenizer) imports transformers itself when it is made.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

_TORCHVISION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None


def declare_torchvision_ops() -> None:
    global _library
    import torch

    if _library is not None or hasattr(torch.ops.torchvision, "nms"):
        return
    _library = torch.library.Library("torchvision", "DEF")
    for schema in _TORCHVISION_OPS:
        _library.define(schema)


@contextlib.contextmanager
def hidden_module(name: str) -> Iterator[None]:
    """In the block, `import name` raises ImportError (as if it were not installed), unless it is imported
    already; afterwards it imports as usual. Modules that import it optionally go without it."""
    if name in sys.modules:
        yield
        return
    sys.modules[name] = None  # type: ignore[assignment]  (the import system's "not importable" mark)
    try:
        yield
    finally:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


def import_open_clip() -> ModuleType:
    """Import open_clip (and torchvision) on CPU-only torch builds, without timm's optional wandb and without
    transformers until a Hugging Face text tower is built."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        declare_torchvision_ops()
    with hidden_module("wandb"), hidden_module("transformers"):
        module = importlib.import_module("open_clip")
    if module.hf_model.transformers is None:  # hidden (or not installed: the builder then says so itself)
        module.model.HFTextEncoder = _hf_text_encoder_importing_transformers(module)
    return module


def _hf_text_encoder_importing_transformers(open_clip: ModuleType) -> Any:
    """What open_clip.model builds a Hugging Face text tower with: at the first call, open_clip.hf_model
    imported again (transformers importable now) and its HFTextEncoder put back in open_clip.model."""

    def build(*args: Any, **kwargs: Any) -> Any:
        hf_model = importlib.reload(open_clip.hf_model)
        open_clip.model.HFTextEncoder = hf_model.HFTextEncoder
        return hf_model.HFTextEncoder(*args, **kwargs)

    return build
