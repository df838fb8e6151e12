"""SVO-Probes (Hendricks & Nematzadeh, 2021): for a sentence, pick its image over one whose subject, verb or object
differs. Scored as FSC-CLIP scores it (seed 003, A.2: text-to-image top-1 between the positive and negative image),
not as the release's notebook (binary image-sentence match).

File: `benchmark_dir/{spec["file"] or "svo_probes.csv"}` as released (github.com/google-deepmind/svo_probes; also HF
`MichiganNLP/svo_probes`), a CSV with the columns `sentence, pos_triplet, neg_triplet, pos_url, neg_url, pos_image_id,
neg_image_id, subj_neg, verb_neg, obj_neg` (others ignored); the three `*_neg` columns are True / False and name the
negative's kind. The release has image URLs only: the images are read as
`{spec["image_root"] or benchmark_dir/images}/<image id>.jpg` (the project's layout: download each url to its id), and
a row whose image is missing is skipped and counted (FSC-CLIP scored the 22,162 rows whose images downloaded).

A row is right iff cos(sentence, positive image) > cos(sentence, negative image) strictly (the project's rule: a tie
is wrong). vl_compo's evaluation code is not released, so its tie rule cannot be checked; two different images tie
only by accident. Metrics: `subj_neg`, `verb_neg`, `obj_neg` (the rows whose column is True; a row with several is
counted in each) and the headline `mean`, their plain mean (vl_compo's `svo_probes` column, which its
`individual_results.csv` reproduces to 1e-8).
"""

from __future__ import annotations

import csv
import io
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
    read_text_file,
    require_text,
)
from compo.evaluate.files import SVO_PROBES_FILE
from compo.evaluate.kinds import Benchmark, BenchmarkSize

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


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files, pessimistic_rank

    file = benchmark_dir / (spec.get("file") or SVO_PROBES_FILE)
    rows = load_rows(file)
    root = image_root(spec, benchmark_dir)
    path = {image: item_path(root, f"{image}.jpg") for row in rows for image in (row["pos"], row["neg"])}
    image_emb, image_row, failed = encode_image_files(loaded, list(path.values()))

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    kept = []
    for row in rows:
        bad = next((failed[path[row[k]]] for k in ("pos", "neg") if path[row[k]] in failed), None)
        if bad:
            skipped[bad] += 1
            examples[bad].append(f"line {row['item']}")
        else:
            kept.append(row)
    log_skips("svo_probes", skipped, examples)
    if not kept:
        raise BenchmarkError(f"{file}: no row with both images readable under {root}")

    text_emb, text_row = encode_distinct_texts(loaded, [row["sentence"] for row in kept])
    texts = text_emb[[text_row[row["sentence"]] for row in kept]]
    score_pos = (texts * image_emb[[image_row[path[row["pos"]]] for row in kept]]).sum(dim=1)
    score_neg = (texts * image_emb[[image_row[path[row["neg"]]] for row in kept]]).sum(dim=1)
    ranks = pessimistic_rank(score_pos, score_neg[:, None])
    kinds = ["+".join(n for n in NEGATIVES if row[n]) or "none" for row in kept]
    predictions = pd.DataFrame({"subset": kinds, "item": [row["item"] for row in kept],
                                "correct": (ranks == 1).numpy(), "score_pos": score_pos.numpy(),
                                "score_neg": score_neg.numpy(), "rank": ranks.numpy()})
    metrics: dict[str, Metric] = {}
    for negative in NEGATIVES:
        chosen = [row[negative] for row in kept]
        if any(chosen):
            metrics[negative] = Metric(float(predictions["correct"][chosen].mean()), sum(chosen))
    if not metrics:
        raise BenchmarkError(f"{file}: no scored row has subj_neg, verb_neg or obj_neg True")
    metrics["mean"] = Metric(sum(m.value for m in metrics.values()) / len(metrics), len(predictions))
    return BenchmarkResult(PROTOCOL, "mean", metrics, predictions, dict(skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / (spec.get("file") or SVO_PROBES_FILE)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    root = image_root(spec, folder)
    return [item_path(root, f"{row[k]}.jpg") for row in load_rows(release_files(spec, folder)[0])
            for k in ("pos", "neg")]


RELEASED_PAIRS = 22_162  # the rows FSC-CLIP could download: two images and a sentence each

BENCHMARKS = (
    Benchmark(kind="svo_probes", source="github.com/google-deepmind/svo_probes svo_probes.csv; scored as FSC-CLIP "
              "(text-to-image top-1 between the two images)",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(2 * RELEASED_PAIRS, RELEASED_PAIRS, 0),
              headline="mean", subsets=NEGATIVES, chance=1 / 2),
)
