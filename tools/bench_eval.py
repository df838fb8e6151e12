"""Seconds to evaluate a study's models on its benchmarks, this checkout against another (before/after).

Runs `compo evaluate` (the command the `evaluate` rule runs, with the study's benchmark set) on model
folders of a finished results folder, with this checkout's code and, with `--before CHECKOUT`, with that
checkout's `workflow/compo` (PYTHONPATH), in interleaved rounds (after, before, after, before, ...), so a
machine shared with other jobs disturbs both sides alike. Prints the wall seconds per model of each round,
the medians and their ratio, and whether both sides measured the same metrics (every `<benchmark>.json`
of the first round). Outputs go to a temporary folder; the results folder is only read.

    .venv/bin/python tools/bench_eval.py RESULTS [--models clip-ft/coco/seed0 ...]
        [--configfile config/config.yaml ...] [--threads 1] [--rounds 3] [--before /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compo import layout
from compo.config import load_config, truncate_words

REPO = Path(__file__).resolve().parents[1]


def benchmarks_arg(config: dict, results: Path) -> str:
    """The `--benchmarks` JSON of the evaluate rule."""
    return json.dumps({name: {"spec": config["benchmarks"][name],
                              "dir": layout.benchmark_dir(str(results), config["benchmarks"][name])}
                       for name in config["study"]["benchmarks"]})


def evaluate_seconds(code: Path, model: str, config: dict, results: Path, threads: int, out: Path) -> float:
    """Wall seconds of one `compo evaluate` of `model` with the package under `code` (a checkout)."""
    env = dict(os.environ, PYTHONPATH=str(code / "workflow"))
    command = [sys.executable, "-m", "compo", "evaluate", "--model-dir", str(results / "models" / model),
               "--model-id", model, "--benchmarks", benchmarks_arg(config, results),
               "--templates", json.dumps(config.get("zeroshot_templates")), "--threads", str(threads),
               "--out-dir", str(out)]
    help_text = subprocess.run(command[:4] + ["--help"], capture_output=True, text=True, env=env).stdout
    if "--device" in help_text:  # checkouts from before the device setting have neither option
        command += ["--device", "cpu", "--precision", "fp32"]
    if "--truncate-words" in help_text:  # the text protocol comes from the rule (older checkouts read the model)
        words = truncate_words(config, layout.parse_model_id(model).method)
        command += [] if words is None else ["--truncate-words", str(words)]
    began = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=results.parent)
    seconds = time.perf_counter() - began
    if run.returncode != 0:
        raise SystemExit(f"compo evaluate of {model} with {code} failed:\n{run.stderr[-3000:]}")
    return seconds


def metric_differences(after: Path, before: Path) -> tuple[int, list[str]]:
    """The number of benchmark metrics (`metrics` of each `<benchmark>.json`) both evaluation folders
    report, and those of them that differ (a metric only one side reports is not compared)."""
    shared, differences = 0, []
    for path in sorted(after.rglob("*.json")):
        ours = json.loads(path.read_text())["metrics"]
        theirs = json.loads((before / path.relative_to(after)).read_text())["metrics"]
        for name in ours.keys() & theirs.keys():
            shared += 1
            if ours[name] != theirs[name]:
                differences.append(f"{path.relative_to(after)} {name}: {ours[name]} vs {theirs[name]}")
    return shared, differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a finished study's results folder (models and world benchmarks)")
    parser.add_argument("--models", nargs="+", default=["clip-ft/coco/seed0"])
    parser.add_argument("--configfile", nargs="*", default=[str(REPO / "config" / "config.yaml")])
    parser.add_argument("--threads", type=int, default=1, help="the evaluate rule's threads (default 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="another checkout to compare with")
    args = parser.parse_args()
    results = Path(args.results).resolve()
    config = load_config(*args.configfile)
    sides = {"this checkout": REPO} | ({"before": args.before.resolve()} if args.before else {})
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as scratch:
        for round_ in range(args.rounds):
            for side, code in sides.items():
                for model in args.models:
                    out = Path(scratch) / side.replace(" ", "-") / str(round_) / model
                    took = evaluate_seconds(code, model, config, results, args.threads, out)
                    seconds[side].append(took)
                    print(f"round {round_ + 1} {side:<14} {model:<32} {took:7.1f} s", flush=True)
        print(f"\n{len(config['study']['benchmarks'])} benchmarks, {args.threads} thread(s), CPU fp32, "
              f"{args.rounds} rounds x {len(args.models)} models")
        for side, values in seconds.items():
            print(f"{side:<14} median {statistics.median(values):7.1f} s per model evaluation")
        if args.before:
            ratio = statistics.median(seconds["before"]) / statistics.median(seconds["this checkout"])
            print(f"before / this checkout: {ratio:.2f}x")
            shared, differences = metric_differences(Path(scratch) / "this-checkout" / "0",
                                                     Path(scratch) / "before" / "0")
            print(f"metrics both sides report: {shared}, of which {len(differences)} differ")
            print("\n".join(f"  {line}" for line in differences[:20]))


if __name__ == "__main__":
    main()
