"""Tests of the synthetic world: scenes, rendering, captions, the truth checker, splits and benchmarks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from compo.io import read_table
from compo.world import (
    BACKGROUNDS,
    COLOURS,
    FILLER_WORDS,
    GROUNDED_WORDS,
    PATTERNS,
    RELATIONS,
    SHAPES,
    SIZES,
    SUGARCREPE_SUBSETS,
    UNGROUNDED_WORDS,
    caption_holds,
    generate_benchmarks,
    generate_split,
    long_caption,
    render_scene,
    render_short,
    rng_stream,
    sample_scene,
    sample_short_plan,
)
from compo.world.benchmarks import sugarcrepe_item
from compo.world.render import COLOUR_RGB
from compo.world.scene import RADIUS, RELATION_MARGIN, scene_relations
from compo.world.vocab import BACKGROUND_CLASHES


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _scenes(n: int, seed: int = 0, name: str = "test") -> list[dict]:
    rng = rng_stream(seed, name)
    return [sample_scene(rng, f"{name}-{i}", 4) for i in range(n)]


def _scene(objects: list[dict], background: str = "grass") -> dict:
    return {"image_id": "crafted", "background": background, "texture_seed": 1, "objects": objects,
            "relations": scene_relations(objects)}


def _obj(shape: str, colour: str, size: str, pattern: str, x: float, y: float) -> dict:
    return {"shape": shape, "colour": colour, "size": size, "pattern": pattern, "x": x, "y": y}


# A small red striped circle left of a large blue plain square, same height (no vertical relation).
TWO = _scene([
    _obj("circle", "red", "small", "striped", 0.2, 0.5),
    _obj("square", "blue", "large", "plain", 0.8, 0.5),
])


# --- vocabulary and scenes -------------------------------------------------------------------------------

def test_vocabulary_constants():
    assert {"circle", "square", "triangle", "star", "heart", "cross", "diamond"} <= set(SHAPES)
    assert {"red", "green", "blue", "yellow", "purple", "orange", "white", "black"} <= set(COLOURS)
    assert SIZES == ("small", "large") and PATTERNS == ("plain", "striped", "dotted")
    assert set(BACKGROUNDS) == {"grass", "sand", "water", "snow", "road"}
    assert set(RELATIONS) == {"left of", "right of", "above", "below"}


def test_scenes_are_valid():
    for scene in _scenes(300):
        objects = scene["objects"]
        assert 1 <= len(objects) <= 4
        keys = {(o["shape"], o["colour"], o["size"], o["pattern"]) for o in objects}
        assert len(keys) == len(objects)
        for o in objects:
            assert o["colour"] not in BACKGROUND_CLASHES[scene["background"]]  # no white on snow etc.
            assert RADIUS[o["size"]] <= o["x"] <= 1 - RADIUS[o["size"]]
            assert RADIUS[o["size"]] <= o["y"] <= 1 - RADIUS[o["size"]]
        for i, a in enumerate(objects):
            for b in objects[i + 1 :]:
                assert np.hypot(a["x"] - b["x"], a["y"] - b["y"]) >= RADIUS[a["size"]] + RADIUS[b["size"]]
        json.dumps(scene)  # JSON-able


def test_relations_follow_positions_with_a_margin():
    for scene in _scenes(100):
        objects = scene["objects"]
        listed = {(r["subject"], r["relation"], r["object"]) for r in scene["relations"]}
        expected = set()
        for i, a in enumerate(objects):
            for j, b in enumerate(objects):
                if i == j:
                    continue
                if b["x"] - a["x"] > RELATION_MARGIN:
                    expected.add((i, "left of", j))
                if a["x"] - b["x"] > RELATION_MARGIN:
                    expected.add((i, "right of", j))
                if b["y"] - a["y"] > RELATION_MARGIN:
                    expected.add((i, "above", j))
                if a["y"] - b["y"] > RELATION_MARGIN:
                    expected.add((i, "below", j))
        assert listed == expected


# --- rendering ---------------------------------------------------------------------------------------------

def test_render_draws_each_object_in_its_colour():
    for scene in _scenes(40):
        for o in scene["objects"]:
            o["pattern"] = "plain"
        image = np.asarray(render_scene(scene, 64))
        assert image.shape == (64, 64, 3)
        for o in scene["objects"]:
            # the centre may be covered by no other object: objects never overlap
            pixel = image[int(o["y"] * 64), int(o["x"] * 64)]
            assert tuple(pixel) == COLOUR_RGB[o["colour"]], (scene, o)
        again = np.asarray(render_scene(scene, 64))
        assert (image == again).all()


def test_large_objects_cover_more_pixels_and_patterns_show():
    def pixels(size: str, pattern: str) -> int:
        scene = _scene([_obj("circle", "red", size, pattern, 0.5, 0.5)], "snow")
        return int((np.asarray(render_scene(scene, 64)) == COLOUR_RGB["red"]).all(axis=-1).sum())

    assert pixels("large", "plain") > 2 * pixels("small", "plain")
    assert pixels("small", "striped") < pixels("small", "plain")
    assert pixels("small", "dotted") < pixels("small", "plain")


# --- captions and ground truth -----------------------------------------------------------------------------

def _captions(n: int, rate: float = 0.35, seed: int = 0):
    rng = rng_stream(seed, "captions")
    for scene in _scenes(n, seed):
        for _ in range(3):
            yield scene, "short", render_short(sample_short_plan(rng, scene, rate))
        yield scene, "long", long_caption(rng, scene)


def test_caption_ground_truth_is_consistent():
    known = GROUNDED_WORDS | UNGROUNDED_WORDS | FILLER_WORDS | {"to"}
    for scene, _, caption in _captions(200):
        text = caption.text
        for phrase in caption.gt_noun_phrases:
            assert re.search(rf"(^|\W){re.escape(phrase)}(\W|$)", text), (phrase, text)
        assert f"the {scene['background']}" in caption.gt_noun_phrases or scene["background"] not in text
        assert set(caption.grounded_words) <= GROUNDED_WORDS
        assert not set(caption.ungrounded_words) & GROUNDED_WORDS
        assert set(caption.ungrounded_words) <= UNGROUNDED_WORDS
        tokens = _words(text)
        assert set(tokens) <= known, set(tokens) - known
        assert set(caption.grounded_words) == set(tokens) & GROUNDED_WORDS
        assert set(caption.ungrounded_words) == set(tokens) & UNGROUNDED_WORDS


@pytest.mark.parametrize("rate", [0.0, 0.35, 1.0])
def test_ungrounded_rate(rate):
    shorts = [c for _, kind, c in _captions(300, rate) if kind == "short"]
    share = np.mean([bool(c.ungrounded_words) for c in shorts])
    assert abs(share - rate) < 4 * np.sqrt(0.25 / len(shorts)) + 1e-9


def test_long_captions_describe_every_object_and_often_exceed_77_clip_tokens():
    from compo.models import get_tokenizer

    tokenizer = get_tokenizer("compo-tiny-clip")
    longs = [(scene, c) for scene, kind, c in _captions(120) if kind == "long"]
    lengths = []
    for scene, caption in longs:
        for o in scene["objects"]:
            assert f"{o['size']} {o['colour']} {o['pattern']} {o['shape']}" in caption.text
        lengths.append(len(tokenizer.encode(caption.text)) + 2)  # + start and end tokens
    share = np.mean(np.array(lengths) > 77)
    assert share > 0.5, share


def test_grounded_words_are_concrete_and_ungrounded_words_abstract():
    """Brysbaert et al. (2014) ratings from the norms subset compo ships (1 abstract .. 5 concrete)."""
    from compo.concreteness import load_norms

    norms = load_norms()
    assert all(norms.rating(w) >= 3.5 for w in (*SHAPES, *COLOURS, *BACKGROUNDS))
    rated = {w: norms.rating(w) for w in UNGROUNDED_WORDS if norms.rating(w) is not None}
    assert len(rated) >= 0.8 * len(UNGROUNDED_WORDS)  # inflected forms ("conveys") are rated as lemmas
    assert all(r < 3.0 for r in rated.values()), rated


# --- the truth checker -------------------------------------------------------------------------------------

def test_every_generated_caption_holds_for_its_scene():
    for seed in range(3):
        for scene, kind, caption in _captions(150, seed=seed):
            assert caption_holds(scene, caption.text) is True, (kind, caption.text, scene)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a small red striped circle to the left of a large blue square on the grass", True),
        ("a striped small red circle to the left of a blue square", True),  # attribute order is free
        ("a red circle is to the left of a blue square", True),
        ("the grass with a red circle and a blue square", True),
        ("a lovely picture of a blue square in a calm mood", True),
        ("a blue square with a sense of freedom", True),
        ("a blue square with a freedom of sense", True),  # swapped ungrounded words: accidentally true
        ("a blue square to the right of a red circle", True),
        ("a red circle to the right of a blue square", False),  # converse relation
        ("a blue circle to the left of a red square", False),  # swapped colours
        ("a red square to the left of a blue circle", False),  # swapped shapes
        ("a large red circle", False),  # swapped size
        ("a red dotted circle", False),
        ("a green circle", False),
        ("a red star", False),
        ("a red circle on the sand", False),
        ("a red circle and a red circle", False),  # two mentions need two distinct objects
        ("a red circle above a blue square", False),  # same height: no vertical relation
        ("a red circle below a blue square", False),
        ("a red blue circle", False),
        ("there is a red circle on the left side of the image", True),
        ("there is a red circle on the right side", False),
        ("there is a blue square on the right side", True),
        ("there is a blue square in the top right corner", False),
        ("The image shows two objects on the grass. There is a red circle.", True),
        ("The image shows three objects on the grass. There is a red circle.", False),
        ("The scene has a calm mood. There is a purple heart.", False),
        ("a red", None),  # dangling attribute
        ("to the left of a blue square", None),  # dangling relation
        ("a red circle to the left of", None),
        ("a red ellipse", None),  # out of vocabulary
        ("a red circle with a dog", None),
        ("on the grass", None),  # no object
        ("", None),
        ("2 red circles", None),
        ("a red grass circle", None),
        ("a red mood with a circle", None),  # an attribute run ends at a function word
        ("a lovely red circle", True),
        ("a red circle to the left of the grass", None),
    ],
)
def test_truth_checker_on_crafted_statements(text, expected):
    assert caption_holds(TWO, text) is expected


def _oracle(scene: dict, c1: str, s1: str, relation: str, c2: str, s2: str) -> bool:
    """Plain-loop truth of 'a c1 s1 <relation> a c2 s2' straight from coordinates."""
    objects = scene["objects"]
    for i, a in enumerate(objects):
        for j, b in enumerate(objects):
            if i == j or (a["colour"], a["shape"]) != (c1, s1) or (b["colour"], b["shape"]) != (c2, s2):
                continue
            dx, dy = b["x"] - a["x"], b["y"] - a["y"]
            if {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[relation] > RELATION_MARGIN:
                return True
    return False


def test_truth_checker_matches_a_plain_oracle_on_random_statements():
    rng = np.random.default_rng(7)
    phrases = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}
    outcomes = []

    def pick(items: tuple[str, ...]) -> str:
        return items[int(rng.integers(len(items)))]

    for scene in _scenes(150, seed=3):
        objects = scene["objects"]
        for _ in range(8):
            # half the statements name real objects so that both outcomes occur often
            a, b = (objects[int(rng.integers(len(objects)))] for _ in range(2))
            c1, s1 = (a["colour"], a["shape"]) if rng.random() < 0.7 else (pick(COLOURS), pick(SHAPES))
            c2, s2 = (b["colour"], b["shape"]) if rng.random() < 0.7 else (pick(COLOURS), pick(SHAPES))
            relation = pick(RELATIONS)
            text = f"a {c1} {s1} {phrases[relation]} a {c2} {s2}"
            expected = _oracle(scene, c1, s1, relation, c2, s2)
            assert caption_holds(scene, text) is expected, (text, scene)
            outcomes.append(expected)
    assert 0.1 < np.mean(outcomes) < 0.9


# --- splits ------------------------------------------------------------------------------------------------

def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_split_is_byte_identical_for_the_same_seed(tmp_path, monkeypatch, tiny_world: dict):
    for run, seed in (("a", 3), ("b", 3), ("c", 4)):  # same relative out_dir: image paths agree
        (tmp_path / run).mkdir()
        monkeypatch.chdir(tmp_path / run)
        generate_split("pretrain", tiny_world, seed=seed, out_dir="world")
    a, b, c = (_files(tmp_path / x / "world") for x in "abc")
    assert len(a) == tiny_world["splits"]["pretrain"] + 2
    assert a == b
    assert a["manifest.parquet"] != c["manifest.parquet"]


def test_split_files_follow_the_manifest_contract(tmp_path, monkeypatch, tiny_world: dict):
    monkeypatch.chdir(tmp_path)
    generate_split("finetune", tiny_world, seed=0, out_dir="world/finetune")
    manifest = read_table("world/finetune/manifest.parquet", "manifest")
    n = tiny_world["splits"]["finetune"]
    assert len(manifest) == n * (tiny_world["short_captions"] + 1)
    assert manifest.caption_kind.value_counts().to_dict() == {"short": n * tiny_world["short_captions"], "long": n}
    assert set(manifest.dataset) == {"finetune"}
    scenes = [json.loads(line) for line in Path("world/finetune/scenes.jsonl").read_text().splitlines()]
    assert [s["image_id"] for s in scenes] == sorted(set(manifest.image_id))
    by_id = {s["image_id"]: s for s in scenes}
    for row in manifest.itertuples():
        assert row.image_path == f"world/finetune/images/{row.image_id}.png"  # relative, as out_dir was
        assert Path(row.image_path).exists()
        assert json.loads(row.scene) == by_id[row.image_id]
        assert caption_holds(by_id[row.image_id], row.caption) is True
        assert all(p in row.caption for p in row.gt_noun_phrases)


def test_splits_are_disjoint_and_independent(tmp_path, tiny_world: dict):
    for split in ("pretrain", "eval"):
        generate_split(split, tiny_world, seed=0, out_dir=tmp_path / split)
    bigger = {**tiny_world, "splits": {**tiny_world["splits"], "eval": tiny_world["splits"]["eval"] + 2}}
    generate_split("eval", bigger, seed=0, out_dir=tmp_path / "eval-bigger")

    def content(split: str) -> list[str]:
        lines = (tmp_path / split / "scenes.jsonl").read_text().splitlines()
        return [json.dumps({k: v for k, v in json.loads(x).items() if k != "image_id"}) for x in lines]

    assert not set(content("pretrain")) & set(content("eval"))
    # a split's stream depends on (seed, split) only: more images extend it without changing the first ones
    assert content("eval-bigger")[: tiny_world["splits"]["eval"]] == content("eval")


def test_object_centric_share_of_a_split_shows_one_object_and_leaves_other_splits_alone(tmp_path, tiny_world):
    def scenes(world: dict, split: str, name: str) -> list[dict]:
        generate_split(split, world, seed=0, out_dir=tmp_path / name)
        return [json.loads(x) for x in (tmp_path / name / "scenes.jsonl").read_text().splitlines()]

    bigger = {**tiny_world, "splits": {**tiny_world["splits"], "pretrain": 200}}
    plain = scenes(bigger, "pretrain", "plain")
    mixed = scenes({**bigger, "object_centric": {"pretrain": 0.5}}, "pretrain", "mixed")
    single = scenes({**bigger, "object_centric": {"pretrain": 1.0}}, "pretrain", "single")
    one = [len(s["objects"]) == 1 for s in mixed]
    assert all(len(s["objects"]) == 1 for s in single)
    # with max_objects 4, a plain scene has one object a quarter of the time: the mix is 0.5 + 0.5 / 4
    assert 0.5 < np.mean(one) < 0.75 and np.mean([len(s["objects"]) == 1 for s in plain]) < 0.4
    # other splits keep their exact scenes when only pretrain is object-centric
    assert scenes({**tiny_world, "object_centric": {"pretrain": 0.5}}, "eval", "eval-a") == scenes(
        tiny_world, "eval", "eval-b")


def test_binding_twins_are_exact_swaps_kept_apart_from_the_split_they_join(tmp_path, tiny_world):
    bigger = {**tiny_world, "splits": {**tiny_world["splits"], "pretrain": 40}}
    generate_split("pretrain", bigger, seed=0, out_dir=tmp_path / "plain")
    generate_split("pretrain", {**bigger, "binding_twins": {"pretrain": 1.0}}, seed=0, out_dir=tmp_path / "twins")
    plain = read_table(tmp_path / "plain" / "manifest.parquet", "manifest")
    twins = read_table(tmp_path / "twins" / "manifest.parquet", "manifest")
    paired = twins[twins["binding_twin"].notna()]
    # the split's own images and captions are those it has without twins; twins only add rows
    own = twins[twins["binding_twin"].isna() & ~twins["image_id"].str.endswith("-twin")].reset_index(drop=True)
    assert own[["caption_id", "caption", "scene"]].equals(plain[["caption_id", "caption", "scene"]])
    multi = sum(len(json.loads(s)["objects"]) > 1 for s in plain.drop_duplicates("image_id")["scene"])
    assert 0.8 * multi <= len(paired) // 2 <= multi
    by_id = paired.set_index("caption_id")
    for row in paired[~paired["image_id"].str.endswith("-twin")].itertuples():
        twin = by_id.loc[row.binding_twin]
        assert by_id.loc[twin.name, "binding_twin"] == row.caption_id  # partners name each other
        assert sorted(row.caption.split()) == sorted(twin.caption.split()) and row.caption != twin.caption
        scene, twin_scene = json.loads(row.scene), json.loads(twin.scene)
        assert caption_holds(scene, row.caption) is True and caption_holds(scene, twin.caption) is False
        assert caption_holds(twin_scene, twin.caption) is True and caption_holds(twin_scene, row.caption) is False
        # the re-render keeps the objects' shapes and the background (a swapped size may move an object)
        assert [o["shape"] for o in scene["objects"]] == [o["shape"] for o in twin_scene["objects"]]
        assert (scene["background"], scene["texture_seed"]) == (twin_scene["background"], twin_scene["texture_seed"])
        assert Path(twin.image_path).is_file()


def test_a_caption_style_writes_its_split_as_told_and_leaves_the_others_alone(tmp_path, tiny_world):
    """world.caption_style.<split>: only that split's short captions change (the others byte for byte), and
    they follow the style: no framing noun or ungrounded phrase at rate 0, the mentions between min and max,
    every relation stated at 1, no attribute shown at 0 but the colours at 1."""
    bigger = {**tiny_world, "splits": {**tiny_world["splits"], "finetune": 60}}
    style = {"framing": 0.0, "ungrounded_rate": 0.0, "min_mentions": 2, "max_mentions": 2, "relation": 1.0,
             "background": 1.0, "background_first": 0.0, "copula": 0.0,
             "show": {"size": 0.0, "colour": 1.0, "pattern": 0.0}}
    styled = {**bigger, "caption_style": {"finetune": style}}
    for split in ("pretrain", "finetune"):
        generate_split(split, bigger, seed=0, out_dir=tmp_path / "plain" / split)
        generate_split(split, styled, seed=0, out_dir=tmp_path / "styled" / split)
    manifests = {name: read_table(tmp_path / name / "finetune" / "manifest.parquet", "manifest")
                 for name in ("plain", "styled")}
    pretrain = [read_table(tmp_path / name / "pretrain" / "manifest.parquet", "manifest").drop(columns="image_path")
                for name in ("plain", "styled")]
    pd.testing.assert_frame_equal(*pretrain)
    short = manifests["styled"][manifests["styled"]["caption_kind"] == "short"]
    assert not manifests["plain"]["caption"].equals(manifests["styled"]["caption"])
    for row in short.itertuples():
        scene, words = json.loads(row.scene), _words(row.caption)
        assert not {"photo", "image", "picture"} & set(words) and not set(words) & UNGROUNDED_WORDS, row.caption
        shapes = [w for w in words if w in SHAPES]
        assert len(shapes) == min(2, len(scene["objects"])), row.caption
        assert sum(w in COLOURS for w in words) == len(shapes) and not set(words) & (set(SIZES) | set(PATTERNS))
        assert scene["background"] in words and caption_holds(scene, row.caption) is True
        if len(shapes) == 2 and any(r["subject"] != r["object"] for r in scene["relations"]):
            assert {"left", "right", "above", "below"} & set(words), row.caption
    with pytest.raises(KeyError, match="caption_style.test: no such split"):
        generate_split("finetune", {**bigger, "caption_style": {"test": {}}}, seed=0, out_dir=tmp_path / "x")
    with pytest.raises(KeyError, match="caption_style.finetune: .*framed"):
        generate_split("finetune", {**bigger, "caption_style": {"finetune": {"framed": 1}}}, seed=0,
                       out_dir=tmp_path / "y")


@pytest.mark.parametrize(("share", "message"), [({"test": 0.5}, "object_centric.test: no such split"),
                                                ({"pretrain": 1.5}, r"object_centric.pretrain must be a share")])
def test_a_bad_object_centric_share_names_the_key(tmp_path, tiny_world, share, message):
    with pytest.raises((KeyError, ValueError), match=message):
        generate_split("pretrain", {**tiny_world, "object_centric": share}, seed=0, out_dir=tmp_path)


def test_unknown_split_is_an_error(tmp_path, tiny_world: dict):
    with pytest.raises(KeyError, match="split 'test'"):
        generate_split("test", tiny_world, seed=0, out_dir=tmp_path)


# --- benchmarks --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("subset", SUGARCREPE_SUBSETS)
def test_sugarcrepe_negatives_are_false_and_swaps_keep_the_words(subset, tiny_world: dict):
    rng = rng_stream(0, "test-sugarcrepe", subset)
    for index in range(25):
        scene, positive, negative = sugarcrepe_item(subset, rng, f"{subset}-{index}", tiny_world)
        assert positive != negative
        assert caption_holds(scene, positive) is True
        assert caption_holds(scene, negative) is False
        if subset.startswith("swap"):
            assert sorted(_words(positive)) == sorted(_words(negative))
        if subset.startswith("add"):
            assert len(_words(negative)) > len(_words(positive))
        if subset == "replace_obj":
            changed = set(_words(negative)) - set(_words(positive))
            assert changed and changed <= set(SHAPES) - {o["shape"] for o in scene["objects"]}


def test_benchmark_files_parse(tmp_path, tiny_world: dict):
    generate_benchmarks(tiny_world, seed=0, out_dir=tmp_path)
    per_subset = tiny_world["benchmarks"]["sugarcrepe_per_subset"]
    for subset in SUGARCREPE_SUBSETS:
        items = json.loads((tmp_path / "sugarcrepe" / f"{subset}.json").read_text())
        assert sorted(items) == [str(i) for i in range(per_subset)]
        for item in items.values():
            assert set(item) == {"filename", "caption", "negative_caption"}
            assert (tmp_path / "sugarcrepe" / "images" / item["filename"]).exists()
            assert item["caption"] != item["negative_caption"]
    for folder, classes in (("zeroshot-shape", SHAPES), ("zeroshot-colour", COLOURS)):
        names = json.loads((tmp_path / folder / "classnames.json").read_text())
        assert sorted(names) == sorted(classes)
        assert all(cls in name for cls, name in names.items())
        for cls in classes:
            n_images = len(list((tmp_path / folder / cls).glob("*.png")))
            assert n_images == tiny_world["benchmarks"]["zeroshot_per_class"]
    data = json.loads((tmp_path / "retrieval" / "dataset.json").read_text())
    assert len(data["images"]) == tiny_world["splits"]["eval"]
    for image in data["images"]:
        assert image["split"] == "test" and image["filepath"] == ""
        assert (tmp_path / "retrieval" / "images" / image["filename"]).exists()
        assert len(image["sentences"]) == tiny_world["short_captions"]
        for sentence in image["sentences"]:
            assert sentence["tokens"] == _words(sentence["raw"])
    assert len({i["imgid"] for i in data["images"]}) == len(data["images"])
    for cls in COLOURS:  # a zero-shot colour image shows its colour
        image = np.asarray(Image.open(next((tmp_path / "zeroshot-colour" / cls).glob("*.png"))))
        assert (image == COLOUR_RGB[cls]).all(axis=-1).any()
    # same seed, byte-identical files
    generate_benchmarks(tiny_world, seed=0, out_dir=tmp_path / "again")
    first = {k: v for k, v in _files(tmp_path).items() if not k.startswith("again")}
    assert _files(tmp_path / "again") == first
