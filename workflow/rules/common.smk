"""Helpers shared by every rule: paths, wildcard constraints, and the `get_*` input functions.

Model ids are `{method}/{dataset}/seed{seed}`; a base model is `base-{base}/{data-or-tag}/seed{seed}` where
the middle part is the pretraining dataset (init: scratch) or the open_clip pretrained tag.
"""

import json
import os
import re
import shlex

from compo.config import check_config, resolve_method
from compo.evaluate import benchmark_files

check_config(config)

R = config["results"]
WORLD_SPLITS = list(config.get("world", {}).get("splits", {}))
SUGARCREPE_SUBSETS = [
    "replace_obj",
    "replace_att",
    "replace_rel",
    "swap_obj",
    "swap_att",
    "add_obj",
    "add_att",
]


def _alternatives(names):
    """A regex matching exactly one of `names` (wildcard constraints are built from the config)."""
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) or "(?!)"


def json_arg(obj):
    """A config section as one shell-quoted JSON argument for a `compo` command."""
    return shlex.quote(json.dumps(obj, sort_keys=True))


def base_tag(base):
    spec = config["bases"][base]
    return spec["dataset"] if spec["init"] == "scratch" else spec["init"]


def base_model_id(base):
    return f"base-{base}/{base_tag(base)}/seed{config['seed']}"


def method_model_id(method, dataset, seed):
    return f"{method}/{dataset}/seed{seed}"


wildcard_constraints:
    method=_alternatives(config["methods"]),
    base=_alternatives(config["bases"]),
    dataset=_alternatives(set(config["datasets"]) | {base_tag(b) for b in config["bases"]}),
    seed=r"\d+",
    model=r"[^/]+/[^/]+/seed\d+",
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
    return {"raw": spec["path"]}


# --- models ------------------------------------------------------------------------------------------
def model_dir(model_id):
    return f"{R}/models/{model_id}"


MODEL_FILES = ["checkpoint.pt", "model.json", "config.yaml", "losses.csv", "timings.csv"]


def get_recipe(method):
    return resolve_method(config, method)


def get_train_inputs(wildcards):
    """A fine-tuning job needs its base checkpoint, its training manifest and, if any, its negatives."""
    recipe = get_recipe(wildcards.method)
    inputs = {
        "init": f"{R}/models/{base_model_id(recipe['base'])}/checkpoint.pt",
        "manifest": get_manifest(wildcards.dataset),
        "parse": f"{R}/parse/{wildcards.dataset}.parquet",
        "concreteness": f"{R}/concreteness/{wildcards.dataset}.parquet",
    }
    if recipe.get("negatives"):
        inputs["negatives"] = f"{R}/negatives/{wildcards.dataset}/{recipe['negatives']}.parquet"
    return inputs


def get_pretrain_inputs(wildcards):
    spec = config["bases"][wildcards.base]
    if spec["init"] == "scratch" and spec["train"]["steps"] > 0:
        return {"manifest": get_manifest(spec["dataset"])}
    return {}


def optional_arg(flag, inputs, key):
    """`--flag path` when the rule has input `key`, else nothing."""
    return f"{flag} {inputs[key]}" if key in inputs.keys() else ""


def negative_shards(generator):
    """Shards of a generator (LLM generators run sharded; rule-based ones in one job)."""
    return int(config["negatives"][generator].get("shards", 1))


SHARDED = [g for g in config["negatives"] if negative_shards(g) > 1]
UNSHARDED = [g for g in config["negatives"] if negative_shards(g) == 1]


# --- WiSE-FT -----------------------------------------------------------------------------------------
WISEFT = config.get("wiseft", {"methods": [], "alphas": []})


def wiseft_alpha(alpha):
    """alpha as it appears in model ids (one decimal: the trajectory's step is 0.1)."""
    if not 0 <= alpha <= 1 or round(alpha, 1) != alpha:
        raise ValueError(f"config key wiseft.alphas: {alpha} is not one of 0.0, 0.1, ..., 1.0")
    return f"{alpha:.1f}"


def wiseft_model_ids(datasets, seeds):
    """Every interpolated model of the configured methods and alphas (a method's own `datasets` wins)."""
    return [
        f"wiseft-{method}-a{wiseft_alpha(alpha)}/{dataset}/seed{seed}"
        for method in WISEFT["methods"]
        for dataset in get_recipe(method).get("datasets", datasets)
        for seed in seeds
        for alpha in WISEFT["alphas"]
    ]


def get_wiseft_inputs(wildcards):
    """The two endpoints: the method's base model and the fine-tuned model."""
    base = get_recipe(wildcards.method)["base"]
    finetuned = method_model_id(wildcards.method, wildcards.dataset, wildcards.seed)
    return {
        "base": f"{R}/models/{base_model_id(base)}/checkpoint.pt",
        "finetuned": f"{R}/models/{finetuned}/checkpoint.pt",
    }


# --- benchmarks --------------------------------------------------------------------------------------
def get_benchmark_dir(benchmark):
    spec = config["benchmarks"][benchmark]
    if spec["source"] == "files":
        return spec["path"]
    folder = f"zeroshot-{spec['attribute']}" if spec["kind"] == "zeroshot" else spec["kind"]
    if folder not in WORLD_BENCHMARKS:
        raise ValueError(f"config key benchmarks.{benchmark}: the world generates no {folder!r} benchmark")
    return f"{R}/benchmarks/world/{folder}"


def get_benchmark_files(benchmark):
    """The files that define a benchmark, so evaluation reruns when they change."""
    spec = config["benchmarks"][benchmark]
    return benchmark_files(spec["kind"], get_benchmark_dir(benchmark), spec)


# Every model is evaluated on the study's benchmarks, WiSE-FT models on `wiseft.benchmarks` (one
# evaluation job per model): (rule name, model-id regex, benchmarks).
EVAL_BENCHMARKS = config["study"]["benchmarks"]
WISEFT_BENCHMARKS = config.get("wiseft", {}).get("benchmarks", EVAL_BENCHMARKS)
EVAL_SETS = [
    ("evaluate", r"(?!wiseft-)[^/]+/[^/]+/seed\d+", EVAL_BENCHMARKS),
    ("evaluate_wiseft", r"wiseft-[^/]+/[^/]+/seed\d+", WISEFT_BENCHMARKS),
]


# Every benchmark the world generates (rule `benchmarks` writes them all at once), in its folder.
WORLD_BENCHMARKS = {
    "sugarcrepe": {"kind": "sugarcrepe"},
    "sugarcrepe_pp": {"kind": "sugarcrepe_pp"},
    "zeroshot-shape": {"kind": "zeroshot"},
    "zeroshot-colour": {"kind": "zeroshot"},
    "retrieval": {"kind": "retrieval"},
    "long_retrieval": {"kind": "long_retrieval"},
    "winoground": {"kind": "winoground"},
    "aro_relation": {"kind": "aro_relation"},
    "aro_attribution": {"kind": "aro_attribution"},
    "aro_order": {"kind": "aro_order"},
    "valse": {"kind": "valse", "pieces": ["relations", "foil-it"]},
    "linear_probe": {"kind": "linear_probe"},
}


def world_benchmark_outputs():
    root = f"{R}/benchmarks/world"
    return [f for folder, spec in WORLD_BENCHMARKS.items() for f in benchmark_files(spec["kind"], f"{root}/{folder}", spec)]


# --- the study ---------------------------------------------------------------------------------------
def model_ids(methods, datasets, seeds):
    """Every model of `methods` x datasets x seeds (a method's own `datasets` wins), plus their bases."""
    bases = {get_recipe(m)["base"] for m in methods}
    ids = [base_model_id(b) for b in sorted(bases)]
    ids += [
        method_model_id(m, d, s)
        for m in methods
        for d in get_recipe(m).get("datasets", datasets)
        for s in seeds
    ]
    return ids


def study_model_ids():
    study = config["study"]
    ids = model_ids(study["methods"], study["datasets"], study["seeds"])
    return ids + wiseft_model_ids(study["datasets"], study["seeds"])


def get_eval_jsons(models=None):
    """The result JSONs of `models` (default: the study's), each on its evaluation set's benchmarks."""
    models = study_model_ids() if models is None else models
    return [
        f"{R}/eval/{m}/{b}.json"
        for m in models
        for b in (WISEFT_BENCHMARKS if m.startswith("wiseft-") else EVAL_BENCHMARKS)
    ]


def ablation_eval_jsons(group):
    spec, study = config["ablations"][group], config["study"]
    models = model_ids(spec["methods"], spec.get("datasets", study["datasets"]), spec.get("seeds", study["seeds"]))
    return get_eval_jsons(models)


def study_datasets():
    """Every dataset a study model trains on (methods may name their own datasets)."""
    study = config["study"]
    return sorted({d for m in study["methods"] for d in get_recipe(m).get("datasets", study["datasets"])})


def study_generators():
    return sorted({get_recipe(m)["negatives"] for m in config["study"]["methods"]} - {None})


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
        "model": f"{R}/models/{base_model_id(base)}/checkpoint.pt",
    }
    for policy, name in concreteplant_generators().items():
        inputs[policy] = f"{R}/negatives/{wildcards.dataset}/{name}.parquet"
    return inputs


# Models whose training logs the claims read (training/ metrics): the study's fine-tuned models.
CLAIMS_LOSS_MODELS = [m for m in study_model_ids() if not m.startswith(("base-", "wiseft-"))]


def get_claims_inputs(wildcards):
    """Every study result with its per-item predictions, the training logs, and ConcretePlant's per-pair
    table of the base model when a claim reads it."""
    results = get_eval_jsons()
    inputs = {
        "results": results,
        "predictions": [p.removesuffix(".json") + ".predictions.parquet" for p in results],
        "losses": [f"{R}/models/{m}/losses.csv" for m in CLAIMS_LOSS_MODELS],
    }
    if any(str(c["metric"]).startswith("concreteplant/") for c in config.get("claims", [])):
        inputs["pairs"] = f"{R}/tables/concreteplant/{config['study']['datasets'][0]}.pairs.csv"
    return inputs


def get_study_outputs():
    datasets = config["study"]["datasets"]
    outputs = [f"{R}/tables/results.md", f"{R}/tables/correlations.md"]
    if config.get("claims"):
        outputs.append(f"{R}/tables/claims.md")
    outputs += [f"{R}/tables/parse/{d}.csv" for d in datasets]
    outputs += [f"{R}/tables/negatives/{d}/{g}.csv" for d in datasets for g in study_generators()]
    outputs += [f"{R}/tables/negatives/{d}/quality.csv" for d in datasets]
    outputs += [f"{R}/tables/datasets/{d}.csv" for d in study_datasets()]
    if concreteplant_generators():
        outputs += [f"{R}/tables/concreteplant/{d}.csv" for d in datasets]
    outputs += [f"{R}/tables/ablations/{g}/results.md" for g in config["study"].get("ablations", [])]
    return outputs


# --- multi-GPU training ---------------------------------------------------------------------------------
def get_launcher(wildcards, resources):
    """How a training job starts `compo train`: with more than one GPU (resource `gpu`) torchrun starts one
    process per GPU inside the job (`python -m compo train ...` on each, data-parallel: compo.distributed);
    otherwise the plain `compo` command."""
    gpus = int(getattr(resources, "gpu", 0) or 0)
    if gpus > 1:
        return f"torchrun --standalone --nproc_per_node {gpus} -m compo"
    return "compo"
