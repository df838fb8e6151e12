"""Writing a split of the world: PNG images, scene graphs (JSONL) and the caption manifest."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from compo.io import write_table, write_text
from compo.world.captions import Caption, CaptionStyle, long_caption, render_short, sample_short_plan
from compo.world.edit import binding_twin
from compo.world.render import render_scene
from compo.world.scene import rng_stream, sample_scene

log = logging.getLogger(__name__)


def scene_json(scene: dict[str, Any]) -> str:
    return json.dumps(scene, sort_keys=True, separators=(",", ":"))


def save_png(image: Any, path: Path) -> None:
    # Written in place (no temporary + rename per image): the manifest, written last and atomically, is
    # what marks a split complete.
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")


def check_world(world: dict[str, Any], split: str | None = None) -> None:
    for key in ("image_size", "splits", "short_captions", "max_objects", "ungrounded_rate"):
        if key not in world:
            raise KeyError(f"world config: missing key {key!r}")
    if split is not None and split not in world["splits"]:
        raise KeyError(f"world config: split {split!r} not in world.splits {sorted(world['splits'])}")
    for name, entry in world.get("caption_style", {}).items():
        if name not in world["splits"]:
            raise KeyError(f"world config: caption_style.{name}: no such split in world.splits "
                           f"{sorted(world['splits'])}")
        try:
            CaptionStyle.from_config(entry)
        except TypeError as error:
            raise KeyError(f"world config: caption_style.{name}: {error}") from error
    for key in ("object_centric", "binding_twins"):
        for name, share in world.get(key, {}).items():
            if name not in world["splits"]:
                raise KeyError(f"world config: {key}.{name}: no such split in world.splits "
                               f"{sorted(world['splits'])}")
            if not 0 <= share <= 1:
                raise ValueError(f"world config: {key}.{name} must be a share in [0, 1], got {share!r}")


def object_centric_share(world: dict[str, Any], split: str) -> float:
    """The share of the split's images that show one object (`world.object_centric`, default 0).

    Web-scale pretraining data is full of object-centric photos whose caption names the one object (the
    stand-in for ImageNet-like images in LAION); on multi-object scenes alone a tiny contrastive model can
    tell a batch's images apart by colour, background and count and never needs the shape (docs/embedded-study.md)."""
    return float(world.get("object_centric", {}).get(split, 0.0))


def binding_twin_share(world: dict[str, Any], split: str) -> float:
    """The share of the split's multi-object scenes that come with their binding twin (`world.binding_twins`,
    default 0): the scene re-rendered with one attribute exchanged between two of its objects
    (`compo.world.edit.binding_twin`), a caption of each that differs only in that binding, and the two
    captions kept in one training batch (`compo.batches.paired_order`). A contrastive batch of 64 holds
    almost no such pair by chance, so pretraining never has to tell a caption from its binding swap
    (docs/embedded-study.md, "Why binding is not learned"); web-scale data holds many."""
    return float(world.get("binding_twins", {}).get(split, 0.0))


def caption_style(world: dict[str, Any], split: str) -> CaptionStyle:
    """How the split's short captions are written (`world.caption_style.<split>`; none: the original style).

    The fine-tuning split stands for COCO, whose captions seldom open with "a photo of", rarely carry mood words
    and name more objects and relations than the pretraining alt-text the original style imitates: what
    NegCLIP's swaps spend their draws on follows (docs/embedded-study.md, "A world whose negatives are spent
    like COCO's")."""
    return CaptionStyle.from_config(world.get("caption_style", {}).get(split))


def _row(image_id: str, image_path: str, caption_id: str, caption: Caption, dataset: str, kind: str,
         scene: str, binding_twin: str | None = None) -> dict[str, Any]:
    return {
        "image_id": image_id,
        "image_path": image_path,
        "caption_id": caption_id,
        "caption": caption.text,
        "dataset": dataset,
        "caption_kind": kind,
        "scene": scene,
        "gt_noun_phrases": caption.gt_noun_phrases,
        "grounded_words": caption.grounded_words,
        "ungrounded_words": caption.ungrounded_words,
        "binding_twin": binding_twin,
    }


def generate_split(split: str, world: dict[str, Any], seed: int, out_dir: str | Path) -> None:
    """Write `out_dir/images/*.png`, `out_dir/scenes.jsonl` and `out_dir/manifest.parquet` for one split.

    The split's own random stream comes from (seed, split), so splits are independent and the same seed
    gives byte-identical files. Binding twins (`binding_twin_share`) come from a stream of their own and
    are added after their scene (image `{id}-twin`, one short and one long caption; the scene gains the
    short caption `{id}-b` they pair with), so the split's other images and captions are those it has
    without them."""
    check_world(world, split)
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = rng_stream(seed, "split", split)
    single = object_centric_share(world, split)
    twins = binding_twin_share(world, split)
    twin_rng = rng_stream(seed, "split", split, "binding-twins")
    style = caption_style(world, split)
    rows, scene_lines = [], []
    wanted = made = 0
    for index in range(int(world["splits"][split])):
        image_id = f"{split}-{index:06d}"
        # drawn only when the split has object-centric images, so other splits keep their exact bytes
        one_object = single > 0 and rng.random() < single
        scene = sample_scene(rng, image_id, world["max_objects"], n_objects=1 if one_object else None)
        image_path = out_dir / "images" / f"{image_id}.png"
        save_png(render_scene(scene, world["image_size"]), image_path)
        encoded = scene_json(scene)
        scene_lines.append(encoded)
        for k in range(world["short_captions"]):
            caption = render_short(sample_short_plan(rng, scene, world["ungrounded_rate"], style))
            rows.append(_row(image_id, str(image_path), f"{image_id}-s{k}", caption, split, "short", encoded))
        caption = long_caption(rng, scene)
        rows.append(_row(image_id, str(image_path), f"{image_id}-long", caption, split, "long", encoded))
        if twins > 0 and len(scene["objects"]) > 1 and twin_rng.random() < twins:
            wanted += 1
            found = binding_twin(twin_rng, scene, world["ungrounded_rate"], style=style)
            if found is None:
                continue
            made += 1
            bound, swapped, twin = found
            twin_id = f"{image_id}-twin"
            twin["image_id"] = twin_id
            twin_path = out_dir / "images" / f"{twin_id}.png"
            save_png(render_scene(twin, world["image_size"]), twin_path)
            twin_encoded = scene_json(twin)
            scene_lines.append(twin_encoded)
            rows.append(_row(image_id, str(image_path), f"{image_id}-b", bound, split, "short", encoded,
                             binding_twin=f"{twin_id}-b"))
            rows.append(_row(twin_id, str(twin_path), f"{twin_id}-b", swapped, split, "short", twin_encoded,
                             binding_twin=f"{image_id}-b"))
            rows.append(_row(twin_id, str(twin_path), f"{twin_id}-long", long_caption(twin_rng, twin), split,
                             "long", twin_encoded))
    write_text("\n".join(scene_lines) + "\n", out_dir / "scenes.jsonl")
    write_table(pd.DataFrame(rows), out_dir / "manifest.parquet", "manifest")
    if twins > 0:
        log.info("world split %s: %d of %d multi-object scenes drawn for a binding twin got one (%d without: no "
                 "caption of theirs states one attribute of two objects that differ in it)", split, made,
                 wanted, wanted - made)
    log.info("world split %s: %d images, %d captions -> %s", split, len(scene_lines), len(rows), out_dir)
