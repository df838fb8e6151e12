"""What gradient accumulation (`train.accum_freq`, compo.accumulate) saves and costs on one training step.

For a model (random initial weights), a loss (infonce or negclip with k random hard negatives) and a batch of
synthetic images and captions, one step at each accum_freq: the largest total of tensors autograd holds for the
backward at once (the activations: what accumulation divides), the step's wall time (median of --repeats), and on
a GPU its peak allocated memory. The gradients are checked against accum_freq 1 (max relative difference).

    python tools/bench_accumulate.py --model compo-tiny-vit-clip --batch 32 --accum 1 2 4 \
        [--loss negclip --k 2] [--precision amp_bf16] [--device cpu] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from compo.accumulate import accumulated_step
from compo.devices import autocast, resolve_device
from compo.losses import TOTAL, get_loss
from compo.models import create_model, get_tokenizer

WORDS = ["red", "blue", "circle", "square", "above", "below", "a", "the", "large", "small", "dog", "grass"]


def synthetic_batch(model: torch.nn.Module, name: str, n: int, k: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """n random images at the model's size and n random 12-word captions (k shuffled ones as negatives)."""
    generator = torch.Generator().manual_seed(seed)
    size = model.visual.image_size
    size = size if isinstance(size, tuple) else (size, size)
    tokenizer = get_tokenizer(name)

    def captions(count: int) -> list[str]:
        picks = torch.randint(len(WORDS), (count, 12), generator=generator)
        return [" ".join(WORDS[i] for i in row) for row in picks.tolist()]

    batch = {"images": torch.randn(n, 3, *size, generator=generator), "texts": tokenizer(captions(n))}
    if k:
        batch["negatives"] = tokenizer(captions(n * k)).view(n, k, -1)
        batch["negative_mask"] = torch.ones(n, k, dtype=torch.bool)
    return batch


def one_step(model, loss, batch, parts, device, precision):  # noqa: ANN001, ANN201
    """(activation bytes held at most, seconds, gradients) of one step in `parts` micro-batches."""
    split = {key: torch.tensor_split(value.to(device), parts) for key, value in batch.items()}
    micro = [{key: chunks[i] for key, chunks in split.items()} for i in range(parts)]
    held, peak, seen = [0], [0], {p.data_ptr() for p in model.parameters()}  # weights themselves: no new memory

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.data_ptr() not in seen:  # each storage once (a tensor saved by several ops)
            seen.add(tensor.data_ptr())
            held[0] += tensor.numel() * tensor.element_size()
            peak[0] = max(peak[0], held[0])
        return tensor

    def forward(part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with autocast(device, precision):
            return loss(model, part)

    def backward(total: torch.Tensor) -> None:
        total.backward()
        held[0] = 0  # the backward freed the graph
        seen.clear()
        seen.update(p.data_ptr() for p in model.parameters())

    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        accumulated_step(forward, micro, model, backward, TOTAL)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return peak[0], time.perf_counter() - began, {n: p.grad.clone() for n, p in model.named_parameters()
                                                  if p.grad is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="compo-tiny-vit-clip")
    parser.add_argument("--loss", default="negclip", choices=["infonce", "negclip"])
    parser.add_argument("--k", type=int, default=2, help="hard negatives per caption (negclip)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--accum", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = resolve_device(args.device)
    model = create_model(args.model, "scratch", seed=0).to(device).train()
    loss = get_loss(args.loss).build({})
    batch = synthetic_batch(model, args.model, args.batch, args.k if args.loss == "negclip" else 0)
    reference = None
    print(f"{args.model} {args.loss} batch {args.batch} {args.precision} on {device}")
    for parts in args.accum:
        runs = []
        for _ in range(args.repeats):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            runs.append(one_step(model, loss, batch, parts, device, args.precision))
        held, _, grads = runs[-1]
        seconds = statistics.median(r[1] for r in runs)
        reference = reference or (seconds, grads)
        worst, where = max((float((grads[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)), n)
                           for n, g in reference[1].items())
        gpu = f", GPU peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.type == "cuda" else ""
        print(f"accum_freq {parts}: activations held {held / 2**20:8.1f} MiB, {seconds:.3f} s "
              f"(x{seconds / reference[0]:.2f}){gpu}; gradients vs the first: max relative {worst:.1e} ({where})")


if __name__ == "__main__":
    main()
