"""VALSE (Parcalabescu et al., 2022): does the model prefer a caption to its foil, per linguistic piece?

Files: `{benchmark_dir}/{piece}.json` for each piece in `spec["pieces"]` (default `PIECES`: the 11 files
of the release, github.com/Heidelberg-NLP/VALSE `data/`), each `{"<foil id>": {"dataset", "image_file",
"caption", "foil", "mturk", ...}}`. The image of an item is `image_roots[piece] / image_file` when
`spec["image_roots"]` names the piece (as the release's `config.py` gives one image folder per piece),
else `image_roots[dataset]` when it names the item's source dataset (SWiG, visual7w, VisDial_v1.0,
coco2017, coco_2017, "FOIL dataset"), else `{spec["image_root"] or benchmark_dir/images}/image_file`.
As the VALSE authors advise, only validated foils are scored: items with `mturk.caption < 2` (fewer than
two of three annotators chose the caption, and not the foil, as describing the image) are dropped and
counted as "not_validated"; items without `mturk` (e.g. the synthetic world's, checked by the truth
checker) are kept. `spec["valid_only"]: false` keeps all. Pairwise ranking accuracy acc_r: correct iff
cos(image, caption) > cos(image, foil) strictly. Metrics per piece; "mean" (the headline) is their
unweighted mean, as the VALSE paper's "Avg." column (Table 2: the mean of the 11 piece accuracies, e.g.
CLIP's 64.0); "micro" is the item-level accuracy.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    log_skips,
    read_keyed_items,
)
from compo.evaluate.files import VALSE_PIECES, valse_pieces
from compo.evaluate.kinds import Benchmark, BenchmarkSize

if TYPE_CHECKING:
    from compo.models import LoadedModel

log = logging.getLogger(__name__)

PROTOCOL = "valse-pairwise-ranking-strict"
PIECES = VALSE_PIECES
FIELDS = ("dataset", "image_file", "caption", "foil")
NOT_VALIDATED = "not_validated"
MIN_VOTES = 2


pieces_of = valse_pieces


def load_piece(path: Path) -> dict[str, dict[str, Any]]:
    items = read_keyed_items(path, "VALSE piece file", FIELDS)
    for foil_id, item in items.items():
        where = f"{path}: item {foil_id!r}"
        votes = item.get("mturk")
        if votes is not None and not (isinstance(votes, dict) and isinstance(votes.get("caption"), int)):
            raise BenchmarkError(f"{where}: 'mturk' must be an object with an integer 'caption' count")
    return items


def validated(item: dict[str, Any]) -> bool:
    return item.get("mturk") is None or item["mturk"]["caption"] >= MIN_VOTES


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files, pessimistic_rank

    pieces = {piece: load_piece(benchmark_dir / f"{piece}.json") for piece in pieces_of(spec)}
    default_root, roots = image_root(spec, benchmark_dir), spec.get("image_roots") or {}

    def path_of(piece: str, item: dict[str, Any]) -> Path:
        root = roots.get(piece) or roots.get(item["dataset"]) or default_root
        return item_path(Path(root), item["image_file"])

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    scored: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for piece, items in pieces.items():
        scored[piece] = []
        for foil_id, item in items.items():
            if spec.get("valid_only", True) and not validated(item):
                skipped[NOT_VALIDATED] += 1
                examples[NOT_VALIDATED].append(f"{piece}/{foil_id}")
            else:
                scored[piece].append((foil_id, item))

    image_emb, image_row, failed = encode_image_files(
        loaded, [path_of(piece, item) for piece, kept in scored.items() for _, item in kept])
    text_emb, text_row = encode_distinct_texts(
        loaded, [item[key] for kept in scored.values() for _, item in kept for key in ("caption", "foil")])

    frames = []
    for piece, kept in scored.items():
        rows = []
        for foil_id, item in kept:
            path = path_of(piece, item)
            if path in failed:
                skipped[failed[path]] += 1
                examples[failed[path]].append(f"{piece}/{foil_id} ({path})")
            else:
                rows.append((foil_id, image_row[path], text_row[item["caption"]], text_row[item["foil"]]))
        if not rows:
            raise BenchmarkError(f"{benchmark_dir / f'{piece}.json'}: no validated item with a readable image")
        ids, img, cap, foil = zip(*rows, strict=True)
        images = image_emb[list(img)]
        score_caption = (images * text_emb[list(cap)]).sum(1)
        score_foil = (images * text_emb[list(foil)]).sum(1)
        ranks = pessimistic_rank(score_caption, score_foil[:, None])
        frames.append(pd.DataFrame({"subset": piece, "item": list(ids), "correct": (ranks == 1).numpy(),
                                    "score_pos": score_caption.numpy(), "score_neg": score_foil.numpy(),
                                    "rank": ranks.numpy()}))
    log_skips("valse", skipped, examples)
    predictions = pd.concat(frames, ignore_index=True)

    metrics: dict[str, Metric] = {}
    for piece in pieces:
        correct = predictions.loc[predictions["subset"] == piece, "correct"]
        metrics[piece] = Metric(float(correct.mean()), int(len(correct)))
    if len(pieces) != len(PIECES):
        log.info("valse: 'mean' averages %d piece(s); the VALSE paper's Avg. averages all %d", len(pieces),
                 len(PIECES))
    metrics["mean"] = Metric(sum(metrics[p].value for p in pieces) / len(pieces), len(predictions))
    metrics["micro"] = Metric(float(predictions["correct"].mean()), len(predictions))
    return BenchmarkResult(PROTOCOL, "mean", metrics, predictions, dict(skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / f"{piece}.json" for piece in valse_pieces(spec)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    default_root, roots = image_root(spec, folder), spec.get("image_roots") or {}
    return [item_path(Path(roots.get(piece) or roots.get(item["dataset"]) or default_root), item["image_file"])
            for piece in valse_pieces(spec) for item in load_piece(folder / f"{piece}.json").values()]


RELEASED_IMAGES, RELEASED_ITEMS = 6_800, 8_782  # an item: its image, caption and foil

BENCHMARKS = (
    Benchmark(kind="valse", source="github.com/Heidelberg-NLP/VALSE data/*.json; its pairwise ranking",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(RELEASED_IMAGES, 2 * RELEASED_ITEMS, 0),
              headline="mean", subsets=PIECES, chance=1 / 2),
)
