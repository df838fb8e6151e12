"""The one scorer of benchmarks that ask a model to pick the right caption (or image) among candidates.

A kind's reader turns its release into `Item`s: an image with candidate captions (image-to-text), a caption with
candidate images (text-to-image), or two images and two captions (Winoground's 2x2, judged by its own module).
`score_items` embeds each distinct image and text once, leaves out the items whose image cannot be read (counted
per reason, examples in the log) or that the reader left out (`Item.skip`), and gives each item's cosine
similarities in float64. `pick` ranks the right candidate among the wrong ones with ties counted against the model
(`pessimistic_rank`, within TIE_TOLERANCE), and beside it, where a released scorer takes the first maximum, the
released rank. `run_items` does both and the metrics: the accuracy of each subset (`accuracies`) and whatever the
kind adds through its `metrics` hook (What's Up's pair and set accuracy, SugarCrepe's groups, ...).

A similarity is the elementwise product of the two embeddings summed over the embedding, per item: a row's sum
does not depend on the rows computed with it, so neither the chunk nor a candidate's place changes a score.

Torch is imported inside the functions that score: a kind module importing this one stays importable without it
(the rules read the declarations while Snakemake builds the DAG).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.common import BenchmarkError, BenchmarkResult, CroppedImage, Metric, log_skips

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

PREDICTION_COLUMNS = ["subset", "item", "correct", "score_pos", "score_neg", "rank"]
RELEASED = "released_correct"  # pick's column of the released rule's verdict (a metric's input, not written)
CHUNK = 1024  # items whose similarities are computed together: bounded memory (items x candidates x dim)

# (loaded, images) -> (embeddings, row of each readable image, skip reason of each unreadable one), as
# compo.evaluate.scoring.encode_image_files; an image is whatever hashable key the encoder reads (a path, a crop)
ImageEncoder = Callable[["LoadedModel", list[Any]], "tuple[torch.Tensor, dict[Any, int], dict[Any, str]]"]


@dataclass(frozen=True)
class Item:
    """One question of a candidate benchmark.

    images / texts: with one image, the texts are its candidates (image-to-text); with one text, the images are
    (text-to-image); with several of both the item is a matrix its kind judges (Winoground). `right`: the index of
    the right candidate, or several (each must beat every wrong one; SugarCrepe++'s two captions). `skip`: the
    reason the reader leaves the item out (VALSE's unvalidated foils), counted as an unreadable image is. `tags`:
    what the kind's metrics group on."""

    subset: str
    item: str
    images: tuple[Hashable, ...] = ()
    texts: tuple[str, ...] = ()
    right: tuple[int, ...] = (0,)
    skip: str | None = None
    tags: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def image_to_text(self) -> bool:
        return len(self.images) == 1


REPEATED_ITEM = "repeated_item"  # skip reason: the item repeats an earlier one of its subset


def repeats(item: Item, seen: set[tuple[Any, ...]]) -> bool:
    """Whether `item` repeats one already in `seen` (the same subset, images, texts and right candidates: a release
    file giving an item twice), adding it to `seen` when not. An item the reader already skips is never one."""
    if item.skip is not None:
        return False
    key = (item.subset, item.images, item.texts, item.right)
    if key in seen:
        return True
    seen.add(key)
    return False


def skip_repeats(items: Iterable[Item]) -> list[Item]:
    """The items, each repeating an earlier one (`repeats`) left out as `repeated_item`: counted in the result's
    "skipped", never scored twice. Items without repeats are returned unchanged."""
    seen: set[tuple[Any, ...]] = set()
    return [replace(item, skip=REPEATED_ITEM) if repeats(item, seen) else item for item in items]


@dataclass
class Scored:
    """The items scored, in the reader's order, and their similarities: scores[n, t, i] = cos(text t, image i) of
    item n (float64; -inf past an item's own texts and images); the skip counts; the text embeddings (and the row
    of each text, `extra_texts` included) for a kind that compares texts with each other."""

    items: list[Item]
    scores: torch.Tensor
    skipped: Counter
    text_emb: torch.Tensor
    text_row: dict[str, int]


def _shown(image: Any) -> str:
    return str(image.path if isinstance(image, CroppedImage) else image[0] if isinstance(image, tuple) else image)


def _left_out(items: Sequence[Item], kept: Sequence[Item], reasons: dict[str, Counter],
              files: Path | Mapping[str, Path], benchmark: str) -> None:
    """An error naming the file when a subset (`files` a mapping: one file per subset) or the whole benchmark
    (one file) has no item left to score; `reasons`: the skip counts per subset."""
    def why(counts: Counter) -> str:
        return ", ".join(f"{reason}: {count}" for reason, count in sorted(counts.items()))

    if isinstance(files, Mapping):
        scored = {item.subset for item in kept}
        for subset in dict.fromkeys(item.subset for item in items):
            if subset not in scored:
                raise BenchmarkError(f"{files[subset]}: no {benchmark} item of {subset!r} left to score: every "
                                     f"item's image is missing or unreadable, or the item left out "
                                     f"({why(reasons[subset])})")
    elif not kept:
        raise BenchmarkError(f"{files}: no {benchmark} item left to score: every item's image is missing or "
                             f"unreadable, or the item left out ({why(sum(reasons.values(), Counter()))})")


def score_items(loaded: LoadedModel, items: Sequence[Item], *, benchmark: str, files: Path | Mapping[str, Path],
                encode_images: ImageEncoder | None = None, extra_texts: Sequence[str] = (),
                chunk: int = CHUNK) -> Scored:
    """Embed the items' images and texts, leave out (and count) those the reader skips or whose image is
    unreadable (the first unreadable one names the reason), and compute every kept item's similarities.

    files: the release file the items come from (an error names it when no item is left), or one per subset (an
    error when a subset has none left). encode_images: how images are embedded (default: each distinct file or
    CroppedImage once, `encode_image_files`). extra_texts: texts a kind also scores on its own (SugarCrepe++'s
    text-only task), embedded with the items' texts."""
    import torch

    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files

    skipped: Counter = Counter()
    reasons: dict[str, Counter] = defaultdict(Counter)  # per subset, for the error when one is left empty
    examples: dict[str, list[str]] = defaultdict(list)
    for item in items:
        if item.skip:
            skipped[item.skip] += 1
            reasons[item.subset][item.skip] += 1
            shown = f" ({_shown(item.images[0])})" if item.images else ""
            examples[item.skip].append(f"{item.subset}/{item.item}{shown}")
    asked = [item for item in items if not item.skip]
    image_emb, image_row, failed = (encode_images or encode_image_files)(
        loaded, [image for item in asked for image in item.images])
    kept = []
    for item in asked:
        bad = next((image for image in item.images if image in failed), None)
        if bad is None:
            kept.append(item)
        else:
            skipped[failed[bad]] += 1
            reasons[item.subset][failed[bad]] += 1
            examples[failed[bad]].append(f"{item.subset}/{item.item} ({_shown(bad)})")
    log_skips(benchmark, skipped, examples)
    _left_out(items, kept, reasons, files, benchmark)

    text_emb, text_row = encode_distinct_texts(loaded, [t for item in kept for t in item.texts] + list(extra_texts))
    texts, images = max(len(item.texts) for item in kept), max(len(item.images) for item in kept)
    scores = torch.full((len(kept), texts, images), -torch.inf, dtype=torch.float64)
    shapes: dict[tuple[int, int], list[int]] = defaultdict(list)
    for n, item in enumerate(kept):
        shapes[(len(item.texts), len(item.images))].append(n)
    for (t, i), members in shapes.items():  # items of one shape together: no padding in the products
        for start in range(0, len(members), chunk):
            rows = members[start : start + chunk]
            text = text_emb[torch.tensor([[text_row[s] for s in kept[n].texts] for n in rows])]       # [c, t, D]
            image = image_emb[torch.tensor([[image_row[p] for p in kept[n].images] for n in rows])]  # [c, i, D]
            scores[rows, :t, :i] = (text[:, :, None, :] * image[:, None, :, :]).sum(-1)
    return Scored(kept, scores, skipped, text_emb, text_row)


def pick(scored: Scored, *, ties_to_first: bool = False) -> pd.DataFrame:
    """The predictions of candidate items: per item its subset and id, `rank` (1 + the wrong candidates scoring at
    least as high as the right one, or the weakest of the right ones: ties against the model), `correct` (rank 1),
    `score_pos` (that right score) and `score_neg` (the best wrong one). ties_to_first: also `released_correct`,
    the verdict of a released scorer whose argmax takes the first maximum (a tie goes to the earlier candidate)."""
    import torch

    from compo.evaluate.scoring import first_max_rank, pessimistic_rank

    items, scores = scored.items, scored.scores
    if any(len(item.images) != 1 and len(item.texts) != 1 for item in items):
        raise ValueError("pick: an item with several images and several texts is judged by its kind")
    width = max(scores.shape[1], scores.shape[2])
    by_text = torch.nn.functional.pad(scores[:, :, 0], (0, width - scores.shape[1]), value=-torch.inf)
    by_image = torch.nn.functional.pad(scores[:, 0, :], (0, width - scores.shape[2]), value=-torch.inf)
    candidates = torch.where(torch.tensor([item.image_to_text for item in items])[:, None], by_text, by_image)
    count = torch.tensor([len(item.texts if item.image_to_text else item.images) for item in items])
    real = torch.arange(width)[None, :] < count[:, None]
    most = max(len(item.right) for item in items)  # padded with an item's first right index (set twice)
    index = torch.tensor([[*item.right, *item.right[:1] * (most - len(item.right))] for item in items])
    right = torch.zeros_like(real).scatter(1, index, True)
    wrong = real & ~right
    true = candidates.masked_fill(~right, torch.inf).min(dim=1).values
    ranks = pessimistic_rank(true, candidates, wrong)
    predictions = pd.DataFrame({
        "subset": [item.subset for item in items], "item": [item.item for item in items],
        "correct": (ranks == 1).numpy(), "score_pos": true.numpy(),
        "score_neg": candidates.masked_fill(~wrong, -torch.inf).max(dim=1).values.numpy(), "rank": ranks.numpy()})
    if ties_to_first:
        if any(len(item.right) != 1 for item in items):
            raise ValueError("pick: the first-maximum rule ranks one right candidate")
        target = torch.tensor([item.right[0] for item in items])
        predictions[RELEASED] = (first_max_rank(candidates, target) == 1).numpy()
    return predictions


def accuracy(rows: pd.DataFrame, column: str = "correct") -> Metric:
    return Metric(float(rows[column].mean()), len(rows))


def accuracies(predictions: pd.DataFrame) -> dict[str, Metric]:
    """Each subset's accuracy, in the order the subsets come: `<subset>` the released rule's where pick kept one
    (and `<subset>_strict` the project's), else the project's."""
    released = RELEASED in predictions
    metrics = {}
    for subset, rows in predictions.groupby("subset", sort=False):
        metrics[subset] = accuracy(rows, RELEASED if released else "correct")
        if released:
            metrics[f"{subset}_strict"] = accuracy(rows)
    return metrics


def macro(metrics: Sequence[Metric], n: int | None = None) -> Metric:
    """The unweighted mean of `metrics` (n: their items unless given)."""
    return Metric(sum(m.value for m in metrics) / len(metrics), sum(m.n for m in metrics) if n is None else n)


def accuracies_and_mean(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
    """The default metrics: each subset's accuracy and `mean`, their unweighted mean."""
    metrics = accuracies(predictions)
    return {**metrics, "mean": macro(list(metrics.values()))}


# (predictions with `released_correct` where kept, the items scored) -> the result's metrics
MetricsHook = Callable[[pd.DataFrame, list[Item]], dict[str, Metric]]


def run_items(loaded: LoadedModel, items: Sequence[Item], *, benchmark: str, protocol: str, headline: str,
              files: Path | Mapping[str, Path], metrics: MetricsHook = accuracies_and_mean,
              ties_to_first: bool = False, encode_images: ImageEncoder | None = None,
              skipped: Mapping[str, int] | None = None) -> BenchmarkResult:
    """Score candidate items (`score_items`, `pick`) into a result: the predictions table, the skip counts (with
    `skipped`, what the reader counted that never became an item) and the `metrics` hook's metrics."""
    scored = score_items(loaded, items, benchmark=benchmark, files=files, encode_images=encode_images)
    predictions = pick(scored, ties_to_first=ties_to_first)
    counts = Counter(skipped or {})
    counts.update(scored.skipped)
    return BenchmarkResult(protocol, headline, metrics(predictions, scored.items), predictions[PREDICTION_COLUMNS],
                           dict(counts))
