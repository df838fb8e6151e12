"""Winoground (Thrush et al., 2022): two images, two captions with the same words in a different order.

File: `{benchmark_dir}/examples.jsonl`, one JSON object per line with `{"id", "image_0", "image_1",
"caption_0", "caption_1", "tag", "secondary_tag", "num_main_preds", "collapsed_tag"}` as in
facebook/winoground's `data/examples.jsonl`. `image_k` names the image file
under `spec["image_root"]` or `{benchmark_dir}/images`; a name without a suffix gets ".png"
(the release names images "ex_{id}_img_0" and ships "ex_{id}_img_0.png").
With s(c, i) the cosine of caption c and image i, as in the paper:
- text score: s(c0, i0) > s(c1, i0) and s(c1, i1) > s(c0, i1);
- image score: s(c0, i0) > s(c0, i1) and s(c1, i1) > s(c1, i0);
- group score: both.
Comparisons are strict (ties wrong). Metrics: text / image / group overall, and per group as the
Winoground paper's Table 3 breaks them down: by `collapsed_tag` (`{score}_object`, `{score}_relation`,
`{score}_both`: what the swap exchanges) and by `num_main_preds` (`{score}_1_main_preds`,
`{score}_2_main_preds`). The fine-grained `tag` (70 values in the release, e.g. "Adjective-Color") and
`secondary_tag` are checked but not grouped on: a fine-grained tag is never reported as if it were
the collapsed one. An example with a missing or unreadable image is skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from compo.evaluate.candidates import Item, Scored, score_items
from compo.evaluate.common import (
    TIE_TOLERANCE,
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    read_text_file,
    require,
    require_text,
)
from compo.evaluate.files import WINOGROUND_EXAMPLES
from compo.evaluate.kinds import Benchmark, BenchmarkSize, Selection

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

PROTOCOL = "winoground-text-image-group-strict"
EXAMPLES = WINOGROUND_EXAMPLES
FIELDS = ("id", "image_0", "image_1", "caption_0", "caption_1", "tag", "collapsed_tag", "num_main_preds")
TEXT_FIELDS = ("image_0", "image_1", "caption_0", "caption_1", "tag", "collapsed_tag")
SCORES = ("text", "image", "group")
IMAGES = ("image_0", "image_1")


def load_examples(path: Path) -> list[dict[str, Any]]:
    examples, seen = [], set()
    for line_number, line in enumerate(read_text_file(path, "Winoground examples file").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except json.JSONDecodeError as error:
            raise BenchmarkError(f"{path}: line {line_number}: not valid JSON ({error})") from error
        where = f"{path}: line {line_number} (example {example.get('id') if isinstance(example, dict) else '?'})"
        require(example, FIELDS, where)
        for key in TEXT_FIELDS:
            require_text(example[key], where, key)
        predicates = example["num_main_preds"]
        if not isinstance(predicates, int) or isinstance(predicates, bool) or predicates < 1:
            raise BenchmarkError(f"{where}: field 'num_main_preds' must be a positive integer, got {predicates!r}")
        if str(example["id"]) in seen:
            raise BenchmarkError(f"{where}: duplicate id")
        seen.add(str(example["id"]))
        examples.append(example)
    if not examples:
        raise BenchmarkError(f"{path}: no examples")
    return examples


def image_file(name: str) -> str:
    return name if Path(name).suffix else f"{name}.png"


def comparison_failures(s: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per example, how many of each score's comparisons fail (0 = correct); s[n, c, i] = s(c, i).
    A comparison fails unless the right score beats the wrong one by more than TIE_TOLERANCE."""
    def fails(right: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
        return (wrong >= right - TIE_TOLERANCE).long()

    text = fails(s[:, 0, 0], s[:, 1, 0]) + fails(s[:, 1, 1], s[:, 0, 1])
    image = fails(s[:, 0, 0], s[:, 0, 1]) + fails(s[:, 1, 1], s[:, 1, 0])
    return {"text": text, "image": image, "group": text + image}


def items_of(benchmark_dir: Path, spec: dict[str, Any]) -> list[Item]:
    """Every example: its two images and two captions (caption k describes image k), by collapsed tag."""
    root = image_root(spec, benchmark_dir)
    return [Item(ex["collapsed_tag"], str(ex["id"]), tuple(item_path(root, image_file(ex[k])) for k in IMAGES),
                 (ex["caption_0"], ex["caption_1"]), tags=ex) for ex in load_examples(benchmark_dir / EXAMPLES)]


def score_predictions(scored: Scored, subset: Callable[[Item, str], str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The predictions of 2x2 items, one row per item and score (text, image, group): `rank` 1 + its failed
    comparisons, `score_pos` / `score_neg` the mean of the matched / mismatched pairs' similarities; and the
    failures per score. subset(item, score) names a row's subset."""
    s = scored.scores  # [n, caption, image]
    failures = comparison_failures(s)
    right, wrong = (s[:, 0, 0] + s[:, 1, 1]) / 2, (s[:, 0, 1] + s[:, 1, 0]) / 2
    predictions = pd.concat([
        pd.DataFrame({"subset": [subset(item, name) for item in scored.items],
                      "item": [item.item for item in scored.items], "correct": (failures[name] == 0).numpy(),
                      "score_pos": right.numpy(), "score_neg": wrong.numpy(), "rank": (1 + failures[name]).numpy()})
        for name in SCORES], ignore_index=True)
    return predictions, failures


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    import torch

    scored = score_items(loaded, items_of(benchmark_dir, spec), benchmark="winoground",
                         files=benchmark_dir / EXAMPLES)
    predictions, failures = score_predictions(scored, lambda item, name: name)
    examples = [item.tags for item in scored.items]
    groups = {  # metric-name suffix -> items in the group (the paper's Table 3 columns)
        **{tag.lower(): [ex["collapsed_tag"] == tag for ex in examples]
           for tag in sorted({ex["collapsed_tag"] for ex in examples})},
        **{f"{n}_main_preds": [ex["num_main_preds"] == n for ex in examples]
           for n in sorted({ex["num_main_preds"] for ex in examples})},
    }
    metrics: dict[str, Metric] = {}
    for name in SCORES:
        correct = (failures[name] == 0).double()
        metrics[name] = Metric(float(correct.mean()), len(examples))
        for suffix, members in groups.items():
            mask = torch.tensor(members)
            metrics[f"{name}_{suffix}"] = Metric(float(correct[mask].mean()), int(mask.sum()))
    return BenchmarkResult(PROTOCOL, "group", metrics, predictions, dict(scored.skipped))


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / EXAMPLES]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [image for item in items_of(folder, spec) for image in item.images]


RELEASED_EXAMPLES = 400  # two images and two captions each

def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection] | None:
    """The text, image and group scores: each the rows of its own subset."""
    return [Selection((metric,))] if metric in ("text", "image", "group") else None


BENCHMARKS = (
    Benchmark(kind="winoground", source="HF facebook/winoground examples.jsonl; its text / image / group scores",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(2 * RELEASED_EXAMPLES, 2 * RELEASED_EXAMPLES, 0), headline="group",
              subsets=SCORES, chance={"text": 1 / 4, "image": 1 / 4, "group": 1 / 6}, selections=selections,
              downloads=lambda spec: {"path": 'huggingface.co/datasets/facebook/winoground (compo prefetch); '
                                              "data/examples.jsonl, data/images/"},
              keys={}),
)
