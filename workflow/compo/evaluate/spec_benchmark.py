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
gives `*_strict` and the predictions' `rank`. An item with an unreadable image is skipped and counted; a subset
direction left with no item is an error naming its file.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    item_path,
    log_skips,
    read_json_file,
    require,
    require_text,
)
from compo.evaluate.files import SPEC_DIRECTIONS, SPEC_SUBSETS
from compo.evaluate.kinds import Benchmark, BenchmarkSize

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

PROTOCOL = "spec-argmax-i2t-t2i"
Item = tuple[Any, list[Any], int]  # query, keys, label: images as Paths, texts as str


def load_file(path: Path, direction: str, subset_dir: Path) -> list[Item]:
    """One subset's image2text or text2image file, checked; image paths resolved under the subset folder."""
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
        if items and len(keys) != len(items[0][1]):
            raise BenchmarkError(f"{where}: {len(keys)} keys, but item 0 has {len(items[0][1])}; the release batches "
                                 "a file's items, so each has the same number")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(keys):
            raise BenchmarkError(f"{where}: 'label' must be an index into its {len(keys)} keys, got {label!r}")
        texts = [entry["query"]] if direction == "t2i" else keys
        names = keys if direction == "t2i" else [entry["query"]]
        for n, text in enumerate(texts):
            require_text(text, where, "query" if direction == "t2i" else f"keys[{n}]")
        if not all(isinstance(name, str) and name for name in names):
            raise BenchmarkError(f"{where}: image paths must be non-empty strings, got {names!r:.120}")
        images = [item_path(subset_dir, name) for name in names]
        items.append((entry["query"], images, label) if direction == "t2i" else (images[0], keys, label))
    return items


def ranks(scores: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's label: its released rank (the first maximum wins a tie), its strict rank (a tie is wrong), and the
    mask of the other candidates; scores [N, K], label [N]."""
    import torch

    from compo.evaluate.scoring import first_max_rank, pessimistic_rank

    others = torch.ones_like(scores, dtype=torch.bool).scatter(1, label[:, None], False)
    strict = pessimistic_rank(scores.gather(1, label[:, None])[:, 0], scores, others)
    return first_max_rank(scores, label), strict, others


def summary(accuracy: dict[str, float]) -> dict[str, float]:
    """The direction means over subsets (keys `<subset>/<direction>`) and `mean`, their mean (FSC-CLIP's column)."""
    means = {}
    for direction in SPEC_DIRECTIONS:
        values = [v for name, v in accuracy.items() if name.endswith(f"/{direction}")]
        if values:
            means[direction] = sum(values) / len(values)
    means["mean"] = sum(means.values()) / len(means)
    return means


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    import torch

    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files

    files = {f"{subset}/{direction}": (benchmark_dir / subset / name, direction, benchmark_dir / subset)
             for subset in SPEC_SUBSETS for direction, name in SPEC_DIRECTIONS.items()}
    loaded_items = {key: load_file(*where) for key, where in files.items()}
    images = [p for key, items in loaded_items.items() for query, keys, _ in items
              for p in (keys if key.endswith("/t2i") else [query])]
    texts = [t for key, items in loaded_items.items() for query, keys, _ in items
             for t in ([query] if key.endswith("/t2i") else keys)]
    image_emb, image_row, failed = encode_image_files(loaded, images)
    text_emb, text_row = encode_distinct_texts(loaded, texts)

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    metrics: dict[str, Metric] = {}
    frames = []
    for key, items in loaded_items.items():
        t2i = key.endswith("/t2i")
        kept = []
        for k, (query, keys, label) in enumerate(items):
            bad = next((failed[p] for p in (keys if t2i else [query]) if p in failed), None)
            if bad:
                skipped[bad] += 1
                examples[bad].append(f"{key}/{k}")
            else:
                kept.append((k, query, keys, label))
        if not kept:
            raise BenchmarkError(f"{files[key][0]}: no item with readable images")
        if t2i:
            queries = text_emb[[text_row[q] for _, q, _, _ in kept]]
            candidates = image_emb[torch.tensor([[image_row[p] for p in keys] for _, _, keys, _ in kept])]
        else:
            queries = image_emb[[image_row[q] for _, q, _, _ in kept]]
            candidates = text_emb[torch.tensor([[text_row[t] for t in keys] for _, _, keys, _ in kept])]
        scores = torch.einsum("nd,nkd->nk", queries, candidates)
        label = torch.tensor([label for *_, label in kept])
        released, strict, others = ranks(scores, label)
        metrics[key] = Metric(float((released == 1).double().mean()), len(kept))
        metrics[f"{key}_strict"] = Metric(float((strict == 1).double().mean()), len(kept))
        frames.append(pd.DataFrame({
            "subset": key, "item": [str(k) for k, *_ in kept], "correct": (strict == 1).numpy(),
            "score_pos": scores.gather(1, label[:, None])[:, 0].numpy(),
            "score_neg": scores.masked_fill(~others, -torch.inf).max(dim=1).values.numpy(), "rank": strict.numpy()}))
    log_skips("spec", skipped, examples)
    for suffix in ("", "_strict"):
        means = summary({key: metrics[f"{key}{suffix}"].value for key in files})
        for name, value in means.items():
            n = sum(metrics[key].n for key in files if name == "mean" or key.endswith(f"/{name}"))
            metrics[f"{name}{suffix}"] = Metric(value, n)
    return BenchmarkResult(PROTOCOL, "mean", metrics, pd.concat(frames, ignore_index=True), dict(skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / subset / name for subset in SPEC_SUBSETS for name in SPEC_DIRECTIONS.values()]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [p for subset in SPEC_SUBSETS for direction, name in SPEC_DIRECTIONS.items()
            for query, keys, _ in load_file(folder / subset / name, direction, folder / subset)
            for p in (keys if direction == "t2i" else [query])]


# items per subset and direction (inferred from the release's notebook); ASSUMPTION: each image is an i2t query
# and each text a t2i query once, the candidates drawn from the same images and texts
RELEASED_ITEMS = {"existence": 1_000, "relative_spatial": 2_000, "absolute_size": 1_500, "relative_size": 1_500,
                  "count": 4_500, "absolute_spatial": 4_500}

BENCHMARKS = (
    Benchmark(kind="spec", source="HF wjpoom/SPEC data.zip; its clip_wrapper argmax scorer",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(sum(RELEASED_ITEMS.values()), sum(RELEASED_ITEMS.values()), 0),
              headline="mean", subsets=("i2t", "t2i"), chance=None),
)
