"""Helpers shared by every rule: paths, wildcard constraints, and the `get_*` input functions.

Model ids and the files of a model folder come from `compo.layout`; what a training job reads follows
from its loss's contract in `compo.losses.LOSSES`. Nothing here imports torch: building the DAG stays fast.
"""

import functools
import json
import os
import re

from compo import layout
from compo.artifacts import CACHE_ENV, job_environment, model_cache
from compo.claim_specs import study_claims
from compo.config import base_seeds, resolve_method, train_mem_mb, truncate_words
from compo.data import raw_paths
from compo.evaluate.kinds import benchmark_files
from compo.llm import vllm_engine_args
from compo.memory import check_fits, gpus as train_gpus
from compo.plan import job_minutes, runtime_minutes, walltime_minutes
from compo.profiles import plain_resource
from compo.provenance import package_version
from compo.losses import IMAGE_NEEDS, LOSSES, PARSE_NEEDS
from compo.world.benchmarks import world_benchmarks

R = config["results"]

# Jobs never download: they read external models from the prefetched cache (compo.prefetch, compo.artifacts)
# with the hub libraries offline. The process that builds the DAG resolves the cache once; its jobs inherit
# it, local ones as children and cluster ones through sbatch's --export=ALL, so every node reads the same.
if workflow.is_main_process or CACHE_ENV not in os.environ:
    os.environ.update(job_environment(model_cache(config)))
BASE_SEEDS = base_seeds(config)
WORLD_SPLITS = list(config.get("world", {}).get("splits", {}))
MODEL_FILES = layout.MODEL_FILES


def _alternatives(names):
    """A regex matching exactly one of `names` (wildcard constraints are built from the config)."""
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) or "(?!)"


def json_arg(obj):
    """A config section as one JSON argument for a `compo` command (the shell command quotes it: `:q`)."""
    return json.dumps(obj, sort_keys=True)


def optional_arg(flag, inputs, key):
    """The words `--flag path` for a job with input `key`, else none (a list: the shell quotes each word)."""
    return [flag, inputs[key]] if key in inputs.keys() else []


def base_tag(base):
    spec = config["bases"][base]
    return spec["dataset"] if spec["init"] == "scratch" else spec["init"]


def base_model_id(base, seed=None):
    """The base a fine-tuning seed starts from (study.base_seeds); no seed: the first base seed's."""
    pretrain_seed = BASE_SEEDS[0] if seed is None else layout.base_seed_for(seed, BASE_SEEDS)
    return layout.base_model_id(base, base_tag(base), pretrain_seed)


wildcard_constraints:
    method=_alternatives(config["methods"]),
    base=_alternatives(config["bases"]),
    dataset=_alternatives(set(config["datasets"]) | {base_tag(b) for b in config["bases"]}),
    seed=r"\d+",
    model=layout.MODEL_ID_REGEX,
    benchmark=_alternatives(config["benchmarks"]),
    split=_alternatives(WORLD_SPLITS),
    generator=_alternatives(config["negatives"]),


# --- data --------------------------------------------------------------------------------------------
def get_manifest(dataset):
    return f"{R}/data/{dataset}/manifest.parquet"


def get_dataset_inputs(wildcards):
    """The raw inputs of a dataset manifest: a world split, or the user's raw file."""
    spec = config["datasets"][wildcards.dataset]
    if spec["source"] == "world":
        return {"world": f"{R}/world/{spec['split']}/manifest.parquet"}
    return {"raw": [str(path) for path in raw_paths(spec["path"])]}  # a glob or list: every file


def get_norms(section):
    """The norms file of a config section as an input ([] for the shipped subset or a URL: not a file)."""
    norms = section.get("norms")
    return [] if not norms or norms.startswith(("http://", "https://")) else [norms]


def get_released_negatives(section):
    """The released negatives file a generator reads (`negatives.<name>.path`) as an input ([] for the others)."""
    return [section["path"]] if section.get("path") else []


def norms_args(section):
    """`--norms` / `--sha256` of a config section naming the concreteness norms (none: the shipped subset)."""
    words = ["--norms", section["norms"]] if section.get("norms") else []
    return words + (["--sha256", section["sha256"]] if section.get("sha256") else [])


def negative_shards(generator):
    """Shards of a generator (LLM generators run sharded; rule-based ones in one job)."""
    return int(config["negatives"][generator].get("shards", 1))


def shard_gpus(generator):
    """GPUs one shard of an LLM generator asks for: its vLLM engine's tensor-parallel size (compo.llm)."""
    spec = config["negatives"][generator]
    return vllm_engine_args(spec.get("vllm"))["tensor_parallel_size"] if spec.get("backend") == "vllm" else 1


SHARDED = [g for g in config["negatives"] if negative_shards(g) > 1]
UNSHARDED = [g for g in config["negatives"] if negative_shards(g) == 1]
# Generators whose negatives get SDXL-Turbo images (an `images` mapping; real data): rule negative_images.
DIFFUSION = [g for g in config["negatives"] if isinstance(config["negatives"][g].get("images"), dict)]


def image_shards(generator):
    """Shards of a generator's SDXL-Turbo image negatives."""
    return int(config["negatives"][generator]["images"].get("shards", 1))


def negatives_table(dataset, generator):
    """The negatives table training reads: with SDXL-Turbo images, the one that has them."""
    suffix = ".images" if generator in DIFFUSION else ""
    return f"{R}/negatives/{dataset}/{generator}{suffix}.parquet"


def negative_images(dataset, generator):
    """The folder of a generator's image negatives (compo negatives --images-dir)."""
    return f"{R}/negatives/{dataset}/{generator}"


# --- models ------------------------------------------------------------------------------------------
# Model folders as wildcard patterns (compo.layout spells the ids).
BASE_MODEL = layout.base_model_id("{base}", "{dataset}", "{seed}")
METHOD_MODEL = layout.model_id("{method}", "{dataset}", "{seed}")
WISEFT_MODEL = layout.model_id(layout.wiseft_name("{method}", "{alpha}"), "{dataset}", "{seed}")


@functools.cache  # the config is fixed for a DAG build; model_ids alone asks ~1,700 times (read-only dicts)
def get_recipe(method):
    return resolve_method(config, method)


def get_train_inputs(wildcards):
    """What a fine-tuning job reads: its base checkpoint, the training manifest and, by what its loss needs
    (compo.losses.LOSSES), the parse table, the negatives table and their images."""
    recipe = get_recipe(wildcards.method)
    needs = LOSSES[recipe["loss"]].needs
    inputs = {
        "init": f"{R}/models/{base_model_id(recipe['base'], wildcards.seed)}/{layout.CHECKPOINT}",
        "manifest": get_manifest(wildcards.dataset),
        "overlap": get_overlap_table(wildcards.dataset),
    }
    if needs & PARSE_NEEDS:
        inputs["parse"] = f"{R}/parse/{wildcards.dataset}.parquet"
    if recipe.get("negatives"):
        inputs["negatives"] = negatives_table(wildcards.dataset, recipe["negatives"])
        if needs & IMAGE_NEEDS and config["negatives"][recipe["negatives"]].get("images") is True:
            inputs["negative_images"] = negative_images(wildcards.dataset, recipe["negatives"])
    return inputs | val_benchmark_inputs(recipe)


def get_pretrain_inputs(wildcards):
    spec = config["bases"][wildcards.base]
    if spec["init"] == "scratch" and spec["train"]["steps"] > 0:
        return {"manifest": get_manifest(spec["dataset"]), "overlap": get_overlap_table(spec["dataset"])} | (
            val_benchmark_inputs(spec)
        )
    # a released base's local weights file: missing fails the DAG build, replacing it reruns the export
    return {"weights": spec["weights"]} if spec.get("weights") else {}


# --- validation during training (recipe train.val_benchmark, compo.validation) -------------------------------
def val_benchmark_inputs(recipe):
    """The files of the zero-shot benchmark a recipe validates on while it trains (none when it names none)."""
    name = recipe.get("train", {}).get("val_benchmark")
    return {"val_benchmark": get_benchmark_files(name)} if name else {}


def val_benchmark_arg(recipe):
    """`--val-benchmark JSON` (name, config entry, folder, the config's templates) for a recipe that names one."""
    name = recipe.get("train", {}).get("val_benchmark")
    if not name:
        return []
    entry = {
        "name": name,
        "spec": config["benchmarks"][name],
        "dir": get_benchmark_dir(name),
        "templates": config.get("zeroshot_templates"),
    }
    return ["--val-benchmark", json_arg(entry)]


# --- the benchmark-image guard (rule overlap, compo.overlap) -------------------------------------------------
def get_overlap_table(dataset):
    """Training waits for it: the rule fails when the dataset holds benchmark images the config does not accept."""
    return f"{R}/tables/overlap/{dataset}.csv"


def overlap_benchmarks():
    """Every benchmark a model of the study is evaluated on."""
    return list(dict.fromkeys([*EVAL_BENCHMARKS, *WISEFT_BENCHMARKS]))


def get_overlap_inputs(wildcards):
    return {
        "manifest": get_manifest(wildcards.dataset),
        "benchmarks": [f for b in overlap_benchmarks() for f in get_benchmark_files(b)],
    }


# --- WiSE-FT -----------------------------------------------------------------------------------------
WISEFT = config.get("wiseft", {"methods": [], "alphas": []})


def wiseft_model_ids(datasets, seeds):
    """Every interpolated model of the configured methods and alphas (a method's own `datasets` wins)."""
    return [
        layout.wiseft_model_id(method, alpha, dataset, seed)
        for method in WISEFT["methods"]
        for dataset in get_recipe(method).get("datasets", datasets)
        for seed in seeds
        for alpha in WISEFT["alphas"]
    ]


def get_wiseft_inputs(wildcards):
    """The two endpoints: the method's base model and the fine-tuned model."""
    base = get_recipe(wildcards.method)["base"]
    finetuned = layout.model_id(wildcards.method, wildcards.dataset, wildcards.seed)
    return {
        "base": f"{R}/models/{base_model_id(base, wildcards.seed)}/{layout.CHECKPOINT}",
        "finetuned": f"{R}/models/{finetuned}/{layout.CHECKPOINT}",
    }


# --- benchmarks --------------------------------------------------------------------------------------
def get_benchmark_dir(benchmark):
    return layout.benchmark_dir(R, config["benchmarks"][benchmark])


def get_benchmark_files(benchmark):
    """The files that define a benchmark, so evaluation reruns when they change."""
    spec = config["benchmarks"][benchmark]
    return benchmark_files(spec["kind"], get_benchmark_dir(benchmark), spec)


def world_benchmark_outputs():
    """Every file that defines a world benchmark (rule `benchmarks` writes them all at once)."""
    return [
        f
        for spec in world_benchmarks().values()
        for f in benchmark_files(spec["kind"], layout.world_benchmark_dir(R, spec), spec)
    ]


# Every model is evaluated on the study's benchmarks, WiSE-FT models on `wiseft.benchmarks` (one
# evaluation job per model: rules evaluate and evaluate_wiseft).
EVAL_BENCHMARKS = config["study"]["benchmarks"]
WISEFT_BENCHMARKS = config.get("wiseft", {}).get("benchmarks", EVAL_BENCHMARKS)


# The record of each evaluation set's files, written by the benchmark_set rule; WiSE-FT's is the study's when equal.
BENCHMARK_SETS = {"study": EVAL_BENCHMARKS, "wiseft": WISEFT_BENCHMARKS}


def benchmark_set_record(benchmarks):
    """The record an evaluation job of `benchmarks` (one of BENCHMARK_SETS) reads in place of their files."""
    name = "study" if list(benchmarks) == list(EVAL_BENCHMARKS) else "wiseft"
    return f"{R}/benchmarks/sets/{name}.json"


def eval_benchmarks_arg(benchmarks):
    """The benchmarks of an evaluation job, each with its config entry and folder, as one JSON argument."""
    return json_arg({b: {"spec": config["benchmarks"][b], "dir": get_benchmark_dir(b)} for b in benchmarks})


def text_protocol_args(wildcards):
    """`--truncate-words N` for a model whose method recipe sets text.truncate_words (LongCLIP-70)."""
    words = truncate_words(config, layout.parse_model_id(wildcards.model).method)
    return [] if words is None else ["--truncate-words", str(words)]


# --- the study ---------------------------------------------------------------------------------------
def model_ids(methods, datasets, seeds):
    """Every model of `methods` x datasets x seeds (a method's own `datasets` wins), plus the bases they
    start from."""
    bases = {get_recipe(m)["base"] for m in methods}
    ids = sorted({base_model_id(b, s) for b in bases for s in seeds})
    ids += [layout.model_id(m, d, s) for m in methods for d in get_recipe(m).get("datasets", datasets) for s in seeds]
    return ids


def study_model_ids():
    study = config["study"]
    ids = model_ids(study["methods"], study["datasets"], study["seeds"])
    ids += sorted({base_model_id(b, s) for b in study.get("bases", []) for s in study["seeds"]} - set(ids))
    return ids + wiseft_model_ids(study["datasets"], study["seeds"])


def get_eval_indexes(models=None):
    """The evaluation index of each of `models` (default: the study's): written last by the model's evaluation job,
    it stands for every result JSON of its benchmarks (compo.layout.EVAL_INDEX), one DAG edge per model."""
    models = study_model_ids() if models is None else models
    return [f"{R}/eval/{m}/{layout.EVAL_INDEX}" for m in models]


def ablation_model_ids(group):
    return model_ids(config["ablations"][group]["methods"], *ablation_scope(group))


def ablation_eval_indexes(group):
    return get_eval_indexes(ablation_model_ids(group))


def study_and_ablation_methods():
    study = config["study"]
    ablated = [m for group in study.get("ablations", []) for m in config["ablations"][group]["methods"]]
    return list(dict.fromkeys([*study["methods"], *ablated]))


def method_model_ids(method):
    """The models of one method (its bases included) at the study's datasets and seeds, or for a method only an
    ablation trains, at that ablation's."""
    study = config["study"]
    if method in study["methods"]:
        return model_ids([method], study["datasets"], study["seeds"])
    ids = [
        m
        for g in study.get("ablations", [])
        if method in config["ablations"][g]["methods"]
        for m in model_ids([method], *ablation_scope(g))
    ]
    return list(dict.fromkeys(ids))


def ablation_scope(group):
    """(datasets, seeds) of an ablation group: its own, or the study's."""
    spec, study = config["ablations"][group], config["study"]
    return spec.get("datasets", study["datasets"]), spec.get("seeds", study["seeds"])


def reproduction_only_indexes():
    """The evaluation indexes of the study's ablation models that are not study models: the reproduction table
    binds the seeds' cells they reproduce (DeGLA's Table 7, ...), the study's own tables leave them out."""
    study = set(study_model_ids())
    ablated = {m for group in config["study"].get("ablations", []) for m in ablation_model_ids(group)}
    return get_eval_indexes(sorted(ablated - study))


def study_datasets():
    """Every dataset a study model trains on (methods may name their own datasets)."""
    study = config["study"]
    return sorted({d for m in study["methods"] for d in get_recipe(m).get("datasets", study["datasets"])})


def study_generators():
    return sorted({get_recipe(m)["negatives"] for m in config["study"]["methods"]} - {None})


def trained_generator_pairs():
    """(dataset, generator) of every negatives table a study or ablation method trains on."""
    study = config["study"]
    ablated = [m for group in study.get("ablations", []) for m in config["ablations"][group]["methods"]]
    pairs = set()
    for method in [*study["methods"], *ablated]:
        recipe = get_recipe(method)
        if recipe.get("negatives"):
            pairs |= {(d, recipe["negatives"]) for d in recipe.get("datasets", study["datasets"])}
    return pairs


def generator_costs_gpus(name):
    """An LLM or SDXL generator: GPU hours per dataset, run only where a method trains on it (issue 42)."""
    spec = config["negatives"][name]
    return spec.get("backend") in ("vllm", "transformers") or isinstance(spec.get("images"), dict)


def dataset_generators(dataset):
    """The generators a dataset's tables (and quality report) cover: every rule-based one, and the GPU ones only
    where a method trains on their negatives of that dataset."""
    trained = trained_generator_pairs()
    return [g for g in config["negatives"] if not generator_costs_gpus(g) or (dataset, g) in trained]


def concreteplant_dataset():
    """Where seed 002's Table 1 is measured: the dataset ConcretePlant's methods train on (D_hc / D_lc / D_wo are
    built from it; paper: Karpathy train's longest captions), else the study's first."""
    names = set(concreteplant_generators().values())
    trained = sorted(d for d, g in trained_generator_pairs() if g in names)
    return trained[0] if trained else config["study"]["datasets"][0]


def data_table_datasets(kind):
    """The datasets a per-dataset report table is written for."""
    if kind == "concreteplant":
        return [concreteplant_dataset()] if report_datasets() else []
    return report_datasets()


def concreteplant_generators():
    """ConcretePlant's datasets in the config as {policy: negatives entry} (one per policy)."""
    found = {}
    for name, spec in config["negatives"].items():
        generator = spec["generator"]
        if generator.startswith("concreteplant"):
            found.setdefault(spec.get("policy") or generator.rsplit("-", 1)[-1], name)
    return found


def get_concreteplant_table_inputs(wildcards):
    base = "clip" if "clip" in config["bases"] else sorted(config["bases"])[0]
    inputs = {
        "concreteness": f"{R}/concreteness/{wildcards.dataset}.parquet",
        "manifest": get_manifest(wildcards.dataset),
        "model": f"{R}/models/{base_model_id(base)}/{layout.CHECKPOINT}",
    }
    for policy, name in concreteplant_generators().items():
        inputs[policy] = negatives_table(wildcards.dataset, name)
    return inputs


# Models whose training logs the claims read (training/ metrics): the study's fine-tuned models.
CLAIMS_LOSS_MODELS = [m for m in study_model_ids() if not m.startswith((layout.BASE_PREFIX, layout.WISEFT_PREFIX))]


def get_claims_inputs(wildcards):
    """Every study model's evaluation index (its results and per-item predictions), the training logs, and
    ConcretePlant's per-pair table of the base model when a claim reads it."""
    inputs = {
        "results": get_eval_indexes(),
        "losses": [f"{R}/models/{m}/{layout.LOSSES_CSV}" for m in CLAIMS_LOSS_MODELS],
    }
    if any(str(c["metric"]).startswith("concreteplant/") for c in study_claims(config)):
        inputs["pairs"] = f"{R}/tables/concreteplant/{concreteplant_dataset()}.pairs.csv"
    return inputs


def get_study_outputs():
    datasets = report_datasets()
    outputs = [f"{R}/tables/results.md", f"{R}/tables/correlations.md"]
    if study_claims(config):
        outputs.append(f"{R}/tables/claims.md")
    outputs += [f"{R}/tables/parse/{d}.csv" for d in datasets]
    outputs += [
        f"{R}/tables/negatives/{d}/{g}.csv" for d in datasets for g in study_generators() if g in dataset_generators(d)
    ]
    outputs += [f"{R}/tables/negatives/{d}/quality.csv" for d in datasets]
    outputs += [f"{R}/tables/datasets/{d}.csv" for d in study_datasets()]
    if concreteplant_generators():
        outputs += [f"{R}/tables/concreteplant/{d}.csv" for d in data_table_datasets("concreteplant")]
    outputs += [f"{R}/tables/ablations/{g}/results.md" for g in config["study"].get("ablations", [])]
    return outputs


# --- memory a fine-tuning job asks for ------------------------------------------------------------------
def get_train_mem_mb(wildcards):
    return train_mem_mb(config, wildcards.method)


# GPUs per method (the recipe's train.gpus, default 1), not per rule: so one method can have 4 without giving
# every fine-tune 4; all on one node (torchrun --standalone needs one), so nodes: 1. mem_mb is declared only
# when the config has the table (else the profile's default-resources apply, as to any rule); a profile's
# set-resources for train overrides these (the SLURM profiles set none of gpu / nodes for train).
def get_train_gpus(wildcards):
    """The method's GPUs; a job that cannot fit the GPU memory the workflow profile names (`gpu_mem_gb`) is
    refused here, while the DAG is built, before anything is queued (compo.memory.check_fits)."""
    recipe = get_recipe(wildcards.method)
    gpu_mem = profile_resource("train", "gpu_mem_gb")
    if gpu_mem is not None:
        refusal = check_fits(recipe, config["bases"][recipe["base"]]["model"], config["train"], float(gpu_mem))
        if refusal:
            raise ValueError(f"refused, does not fit its GPU: {refusal}")
    return train_gpus(recipe)


def profile_value(rule, name, defaults=True):
    """The value the workflow profile (or --set-resources) gives resource `name` of `rule`: its set-resources, else
    (`defaults`) its default-resources, as written (compo.profiles.plain_resource); None: not set, or computed by a
    function."""
    settings = workflow.resource_settings
    sources = [(settings.overwrite_resources or {}).get(rule) or {}]
    if defaults:
        sources.append(settings.default_resources or {})
    for resources in sources:
        value = plain_resource(resources.get(name)) if hasattr(resources, "get") else None
        if value is not None:
            return value
    return None


def profile_resource(rule, name):
    """A numeric resource the profile gives `rule` (e.g. gpu_mem_gb), or None; a value that is not a number is
    an error naming the rule and the resource."""
    value = profile_value(rule, name)
    if value is not None and not isinstance(value, int | float):
        raise ValueError(f"profile: set-resources.{rule}.{name}: {value!r} is not a number (e.g. {name}: 80)")
    return value


# --- CPUs and host memory of a GPU job: per GPU ----------------------------------------------------------------
# A job's CPUs and host memory scale with its GPUs where the profile names them per GPU (set-resources.<rule>:
# cpus_per_gpu, mem_mb_per_gpu): a 4-GPU C2LIP job runs 4 ranks, each decoding its images and reading its tables,
# so it asks 4x a 1-GPU job's (cpus_per_task and mem_mb, the figures the SLURM plugin submits), without giving
# every 1-GPU fine-tune as much. The job's threads are the same CPUs: the trainer splits them over its ranks.
PER_GPU = {"cpus_per_gpu": "cpus_per_task", "mem_mb_per_gpu": "mem_mb"}


def per_gpu_figure(rule, name):
    """The per-GPU figure `name` (cpus_per_gpu, mem_mb_per_gpu) the profile gives `rule`, or None. Naming the
    whole-job figure it replaces under the same rule's set-resources is an error (set-resources would override the
    scaled figure: the per-GPU one would be dropped without a word)."""
    figure = profile_resource(rule, name)
    if figure is not None and profile_value(rule, PER_GPU[name], defaults=False) is not None:
        raise ValueError(
            f"profile: set-resources.{rule} names both {name} and {PER_GPU[name]}: keep {name} (the job asks for "
            f"{name} x its GPUs) or {PER_GPU[name]} (the same for any GPU count)"
        )
    return figure


def gpu_job_resources(rule, gpus):
    """cpus_per_task and mem_mb of a job of the GPU rule `rule`, each the profile's per-GPU figure x the job's
    GPUs (`gpus`, a function of the wildcards) where the profile names one; the others are left to the profile
    as for any rule."""
    resources = {}
    for name, whole in PER_GPU.items():
        figure = per_gpu_figure(rule, name)
        if figure is not None:
            resources[whole] = lambda wildcards, figure=figure: int(figure * gpus(wildcards))
    return resources


def gpu_job_threads(rule, gpus, fallback):
    """A GPU rule's threads: the CPUs the job asks for (cpus_per_gpu x its GPUs) where the profile names them per
    GPU, else `fallback` (the config's threads)."""
    figure = per_gpu_figure(rule, "cpus_per_gpu")
    if figure is None:
        return fallback
    return lambda wildcards: int(figure * gpus(wildcards))


def train_job_gpus(wildcards):
    return train_gpus(get_recipe(wildcards.method))


TRAIN_RESOURCES = {"gpu": get_train_gpus, "nodes": 1}
if train_mem_mb(config, "") is not None:
    TRAIN_RESOURCES["mem_mb"] = get_train_mem_mb
TRAIN_RESOURCES |= gpu_job_resources("train", train_job_gpus)  # the profile's per-GPU memory wins over the config's


# --- walltime a GPU job asks for (a cluster's runtime; compo.plan) --------------------------------------------
def profile_gpu_model(rule):
    """The gpu_model the profile gives `rule` (set-resources, else default-resources); None: none named."""
    value = profile_value(rule, "gpu_model")
    return None if value is None else str(value)


def profile_max_runtime(rule):
    """Minutes of the partition limit the profile gives `rule` (`max_runtime`: set-resources, else
    default-resources; "48h", 2880, "2-00:00:00"); None: none named."""
    return runtime_minutes(profile_value(rule, "max_runtime"), f"profile: resources of {rule}: max_runtime")


def planned_runtime(rule):
    """A rule's runtime: the cost plan's estimate of the job on the profile's GPU x the margin (x the attempt:
    a retry after a timeout asks for more), never past the profile's `max_runtime` (sbatch would refuse it);
    a profile's set-resources runtime for the rule overrides it."""
    gpu_model = profile_gpu_model(rule)
    max_minutes = profile_max_runtime(rule)

    # the config's threads, not the `threads` Snakemake passes: a local dry run caps those at its own cores
    def runtime(wildcards, attempt):
        estimate = job_minutes(config, rule, dict(wildcards.items()), None, gpu_model)
        return walltime_minutes(estimate, attempt, max_minutes)

    return runtime


# --- multi-GPU training ---------------------------------------------------------------------------------
def get_launcher(wildcards, resources):
    """How a training job starts `compo train`: with more than one GPU (resource `gpu`) torchrun starts one
    process per GPU inside the job (`python -m compo train ...` on each, data-parallel: compo.distributed);
    otherwise `python -m compo`, as every rule (the Snakefile puts the package on PYTHONPATH). `--` ends torchrun's
    own options: its parser reads compo's `--log` as an ambiguous abbreviation of `--log-dir` / `--logs-specs`."""
    gpus = int(getattr(resources, "gpu", 0) or 0)
    if gpus > 1:
        return f"torchrun --standalone --nproc_per_node {gpus} -m compo --"
    return "python -m compo"


# --- figures and the report (rules and their settings, FIGURE_REPORT and DATA_TABLES, in report.smk) ---
def report_datasets():
    """The study's training datasets, none when it trains nothing (a study of released bases)."""
    return config["study"]["datasets"] if config["study"]["methods"] else []


def data_table_kinds():
    return [k for k in DATA_TABLES if k != "concreteplant" or concreteplant_generators()]


def get_figure_inputs(wildcards):
    """The tables every figure reads; per-model training logs of every trained (non-WiSE-FT) model."""
    datasets = report_datasets()
    models = [m for m in study_model_ids() if not layout.is_wiseft(m)]
    inputs = {
        "summary": f"{R}/tables/results.csv",
        "claims": f"{R}/tables/claims.csv",
        "effects": f"{R}/tables/effects.csv",
        "correlations": f"{R}/tables/correlations.csv",
        "losses": [f"{R}/models/{m}/losses.csv" for m in models],
        "quality": [f"{R}/tables/negatives/{d}/quality.csv" for d in datasets],
        "attributes": [f"{R}/tables/datasets/{d}.csv" for d in study_datasets()],
        "pairs": [],
    }
    if concreteplant_generators():
        inputs["pairs"] = [f"{R}/tables/concreteplant/{d}.pairs.csv" for d in data_table_datasets("concreteplant")]
    return inputs


def benchmark_kinds():
    """{benchmark: kind} of the config's benchmarks, for the figures (subsets and chance levels)."""
    return json_arg({name: spec["kind"] for name, spec in config["benchmarks"].items()})


def report_method_order():
    """Methods in the config's order (bases first), so every figure lists them alike."""
    return list(config["study"]["methods"])


def report_outputs():
    """Every figure and report table of the study (rule all builds them)."""
    outputs = [f"{R}/figures/{name}.{ext}" for name in FIGURE_REPORT for ext in ("png", "pdf")]
    outputs += [f"{R}/report/claims.html", f"{R}/report/results.html", f"{R}/report/workflow.rst"]
    outputs += [f"{R}/report/{kind}/{d}.html" for kind in data_table_kinds() for d in data_table_datasets(kind)]
    return outputs
