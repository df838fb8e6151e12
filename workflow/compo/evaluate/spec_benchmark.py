"""SPEC (Peng et al., 2024): pick the right one of several candidates differing in one attribute (absolute / relative
size, absolute / relative position, existence, count), image-to-text and text-to-image. Benchmark kind `spec`.

Files, in the layout the release's `spec/dataset.py` reads (HF `wjpoom/SPEC`, `data.zip`: annotations and images
together): per subset of `files.SPEC_SUBSETS`, `benchmark_dir/<subset>/image2text.json` and `text2image.json`, each a
list of `{"query", "keys", "label"}`. image2text: query = an image path relative to the subset folder, keys = the
candidate texts; text2image: query = a text, keys = candidate image paths relative to the subset folder; label = the
index of the right key. A file's items have the same number of keys (the release stacks them in batches).

Scoring as the release's `spec/models/clip_wrapper.py`: `argmax` over the cosine similarities == label, torch's
argmax taking the first maximum, so a tie goes to the candidate listed first: accuracy `<subset>/<i2t|t2i>`, the
direction means `i2t` and `t2i` over the subsets (the release's "average all subset"), and the headline `mean` =
(i2t + t2i) / 2, FSC-CLIP's SPEC column (seed 003, A.2). The project's strict rule (a tie counts against the model)
gives `*_strict` and the predictions' `rank`. An item with an unreadable image is skipped and counted, as is an item
given again in its file (`repeated_item`: the same query, keys and label; scored once); a subset direction left with
no item is an error naming its file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.candidates import Item, accuracies, run_items, skip_repeats
from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    item_path,
    read_json_file,
    require,
    require_text,
)
from compo.evaluate.files import SPEC_DIRECTIONS, SPEC_SUBSETS
from compo.evaluate.kinds import Benchmark, BenchmarkSize, stored_only

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "spec-argmax-i2t-t2i"


def load_file(path: Path, direction: str, subset_dir: Path) -> list[Item]:
    """One subset's image2text or text2image file, checked, as items of `<subset folder name>/<direction>`: the
    query image with its candidate texts, or the query text with its candidate images (resolved under the
    subset folder)."""
    data = read_json_file(path, f"SPEC {direction} file")
    if not isinstance(data, list) or not data:
        raise BenchmarkError(f"{path}: expected a non-empty list of {{query, keys, label}}")
    items: list[Item] = []
    for k, entry in enumerate(data):
        where = f"{path}: item {k}"
        require(entry, ("query", "keys", "label"), where)
        keys, label = entry["keys"], entry["label"]
        if not isinstance(keys, list) or len(keys) < 2:
            raise BenchmarkError(f"{where}: 'keys' must be a list of at least 2 candidates, got {keys!r:.120}")
        if items and len(keys) != len(data[0]["keys"]):
            raise BenchmarkError(f"{where}: {len(keys)} keys, but item 0 has {len(data[0]['keys'])}; the release "
                                 "batches a file's items, so each has the same number")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(keys):
            raise BenchmarkError(f"{where}: 'label' must be an index into its {len(keys)} keys, got {label!r}")
        texts = [entry["query"]] if direction == "t2i" else keys
        names = keys if direction == "t2i" else [entry["query"]]
        for n, text in enumerate(texts):
            require_text(text, where, "query" if direction == "t2i" else f"keys[{n}]")
        if not all(isinstance(name, str) and name for name in names):
            raise BenchmarkError(f"{where}: image paths must be non-empty strings, got {names!r:.120}")
        images = tuple(item_path(subset_dir, name) for name in names)
        items.append(Item(f"{subset_dir.name}/{direction}", str(k), images, tuple(texts), (label,)))
    return items


def summary(accuracy: dict[str, float]) -> dict[str, float]:
    """The direction means over subsets (keys `<subset>/<direction>`) and `mean`, their mean (FSC-CLIP's column)."""
    means = {}
    for direction in SPEC_DIRECTIONS:
        values = [v for name, v in accuracy.items() if name.endswith(f"/{direction}")]
        if values:
            means[direction] = sum(values) / len(values)
    means["mean"] = sum(means.values()) / len(means)
    return means


def spec_metrics(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
    """Each `<subset>/<direction>`'s accuracy (released rule and strict), the direction means and `mean`."""
    metrics = accuracies(predictions)
    keys = predictions["subset"].unique()
    for suffix in ("", "_strict"):
        means = summary({key: metrics[f"{key}{suffix}"].value for key in keys})
        for name, value in means.items():
            n = sum(metrics[key].n for key in keys if name == "mean" or key.endswith(f"/{name}"))
            metrics[f"{name}{suffix}"] = Metric(value, n)
    return metrics


def files_of(folder: Path) -> dict[str, Path]:
    """The release's files, by `<subset>/<direction>`."""
    return {f"{subset}/{direction}": folder / subset / name
            for subset in SPEC_SUBSETS for direction, name in SPEC_DIRECTIONS.items()}


def items_of(folder: Path) -> list[Item]:
    return [item for key, path in files_of(folder).items()
            for item in load_file(path, key.split("/")[1], path.parent)]


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    # the released argmax takes the first maximum: a tie goes to the candidate listed first
    return run_items(loaded, skip_repeats(items_of(benchmark_dir)), benchmark="spec", protocol=PROTOCOL,
                     headline="mean", files=files_of(benchmark_dir), metrics=spec_metrics, ties_to_first=True)


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return list(files_of(folder).values())


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [image for item in items_of(folder) for image in item.images]


# items per subset and direction (inferred from the release's notebook); ASSUMPTION: each image is an i2t query
# and each text a t2i query once, the candidates drawn from the same images and texts
RELEASED_ITEMS = {"existence": 1_000, "relative_spatial": 2_000, "absolute_size": 1_500, "relative_size": 1_500,
                  "count": 4_500, "absolute_spatial": 4_500}

BENCHMARKS = (
    Benchmark(kind="spec", source="HF wjpoom/SPEC data.zip; its clip_wrapper argmax scorer",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(sum(RELEASED_ITEMS.values()), sum(RELEASED_ITEMS.values()), 0),
              headline="mean", subsets=("i2t", "t2i"), chance=None, selections=stored_only,
              downloads=lambda spec: {"path": 'huggingface.co/datasets/wjpoom/SPEC (compo prefetch); data.zip '
                                              "unpacked"},
              keys={}),
)
