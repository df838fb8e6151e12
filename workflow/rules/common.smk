"""Helpers shared by every rule: wildcard constraints, one-line input functions and the arguments of commands.

What the study is (its models, what each rule reads, which negatives tables train, the report's outputs) is
`compo.study.Study`, a function of the config alone, asked here as STUDY; model ids and the files of a model folder
come from `compo.layout`. Nothing here imports torch: building the DAG stays fast.
"""

import json
import os
import re

from compo import layout
from compo.artifacts import CACHE_ENV, job_environment, model_cache
from compo.config import train_mem_mb, truncate_words
from compo.llm import vllm_engine_args
from compo.memory import check_fits, gpus as train_gpus
from compo.plan import job_minutes, runtime_minutes, walltime_minutes
from compo.profiles import RuleResources
from compo.provenance import package_version
from compo.study import Study, norms_files, released_negatives

R = config["results"]
STUDY = Study(config)
PROFILE = RuleResources(workflow.resource_settings)

# Jobs never download: they read external models from the prefetched cache (compo.prefetch, compo.artifacts)
# with the hub libraries offline. The process that builds the DAG resolves the cache once; its jobs inherit
# it, local ones as children and cluster ones through sbatch's --export=ALL, so every node reads the same.
if workflow.is_main_process or CACHE_ENV not in os.environ:
    os.environ.update(job_environment(model_cache(config)))
BASE_SEEDS = STUDY.base_seeds
MODEL_FILES = layout.MODEL_FILES
# Model folders as wildcard patterns (compo.layout spells the ids).
BASE_MODEL = layout.base_model_id("{base}", "{dataset}", "{seed}")
METHOD_MODEL = layout.model_id("{method}", "{dataset}", "{seed}")
WISEFT_MODEL = layout.model_id(layout.wiseft_name("{method}", "{alpha}"), "{dataset}", "{seed}")


def _alternatives(names):
    """A regex matching exactly one of `names` (wildcard constraints are built from the config)."""
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) or "(?!)"


wildcard_constraints:
    method=_alternatives(config["methods"]),
    base=_alternatives(config["bases"]),
    dataset=_alternatives(set(config["datasets"]) | {STUDY.base_tag(b) for b in config["bases"]}),
    seed=r"\d+",
    model=layout.MODEL_ID_REGEX,
    benchmark=_alternatives(config["benchmarks"]),
    split=_alternatives(config.get("world", {}).get("splits", {})),
    generator=_alternatives(config["negatives"]),


# --- input functions (compo.study) -----------------------------------------------------------------------
def get_dataset_inputs(wildcards):
    return STUDY.dataset_inputs(wildcards.dataset)


def get_overlap_inputs(wildcards):
    return STUDY.overlap_inputs(wildcards.dataset)


def get_pretrain_inputs(wildcards):
    return STUDY.pretrain_inputs(wildcards.base)


def get_train_inputs(wildcards):
    return STUDY.train_inputs(wildcards.method, wildcards.dataset, wildcards.seed)


def get_wiseft_inputs(wildcards):
    return STUDY.wiseft_inputs(wildcards.method, wildcards.dataset, wildcards.seed)


def get_generator_norms(wildcards):
    return norms_files(config["negatives"][wildcards.generator])


def get_concreteplant_table_inputs(wildcards):
    return STUDY.concreteplant_table_inputs(wildcards.dataset)


# --- arguments of the commands -------------------------------------------------------------------------
def json_arg(obj):
    """A config section as one JSON argument for a `compo` command (the shell command quotes it: `:q`)."""
    return json.dumps(obj, sort_keys=True)


def optional_arg(flag, inputs, key):
    """The words `--flag path` for a job with input `key`, else none (a list: the shell quotes each word)."""
    return [flag, inputs[key]] if key in inputs.keys() else []


def norms_args(section):
    """`--norms` / `--sha256` of a config section naming the concreteness norms (none: the shipped subset)."""
    words = ["--norms", section["norms"]] if section.get("norms") else []
    return words + (["--sha256", section["sha256"]] if section.get("sha256") else [])


def val_benchmark_arg(recipe):
    """`--val-benchmark JSON` (name, config entry, folder, the config's templates) for a recipe that names one."""
    entry = STUDY.val_benchmark_entry(recipe)
    return [] if entry is None else ["--val-benchmark", json_arg(entry)]


def text_protocol_args(wildcards):
    """`--truncate-words N` for a model whose method recipe sets text.truncate_words (LongCLIP-70)."""
    words = truncate_words(config, layout.parse_model_id(wildcards.model).method)
    return [] if words is None else ["--truncate-words", str(words)]


def benchmark_kinds():
    """{benchmark: kind} of the config's benchmarks, for the figures (subsets and chance levels)."""
    return json_arg({name: spec["kind"] for name, spec in config["benchmarks"].items()})


def shard_gpus(generator):
    """GPUs one shard of an LLM generator asks for: its vLLM engine's tensor-parallel size (compo.llm)."""
    spec = config["negatives"][generator]
    return vllm_engine_args(spec.get("vllm"))["tensor_parallel_size"] if spec.get("backend") == "vllm" else 1


def get_launcher(wildcards, resources):
    """How a training job starts `compo train`: with more than one GPU (resource `gpu`) torchrun starts one
    process per GPU inside the job (`python -m compo train ...` on each, data-parallel: compo.distributed);
    otherwise `python -m compo`, as every rule (the Snakefile puts the package on PYTHONPATH). `--` ends torchrun's
    own options: its parser reads compo's `--log` as an ambiguous abbreviation of `--log-dir` / `--logs-specs`."""
    gpus = int(getattr(resources, "gpu", 0) or 0)
    if gpus > 1:
        return f"torchrun --standalone --nproc_per_node {gpus} -m compo --"
    return "python -m compo"


# --- resources of a fine-tuning job -----------------------------------------------------------------------
# GPUs per method (the recipe's train.gpus, default 1), not per rule: so one method can have 4 without giving
# every fine-tune 4; all on one node (torchrun --standalone needs one), so nodes: 1. mem_mb is declared only
# when the config has the table (else the profile's default-resources apply, as to any rule); a profile's
# set-resources for train overrides these (the SLURM profiles set none of gpu / nodes for train).
def get_train_gpus(wildcards):
    """The method's GPUs; a job that cannot fit the GPU memory the workflow profile names (`gpu_mem_gb`) is
    refused here, while the DAG is built, before anything is queued (compo.memory.check_fits)."""
    recipe = STUDY.recipe(wildcards.method)
    gpu_mem = PROFILE.number("train", "gpu_mem_gb")
    if gpu_mem is not None:
        refusal = check_fits(recipe, config["bases"][recipe["base"]]["model"], config["train"], float(gpu_mem))
        if refusal:
            raise ValueError(f"refused, does not fit its GPU: {refusal}")
    return train_gpus(recipe)


def train_job_gpus(wildcards):
    return train_gpus(STUDY.recipe(wildcards.method))


TRAIN_RESOURCES = {"gpu": get_train_gpus, "nodes": 1}
if train_mem_mb(config, "") is not None:
    TRAIN_RESOURCES["mem_mb"] = lambda wildcards: train_mem_mb(config, wildcards.method)
TRAIN_RESOURCES |= PROFILE.gpu_job_resources("train", train_job_gpus)  # the profile's per-GPU memory wins


# --- walltime a GPU job asks for (a cluster's runtime; compo.plan) --------------------------------------------
def planned_runtime(rule):
    """A rule's runtime: the cost plan's estimate of the job on the profile's GPU x the margin (x the attempt:
    a retry after a timeout asks for more), never past the profile's `max_runtime` (sbatch would refuse it:
    "48h", 2880, "2-00:00:00"); a profile's set-resources runtime for the rule overrides it."""
    gpu_model = PROFILE.gpu_model(rule)
    where = f"profile: resources of {rule}: max_runtime"
    max_minutes = runtime_minutes(PROFILE.value(rule, "max_runtime"), where)

    # the config's threads, not the `threads` Snakemake passes: a local dry run caps those at its own cores
    def runtime(wildcards, attempt):
        estimate = job_minutes(config, rule, dict(wildcards.items()), None, gpu_model)
        return walltime_minutes(estimate, attempt, max_minutes)

    return runtime
