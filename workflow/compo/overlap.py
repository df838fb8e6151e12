"""No benchmark image in a training set: the guard that runs before any model trains on a dataset.

Every training dataset's images (its manifest) are compared with every evaluated benchmark's images, two ways:

* COCO ids read from the file names, where both sides name COCO images: `COCO_train2014_000000057870.jpg` (2014,
  Karpathy's files) or `000000057870.jpg` (2017, SugarCrepe's val2017 names). The 2014 and 2017 releases share
  their ids, so a Karpathy restval image (val2014) and a SugarCrepe image (val2017) with the same id are one image.
  This needs no file on disk (the real Karpathy split lists are names only).
* A content hash (sha256 of the file's bytes) for every image that exists on disk, whatever its name: files of
  equal size are hashed, so two sets are compared by one `stat` per file and a hash only where sizes collide.

The result is one row per benchmark (`{results}/tables/overlap/{dataset}.csv`: the counts, how they were found,
a few examples, and whether the overlap was accepted). A benchmark image found in the training set stops the
workflow before training, naming the dataset, the benchmark and the count, unless the config accepts that pair
(`overlap.accept: [{dataset, benchmark}]`, e.g. to reproduce a seed that trained on it); the table, and the
report's data page, show the accepted overlaps. A benchmark's images are those its kind's declaration lists
(`compo.evaluate.kinds`: the whole release, before any sampling the scorer does); kinds whose images are class
folders (`zeroshot`, `linear_probe`) declare none and are listed as not compared.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from compo.evaluate.kinds import benchmark_images
from compo.io import read_table, write_text
from compo.provenance import file_sha256

log = logging.getLogger(__name__)

COCO_2014 = re.compile(r"^COCO_[a-z]+20\d\d_(\d+)\.(?:jpe?g|png)$", re.IGNORECASE)
COCO_2017 = re.compile(r"^(\d{12})\.jpe?g$", re.IGNORECASE)
COLUMNS = ["dataset", "benchmark", "kind", "training_images", "benchmark_images", "by_coco_id", "by_content",
           "overlap", "accepted", "examples"]
EXAMPLES = 3


class OverlapError(RuntimeError):
    """A benchmark's images are in a training set and the config does not accept it."""


def coco_id(path: str | Path) -> int | None:
    """The COCO image id a file name carries (2014 or 2017 naming), else None."""
    name = Path(path).name
    match = COCO_2014.match(name) or COCO_2017.match(name)
    return int(match.group(1)) if match else None


def _sizes(paths: Iterable[Path], threads: int) -> dict[Path, int]:
    """File sizes of the paths that exist (a missing benchmark image is compared by name only); `threads` stat
    chunks of paths at once (a network filesystem answers slowly, a local one fast either way)."""
    def sizes(chunk: list[Path]) -> list[tuple[Path, int]]:
        found = []
        for path in chunk:
            try:
                found.append((path, os.stat(path).st_size))
            except OSError:  # missing, or not readable: no content to compare
                continue
        return found
    paths = list(dict.fromkeys(paths))
    chunks = [paths[i : i + 4096] for i in range(0, len(paths), 4096)]
    with ThreadPoolExecutor(max(1, threads)) as pool:
        return dict(pair for found in pool.map(sizes, chunks) for pair in found)


def compare(training: Iterable[str | Path], benchmark: Iterable[str | Path], threads: int = 1
            ) -> tuple[set[Path], set[Path]]:
    """The benchmark images found in `training`: (by COCO id, by content), each a set of benchmark paths."""
    training, benchmark = [Path(p) for p in training], list(dict.fromkeys(Path(p) for p in benchmark))
    ids = {i for i in map(coco_id, training) if i is not None}
    by_id = {p for p in benchmark if coco_id(p) in ids}
    train_sizes, bench_sizes = _sizes(training, threads), _sizes(benchmark, threads)
    common = set(train_sizes.values()) & set(bench_sizes.values())
    candidates = [p for p, s in train_sizes.items() if s in common], [p for p, s in bench_sizes.items() if s in common]
    with ThreadPoolExecutor(max(1, threads)) as pool:
        train_hashes = set(pool.map(file_sha256, candidates[0]))
        bench_hashes = dict(zip(candidates[1], pool.map(file_sha256, candidates[1]), strict=True))
    by_content = {p for p, h in bench_hashes.items() if h in train_hashes}
    return by_id, by_content


# --- the guard ------------------------------------------------------------------------------------------------


def accepted_pairs(accept: list[dict[str, str]] | None) -> set[tuple[str, str]]:
    return {(entry["dataset"], entry["benchmark"]) for entry in accept or []}


def overlap_table(dataset: str, training: list[str], benchmarks: dict[str, dict[str, Any]],
                  accept: list[dict[str, str]] | None = None, threads: int = 1) -> pd.DataFrame:
    """One row per benchmark ({name: {"spec", "dir"}}): how many of its images are in `training` (image paths)."""
    accepted, rows = accepted_pairs(accept), []
    for name, entry in benchmarks.items():
        spec = entry["spec"]
        images = benchmark_images(spec["kind"], spec, entry["dir"])
        row = {"dataset": dataset, "benchmark": name, "kind": spec["kind"], "training_images": len(set(training)),
               "accepted": (dataset, name) in accepted}
        if images is None:
            rows.append({**row, "benchmark_images": 0, "by_coco_id": 0, "by_content": 0, "overlap": 0,
                         "examples": "not compared (class folders)"})
            continue
        by_id, by_content = compare(training, images, threads)
        found = sorted(by_id | by_content)
        rows.append({**row, "benchmark_images": len(set(images)), "by_coco_id": len(by_id),
                     "by_content": len(by_content), "overlap": len(found),
                     "examples": "; ".join(str(p) for p in found[:EXAMPLES])})
    return pd.DataFrame(rows, columns=COLUMNS)


def refused(table: pd.DataFrame) -> pd.DataFrame:
    return table[(table["overlap"] > 0) & ~table["accepted"]]


def check_overlap(dataset: str, manifest: str | Path, benchmarks: dict[str, dict[str, Any]], out: str | Path,
                  accept: list[dict[str, str]] | None = None, threads: int = 1) -> pd.DataFrame:
    """Compare a dataset's manifest with the benchmarks, write the table to `out` when nothing is refused, and
    raise OverlapError naming each refused benchmark and its count otherwise (no table: training must not start)."""
    images = [str(p) for p in read_table(manifest, "manifest")["image_path"].drop_duplicates()]
    table = overlap_table(dataset, images, benchmarks, accept, threads)
    for row in table.itertuples():
        if row.overlap:
            log.warning("dataset %s: %d of benchmark %s's %d images are training images%s (e.g. %s)", dataset,
                        row.overlap, row.benchmark, row.benchmark_images, " (accepted)" if row.accepted else "",
                        row.examples)
    bad = refused(table)
    if len(bad):
        lines = [f"{r.benchmark}: {r.overlap} of its {r.benchmark_images} images ({r.by_coco_id} by COCO id, "
                 f"{r.by_content} by content; e.g. {r.examples})" for r in bad.itertuples()]
        raise OverlapError(f"dataset {dataset} ({manifest}) contains benchmark images, so no model trains on it:\n  "
                           + "\n  ".join(lines) + "\nUse a training split without them, or accept a named overlap "
                           f"in the config: overlap: {{accept: [{{dataset: {dataset}, benchmark: "
                           f"{bad.iloc[0]['benchmark']}}}]}}")
    write_text(table.to_csv(index=False), out)
    return table
