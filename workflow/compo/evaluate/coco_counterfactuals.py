"""COCO-Counterfactuals (Le et al., 2023) as FSC-CLIP retrieves on it: image<->text R@1 over a random 30% of the
examples, each example's two images and two captions pooled into one gallery.

File: `{benchmark_dir}/{spec["file"] or "data/examples.jsonl"}` as on the Hugging Face Hub (Intel/COCO-Counterfactuals,
CC BY 4.0): one JSON object per line with `id`, `image_0`, `image_1` (file stems: the Hub's loading script joins the
extracted `data/images.zip` folder and adds an extension) and the captions `caption_0`, `caption_1` (names as the
loading script's fields were not seen, only the image fields: an assumption, checked on load). An image is
`{spec["image_root"] or benchmark_dir/images}/<image_k>` plus ".jpg" when the name has no suffix (the script's
IMAGE_EXTENSION was not seen either).

FSC-CLIP uses 30% of the 17,410 examples (5,223; 10,446 images and texts): `fraction` (default 0.3) of them,
`round(fraction * n)`, drawn by `random.Random(seed).sample` over example positions (seed `spec["seed"]`, default 0)
and kept in file order; FSC-CLIP's own draw is not published. Scoring is compo.evaluate.retrieval's (each image's
caption is its only positive; ties count against the model): `i2t_r1`, `t2i_r1` (FSC-CLIP's I2T / T2I Ret),
R@5 / R@10, and the headline `r1_mean`, their mean.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    read_text_file,
    refuse_repeated,
    require,
    require_text,
)
from compo.evaluate.files import COCO_CF_FILE
from compo.evaluate.kinds import Benchmark, BenchmarkSize, Key, stored_only
from compo.evaluate.retrieval import RetrievalImage, score

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "coco-counterfactuals-recall-at-k-pessimistic-ties"
FIELDS = ("id", "image_0", "image_1", "caption_0", "caption_1")
FRACTION = 0.3  # FSC-CLIP's subsample
IMAGE_SUFFIX = ".jpg"


def load_examples(path: Path) -> list[dict[str, Any]]:
    examples = []
    for line_number, line in enumerate(read_text_file(path, "COCO-Counterfactuals examples file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except json.JSONDecodeError as error:
            raise BenchmarkError(f"{path}: line {line_number}: not valid JSON ({error})") from error
        where = f"{path}: line {line_number}"
        require(example, FIELDS, where)
        for key in FIELDS[1:]:
            require_text(example[key], where, key)
        examples.append(example)
    if not examples:
        raise BenchmarkError(f"{path}: no examples")
    refuse_repeated([str(example["id"]) for example in examples], path, "example id(s)")
    return examples


def sample(examples: list[dict[str, Any]], fraction: float, seed: int) -> list[dict[str, Any]]:
    """round(fraction * n) examples drawn with `random.Random(seed)`, in file order."""
    if not 0 < fraction <= 1:
        raise BenchmarkError(f"coco_counterfactuals: 'fraction' must be in (0, 1], got {fraction!r}")
    keep = set(random.Random(seed).sample(range(len(examples)), max(1, round(fraction * len(examples)))))
    return [example for index, example in enumerate(examples) if index in keep]


def image_name(stem: str) -> str:
    return stem if Path(stem).suffix else stem + IMAGE_SUFFIX


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    file = benchmark_dir / (spec.get("file") or COCO_CF_FILE)
    examples = sample(load_examples(file), spec.get("fraction", FRACTION), spec.get("seed", 0))
    root = image_root(spec, benchmark_dir)
    gallery = [RetrievalImage(f"{example['id']}/{k}", item_path(root, image_name(example[f"image_{k}"])),
                              [f"{example['id']}/{k}"], [example[f"caption_{k}"]])
               for example in examples for k in (0, 1)]
    result = score(loaded, gallery, file)
    r1 = (result.metrics["i2t_r1"].value + result.metrics["t2i_r1"].value) / 2
    metrics = {**result.metrics, "r1_mean": Metric(r1, result.metrics["i2t_r1"].n)}
    return replace(result, protocol=PROTOCOL, headline="r1_mean", metrics=metrics)


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / (spec.get("file") or COCO_CF_FILE)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    """Every example's two images, before the `fraction` draw (the guard looks at the whole release)."""
    root = image_root(spec, folder)
    return [item_path(root, image_name(example[f"image_{k}"]))
            for example in load_examples(release_files(spec, folder)[0]) for k in (0, 1)]


RELEASED_EXAMPLES = 17_410  # two images and two captions each; `fraction` of them are scored (FSC-CLIP's 30%)


def release_size(spec: dict[str, Any]) -> BenchmarkSize:
    examples = round(float(spec.get("fraction", FRACTION)) * RELEASED_EXAMPLES)
    return BenchmarkSize(2 * examples, 2 * examples, 0)


BENCHMARKS = (
    Benchmark(kind="coco_counterfactuals", source="HF Intel/COCO-Counterfactuals data/examples.jsonl; retrieved as "
              "FSC-CLIP does (R@1 over a 30% draw)",
              run=run, files=release_files, images=image_paths, size=release_size, headline="r1_mean",
              subsets=("i2t_r1", "t2i_r1"), chance=None,
              selections=stored_only,
              downloads=lambda spec: {"path": 'huggingface.co/datasets/Intel/COCO-Counterfactuals (compo prefetch); '
                                              "data/examples.jsonl, data/images/"},
              keys={"file": Key({"type": ["string", "null"]}, f"the examples file (default `{COCO_CF_FILE}`)"),
                    "fraction": Key({"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                    f"the share of examples retrieved over (default {FRACTION}: 5,223 of 17,410, a "
                                    "`random.Random(seed).sample` of positions)", "FSC-CLIP (seed 003, appendix A.2)"),
                    "seed": Key({"type": "integer", "minimum": 0}, "the seed of the examples drawn (default 0)",
                                "FSC-CLIP (seed 003, appendix A.2)")}),
)
