"""CREPE-Productivity (Ma et al., 2023): retrieve a Visual Genome region's caption from among hard negatives
that swap, negate or replace an atom of it, at caption complexities 4 to 12.

Files, as released (github.com/RAIVNLab/CREPE `data/prod_hard_negatives.zip`, unzipped under `benchmark_dir`):
`prod_hard_negatives/<atom|swap|negate>/prod_vg_hard_negs_<type>_complexity_<4..12>.csv` (`files.crepe_file`),
columns `image_id` (a Visual Genome id), `x, y, width, height` (the region), `caption` and `hard_negs` (a
Python-literal list of strings, read with `ast.literal_eval`, which evaluates literals only). The image is
`<image_root>/VG_100K/<image_id>.jpg`, else `VG_100K_2/<image_id>.jpg`, as the release's `get_image_by_id` looks
(image_root: `spec["image_root"]` or `benchmark_dir/images`), cropped to the region as its `TF.crop` does (padded
past the image's edge), except that a region larger than its image is clipped to it, as ARO's boxes are
(`bounded_box`; logged with a count), a region not overlapping its image is skipped (`box_outside_image`), and a
region with a coordinate of inf or NaN is skipped (`box_not_finite`), each counted in the result's "skipped".

As `crepe_prod_eval_clip.py` scores: the cropped image against `[caption] + hard_negs`, R@1 = the caption ranks
first. The release ranks by `torch.argsort(descending=True)`, which leaves the order of tied scores undefined, so
no released tie rule exists to report: ties count against the model (the project's rule, `pessimistic_rank`).
Metrics: `<type>` (R@1 over all complexities' items: vl_compo's `crepe::<type>`; its code is not released, so
pooling rather than averaging the complexities is an assumption), `<type>/<complexity>` (the release's
per-file R@1), `<type>_r3` / `_r5` / `_r10` and the headline `mean`, the mean of the types present (`type_mean`:
vl_compo's `crepe` column, which its `individual_results.csv` reproduces to the 6th digit; FSC-CLIP's CREPE column).
"""

from __future__ import annotations

import ast
import csv
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.candidates import Item, accuracies, run_items
from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    CroppedImage,
    Metric,
    image_root,
    item_path,
    read_text_file,
    require_text,
)
from compo.evaluate.files import CREPE_COMPLEXITIES, CREPE_TYPES, crepe_file
from compo.evaluate.kinds import Benchmark, BenchmarkSize, stored_only

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "crepe-productivity-i2t-r1-strict"
COLUMNS = ("image_id", "x", "y", "width", "height", "caption", "hard_negs")
VG_FOLDERS = ("VG_100K", "VG_100K_2")  # where the release's get_image_by_id looks, in this order
KS = (1, 3, 5, 10)
BOX_NOT_FINITE = "box_not_finite"  # a region coordinate of inf or NaN: skipped, counted


def load_rows(path: Path) -> list[dict[str, Any]]:
    """One complexity file's items: image id, crop box (PIL's left, top, right, bottom), caption, hard negatives."""
    reader = csv.DictReader(io.StringIO(read_text_file(path, "CREPE productivity CSV")))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise BenchmarkError(f"{path}: missing column(s) {', '.join(missing)} (expected {', '.join(COLUMNS)})")
    rows = []
    for line, row in enumerate(reader, start=2):
        where = f"{path}: line {line}"
        try:
            coordinates = [float(row[k]) for k in ("x", "y", "width", "height")]
        except (TypeError, ValueError) as error:
            raise BenchmarkError(f"{where}: x, y, width, height must be numbers ({error})") from error
        image_id = str(row["image_id"]).strip()
        if not all(math.isfinite(c) for c in coordinates):  # int(inf) raised OverflowError: no region to crop
            rows.append({"item": f"{path.stem}/{line}", "image_id": image_id, "box": None, "skip": BOX_NOT_FINITE,
                         "caption": require_text(row["caption"], where, "caption"), "negatives": []})
            continue
        x, y, width, height = (int(c) for c in coordinates)
        if width <= 0 or height <= 0 or not (image_id.isascii() and image_id.isdigit()):
            raise BenchmarkError(f"{where}: expected a Visual Genome image id and a positive crop, got "
                                 f"image_id {row['image_id']!r}, width {width}, height {height}")
        try:
            negatives = ast.literal_eval(row["hard_negs"] or "")
        except (ValueError, SyntaxError, MemoryError, RecursionError) as error:
            raise BenchmarkError(f"{where}: hard_negs is not a Python-literal list ({error})") from error
        if not isinstance(negatives, list | tuple) or not negatives:
            raise BenchmarkError(f"{where}: hard_negs must be a non-empty list of captions, got {negatives!r:.80}")
        rows.append({"item": f"{path.stem}/{line}", "image_id": image_id, "box": (x, y, x + width, y + height),
                     "caption": require_text(row["caption"], where, "caption"), "skip": None,
                     "negatives": [require_text(n, where, "hard_negs") for n in negatives]})
    if not rows:
        raise BenchmarkError(f"{path}: no items")
    return rows


def type_mean(values: dict[str, float]) -> float:
    """The benchmark's number: the plain mean of its negative types' R@1 (vl_compo's `crepe` column)."""
    present = [values[kind] for kind in CREPE_TYPES if kind in values]
    return sum(present) / len(present)


def vg_image(root: Path, image_id: str) -> Path:
    """The first of VG_100K/<id>.jpg and VG_100K_2/<id>.jpg that exists (else the first, reported missing)."""
    paths = [item_path(root, folder, f"{image_id}.jpg") for folder in VG_FOLDERS]
    return next((p for p in paths if p.is_file()), paths[0])


def items_of(benchmark_dir: Path, spec: dict[str, Any]) -> list[Item]:
    """Every file's regions, cropped, with the caption (right) and its hard negatives as candidates."""
    root = image_root(spec, benchmark_dir)
    return [Item(f"{kind}/{complexity}", row["item"], (CroppedImage(vg_image(root, row["image_id"]), row["box"]),),
                 (row["caption"], *row["negatives"]), skip=row["skip"])
            for kind in CREPE_TYPES for complexity in CREPE_COMPLEXITIES
            for row in load_rows(crepe_file(benchmark_dir, kind, complexity))]


def crepe_metrics(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
    """Per negative type its R@1 over every complexity (and R@3, @5, @10), per file its R@1, and `mean`."""
    metrics: dict[str, Metric] = {}
    kinds = predictions["subset"].str.split("/").str[0]
    for kind in CREPE_TYPES:
        rows = predictions[kinds == kind]
        if not len(rows):
            continue
        for k in KS:
            metrics[kind if k == 1 else f"{kind}_r{k}"] = Metric(float((rows["rank"] <= k).mean()), len(rows))
        metrics.update(accuracies(rows))
    metrics["mean"] = Metric(type_mean({kind: m.value for kind, m in metrics.items()}), len(predictions))
    return metrics


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    return run_items(loaded, items_of(benchmark_dir, spec), benchmark="crepe", protocol=PROTOCOL, headline="mean",
                     files=benchmark_dir, metrics=crepe_metrics)


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [crepe_file(folder, t, c) for t in CREPE_TYPES for c in CREPE_COMPLEXITIES]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [item.images[0].path for item in items_of(folder, spec)]


# ASSUMPTION (the CSVs were not seen, the paper's per-file counts not stated): 1,000 regions per negative type
# and complexity (3 x 9 files), each its caption and ~9 hard negatives
RELEASED_REGIONS, TEXTS_PER_REGION = len(CREPE_TYPES) * len(CREPE_COMPLEXITIES) * 1_000, 10

BENCHMARKS = (
    Benchmark(kind="crepe", source="github.com/RAIVNLab/CREPE data/prod_hard_negatives.zip; "
              "crepe_prod_eval_clip.py's R@1",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(RELEASED_REGIONS, RELEASED_REGIONS * TEXTS_PER_REGION, 0),
              headline="mean", subsets=CREPE_TYPES, chance=None, selections=stored_only,
              downloads=lambda spec: {"path": 'github.com/RAIVNLab/CREPE data/prod_hard_negatives.zip; '
                                              "prod_hard_negatives/",
                                      "image_root": 'Visual Genome VG_100K, VG_100K_2; the folder holding both'},
              keys={}),
)
