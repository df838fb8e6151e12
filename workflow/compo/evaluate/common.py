"""What every benchmark reader shares, without torch: the result record, file reading, field checks and skip
counts (the scoring helpers that need torch, images embedded and ranks, are in `compo.evaluate.scoring`).

Ties in ranking are broken against the model everywhere: a candidate's rank is 1 plus the number of
wrong candidates that score at least as high as the right one (`pessimistic_rank`). So a SugarCrepe item
whose caption and negative score the same is wrong, a zero-shot image whose true class ties with
another class is not a top-1 hit, and a retrieval query whose best positive ties with a negative is
ranked behind it. This makes every metric deterministic and never flatters a degenerate model.

Scores are cosine similarities computed in float64, and two scores within `TIE_TOLERANCE` are a tie:
a matrix product can round equal inputs differently in different output columns (BLAS tail kernels),
so exact equality alone would make ties depend on where a candidate sits in the matrix. Each distinct
image file and text is embedded once, so equal inputs always get equal embeddings.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from compo.evaluate.files import BenchmarkError
from compo.images import (  # noqa: F401  (the loaders import them from here)
    CORRUPT_IMAGE,
    MISSING_IMAGE,
    OUTSIDE_ROOT,
    OutsideRoot,
    TarMember,
    item_path,
    open_image,
)
from compo.paths import has_visible_text, repeated

log = logging.getLogger(__name__)

TIE_TOLERANCE = 1e-9  # float64 rounding noise is ~1e-16; real score gaps are many orders larger


@dataclass
class Metric:
    value: float
    n: int


@dataclass
class BenchmarkResult:
    protocol: str                 # name of the scoring protocol, written to the result JSON
    headline: str                 # the metric that summarises the benchmark (used for correlations)
    metrics: dict[str, Metric]
    predictions: pd.DataFrame     # rows of the `predictions` table contract
    skipped: dict[str, int] = field(default_factory=dict)


def image_root(spec: dict[str, Any], benchmark_dir: Path) -> Path:
    return Path(spec.get("image_root") or benchmark_dir / "images")


def require(item: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    if not isinstance(item, dict):
        raise BenchmarkError(f"{where}: expected an object, got {type(item).__name__}")
    missing = [key for key in keys if key not in item]
    if missing:
        raise BenchmarkError(f"{where}: missing field(s) {', '.join(missing)}")


@dataclass(frozen=True)
class CroppedImage:
    """A region of an image file, embedded on its own (CREPE's Visual Genome crops): `box` is PIL's
    (left, top, right, bottom); a box reaching past the image is padded black, as torchvision's crop pads, a box
    larger than its image clipped to it (`bounded_box`)."""

    path: Path
    box: tuple[int, int, int, int]


BOX_OUTSIDE = "box_outside_image"  # a crop box that does not overlap its image (after clipping): nothing to embed
Box = tuple[float, float, float, float]


def bounded_box(box: Box, size: tuple[int, int]) -> Box | None:
    """The box as cropped: the released readers pad a box reaching outside its image (PIL's crop), kept here, but a
    box larger than its image in a dimension is clipped to the image in that dimension, so a crop is never larger
    than its image (an 11,000 px box on a 64 px image would be a 363 MB crop, issue 43; a 10^6 px one PIL's
    decompression-bomb error, issue 59). None when the box does not overlap the image (it lies beside it, maybe
    at a coordinate past what PIL can address: its OverflowError, issue 59)."""
    bounded = list(box)
    for axis, extent in enumerate(size):
        low, high = box[axis], box[axis + 2]
        if high - low > extent:
            bounded[axis], bounded[axis + 2] = max(low, 0.0), min(high, float(extent))
    if bounded[2] <= max(bounded[0], 0) or bounded[3] <= max(bounded[1], 0) or bounded[0] >= size[0] \
            or bounded[1] >= size[1]:
        return None
    return (bounded[0], bounded[1], bounded[2], bounded[3])


def log_skips(benchmark: str, skipped: Counter, examples: dict[str, list[str]]) -> None:
    for reason, count in sorted(skipped.items()):
        log.warning("%s: skipped %d item(s): %s (e.g. %s)", benchmark, count, reason,
                    ", ".join(examples.get(reason, [])[:3]))


def read_text_file(path: Path, what: str) -> str:
    """A benchmark's text file as UTF-8; a missing or undecodable file is an error naming it."""
    if not path.is_file():
        raise BenchmarkError(f"{path}: {what} not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise BenchmarkError(f"{path}: not UTF-8 text ({error}); {what} is read as UTF-8") from error


def read_json_file(path: Path, what: str) -> Any:
    """A benchmark's JSON file; a missing or invalid file is an error naming it and what it should hold."""
    text = read_text_file(path, what)
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, path))
    except json.JSONDecodeError as error:
        raise BenchmarkError(f"{path}: not valid JSON ({error})") from error


def _unique_keys(pairs: list[tuple[str, Any]], path: Path) -> dict[str, Any]:
    # json keeps the last of a repeated key: a SugarCrepe id given twice would drop an item unseen
    twice = repeated(key for key, _ in pairs)
    if twice:
        raise BenchmarkError(f"{path}: key(s) {', '.join(map(repr, twice))} given more than once in one object; "
                             "expected each id once")
    return dict(pairs)


def require_text(value: Any, where: str, key: str) -> str:
    """A benchmark caption: a string with a visible letter or digit (not empty, not only zero-width,
    direction, BOM or NUL characters, which would be scored as if they were text); else an error naming it."""
    if not isinstance(value, str) or not has_visible_text(value):
        raise BenchmarkError(f"{where}: field {key!r} must be a caption with a visible letter or digit, got "
                             f"{type(value).__name__} {value!r:.60}")
    return value


def refuse_repeated(values: list[Any], where: Path | str, what: str) -> None:
    """An error naming the values given more than once, where a repeat would change what is scored."""
    twice = repeated(values)
    if twice:
        shown = ", ".join(f"{value!s} ({n}x)" for value, n in list(twice.items())[:5])
        raise BenchmarkError(f"{where}: {len(twice)} {what} given more than once: {shown}; expected each once")


def read_keyed_items(path: Path, what: str, fields: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """A JSON object of items keyed by id (SugarCrepe, VALSE), each with `fields` as non-empty strings."""
    items = read_json_file(path, what)
    if not isinstance(items, dict) or not items:
        raise BenchmarkError(f"{path}: expected a non-empty object of items keyed by id")
    for item_id, item in items.items():
        where = f"{path}: item {item_id!r}"
        require(item, fields, where)
        for key in fields:
            require_text(item[key], where, key)
    return items
