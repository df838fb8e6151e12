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
and counted; a subset left with no item is an error naming its file.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    log_skips,
    read_json_file,
    require_text,
)
from compo.evaluate.files import WHATSUP_FILES, whatsup_subsets
from compo.evaluate.kinds import Benchmark, BenchmarkSize

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

PROTOCOL = "whatsup-i2t-argmax"
CONTROLLED = {"WhatsUp_A": ("controlled_images", (("left", "right"), ("on", "under"))),
              "WhatsUp_B": ("controlled_clevr", (("left", "right"), ("in-front", "behind")))}
OPTIONS = 4  # a controlled item's captions


@dataclass
class Item:
    """One question: its id, image path, captions (the right one first) and, for a controlled image, its object
    pair and preposition."""
    item: str
    image: Path
    captions: list[str]
    group: str = ""
    preposition: str = ""


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
    return Item(name, item_path(root, folder, name), captions, f"{parts[0]}|{parts[-1]}", parts[1])


def _qa(entry: Any, subset: str, root: Path, where: str) -> Item:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], int | str)
            and not isinstance(entry[0], bool) and str(entry[0]).isdigit()):
        raise BenchmarkError(f"{where}: expected [image_id, right caption, wrong caption], got {entry!r:.120}")
    image_id = str(entry[0])
    name = f"val2017/{image_id.zfill(12)}.jpg" if subset.startswith("COCO") else f"vg_images/{image_id}.jpg"
    captions = [require_text(entry[1], where, "right caption"), require_text(entry[2], where, "wrong caption")]
    return Item(image_id, item_path(root, *name.split("/")), captions)


def pair_and_set(items: list[Item], correct: list[bool], subset: str) -> tuple[float, float]:
    """The release's pair and set accuracy of a controlled subset: per object pair, +1 pair when both images of
    each opposite preposition pair are right, +1 set when all four are; over N/2 and N/4 (N: items scored, a
    preposition without a scored image counts as wrong, as the release's zero default does)."""
    right: dict[str, dict[str, bool]] = defaultdict(dict)
    for item, ok in zip(items, correct, strict=True):
        right[item.group][item.preposition] = bool(ok)
    pairs = sum(all(found.get(p, False) for p in pair) for found in right.values() for pair in CONTROLLED[subset][1])
    sets = sum(sum(found.values()) == OPTIONS for found in right.values())
    return pairs / (len(items) / 2), sets / (len(items) / 4)


def score(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(released rank, strict rank) of the right caption, listed first in each row of scores [N, options]."""
    from compo.evaluate.scoring import argmax_rank, pessimistic_rank

    return argmax_rank(scores[:, 0], scores[:, 1:]), pessimistic_rank(scores[:, 0], scores[:, 1:])


def subset_metrics(subset: str, items: list[Item], released: torch.Tensor, strict: torch.Tensor) -> dict[str, Metric]:
    """A subset's accuracy (released rule and strict) and, for a controlled subset, its pair and set accuracy."""
    n = len(items)
    metrics = {subset: Metric(float((released == 1).double().mean()), n),
               f"{subset}_strict": Metric(float((strict == 1).double().mean()), n)}
    if subset in CONTROLLED:
        for suffix, ranks in (("", released), ("_strict", strict)):
            pair, whole = pair_and_set(items, (ranks == 1).tolist(), subset)
            metrics[f"{subset}_pair{suffix}"] = Metric(pair, n // 2)
            metrics[f"{subset}_set{suffix}"] = Metric(whole, n // 4)
    return metrics


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    import torch

    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files

    root = image_root(spec, benchmark_dir)
    subsets = {subset: load_subset(benchmark_dir / WHATSUP_FILES[subset], subset, root)
               for subset in whatsup_subsets(spec)}
    image_emb, image_row, failed = encode_image_files(
        loaded, [item.image for items in subsets.values() for item in items])
    text_emb, text_row = encode_distinct_texts(
        loaded, [text for items in subsets.values() for item in items for text in item.captions])

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    metrics: dict[str, Metric] = {}
    frames = []
    for subset, items in subsets.items():
        kept = []
        for item in items:
            if item.image in failed:
                skipped[failed[item.image]] += 1
                examples[failed[item.image]].append(f"{subset}/{item.item} ({item.image})")
            else:
                kept.append(item)
        if not kept:
            raise BenchmarkError(f"{benchmark_dir / WHATSUP_FILES[subset]}: no item of {subset} has a readable image "
                                 f"under {root}")
        images = image_emb[[image_row[item.image] for item in kept]]
        texts = text_emb[torch.tensor([[text_row[t] for t in item.captions] for item in kept])]  # [n, options, D]
        scores = (texts * images[:, None, :]).sum(-1)
        released, strict = score(scores)
        metrics.update(subset_metrics(subset, kept, released, strict))
        frames.append(pd.DataFrame({
            "subset": subset, "item": [item.item for item in kept], "correct": (strict == 1).numpy(),
            "score_pos": scores[:, 0].numpy(), "score_neg": scores[:, 1:].max(dim=1).values.numpy(),
            "rank": strict.numpy()}))
    log_skips("whatsup", skipped, examples)
    for suffix in ("", "_strict"):
        values = [metrics[f"{subset}{suffix}"] for subset in subsets]
        metrics[f"mean{suffix}"] = Metric(sum(m.value for m in values) / len(values), sum(m.n for m in values))
    return BenchmarkResult(PROTOCOL, "mean", metrics, pd.concat(frames, ignore_index=True), dict(skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / WHATSUP_FILES[subset] for subset in whatsup_subsets(spec)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    root = image_root(spec, folder)
    return [item.image for subset in whatsup_subsets(spec)
            for item in load_subset(folder / WHATSUP_FILES[subset], subset, root)]


# (images, options) per subset: four captions each in Controlled A / B, two in the QA sets. The item counts are the
# smallest denominators that make all 202 of vl_compo's per-subset accuracies whole counts (individual_results.csv;
# tests/test_whatsup_spec_svo.py checks them); the JSONs themselves were not seen
RELEASED_SUBSETS = {"WhatsUp_A": (412, 4), "WhatsUp_B": (408, 4), "COCO_QA_ONE": (2_247, 2),
                    "COCO_QA_TWO": (440, 2), "VG_QA_ONE": (1_160, 2), "VG_QA_TWO": (291, 2)}


def release_size(spec: dict[str, Any]) -> BenchmarkSize:
    subsets = [RELEASED_SUBSETS[s] for s in whatsup_subsets(spec)]
    return BenchmarkSize(sum(n for n, _ in subsets), sum(n * k for n, k in subsets), 0)


BENCHMARKS = (
    Benchmark(kind="whatsup", source="github.com/amitakamath/whatsup_vlms dataset_zoo; its argmax scorer",
              run=run, files=release_files, images=image_paths, size=release_size, headline="mean",
              subsets=tuple(WHATSUP_FILES),
              chance={s: 1 / (4 if s in CONTROLLED else 2) for s in WHATSUP_FILES}),
)
