"""Zero-shot classification as in CLIP (Radford et al., 2021): each class is the renormalised mean of
its prompt-template embeddings, each image is assigned the class it is most similar to.

Files: ImageFolder layout `{benchmark_dir}/{class_folder}/*.png` (other common image suffixes too) and
`{benchmark_dir}/classnames.json` mapping every class folder to the class name used in the prompts.
Top-1 (and top-5 when there are more than 5 classes) with ties counted against the model.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    encode_image_files,
    log_skips,
    pessimistic_rank,
    read_json_file,
)
from compo.evaluate.files import CLASSNAMES
from compo.models import LoadedModel, encode_texts, normalized

PROTOCOL = "clip-zeroshot-template-ensemble"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def load_classnames(benchmark_dir: Path) -> dict[str, str]:
    """Class folder -> class name, checked against the folders that exist (both ways)."""
    path = benchmark_dir / CLASSNAMES
    classnames = read_json_file(path, "zero-shot class names file")
    if not isinstance(classnames, dict) or len(classnames) < 2:
        raise BenchmarkError(f"{path}: expected an object mapping at least 2 class folders to names")
    for folder, name in classnames.items():
        if not isinstance(name, str) or not name.strip():
            raise BenchmarkError(f"{path}: class {folder!r} needs a non-empty name")
        if not (benchmark_dir / folder).is_dir():
            raise BenchmarkError(f"{path}: class {folder!r} has no folder {benchmark_dir / folder}")
    unnamed = sorted(p.name for p in benchmark_dir.iterdir() if p.is_dir() and p.name not in classnames)
    if unnamed:
        raise BenchmarkError(f"{path}: folder(s) {', '.join(unnamed)} have no class name")
    return {folder: classnames[folder] for folder in sorted(classnames)}


def check_templates(templates: list[str] | None) -> list[str]:
    if not templates:
        raise BenchmarkError("zero-shot evaluation needs prompt templates (config key zeroshot_templates)")
    for template in templates:
        if template.count("{}") != 1:
            raise BenchmarkError(f"zero-shot template {template!r} must contain exactly one '{{}}'")
    return list(templates)


def class_embeddings(loaded: LoadedModel, names: list[str], templates: list[str]) -> torch.Tensor:
    """[C, D]: per class, mean of its L2-normalised template embeddings, renormalised (CLIP's ensemble)."""
    prompts = [template.format(name) for name in names for template in templates]
    embeddings = encode_texts(loaded, prompts).reshape(len(names), len(templates), -1)
    return normalized(embeddings.double().mean(dim=1))


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    templates = check_templates(templates)
    classnames = load_classnames(benchmark_dir)
    folders = list(classnames)
    samples = [(path, label) for label, folder in enumerate(folders)
               for path in sorted((benchmark_dir / folder).iterdir())
               if path.suffix.lower() in IMAGE_SUFFIXES]
    if not samples:
        raise BenchmarkError(f"{benchmark_dir}: no images in the class folders")

    image_emb, image_row, failed = encode_image_files(loaded, [path for path, _ in samples])
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    for path, reason in failed.items():
        skipped[reason] += 1
        examples[reason].append(str(path))
    log_skips("zeroshot", skipped, examples)
    kept = [(path, label) for path, label in samples if path in image_row]
    if not kept:
        raise BenchmarkError(f"{benchmark_dir}: every image is missing or unreadable")

    labels = torch.tensor([label for _, label in kept])
    scores = image_emb[[image_row[path] for path, _ in kept]] @ class_embeddings(
        loaded, list(classnames.values()), templates).T
    true_scores = scores.gather(1, labels[:, None]).squeeze(1)
    wrong = torch.ones_like(scores, dtype=torch.bool).scatter_(1, labels[:, None], False)
    ranks = pessimistic_rank(true_scores, scores, wrong)
    best_wrong = scores.masked_fill(~wrong, float("-inf")).max(dim=1).values

    predictions = pd.DataFrame({
        "subset": [folders[label] for _, label in kept],
        "item": [str(path.relative_to(benchmark_dir)) for path, _ in kept],
        "correct": (ranks == 1).numpy(),
        "score_pos": true_scores.numpy(),
        "score_neg": best_wrong.numpy(),
        "rank": ranks.numpy(),
    })
    n = len(predictions)
    metrics = {"top1": Metric(float((ranks <= 1).double().mean()), n)}
    if len(folders) > 5:
        metrics["top5"] = Metric(float((ranks <= 5).double().mean()), n)
    return BenchmarkResult(PROTOCOL, "top1", metrics, predictions, dict(skipped))
