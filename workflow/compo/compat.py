"""Environment shims that must run before third-party imports.

The PyPI torchvision wheel is CUDA-linked (0.28.0 is 0.28.0+cu130: its `_C.so` needs libtorch_cuda.so);
on the CPU torch build its `_C` extension fails to load, so the `torchvision::nms`/`qnms` operators it
registers fake kernels for do not exist and `import torchvision` (hence `import open_clip`) raises.
scripts/setup-venv.sh installs the matching +cpu torchvision from PyTorch's CPU index, which PyPI does not
carry; where that index cannot be reached (a closed network with a PyPI mirror), the CUDA wheel arrives
and this shim stays needed. Declaring the two schemas first lets it import; the operators stay
unimplemented, and compo never calls them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

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


def import_open_clip() -> ModuleType:
    """Import open_clip (and torchvision) on CPU-only torch builds."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        import sys

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        declare_torchvision_ops()
    return importlib.import_module("open_clip")
