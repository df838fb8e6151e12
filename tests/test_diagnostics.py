"""The diagnostic scripts' data: what config/README.md quotes must come from the data it claims."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

from compo.io import read_table
from compo.world import generate_split
from compo.world.truth import caption_holds

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location(name, REPO / "workflow" / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_binding_oracle_negatives_are_swap_att_and_false(tmp_path: Path, tiny_world: dict) -> None:
    """Every oracle negative exchanges one attribute between two objects of its caption (same words),
    is proven false of the image, and its rewritten caption is proven true; one-object scenes get none."""
    world = {**tiny_world, "splits": {**tiny_world["splits"], "finetune": 12}}
    generate_split("finetune", world, 0, tmp_path / "world")
    manifest_path, negatives_path, count = _script("diagnose_binding").oracle_tables(
        tmp_path / "world" / "manifest.parquet", world, 0, tmp_path / "oracle")
    manifest = pd.read_parquet(manifest_path).set_index("caption_id")
    negatives = read_table(negatives_path, "negatives")
    assert len(negatives) == len(manifest) and count == int(negatives["valid"].sum()) > 0
    for row in negatives.itertuples(index=False):
        scene = json.loads(manifest.loc[row.caption_id, "scene"])
        caption = manifest.loc[row.caption_id, "caption"]
        if not row.valid:
            assert pd.isna(row.negative) and row.reason == "exhausted"
            continue
        assert len(scene["objects"]) > 1
        assert sorted(caption.split()) == sorted(row.negative.split()) and caption != row.negative
        assert caption_holds(scene, caption) is True and caption_holds(scene, row.negative) is False
