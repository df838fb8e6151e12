"""Training throughput of the project's trainer against open_clip's own (`open_clip_train.main`).

Both fine-tune the same base checkpoint with CLIP's InfoNCE (clip-ft) on the same synthetic-world
manifest (open_clip_train reads it as its CSV dataset), with the same model config, batch size,
precision, torch threads, DataLoader workers and number of steps, each in a fresh process, in
alternating pairs. Per run the samples/s are batch / median step seconds (data wait included; the
first `--warmup` steps left out): the project's from its timings.csv, open_clip's from its per-step
log lines. Printed: each pair, the medians and their ratio, and the project's fraction of this
machine's fp32 (or the precision's) GEMM rate: the FLOPs of one training step (forward + backward,
counted by torch's FlopCounterMode) times steps/s over the rate of a large torch.mm.

    .venv/bin/python tools/bench_throughput.py [--steps 210] [--pairs 6] [--batch-size 64]
        [--threads 2] [--workers 1] [--precision fp32] [--device cpu] [--images 1500]
    # on a GPU, as the issue asks: --model ViT-B-32-quickgelu --image-size 224 --batch-size 256 --device cuda
        --precision amp --threads 8 --workers 7 [--compile]

`--count-ops` counts instead of timing (compo_tools.opcount): per steady-state step and phase, the dispatched aten
ops, the kernel ops among them (no views, no bare allocations) and the host syncs, of the project's own
`train_steps` for each of `--methods` and of open_clip_train's own `train_one_epoch` (run in this process
through `open_clip_train.main`, logging every step as the project's losses.csv does), on the same model and
data. On a GPU a step of small kernels is bound by the host (about 25 us of CPU per op for both trainers on an
H100), so ops per step predict steps per second there. Its default is the CPU proxy of the H100 case:
ViT-B-32-quickgelu's layers and heads with every width divided by `--narrow` (16: the same ops, a test checks),
224 px, batch 256, amp, the project with the settings a GPU run takes (`train.shapes: static`, fused AdamW) and
open_clip_train with the AdamW torch picks on a GPU (foreach); on the CPU every tensor stands for a device
tensor, so a host read outside the data phase counts as the sync it would be there (compo_tools.opcount). c2lip
runs on the same towers with a learned logit bias (its sigmoid loss needs one). Its last line is
`ops per step ratio R (project N / open_clip_train M); syncs project S, open_clip_train T` for clip-ft.

    .venv/bin/python tools/bench_throughput.py --count-ops [--methods clip-ft negclip degla fsc-clip
        c2lip cement] [--narrow 16] [--steps 5 --warmup 2] [--shapes static] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pandas as pd
import torch

from compo.config import load_config, resolve_method
from compo.data import build_manifest
from compo.devices import autocast, resolve_device
from compo.losses import get_loss
from compo.models import (
    create_model,
    get_tokenizer,
    image_transform,
    model_config,
    register_model_config,
    save_checkpoint,
)
from compo.world import generate_split
from compo_tools.opcount import KINDS, PHASES, OpCounter, per_step, steady, sync_sites

REPO = Path(__file__).resolve().parents[1]
OPEN_CLIP_STEP = re.compile(r"Batch \(t\): ([0-9.]+),")
# open_clip_train with compo's model configs registered (the one thing its CLI cannot be told)
OPEN_CLIP_SHIM = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
from compo.models import open_clip
open_clip()
from open_clip_train.main import main
main(sys.argv[2:])
"""


def gemm_rate(threads: int, device: torch.device, precision: str, size: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of a size^3 matrix product (median of `repeats`) under the precision's autocast."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    seconds = []
    with autocast(device, precision):
        for _ in range(repeats + 1):
            if device.type == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
            a @ b
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - began)
    return 2 * size**3 / statistics.median(seconds[1:])


def step_flops(model_name: str, manifest: Path, batch_size: int) -> float:
    """FLOPs of one clip-ft training step's forward and backward on a batch of the manifest."""
    from torch.utils.flop_counter import FlopCounterMode

    from compo.batches import TrainingData

    model = create_model(model_name, "scratch", 0).train()
    data = TrainingData(manifest, get_tokenizer(model_name), image_transform(model))
    batch = data.batch(list(range(batch_size)))
    loss = get_loss("infonce").build({})
    with FlopCounterMode(display=False) as counter:
        loss(model, batch)["loss"].backward()
    return float(counter.get_total_flops())


def project_run(root: Path, recipe: dict, base: Path, manifest: Path, args: argparse.Namespace,
                run: int) -> list[float]:
    out = root / "project" / f"run{run}"
    settings = {"threads": args.threads, "checkpoint_every": 10**9, "log_every": 10**9, "workers": args.workers,
                "precision": args.precision, "device": args.device}
    if args.compile:  # only when asked: an older checkout's trainer (before/after figures) lacks the setting
        settings["compile"] = True
    command = [sys.executable, "-m", "compo", "train", "--recipe", json.dumps(recipe), "--settings",
               json.dumps(settings), "--manifest", str(manifest), "--init-dir", str(base), "--seed", "0",
               "--out", str(out)]
    _run(command, args.threads)
    # timings.csv; a trainer from before it existed wrote the seconds into losses.csv (so the script can
    # measure an older checkout, PYTHONPATH=<it>/workflow, for before/after figures)
    timings = out / "timings.csv"
    return pd.read_csv(timings if timings.exists() else out / "losses.csv")["seconds"].tolist()


def open_clip_run(root: Path, csv_path: Path, base: Path, recipe: dict, args: argparse.Namespace,
                  run: int) -> list[float]:
    hp = recipe["train"]
    command = [sys.executable, "-c", OPEN_CLIP_SHIM, str(args.threads),
               "--train-data", str(csv_path), "--dataset-type", "csv", "--csv-img-key", "filepath",
               "--csv-caption-key", "title", "--csv-separator", ",", "--model", args.model,
               "--pretrained", str(base / "checkpoint.pt"), "--batch-size", str(args.batch_size), "--epochs", "1",
               "--lr", str(hp["lr"]), "--wd", str(hp["weight_decay"]), "--warmup", str(hp["warmup"]),
               "--precision", args.precision, "--workers", str(args.workers), "--log-every-n-steps", "1",
               "--logs", str(root / "open_clip"), "--name", f"run{run}", "--report-to", "",
               "--save-frequency", "0", "--seed", "0", "--device", args.device_type]
    _run(command, args.threads)
    log = (root / "open_clip" / f"run{run}" / "out.log").read_text()
    return [float(seconds) for seconds in OPEN_CLIP_STEP.findall(log)]


def _run(command: list[str], threads: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode:
        raise SystemExit(f"{command[:4]} ... failed ({result.returncode}):\n{result.stderr[-3000:]}")


def samples_per_second(seconds: list[float], batch_size: int, warmup: int) -> float:
    return batch_size / statistics.median(seconds[warmup:] or seconds)


# --- --count-ops -------------------------------------------------------------------------------------------

COUNT_DEFAULTS = {"model": "ViT-B-32-quickgelu", "image_size": 224, "batch_size": 256, "precision": "amp",
                  "steps": 5, "warmup": 2}
TIMING_DEFAULTS = {"images": 1500, "batch_size": 64, "steps": 210, "warmup": 10, "precision": "fp32"}


def narrowed_config(model_name: str, narrow: int, logit_bias: float | None = None) -> tuple[str, dict]:
    """An open_clip config with `model_name`'s layers, heads, patch and image size and every width divided by
    `narrow` (registered under a name of its own), optionally with a learned logit bias; narrow 1: the model."""
    config = copy.deepcopy(model_config(model_name))
    if narrow > 1:
        vision, text = config["vision_cfg"], config["text_cfg"]
        heads = vision["width"] // vision.get("head_width", 64)  # open_clip's ViT: width / head_width heads
        vision["width"] //= narrow
        vision["head_width"] = vision["width"] // heads
        text["width"] //= narrow  # text heads are given: the same count, narrower
        config["embed_dim"] //= narrow
    if logit_bias is not None:
        config["init_logit_bias"] = logit_bias
    if narrow == 1 and logit_bias is None:
        return model_name, config
    name = f"{model_name}-narrow{narrow}" + ("-bias" if logit_bias is not None else "")
    register_model_config(name, config)
    return name, config


def count_project(recipe: dict, inputs: dict, base: Path, out: Path, args: argparse.Namespace,
                  device: torch.device) -> list:
    """The project's own train_steps, counted (compo_tools.opcount): the StepCounts of its steps."""
    import dataclasses

    from compo import train as trainer

    wanted = {"threads": args.threads, "checkpoint_every": 10**9, "log_every": 10**9, "workers": args.workers,
              "precision": args.precision, "device": args.device, "shapes": args.shapes}
    known = {field.name for field in dataclasses.fields(trainer.Settings)}  # an older checkout lacks `shapes`
    settings = trainer.Settings.from_config({k: v for k, v in wanted.items() if k in known})
    run = trainer.build(recipe, 0, out, trainer.Inputs(init_dir=str(base), **inputs), settings, device)
    if device.type == "cpu" and args.shapes == "static":  # the proxy takes the optimizer a GPU run builds
        try:
            run.optimizer = trainer.build_optimizer(run.loss.trainable_parameters(run.model), run.hp, fused=True)
            run.trained = [p for group in run.optimizer.param_groups for p in group["params"]]
        except TypeError:  # a checkout from before fused AdamW: foreach on a GPU too
            pass
    with OpCounter(proxy=device.type == "cpu") as counter:
        trainer.train_steps(run)
    return counter.steps[1 : 1 + run.steps], graph_breaks(run, device)


def graph_breaks(run, device: torch.device) -> int:  # noqa: ANN001 - compo.train.Run
    """torch._dynamo.explain's graph breaks of the loss with the model on the run's first batch (the graphs
    train.compile would make, less one)."""
    from compo.devices import autocast

    batch = run.data.batch(run.data.rows.index[: int(run.hp["batch_size"])].tolist(), 0)
    batch = {name: tensor.to(device) for name, tensor in batch.items()}
    run.model.to(device).train()
    with autocast(device, run.settings.precision):
        explained = torch._dynamo.explain(run.loss)(run.model, batch)
    torch._dynamo.reset()
    return explained.graph_break_count


def count_open_clip(csv_path: Path, base: Path, model: str, root: Path, args: argparse.Namespace,
                    device: torch.device) -> list:
    """open_clip_train's own train_one_epoch, run by its own main in this process, counted."""
    import open_clip_train.main as open_clip_main

    counted: dict[str, OpCounter] = {}
    original_epoch, original_optim = open_clip_main.train_one_epoch, open_clip_main.optim

    def train_one_epoch(*positional, **named):  # noqa: ANN202
        with OpCounter(proxy=device.type == "cpu") as counter:
            original_epoch(*positional, **named)
        counted["epoch"] = counter

    open_clip_main.train_one_epoch = train_one_epoch
    if device.type == "cpu":  # the AdamW torch picks for GPU tensors (foreach); on the CPU it would loop
        open_clip_main.optim = types.SimpleNamespace(AdamW=functools.partial(torch.optim.AdamW, foreach=True))
    try:
        open_clip_main.main([
            "--train-data", str(csv_path), "--dataset-type", "csv", "--csv-img-key", "filepath",
            "--csv-caption-key", "title", "--csv-separator", ",", "--model", model, "--pretrained",
            str(base / "checkpoint.pt"), "--batch-size", str(args.batch_size), "--epochs", "1", "--lr", "5e-4",
            "--wd", "0.1", "--warmup", "1", "--precision", args.precision, "--workers", str(args.workers),
            "--log-every-n-steps", "1", "--logs", str(root / "open_clip"), "--name", "count", "--report-to", "",
            "--save-frequency", "0", "--seed", "0", "--device", device.type])
    finally:
        open_clip_main.train_one_epoch, open_clip_main.optim = original_epoch, original_optim
    return counted["epoch"].steps[1 : 1 + args.steps]


def _needs_bias(config: dict, recipe: dict) -> bool:
    return "init_logit_bias" in model_config(config["bases"][recipe["base"]]["model"])


def count_ops(args: argparse.Namespace, config: dict, device: torch.device) -> None:
    from compo.negatives import generate_negatives
    from compo_tools.world_set import build_training_set  # spaCy: only this mode parses

    torch.set_num_threads(args.threads)
    methods = ["clip-ft", *[m for m in args.methods if m != "clip-ft"]]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        world = copy.deepcopy(config["world"])
        world["splits"]["finetune"] = args.images or -(-args.steps * args.batch_size // world["short_captions"]) + 8
        world["image_size"] = args.image_size
        # the training set as the workflow builds it (the `coco` dataset: the split's short captions)
        manifest = build_training_set(config, world, root)
        bases: dict[bool, tuple[str, Path]] = {}
        for bias in (False, True):
            name, _ = narrowed_config(args.model, args.narrow, -10.0 if bias else None)
            bases[bias] = name, root / ("base-bias" if bias else "base")
            save_checkpoint(create_model(name, "scratch", 0), name, bases[bias][1])
        frame = pd.read_parquet(manifest)
        csv_path = root / "train.csv"  # open_clip_train's CSV: exactly `steps` batches of the manifest's captions
        frame.iloc[: args.steps * args.batch_size].rename(columns={"image_path": "filepath", "caption": "title"})[
            ["filepath", "title"]].to_csv(csv_path, index=False)
        name, vision, text = bases[False][0], model_config(bases[False][0])["vision_cfg"], \
            model_config(bases[False][0])["text_cfg"]
        print(f"count-ops: {name} (vision width {vision['width']}, {vision['layers']} layers; text width "
              f"{text['width']}, {text['layers']} layers, {text['heads']} heads), {args.image_size} px, batch "
              f"{args.batch_size}, {args.precision}, device {device}, project train.shapes {args.shapes}"
              + (" and fused AdamW (a GPU run's path)" if device.type == "cpu" and args.shapes == "static" else "")
              + f"; {args.steps} steps, at least the first {args.warmup} left out (and any before an optimizer's "
              "first step or skipped by the loss scaler)", flush=True)
        results, breaks = {}, {}
        negatives: dict[str, Path] = {}
        for method in methods:
            recipe = resolve_method(config, method)
            recipe["train"].update(steps=args.steps, batch_size=args.batch_size, warmup=1)
            for generator in filter(None, [recipe.get("negatives")]):
                if generator not in negatives:
                    negatives[generator] = root / "negatives" / f"{generator}.parquet"
                    generate_negatives(manifest, root / "parse.parquet", config["negatives"][generator], seed=0,
                                       out=negatives[generator], report=root / "negatives" / f"{generator}.csv",
                                       concreteness=root / "concreteness.parquet")
            neg = recipe.get("negatives")
            inputs = {"manifest": str(manifest), "negatives": str(negatives[neg]) if neg else None,
                      "parse": str(root / "parse.parquet"), "concreteness": str(root / "concreteness.parquet")}
            base = bases[_needs_bias(config, recipe)][1]
            steps, breaks[method] = count_project(recipe, inputs, base, root / "out" / method, args, device)
            results[method] = steady(steps, args.warmup)
            _print_counts(f"project {method}", results[method])
            print(f"   graph breaks (torch._dynamo.explain of the loss on a batch): {breaks[method]}", flush=True)
        reference = steady(count_open_clip(csv_path, bases[False][1], bases[False][0], root, args, device),
                           args.warmup)
        _print_counts("open_clip_train (clip-ft)", reference)
    theirs = per_step(reference)["total"]
    print(f"\n{'per step':28s} {'dispatched':>10s} {'kernel':>8s} {'syncs':>6s} {'ops / open_clip_train':>22s} "
          f"{'graph breaks':>13s}")
    for label, steps in [*((m, results[m]) for m in methods), ("open_clip_train", reference)]:
        total = per_step(steps)["total"]
        print(f"{label:28s} {total['dispatched']:10,.0f} {total['kernel']:8,.0f} {total['syncs']:6.0f} "
              f"{total['dispatched'] / theirs['dispatched']:22.2f} {breaks.get(label, ''):>13}")
    ours = per_step(results["clip-ft"])["total"]
    print(f"ops per step ratio {ours['dispatched'] / theirs['dispatched']:.2f} (project {ours['dispatched']:,.0f} / "
          f"open_clip_train {theirs['dispatched']:,.0f}); syncs project {ours['syncs']:.0f}, open_clip_train "
          f"{theirs['syncs']:.0f}")


def _print_counts(label: str, steps: list) -> None:
    if not steps:
        raise SystemExit(f"{label}: no steady-state step counted (every step skipped by the loss scaler?); "
                         "raise --steps")
    table = per_step(steps)
    print(f"-- {label}: per step by phase ({', '.join(KINDS)}; medians of {len(steps)} steps)", flush=True)
    for phase in (*PHASES, "total"):
        print(f"   {phase:10s} " + " ".join(f"{table[phase][kind]:8,.0f}" for kind in KINDS))
    sites = sync_sites(steps)
    if sites:
        print("   syncs in all counted steps: " + ", ".join(f"{phase} {op} x{n}" for (phase, op), n in sites.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    parser.add_argument("--model", default=None, help="open_clip model (default: the config's clip base; "
                                                      "--count-ops: ViT-B-32-quickgelu)")
    parser.add_argument("--image-size", type=int, default=None, help="world image size (default: the config's; "
                                                                     "--count-ops: 224)")
    parser.add_argument("--images", type=int, default=None, help="world images, 3 short captions each (default "
                                                                 "1500; --count-ops: enough for its steps)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 64; --count-ops 256")
    parser.add_argument("--steps", type=int, default=None, help="default 210; --count-ops 5")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out (default 10; --count-ops 2)")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--precision", default=None, choices=["fp32", "amp", "amp_bf16"],
                        help="default fp32; --count-ops amp")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--compile", action="store_true", help="the project with train.compile (torch.compile of "
                        "its loss and model; open_clip_train runs as it does by default, uncompiled)")
    parser.add_argument("--count-ops", action="store_true", help="count ops and syncs per step instead of timing")
    parser.add_argument("--methods", nargs="*", default=["clip-ft", "negclip", "degla", "fsc-clip", "c2lip", "cement"],
                        help="--count-ops: the methods counted (clip-ft always)")
    parser.add_argument("--narrow", type=int, default=16, help="--count-ops: every width divided by this")
    parser.add_argument("--shapes", default="static", choices=["auto", "dynamic", "static"],
                        help="--count-ops: the project's train.shapes (static: a GPU run's path)")
    args = parser.parse_args()
    for key, value in (COUNT_DEFAULTS if args.count_ops else TIMING_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    config = load_config(args.config)
    if args.count_ops:
        count_ops(args, config, resolve_device(args.device, "--device"))
        return
    args.model = args.model or config["bases"]["clip"]["model"]
    device = resolve_device(args.device, "--device")
    args.device_type = device.type
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        world = copy.deepcopy(config["world"])
        world["splits"]["finetune"] = args.images
        if args.image_size:
            world["image_size"] = args.image_size
        generate_split("finetune", world, seed=config["seed"], out_dir=root / "world")
        manifest = root / "coco.parquet"
        build_manifest("coco", config["datasets"]["coco"], out=manifest,
                       world_manifest=root / "world" / "manifest.parquet")
        frame = pd.read_parquet(manifest)
        # open_clip_train's CSV: the manifest's captions, repeated to fill one epoch of `steps` batches
        repeats = -(-args.steps * args.batch_size // len(frame))
        csv_path = root / "train.csv"
        pd.concat([frame] * repeats).rename(columns={"image_path": "filepath", "caption": "title"})[
            ["filepath", "title"]].to_csv(csv_path, index=False)
        base = root / "base"
        save_checkpoint(create_model(args.model, "scratch", 0), args.model, base)
        recipe = resolve_method(config, "clip-ft")
        recipe["train"].update(steps=args.steps, batch_size=args.batch_size)

        flops = step_flops(args.model, manifest, args.batch_size)
        rate = gemm_rate(args.threads, device, args.precision)
        print(f"{args.model}, {world['image_size']} px, batch {args.batch_size}, {args.precision}, {args.threads} "
              f"threads, {args.workers} workers, {args.steps} steps, device {device}, project compiled "
              f"{args.compile}; step {flops / 1e9:.1f} GFLOP, "
              f"GEMM {rate / 1e9:.1f} GFLOP/s", flush=True)
        print(f"{'pair':>4s} {'project':>9s} {'open_clip':>10s} {'ratio':>6s}  (samples/s)", flush=True)
        project, reference = [], []
        for pair in range(args.pairs):
            project.append(samples_per_second(project_run(root, recipe, base, manifest, args, pair),
                                              args.batch_size, args.warmup))
            reference.append(samples_per_second(open_clip_run(root, csv_path, base, recipe, args, pair),
                                                args.batch_size, args.warmup))
            print(f"{pair:4d} {project[-1]:9.1f} {reference[-1]:10.1f} {project[-1] / reference[-1]:6.2f}", flush=True)
        ours, theirs = statistics.median(project), statistics.median(reference)
        ratios = [p / r for p, r in zip(project, reference, strict=True)]
        print(f"median: project {ours:.1f} samples/s (range {min(project):.1f}-{max(project):.1f}), open_clip_train "
              f"{theirs:.1f} ({min(reference):.1f}-{max(reference):.1f}); ratio of medians {ours / theirs:.2f}, "
              f"median of pair ratios {statistics.median(ratios):.2f}")
        achieved = ours / args.batch_size * flops
        print(f"project: {achieved / 1e9:.1f} GFLOP/s = {100 * achieved / rate:.0f} % of the measured GEMM rate")


if __name__ == "__main__":
    main()
