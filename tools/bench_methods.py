"""Seconds per training step of every method relative to clip-ft, through the real trainer.

Builds a small synthetic-world dataset with the same stages the workflow runs (world split, parse,
concreteness, each method's negatives), exports untrained bases (steps 0), then trains every method for
a few steps at the same batch size on the same data and prints the median seconds per step (first step
left out as warm-up) and the ratio to clip-ft. Data loading is included, as in a real run (timings.csv).
Methods run in `--rounds` interleaved rounds (clip-ft, negclip, ..., clip-ft, negclip, ...) and each
method's ratio is the median over rounds of its step time over clip-ft's in the same round, so a
machine shared with other jobs disturbs both sides of a ratio alike.

`--profile` runs the torch profiler over each method's steps and prints where the time goes: the
trainer's phases (data wait, forward, backward, optimizer incl. EMA updates) and the top operators.
Beside the timings it prints each method's FLOPs per step (forward + backward, FlopCounterMode) and
their ratio to clip-ft's: the ratio a compute-bound step cannot beat.

    .venv/bin/python tools/bench_methods.py [--methods clip-ft negclip ...] [--batch-size 64]
        [--steps 6] [--threads 2] [--images 256] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from compo.adapt import adapt_model
from compo.batches import TrainingData, epoch_order
from compo.config import load_config, resolve_method
from compo.losses import TOTAL, get_loss, needs_of
from compo.models import get_tokenizer, image_transform, load_model
from compo.negatives import generate_negatives
from compo.train import find_image_neighbours, train
from compo_tools.world_set import build_training_set

REPO = Path(__file__).resolve().parents[1]
PHASES = ("data", "forward", "backward", "optimizer")  # the trainer's record_function labels


def median_step_seconds(model_dir: Path) -> float:
    # timings.csv; a trainer from before it existed wrote the seconds into losses.csv (so the script can
    # measure an older checkout, PYTHONPATH=<it>/workflow, for before/after figures)
    path = model_dir / "timings.csv"
    with open(path if path.exists() else model_dir / "losses.csv") as handle:
        seconds = [float(row["seconds"]) for row in csv.DictReader(handle)]
    return statistics.median(seconds[1:] or seconds)


def step_flops(recipe: dict, inputs: dict, base: Path, batch_size: int) -> float:
    """FLOPs of one step's forward and backward (teacher forward included) on the run's first batch."""
    loaded = load_model(base)
    model, name = adapt_model(loaded.model, loaded.model_name, recipe, seed=0)
    spec = get_loss(recipe["loss"])
    loss = spec.build(recipe)
    data = TrainingData(inputs["manifest"], get_tokenizer(name), image_transform(model), needs_of(recipe),
                        negatives=inputs["negatives"], k=recipe.get("k"), recipe=recipe, seed=0,
                        parse=inputs["parse"], concreteness=inputs["concreteness"])
    find_image_neighbours(data, model, recipe)
    model.train()
    loss.setup(model)
    batch = data.batch(epoch_order(len(data), 0, 0)[:batch_size].tolist(), 0)
    with FlopCounterMode(display=False) as counter:
        loss(model, batch)[TOTAL].backward()
    return float(counter.get_total_flops())


def print_profile(method: str, prof: profile, steps: int) -> None:
    events = prof.key_averages()
    phases = {e.key: e.cpu_time_total / 1e6 / steps for e in events if e.key in PHASES}
    print(f"-- {method}: seconds per step by phase: "
          + ", ".join(f"{name} {phases.get(name, 0.0):.3f}" for name in PHASES))
    ops = sorted((e for e in events if e.key not in PHASES and not e.key.startswith("ProfilerStep")),
                 key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    total = sum(e.self_cpu_time_total for e in events if e.key not in PHASES)
    print("   top operators (self CPU, share of all operators): " + ", ".join(
        f"{e.key} {e.self_cpu_time_total / 1e6 / steps:.3f}s {100 * e.self_cpu_time_total / total:.0f}%" for e in ops))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    parser.add_argument("--methods", nargs="*", help="default: every method of the config")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the methods")
    parser.add_argument("--profile", action="store_true", help="torch profiler breakdown per method (round 1)")
    args = parser.parse_args()

    config = load_config(args.config)
    methods = args.methods or list(config["methods"])
    methods = ["clip-ft", *[m for m in methods if m != "clip-ft"]]
    settings = {"threads": args.threads, "checkpoint_every": 10**9, "log_every": 10**9}
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        world = copy.deepcopy(config["world"])
        world["splits"]["finetune"] = args.images
        # the training set as the workflow builds it (the `coco` dataset: the split's short captions)
        manifest = build_training_set(config, world, root)
        bases: dict[str, Path] = {}
        for name, base in config["bases"].items():
            recipe = copy.deepcopy(base)
            recipe.setdefault("train", {}).update(steps=0)
            bases[name] = root / "bases" / name
            train(recipe, None, str(bases[name]), seed=0, settings=settings)
        negatives: dict[str, Path] = {}
        recipes, inputs = {}, {}
        for method in methods:
            recipe = resolve_method(config, method)
            recipe["train"].update(steps=args.steps, batch_size=args.batch_size, warmup=1)
            needed = [recipe.get("negatives")] + list(recipe.get("online_negatives") or [])
            for name in filter(None, needed):
                if name not in negatives:
                    negatives[name] = root / "negatives" / f"{name}.parquet"
                    generate_negatives(manifest, root / "parse.parquet", config["negatives"][name], seed=0,
                                       out=negatives[name], report=root / "negatives" / f"{name}.csv",
                                       concreteness=root / "concreteness.parquet")
            neg = recipe.get("negatives")
            recipes[method] = recipe
            inputs[method] = {"manifest": str(manifest), "negatives": str(negatives[neg]) if neg else None,
                              "parse": str(root / "parse.parquet"), "concreteness": str(root / "concreteness.parquet")}
        flops = {m: step_flops(recipes[m], inputs[m], bases[recipes[m]["base"]], args.batch_size) for m in methods}

        seconds: dict[str, list[float]] = {m: [] for m in methods}
        for round_ in range(args.rounds):
            for method in methods:
                out = root / "models" / method
                profiling = args.profile and round_ == 0
                with profile(activities=[ProfilerActivity.CPU]) if profiling else contextlib.nullcontext() as prof:
                    train(recipes[method], out_dir=str(out), seed=0, init_dir=str(bases[recipes[method]["base"]]),
                          settings=settings, **inputs[method])
                seconds[method].append(median_step_seconds(out))
                shutil.rmtree(out)
                print(f"round {round_ + 1} {method:28s} {seconds[method][-1]:.3f} s/step", flush=True)
                if profiling:
                    print_profile(method, prof, args.steps)
    print(f"\nbatch {args.batch_size}, {args.threads} threads, {args.steps} steps (median, first left out), "
          f"{args.rounds} rounds (ratio: median over rounds of the same round's ratio)")
    print(f"{'method':28s} {'s/step':>8s} {'x clip-ft':>10s} {'GFLOP':>7s} {'x clip-ft':>10s}")
    for method in methods:
        ratio = statistics.median(s / r for s, r in zip(seconds[method], seconds["clip-ft"], strict=True))
        print(f"{method:28s} {statistics.median(seconds[method]):8.3f} {ratio:10.2f} {flops[method] / 1e9:7.1f} "
              f"{flops[method] / flops['clip-ft']:10.2f}")


if __name__ == "__main__":
    main()
