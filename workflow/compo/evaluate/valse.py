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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compo.evaluate.candidates import Item, accuracies_and_mean, accuracy, run_items
from compo.evaluate.common import BenchmarkError, BenchmarkResult, image_root, item_path, read_keyed_items
from compo.evaluate.files import VALSE_PIECES, valse_pieces
from compo.evaluate.kinds import FOLDERS, NAMES, Benchmark, BenchmarkSize, Key, Selection

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


def items_of(benchmark_dir: Path, spec: dict[str, Any]) -> list[Item]:
    """Every piece's items: the image, the caption (right) and its foil; an unvalidated foil left out (counted)."""
    default_root, roots = image_root(spec, benchmark_dir), spec.get("image_roots") or {}
    valid_only = spec.get("valid_only", True)
    return [Item(piece, foil_id, (item_path(Path(roots.get(piece) or roots.get(item["dataset"]) or default_root),
                                            item["image_file"]),), (item["caption"], item["foil"]),
                 skip=NOT_VALIDATED if valid_only and not validated(item) else None)
            for piece in pieces_of(spec) for foil_id, item in load_piece(benchmark_dir / f"{piece}.json").items()]


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    pieces = pieces_of(spec)
    if len(pieces) != len(PIECES):
        log.info("valse: 'mean' averages %d piece(s); the VALSE paper's Avg. averages all %d", len(pieces),
                 len(PIECES))
    return run_items(loaded, items_of(benchmark_dir, spec), benchmark="valse", protocol=PROTOCOL, headline="mean",
                     files=dict(zip(pieces, release_files(spec, benchmark_dir), strict=True)),
                     metrics=lambda predictions, items: {**accuracies_and_mean(predictions, items),
                                                         "micro": accuracy(predictions)})


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / f"{piece}.json" for piece in valse_pieces(spec)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [item.images[0] for item in items_of(folder, {**spec, "valid_only": False})]


RELEASED_IMAGES, RELEASED_ITEMS = 6_800, 8_782  # an item: its image, caption and foil

def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection]:
    """A piece's rows; `mean`: the pieces scored, each weighted equally; `micro`: every row."""
    if metric == "mean":
        return [Selection(tuple(m for m in metrics if m not in ("mean", "micro")), macro=True)]
    if metric == "micro":
        return [Selection(None)]
    return [Selection((metric,))]


BENCHMARKS = (
    Benchmark(kind="valse", source="github.com/Heidelberg-NLP/VALSE data/*.json; its pairwise ranking",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(RELEASED_IMAGES, 2 * RELEASED_ITEMS, 0),
              headline="mean", subsets=PIECES, chance=1 / 2,
              selections=selections,
              downloads=lambda spec: {"path": 'github.com/Heidelberg-NLP/VALSE data/; its 11 <piece>.json',
                                      "image_roots": "the piece's source images as VALSE's README lists them "
                                                     "(Visual7W, COCO 2014/2017, SWiG images_512, VisDial v1.0 val)"},
              keys={"pieces": Key(NAMES, "the piece files scored (default all 11; the headline `mean` is the VALSE "
                                  "paper's Avg.)", "VALSE"),
                    "image_roots": Key(FOLDERS, "an image folder per piece (as the release's "
                                       "config.py) or per source dataset", "VALSE"),
                    "valid_only": Key({"type": "boolean"}, "score only the foils annotators validated (default true)",
                                      "VALSE")}),
)
