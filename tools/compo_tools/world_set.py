"""The embedded study's fine-tuning set as the workflow builds it, for the benchmarks that train outside Snakemake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compo.concreteness import score_parse
from compo.data import build_manifest
from compo.parse import parse_manifest
from compo.world import generate_split


def build_training_set(config: dict[str, Any], world: dict[str, Any], root: Path) -> Path:
    """The world's `finetune` split (settings `world`) under `root`, the `coco` dataset's manifest of it (its short
    captions), its parse and concreteness tables (`root/parse.parquet`, `root/concreteness.parquet`); the manifest."""
    generate_split("finetune", world, seed=config["seed"], out_dir=root / "world")
    manifest = root / "coco.parquet"
    build_manifest("coco", config["datasets"]["coco"], out=manifest, world_manifest=root / "world" / "manifest.parquet")
    parse_manifest(manifest, out=root / "parse.parquet", report=root / "parse.csv",
                   spacy_model=config["parse"]["spacy_model"], batch_size=config["parse"]["batch_size"])
    score_parse(root / "parse.parquet", out=root / "concreteness.parquet")
    return manifest
