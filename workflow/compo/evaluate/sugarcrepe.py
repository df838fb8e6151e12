"""SugarCrepe (Hsieh et al., 2023): for each image, does the model prefer the true caption to its
hard negative?

Files: `{benchmark_dir}/{subset}.json`, one per subset, each a dict
`{"<id>": {"filename": ..., "caption": ..., "negative_caption": ...}}`; images under
`spec["image_root"]` or `{benchmark_dir}/images`. An item is correct iff
cos(image, caption) > cos(image, negative_caption) strictly (a tie is wrong). The groups replace / swap /
add and `overall` are MACRO means of their sub-tasks' accuracies, as the seeds report them (DeGLA Table 3's
ADD = (93.8 + 95.7) / 2; FSC-CLIP / vl_compo average the sub-tasks); `<group>_micro` and `overall_micro`
keep the mean over the group's items as a second column.
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
    read_keyed_items,
)
from compo.evaluate.files import SUGARCREPE_GROUPS, SUGARCREPE_SUBSETS
from compo.evaluate.kinds import Benchmark, BenchmarkSize

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "sugarcrepe-itm-strict"
SUBSETS = SUGARCREPE_SUBSETS
GROUPS = {**SUGARCREPE_GROUPS, "overall": SUBSETS}
FIELDS = ("filename", "caption", "negative_caption")


def load_subset(path: Path) -> dict[str, dict[str, str]]:
    """One subset file, checked: every item has the three fields as strings."""
    return read_keyed_items(path, "SugarCrepe subset file", FIELDS)


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files, pessimistic_rank

    subsets = {subset: load_subset(benchmark_dir / f"{subset}.json") for subset in SUBSETS}
    root = image_root(spec, benchmark_dir)

    paths = [item_path(root, item["filename"]) for items in subsets.values() for item in items.values()]
    image_emb, image_row, failed = encode_image_files(loaded, paths)
    texts = [item[key] for items in subsets.values() for item in items.values()
             for key in ("caption", "negative_caption")]
    text_emb, text_row = encode_distinct_texts(loaded, texts)

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    rows = []
    for subset, items in subsets.items():
        kept = []
        for item_id, item in items.items():
            path = item_path(root, item["filename"])
            if path in failed:
                skipped[failed[path]] += 1
                examples[failed[path]].append(f"{subset}/{item_id} ({path})")
                continue
            kept.append((item_id, image_row[path], text_row[item["caption"]],
                         text_row[item["negative_caption"]]))
        if not kept:
            raise BenchmarkError(f"{benchmark_dir / f'{subset}.json'}: every item's image is missing or "
                                 f"unreadable under {root}")
        ids, img, pos, neg = zip(*kept, strict=True)
        images = image_emb[list(img)]
        score_pos = (images * text_emb[list(pos)]).sum(dim=1)
        score_neg = (images * text_emb[list(neg)]).sum(dim=1)
        ranks = pessimistic_rank(score_pos, score_neg[:, None])  # 1 iff caption beats negative strictly
        rows.append(pd.DataFrame({"subset": subset, "item": [str(i) for i in ids],
                                  "correct": (ranks == 1).numpy(), "score_pos": score_pos.numpy(),
                                  "score_neg": score_neg.numpy(), "rank": ranks.numpy()}))
    log_skips("sugarcrepe", skipped, examples)
    predictions = pd.concat(rows, ignore_index=True)

    metrics: dict[str, Metric] = {}
    for subset in SUBSETS:
        correct = predictions.loc[predictions["subset"] == subset, "correct"]
        metrics[subset] = Metric(float(correct.mean()), int(len(correct)))
    for group, members in GROUPS.items():
        correct = predictions.loc[predictions["subset"].isin(members), "correct"]
        metrics[group] = Metric(float(sum(metrics[m].value for m in members) / len(members)), int(len(correct)))
        metrics[f"{group}_micro"] = Metric(float(correct.mean()), int(len(correct)))
    return BenchmarkResult(PROTOCOL, "overall", metrics, predictions, dict(skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / f"{subset}.json" for subset in SUBSETS]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    root = image_root(spec, folder)
    return [item_path(root, item["filename"]) for s in SUBSETS for item in load_subset(folder / f"{s}.json").values()]


RELEASED_ITEMS = 7_511  # one image and two captions an item (the release's seven files)

BENCHMARKS = (
    Benchmark(kind="sugarcrepe", source="github.com/RAIVNLab/sugar-crepe data/*.json; its ITM scorer, a tie wrong",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(RELEASED_ITEMS, 2 * RELEASED_ITEMS, 0),
              headline="overall", subsets=SUBSETS, chance=1 / 2),
)
