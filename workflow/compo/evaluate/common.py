"""What every benchmark loader shares: the result record, image loading with skip counts, and ranks.

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
import torch

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
from compo.models import LoadedModel, encode_image_batch, encode_texts
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
    (left, top, right, bottom); a box reaching past the image is padded black, as torchvision's crop pads."""

    path: Path
    box: tuple[int, int, int, int]


class _ImageFiles(torch.utils.data.Dataset):
    """Image files (or regions of them) decoded and preprocessed (in DataLoader workers when there are any):
    per path its index and the model input, or the skip reason."""

    def __init__(self, paths: list[Path | CroppedImage], preprocess: Any) -> None:
        self.paths, self.preprocess = paths, preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | str]:
        source = self.paths[index]
        opened = open_image(source.path if isinstance(source, CroppedImage) else source)
        if isinstance(source, CroppedImage) and not isinstance(opened, str):
            opened = opened.crop(source.box)
        return index, opened if isinstance(opened, str) else self.preprocess(opened)


def encode_image_files(
    loaded: LoadedModel, paths: list[Path] | list[CroppedImage], batch_size: int = 256
) -> tuple[torch.Tensor, dict[Any, int], dict[Any, str]]:
    """Embed each distinct readable image (or CroppedImage region) once, in batches (bounded memory), on the
    model's device.

    Files are decoded and preprocessed in `loaded.workers` DataLoader workers (none: in this process).
    Returns the embeddings [n_readable, D], the row of each readable path, and the skip reason of
    each unreadable path."""
    distinct = list(dict.fromkeys(paths))
    rows: dict[Path, int] = {}
    failed: dict[Path, str] = {}
    chunks = []
    loader = torch.utils.data.DataLoader(
        _ImageFiles(distinct, loaded.preprocess), batch_size=batch_size, num_workers=loaded.workers,
        collate_fn=list, pin_memory=loaded.device.type == "cuda")
    for items in loader:
        images = []
        for index, item in items:
            path = distinct[index]
            if isinstance(item, str):
                failed[path] = item
                continue
            rows[path] = len(rows)
            images.append(item)
        if images:
            chunks.append(encode_image_batch(loaded, torch.stack(images)))
    embeddings = torch.cat(chunks).double() if chunks else torch.empty(0, 0, dtype=torch.float64)
    return embeddings, rows, failed


def encode_distinct_texts(loaded: LoadedModel, texts: list[str]) -> tuple[torch.Tensor, dict[str, int]]:
    """Embed each distinct text once; returns the embeddings and the row of each text."""
    distinct = list(dict.fromkeys(texts))
    return encode_texts(loaded, distinct).double(), {text: row for row, text in enumerate(distinct)}


def pessimistic_rank(true_scores: torch.Tensor, other_scores: torch.Tensor,
                     others_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Rank (1 = best) of each query's right candidate among its wrong ones, ties counted against it:
    1 + the number of wrong candidates scoring at least `true - TIE_TOLERANCE`.

    true_scores [N]; other_scores [N, M] the wrong candidates; others_mask [N, M] marks which entries
    of other_scores are wrong candidates (all when None)."""
    beaten_or_tied = other_scores >= true_scores[:, None] - TIE_TOLERANCE
    if others_mask is not None:
        beaten_or_tied &= others_mask
    return 1 + beaten_or_tied.sum(dim=1)


def argmax_rank(true_scores: torch.Tensor, other_scores: torch.Tensor) -> torch.Tensor:
    """Rank (1 = best) of each query's right candidate when it is listed FIRST and ties go to it, as
    `np.argmax` (the first maximum) scores a benchmark whose released code reads `argmax == 0` (ARO's
    COCO-/Flickr-Order): 1 + the number of wrong candidates scoring above `true + TIE_TOLERANCE`."""
    return 1 + (other_scores > true_scores[:, None] + TIE_TOLERANCE).sum(dim=1)


def first_max_rank(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The target's rank when ties go to the EARLIER candidate, as `argmax` (torch's and numpy's: the first
    maximum) and numpy's stable `argsort(-scores)` of a few values order them (ImageCoDe, SPEC): 1 + the number
    of candidates before the target scoring at least as high, and after it scoring higher. scores [N, K],
    target [N]."""
    true = scores.gather(1, target[:, None])
    position = torch.arange(scores.shape[1])[None, :]
    before = (position < target[:, None]) & (scores >= true - TIE_TOLERANCE)
    after = (position > target[:, None]) & (scores > true + TIE_TOLERANCE)
    return 1 + (before | after).sum(dim=1)


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
