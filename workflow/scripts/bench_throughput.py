"""Training throughput of the project's trainer against open_clip's own (`open_clip_train.main`).

Both fine-tune the same base checkpoint with CLIP's InfoNCE (clip-ft) on the same synthetic-world
manifest (open_clip_train reads it as its CSV dataset), with the same model config, batch size,
precision, torch threads, DataLoader workers and number of steps, each in a fresh process, in
alternating pairs. Per run the samples/s are batch / median step seconds (data wait included; the
first `--warmup` steps left out): the project's from its timings.csv, open_clip's from its per-step
log lines. Printed: each pair, the medians and their ratio, and the project's fraction of this
machine's fp32 (or the precision's) GEMM rate: the FLOPs of one training step (forward + backward,
counted by torch's FlopCounterMode) times steps/s over the rate of a large torch.mm.

    .venv/bin/python workflow/scripts/bench_throughput.py [--steps 210] [--pairs 6] [--batch-size 64]
        [--threads 2] [--workers 1] [--precision fp32] [--device cpu] [--images 1500]
    # on a GPU, as the issue asks: --model ViT-B-32-quickgelu --image-size 224 --batch-size 256 --device cuda
        --precision amp --threads 8 --workers 7
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from compo.config import load_config, resolve_method
from compo.data import build_manifest
from compo.devices import autocast, resolve_device
from compo.losses import get_loss
from compo.models import create_model, get_tokenizer, image_transform, save_checkpoint
from compo.world import generate_split

REPO = Path(__file__).resolve().parents[2]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    parser.add_argument("--model", default=None, help="open_clip model (default: the config's clip base)")
    parser.add_argument("--image-size", type=int, default=None, help="world image size (default: the config's)")
    parser.add_argument("--images", type=int, default=1500, help="world images (3 short captions each)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=210)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp", "amp_bf16"])
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args()

    config = load_config(args.config)
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
              f"threads, {args.workers} workers, {args.steps} steps, device {device}; step {flops / 1e9:.1f} GFLOP, "
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
