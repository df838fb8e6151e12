"""Scoring helpers every benchmark's scorer shares (torch): each distinct image and text embedded once, and the
ranks of the right candidate with ties counted as each benchmark's released scorer counts them (see
`compo.evaluate.common` for the tie rule and its tolerance)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from compo.evaluate.common import (
    BOX_OUTSIDE,
    TIE_TOLERANCE,
    BenchmarkError,
    CroppedImage,
    Metric,
    bounded_box,
    open_image,
)
from compo.models import LoadedModel, encode_image_batch, encode_texts

log = logging.getLogger(__name__)


class _ImageFiles(torch.utils.data.Dataset):
    """Image files (or regions of them) decoded and preprocessed (in DataLoader workers when there are any):
    per path its index and the model input, or the skip reason."""

    def __init__(self, paths: list[Path | CroppedImage], preprocess: Any) -> None:
        self.paths, self.preprocess = paths, preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | str, bool]:
        """(index, the model input or the skip reason, whether a crop box was clipped to its image)."""
        source = self.paths[index]
        opened = open_image(source.path if isinstance(source, CroppedImage) else source)
        clipped = False
        if isinstance(source, CroppedImage) and not isinstance(opened, str):
            box = bounded_box(source.box, opened.size)
            if box is None:
                return index, BOX_OUTSIDE, False
            clipped, opened = box != source.box, opened.crop(box)
        return index, opened if isinstance(opened, str) else self.preprocess(opened), clipped


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
    clipped = []
    for items in loader:
        images = []
        for index, item, was_clipped in items:
            path = distinct[index]
            if isinstance(item, str):
                failed[path] = item
                continue
            rows[path] = len(rows)
            images.append(item)
            if was_clipped:
                clipped.append(path)
        if images:
            chunks.append(encode_image_batch(loaded, torch.stack(images)))
    if clipped:
        log.warning("%d crop box(es) larger than their image clipped to it, e.g. %s box %s", len(clipped),
                    clipped[0].path, clipped[0].box)
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


NO_LABEL = "image_without_labels"  # a multi-label test image without a label: counted, not ranked


# --- multi-label and ranked-candidate rows (zero-shot and the linear probe) ----------------------------------------
def mean_average_precision(scores: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean over the classes with a positive of average precision: per class, the mean over its positives
    of the precision at the positive's rank, ranked by score with ties counted against it (a negative
    scoring at least as high ranks ahead)."""
    precisions = []
    for c in range(targets.shape[1]):
        positive = targets[:, c].bool()
        if not positive.any():
            continue
        pos_scores, neg_scores = scores[positive, c], scores[~positive, c]
        negatives_ahead = (neg_scores[None, :] >= pos_scores[:, None] - TIE_TOLERANCE).sum(1)
        positives_ahead = (pos_scores[None, :] > pos_scores[:, None] + TIE_TOLERANCE).sum(1) + 1
        precisions.append(float((positives_ahead / (positives_ahead + negatives_ahead)).double().mean()))
    if not precisions:
        raise BenchmarkError("multi-label probe: no test image has a label")
    return float(np.mean(precisions))


def ranked_rows(logits: torch.Tensor, true: torch.Tensor, wrong: torch.Tensor, subsets: list[str],
                items: list[str]) -> pd.DataFrame:
    """Prediction rows of ranked candidates: `true` [N] the right one's score, `wrong` [N, C] marks the wrong
    ones among `logits` [N, C] (ties counted against the right one)."""
    ranks = pessimistic_rank(true, logits, wrong)
    return pd.DataFrame({
        "subset": subsets, "item": items, "correct": (ranks == 1).numpy(), "score_pos": true.numpy(),
        "score_neg": logits.masked_fill(~wrong, float("-inf")).max(dim=1).values.numpy(), "rank": ranks.numpy(),
    })


def multilabel_scores(logits: torch.Tensor, targets: torch.Tensor, items: list[str], skipped: Counter
                      ) -> tuple[pd.DataFrame, dict[str, Metric]]:
    """One prediction row per labelled test image (subset "all"): the rank of its best-scoring label among
    its other classes; images without a label are counted, not ranked."""
    labelled = targets.any(dim=1)
    if int((~labelled).sum()):
        skipped[NO_LABEL] += int((~labelled).sum())
    rows = torch.nonzero(labelled).squeeze(1)
    wrong = ~targets[rows]
    true = logits[rows].masked_fill(wrong, float("-inf")).max(dim=1).values
    predictions = ranked_rows(logits[rows], true, wrong, ["all"] * len(rows), [items[i] for i in rows.tolist()])
    metrics = {"map": Metric(mean_average_precision(logits, targets), len(items)),
               "top1": Metric(float(predictions["correct"].mean()), len(predictions))}
    return predictions, metrics
