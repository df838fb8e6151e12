"""Image-text retrieval in the Karpathy split format (COCO / Flickr30k test sets).

File: `{benchmark_dir}/{spec["file"]}`, Karpathy's released `dataset_coco.json` / `dataset_flickr30k.json`
(default name `dataset.json`, the world's) = `{"images": [{"imgid", "filename", "filepath"?, "split",
"sentences": [{"raw": ...}, ...]}, ...]}`; only split "test" is used. Images under
`spec["image_root"]` or `{benchmark_dir}/images`, joined with filepath (when present) and filename.
Image->text: an image's hit at k if any of its captions ranks in the top k among all test captions.
Text->image: a caption's hit at k if its image ranks in the top k among all test images. Ranks count
ties against the model (see `compo.evaluate.common`).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
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
    read_json_file,
    refuse_repeated,
    require,
    require_text,
)
from compo.evaluate.files import DATASET_JSON, karpathy_file  # noqa: F401  (the loaders' file names)
from compo.evaluate.kinds import Benchmark, BenchmarkSize, Key, Selection
from compo.sources import KARPATHY_FILES, KARPATHY_IMAGES

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

PROTOCOL = "karpathy-recall-at-k-pessimistic-ties"
SPLIT = "test"
KS = (1, 5, 10)
CHUNK = 1024  # queries scored at a time: keeps the score matrix of COCO's 5k x 25k test set in memory bounds


def load_test_images(path: Path) -> list[dict[str, Any]]:
    data = read_json_file(path, "Karpathy-format dataset file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise BenchmarkError(f"{path}: expected an object with an 'images' list")
    test = []
    for index, entry in enumerate(data["images"]):
        require(entry, ("split",), f"{path}: images[{index}]")
        if entry["split"] != SPLIT:
            continue
        where = f"{path}: image {entry.get('imgid', f'images[{index}]')!r}"
        require(entry, ("imgid", "filename", "sentences"), where)
        if not isinstance(entry["sentences"], list) or not entry["sentences"]:
            raise BenchmarkError(f"{where}: 'sentences' must be a non-empty list")
        for k, sentence in enumerate(entry["sentences"]):
            require(sentence, ("raw",), f"{where}: sentences[{k}]")
            require_text(sentence["raw"], f"{where}: sentences[{k}]", "raw")
        test.append(entry)
    if not test:
        raise BenchmarkError(f"{path}: no images with split {SPLIT!r}")
    refuse_repeated([str(entry["imgid"]) for entry in test], path, f"imgid(s) of the {SPLIT} split")
    return test


def image_to_text_ranks(image_emb: torch.Tensor, text_emb: torch.Tensor, text_image: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image: rank of its best-scoring caption among the other images' captions, that caption's
    score and the best other caption's score."""
    import torch

    from compo.evaluate.scoring import pessimistic_rank

    ranks, best_pos, best_neg = [], [], []
    for start in range(0, len(image_emb), CHUNK):
        scores = image_emb[start : start + CHUNK] @ text_emb.T
        own = text_image[None, :] == torch.arange(start, start + len(scores))[:, None]
        top_pos = scores.masked_fill(~own, float("-inf")).max(dim=1).values
        ranks.append(pessimistic_rank(top_pos, scores, ~own))
        best_pos.append(top_pos)
        best_neg.append(scores.masked_fill(own, float("-inf")).max(dim=1).values)
    return torch.cat(ranks), torch.cat(best_pos), torch.cat(best_neg)


def text_to_image_ranks(image_emb: torch.Tensor, text_emb: torch.Tensor, text_image: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per caption: rank of its image among all other images, its score and the best other score."""
    import torch

    from compo.evaluate.scoring import pessimistic_rank

    ranks, pos, best_neg = [], [], []
    for start in range(0, len(text_emb), CHUNK):
        scores = text_emb[start : start + CHUNK] @ image_emb.T
        own = torch.zeros_like(scores, dtype=torch.bool)
        own[torch.arange(len(scores)), text_image[start : start + CHUNK]] = True
        true = scores[own]  # one True per row, in row order
        ranks.append(pessimistic_rank(true, scores, ~own))
        pos.append(true)
        best_neg.append(scores.masked_fill(own, float("-inf")).max(dim=1).values)
    return torch.cat(ranks), torch.cat(pos), torch.cat(best_neg)


@dataclass
class RetrievalImage:
    """One test image and its captions (ids and texts, in the file's order)."""

    image_id: str
    path: Path
    caption_ids: list[str]
    captions: list[str]


def karpathy_images(spec: dict[str, Any], benchmark_dir: Path) -> list[RetrievalImage]:
    path = karpathy_file(spec, benchmark_dir)
    root = image_root(spec, benchmark_dir)
    return [RetrievalImage(str(entry["imgid"]), item_path(root, entry.get("filepath") or "", entry["filename"]),
                           [str(s.get("sentid", f"{entry['imgid']}#{k}")) for k, s in enumerate(entry["sentences"])],
                           [s["raw"] for s in entry["sentences"]])
            for entry in load_test_images(path)]  # Flickr30k entries have no filepath


def score(loaded: LoadedModel, test: list[RetrievalImage], where: Path) -> BenchmarkResult:
    """R@1/5/10 both ways over the test images and their captions (unreadable images skipped, counted)."""
    # one file under two ids would be two images scoring exactly alike: ties counted against the model
    import torch

    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files

    refuse_repeated([image.path for image in test], where, "image file(s) (under different image ids)")
    image_emb, image_row, failed = encode_image_files(loaded, [image.path for image in test])

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    kept = []
    for image in test:
        if image.path in failed:
            skipped[failed[image.path]] += 1
            examples[failed[image.path]].append(f"image {image.image_id} ({image.path})")
        else:
            kept.append(image)
    log_skips("retrieval", skipped, examples)
    if len(kept) < 2:
        raise BenchmarkError(f"{where}: fewer than 2 readable test images")

    image_ids = [image.image_id for image in kept]
    images = image_emb[[image_row[image.path] for image in kept]]
    captions = [caption for image in kept for caption in image.captions]
    caption_ids = [caption_id for image in kept for caption_id in image.caption_ids]
    text_image = torch.tensor([index for index, image in enumerate(kept) for _ in image.captions])
    distinct_emb, text_row = encode_distinct_texts(loaded, captions)  # equal captions tie exactly
    texts = distinct_emb[[text_row[caption] for caption in captions]]

    i2t_rank, i2t_pos, i2t_neg = image_to_text_ranks(images, texts, text_image)
    t2i_rank, t2i_pos, t2i_neg = text_to_image_ranks(images, texts, text_image)

    metrics: dict[str, Metric] = {}
    for direction, ranks in (("i2t", i2t_rank), ("t2i", t2i_rank)):
        for k in KS:
            metrics[f"{direction}_r{k}"] = Metric(float((ranks <= k).double().mean()), len(ranks))
    metrics["mean_recall"] = Metric(sum(m.value for m in metrics.values()) / len(metrics), len(images))

    predictions = pd.concat([
        pd.DataFrame({"subset": "i2t", "item": image_ids, "correct": (i2t_rank == 1).numpy(),
                      "score_pos": i2t_pos.numpy(), "score_neg": i2t_neg.numpy(),
                      "rank": i2t_rank.numpy()}),
        pd.DataFrame({"subset": "t2i", "item": caption_ids, "correct": (t2i_rank == 1).numpy(),
                      "score_pos": t2i_pos.numpy(), "score_neg": t2i_neg.numpy(),
                      "rank": t2i_rank.numpy()}),
    ], ignore_index=True)
    return BenchmarkResult(PROTOCOL, "mean_recall", metrics, predictions, dict(skipped))


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    return score(loaded, karpathy_images(spec, benchmark_dir), karpathy_file(spec, benchmark_dir))


def karpathy_test_images(spec: dict[str, Any]) -> int:
    """Images of a Karpathy test split: Flickr30k's 1,000 where the file or folder names Flickr, else COCO's 5,000."""
    return 1_000 if "flickr" in str(spec.get("file", spec.get("path", ""))) else 5_000


RECALL = re.compile(r"^(?P<direction>i2t|t2i)_r(?P<k>\d+)$")  # a direction's recall@k


def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection] | None:
    """`<direction>_r<k>`: the direction's rows, a row scoring when its right match ranks within k; `mean_recall`:
    the mean of every recall the record holds."""
    if metric == "mean_recall":
        return [selection for name in metrics if RECALL.match(name) for selection in selections(name, metrics)]
    match = RECALL.match(metric)
    return [Selection((match["direction"],), at_k=int(match["k"]))] if match else None


BENCHMARKS = (
    Benchmark(kind="retrieval", source="Karpathy's splits (dataset_coco.json, dataset_flickr30k.json); "
              "CLIP_benchmark's zeroshot_retrieval recall@k",
              run=run, files=lambda spec, folder: [karpathy_file(spec, folder)],
              images=lambda spec, folder: [image.path for image in karpathy_images(spec, folder)],
              size=lambda spec: BenchmarkSize(karpathy_test_images(spec), 5 * karpathy_test_images(spec), 0),
              headline="mean_recall", subsets=(), chance=None,
              selections=selections,
              downloads=lambda spec: {"path": KARPATHY_FILES, "image_root": KARPATHY_IMAGES},
              keys={"file": Key({"type": ["string", "null"]}, "the Karpathy-format file's released name "
                                "(`dataset_coco.json`, `dataset_flickr30k.json`; default `dataset.json`)")}),
)
