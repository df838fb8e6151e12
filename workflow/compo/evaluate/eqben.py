"""EqBen (Wang et al., 2023): Winoground's text / image / group scores on minimally different image pairs
(video frames, Kubric and Stable Diffusion renders), per subset.

File: `{benchmark_dir}/{spec["file"]}`, EqBen's Winoground-style annotation (github.com/Wangt-CN/EqBen: the
"original annotation" and the 10% subset "follow the winoground style"). Its pairs are read as the release's
per-subset readers (`src/eqben/eqben_utils.py`, EqBenKubric / SD / GEBC / YouCook2 / AG) read theirs: objects with
`image0, caption0, image1, caption1` (Winoground's `image_0 ...` spelling is accepted too), in a list or nested in
objects (AG: video -> subject -> list; GEBC, YouCook2: video -> list), walked in file order; a caption given as a
list counts by its first entry, as EqBenAG does. An image path is relative to `spec["image_root"]` (default
`benchmark_dir/images`) and its first folder names the subset (`eqbenag`, `eqbenkubric_loc`, ...), as the release's
EqBenALL reads it; YouCook2's `.npy` frames are read as its `process_img_npy` does (compo.images).
The randomized submission file (`ann_json_finegrained_random.json`, a list of single `{image, caption}` pairs) is
refused: regrouping it into 2x2 needs the release's private `private_info.json`, which is not public.

Scoring, as `eqben_acc.cal_wino_score`: text = s(c0,i0) > s(c1,i0) and s(c1,i1) > s(c0,i1); image = s(c0,i0) >
s(c0,i1) and s(c1,i1) > s(c1,i0); group = both; strict `>` (a tie is wrong), the project's rule too, so one set of
numbers (`compo.evaluate.winoground.comparison_failures`). FSC-CLIP caps each subset at 20,000 pairs (`max_items`,
default 20,000): a larger subset keeps `random.Random(seed).sample` of its pair indices (seed `spec["seed"]`,
default 0), scored in file order; which pairs FSC-CLIP kept is not published, so a capped subset is a different
draw. A pair given twice (the same images and captions) is scored once, the repeat counted as `repeated_item`.
Metrics: `<subset>/<text|image|group>` (vl_compo's `eqben::<subset>::...`) and `text` / `image` / `group`, the
unweighted mean over subsets (headline `group`, FSC-CLIP's "group accuracy ... for EqBen").
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compo.evaluate.candidates import Item, accuracy, macro, score_items, skip_repeats
from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    read_json_file,
    require_text,
)
from compo.evaluate.files import eqben_file
from compo.evaluate.kinds import POSITIVE_INT, Benchmark, BenchmarkSize, Key, stored_only
from compo.evaluate.winoground import SCORES, score_predictions

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "eqben-winoground-strict"
MAX_ITEMS = 20_000  # FSC-CLIP's cap per subset
SPELLINGS = (("image0", "caption0", "image1", "caption1"), ("image_0", "caption_0", "image_1", "caption_1"))
Pair = tuple[str, str, str, str, str]  # item id, image0, caption0, image1, caption1


def _pairs(node: Any, where: str, path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The pair objects of the annotation, in file order, each with where it sits."""
    if isinstance(node, list):
        return [p for index, child in enumerate(node) for p in _pairs(child, f"{where}[{index}]", path)]
    if isinstance(node, dict):
        if any(key in node for spelling in SPELLINGS for key in spelling):
            return [(where, node)]
        if "image" in node and "caption" in node:
            raise BenchmarkError(f"{path}: {where}: a single {{image, caption}} pair: this is EqBen's randomized "
                                 "submission file, which cannot be regrouped into 2x2 without its private index; "
                                 "use the Winoground-style annotation (image0, caption0, image1, caption1)")
        return [p for key, child in node.items() for p in _pairs(child, f"{where}/{key}", path)]
    raise BenchmarkError(f"{path}: {where}: expected a pair object, a list or an object of them, got "
                         f"{type(node).__name__}")


def load_pairs(path: Path) -> list[Pair]:
    data = read_json_file(path, "EqBen annotation file")
    found = _pairs(data, "", path)
    if not found:
        raise BenchmarkError(f"{path}: no pairs (expected objects with image0, caption0, image1, caption1)")
    pairs = []
    for where, node in found:
        spelling = next(s for s in SPELLINGS if any(k in node for k in s))
        missing = [k for k in spelling if k not in node]
        if missing:
            raise BenchmarkError(f"{path}: {where or 'top level'}: missing field(s) {', '.join(missing)}")
        values = [node[k][0] if isinstance(node[k], list) and node[k] else node[k] for k in spelling]
        image0, caption0, image1, caption1 = (require_text(v, f"{path}: {where}", k) for v, k in zip(values, spelling,
                                                                                                   strict=True))
        if subset_of(image0) != subset_of(image1):
            raise BenchmarkError(f"{path}: {where}: image0 and image1 are in different subsets ({image0}, {image1})")
        pairs.append((where or "0", image0, caption0, image1, caption1))
    return pairs


def subset_of(image: str) -> str:
    """The subset of an image path: its first folder (`eqbenag/...`), as the release's EqBenALL reads it."""
    return image.replace("\\", "/").lstrip("/").split("/")[0]


def capped(pairs: list[Pair], max_items: int, seed: int) -> list[Pair]:
    """Each subset's pairs, at most `max_items` of them: a larger subset keeps a seeded sample, in file order."""
    by_subset: dict[str, list[int]] = defaultdict(list)
    for index, pair in enumerate(pairs):
        by_subset[subset_of(pair[1])].append(index)
    keep = set()
    for subset in sorted(by_subset):  # a fixed order: the draw does not depend on the file's subset order
        indices = by_subset[subset]
        keep.update(indices if len(indices) <= max_items else random.Random(seed).sample(indices, max_items))
    return [pair for index, pair in enumerate(pairs) if index in keep]


def items_of(benchmark_dir: Path, spec: dict[str, Any], capped_to: int | None = None) -> list[Item]:
    """The pairs (capped per subset to `capped_to`), each its two images and two captions, by subset."""
    root = image_root(spec, benchmark_dir)
    pairs = load_pairs(eqben_file(spec, benchmark_dir))
    if capped_to is not None:
        pairs = capped(pairs, capped_to, spec.get("seed", 0))
    return [Item(subset_of(image0), where, (item_path(root, image0), item_path(root, image1)), (caption0, caption1))
            for where, image0, caption0, image1, caption1 in pairs]


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    items = skip_repeats(items_of(benchmark_dir, spec, spec.get("max_items", MAX_ITEMS)))
    scored = score_items(loaded, items, benchmark="eqben", files=eqben_file(spec, benchmark_dir))
    predictions, _ = score_predictions(scored, lambda item, name: f"{item.subset}/{name}")
    metrics: dict[str, Metric] = {}
    for name in SCORES:
        per_subset = sorted({f"{item.subset}/{name}" for item in scored.items})
        for key in per_subset:
            metrics[key] = accuracy(predictions[predictions["subset"] == key])
        metrics[name] = macro([metrics[k] for k in per_subset], len(scored.items))
    return BenchmarkResult(PROTOCOL, "group", metrics, predictions, dict(scored.skipped))


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    """Every pair's images, before the `max_items` cap (the guard looks at the whole release)."""
    return [image for item in items_of(folder, spec) for image in item.images]


# EqBen's subsets (pairs of two images and two captions), each capped at `max_items` (FSC-CLIP's 20,000); the sizes
# are the release's per-subset counts, taken as 2x2 pairs: an upper bound where they count single image-text pairs
RELEASED_SUBSETS = {"eqbenag": 195_872, "eqbenyoucook2": 45_849, "eqbengebc": 1_814, "eqbenkubric_loc": 2_000,
                    "eqbenkubric_attr": 2_000, "eqbenkubric_cnt": 2_000, "eqbensd": 1_513}


def release_size(spec: dict[str, Any]) -> BenchmarkSize:
    pairs = sum(min(n, int(spec.get("max_items", MAX_ITEMS))) for n in RELEASED_SUBSETS.values())
    return BenchmarkSize(2 * pairs, 2 * pairs, 0)


BENCHMARKS = (
    Benchmark(kind="eqben", source="github.com/Wangt-CN/EqBen Winoground-style annotation; eqben_acc.cal_wino_score",
              run=run, files=lambda spec, folder: [eqben_file(spec, folder)], images=image_paths, size=release_size,
              headline="group", subsets=SCORES, chance={"text": 1 / 4, "image": 1 / 4, "group": 1 / 6},
              selections=stored_only,
              downloads=lambda spec: {"path": 'github.com/Wangt-CN/EqBen (Drive 1gNR4K2Cv4rbnjVRdHuBV6PuoJ5MlRXnZ); '
                                              "the annotation JSON as `file`",
                                      "image_root": "EqBen's image archive (Drive 1e608uhd36ak_v7SnlMVaYcekBc4gBqzn)"},
              keys={"file": Key({"type": "string", "minLength": 1}, "the Winoground-style annotation file (required: "
                                "the release names no default)", "github.com/Wangt-CN/EqBen"),
                    "max_items": Key(POSITIVE_INT, f"pairs kept per subset (default {MAX_ITEMS:,}); a larger subset "
                                     "keeps `random.Random(seed).sample` of its pairs, in file order",
                                     "FSC-CLIP (seed 003, appendix A.2)"),
                    "seed": Key({"type": "integer", "minimum": 0}, "the seed of the pairs kept (default 0)",
                                "FSC-CLIP (seed 003, appendix A.2)")}),
)
