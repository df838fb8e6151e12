"""The world's versions of the benchmarks (compo.world.benchmarks): deterministic, listed, positives hold and
negatives do not, valid files every kind evaluates. The world's What's Up, EqBen and COCO-Counterfactuals (issue 47
item 5): each is written in its release's layout, its labels hold by the truth checker, and the release's loader
reads it (`source: world`) with the scores a hand computation gives on the tiny model."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from compo.evaluate import benchmark_files, run_benchmark
from compo.images import open_image
from compo.models import encode_images, encode_texts
from compo.world import caption_holds, generate_benchmarks
from compo.world.benchmarks import (
    SUGARCREPE_PP_SUBSETS,
    _coco_counterfactuals,
    _eqben,
    _whatsup,
    aro_attribution_item,
    aro_relation_item,
    coco_counterfactual_item,
    sugarcrepe_pp_item,
    whatsup_group,
    winoground_item,
    world_benchmarks,
)
from compo.world.scene import RELATION_MARGIN, relations_between, rng_stream
from compo.world.vocab import RELATIONS

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


# --- What's Up, EqBen and COCO-Counterfactuals: pairs of scenes (issue 47 item 5) ------------------------------------

PAIR_SIZES = {"whatsup_groups": 2, "eqben_items": 4, "coco_counterfactuals_items": 4}


@pytest.fixture(scope="module")
def pairs_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = {"image_size": 32, "max_objects": 4, "ungrounded_rate": 0.35,
             "benchmarks": {"sugarcrepe_per_subset": 3, "zeroshot_per_class": 2, **PAIR_SIZES}}
    out = tmp_path_factory.mktemp("world_pairs")
    for write, name in ((_whatsup, "whatsup"), (_eqben, "eqben"), (_coco_counterfactuals, "coco_counterfactuals")):
        write(world, 0, out / name)
    return out


def _pair_spec(kind: str) -> dict:
    return {**world_benchmarks()[kind], "source": "world"}


def _objects(scene: dict) -> list[tuple]:
    return [(o["shape"], o["colour"], o["size"], o["pattern"]) for o in scene["objects"]]


def test_pair_item_labels_hold_by_the_truth_checker() -> None:
    world = {"max_objects": 4, "ungrounded_rate": 0.35}
    rng = rng_stream(1, "test", "pairs")
    for n in range(3):
        group = whatsup_group(rng, f"g{n}", world)
        assert [relation for _, relation, _ in group] == list(RELATIONS)
        assert len({tuple(_objects(scene)) for scene, _, _ in group}) == 1  # the same two objects, moved
        for scene, relation, captions in group:
            a, b = scene["objects"]
            assert relations_between(a, b) == [relation]  # the other axis within the margin: no second relation
            axis = "y" if relation in ("left of", "right of") else "x"
            assert abs(a[axis] - b[axis]) <= RELATION_MARGIN
            assert len(set(captions)) == 4 and [caption_holds(scene, c) for c in captions] == [True] + [False] * 3
        for tag in ("Relation", "Object"):
            scene0, scene1, c0, c1 = winoground_item(tag, rng, f"e{n}", world)
            assert [caption_holds(s, c) for s in (scene0, scene1) for c in (c0, c1)] == [True, False, False, True]
            moved = [i for i, (p, q) in enumerate(zip(scene0["objects"], scene1["objects"], strict=True))
                     if (p["x"], p["y"]) != (q["x"], q["y"])]
            assert (tag == "Object") == bool(moved) and (tag == "Object") == (_objects(scene0) == _objects(scene1))
        scene0, scene1, c0, c1 = coco_counterfactual_item(rng, f"c{n}", world)
        assert [caption_holds(s, c) for s in (scene0, scene1) for c in (c0, c1)] == [True, False, False, True]
        assert len(c0.split()) == len(c1.split())  # one word replaced
        assert sum(a != b for a, b in zip(c0.split(), c1.split(), strict=True)) == 1


def test_pair_files_follow_the_releases_layouts(pairs_bench: Path) -> None:
    for kind in ("whatsup", "eqben", "coco_counterfactuals"):
        assert all(Path(f).is_file() for f in benchmark_files(kind, str(pairs_bench / kind), _pair_spec(kind)))
    items = json.loads((pairs_bench / "whatsup" / "controlled_images_dataset.json").read_text())
    assert len(items) == 4 * PAIR_SIZES["whatsup_groups"]
    stems = [Path(item["image_path"]).stem.split("_") for item in items]
    assert {parts[1] for parts in stems} == {"left", "right", "on", "under"}  # the release's Controlled-A slots
    assert len({(parts[0], parts[-1]) for parts in stems}) == PAIR_SIZES["whatsup_groups"]
    pairs = json.loads((pairs_bench / "eqben" / "eqben.json").read_text())
    assert [p["image0"].split("/")[0] for p in pairs] == ["world_attr", "world_loc"] * 2
    lines = (pairs_bench / "coco_counterfactuals" / "data" / "examples.jsonl").read_text().splitlines()
    assert len(lines) == PAIR_SIZES["coco_counterfactuals_items"]


def _cosines(loaded, image: Path, texts: list[str]) -> np.ndarray:
    return (encode_texts(loaded, texts).double() @ encode_images(loaded, [open_image(image)]).double()[0]).numpy()


def test_whatsup_world_scores_as_computed_by_hand(pairs_bench: Path, loaded) -> None:
    folder = pairs_bench / "whatsup"
    result = run_benchmark(loaded, _pair_spec("whatsup"), folder)
    items = json.loads((folder / "controlled_images_dataset.json").read_text())
    right, groups = [], defaultdict(dict)
    for item in items:
        s = _cosines(loaded, folder / "images" / item["image_path"], item["caption_options"])
        right.append(int(np.argmax(s)) == 0)
        parts = Path(item["image_path"]).stem.split("_")
        groups[parts[0]][parts[1]] = right[-1]
    assert set(result.metrics) >= {"WhatsUp_A", "WhatsUp_A_pair", "WhatsUp_A_set", "mean"}
    assert "COCO_QA_ONE" not in result.metrics and result.metrics["WhatsUp_A"].n == len(items)
    assert result.metrics["WhatsUp_A"].value == pytest.approx(np.mean(right))
    assert result.metrics["mean"].value == result.metrics["WhatsUp_A"].value
    pairs = sum((g["left"] and g["right"]) + (g["on"] and g["under"]) for g in groups.values())
    assert result.metrics["WhatsUp_A_pair"].value == pytest.approx(pairs / (len(items) / 2))
    assert result.metrics["WhatsUp_A_set"].value == pytest.approx(sum(all(g.values()) for g in groups.values())
                                                                  / len(groups))


def test_eqben_world_scores_as_computed_by_hand(pairs_bench: Path, loaded) -> None:
    folder = pairs_bench / "eqben"
    result = run_benchmark(loaded, _pair_spec("eqben"), folder)
    groups = defaultdict(list)
    for pair in json.loads((folder / "eqben.json").read_text()):
        captions = [pair["caption0"], pair["caption1"]]
        s = np.stack([_cosines(loaded, folder / "images" / pair[f"image{k}"], captions) for k in (0, 1)], axis=1)
        text = s[0, 0] > s[1, 0] and s[1, 1] > s[0, 1]
        image = s[0, 0] > s[0, 1] and s[1, 1] > s[1, 0]
        groups[pair["image0"].split("/")[0]].append(text and image)
    assert result.headline == "group" and sorted(groups) == ["world_attr", "world_loc"]
    for subset, correct in groups.items():
        assert result.metrics[f"{subset}/group"].value == pytest.approx(np.mean(correct))
    assert result.metrics["group"].value == pytest.approx(np.mean([np.mean(c) for c in groups.values()]))


def test_coco_counterfactuals_world_scores_as_computed_by_hand(pairs_bench: Path, loaded) -> None:
    folder = pairs_bench / "coco_counterfactuals"
    result = run_benchmark(loaded, _pair_spec("coco_counterfactuals") | {"fraction": 1.0}, folder)
    records = [json.loads(line) for line in (folder / "data" / "examples.jsonl").read_text().splitlines()]
    captions = [r[f"caption_{k}"] for r in records for k in (0, 1)]
    images = [open_image(folder / "images" / r[f"image_{k}"]) for r in records for k in (0, 1)]
    s = (encode_images(loaded, images).double() @ encode_texts(loaded, captions).double().T).numpy()
    n = len(captions)
    i2t = np.mean([(np.delete(s[i], i) < s[i, i]).all() for i in range(n)])
    t2i = np.mean([(np.delete(s[:, j], j) < s[j, j]).all() for j in range(n)])
    assert result.metrics["i2t_r1"].n == n == 2 * PAIR_SIZES["coco_counterfactuals_items"]
    assert result.metrics["r1_mean"].value == pytest.approx((i2t + t2i) / 2)
