"""Measuring the saved activations the GPU memory model (compo.memory) is built from (issue 42).

A tower's forward pass with autograd on keeps tensors for its backward pass ("saved tensors"); their bytes,
beyond the weights, are what a training step's activation memory is. `torch.autograd.graph.saved_tensors_hooks`
sees every tensor as it is saved: each distinct storage is counted once (an op's output saved again as the next
op's input is one tensor), parameters are left out, and the autocast copies of the weights are the same at every
batch size, so the slope between two batch sizes is the bytes per sample (image tower) or per text (text tower).

Gradient checkpointing (open_clip's and timm's `set_grad_checkpointing`: each residual block under
`torch.utils.checkpoint`, non-reentrant) keeps, instead of a block's saved tensors, only its input, and during
the backward pass recomputes one block at a time. So, from the same measured run, without running it twice:

    checkpointed = saved outside the blocks + sum of the blocks' inputs + the largest block's saved tensors

(each term measured by hooks on the blocks). `peak_bytes` checks both against the whole forward and backward
pass's allocation peak (the profiler's events): on the tiny ViT tower, per sample, 1.20 MB against 1.15 MB
saved, and checkpointed 0.39 MB against 0.41 MB derived (tests/test_memory.py). The figures are taken on the
CPU with random weights; on a GPU the fused attention kernels keep no attention matrix, so the CPU figures are
upper bounds there.

    PYTHONPATH=tools python -m compo_tools.calibrate_memory [--models ViT-B-32-quickgelu ViT-B-16-SigLIP] \
        [--precision amp fp32]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from compo.models import create_model


@dataclass(frozen=True)
class Saved:
    """Saved-tensor bytes of one forward pass: all, those saved inside the residual blocks (largest block), and
    the blocks' inputs (what a checkpointed block keeps)."""

    total: int
    in_blocks: int
    largest_block: int
    block_inputs: int

    @property
    def checkpointed(self) -> int:
        return self.total - self.in_blocks + self.block_inputs + self.largest_block


def _blocks(tower: nn.Module) -> list[nn.Module]:
    """The residual blocks a tower checkpoints: open_clip's `resblocks`, timm's `blocks` (the longest list)."""
    lists = [m for name, m in tower.named_modules() if isinstance(m, nn.ModuleList | nn.Sequential)
             and name.split(".")[-1] in ("resblocks", "blocks")]
    if not lists:
        raise ValueError(f"{type(tower).__name__}: no `resblocks` / `blocks` list of residual blocks found")
    return list(max(lists, key=len))


@contextlib.contextmanager
def _counting(excluded: set[int], blocks: list[nn.Module]) -> Iterator[dict[str, Any]]:
    """Count the distinct storages saved for backward (not those at `excluded` addresses: the weights), and
    which block saved each."""
    counts: dict[str, Any] = {"seen": {}, "per_block": {}, "inputs": 0, "block": None, "keep": []}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in excluded and key not in counts["seen"]:
            counts["seen"][key] = storage.nbytes()
            if counts["block"] is not None:
                counts["per_block"][counts["block"]] = counts["per_block"].get(counts["block"], 0) + storage.nbytes()
        counts["keep"].append(tensor)  # a freed storage's address could be reused and miscounted
        return tensor

    def enter(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            counts["block"] = index
            counts["inputs"] += args[0].untyped_storage().nbytes() if args else 0
        return hook

    def leave(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        counts["block"] = None

    handles = [h for i, b in enumerate(blocks) for h in (b.register_forward_pre_hook(enter(i)),
                                                         b.register_forward_hook(leave))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield counts
    finally:
        for handle in handles:
            handle.remove()


def measure(model: nn.Module, tower: str, inputs: torch.Tensor, precision: str) -> Saved:
    """Saved-tensor bytes of one forward pass of `tower` ("image" or "text") of `model` over `inputs`, under
    `precision` ("amp": bfloat16 autocast on the CPU, the same bytes as float16; "fp32")."""
    blocks = _blocks(model.visual if tower == "image" else model.text if hasattr(model, "text") else model.transformer)
    encode = model.encode_image if tower == "image" else model.encode_text
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32")
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with _counting(parameters, blocks) as counts, autocast:
        out = encode(inputs)
    del out
    per_block = counts["per_block"].values()
    return Saved(sum(counts["seen"].values()), sum(per_block), max(per_block, default=0), counts["inputs"])


def peak_bytes(model: nn.Module, tower: str, inputs: torch.Tensor, precision: str, checkpointing: bool) -> int:
    """The peak of the bytes allocated during one forward and backward pass of `tower` over `inputs` (the
    profiler's allocation and free events, in time order; what was allocated before, the weights, is 0): what
    the saved-tensor figures stand for, measured as a whole, to check them and the checkpointed derivation."""
    from torch.profiler import ProfilerActivity, profile

    model.set_grad_checkpointing(checkpointing)
    encode = model.encode_image if tower == "image" else model.encode_text
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
                out = encode(inputs)
            out.float().sum().backward()
    finally:
        model.set_grad_checkpointing(False)
        model.zero_grad(set_to_none=True)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def text_tokens(model: nn.Module, batch: int, width: int) -> torch.Tensor:
    """Random token ids [batch, width], every position a real token, the end token (the largest id, where a
    causal tower pools) last: the worst case of a batch whose longest text fills `width`."""
    vocab = model.vocab_size if hasattr(model, "vocab_size") else model.text.vocab_size
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, vocab - 1, (batch, width), generator=generator)
    tokens[:, -1] = vocab - 1
    return tokens


def slopes(model: nn.Module, precision: str, batches: tuple[int, int] = (2, 4),
           widths: tuple[int, ...] = ()) -> dict[str, float]:
    """Bytes per image sample and per text token (at each width), plain and checkpointed: the difference of
    two batch sizes' saved bytes over the difference of the batches."""
    size = model.visual.image_size
    size = size if isinstance(size, int) else size[0]
    out: dict[str, float] = {}
    small, large = batches
    images = [measure(model, "image", torch.randn(b, 3, size, size), precision) for b in batches]
    out["image"] = (images[1].total - images[0].total) / (large - small)
    out["image_ckpt"] = (images[1].checkpointed - images[0].checkpointed) / (large - small)
    context = model.context_length if hasattr(model, "context_length") else model.text.context_length
    for width in widths or (context,):
        texts = [measure(model, "text", text_tokens(model, b, width), precision) for b in batches]
        out[f"text@{width}"] = (texts[1].total - texts[0].total) / (large - small) / width
        out[f"text_ckpt@{width}"] = (texts[1].checkpointed - texts[0].checkpointed) / (large - small) / width
    return out


def xac_pair_bytes(patches: int, width: int, precision: str, sizes: tuple[tuple[int, int], ...] = ((4, 16), (4, 32))
                   ) -> float:
    """Saved bytes per (image, phrase) pair of C2LIP's XAC loss (compo.losses.c2lip.xac_loss), `patches` tokens
    of `width` per image: the images fixed and the phrases doubled, so what is per image (the patches' autocast
    copy) stays out of the slope; what is per phrase (3 KB) stays in, spread over the 4 images (an upper bound:
    at 768 images it is 4 bytes a pair)."""
    from compo.losses.c2lip import xac_loss

    measured = []
    for n_images, n_phrases in sizes:
        tokens = torch.randn(n_images, patches, width, requires_grad=True)
        phrases = torch.nn.functional.normalize(torch.randn(n_phrases, width), dim=-1).requires_grad_()
        owner = torch.arange(n_phrases) % n_images
        scale, bias = torch.tensor(10.0, requires_grad=True), torch.tensor(-10.0, requires_grad=True)
        leaves = {t.untyped_storage().data_ptr() for t in (tokens, phrases, scale, bias)}
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32")
        with _counting(leaves, []) as counts, autocast:
            xac_loss(tokens, phrases, owner, scale, bias)
        measured.append(sum(counts["seen"].values()))
    (n0, m0), (n1, m1) = sizes
    return (measured[1] - measured[0]) / (n1 * m1 - n0 * m0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ViT-B-32-quickgelu", "ViT-B-16-SigLIP"])
    parser.add_argument("--precision", nargs="+", default=["amp", "fp32"])
    parser.add_argument("--widths", nargs="*", type=int, default=[], help="text widths (default: the context)")
    args = parser.parse_args()
    for name in args.models:
        model = create_model(name)
        params = sum(p.numel() for p in model.parameters())
        print(f"{name}: {params:,} parameters")
        for precision in args.precision:
            figures = slopes(model, precision, widths=tuple(args.widths))
            print(f"  {precision}: " + ", ".join(f"{key} {value / 1e6:.4f} MB" for key, value in figures.items()))
    for precision in args.precision:
        print(f"xac ({precision}, 196 patches x 768): {xac_pair_bytes(196, 768, precision):.0f} bytes per pair")


if __name__ == "__main__":
    main()
