"""Benchmarks from held-out scenes, written in the real benchmarks' file formats.

- `sugarcrepe/{subset}.json`: {"0": {"filename", "caption", "negative_caption"}, ...} and `sugarcrepe/images/`
- `zeroshot-shape/`, `zeroshot-colour/`: ImageFolder `{class}/{NNNN}.png` plus `classnames.json`
- `retrieval/dataset.json` (Karpathy format) and `retrieval/images/`
- `sugarcrepe_pp/{subset}.json`: [{"id", "filename", "caption", "caption2", "negative_caption"}, ...]
- `winoground/examples.jsonl` and `winoground/images/ex_{id}_img_{0,1}.png`
- `aro_relation/visual_genome_relation.json`, `aro_attribution/visual_genome_attribution.json`
  (with bounding boxes of the object pair in pixels) and their `images/`
- `aro_order/dataset.json`, `long_retrieval/dataset.json` (Karpathy format; short / long captions)
- `valse/{relations,foil-it}.json` ({foil_id: {"dataset", "image_file", "caption", "foil", ...}})
- `linear_probe/{train,test}/{class}/{NNNN}.png` plus `classnames.json`
- `whatsup/controlled_images_dataset.json` (What's Up Controlled-A: four caption options, the right one first) and
  `whatsup/images/controlled_images/<object>_<preposition>_<object>.png`
- `eqben/eqben.json` (EqBen's Winoground-style pairs) and `eqben/images/world_{attr,loc}/`
- `coco_counterfactuals/data/examples.jsonl` and `coco_counterfactuals/images/`
Every stream is derived from (seed, "benchmark", name), never shared with the training splits. Every
caption is checked with the truth checker: positives hold, negatives and foils do not.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from compo.evaluate.files import COCO_CF_FILE, WHATSUP_FILES
from compo.io import write_json, write_text
from compo.layout import WORLD_ZEROSHOT_ATTRIBUTES, world_benchmark_folder
from compo.world.captions import (
    BACKGROUND_FIRST,
    FRAMINGS,
    Caption,
    Mention,
    ShortPlan,
    long_caption,
    render_short,
    sample_short_plan,
    swap_values,
    words,
)
from compo.world.edit import realize_caption
from compo.world.render import render_scene
from compo.world.scene import (
    EDGE,
    GAP,
    POSITION_DECIMALS,
    RADIUS,
    pick,
    relations_between,
    rng_stream,
    sample_scene,
    scene_relations,
)
from compo.world.splits import check_world, save_png
from compo.world.truth import caption_holds
from compo.world.vocab import (
    ATTRIBUTE_FIELDS,
    BACKGROUND_CLASHES,
    COLOURS,
    CONVERSE,
    FIELD_VALUES,
    RELATION_PHRASES,
    RELATIONS,
    SHAPES,
    article,
)

log = logging.getLogger(__name__)

# The world's own sets, named apart from the real benchmarks': two VALSE pieces (piece file -> the world's
# perturbation it holds), not real VALSE's 11 (compo.evaluate.files); What's Up's Controlled-A layout only (two
# objects, four relations); EqBen's annotation file.
WORLD_VALSE_PIECES: dict[str, str] = {"relations": "replace_rel", "foil-it": "replace_obj"}
WORLD_WHATSUP_SUBSETS = ["WhatsUp_A"]
WORLD_EQBEN_FILE = "eqben.json"

SUGARCREPE_SUBSETS: tuple[str, ...] = (
    "replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att",
)
# Prompt templates read "a photo of a {}."; a bare colour is not a noun, so colour classes get one.
COLOURED_THING = "{} object"
MAX_ATTEMPTS = 2000

Perturb = Callable[[np.random.Generator, dict[str, Any], ShortPlan], ShortPlan | None]


def _replace_obj(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan) -> ShortPlan | None:
    absent = [s for s in SHAPES if s not in {o["shape"] for o in scene["objects"]}]
    negative = plan.copy()
    pick(rng, negative.mentions).values["shape"] = pick(rng, absent)
    return negative


def _set_wrong_attribute(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan,
                         mentioned: bool) -> ShortPlan | None:
    """Give one mention a value its object lacks, for an attribute it states (replace) or not (add)."""
    options = [(i, f) for i, m in enumerate(plan.mentions) for f in ATTRIBUTE_FIELDS
               if (f in m.values) == mentioned]
    if not options:
        return None
    i, f = pick(rng, options)
    negative = plan.copy()
    own = scene["objects"][plan.mentions[i].obj][f]
    negative.mentions[i].values[f] = pick(rng, [v for v in FIELD_VALUES[f] if v != own])
    return negative


def _replace_rel(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan) -> ShortPlan | None:
    options = [i for i, r in enumerate(plan.relations) if r is not None]
    if not options:
        return None
    i = pick(rng, options)
    negative = plan.copy()
    negative.relations[i] = CONVERSE[plan.relations[i]]
    return negative


def _swap_obj(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan) -> ShortPlan | None:
    return swap_values(plan, rng, ("shape",))


def _swap_att(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan) -> ShortPlan | None:
    return swap_values(plan, rng, ATTRIBUTE_FIELDS)


def _add_obj(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan) -> ShortPlan | None:
    negative = plan.copy()
    negative.extra = [Mention(-1, {"colour": pick(rng, COLOURS), "shape": pick(rng, SHAPES)})]
    return negative


def _replace_att(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan) -> ShortPlan | None:
    return _set_wrong_attribute(rng, scene, plan, mentioned=True)


def _add_att(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan) -> ShortPlan | None:
    return _set_wrong_attribute(rng, scene, plan, mentioned=False)


PERTURBATIONS: dict[str, Perturb] = {
    "replace_obj": _replace_obj,
    "replace_att": _replace_att,
    "replace_rel": _replace_rel,
    "swap_obj": _swap_obj,
    "swap_att": _swap_att,
    "add_obj": _add_obj,
    "add_att": _add_att,
}


def sugarcrepe_item(
    subset: str, rng: np.random.Generator, image_id: str, world: dict[str, Any]
) -> tuple[dict[str, Any], str, str]:
    """A held-out scene with a true caption and a false negative made by the subset's perturbation."""
    perturb = PERTURBATIONS[subset]
    for _ in range(MAX_ATTEMPTS):
        scene = sample_scene(rng, image_id, world["max_objects"])
        plan = sample_short_plan(rng, scene, world["ungrounded_rate"])
        negative = perturb(rng, scene, plan)
        if negative is None:
            continue
        positive_text, negative_text = render_short(plan).text, render_short(negative).text
        if negative_text != positive_text and caption_holds(scene, negative_text) is False:
            if caption_holds(scene, positive_text) is not True:
                raise RuntimeError(f"sugarcrepe {subset} {image_id}: generated caption does not hold: "
                                   f"{positive_text!r}")
            return scene, positive_text, negative_text
    raise RuntimeError(f"sugarcrepe {subset}: no valid item after {MAX_ATTEMPTS} scenes")


def _sugarcrepe(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    n = int(world["benchmarks"]["sugarcrepe_per_subset"])
    for subset in SUGARCREPE_SUBSETS:
        rng = rng_stream(seed, "benchmark", "sugarcrepe", subset)
        items = {}
        for index in range(n):
            filename = f"{subset}-{index:04d}.png"
            scene, caption, negative = sugarcrepe_item(subset, rng, filename[:-4], world)
            save_png(render_scene(scene, world["image_size"]), out_dir / "images" / filename)
            items[str(index)] = {"filename": filename, "caption": caption, "negative_caption": negative}
        write_json(items, out_dir / f"{subset}.json")


def _zeroshot(world: dict[str, Any], seed: int, out_dir: Path, attribute: str) -> None:
    rng = rng_stream(seed, "benchmark", out_dir.name)
    classnames = {}
    for value in FIELD_VALUES[attribute]:
        classnames[value] = value if attribute == "shape" else COLOURED_THING.format(value)
        for index in range(int(world["benchmarks"]["zeroshot_per_class"])):
            scene = sample_scene(rng, f"{value}-{index:04d}", world["max_objects"], n_objects=1,
                                 fixed={attribute: value})
            save_png(render_scene(scene, world["image_size"]), out_dir / value / f"{index:04d}.png")
    write_json(classnames, out_dir / "classnames.json")


def _karpathy(world: dict[str, Any], seed: int, out_dir: Path, name: str,
              captions: Callable[[np.random.Generator, dict[str, Any]], list[Caption]], min_objects: int = 1) -> None:
    """A Karpathy-format test set of `splits.eval` scenes (at least `min_objects` objects each, as far as
    max_objects allows), each with the captions `captions` draws."""
    rng = rng_stream(seed, "benchmark", name)
    images, sentence_id = [], 0
    low = min(min_objects, world["max_objects"])
    for index in range(int(world["splits"]["eval"])):
        filename = f"{name}-{index:06d}.png"
        n_objects = int(rng.integers(low, world["max_objects"] + 1)) if low > 1 else None
        scene = sample_scene(rng, filename[:-4], world["max_objects"], n_objects=n_objects)
        save_png(render_scene(scene, world["image_size"]), out_dir / "images" / filename)
        sentences = []
        for caption in captions(rng, scene):
            raw = caption.text
            sentences.append({"raw": raw, "tokens": words(raw), "imgid": index, "sentid": sentence_id})
            sentence_id += 1
        images.append({
            "imgid": index,
            "filename": filename,
            "filepath": "",
            "split": "test",
            "sentids": [s["sentid"] for s in sentences],
            "sentences": sentences,
        })
    write_json({"images": images, "dataset": "world"}, out_dir / "dataset.json")


def _short_captions(world: dict[str, Any]) -> Callable[[np.random.Generator, dict[str, Any]], list[Caption]]:
    def draw(rng: np.random.Generator, scene: dict[str, Any]) -> list[Caption]:
        return [render_short(sample_short_plan(rng, scene, world["ungrounded_rate"]))
                for _ in range(world["short_captions"])]
    return draw


def _retrieval(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    _karpathy(world, seed, out_dir, "retrieval", _short_captions(world))


# --- the benchmarks beyond SugarCrepe, zero-shot and retrieval ----------------------------------------------

LONG_RETRIEVAL_MIN_OBJECTS = 3
SUGARCREPE_PP_SUBSETS: tuple[str, ...] = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
BOX_MARGIN = 0.02  # ARO boxes: the union of the pair's object boxes plus this fraction of the image side


def _count(world: dict[str, Any], key: str, fallback: str) -> int:
    """An optional per-benchmark size in world.benchmarks, defaulting to an existing one."""
    sizes = world["benchmarks"]
    return int(sizes.get(key, sizes[fallback]))


def paraphrase(rng: np.random.Generator, plan: ShortPlan) -> ShortPlan:
    """The same claims in another template: another framing and, half the time, the mentions in reverse
    order with converse relations ("a circle left of a square" -> "a square right of a circle")."""
    out = plan.copy()
    if len(out.mentions) > 1 and rng.random() < 0.5:
        out.mentions.reverse()
        out.relations = [None if r is None else CONVERSE[r] for r in reversed(out.relations)]
    framings = sorted({f for f in FRAMINGS if f != plan.framing}
                      | ({BACKGROUND_FIRST} if plan.background is not None else set()) - {plan.framing})
    out.framing = pick(rng, framings)
    # "a circle is above a square" reads as a sentence only without a framing ("there is ...")
    out.copula = (len(out.mentions) == 2 and out.relations[0] is not None and out.framing == ""
                  and not plan.copula)
    return out


def sugarcrepe_pp_item(subset: str, rng: np.random.Generator, image_id: str, world: dict[str, Any]
                       ) -> tuple[dict[str, Any], str, str, str]:
    """A scene, two different true captions (paraphrases) and a false negative edited from the first."""
    perturb = PERTURBATIONS[subset]
    for _ in range(MAX_ATTEMPTS):
        scene = sample_scene(rng, image_id, world["max_objects"])
        plan = sample_short_plan(rng, scene, world["ungrounded_rate"])
        negative = perturb(rng, scene, plan)
        if negative is None:
            continue
        caption, caption2 = render_short(plan).text, render_short(paraphrase(rng, plan)).text
        negative_text = render_short(negative).text
        if len({caption, caption2, negative_text}) == 3 and caption_holds(scene, negative_text) is False:
            if caption_holds(scene, caption) is not True or caption_holds(scene, caption2) is not True:
                raise RuntimeError(f"sugarcrepe_pp {subset} {image_id}: a positive does not hold: "
                                   f"{caption!r} / {caption2!r}")
            return scene, caption, caption2, negative_text
    raise RuntimeError(f"sugarcrepe_pp {subset}: no valid item after {MAX_ATTEMPTS} scenes")


def _sugarcrepe_pp(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    n = _count(world, "sugarcrepe_pp_per_subset", "sugarcrepe_per_subset")
    for subset in SUGARCREPE_PP_SUBSETS:
        rng = rng_stream(seed, "benchmark", "sugarcrepe_pp", subset)
        items = []
        for index in range(n):
            filename = f"{subset}-{index:04d}.png"
            scene, caption, caption2, negative = sugarcrepe_pp_item(subset, rng, filename[:-4], world)
            save_png(render_scene(scene, world["image_size"]), out_dir / "images" / filename)
            items.append({"id": index, "filename": filename, "caption": caption, "caption2": caption2,
                          "negative_caption": negative})
        write_json(items, out_dir / f"{subset}.json")


def layout_valid(objects: list[dict[str, Any]]) -> bool:
    """The placement rules of `sample_scene`: inside the image by EDGE, apart by GAP, no identical twins."""
    for i, a in enumerate(objects):
        r = RADIUS[a["size"]]
        if not (r + EDGE <= a["x"] <= 1 - r - EDGE and r + EDGE <= a["y"] <= 1 - r - EDGE):
            return False
        for b in objects[i + 1 :]:
            if (a["x"] - b["x"]) ** 2 + (a["y"] - b["y"]) ** 2 < (r + RADIUS[b["size"]] + GAP) ** 2:
                return False
    keys = [(o["shape"], o["colour"], o["size"], o["pattern"]) for o in objects]
    return len(set(keys)) == len(keys)


def _attribute_swap(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan
                    ) -> tuple[ShortPlan, dict[str, Any]] | None:
    """Winoground "Relation" pair: two mentions exchange an attribute word in the caption, and the two
    objects exchange that attribute in the second image."""
    options = [(i, j, f) for i in range(len(plan.mentions)) for j in range(i + 1, len(plan.mentions))
               for f in ATTRIBUTE_FIELDS
               if f in plan.mentions[i].values and f in plan.mentions[j].values
               and plan.mentions[i].values[f] != plan.mentions[j].values[f]]
    if not options:
        return None
    i, j, f = pick(rng, options)
    swapped = plan.copy()
    a, b = swapped.mentions[i].values, swapped.mentions[j].values
    a[f], b[f] = b[f], a[f]
    other = copy.deepcopy(scene)
    oa, ob = other["objects"][plan.mentions[i].obj], other["objects"][plan.mentions[j].obj]
    oa[f], ob[f] = ob[f], oa[f]
    if any(o["colour"] in BACKGROUND_CLASHES[other["background"]] for o in other["objects"]):
        return None
    return swapped, other


def _object_swap(rng: np.random.Generator, scene: dict[str, Any], plan: ShortPlan
                 ) -> tuple[ShortPlan, dict[str, Any]] | None:
    """Winoground "Object" pair: the two mentions around a relation change places in the caption, and
    the two objects change places in the second image."""
    if len(plan.mentions) < 2 or plan.relations[0] is None:
        return None
    first = plan.copy()
    first.mentions, first.relations = first.mentions[:2], first.relations[:1]
    swapped = first.copy()
    swapped.mentions.reverse()
    other = copy.deepcopy(scene)
    oa, ob = other["objects"][first.mentions[0].obj], other["objects"][first.mentions[1].obj]
    (oa["x"], oa["y"]), (ob["x"], ob["y"]) = (ob["x"], ob["y"]), (oa["x"], oa["y"])
    plan.mentions, plan.relations = first.mentions, first.relations  # caption_0 uses the two mentions only
    return swapped, other


WINOGROUND_SWAPS = {"Relation": _attribute_swap, "Object": _object_swap}


def winoground_item(tag: str, rng: np.random.Generator, image_id: str, world: dict[str, Any]
                    ) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """Two scenes and two captions with the same words in another order; caption k holds for image k
    and not for the other image (checked)."""
    if world["max_objects"] < 2:
        raise ValueError("winoground needs world.max_objects >= 2")
    for _ in range(MAX_ATTEMPTS):
        scene = sample_scene(rng, f"{image_id}_img_0", world["max_objects"])
        plan = sample_short_plan(rng, scene, world["ungrounded_rate"])
        swap = WINOGROUND_SWAPS[tag](rng, scene, plan)
        if swap is None:
            continue
        swapped, other = swap
        other["image_id"] = f"{image_id}_img_1"
        other["relations"] = scene_relations(other["objects"])
        c0, c1 = render_short(plan).text, render_short(swapped).text
        if (c0 == c1 or sorted(words(c0)) != sorted(words(c1)) or not layout_valid(other["objects"])):
            continue
        if (caption_holds(scene, c0), caption_holds(scene, c1), caption_holds(other, c1),
                caption_holds(other, c0)) == (True, False, True, False):
            return scene, other, c0, c1
    raise RuntimeError(f"winoground {tag}: no valid pair after {MAX_ATTEMPTS} scenes")


# Winoground's fine-grained `tag` for the world's swaps, in the release's vocabulary: an attribute swap
# ("Relation") names the attribute, an object swap ("Object") is a noun-phrase swap.
FINE_TAGS = {"size": "Adjective-Size", "colour": "Adjective-Color", "pattern": "Adjective-Texture"}


def winoground_fine_tag(scene0: dict[str, Any], scene1: dict[str, Any]) -> str:
    """The release's fine-grained tag of a world pair: which attribute the two images exchange, or
    "Noun Phrase" when the objects exchange places."""
    changed = [field for field in FINE_TAGS
               if any(a[field] != b[field] for a, b in zip(scene0["objects"], scene1["objects"], strict=True))]
    return FINE_TAGS[changed[0]] if changed else "Noun Phrase"


def _winoground(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    rng = rng_stream(seed, "benchmark", "winoground")
    lines = []
    for index in range(_count(world, "winoground_items", "sugarcrepe_per_subset")):
        tag = ("Relation", "Object")[index % 2]
        scene0, scene1, c0, c1 = winoground_item(tag, rng, f"ex_{index}", world)
        for k, scene in enumerate((scene0, scene1)):
            save_png(render_scene(scene, world["image_size"]), out_dir / "images" / f"ex_{index}_img_{k}.png")
        lines.append(json.dumps({"id": index, "image_0": f"ex_{index}_img_0", "image_1": f"ex_{index}_img_1",
                                 "caption_0": c0, "caption_1": c1, "tag": winoground_fine_tag(scene0, scene1),
                                 "secondary_tag": "", "num_main_preds": 1, "collapsed_tag": tag}))
    write_text("\n".join(lines) + "\n", out_dir / "examples.jsonl")


def pair_box(scene: dict[str, Any], pair: tuple[int, int], image_size: int) -> dict[str, int]:
    """ARO's bbox_x, bbox_y, bbox_w, bbox_h (pixels): the two objects' boxes, their union plus a margin."""
    objects = [scene["objects"][i] for i in pair]
    reach = [RADIUS[o["size"]] + BOX_MARGIN for o in objects]
    left = max(0.0, min(o["x"] - r for o, r in zip(objects, reach, strict=True)))
    top = max(0.0, min(o["y"] - r for o, r in zip(objects, reach, strict=True)))
    right = min(1.0, max(o["x"] + r for o, r in zip(objects, reach, strict=True)))
    bottom = min(1.0, max(o["y"] + r for o, r in zip(objects, reach, strict=True)))
    x, y = int(left * image_size), int(top * image_size)
    return {"bbox_x": x, "bbox_y": y, "bbox_w": int(round(right * image_size)) - x,
            "bbox_h": int(round(bottom * image_size)) - y}


def _the(obj: dict[str, Any]) -> str:
    return f"the {obj['colour']} {obj['shape']}"


def aro_relation_item(rng: np.random.Generator, image_id: str, world: dict[str, Any]
                      ) -> tuple[dict[str, Any], tuple[int, int], str, str, str]:
    """VG-Relation: "the red circle is above the blue square" against its subject/object swap."""
    for _ in range(MAX_ATTEMPTS):
        scene = sample_scene(rng, image_id, world["max_objects"])
        if not scene["relations"]:
            continue
        relation = pick(rng, scene["relations"])
        a, b = scene["objects"][relation["subject"]], scene["objects"][relation["object"]]
        phrase = RELATION_PHRASES[relation["relation"]]
        true, false = f"{_the(a)} is {phrase} {_the(b)}", f"{_the(b)} is {phrase} {_the(a)}"
        if caption_holds(scene, true) is True and caption_holds(scene, false) is False:
            return scene, (relation["subject"], relation["object"]), phrase, true, false
    raise RuntimeError(f"aro_relation: no valid item after {MAX_ATTEMPTS} scenes")


def aro_attribution_item(rng: np.random.Generator, image_id: str, world: dict[str, Any]
                         ) -> tuple[dict[str, Any], tuple[int, int], list[str], str, str]:
    """VG-Attribution: "the red circle and the blue square" against the attributes exchanged."""
    for _ in range(MAX_ATTEMPTS):
        scene = sample_scene(rng, image_id, world["max_objects"])
        pairs = [(i, j, f) for i in range(len(scene["objects"])) for j in range(len(scene["objects"]))
                 if i != j for f in ATTRIBUTE_FIELDS if scene["objects"][i][f] != scene["objects"][j][f]]
        if not pairs:
            continue
        i, j, f = pick(rng, pairs)
        a, b = scene["objects"][i], scene["objects"][j]
        true = f"the {a[f]} {a['shape']} and the {b[f]} {b['shape']}"
        false = f"the {b[f]} {a['shape']} and the {a[f]} {b['shape']}"
        if caption_holds(scene, true) is True and caption_holds(scene, false) is False:
            return scene, (i, j), [a[f], b[f]], true, false
    raise RuntimeError(f"aro_attribution: no valid item after {MAX_ATTEMPTS} scenes")


def _aro_vg(world: dict[str, Any], seed: int, out_dir: Path, name: str) -> None:
    rng = rng_stream(seed, "benchmark", name)
    make = aro_relation_item if name == "aro_relation" else aro_attribution_item
    group_field = "relation_name" if name == "aro_relation" else "attributes"
    items = []
    for index in range(_count(world, "aro_items", "sugarcrepe_per_subset")):
        filename = f"{name}-{index:04d}.png"
        scene, pair, group, true, false = make(rng, filename[:-4], world)
        save_png(render_scene(scene, world["image_size"]), out_dir / "images" / filename)
        items.append({"image_id": filename[:-4], "image_path": filename,
                      **pair_box(scene, pair, world["image_size"]), "true_caption": true, "false_caption": false,
                      group_field: group})
    filename = "visual_genome_relation.json" if name == "aro_relation" else "visual_genome_attribution.json"
    write_json(items, out_dir / filename)


def _changed_words(plan: ShortPlan, foil: ShortPlan) -> tuple[str, str]:
    """The words a foil replaced ("classes" and "classes_foil" in VALSE)."""
    before, after = words(render_short(plan).text), words(render_short(foil).text)
    return (" ".join(w for w in before if w not in after), " ".join(w for w in after if w not in before))


def _valse(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    for piece, subset in WORLD_VALSE_PIECES.items():
        rng = rng_stream(seed, "benchmark", "valse", piece)
        items = {}
        for index in range(_count(world, "valse_per_piece", "sugarcrepe_per_subset")):
            filename = f"{piece}-{index:04d}.png"
            for _ in range(MAX_ATTEMPTS):
                scene = sample_scene(rng, filename[:-4], world["max_objects"])
                plan = sample_short_plan(rng, scene, world["ungrounded_rate"])
                foil = PERTURBATIONS[subset](rng, scene, plan)
                if foil is not None and caption_holds(scene, render_short(foil).text) is False:
                    break
            else:
                raise RuntimeError(f"valse {piece}: no valid item after {MAX_ATTEMPTS} scenes")
            caption, foil_text = render_short(plan).text, render_short(foil).text
            if caption_holds(scene, caption) is not True:
                raise RuntimeError(f"valse {piece} {filename}: caption does not hold: {caption!r}")
            save_png(render_scene(scene, world["image_size"]), out_dir / "images" / filename)
            classes, classes_foil = _changed_words(plan, foil)
            items[f"{piece}_test_{index:04d}"] = {
                "dataset": "world", "original_split": "test", "dataset_idx": filename,
                "linguistic_phenomena": piece, "image_file": filename, "caption": caption, "foil": foil_text,
                "classes": classes, "classes_foil": classes_foil,
            }
        write_json(items, out_dir / f"{piece}.json")


def _linear_probe(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    """Single-object scenes labelled by shape, a train and a test ImageFolder."""
    rng = rng_stream(seed, "benchmark", "linear_probe")
    n = _count(world, "linear_probe_per_class", "zeroshot_per_class")
    for split in ("train", "test"):
        for shape in SHAPES:
            for index in range(n):
                scene = sample_scene(rng, f"{split}-{shape}-{index:04d}", world["max_objects"], n_objects=1,
                                     fixed={"shape": shape})
                save_png(render_scene(scene, world["image_size"]), out_dir / split / shape / f"{index:04d}.png")
    write_json({shape: shape for shape in SHAPES}, out_dir / "classnames.json")


# --- What's Up, EqBen and COCO-Counterfactuals: image pairs and sets that differ by one edit ---------------

# What's Up Controlled-A's file-name preposition of each world relation: its left / right pair, and its vertical
# pair (on / under), which the world's above / below fill (its captions say "above" / "below")
WHATSUP_TOKENS = {"left of": "left_of", "right of": "right_of", "above": "on", "below": "under"}
WHATSUP_FOLDER = "controlled_images"
EQBEN_SUBSETS = {"Relation": "world_attr", "Object": "world_loc"}  # winoground_item's swap -> EqBen subset folder
COCO_CF_EDITS = ("replace_obj", "replace_att")  # COCO-CF's counterfactuals replace a noun (or its modifier)


def _name(obj: dict[str, Any]) -> str:
    return f"{obj['colour']} {obj['shape']}"


def whatsup_caption(a: dict[str, Any], relation: str, b: dict[str, Any]) -> str:
    """"a red circle to the left of a blue square": What's Up's "A mug to the left of a table"."""
    return f"{article(a['colour'])} {_name(a)} {RELATION_PHRASES[relation]} {article(b['colour'])} {_name(b)}"


def whatsup_group(rng: np.random.Generator, image_id: str, world: dict[str, Any]
                  ) -> list[tuple[dict[str, Any], str, list[str]]]:
    """One object pair in each of the four relations (What's Up's sets of four images of the same two objects): per
    image its scene, relation and four captions (the true one first, then the others in RELATIONS order); only the
    shown relation holds (checked), the other axis stays within RELATION_MARGIN."""
    for _ in range(MAX_ATTEMPTS):
        base = sample_scene(rng, image_id, world["max_objects"], n_objects=2)
        a, b = base["objects"]
        if _name(a) == _name(b):
            continue  # "a red circle left of a red circle" names no pair
        group = []
        for relation in RELATIONS:
            scene = copy.deepcopy(base)
            for _ in range(MAX_ATTEMPTS):
                for obj in scene["objects"]:
                    r = RADIUS[obj["size"]] + EDGE
                    obj["x"], obj["y"] = (round(float(v), POSITION_DECIMALS) for v in rng.uniform(r, 1 - r, size=2))
                first, second = scene["objects"]
                if relations_between(first, second) == [relation] and layout_valid(scene["objects"]):
                    break
            else:
                break
            scene["relations"] = scene_relations(scene["objects"])
            captions = [whatsup_caption(a, relation, b)]
            captions += [whatsup_caption(a, other, b) for other in RELATIONS if other != relation]
            if [caption_holds(scene, c) for c in captions] != [True, False, False, False]:
                raise RuntimeError(f"whatsup {image_id} {relation}: the captions' truth is not [T, F, F, F]: "
                                   f"{captions}")
            group.append((scene, relation, captions))
        if len(group) == len(RELATIONS):
            return group
    raise RuntimeError(f"whatsup {image_id}: no valid object pair after {MAX_ATTEMPTS} draws")


def _whatsup(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    rng = rng_stream(seed, "benchmark", "whatsup")
    items = []
    for index in range(_count(world, "whatsup_groups", "sugarcrepe_per_subset")):
        group = whatsup_group(rng, f"whatsup-{index:04d}", world)
        a, b = (_name(o).replace(" ", "-") for o in group[0][0]["objects"])
        # the release groups a pair's images by the file name's first and last word: make each group's its own
        a = f"{a}-{index}"
        for scene, relation, captions in group:
            filename = f"{a}_{WHATSUP_TOKENS[relation]}_{b}.png"
            save_png(render_scene(scene, world["image_size"]), out_dir / "images" / WHATSUP_FOLDER / filename)
            items.append({"image_path": f"{WHATSUP_FOLDER}/{filename}", "caption_options": captions})
    write_json(items, out_dir / WHATSUP_FILES["WhatsUp_A"])


def _eqben(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    """EqBen's Winoground-style pairs: Kubric-like renders whose two scenes differ by one attribute swap
    (`world_attr`) or one position swap (`world_loc`), each caption true of its image only (winoground_item)."""
    rng = rng_stream(seed, "benchmark", "eqben")
    pairs = []
    for index in range(_count(world, "eqben_items", "sugarcrepe_per_subset")):
        tag = ("Relation", "Object")[index % 2]
        subset = EQBEN_SUBSETS[tag]
        scene0, scene1, c0, c1 = winoground_item(tag, rng, f"{index:04d}", world)
        for k, scene in enumerate((scene0, scene1)):
            save_png(render_scene(scene, world["image_size"]), out_dir / "images" / subset / f"{index:04d}_{k}.png")
        pairs.append({"image0": f"{subset}/{index:04d}_0.png", "caption0": c0,
                      "image1": f"{subset}/{index:04d}_1.png", "caption1": c1})
    write_json(pairs, out_dir / WORLD_EQBEN_FILE)


def coco_counterfactual_item(rng: np.random.Generator, image_id: str, world: dict[str, Any]
                             ) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """A scene and its counterfactual: a caption's object (or attribute) replaced, and the scene minimally edited
    (compo.world.edit) so the new caption holds and the old one does not; each caption is true of its image only."""
    for _ in range(MAX_ATTEMPTS):
        scene = sample_scene(rng, f"{image_id}_0", world["max_objects"])
        plan = sample_short_plan(rng, scene, 0.0)
        edited = PERTURBATIONS[pick(rng, COCO_CF_EDITS)](rng, scene, plan)
        if edited is None:
            continue
        c0, c1 = render_short(plan).text, render_short(edited).text
        other = realize_caption(scene, c1, avoid=c0)
        if c0 == c1 or other is None:
            continue
        other["image_id"] = f"{image_id}_1"
        if (caption_holds(scene, c0), caption_holds(scene, c1), caption_holds(other, c1),
                caption_holds(other, c0)) == (True, False, True, False):
            return scene, other, c0, c1
    raise RuntimeError(f"coco_counterfactuals {image_id}: no valid pair after {MAX_ATTEMPTS} scenes")


def _coco_counterfactuals(world: dict[str, Any], seed: int, out_dir: Path) -> None:
    rng = rng_stream(seed, "benchmark", "coco_counterfactuals")
    lines = []
    for index in range(_count(world, "coco_counterfactuals_items", "sugarcrepe_per_subset")):
        scene0, scene1, c0, c1 = coco_counterfactual_item(rng, f"{index:04d}", world)
        for k, scene in enumerate((scene0, scene1)):
            save_png(render_scene(scene, world["image_size"]), out_dir / "images" / f"{index:04d}_{k}.png")
        # image names with their suffix: the loader adds ".jpg" only to a bare stem
        lines.append(json.dumps({"id": str(index), "image_0": f"{index:04d}_0.png", "image_1": f"{index:04d}_1.png",
                                 "caption_0": c0, "caption_1": c1}))
    write_text("\n".join(lines) + "\n", out_dir / COCO_CF_FILE)


class WorldBenchmark(NamedTuple):
    """A benchmark the world writes: the config entry its files follow, and the function writing them."""

    spec: dict[str, Any]
    write: Callable[[dict[str, Any], int, Path], None]


# Every benchmark the world writes, by its folder under {results}/benchmarks/world: the one list the rule `benchmarks`
# (its outputs), the config check (a `source: world` entry names one) and generate_benchmarks read.
WORLD_BENCHMARKS: dict[str, WorldBenchmark] = {
    "sugarcrepe": WorldBenchmark({"kind": "sugarcrepe"}, _sugarcrepe),
    **{world_benchmark_folder(spec): WorldBenchmark(spec, functools.partial(_zeroshot, attribute=spec["attribute"]))
       for spec in ({"kind": "zeroshot", "attribute": attribute} for attribute in WORLD_ZEROSHOT_ATTRIBUTES)},
    "retrieval": WorldBenchmark({"kind": "retrieval"}, _retrieval),
    "sugarcrepe_pp": WorldBenchmark({"kind": "sugarcrepe_pp"}, _sugarcrepe_pp),
    "winoground": WorldBenchmark({"kind": "winoground"}, _winoground),
    **{name: WorldBenchmark({"kind": name}, functools.partial(_aro_vg, name=name))
       for name in ("aro_relation", "aro_attribution")},
    "aro_order": WorldBenchmark({"kind": "aro_order"}, lambda world, seed, out_dir: _karpathy(
        world, seed, out_dir, "aro_order", _short_captions(world))),
    # dense scenes, as Urban1k's: their long captions run well beyond 70 words (about 100 to 180), so
    # LongCLIP-70's truncation (seed 004) leaves out part of every description
    "long_retrieval": WorldBenchmark({"kind": "long_retrieval"}, lambda world, seed, out_dir: _karpathy(
        world, seed, out_dir, "long_retrieval", lambda rng, scene: [long_caption(rng, scene)],
        min_objects=LONG_RETRIEVAL_MIN_OBJECTS)),
    "valse": WorldBenchmark({"kind": "valse", "pieces": list(WORLD_VALSE_PIECES)}, _valse),
    "linear_probe": WorldBenchmark({"kind": "linear_probe"}, _linear_probe),
    "whatsup": WorldBenchmark({"kind": "whatsup", "subsets": list(WORLD_WHATSUP_SUBSETS)}, _whatsup),
    "eqben": WorldBenchmark({"kind": "eqben", "file": WORLD_EQBEN_FILE}, _eqben),
    "coco_counterfactuals": WorldBenchmark({"kind": "coco_counterfactuals"}, _coco_counterfactuals),
}


def world_benchmarks() -> dict[str, dict[str, Any]]:
    """Every benchmark folder the world writes, with the spec its files follow (a copy: callers may extend it)."""
    return {folder: copy.deepcopy(benchmark.spec) for folder, benchmark in WORLD_BENCHMARKS.items()}


def generate_benchmarks(world: dict[str, Any], seed: int, out_dir: str | Path) -> None:
    """Write every benchmark of the world under `out_dir`, one folder each (WORLD_BENCHMARKS)."""
    check_world(world)
    if "benchmarks" not in world:
        raise KeyError("world config: missing key 'benchmarks'")
    out_dir = Path(out_dir)
    for folder, benchmark in WORLD_BENCHMARKS.items():
        benchmark.write(world, seed, out_dir / folder)
    log.info("world benchmarks -> %s", out_dir)
