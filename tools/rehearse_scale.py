"""The paper study's jobs at their real size, before they are queued (issue 42 item 10): each training recipe
for a few steps at its real batch, micro-batch, text context, precision and model (random initial weights,
synthetic 224 px images and token ids), printing its peak GPU memory beside `compo.memory`'s prediction and its
samples/s beside `compo.plan`'s; with `--eval`, the evaluation's image encoding (images/s) and the ImageNet-size
linear probe's objective (memory and seconds), on synthetic data of their real size.

What a step holds is what the memory model counts: the towers' weights, gradients and AdamW state, and per
micro-batch the rows each loss puts through each tower (`compo.memory.rows_per_caption`: hard negatives,
Cement's negative images, C2LIP's noun phrases, ...), the features scored by one contrastive loss over the global
batch's rows. Loss-specific tensors (XAC's chunked pairs, the logits) are the small remainder. So a recipe that
fits here fits as its trainer runs it, up to those terms; the GPU figures replace the CPU-calibrated ones in
`compo.memory` and docs/paper-costs.md ("Training jobs' GPU memory").

    python tools/rehearse_scale.py --configfile config/paper.yaml --device cuda [--steps 20]
        [--methods clip-ft c2lip ...] [--eval] [--out rehearsal.csv]

Without a GPU (`--device cpu`) it runs the same code at `--batch-scale` of each batch (default 1/64 on the CPU)
and reports peak RSS growth: a check of the wiring and a CPU calibration, not a GPU figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

from compo.adapt import adapt_model
from compo.config import load_config, resolve_method
from compo.devices import autocast, grad_scaler, resolve_device
from compo.memory import CONTEXT, GIB, accum_freq, gpus, rows_per_caption, train_memory
from compo.models import create_model
from compo.plan import train_minutes
from compo.train import build_optimizer

COLUMNS = ["method", "model", "batch", "micro_batch", "accum_freq", "context", "precision", "device",
           "predicted_gb", "measured_gb", "samples_per_s", "planned_samples_per_s"]


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    # VmHWM: this address space's own peak (ru_maxrss may carry a parent's across fork and exec)
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))


def _reset_peak(device: torch.device) -> int:
    """The baseline the step's peak is measured from."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rehearse_recipe(config: dict[str, Any], method: str, device: torch.device, steps: int = 20,
                    batch_scale: float = 1.0) -> dict[str, Any]:
    """`steps` optimizer steps of `method`'s towers at its (scaled) batch; the peak memory and samples/s."""
    recipe = resolve_method(config, method)
    model_name = config["bases"][recipe["base"]]["model"]
    settings = config.get("train") or {}
    precision = str(settings.get("precision", "fp32"))
    hp = recipe["train"]
    batch = max(2, int(int(hp["batch_size"]) * batch_scale) // gpus(recipe))
    freq = min(accum_freq(recipe), batch)
    micro = max(1, batch // freq)
    images_per, texts_per = rows_per_caption(recipe)
    torch.manual_seed(0)
    baseline = _reset_peak(device)
    model, model_name_adapted = adapt_model(create_model(model_name, "scratch", 0), model_name, recipe)
    model = model.to(device).train()
    if settings.get("grad_checkpointing") or hp.get("grad_checkpointing"):
        model.set_grad_checkpointing(True)
    context = int((recipe.get("text") or {}).get("context_length") or CONTEXT.get(model_name, 77))
    size = model.visual.image_size
    size = size if isinstance(size, int) else size[0]
    vocab = model.token_embedding.num_embeddings if hasattr(model, "token_embedding") else 1000
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = build_optimizer(iter(trained), hp, fused=device.type == "cuda")
    scaler = grad_scaler(device, precision)
    n_images, n_texts = max(1, round(micro * images_per)), max(1, round(micro * texts_per))
    seconds, timed = 0.0, 0
    for step in range(steps):
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for _ in range(freq):
            images = torch.rand(n_images, 3, size, size, device=device)
            texts = torch.randint(1, vocab, (n_texts, context), device=device)
            with autocast(device, precision):
                image_features = F.normalize(model.encode_image(images), dim=-1)
                text_features = F.normalize(model.encode_text(texts), dim=-1)
                logits = model.logit_scale.exp() * image_features @ text_features.T
                targets = torch.arange(min(n_images, n_texts), device=device)
                loss = (F.cross_entropy(logits[: len(targets)].float(), targets)
                        + F.cross_entropy(logits.T[: len(targets)].float(), targets)) / 2 / freq
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= min(2, steps - 1):  # the first steps warm the allocator and kernels up
            seconds += time.perf_counter() - began
            timed += 1
    measured = (_peak_bytes(device) - baseline) / GIB
    predicted = train_memory({**recipe, "train": {**hp, "batch_size": batch * gpus(recipe)}}, model_name, settings)
    planned = train_minutes(recipe, model_name, "h200")
    planned_rate = None if not planned else int(hp["steps"]) * int(hp["batch_size"]) / (planned * 60)
    return {"method": method, "model": model_name_adapted, "batch": batch, "micro_batch": micro,
            "accum_freq": freq, "context": context, "precision": precision, "device": device.type,
            "predicted_gb": None if predicted is None else round(predicted.total, 2),
            "measured_gb": round(measured, 2),
            "samples_per_s": round(batch * timed / seconds, 1) if seconds else math.nan,
            "planned_samples_per_s": None if planned_rate is None else round(planned_rate, 1)}


def rehearse_evaluation(device: torch.device, model_name: str, images: int = 4096, batch: int = 256,
                        probe_rows: int = 1_281_167, classes: int = 1000, dim: int = 512,
                        chunk: int = 1 << 14) -> dict[str, Any]:
    """Image encoding images/s at the evaluation's batch (no gradients), and one evaluation of the chunked
    float64 probe objective on `probe_rows` features (ImageNet's train set by default): its peak and seconds."""
    from compo.evaluate.linear_probe import probe_objective

    model = create_model(model_name, "scratch", 0).to(device).eval()
    size = model.visual.image_size
    size = size if isinstance(size, int) else size[0]
    with torch.no_grad(), autocast(device, "amp" if device.type == "cuda" else "fp32"):
        model.encode_image(torch.rand(batch, 3, size, size, device=device))
        began = time.perf_counter()
        for _ in range(max(1, images // batch)):
            model.encode_image(torch.rand(batch, 3, size, size, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rate = max(1, images // batch) * batch / (time.perf_counter() - began)
    del model
    baseline = _reset_peak(device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    features = torch.randn(probe_rows, dim, generator=generator, dtype=torch.float64).to(device)
    labels = torch.randint(0, classes, (probe_rows,), generator=generator).to(device)
    weight = torch.zeros(dim, classes, dtype=torch.float64, device=device, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, device=device, requires_grad=True)
    began = time.perf_counter()
    probe_objective(features, labels, weight, bias, 1e-4, chunk)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"model": model_name, "device": device.type, "encode_images_per_s": round(rate, 1),
            "probe_rows": probe_rows, "probe_gb": round((_peak_bytes(device) - baseline) / GIB, 2),
            "probe_objective_s": round(time.perf_counter() - began, 2)}


def isolated(device: torch.device, function: Any, *args: Any) -> dict[str, Any]:
    """`function(*args)` in a forked child on the CPU (a fork is safe here: this script forks before torch has
    started threads), whose peak RSS starts at its RSS at the fork, so each recipe's figure is its own (a
    process's high-water mark only grows). On a GPU: in this process (the allocator's peak resets)."""
    if device.type == "cuda":
        return function(*args)
    read, write = os.pipe()
    if os.fork() == 0:
        try:
            os.write(write, json.dumps(function(*args)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        text = handle.read()
    os.wait()
    if not text:
        raise RuntimeError(f"{function.__name__} {args[1:2]}: the rehearsal's child process failed")
    return json.loads(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", default=["config/paper.yaml"])
    parser.add_argument("--methods", nargs="*", help="default: the study's methods")
    parser.add_argument("--device", default="cuda", help="cuda (the rehearsal) or cpu (wiring, CPU calibration)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-scale", type=float, default=None,
                        help="fraction of each batch (default 1 on a GPU, 1/64 on the CPU)")
    parser.add_argument("--eval", action="store_true", help="also the evaluation's encoding rate and the probe")
    parser.add_argument("--probe-rows", type=int, default=1_281_167)
    parser.add_argument("--out", default=None, help="write the training rows as CSV here")
    args = parser.parse_args(argv)
    config = load_config(*args.configfile)
    device = resolve_device(args.device, "--device")
    scale = args.batch_scale if args.batch_scale is not None else (1.0 if device.type == "cuda" else 1 / 64)
    rows = []
    for method in args.methods or config["study"]["methods"]:
        row = isolated(device, rehearse_recipe, config, method, device, args.steps, scale)
        rows.append(row)
        print(", ".join(f"{key}={row[key]}" for key in COLUMNS), flush=True)
    if args.out:
        with open(args.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    if args.eval:
        for model_name in sorted({config["bases"][b]["model"] for b in config["bases"]}):
            print(rehearse_evaluation(device, model_name, probe_rows=args.probe_rows), flush=True)
    if device.type != "cuda":
        print("on the CPU: peak RSS growth and CPU samples/s at the scaled batch, not GPU figures", file=sys.stderr)


if __name__ == "__main__":
    main()
