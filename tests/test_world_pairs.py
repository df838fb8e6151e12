"""The world's What's Up, EqBen and COCO-Counterfactuals (issue 47 item 5): each is written in its release's layout,
its labels hold by the truth checker, and the release's loader reads it (`source: world`) with the scores a hand
computation gives on the tiny model."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from compo.evaluate import benchmark_files, run_benchmark
from compo.images import open_image
from compo.models import encode_images, encode_texts
from compo.world.benchmarks import (
    _coco_counterfactuals,
    _eqben,
    _whatsup,
    coco_counterfactual_item,
    whatsup_group,
    winoground_item,
    world_benchmarks,
)
from compo.world.scene import RELATION_MARGIN, relations_between, rng_stream
from compo.world.truth import caption_holds
from compo.world.vocab import RELATIONS

pytestmark = pytest.mark.usefixtures("one_thread")
SIZES = {"whatsup_groups": 2, "eqben_items": 4, "coco_counterfactuals_items": 4}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = {"image_size": 32, "max_objects": 4, "ungrounded_rate": 0.35,
             "benchmarks": {"sugarcrepe_per_subset": 3, "zeroshot_per_class": 2, **SIZES}}
    out = tmp_path_factory.mktemp("world_pairs")
    for write, name in ((_whatsup, "whatsup"), (_eqben, "eqben"), (_coco_counterfactuals, "coco_counterfactuals")):
        write(world, 0, out / name)
    return out


def _spec(kind: str) -> dict:
    return {**world_benchmarks()[kind], "source": "world"}


def _objects(scene: dict) -> list[tuple]:
    return [(o["shape"], o["colour"], o["size"], o["pattern"]) for o in scene["objects"]]


def test_item_labels_hold_by_the_truth_checker() -> None:
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


def test_files_follow_the_releases_layouts(written: Path) -> None:
    for kind in ("whatsup", "eqben", "coco_counterfactuals"):
        assert all(Path(f).is_file() for f in benchmark_files(kind, str(written / kind), _spec(kind)))
    items = json.loads((written / "whatsup" / "controlled_images_dataset.json").read_text())
    assert len(items) == 4 * SIZES["whatsup_groups"]
    stems = [Path(item["image_path"]).stem.split("_") for item in items]
    assert {parts[1] for parts in stems} == {"left", "right", "on", "under"}  # the release's Controlled-A slots
    assert len({(parts[0], parts[-1]) for parts in stems}) == SIZES["whatsup_groups"]
    pairs = json.loads((written / "eqben" / "eqben.json").read_text())
    assert [p["image0"].split("/")[0] for p in pairs] == ["world_attr", "world_loc"] * 2
    lines = (written / "coco_counterfactuals" / "data" / "examples.jsonl").read_text().splitlines()
    assert len(lines) == SIZES["coco_counterfactuals_items"]


def _cosines(loaded, image: Path, texts: list[str]) -> np.ndarray:
    return (encode_texts(loaded, texts).double() @ encode_images(loaded, [open_image(image)]).double()[0]).numpy()


def test_whatsup_world_scores_as_computed_by_hand(written: Path, loaded) -> None:
    folder = written / "whatsup"
    result = run_benchmark(loaded, _spec("whatsup"), folder)
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


def test_eqben_world_scores_as_computed_by_hand(written: Path, loaded) -> None:
    folder = written / "eqben"
    result = run_benchmark(loaded, _spec("eqben"), folder)
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


def test_coco_counterfactuals_world_scores_as_computed_by_hand(written: Path, loaded) -> None:
    folder = written / "coco_counterfactuals"
    result = run_benchmark(loaded, _spec("coco_counterfactuals") | {"fraction": 1.0}, folder)
    records = [json.loads(line) for line in (folder / "data" / "examples.jsonl").read_text().splitlines()]
    captions = [r[f"caption_{k}"] for r in records for k in (0, 1)]
    images = [open_image(folder / "images" / r[f"image_{k}"]) for r in records for k in (0, 1)]
    s = (encode_images(loaded, images).double() @ encode_texts(loaded, captions).double().T).numpy()
    n = len(captions)
    i2t = np.mean([(np.delete(s[i], i) < s[i, i]).all() for i in range(n)])
    t2i = np.mean([(np.delete(s[:, j], j) < s[j, j]).all() for j in range(n)])
    assert result.metrics["i2t_r1"].n == n == 2 * SIZES["coco_counterfactuals_items"]
    assert result.metrics["r1_mean"].value == pytest.approx((i2t + t2i) / 2)


def test_whatsup_subsets_must_be_known_names() -> None:
    from compo.evaluate.files import BenchmarkError, whatsup_subsets

    assert whatsup_subsets({}) == ["WhatsUp_A", "WhatsUp_B", "COCO_QA_ONE", "COCO_QA_TWO", "VG_QA_ONE", "VG_QA_TWO"]
    with pytest.raises(BenchmarkError, match=r"whatsup: 'subsets' must be .* got \['WhatsUp_C'\]"):
        benchmark_files("whatsup", "b", {"subsets": ["WhatsUp_C"]})
