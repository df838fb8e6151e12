"""Where the workflow's outputs live: model ids, the files of a model folder, the world's benchmark folders.

The one home of these names: the Snakemake rules (`workflow/rules/common.smk`), the trainer, WiSE-FT,
evaluation and the statistics import them from here.

Model ids (the `{model}` of `{results}/models/{model}/` and `{results}/eval/{model}/`):
  {method}/{dataset}/seed{seed}                 a method fine-tuned on a dataset with one seed
  base-{base}/{tag}/seed{seed}                  a base model; tag = its pretraining dataset (init scratch)
                                                or its open_clip pretrained tag
  wiseft-{method}-a{alpha}/{dataset}/seed{seed} WiSE-FT between a method's model and its base, alpha 0.0..1.0
A model folder holds MODEL_FILES; plain open_clip loads CHECKPOINT with the config in MODEL_JSON.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compo.hashing import file_sha256

# --- model folders ------------------------------------------------------------------------------------
CHECKPOINT = "checkpoint.pt"  # the state dict
MODEL_JSON = "model.json"     # {"model_name": ..., "model_config": {...}, checkpoint_sha256, compo_version, ...}
CONFIG_YAML = "config.yaml"   # the resolved recipe, seed, settings, inputs (their hashes) and versions
LOSSES_CSV = "losses.csv"     # one row per training step: loss terms, reproducible (header only for WiSE-FT)
TIMINGS_CSV = "timings.csv"   # one row per training step: seconds (data, step); wall clock, kept apart
MODEL_FILES = (CHECKPOINT, MODEL_JSON, CONFIG_YAML, LOSSES_CSV, TIMINGS_CSV)  # written as a whole folder

# --- model ids ----------------------------------------------------------------------------------------
BASE_PREFIX = "base-"
WISEFT_PREFIX = "wiseft-"
MODEL_ID_REGEX = r"[^/]+/[^/]+/seed\d+"
# the method part of a WiSE-FT model id: the method interpolated and its alpha (`wiseft_name`)
WISEFT_METHOD = re.compile(rf"^{WISEFT_PREFIX}(?P<method>.+)-a(?P<alpha>\d+(?:\.\d+)?)$")
_MODEL_ID = re.compile(r"^(?P<method>[^/]+)/(?P<dataset>[^/]+)/seed(?P<seed>\d+)$")


@dataclass(frozen=True)
class ModelId:
    method: str    # the method, base-{base} or wiseft-{method}-a{alpha}
    dataset: str
    seed: int


def model_id(method: str, dataset: str, seed: int | str) -> str:
    return f"{method}/{dataset}/seed{seed}"


def base_method(base: str) -> str:
    """The method part of a base's model ids (`bases.<base>` of the config)."""
    return f"{BASE_PREFIX}{base}"


def is_base(method: str) -> bool:
    return method.startswith(BASE_PREFIX)


def is_wiseft(method: str) -> bool:
    return method.startswith(WISEFT_PREFIX)


def base_model_id(base: str, tag: str, seed: int | str) -> str:
    return model_id(base_method(base), tag, seed)


def base_seed_for(seed: int, base_seeds: list[int]) -> int:
    """The pretraining seed of the base a fine-tuning seed starts from (config `study.base_seeds`): seed s
    fine-tunes base_seeds[s mod len(base_seeds)], so seeds 0, 1, 2, 3 over bases [0, 1] alternate."""
    return base_seeds[int(seed) % len(base_seeds)]


def wiseft_alpha(alpha: float) -> str:
    """alpha as it appears in model ids (one decimal: the trajectory's step is 0.1)."""
    if not 0 <= alpha <= 1 or round(alpha, 1) != alpha:
        raise ValueError(f"config key wiseft.alphas: {alpha} is not one of 0.0, 0.1, ..., 1.0")
    return f"{alpha:.1f}"


def wiseft_name(method: str, alpha: str) -> str:
    """The method part of a WiSE-FT model id; `alpha` as formatted by `wiseft_alpha`."""
    return f"{WISEFT_PREFIX}{method}-a{alpha}"


def wiseft_model_id(method: str, alpha: float, dataset: str, seed: int | str) -> str:
    return model_id(wiseft_name(method, wiseft_alpha(alpha)), dataset, seed)


def parse_model_id(text: str) -> ModelId | None:
    """The parts of a model id, or None when `text` is not one."""
    match = _MODEL_ID.match(text)
    return None if match is None else ModelId(match["method"], match["dataset"], int(match["seed"]))


def model_dir(results: str, model: str) -> str:
    return f"{results}/models/{model}"


# --- evaluation folders -------------------------------------------------------------------------------
# {results}/eval/{model}/ holds <benchmark>.json per benchmark, the folder predictions/ with
# <benchmark>.parquet (per-item predictions), and this index, written last by the model's evaluation job.
# What reads every result of a model (aggregate, claims, ablations) depends on the index alone, and the
# predictions are one folder output: the paper DAG has an edge per model, not one per benchmark file (~46,000
# edges and ~21,000 outputs were most of its dry-run time). Benchmark names start with a letter or digit.
EVAL_INDEX = "_evaluated.json"  # {"model": id, "results": ["<benchmark>.json", ...], "sha256": {name: hex}}
INDEX_HASHES = "sha256"  # each listed result's sha256, as the evaluation wrote it (check_index_hashes)
PREDICTIONS_DIR = "predictions"


def result_model_dir(result_json: str | Path) -> Path | None:
    """The model folder of a result JSON at `{results}/eval/{model}/<benchmark>.json`: `{results}/models/{model}`,
    beside it whichever folder the path is read from; None for a result outside that layout."""
    path = Path(result_json)
    folders = path.parent.parts[-4:]
    model = "/".join(folders[1:])
    if len(folders) < 4 or folders[0] != "eval" or parse_model_id(model) is None:
        return None
    return Path(model_dir(str(path.parents[4]), model))


def predictions_path(result_json: str | Path) -> str:
    """The per-item predictions of a result JSON: `predictions/<benchmark>.parquet` beside it."""
    path = Path(result_json)
    return str(path.parent / PREDICTIONS_DIR / f"{path.stem}.parquet")


def eval_result_paths(inputs: list[str]) -> list[str]:
    """The result JSONs named by `inputs`: an evaluation index stands for every result it lists (in its folder),
    any other path for itself. A listed result that is missing is an error naming the index."""
    paths: list[str] = []
    for item in map(str, inputs):
        if Path(item).name != EVAL_INDEX:
            paths.append(item)
            continue
        try:
            index = json.loads(Path(item).read_text())
            names = index["results"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{item}: not an evaluation index ({error}); rerun the model's evaluation") from error
        if not isinstance(names, list) or not all(isinstance(n, str) and "/" not in n for n in names):
            raise ValueError(f"{item}: 'results' should be a list of file names in its folder, got {names!r}")
        listed = [str(Path(item).with_name(name)) for name in names]
        missing = [p for p in listed if not Path(p).exists()]
        if missing:
            raise ValueError(f"{item}: lists {len(missing)} result(s) that are missing, e.g. {missing[0]}; rerun "
                             f"the model's evaluation")
        check_index_hashes(item, index, listed)
        paths += listed
    return paths


def check_index_hashes(index_path: str, index: dict[str, Any], listed: list[str]) -> None:
    """Each listed result's bytes are those its index recorded (`sha256`, written with it by the evaluation job):
    a result edited after its evaluation is an error naming it. Snakemake sees only the index (one edge per model,
    above), so an edit would otherwise never re-run what reads it, or enter the tables unseen when it does. An
    index of an older compo records no hashes: logged, not checked."""
    recorded = index.get(INDEX_HASHES)
    if recorded is None:
        logging.getLogger(__name__).warning("%s: records no sha256 of its results (written by an older compo): "
                                            "edits to them are not detected; rerun the evaluation to record them",
                                            index_path)
        return
    for path in listed:
        name = Path(path).name
        if not isinstance(recorded, dict) or recorded.get(name) != file_sha256(path):
            raise ValueError(f"{path}: its bytes are not those {index_path} recorded when the evaluation wrote it "
                             f"(sha256 {recorded.get(name) if isinstance(recorded, dict) else None}): the result was "
                             f"edited or replaced after its evaluation; rerun it (snakemake --forcerun {index_path})")


# --- the world's benchmarks ---------------------------------------------------------------------------
# The world's zero-shot sets: classification of these object attributes, a folder each (compo.world.benchmarks)
WORLD_ZEROSHOT_ATTRIBUTES = ("shape", "colour")


def world_benchmark_folder(spec: dict[str, Any]) -> str:
    """The world folder holding the files of a `source: world` benchmark entry."""
    return f"zeroshot-{spec['attribute']}" if spec["kind"] == "zeroshot" else spec["kind"]


def world_benchmark_dir(results: str, spec: dict[str, Any]) -> str:
    return f"{results}/benchmarks/world/{world_benchmark_folder(spec)}"


def benchmark_dir(results: str, spec: dict[str, Any]) -> str:
    """A benchmark's folder: its released files (`path`) or the world's generated version."""
    return spec["path"] if spec["source"] == "files" else world_benchmark_dir(results, spec)


def rank_path(path: str | Path) -> Path:
    """This process's own copy of a job's file (its log, its resource record): `path`, or `path.rank<r>` for rank
    r > 0 under torchrun, where every rank writes one."""
    rank = int(os.environ.get("RANK", "0"))
    return Path(f"{path}.rank{rank}" if rank > 0 else path)


# --- the jobs' resource records (compo.resource_use) -------------------------------------------------
# {results}/timing/<folder>/... -> the rule that wrote it (the `log.timing` paths of workflow/rules/*.smk)
TIMING_DIR = "timing"
_RULE_OF_TIMING_FOLDER = {"world": "world", "benchmarks": "benchmarks", "dataset": "dataset", "parse": "parse",
                          "prepared": "prepare_benchmark",
                          "concreteness": "concreteness", "attributes": "dataset_attributes",
                          "negatives": "negatives", "eval": "evaluate", "wiseft": "wiseft",
                          "concreteplant": "concreteplant_table", "aggregate.tsv": "aggregate",
                          "claims.tsv": "claims"}


# every rule a resource record names (timing_rule's answers)
TIMED_RULES = frozenset({*_RULE_OF_TIMING_FOLDER.values(), "pretrain", "train", "evaluate_wiseft", "negatives_shard",
                         "negative_images_shard"})


def timing_rule(parts: tuple[str, ...]) -> str:
    """The rule whose resource record is `{results}/timing/<parts...>`."""
    if parts[0] == "train":
        return "pretrain" if parts[1].startswith(BASE_PREFIX) else "train"
    if parts[0] == "eval" and parts[1].startswith(WISEFT_PREFIX):
        return "evaluate_wiseft"
    if parts[0] == "negatives" and ".images.shard" in parts[-1]:
        return "negative_images_shard"
    if parts[0] == "negatives" and ".shard" in parts[-1]:
        return "negatives_shard"
    if parts[0] not in _RULE_OF_TIMING_FOLDER:
        raise ValueError(f"{TIMING_DIR}/{'/'.join(parts)}: no rule writes resource records under {parts[0]!r}")
    return _RULE_OF_TIMING_FOLDER[parts[0]]
