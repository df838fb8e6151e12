"""SugarCrepe++ (Dumpala et al., 2024): two paraphrased positives and one hard negative per image.

Files: `{benchmark_dir}/{subset}.json`, one per subset, each a list of
`{"id", "filename", "caption", "caption2", "negative_caption"}`; images under `spec["image_root"]` or
`{benchmark_dir}/images`. Two tasks, as in the paper's code:
- ITT (image-text): correct iff cos(image, caption) > cos(image, negative) and
  cos(image, caption2) > cos(image, negative);
- TOT (text only): correct iff cos(caption, caption2) > cos(caption, negative) and
  cos(caption, caption2) > cos(caption2, negative).
Comparisons are strict (a tie is wrong, see `compo.evaluate.common`). TOT needs no image, so an item
whose image is missing or unreadable is skipped (and counted) for ITT only. The `*_overall` metrics are
micro-averaged over the subsets' items.
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
    image_root,
    item_path,
    log_skips,
    read_json_file,
    require,
)
from compo.evaluate.files import SUGARCREPE_PP_SUBSETS
from compo.evaluate.kinds import Benchmark, BenchmarkSize

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

PROTOCOL = "sugarcrepe-pp-itt-tot-strict"
SUBSETS = SUGARCREPE_PP_SUBSETS
FIELDS = ("id", "filename", "caption", "caption2", "negative_caption")
TEXT_FIELDS = ("filename", "caption", "caption2", "negative_caption")


def load_subset(path: Path) -> list[dict[str, Any]]:
    """One subset file, checked: a non-empty list of items with the five fields, ids unique."""
    items = read_json_file(path, "SugarCrepe++ subset file")
    if not isinstance(items, list) or not items:
        raise BenchmarkError(f"{path}: expected a non-empty list of items")
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = f"{path}: item {item.get('id', index) if isinstance(item, dict) else index!r}"
        require(item, FIELDS, where)
        for key in TEXT_FIELDS:
            if not isinstance(item[key], str) or not item[key]:
                raise BenchmarkError(f"{where}: field {key!r} must be a non-empty string")
        if str(item["id"]) in seen:
            raise BenchmarkError(f"{where}: duplicate id")
        seen.add(str(item["id"]))
    return items


def _rows(subset: str, task: str, ids: list[str], score_pos: torch.Tensor, score_neg: torch.Tensor,
          ranks: torch.Tensor) -> pd.DataFrame:
    return pd.DataFrame({"subset": f"{subset}/{task}", "item": ids, "correct": (ranks == 1).numpy(),
                         "score_pos": score_pos.numpy(), "score_neg": score_neg.numpy(), "rank": ranks.numpy()})


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    import torch

    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files, pessimistic_rank

    subsets = {subset: load_subset(benchmark_dir / f"{subset}.json") for subset in SUBSETS}
    root = image_root(spec, benchmark_dir)
    image_emb, image_row, failed = encode_image_files(
        loaded, [item_path(root, item["filename"]) for items in subsets.values() for item in items])
    text_emb, text_row = encode_distinct_texts(
        loaded, [item[key] for items in subsets.values() for item in items
                 for key in ("caption", "caption2", "negative_caption")])

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    frames = []
    for subset, items in subsets.items():
        ids = [str(item["id"]) for item in items]
        p1 = text_emb[[text_row[item["caption"]] for item in items]]
        p2 = text_emb[[text_row[item["caption2"]] for item in items]]
        neg = text_emb[[text_row[item["negative_caption"]] for item in items]]
        # TOT: the paraphrase pair must be closer than either positive is to the negative
        pos_pair, p1_neg, p2_neg = (p1 * p2).sum(1), (p1 * neg).sum(1), (p2 * neg).sum(1)
        others = torch.stack([p1_neg, p2_neg], dim=1)
        frames.append(_rows(subset, "tot", ids, pos_pair, others.max(dim=1).values,
                            pessimistic_rank(pos_pair, others)))

        kept = []
        for index, item in enumerate(items):
            path = item_path(root, item["filename"])
            if path in failed:
                skipped[failed[path]] += 1
                examples[failed[path]].append(f"{subset}/{item['id']} ({path})")
            else:
                kept.append((index, image_row[path]))
        if not kept:
            raise BenchmarkError(f"{benchmark_dir / f'{subset}.json'}: every item's image is missing or "
                                 f"unreadable under {root}")
        rows, image_rows = (list(column) for column in zip(*kept, strict=True))
        images = image_emb[image_rows]
        s1, s2 = (images * p1[rows]).sum(1), (images * p2[rows]).sum(1)
        s_neg = (images * neg[rows]).sum(1)
        weaker = torch.minimum(s1, s2)  # both positives beat the negative iff the weaker one does
        frames.append(_rows(subset, "itt", [ids[i] for i in rows], weaker, s_neg,
                            pessimistic_rank(weaker, s_neg[:, None])))
    log_skips("sugarcrepe_pp", skipped, examples)
    predictions = pd.concat(frames, ignore_index=True)

    metrics: dict[str, Metric] = {}
    for task in ("itt", "tot"):
        for subset in SUBSETS:
            correct = predictions.loc[predictions["subset"] == f"{subset}/{task}", "correct"]
            metrics[f"{task}_{subset}"] = Metric(float(correct.mean()), int(len(correct)))
        correct = predictions.loc[predictions["subset"].str.endswith(f"/{task}"), "correct"]
        metrics[f"{task}_overall"] = Metric(float(correct.mean()), int(len(correct)))
    return BenchmarkResult(PROTOCOL, "itt_overall", metrics, predictions, dict(skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / f"{subset}.json" for subset in SUBSETS]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    root = image_root(spec, folder)
    return [item_path(root, item["filename"]) for s in SUBSETS for item in load_subset(folder / f"{s}.json")]


RELEASED_ITEMS = 4_757  # one image and three captions an item

BENCHMARKS = (
    Benchmark(kind="sugarcrepe_pp", source="github.com/Sri-Harsha/scpp data/*.json; its ITT / TOT scorer",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(RELEASED_ITEMS, 3 * RELEASED_ITEMS, 0), headline="itt_overall",
              subsets=tuple(f"{task}_{subset}" for task in ("itt", "tot") for subset in SUBSETS),
              chance=1 / 3),
)
