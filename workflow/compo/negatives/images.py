"""Image negatives for the synthetic world: each true negative caption re-rendered exactly.

For a valid negatives row whose caption has a scene (manifest `scene`) and whose truth is "false", the
negative caption is realized on the anchor's scene with `compo.world.edit.realize_caption` (the minimal
edit making it hold) while the anchor's own caption is required NOT to hold on the edited scene: that
is what makes the image a hard negative of the anchor (the pair differs exactly in what the caption
swap changed). The scene is rendered to `out_dir/{caption_id}__{slot}.png` (characters outside
[A-Za-z0-9._-] replaced by "_"). PNG files, not a tar shard as SDXL-Turbo's real-data images
(compo.negatives.diffusion): the embedded study writes a few thousand, in one unsharded job whose folder is
also the (empty) output of every generator without images; a shard would save no inode quota worth the
rule's second output kind.

Image size: the anchor image's own size, read from its PNG header (manifest `image_path`), so the
negative lies on the anchor's pixel grid whatever the config said when the split was written; an
explicit `image_size` overrides it (and avoids touching the anchor files).

Row outcomes (logged, and returned in `paths.attrs["counts"]`):
  rendered             a negative image was written
  not_applicable       invalid slot, or truth is not "false" (a hard positive or unknown)
  no_scene             truth "false" but the manifest has no scene for the caption (cannot happen with the
                       stage's own truth labels; counted for tables from elsewhere)
  not_realizable       no edit within the world's rules makes the negative hold
  anchor_still_holds   the negative can be realized, but only on scenes where the anchor caption holds too
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
from PIL import Image

from compo.world import caption_holds, render_scene
from compo.world.edit import realize_caption

log = logging.getLogger(__name__)

OUTCOMES = ("rendered", "not_applicable", "no_scene", "not_realizable", "anchor_still_holds")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def image_name(caption_id: str, slot: int) -> str:
    return f"{_UNSAFE.sub('_', str(caption_id))}__{int(slot)}.png"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _anchor_size(image_path: str, caption_id: str) -> int:
    try:
        with Image.open(image_path) as image:  # reads the header only
            width, height = image.size
    except OSError as error:
        raise ValueError(f"manifest: caption_id {caption_id!r}: cannot read image {image_path!r} to take its "
                         f"size ({error}); pass image_size explicitly") from error
    if width != height:
        raise ValueError(f"manifest: caption_id {caption_id!r}: image {image_path!r} is {width}x{height}, "
                         f"world images are square")
    return width


def render_negative_images(negatives: pd.DataFrame, manifest: pd.DataFrame, out_dir: str | Path,
                           image_size: int | None = None) -> pd.Series:
    """The path of each row's negative image (None where none applies), written under `out_dir`.

    `negatives` follows the negatives contract, `manifest` the manifest contract (joined on caption_id).
    The Series is aligned with `negatives.index`, named `negative_image`; `attrs["counts"]` holds the
    outcome counts (module docstring). Deterministic: the same tables give byte-identical files."""
    for column in ("caption_id", "slot", "negative", "valid", "truth"):
        if column not in negatives.columns:
            raise KeyError(f"negatives table: missing column {column!r}")
    for column in ("caption_id", "caption", "scene", "image_path"):
        if column not in manifest.columns:
            raise KeyError(f"manifest: missing column {column!r}")
    anchors = {row["caption_id"]: row for row in manifest[["caption_id", "caption", "scene", "image_path"]]
               .to_dict("records")}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scenes: dict[str, dict[str, Any]] = {}   # one parse per distinct scene JSON (captions share images)
    sizes: dict[str, int] = {}
    names: dict[str, Any] = {}
    counts: Counter[str] = Counter({outcome: 0 for outcome in OUTCOMES})
    paths: list[str | None] = []
    for index, row in zip(negatives.index, negatives.to_dict("records"), strict=True):
        caption_id = row["caption_id"]
        if not row["valid"] or row["truth"] != "false":
            counts["not_applicable"] += 1
            paths.append(None)
            continue
        if caption_id not in anchors:
            raise ValueError(f"negatives row {index}: caption_id {caption_id!r} is not in the manifest")
        anchor = anchors[caption_id]
        if _missing(anchor["scene"]):
            counts["no_scene"] += 1
            paths.append(None)
            continue
        if anchor["scene"] not in scenes:
            try:
                scenes[anchor["scene"]] = json.loads(anchor["scene"])
            except json.JSONDecodeError as error:
                raise ValueError(f"manifest: caption_id {caption_id!r}: scene is not JSON ({error})") \
                    from error
        scene = scenes[anchor["scene"]]
        edited = realize_caption(scene, row["negative"], avoid=anchor["caption"])
        if edited is None:
            realizable = realize_caption(scene, row["negative"]) is not None
            counts["anchor_still_holds" if realizable else "not_realizable"] += 1
            paths.append(None)
            continue
        # realize_caption verified both; checked again here because this is the image's whole point
        if caption_holds(edited, row["negative"]) is not True or caption_holds(edited, anchor["caption"]):
            raise AssertionError(f"negatives row {index} ({caption_id!r} slot {row['slot']}): the edited "
                                 f"scene does not separate the negative from the anchor caption")
        size = image_size
        if size is None:
            path = anchor["image_path"]
            if path not in sizes:
                sizes[path] = _anchor_size(path, caption_id)
            size = sizes[path]
        name = image_name(caption_id, row["slot"])
        if name in names:
            raise ValueError(f"negatives rows {names[name]} and {index}: both map to image file {name!r}")
        names[name] = index
        target = out_dir / name
        render_scene(edited, size).save(target, format="PNG")
        paths.append(str(target))
        counts["rendered"] += 1
    result = pd.Series(paths, index=negatives.index, name="negative_image", dtype=object)
    result.attrs["counts"] = dict(counts)
    applicable = sum(counts[o] for o in ("rendered", "not_realizable", "anchor_still_holds"))
    share = 100 * counts["rendered"] / applicable if applicable else 0.0
    log.info("image negatives -> %s: %d rendered of %d true negatives with a scene (%.1f%%); %d not "
             "realizable, %d where the anchor caption would still hold, %d without a scene, %d rows not "
             "applicable", out_dir, counts["rendered"], applicable, share, counts["not_realizable"],
             counts["anchor_still_holds"], counts["no_scene"], counts["not_applicable"])
    return result
