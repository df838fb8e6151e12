"""Why the tiny bases do (not) learn the world: train base variants with the workflow's own trainer and
print what each learned on the world's held-out benchmarks.

A variant is (image tower, pretraining world, loss): the ViT towers (`compo-tiny-vit-*`, patch 8) against
CLIP's ModifiedResNet towers (`compo-tiny-clip` / `compo-tiny-sigmoid`), on the multi-object pretraining
world alone or with a share of object-centric (one-object) images (`world.object_centric`). Every
variant trains with `compo.train.train` on a world written by `compo.world.generate_split` and is scored
by `compo.evaluate.evaluate` on the benchmarks of `compo.world.generate_benchmarks`, exactly as the
workflow does; `--supervised` instead trains the image tower alone to classify the single object's shape
(does the tower learn shape at all when told the answer directly?).

    python experiments/diagnose_bases.py --steps 500 1500 3000        # the full table (hours on 2 cores)
    python experiments/diagnose_bases.py --variants clip-rn-mix --steps 3000
    python experiments/diagnose_bases.py --supervised --steps 300
    python experiments/diagnose_bases.py --variants clip-rn-mix --steps 2000 --batch-size 256

`--batch-size` and `--lr` override the base recipe's (a larger batch holds more images whose captions
differ only in which attribute goes with which object, so contrastive pretraining asks for binding more often).

Prints one row per (variant, steps): zero-shot shape / colour top-1, retrieval R@1 both ways (chance:
1 / eval images), SugarCrepe replace, swap and its swap-att / swap-obj subsets, ARO VG-Attribution.
docs/embedded-study.md quotes its figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

VARIANTS: dict[str, dict] = {
    # name: base recipe overrides, world overrides
    "clip-vit-plain": {"model": "compo-tiny-vit-clip", "loss": "infonce", "object_centric": 0.0},
    "clip-rn-plain": {"model": "compo-tiny-clip", "loss": "infonce", "object_centric": 0.0},
    "clip-rn-mix": {"model": "compo-tiny-clip", "loss": "infonce", "object_centric": 0.5},
    "siglip-vit-plain": {"model": "compo-tiny-vit-sigmoid", "loss": "siglip", "object_centric": 0.0},
    "siglip-rn-mix": {"model": "compo-tiny-sigmoid", "loss": "siglip", "object_centric": 0.5},
}
COLUMNS = [("zeroshot-shape", "top1", "zs-shape"), ("zeroshot-colour", "top1", "zs-colour"),
           ("retrieval", "i2t_r1", "i2t-R@1"), ("retrieval", "t2i_r1", "t2i-R@1"),
           ("sugarcrepe", "replace", "sc-replace"), ("sugarcrepe", "swap", "sc-swap"),
           ("sugarcrepe", "swap_att", "sc-swap-att"), ("sugarcrepe", "swap_obj", "sc-swap-obj"),
           ("aro_attribution", "macro", "aro-attr")]


def load_config(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def write_worlds(config: dict, shares: set[float], root: Path) -> dict[float, Path]:
    """One pretraining manifest per object-centric share, and the held-out benchmarks once."""
    from compo.data import build_manifest
    from compo.world import generate_benchmarks, generate_split

    world, seed = config["world"], config["seed"]
    generate_benchmarks(world, seed, root / "benchmarks")
    manifests = {}
    for share in sorted(shares):
        folder = root / f"world-oc{share}"
        generate_split("pretrain", {**world, "object_centric": {"pretrain": share}}, seed, folder)
        manifests[share] = folder / "train.parquet"
        build_manifest("pretrain", config["datasets"]["pretrain"], manifests[share], folder / "manifest.parquet")
    return manifests


def score(model_dir: Path, config: dict, benchmarks_dir: Path, root: Path, wanted: list[tuple[str, str]]
          ) -> dict[tuple[str, str], float]:
    """Evaluate `model_dir` on the benchmarks of `wanted` ((benchmark, metric) pairs; files under
    `benchmarks_dir/<benchmark>`) as the workflow does, results under `root/eval`; the metrics' values."""
    from compo.evaluate import evaluate

    row = {}
    for benchmark in sorted({name for name, _ in wanted}):
        out = root / "eval" / model_dir.name / f"{benchmark}.json"
        evaluate(model_dir, benchmark, config["benchmarks"][benchmark], benchmarks_dir / benchmark, out,
                 out.with_suffix(".parquet"), config["zeroshot_templates"], model_id=model_dir.name)
        metrics = json.loads(out.read_text())["metrics"]
        row.update({(benchmark, metric): metrics[metric]["value"] for name, metric in wanted if name == benchmark})
    return row


def fit_probe(tower, head, train_x, train_y, loss, steps: list[int], seed: int) -> Iterator[int]:  # noqa: ANN001
    """Train `tower` + `head` on (train_x, train_y) with `loss` (AdamW 1e-3, batches of 64 drawn from
    `seed`); after each of `steps` (sorted) yield that count with both in eval mode, for the caller to score."""
    import numpy as np
    import torch

    optimizer = torch.optim.AdamW([*tower.parameters(), *head.parameters()], lr=1e-3, weight_decay=0.1)
    generator, done = np.random.default_rng(seed), 0
    for n in sorted(steps):
        tower.train()
        for _ in range(n - done):
            batch = torch.as_tensor(generator.choice(len(train_x), 64, replace=False))
            value = loss(head(tower(train_x[batch])), train_y[batch])
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
        done = n
        tower.eval()
        yield n


def base_recipe(config: dict, name: str, steps: int, overrides: dict | None = None) -> dict:
    """The config's base recipe for variant `name`, trained `steps` steps, its train settings updated by
    `overrides` (e.g. batch_size, lr); warm-up capped at `steps`."""
    variant = VARIANTS[name]
    recipe = copy.deepcopy(config["bases"]["siglip" if variant["loss"] == "siglip" else "clip"])
    recipe.update(model=variant["model"], loss=variant["loss"])
    recipe["train"] = {**recipe["train"], **(overrides or {}), "steps": steps,
                       "warmup": min(recipe["train"]["warmup"], steps)}
    return recipe


def contrastive(config: dict, names: list[str], steps: list[int], root: Path, threads: int,
                overrides: dict | None = None) -> None:
    """Pretrain each variant for each of `steps` (with `overrides` of the recipe's train settings) and
    print one row of its scores."""
    from compo.train import train

    manifests = write_worlds(config, {VARIANTS[n]["object_centric"] for n in names}, root)
    chance = 1 / config["world"]["splits"]["eval"]
    print(f"retrieval chance: R@1 = {chance:.4f}; zero-shot chance: shape 1/7 = 0.143, colour 1/8 = 0.125")
    print("variant            steps  s/step  " + "  ".join(f"{label:>10}" for *_, label in COLUMNS), flush=True)
    for name in names:
        variant = VARIANTS[name]
        for n in steps:
            recipe = base_recipe(config, name, n, overrides)
            out = root / "models" / f"{name}-{n}"
            start = time.perf_counter()
            train(recipe, str(manifests[variant["object_centric"]]), str(out), seed=config["seed"],
                  settings={**config["train"], "threads": threads})
            per_step = (time.perf_counter() - start) / max(n, 1)
            row = score(out, config, root / "benchmarks", root, [(b, m) for b, m, _ in COLUMNS])
            print(f"{name:<18} {n:>5}  {per_step:6.3f}  " + "  ".join(f"{row[b, m]:>10.3f}" for b, m, _ in COLUMNS),
                  flush=True)


def supervised(config: dict, steps: list[int], threads: int) -> None:
    """The image tower alone, trained to name the shape of one object (cross-entropy, AdamW 1e-3)."""
    import torch

    from compo.models import create_model, image_transform
    from compo.world.render import render_scene
    from compo.world.scene import rng_stream, sample_scene
    from compo.world.vocab import SHAPES

    torch.set_num_threads(threads)
    size = config["world"]["image_size"]

    def images(stream: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = rng_stream(config["seed"], "diagnose", stream)
        scenes = [sample_scene(rng, f"{stream}-{i}", 1, n_objects=1) for i in range(n)]
        labels = torch.tensor([SHAPES.index(s["objects"][0]["shape"]) for s in scenes])
        return torch.stack([transform(render_scene(s, size)) for s in scenes]), labels

    print("tower                 steps  held-out shape accuracy (chance 0.143)")
    for model_name in ("compo-tiny-vit-clip", "compo-tiny-clip"):
        tower = create_model(model_name, "scratch", config["seed"]).visual
        transform = image_transform(create_model(model_name, "scratch", config["seed"]))
        train_x, train_y = images("train", 4000)
        test_x, test_y = images("test", 700)
        head = torch.nn.Linear(tower.output_dim, len(SHAPES))
        for n in fit_probe(tower, head, train_x, train_y, torch.nn.functional.cross_entropy, steps, config["seed"]):
            with torch.no_grad():
                accuracy = (head(tower(test_x)).argmax(1) == test_y).float().mean().item()
            print(f"{model_name:<20} {n:>6}  {accuracy:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--steps", nargs="+", type=int, default=[500, 1500, 3000])
    parser.add_argument("--supervised", action="store_true", help="the image towers on shape labels instead")
    parser.add_argument("--batch-size", type=int, help="pretraining batch size (default: the base recipe's)")
    parser.add_argument("--lr", type=float, help="pretraining learning rate (default: the base recipe's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="keep worlds and models here (default: a temporary folder)")
    args = parser.parse_args()
    overrides = {key: value for key, value in (("batch_size", args.batch_size), ("lr", args.lr)) if value is not None}
    config = load_config(args.config)
    if args.supervised:
        supervised(config, args.steps, args.threads)
        return
    with tempfile.TemporaryDirectory() as scratch:
        root = args.workdir or Path(scratch)
        contrastive(config, args.variants, args.steps, root, args.threads, overrides)


if __name__ == "__main__":
    main()
