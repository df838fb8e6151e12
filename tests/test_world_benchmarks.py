"""The world's versions of the benchmarks (compo.world.benchmarks): deterministic, listed, positives hold and
negatives do not, valid files every kind evaluates."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from compo.evaluate import benchmark_files, run_benchmark
from compo.world import caption_holds, generate_benchmarks
from compo.world.benchmarks import (
    SUGARCREPE_PP_SUBSETS,
    aro_attribution_item,
    aro_relation_item,
    sugarcrepe_pp_item,
    winoground_item,
)
from compo.world.scene import rng_stream

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared

WORLD_SPECS = {
    "sugarcrepe_pp": {"kind": "sugarcrepe_pp", "source": "world"},
    "winoground": {"kind": "winoground", "source": "world"},
    "aro_relation": {"kind": "aro_relation", "source": "world", "min_count": 1},
    "aro_attribution": {"kind": "aro_attribution", "source": "world", "min_count": 1},
    "aro_order": {"kind": "aro_order", "source": "world"},
    "valse": {"kind": "valse", "source": "world", "pieces": ["relations", "foil-it"]},
    "linear_probe": {"kind": "linear_probe", "source": "world"},
    "long_retrieval": {"kind": "long_retrieval", "source": "world"},
}

def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world_bench(tmp_path_factory: pytest.TempPathFactory, tiny_world: dict) -> Path:
    out = tmp_path_factory.mktemp("world") / "bench"
    generate_benchmarks(tiny_world, seed=0, out_dir=out)
    return out


def test_world_benchmarks_are_deterministic_and_listed(tmp_path: Path, world_bench: Path, tiny_world: dict) -> None:
    generate_benchmarks(tiny_world, seed=0, out_dir=tmp_path / "again")
    assert _digest(tmp_path / "again") == _digest(world_bench)
    for name, spec in WORLD_SPECS.items():
        for path in benchmark_files(spec["kind"], str(world_bench / name), spec):
            assert Path(path).is_file(), path


def test_world_items_hold_and_negatives_do_not(tiny_world: dict) -> None:
    world = {**tiny_world, "image_size": 32}
    for subset in SUGARCREPE_PP_SUBSETS:
        rng = rng_stream(0, "test", subset)
        for i in range(8):
            scene, c1, c2, negative = sugarcrepe_pp_item(subset, rng, f"x{i}", world)
            assert c1 != c2 and caption_holds(scene, c1) and caption_holds(scene, c2)
            assert caption_holds(scene, negative) is False
    rng = rng_stream(0, "test", "winoground")
    for i in range(12):
        scene0, scene1, c0, c1 = winoground_item(("Relation", "Object")[i % 2], rng, f"ex_{i}", world)
        assert sorted(c0.split()) == sorted(c1.split()) and c0 != c1
        assert (caption_holds(scene0, c0), caption_holds(scene0, c1)) == (True, False)
        assert (caption_holds(scene1, c1), caption_holds(scene1, c0)) == (True, False)
        assert scene0["background"] == scene1["background"] and scene0["texture_seed"] == scene1["texture_seed"]
    for make in (aro_relation_item, aro_attribution_item):
        rng = rng_stream(0, "test", make.__name__)
        for i in range(10):
            scene, pair, _, true, false = make(rng, f"a{i}", world)
            assert caption_holds(scene, true) is True and caption_holds(scene, false) is False
            assert sorted(true.split()) == sorted(false.split()) and pair[0] != pair[1]


def test_world_files_are_valid(world_bench: Path, tiny_world: dict) -> None:
    n = tiny_world["benchmarks"]["sugarcrepe_per_subset"]
    for line in (world_bench / "winoground" / "examples.jsonl").read_text().splitlines():
        example = json.loads(line)
        for k in range(2):
            assert (world_bench / "winoground" / "images" / f"{example[f'image_{k}']}.png").is_file()
    for name, field in (("aro_relation", "relation_name"), ("aro_attribution", "attributes")):
        filename = "visual_genome_relation.json" if field == "relation_name" else "visual_genome_attribution.json"
        items = json.loads((world_bench / name / filename).read_text())
        assert len(items) == n
        for item in items:
            assert item["bbox_w"] > 0 and item["bbox_h"] > 0
            assert item["bbox_x"] + item["bbox_w"] <= tiny_world["image_size"]
            assert item["bbox_y"] + item["bbox_h"] <= tiny_world["image_size"]
    for piece in ("relations", "foil-it"):
        for item in json.loads((world_bench / "valse" / f"{piece}.json").read_text()).values():
            assert item["caption"] != item["foil"] and item["classes"] and item["classes_foil"]
    long = json.loads((world_bench / "long_retrieval" / "dataset.json").read_text())
    assert all(len(image["sentences"]) == 1 and len(image["sentences"][0]["tokens"]) > 30 for image in long["images"])
    for split in ("train", "test"):
        assert len(list((world_bench / "linear_probe" / split).glob("*/*.png"))) == 7 * 2


def test_every_new_kind_evaluates_on_the_world_files(world_bench: Path, loaded) -> None:
    torch.set_num_threads(1)
    for name, spec in WORLD_SPECS.items():
        result = run_benchmark(loaded, spec, world_bench / name)
        assert result.headline in result.metrics and result.skipped == {}
        assert 0.0 <= result.metrics[result.headline].value <= 1.0
    assert run_benchmark(loaded, WORLD_SPECS["long_retrieval"], world_bench / "long_retrieval").protocol.endswith(
        "long-captions")
