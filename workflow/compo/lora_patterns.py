"""Which weights a LoRA recipe adapts: glob patterns over parameter names, matched on their shapes alone.

Torch-free, so the DAG build's check of every method's `lora.targets` (compo.config.check_lora_targets, on the
cached names of compo.architectures.weight_shapes) imports no torch; compo.adapt applies the adapters.
"""

from __future__ import annotations

import fnmatch

DEFAULT_LORA_TARGETS = ("*attn.in_proj_weight", "*attn.out_proj.weight", "*mlp.c_fc.weight", "*mlp.c_proj.weight")


def lora_matches(shapes: dict[str, tuple[int, ...]], patterns: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """{pattern: the weight matrices and square convolution kernels it matches}, from a model's parameter
    shapes (in the model's order)."""
    names = [name for name, shape in shapes.items() if len(shape) == 2 or (len(shape) == 4 and shape[2] == shape[3])]
    return {pattern: [n for n in names if fnmatch.fnmatchcase(n, pattern)] for pattern in patterns}
