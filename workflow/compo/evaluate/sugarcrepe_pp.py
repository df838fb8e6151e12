"""SugarCrepe++ (Dumpala et al., 2024): two paraphrased positives and one hard negative per image.

Files: `{benchmark_dir}/{subset}.json`, one per subset, each a list of
`{"id", "filename", "caption", "caption2", "negative_caption"}`; images under `spec["image_root"]` or
`{benchmark_dir}/images`. Two tasks, as in the paper's code:
- ITT (image-text): correct iff cos(image, caption) > cos(image, negative) and
  cos(image, caption2) > cos(image, negative);
- TOT (text only): correct iff cos(caption, caption2) > cos(caption, negative) and
  cos(caption, caption2) > cos(caption2, negative).
Comparisons are strict (a tie is wrong, see `compo.evaluate.common`). TOT needs no image, so an item
whose image is missing or unreadable is skipped (and counted) for ITT only. The `*_overall` metrics are
micro-averaged over the subsets' items.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.candidates import Item, accuracy, pick, score_items
from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    read_json_file,
    require,
)
from compo.evaluate.files import SUGARCREPE_PP_SUBSETS
from compo.evaluate.kinds import Benchmark, BenchmarkSize, Selection
from compo.sources import COCO_VAL2017

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "sugarcrepe-pp-itt-tot-strict"
SUBSETS = SUGARCREPE_PP_SUBSETS
FIELDS = ("id", "filename", "caption", "caption2", "negative_caption")
TEXT_FIELDS = ("filename", "caption", "caption2", "negative_caption")
CAPTIONS = ("caption", "caption2", "negative_caption")  # the two positives, then the negative


def load_subset(path: Path) -> list[dict[str, Any]]:
    """One subset file, checked: a non-empty list of items with the five fields, ids unique."""
    items = read_json_file(path, "SugarCrepe++ subset file")
    if not isinstance(items, list) or not items:
        raise BenchmarkError(f"{path}: expected a non-empty list of items")
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = f"{path}: item {item.get('id', index) if isinstance(item, dict) else index!r}"
        require(item, FIELDS, where)
        for key in TEXT_FIELDS:
            if not isinstance(item[key], str) or not item[key]:
                raise BenchmarkError(f"{where}: field {key!r} must be a non-empty string")
        if str(item["id"]) in seen:
            raise BenchmarkError(f"{where}: duplicate id")
        seen.add(str(item["id"]))
    return items


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    import torch

    from compo.evaluate.scoring import pessimistic_rank

    subsets = {subset: load_subset(benchmark_dir / f"{subset}.json") for subset in SUBSETS}
    root = image_root(spec, benchmark_dir)
    # ITT: both positives must beat the negative (the candidate scorer ranks the weaker one)
    items = [Item(f"{subset}/itt", str(item["id"]), (item_path(root, item["filename"]),),
                  tuple(item[key] for key in CAPTIONS), right=(0, 1)) for subset, found in subsets.items()
             for item in found]
    scored = score_items(loaded, items, benchmark="sugarcrepe_pp",
                         files={f"{subset}/itt": benchmark_dir / f"{subset}.json" for subset in SUBSETS},
                         extra_texts=[text for item in items for text in item.texts])  # TOT scores every item
    itt = pick(scored)

    frames = []
    for subset, found in subsets.items():
        # TOT (every item: no image): the paraphrase pair must be closer than either positive is to the negative
        p1, p2, neg = (scored.text_emb[[scored.text_row[item[key]] for item in found]] for key in CAPTIONS)
        pos_pair, others = (p1 * p2).sum(1), torch.stack([(p1 * neg).sum(1), (p2 * neg).sum(1)], dim=1)
        ranks = pessimistic_rank(pos_pair, others)
        frames.append(pd.DataFrame({"subset": f"{subset}/tot", "item": [str(item["id"]) for item in found],
                                    "correct": (ranks == 1).numpy(), "score_pos": pos_pair.numpy(),
                                    "score_neg": others.max(dim=1).values.numpy(), "rank": ranks.numpy()}))
        frames.append(itt[itt["subset"] == f"{subset}/itt"])
    predictions = pd.concat(frames, ignore_index=True)

    metrics: dict[str, Metric] = {}
    for task in ("itt", "tot"):
        for subset in SUBSETS:
            metrics[f"{task}_{subset}"] = accuracy(predictions[predictions["subset"] == f"{subset}/{task}"])
        metrics[f"{task}_overall"] = accuracy(predictions[predictions["subset"].str.endswith(f"/{task}")])
    return BenchmarkResult(PROTOCOL, "itt_overall", metrics, predictions, dict(scored.skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / f"{subset}.json" for subset in SUBSETS]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    root = image_root(spec, folder)
    return [item_path(root, item["filename"]) for s in SUBSETS for item in load_subset(folder / f"{s}.json")]


RELEASED_ITEMS = 4_757  # one image and three captions an item

def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection]:
    """`<task>_<subset>`: the subset's rows of that task (subset `<subset>/<task>`); `<task>_overall`: all of them."""
    task, _, subset = metric.partition("_")
    if subset == "overall":
        return [Selection(tuple(f"{m.split('_', 1)[1]}/{task}" for m in metrics
                                if m.startswith(f"{task}_") and m != metric))]
    return [Selection((f"{subset}/{task}",))]


BENCHMARKS = (
    Benchmark(kind="sugarcrepe_pp", source="github.com/Sri-Harsha/scpp data/*.json; its ITT / TOT scorer",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(RELEASED_ITEMS, 3 * RELEASED_ITEMS, 0), headline="itt_overall",
              subsets=tuple(f"{task}_{subset}" for task in ("itt", "tot") for subset in SUBSETS),
              chance=1 / 3, selections=selections,
              downloads=lambda spec: {"path": 'github.com/Sri-Harsha/scpp data/; its 5 <subset>.json',
                                      "image_root": COCO_VAL2017},
              keys={}),
)
