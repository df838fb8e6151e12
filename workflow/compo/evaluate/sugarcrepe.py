"""SugarCrepe (Hsieh et al., 2023): for each image, does the model prefer the true caption to its
hard negative?

Files: `{benchmark_dir}/{subset}.json`, one per subset, each a dict
`{"<id>": {"filename": ..., "caption": ..., "negative_caption": ...}}`; images under
`spec["image_root"]` or `{benchmark_dir}/images`. An item is correct iff
cos(image, caption) > cos(image, negative_caption) strictly (a tie is wrong). The groups replace / swap /
add and `overall` are MACRO means of their sub-tasks' accuracies, as the seeds report them (DeGLA Table 3's
ADD = (93.8 + 95.7) / 2; FSC-CLIP / vl_compo average the sub-tasks); `<group>_micro` and `overall_micro`
keep the mean over the group's items as a second column.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.candidates import Item, accuracies, accuracy, macro, run_items
from compo.evaluate.common import BenchmarkResult, Metric, image_root, item_path, read_keyed_items
from compo.evaluate.files import SUGARCREPE_GROUPS, SUGARCREPE_SUBSETS
from compo.evaluate.kinds import Benchmark, BenchmarkSize, Selection
from compo.sources import COCO_VAL2017

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "sugarcrepe-itm-strict"
SUBSETS = SUGARCREPE_SUBSETS
GROUPS = {**SUGARCREPE_GROUPS, "overall": SUBSETS}
FIELDS = ("filename", "caption", "negative_caption")


def load_subset(path: Path) -> dict[str, dict[str, str]]:
    """One subset file, checked: every item has the three fields as strings."""
    return read_keyed_items(path, "SugarCrepe subset file", FIELDS)


def items_of(benchmark_dir: Path, spec: dict[str, Any]) -> list[Item]:
    """Every subset's items: the image, the caption (right) and its negative."""
    root = image_root(spec, benchmark_dir)
    return [Item(subset, str(item_id), (item_path(root, item["filename"]),),
                 (item["caption"], item["negative_caption"]))
            for subset in SUBSETS for item_id, item in load_subset(benchmark_dir / f"{subset}.json").items()]


def group_metrics(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
    """Each subset's accuracy, and per group its macro mean (`<group>`) and item-level accuracy (`<group>_micro`)."""
    metrics = accuracies(predictions)
    for group, members in GROUPS.items():
        rows = predictions[predictions["subset"].isin(members)]
        metrics[group] = macro([metrics[m] for m in members], len(rows))
        metrics[f"{group}_micro"] = accuracy(rows)
    return metrics


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    return run_items(loaded, items_of(benchmark_dir, spec), benchmark="sugarcrepe", protocol=PROTOCOL,
                     headline="overall", files={s: benchmark_dir / f"{s}.json" for s in SUBSETS},
                     metrics=group_metrics)


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / f"{subset}.json" for subset in SUBSETS]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [item.images[0] for item in items_of(folder, spec)]


RELEASED_ITEMS = 7_511  # one image and two captions an item (the release's seven files)

def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection]:
    """A sub-task's rows; a group and overall: the mean of their sub-tasks (`<group>_micro`: of their rows)."""
    group, micro = metric.removesuffix("_micro"), metric.endswith("_micro")
    if group == "overall":
        return [Selection(None, macro=not micro)]
    if group in SUGARCREPE_GROUPS:
        return [Selection(SUGARCREPE_GROUPS[group], macro=not micro)]
    return [Selection((metric,))]


BENCHMARKS = (
    Benchmark(kind="sugarcrepe", source="github.com/RAIVNLab/sugar-crepe data/*.json; its ITM scorer, a tie wrong",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(RELEASED_ITEMS, 2 * RELEASED_ITEMS, 0),
              headline="overall", subsets=SUBSETS, chance=1 / 2, selections=selections,
              downloads=lambda spec: {"path": 'github.com/RAIVNLab/sugar-crepe data/; its 7 <subset>.json',
                                      "image_root": COCO_VAL2017},
              keys={}),
)
