"""The study as a function of the config: which models it trains and evaluates, what each rule reads, which
negatives tables train, what the report holds.

The Snakemake rules (`workflow/rules/common.smk`) ask a `Study` these questions through one-line input
functions; `compo plan` asks it too. Every answer is a plain value (model ids, paths under `results`), computed
from the config alone: no file is read, nothing imports torch or Snakemake, so it is tested without a dry run.
Model ids and the files of a model folder come from `compo.layout`; what a training job reads follows from its
loss's contract in `compo.losses.LOSSES`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from compo import layout
from compo.claim_specs import study_claims
from compo.config import base_seeds, resolve_method
from compo.data import raw_paths
from compo.evaluate.kinds import benchmark_files, prepares
from compo.losses import IMAGE_NEEDS, LOSSES, PARSE_NEEDS
from compo.world.benchmarks import world_benchmarks

# the backends of a generator that runs an LLM (GPU hours per dataset)
LLM_BACKENDS = ("vllm", "transformers")


def is_url(value: Any) -> bool:
    """A config value that names a download, not a local file (norms, released files)."""
    return str(value).startswith(("http://", "https://"))


def norms_files(section: dict[str, Any]) -> list[str]:
    """The norms file of a config section as an input ([] for the shipped subset or a URL: not a file)."""
    norms = section.get("norms")
    return [] if not norms or is_url(norms) else [norms]


def released_negatives(section: dict[str, Any]) -> list[str]:
    """The released negatives file a generator reads (`negatives.<name>.path`) as an input ([] for the others)."""
    return [section["path"]] if section.get("path") else []


def runs_llm(spec: dict[str, Any]) -> bool:
    """A generator whose negatives an LLM writes (`backend` vllm or transformers)."""
    return spec.get("backend") in LLM_BACKENDS


def has_diffusion_images(spec: dict[str, Any]) -> bool:
    """A generator whose negatives get SDXL-Turbo images (an `images` mapping; `images: true` is the world's)."""
    return isinstance(spec.get("images"), dict)


class Study:
    """The study `config` describes (a validated, merged config, read-only while this object is used: recipes are
    cached)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.results: str = config["results"]
        self.base_seeds: list[int] = base_seeds(config)
        wiseft = config.get("wiseft") or {}
        self.wiseft_methods: list[str] = list(wiseft.get("methods", []))
        self.wiseft_alphas: list[float] = list(wiseft.get("alphas", []))
        # every model is evaluated on the study's benchmarks, WiSE-FT models on `wiseft.benchmarks`
        self.eval_benchmarks: list[str] = list(config["study"]["benchmarks"])
        self.wiseft_benchmarks: list[str] = list(wiseft.get("benchmarks", self.eval_benchmarks))
        # the evaluation sets whose files rule benchmark_set records; WiSE-FT's is the study's when equal
        self.benchmark_sets: dict[str, list[str]] = {"study": self.eval_benchmarks, "wiseft": self.wiseft_benchmarks}
        self._recipes: dict[str, dict[str, Any]] = {}

    # --- recipes and bases --------------------------------------------------------------------------------
    def recipe(self, method: str) -> dict[str, Any]:
        """Method `method`'s recipe, its parents merged in (compo.config.resolve_method; an unknown method is a
        ConfigError naming it). Resolved once per method: a DAG build asks ~1,700 times."""
        if method not in self._recipes:
            self._recipes[method] = resolve_method(self.config, method)
        return self._recipes[method]

    def method_datasets(self, method: str, datasets: list[str]) -> list[str]:
        """The datasets a method trains on: its own `datasets`, else `datasets`."""
        return self.recipe(method).get("datasets", datasets)

    def base_tag(self, base: str) -> str:
        """The middle part of a base's model ids: its pretraining dataset (init scratch) or its open_clip tag."""
        spec = self.config["bases"][base]
        return spec["dataset"] if spec["init"] == "scratch" else spec["init"]

    def base_model_id(self, base: str, seed: int | str | None = None) -> str:
        """The base a fine-tuning seed starts from (study.base_seeds); no seed: the first base seed's."""
        pretrain_seed = self.base_seeds[0] if seed is None else layout.base_seed_for(int(seed), self.base_seeds)
        return layout.base_model_id(base, self.base_tag(base), pretrain_seed)

    def checkpoint(self, model: str) -> str:
        return f"{layout.model_dir(self.results, model)}/{layout.CHECKPOINT}"

    def model_name(self, model: str) -> str:
        """The open_clip model of a model id (a base, a fine-tune or a WiSE-FT model)."""
        method = model.split("/")[0]
        if layout.is_base(method):
            return self.config["bases"][method.removeprefix(layout.BASE_PREFIX)]["model"]
        wiseft = layout.WISEFT_METHOD.match(method)
        if wiseft:
            method = wiseft["method"]
        return self.config["bases"][self.recipe(method)["base"]]["model"]

    # --- data ------------------------------------------------------------------------------------------------
    def manifest(self, dataset: str) -> str:
        return f"{self.results}/data/{dataset}/manifest.parquet"

    def dataset_inputs(self, dataset: str) -> dict[str, Any]:
        """The raw inputs of a dataset manifest: a world split, or the user's raw files (a glob or list: each)."""
        spec = self.config["datasets"][dataset]
        if spec["source"] == "world":
            return {"world": f"{self.results}/world/{spec['split']}/manifest.parquet"}
        return {"raw": [str(path) for path in raw_paths(spec["path"])]}

    def overlap_table(self, dataset: str) -> str:
        """Training waits for it: the rule fails when the dataset holds benchmark images the config does not accept."""
        return f"{self.results}/tables/overlap/{dataset}.csv"

    def overlap_benchmarks(self) -> list[str]:
        """Every benchmark a model of the study is evaluated on."""
        return list(dict.fromkeys([*self.eval_benchmarks, *self.wiseft_benchmarks]))

    def overlap_inputs(self, dataset: str) -> dict[str, Any]:
        """The manifest and the evaluation sets' records, which stand for their benchmarks' files as they do for
        an evaluation job: the check reruns when a file changes, and Snakemake's scheduler, which re-reads the
        size of every input of every waiting job at each scheduling round, has two files to read, not every
        benchmark file (hundreds in the paper study)."""
        records = [self.benchmark_set_record(self.eval_benchmarks), self.benchmark_set_record(self.wiseft_benchmarks)]
        return {"manifest": self.manifest(dataset), "benchmarks": list(dict.fromkeys(records))}

    # --- negatives -------------------------------------------------------------------------------------------
    def negative_shards(self, generator: str) -> int:
        """Shards of a generator (LLM generators run sharded; rule-based ones in one job)."""
        return int(self.config["negatives"][generator].get("shards", 1))

    def image_shards(self, generator: str) -> int:
        """Shards of a generator's SDXL-Turbo image negatives."""
        return int(self.config["negatives"][generator]["images"].get("shards", 1))

    def sharded_generators(self) -> list[str]:
        return [g for g in self.config["negatives"] if self.negative_shards(g) > 1]

    def unsharded_generators(self) -> list[str]:
        return [g for g in self.config["negatives"] if self.negative_shards(g) == 1]

    def diffusion_generators(self) -> list[str]:
        """Generators whose negatives get SDXL-Turbo images (real data): rule negative_images."""
        return [g for g in self.config["negatives"] if has_diffusion_images(self.config["negatives"][g])]

    def negatives_table(self, dataset: str, generator: str) -> str:
        """The negatives table training reads: with SDXL-Turbo images, the one that has them."""
        images = has_diffusion_images(self.config["negatives"][generator])
        return f"{self.results}/negatives/{dataset}/{generator}{'.images' if images else ''}.parquet"

    def negative_images(self, dataset: str, generator: str) -> str:
        """The folder of a generator's image negatives (compo negatives --images-dir)."""
        return f"{self.results}/negatives/{dataset}/{generator}"

    def generator_costs_gpus(self, generator: str) -> bool:
        """An LLM or SDXL generator: GPU hours per dataset, run only where a method trains on it (issue 42)."""
        spec = self.config["negatives"][generator]
        return runs_llm(spec) or has_diffusion_images(spec)

    def trained_generator_pairs(self) -> set[tuple[str, str]]:
        """(dataset, generator) of every negatives table a study or ablation method trains on."""
        datasets = self.config["study"]["datasets"]
        pairs = set()
        for method in self.study_and_ablation_methods():
            generator = self.recipe(method).get("negatives")
            if generator:
                pairs |= {(d, generator) for d in self.method_datasets(method, datasets)}
        return pairs

    def dataset_generators(self, dataset: str) -> list[str]:
        """The generators a dataset's tables (and quality report) cover: every rule-based one, and the GPU ones
        only where a method trains on their negatives of that dataset."""
        trained = self.trained_generator_pairs()
        return [g for g in self.config["negatives"] if not self.generator_costs_gpus(g) or (dataset, g) in trained]

    def study_generators(self) -> list[str]:
        """The generators the study's own methods train on."""
        return sorted({self.recipe(m)["negatives"] for m in self.config["study"]["methods"]} - {None})

    def negatives_quality_inputs(self, dataset: str) -> list[str]:
        return [f"{self.results}/tables/negatives/{dataset}/{g}.csv" for g in self.dataset_generators(dataset)]

    # --- training --------------------------------------------------------------------------------------------
    def val_benchmark(self, recipe: dict[str, Any]) -> str | None:
        """The zero-shot benchmark a recipe (or base) validates on while it trains (train.val_benchmark)."""
        return recipe.get("train", {}).get("val_benchmark")

    def val_benchmark_inputs(self, recipe: dict[str, Any]) -> dict[str, list[str]]:
        name = self.val_benchmark(recipe)
        return {"val_benchmark": self.benchmark_files(name)} if name else {}

    def val_benchmark_entry(self, recipe: dict[str, Any]) -> dict[str, Any] | None:
        """What `compo train --val-benchmark` reads: name, config entry, folder, the config's templates."""
        name = self.val_benchmark(recipe)
        if not name:
            return None
        return {"name": name, "spec": self.config["benchmarks"][name], "dir": self.benchmark_dir(name),
                "templates": self.config.get("zeroshot_templates")}

    def train_inputs(self, method: str, dataset: str, seed: int | str) -> dict[str, Any]:
        """What a fine-tuning job reads: its base checkpoint, the training manifest and, by what its loss needs
        (compo.losses.LOSSES), the parse table, the negatives table and their images."""
        recipe = self.recipe(method)
        needs = LOSSES[recipe["loss"]].needs
        inputs = {"init": self.checkpoint(self.base_model_id(recipe["base"], seed)),
                  "manifest": self.manifest(dataset), "overlap": self.overlap_table(dataset)}
        if needs & PARSE_NEEDS:
            inputs["parse"] = f"{self.results}/parse/{dataset}.parquet"
        generator = recipe.get("negatives")
        if generator:
            inputs["negatives"] = self.negatives_table(dataset, generator)
            if needs & IMAGE_NEEDS and self.config["negatives"][generator].get("images") is True:
                inputs["negative_images"] = self.negative_images(dataset, generator)
        return inputs | self.val_benchmark_inputs(recipe)

    def pretrain_inputs(self, base: str) -> dict[str, Any]:
        """A base trained here: its manifest; a released base's local weights file (replacing it reruns the
        export); none for an open_clip tag."""
        spec = self.config["bases"][base]
        if spec["init"] == "scratch" and spec["train"]["steps"] > 0:
            dataset = spec["dataset"]
            return {"manifest": self.manifest(dataset), "overlap": self.overlap_table(dataset)} | (
                self.val_benchmark_inputs(spec))
        return {"weights": spec["weights"]} if spec.get("weights") else {}

    # --- WiSE-FT ---------------------------------------------------------------------------------------------
    def wiseft_model_ids(self, datasets: list[str], seeds: list[int]) -> list[str]:
        """Every interpolated model of the configured methods and alphas (a method's own `datasets` wins)."""
        return [layout.wiseft_model_id(method, alpha, dataset, seed)
                for method in self.wiseft_methods
                for dataset in self.method_datasets(method, datasets)
                for seed in seeds
                for alpha in self.wiseft_alphas]

    def study_wiseft_model_ids(self) -> list[str]:
        study = self.config["study"]
        return self.wiseft_model_ids(study["datasets"], study["seeds"])

    def wiseft_inputs(self, method: str, dataset: str, seed: int | str) -> dict[str, str]:
        """The two endpoints: the method's base model and the fine-tuned model."""
        return {"base": self.checkpoint(self.base_model_id(self.recipe(method)["base"], seed)),
                "finetuned": self.checkpoint(layout.model_id(method, dataset, seed))}

    # --- benchmarks ------------------------------------------------------------------------------------------
    def benchmark_dir(self, benchmark: str) -> str:
        return layout.benchmark_dir(self.results, self.config["benchmarks"][benchmark])

    def benchmark_files(self, benchmark: str) -> list[str]:
        """The files that define a benchmark, so evaluation reruns when they change."""
        spec = self.config["benchmarks"][benchmark]
        return benchmark_files(spec["kind"], self.benchmark_dir(benchmark), spec)

    def world_benchmark_outputs(self) -> list[str]:
        """Every file that defines a world benchmark (rule `benchmarks` writes them all at once)."""
        return [f for spec in world_benchmarks().values()
                for f in benchmark_files(spec["kind"], layout.world_benchmark_dir(self.results, spec), spec)]

    def prepared_file(self, benchmark: str) -> str | None:
        """What rule prepare_benchmark writes for `benchmark`: its kind's model-independent work, done once for
        every evaluation (ARO Order's caption perturbations); None when the kind has none."""
        kind = self.config["benchmarks"][benchmark]["kind"]
        return f"{self.results}/benchmarks/prepared/{benchmark}.json" if prepares(kind) else None

    def benchmark_set_contents(self, name: str) -> dict[str, list[str]]:
        """Evaluation set `name`'s (one of benchmark_sets) files by benchmark, each benchmark's prepared file with
        them: what rule benchmark_set records."""
        return {b: [f for f in [*self.benchmark_files(b), self.prepared_file(b)] if f]
                for b in self.benchmark_sets[name]}

    def benchmark_set_files(self, name: str) -> list[str]:
        """Rule benchmark_set's inputs."""
        return [f for files in self.benchmark_set_contents(name).values() for f in files]

    def benchmark_set_record(self, benchmarks: Iterable[str]) -> str:
        """The record an evaluation job of `benchmarks` (one of benchmark_sets) reads in place of their files."""
        name = "study" if list(benchmarks) == list(self.eval_benchmarks) else "wiseft"
        return f"{self.results}/benchmarks/sets/{name}.json"

    def benchmark_entries(self, benchmarks: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The benchmarks of an evaluation job, each with its config entry, folder and prepared file (if any)."""
        entries = {b: {"spec": self.config["benchmarks"][b], "dir": self.benchmark_dir(b)} for b in benchmarks}
        for benchmark, entry in entries.items():
            if prepared := self.prepared_file(benchmark):
                entry["prepared"] = prepared
        return entries

    # --- the study's models ----------------------------------------------------------------------------------
    def model_ids(self, methods: list[str], datasets: list[str], seeds: list[int]) -> list[str]:
        """Every model of `methods` x datasets x seeds (a method's own `datasets` wins), after the bases they
        start from."""
        bases = {self.recipe(m)["base"] for m in methods}
        ids = sorted({self.base_model_id(b, s) for b in bases for s in seeds})
        ids += [layout.model_id(m, d, s) for m in methods for d in self.method_datasets(m, datasets) for s in seeds]
        return ids

    def study_model_ids(self) -> list[str]:
        """Every model the study evaluates: its methods' (bases included), study.bases', its WiSE-FT models."""
        study = self.config["study"]
        ids = self.model_ids(study["methods"], study["datasets"], study["seeds"])
        ids += sorted({self.base_model_id(b, s) for b in study.get("bases", []) for s in study["seeds"]} - set(ids))
        return ids + self.study_wiseft_model_ids()

    def eval_index(self, model: str) -> str:
        return f"{self.results}/eval/{model}/{layout.EVAL_INDEX}"

    def eval_indexes(self, models: list[str] | None = None) -> list[str]:
        """The evaluation index of each of `models` (default: the study's): written last by the model's evaluation
        job, it stands for every result JSON of its benchmarks (compo.layout.EVAL_INDEX), one DAG edge per model."""
        return [self.eval_index(m) for m in (self.study_model_ids() if models is None else models)]

    def ablation_groups(self) -> list[str]:
        """The ablation groups the study runs (study.ablations)."""
        return list(self.config["study"].get("ablations", []))

    def ablation_scope(self, group: str) -> tuple[list[str], list[int]]:
        """(datasets, seeds) of an ablation group: its own, or the study's."""
        spec, study = self.config["ablations"][group], self.config["study"]
        return spec.get("datasets", study["datasets"]), spec.get("seeds", study["seeds"])

    def ablation_model_ids(self, group: str) -> list[str]:
        return self.model_ids(self.config["ablations"][group]["methods"], *self.ablation_scope(group))

    def study_and_ablation_methods(self) -> list[str]:
        """The study's methods, then those only its ablations train (each once)."""
        ablated = [m for group in self.ablation_groups() for m in self.config["ablations"][group]["methods"]]
        return list(dict.fromkeys([*self.config["study"]["methods"], *ablated]))

    def method_model_ids(self, method: str) -> list[str]:
        """The models of one method (its bases included) at the study's datasets and seeds, or for a method only
        an ablation trains, at that ablation's."""
        study = self.config["study"]
        if method in study["methods"]:
            return self.model_ids([method], study["datasets"], study["seeds"])
        ids = [m for g in self.ablation_groups() if method in self.config["ablations"][g]["methods"]
               for m in self.model_ids([method], *self.ablation_scope(g))]
        return list(dict.fromkeys(ids))

    def reproduction_only_indexes(self) -> list[str]:
        """The evaluation indexes of the study's ablation models that are not study models: the reproduction
        table binds the seeds' cells they reproduce (DeGLA's Table 7, ...), the study's own tables leave them out."""
        study = set(self.study_model_ids())
        ablated = {m for group in self.ablation_groups() for m in self.ablation_model_ids(group)}
        return self.eval_indexes(sorted(ablated - study))

    def trained_model_ids(self) -> list[str]:
        """The study's models that are trained here or exported (not WiSE-FT): their training logs."""
        return [m for m in self.study_model_ids() if not layout.is_wiseft(m)]

    def claims_loss_models(self) -> list[str]:
        """Models whose training logs the claims read (training/ metrics): the study's fine-tuned models."""
        return [m for m in self.trained_model_ids() if not layout.is_base(m)]

    # --- tables, figures and the report ----------------------------------------------------------------------
    def study_datasets(self) -> list[str]:
        """Every dataset a study model trains on (methods may name their own datasets)."""
        study = self.config["study"]
        return sorted({d for m in study["methods"] for d in self.method_datasets(m, study["datasets"])})

    def report_datasets(self) -> list[str]:
        """The study's training datasets, none when it trains nothing (a study of released bases)."""
        study = self.config["study"]
        return list(study["datasets"]) if study["methods"] else []

    def concreteplant_generators(self) -> dict[str, str]:
        """ConcretePlant's datasets in the config as {policy: negatives entry} (one per policy)."""
        found: dict[str, str] = {}
        for name, spec in self.config["negatives"].items():
            generator = spec["generator"]
            if generator.startswith("concreteplant"):
                found.setdefault(spec.get("policy") or generator.rsplit("-", 1)[-1], name)
        return found

    def concreteplant_dataset(self) -> str:
        """Where seed 002's Table 1 is measured: the dataset ConcretePlant's methods train on (D_hc / D_lc / D_wo
        are built from it; paper: Karpathy train's longest captions), else the study's first."""
        names = set(self.concreteplant_generators().values())
        trained = sorted(d for d, g in self.trained_generator_pairs() if g in names)
        return trained[0] if trained else self.config["study"]["datasets"][0]

    def concreteplant_base(self) -> str:
        """The base ConcretePlant's Table 1 scores: `clip` when the config has it, else the first by name."""
        bases = self.config["bases"]
        return "clip" if "clip" in bases else sorted(bases)[0]

    def concreteplant_table_inputs(self, dataset: str) -> dict[str, str]:
        inputs = {"concreteness": f"{self.results}/concreteness/{dataset}.parquet",
                  "manifest": self.manifest(dataset),
                  "model": self.checkpoint(self.base_model_id(self.concreteplant_base()))}
        for policy, name in self.concreteplant_generators().items():
            inputs[policy] = self.negatives_table(dataset, name)
        return inputs

    def data_table_kinds(self, kinds: Iterable[str]) -> list[str]:
        """The per-dataset report tables of `kinds` this study writes (ConcretePlant's only with its generators)."""
        return [k for k in kinds if k != "concreteplant" or self.concreteplant_generators()]

    def data_table_datasets(self, kind: str) -> list[str]:
        """The datasets a per-dataset report table is written for."""
        if kind == "concreteplant":
            return [self.concreteplant_dataset()] if self.report_datasets() else []
        return self.report_datasets()

    def claims(self) -> list[dict[str, Any]]:
        return study_claims(self.config)

    def claims_inputs(self) -> dict[str, Any]:
        """Every study model's evaluation index (its results and per-item predictions), the training logs, and
        ConcretePlant's per-pair table of the base model when a claim reads it."""
        inputs: dict[str, Any] = {
            "results": self.eval_indexes(),
            "losses": [f"{layout.model_dir(self.results, m)}/{layout.LOSSES_CSV}" for m in self.claims_loss_models()],
        }
        if any(str(c["metric"]).startswith("concreteplant/") for c in self.claims()):
            inputs["pairs"] = f"{self.results}/tables/concreteplant/{self.concreteplant_dataset()}.pairs.csv"
        return inputs

    def figure_inputs(self) -> dict[str, Any]:
        """The tables every figure reads; per-model training logs of every trained (non-WiSE-FT) model."""
        R = self.results
        inputs: dict[str, Any] = {
            "summary": f"{R}/tables/results.csv",
            "claims": f"{R}/tables/claims.csv",
            "effects": f"{R}/tables/effects.csv",
            "correlations": f"{R}/tables/correlations.csv",
            "losses": [f"{layout.model_dir(R, m)}/{layout.LOSSES_CSV}" for m in self.trained_model_ids()],
            "quality": [f"{R}/tables/negatives/{d}/quality.csv" for d in self.report_datasets()],
            "attributes": [f"{R}/tables/datasets/{d}.csv" for d in self.study_datasets()],
            "pairs": [],
        }
        if self.concreteplant_generators():
            inputs["pairs"] = [f"{R}/tables/concreteplant/{d}.pairs.csv"
                               for d in self.data_table_datasets("concreteplant")]
        return inputs

    def study_outputs(self) -> list[str]:
        """The tables rule all asks for (the figures and report pages: report_outputs)."""
        R, datasets, generators = self.results, self.report_datasets(), self.study_generators()
        outputs = [f"{R}/tables/results.md", f"{R}/tables/correlations.md"]
        if self.claims():
            outputs.append(f"{R}/tables/claims.md")
        outputs += [f"{R}/tables/parse/{d}.csv" for d in datasets]
        outputs += [f"{R}/tables/negatives/{d}/{g}.csv"
                    for d in datasets for g in generators if g in self.dataset_generators(d)]
        outputs += [f"{R}/tables/negatives/{d}/quality.csv" for d in datasets]
        outputs += [f"{R}/tables/datasets/{d}.csv" for d in self.study_datasets()]
        if self.concreteplant_generators():
            outputs += [f"{R}/tables/concreteplant/{d}.csv" for d in self.data_table_datasets("concreteplant")]
        outputs += [f"{R}/tables/ablations/{g}/results.md" for g in self.ablation_groups()]
        return outputs

    def report_outputs(self, figures: Iterable[str], table_kinds: Iterable[str]) -> list[str]:
        """Every figure (PNG and PDF) and report page of the study: `figures` the figure names, `table_kinds`
        the per-dataset tables the report renders (report.smk's FIGURE_REPORT and DATA_TABLES)."""
        R = self.results
        outputs = [f"{R}/figures/{name}.{ext}" for name in figures for ext in ("png", "pdf")]
        outputs += [f"{R}/report/claims.html", f"{R}/report/results.html", f"{R}/report/workflow.rst"]
        outputs += [f"{R}/report/{kind}/{d}.html"
                    for kind in self.data_table_kinds(table_kinds) for d in self.data_table_datasets(kind)]
        return outputs
