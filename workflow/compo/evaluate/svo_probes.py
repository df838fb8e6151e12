"""SVO-Probes (Hendricks & Nematzadeh, 2021): for a sentence, pick its image over one whose subject, verb or object
differs. Scored as FSC-CLIP scores it (seed 003, A.2: text-to-image top-1 between the positive and negative image),
not as the release's notebook (binary image-sentence match).

File: `benchmark_dir/{spec["file"] or "svo_probes.csv"}` as released (github.com/google-deepmind/svo_probes; also HF
`MichiganNLP/svo_probes`), a CSV with the columns `sentence, pos_triplet, neg_triplet, pos_url, neg_url, pos_image_id,
neg_image_id, subj_neg, verb_neg, obj_neg` (others ignored); the three `*_neg` columns are True / False and name the
negative's kind. The release has image URLs only: the images are read as
`{spec["image_root"] or benchmark_dir/images}/<image id>.jpg` (the project's layout: download each url to its id), and
a row whose image is missing is skipped and counted (FSC-CLIP scored the 22,162 rows whose images downloaded), as
is a row given again (`repeated_item`: the same sentence, images and negative kinds; scored once).

A row is right iff cos(sentence, positive image) > cos(sentence, negative image) strictly (the project's rule: a tie
is wrong). vl_compo's evaluation code is not released, so its tie rule cannot be checked; two different images tie
only by accident. Metrics: `subj_neg`, `verb_neg`, `obj_neg` (the rows whose column is True; a row with several is
counted in each) and the headline `mean`, their plain mean (vl_compo's `svo_probes` column, which its
`individual_results.csv` reproduces to 1e-8).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.candidates import Item, accuracy, macro, run_items, skip_repeats
from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    read_text_file,
    require_text,
)
from compo.evaluate.files import SVO_PROBES_FILE
from compo.evaluate.kinds import Benchmark, BenchmarkSize, Key, stored_only

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "svo-probes-t2i-pos-neg-strict"
NEGATIVES = ("subj_neg", "verb_neg", "obj_neg")
COLUMNS = ("sentence", "pos_triplet", "neg_triplet", "pos_url", "neg_url", "pos_image_id", "neg_image_id", *NEGATIVES)
FLAGS = {"True": True, "False": False}


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The release's rows, checked: per row its sentence, positive and negative image id and negative kinds."""
    reader = csv.DictReader(io.StringIO(read_text_file(path, "SVO-Probes CSV")))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise BenchmarkError(f"{path}: missing column(s) {', '.join(missing)} "
                             f"(expected the release's {', '.join(COLUMNS)})")
    rows = []
    for line, row in enumerate(reader, start=2):
        where = f"{path}: line {line}"
        flags = {}
        for column in NEGATIVES:
            if row[column] not in FLAGS:
                raise BenchmarkError(f"{where}: {column} must be True or False, got {row[column]!r}")
            flags[column] = FLAGS[row[column]]
        ids = [row[c] for c in ("pos_image_id", "neg_image_id")]
        if not all(ids) or ids[0] == ids[1]:
            raise BenchmarkError(f"{where}: pos_image_id and neg_image_id must be two different ids, got {ids}")
        rows.append({"item": str(line), "sentence": require_text(row["sentence"], where, "sentence"),
                     "pos": ids[0], "neg": ids[1], **flags})
    if not rows:
        raise BenchmarkError(f"{path}: no rows")
    return rows


def items_of(file: Path, root: Path) -> list[Item]:
    """Every row: its sentence, and the positive image (right) and the negative as candidates."""
    return [Item("+".join(n for n in NEGATIVES if row[n]) or "none", row["item"],
                 (item_path(root, f"{row['pos']}.jpg"), item_path(root, f"{row['neg']}.jpg")), (row["sentence"],),
                 tags={n: row[n] for n in NEGATIVES}) for row in load_rows(file)]


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    file = release_files(spec, benchmark_dir)[0]

    def by_negative(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
        metrics: dict[str, Metric] = {}
        for negative in NEGATIVES:  # a row with several negative kinds counts in each
            chosen = [item.tags[negative] for item in items]
            if any(chosen):
                metrics[negative] = accuracy(predictions[chosen])
        if not metrics:
            raise BenchmarkError(f"{file}: no scored row has subj_neg, verb_neg or obj_neg True")
        return {**metrics, "mean": macro(list(metrics.values()), len(predictions))}

    return run_items(loaded, skip_repeats(items_of(file, image_root(spec, benchmark_dir))), benchmark="svo_probes",
                     protocol=PROTOCOL, headline="mean", files=file, metrics=by_negative)


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / (spec.get("file") or SVO_PROBES_FILE)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [image for item in items_of(release_files(spec, folder)[0], image_root(spec, folder))
            for image in item.images]


RELEASED_PAIRS = 22_162  # the rows FSC-CLIP could download: two images and a sentence each

BENCHMARKS = (
    Benchmark(kind="svo_probes", source="github.com/google-deepmind/svo_probes svo_probes.csv; scored as FSC-CLIP "
              "(text-to-image top-1 between the two images)",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(2 * RELEASED_PAIRS, RELEASED_PAIRS, 0),
              headline="mean", subsets=NEGATIVES, chance=1 / 2,
              selections=stored_only,
              downloads=lambda spec: {"path": 'github.com/google-deepmind/svo_probes; svo_probes.csv',
                                      "image_root": 'the pos_url / neg_url of svo_probes.csv (img2dataset); <image '
                                                    "id>.jpg in an absolute folder of yours"},
              keys={"file": Key({"type": ["string", "null"]}, f"the release's CSV (default `{SVO_PROBES_FILE}`)")}),
)
