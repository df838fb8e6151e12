"""What's Up (Kamath et al., 2023): does the model pick the caption with the right spatial preposition?

Files, as the release's `dataset_zoo/aro_datasets.py` reads them from its data folder (github.com/amitakamath/
whatsup_vlms; the JSONs are on Google Drive): per subset `files.WHATSUP_FILES` in `benchmark_dir`, images under
`root = spec["image_root"] or benchmark_dir/images` (the release keeps them beside the JSONs: set image_root to the
same folder).
- Controlled A / B (`WhatsUp_A`, `WhatsUp_B`): a list of `{"image_path", "caption_options"}`, four options, the first
  right. The image is `root/controlled_images/<file name>` (A) or `root/controlled_clevr/<file name>` (B): the
  release opens `image_path` from its working directory, a path into those folders. The file name
  `<object>_<preposition>_..._<object>.<ext>` names the object pair and the preposition (A: left / right / on /
  under; B: left / right / in-front / behind), which pair and set accuracy group by.
- COCO-QA / VG-QA one / two objects: a list of `[image_id, right caption, wrong caption]`; the image is
  `root/val2017/<image_id zero-padded to 12>.jpg` (COCO) or `root/vg_images/<image_id>.jpg` (VG).

Scoring as released: image-to-text, `np.argmax` over the options == 0, so a tie with the right caption (listed
first) counts as correct: `<subset>` (vl_compo's `whatsup::<subset>`). Controlled sets also report, as released,
pair accuracy (an object pair's left and right images both right, and its on / under or in-front / behind images
both right; pairs counted over N/2) and set accuracy (all four right; over N/4). The headline `mean` is the plain
mean of the subsets scored (`spec["subsets"]`, default all six: vl_compo's `whatsup` column, which its
`individual_results.csv` reproduces to 1e-8; the world writes only WhatsUp_A's layout). The project's strict rule
(a tie is wrong) gives `*_strict` and the predictions' `rank`. Unreadable images are skipped
and counted, as is an item given again in its file (`repeated_item`: scored once); a subset left with no item is an
error naming its file.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.candidates import RELEASED, Item, accuracies, macro, run_items, skip_repeats
from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    read_json_file,
    require_text,
)
from compo.evaluate.files import WHATSUP_FILES, whatsup_subsets
from compo.evaluate.kinds import NAMES, Benchmark, BenchmarkSize, Key, stored_only
from compo.sources import WHATSUP_DRIVE

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "whatsup-i2t-argmax"
CONTROLLED = {"WhatsUp_A": ("controlled_images", (("left", "right"), ("on", "under"))),
              "WhatsUp_B": ("controlled_clevr", (("left", "right"), ("in-front", "behind")))}
OPTIONS = 4  # a controlled item's captions


def load_subset(path: Path, subset: str, root: Path) -> list[Item]:
    """One subset's annotation file, checked, with each item's image path under `root`."""
    data = read_json_file(path, f"What's Up {subset} file")
    if not isinstance(data, list) or not data:
        raise BenchmarkError(f"{path}: expected a non-empty list of items")
    return [(_controlled if subset in CONTROLLED else _qa)(entry, subset, root, f"{path}: item {k}")
            for k, entry in enumerate(data)]


def _controlled(entry: Any, subset: str, root: Path, where: str) -> Item:
    if not isinstance(entry, dict) or not isinstance(entry.get("image_path"), str) or not entry["image_path"]:
        raise BenchmarkError(f"{where}: expected {{image_path: str, caption_options: [4 captions]}}, got "
                             f"{entry!r:.120}")
    options = entry.get("caption_options")
    if not isinstance(options, list) or len(options) != OPTIONS:
        raise BenchmarkError(f"{where}: 'caption_options' must be a list of {OPTIONS} captions (the first right), "
                             f"got {options!r:.120}")
    folder, pairs = CONTROLLED[subset]
    name = PurePosixPath(entry["image_path"]).name
    parts = PurePosixPath(name).stem.split("_")
    allowed = [p for pair in pairs for p in pair]
    if len(parts) < 3 or parts[1] not in allowed:  # the release: split("_")[0], [1], [-1] of the file name
        raise BenchmarkError(f"{where}: image file name {name!r} is not <object>_<preposition>_..._<object> with a "
                             f"preposition of {', '.join(allowed)}")
    captions = [require_text(text, where, f"caption_options[{k}]") for k, text in enumerate(options)]
    return Item(subset, name, (item_path(root, folder, name),), tuple(captions),
                tags={"group": f"{parts[0]}|{parts[-1]}", "preposition": parts[1]})


def _qa(entry: Any, subset: str, root: Path, where: str) -> Item:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], int | str)
            and not isinstance(entry[0], bool) and str(entry[0]).isdigit()):
        raise BenchmarkError(f"{where}: expected [image_id, right caption, wrong caption], got {entry!r:.120}")
    image_id = str(entry[0])
    name = f"val2017/{image_id.zfill(12)}.jpg" if subset.startswith("COCO") else f"vg_images/{image_id}.jpg"
    captions = [require_text(entry[1], where, "right caption"), require_text(entry[2], where, "wrong caption")]
    return Item(subset, image_id, (item_path(root, *name.split("/")),), tuple(captions))


def pair_and_set(items: list[Item], correct: list[bool], subset: str) -> tuple[float, float]:
    """The release's pair and set accuracy of a controlled subset: per object pair, +1 pair when both images of
    each opposite preposition pair are right, +1 set when all four are; over N/2 and N/4 (N: items scored, a
    preposition without a scored image counts as wrong, as the release's zero default does)."""
    right: dict[str, dict[str, bool]] = defaultdict(dict)
    for item, ok in zip(items, correct, strict=True):
        right[item.tags["group"]][item.tags["preposition"]] = bool(ok)
    pairs = sum(all(found.get(p, False) for p in pair) for found in right.values() for pair in CONTROLLED[subset][1])
    sets = sum(sum(found.values()) == OPTIONS for found in right.values())
    return pairs / (len(items) / 2), sets / (len(items) / 4)


def whatsup_metrics(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
    """Each subset's accuracy (released rule and strict), a controlled subset's pair and set accuracy, and the
    means over the subsets."""
    by_subset = accuracies(predictions)
    metrics: dict[str, Metric] = {}
    for subset, rows in predictions.groupby("subset", sort=False):
        metrics[subset], metrics[f"{subset}_strict"] = by_subset[subset], by_subset[f"{subset}_strict"]
        if subset in CONTROLLED:
            kept = [item for item in items if item.subset == subset]
            for suffix, column in (("", RELEASED), ("_strict", "correct")):
                pair, whole = pair_and_set(kept, rows[column].tolist(), subset)
                metrics[f"{subset}_pair{suffix}"] = Metric(pair, len(kept) // 2)
                metrics[f"{subset}_set{suffix}"] = Metric(whole, len(kept) // 4)
    subsets = predictions["subset"].unique()
    for suffix in ("", "_strict"):
        metrics[f"mean{suffix}"] = macro([metrics[f"{subset}{suffix}"] for subset in subsets])
    return metrics


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    root = image_root(spec, benchmark_dir)
    files = {subset: benchmark_dir / WHATSUP_FILES[subset] for subset in whatsup_subsets(spec)}
    items = skip_repeats(item for subset, file in files.items() for item in load_subset(file, subset, root))
    return run_items(loaded, items, benchmark="whatsup", protocol=PROTOCOL, headline="mean", files=files,
                     metrics=whatsup_metrics, ties_to_first=True)  # np.argmax: the first caption, the right one


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / WHATSUP_FILES[subset] for subset in whatsup_subsets(spec)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    root = image_root(spec, folder)
    return [item.images[0] for subset in whatsup_subsets(spec)
            for item in load_subset(folder / WHATSUP_FILES[subset], subset, root)]


# (images, options) per subset: four captions each in Controlled A / B, two in the QA sets. The item counts are the
# smallest denominators that make all 202 of vl_compo's per-subset accuracies whole counts (individual_results.csv;
# tests/evaluate/test_whatsup.py checks them); the JSONs themselves were not seen
RELEASED_SUBSETS = {"WhatsUp_A": (412, 4), "WhatsUp_B": (408, 4), "COCO_QA_ONE": (2_247, 2),
                    "COCO_QA_TWO": (440, 2), "VG_QA_ONE": (1_160, 2), "VG_QA_TWO": (291, 2)}


def release_size(spec: dict[str, Any]) -> BenchmarkSize:
    subsets = [RELEASED_SUBSETS[s] for s in whatsup_subsets(spec)]
    return BenchmarkSize(sum(n for n, _ in subsets), sum(n * k for n, k in subsets), 0)


BENCHMARKS = (
    Benchmark(kind="whatsup", source="github.com/amitakamath/whatsup_vlms dataset_zoo; its argmax scorer",
              run=run, files=release_files, images=image_paths, size=release_size, headline="mean",
              subsets=tuple(WHATSUP_FILES),
              chance={s: 1 / (4 if s in CONTROLLED else 2) for s in WHATSUP_FILES},
              selections=stored_only,
              downloads=lambda spec: {"path": f"{WHATSUP_DRIVE}; its six JSONs",
                                      "image_root": f"{WHATSUP_DRIVE}; controlled_images/, controlled_clevr/, "
                                                    "val2017/, vg_images/"},
              keys={"subsets": Key({**NAMES, "items": {"enum": list(WHATSUP_FILES)}},
                                   "the subsets scored (default all six; the world writes `[WhatsUp_A]`)",
                                   "github.com/amitakamath/whatsup_vlms, seed 003")}),
)
