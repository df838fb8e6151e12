"""Loading, validating and resolving the study configuration.

The JSON schema (`workflow/schemas/config.schema.yaml`) checks keys and types; `check_config` adds the
cross-references a schema cannot express (a method's parent, base and negatives exist, the study names
defined datasets and methods). `resolve_method` flattens a method's inheritance chain into one recipe.
YAML files are read strictly (`load_yaml`): a key given twice in one mapping is an error naming the key
and both lines, not a silent override. Every problem is a `ConfigError` whose one-line message names the
file or the key.
"""

from __future__ import annotations

import copy
import difflib
import functools
import logging
from pathlib import Path
from typing import Any

import yaml

from compo.artifacts import resolve_hub_paths
from compo.claim_specs import check_claims
from compo.composites import check_composites
from compo.config_names import CONFIG_SCHEMA, ConfigError, safe_name_problem  # noqa: F401  (re-exported)
from compo.evaluate.kinds import check_keys, declared, kind_keys
from compo.layout import BASE_PREFIX, world_benchmark_folder
from compo.losses import check_recipe, method_keys_schema
from compo.paths import OutsideRootError
from compo.reproduction import accumulated_reported, check_reported
from compo.schema import problems
from compo.world.benchmarks import world_benchmarks

log = logging.getLogger(__name__)


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping."""


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise ConfigError(f"line {line}: duplicate key {key!r} (first given on line {first_line[key]}); "
                              "a YAML mapping takes each key once")
        first_line[key] = line
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=True))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


class _FastStrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """_StrictLoader on libyaml's parser where PyYAML has it: ~6x faster on config/paper.yaml, which every DAG
    build reads. A file it refuses is read again by _StrictLoader, whose messages load_yaml reports."""


_FastStrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content; duplicate keys and syntax errors are ConfigErrors naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path}: not UTF-8 text ({error})") from error
    try:
        try:
            return yaml.load(text, Loader=_FastStrictLoader)  # noqa: S506  (a SafeLoader subclass)
        except yaml.YAMLError:
            return yaml.load(text, Loader=_StrictLoader)  # noqa: S506  (raises, with the pure parser's message)
    except ConfigError as error:
        raise ConfigError(f"config file {path} {error}") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path}{where}: {error.problem or error.context}"
                          + (" (YAML indents with spaces, not tabs)" if "\\t" in str(error.problem) else "")
                          ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path}: not valid YAML ({error})") from None


@functools.cache
def _schema() -> dict[str, Any]:
    return yaml.safe_load(CONFIG_SCHEMA.read_text())


@functools.cache
def config_schema() -> dict[str, Any]:
    """The config schema: workflow/schemas/config.schema.yaml, with each loss's own recipe keys under
    `methods` (declared by the loss modules, `compo.losses.method_keys_schema`) and the benchmark kinds the
    modules of `compo.evaluate` declare (`compo.evaluate.kinds`)."""
    schema = copy.deepcopy(_schema())
    method = schema["properties"]["methods"]["additionalProperties"]
    method["properties"] |= method_keys_schema()
    benchmark = schema["properties"]["benchmarks"]["additionalProperties"]
    benchmark["properties"]["kind"]["enum"] = list(declared())
    # any value here: an entry is checked against its own kind's keys (`_check_benchmark_keys`)
    benchmark["properties"] |= {key: {"description": f"read by kind {', '.join(kinds)}"}
                                for key, kinds in kind_keys().items()}
    return schema


def _check_benchmark_keys(config: dict[str, Any]) -> None:
    """Each benchmark entry's own keys against its kind's declaration: a key of another kind is an error (it
    would be silently unused), as is a value its kind's schema refuses."""
    common = _schema()["properties"]["benchmarks"]["additionalProperties"]["properties"]
    for name, spec in config["benchmarks"].items():
        for key, message in check_keys(spec, common):
            raise ConfigError(f"config key benchmarks.{name}.{key}: {message}")


def validate_schema(config: dict[str, Any]) -> None:
    for key, message in problems(config_schema(), config)[:1]:
        raise ConfigError(f"config key {key or '<top level>'}: {message}")


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# The method recipes both studies share: under every study's own files, in load_config and in the Snakefile
# (`with_shared_recipes`), so config.yaml and paper.yaml each keep only the recipes that differ.
SHARED_RECIPES = Path(__file__).resolve().parents[2] / "config" / "recipes.yaml"


def with_shared_recipes(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with config/recipes.yaml's recipes under its own `methods` (the study's keys win, key by key);
    the study's own recipes first (the parents the shared ones name: a check reports a parent's problem at
    the parent), every other key and the keys' order as `config` has them."""
    shared = load_yaml(SHARED_RECIPES) or {}
    if not isinstance(shared, dict) or set(shared) != {"methods"} or not isinstance(shared["methods"], dict):
        raise ConfigError(f"config file {SHARED_RECIPES}: expected one top-level key, `methods`, mapping "
                          "recipe names to recipes (the recipes both studies share)")
    own = config.get("methods", {})
    if not isinstance(own, dict):  # the schema names it
        return config
    methods = {name: deep_merge(shared["methods"][name], spec)
               if name in shared["methods"] and isinstance(spec, dict) else spec for name, spec in own.items()}
    methods |= {name: copy.deepcopy(spec) for name, spec in shared["methods"].items() if name not in own}
    return {**config, "methods": methods}


def train_mem_mb(config: dict[str, Any], method: str) -> int | None:
    """mem_mb a fine-tuning job of `method` asks Snakemake for: its entry of `memory_mb.train`, else that
    table's default; None when the config has no such table (the profile's default-resources apply)."""
    table = (config.get("memory_mb") or {}).get("train") or {}
    return table.get(method, table.get("default"))


def resolve_method(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The recipe of method `name` with every parent's keys merged in (child wins)."""
    methods = config["methods"]
    chain: list[str] = []
    current: str | None = name
    while current is not None:
        if current not in methods:
            where = f"methods.{chain[-1]}.parent" if chain else "study.methods"
            raise ConfigError(f"config key {where}: unknown method {current!r}")
        if current in chain:
            raise ConfigError(f"config key methods.{name}.parent: inheritance cycle {' -> '.join(chain)}")
        chain.append(current)
        current = methods[current].get("parent")
    recipe: dict[str, Any] = {}
    for link in reversed(chain):
        recipe = deep_merge(recipe, {k: v for k, v in methods[link].items() if k != "parent"})
    recipe["name"] = name
    if recipe.get("negatives"):
        # study-wide, so every method trains on the same kind of negatives; in the recipe, so a saved
        # run state trained under the other setting is not continued
        recipe["drop_true_negatives"] = bool(config.get("hard_negatives", {}).get("drop_true", False))
    if recipe.get("online_negatives"):
        # the trainer draws these every step, so it needs the generators' config entries
        recipe["online_negative_specs"] = {
            n: config["negatives"][n] for n in recipe["online_negatives"] if n in config["negatives"]
        }
    return recipe


REQUIRED_RECIPE_KEYS = ("base", "loss", "train")
REQUIRED_TRAIN_KEYS = ("steps", "batch_size", "lr", "warmup", "weight_decay")


def truncate_words(config: dict[str, Any], method: str) -> int | None:
    """The evaluation's text protocol for a method's models: cut texts to this many words (LongCLIP-70's
    `text.truncate_words`), or None; bases and WiSE-FT models (not under `methods`) keep whole texts."""
    recipe = resolve_method(config, method) if method in config["methods"] else {}
    return (recipe.get("text") or {}).get("truncate_words")


def base_seeds(config: dict[str, Any]) -> list[int]:
    """The pretraining seeds of the bases (config `study.base_seeds`, default [seed]): the first is the base
    every base-level analysis reads (ConcretePlant's pairs)."""
    return list(config["study"].get("base_seeds") or [config["seed"]])


def _check_base_seeds(seeds: list[int], bases: list[int], where: str) -> None:
    """Every base must start equally many of `seeds` (the two-stage bootstrap's balanced design)."""
    from compo.layout import base_seed_for

    counts = {base: 0 for base in bases}
    for seed in seeds:
        counts[base_seed_for(seed, bases)] += 1
    if len(set(counts.values())) != 1:
        spread = ", ".join(f"base seed {b}: {n}" for b, n in counts.items())
        raise ConfigError(f"config key {where}: seed s fine-tunes base seed study.base_seeds[s mod "
                          f"{len(bases)}], which gives the bases unequal numbers of seeds ({spread}); use "
                          f"seeds that give each base as many")


def check_config(config: dict[str, Any]) -> None:
    """Cross-reference checks after the schema; raise ConfigError naming the key."""
    _check_repeats(config)
    study = config["study"]
    for key, pool in (("datasets", "datasets"), ("methods", "methods"), ("benchmarks", "benchmarks")):
        for name in study[key]:
            if name not in config[pool]:
                raise ConfigError(f"config key study.{key}: {name!r} is not defined under {pool}")
    for key, pool in (("methods", "methods"), ("benchmarks", "benchmarks")):
        for name in config.get("wiseft", {}).get(key, []):
            if name not in config[pool]:
                raise ConfigError(f"config key wiseft.{key}: {name!r} is not defined under {pool}")
    bases = base_seeds(config)
    if len(set(bases)) != len(bases):
        raise ConfigError(f"config key study.base_seeds: {bases} repeats a seed")
    _check_base_seeds(study["seeds"], bases, "study.seeds")
    for group in study.get("ablations", []):
        if group not in config.get("ablations", {}):
            raise ConfigError(f"config key study.ablations: {group!r} is not defined under ablations")
    for group, spec in config.get("ablations", {}).items():
        if "seeds" in spec:
            _check_base_seeds(spec["seeds"], bases, f"ablations.{group}.seeds")
        for key, pool in (("methods", "methods"), ("datasets", "datasets")):
            for name in spec.get(key, []):
                if name not in config[pool]:
                    raise ConfigError(f"config key ablations.{group}.{key}: {name!r} is not defined under {pool}")
    for index, entry in enumerate(config.get("overlap", {}).get("accept", [])):
        for key, pool in (("dataset", "datasets"), ("benchmark", "benchmarks")):
            if entry[key] not in config[pool]:
                raise ConfigError(f"config key overlap.accept[{index}].{key}: {entry[key]!r} is not defined "
                                  f"under {pool}")
    for name in config.get("memory_mb", {}).get("train", {}):
        if name != "default" and name not in config["methods"]:
            raise ConfigError(f"config key memory_mb.train.{name}: not a method (expected default or a name "
                              f"under methods)")
    _check_norms(config["concreteness"], "concreteness")
    for name, spec in config["negatives"].items():
        _check_norms(spec, f"negatives.{name}")
    for base_name, base in config["bases"].items():
        if "train" in base:
            _check_schedule(base["train"], f"bases.{base_name}.train")
            _check_validation(base["train"], f"bases.{base_name}.train", config)
        if base["init"] == "scratch":
            if "dataset" not in base or "train" not in base:
                raise ConfigError(f"config key bases.{base_name}: init scratch needs dataset and train")
            if base["dataset"] not in config["datasets"]:
                raise ConfigError(f"config key bases.{base_name}.dataset: unknown dataset {base['dataset']!r}")
    from compo.negatives import build_generator  # each generator validates its own options

    for name, spec in config["negatives"].items():
        try:
            build_generator(spec, where=f"negatives.{name}")
        except ValueError as error:
            raise ConfigError(str(error)) from error
    for method in config["methods"]:
        recipe = resolve_method(config, method)
        for key in REQUIRED_RECIPE_KEYS:
            if key not in recipe:
                raise ConfigError(f"config key methods.{method}.{key}: missing (not set here or by a parent)")
        for key in REQUIRED_TRAIN_KEYS:
            if key not in recipe["train"]:
                raise ConfigError(f"config key methods.{method}.train.{key}: missing")
        if recipe["base"] not in config["bases"]:
            raise ConfigError(f"config key methods.{method}.base: unknown base {recipe['base']!r}")
        _check_schedule(recipe["train"], f"methods.{method}.train")
        _check_validation(recipe["train"], f"methods.{method}.train", config)
        negatives = recipe.get("negatives")
        if negatives is not None and negatives not in config["negatives"]:
            raise ConfigError(f"config key methods.{method}.negatives: unknown generator {negatives!r}")
        if negatives is not None and recipe.get("k") is not None and recipe["k"] > config["negatives"][negatives]["k"]:
            # the trainer reads at most the k negatives per caption the generator wrote
            raise ConfigError(f"config key methods.{method}.k: {recipe['k']} negatives per caption, but "
                              f"negatives.{negatives} writes only k = {config['negatives'][negatives]['k']}")
        for name in recipe.get("online_negatives") or []:
            if name not in config["negatives"]:
                raise ConfigError(f"config key methods.{method}.online_negatives: {name!r} is not under negatives")
        for key, message in check_recipe(recipe):
            raise ConfigError(f"config key methods.{method}.{key}: {message}")
    _check_base_models(config)
    _check_text_positions(config)
    for key, message in check_composites(config.get("composites", {}), list(config["benchmarks"])):
        raise ConfigError(f"config key {key}: {message}")
    for key, message in check_claims(config):
        raise ConfigError(f"config key {key}: {message}")
    methods = [*config["methods"], *(f"{BASE_PREFIX}{name}" for name in config["bases"])]
    for key, message in check_reported(config.get("reported", []), methods, list(config["benchmarks"]),
                                       list(config.get("composites", {}))):
        raise ConfigError(f"config key {key}: {message}")
    if any(b["source"] == "world" for b in config["benchmarks"].values()) or any(
        d["source"] == "world" for d in config["datasets"].values()
    ):
        if "world" not in config:
            raise ConfigError("config key world: datasets or benchmarks use source world but world is missing")
    for name, dataset in config["datasets"].items():
        if dataset["source"] == "world" and dataset.get("split") not in config.get("world", {}).get("splits", {}):
            raise ConfigError(f"config key datasets.{name}.split: must name a world split")
    _check_world_benchmarks(config)


def _check_repeats(config: dict[str, Any]) -> None:
    """Each entry of these lists is one run (a seed, a method, an alpha, a benchmark): a repeat would train
    and evaluate the same models twice and fail only at aggregate, after the whole study."""
    study, wiseft = config["study"], config.get("wiseft", {})
    lists = [(f"study.{key}", study.get(key, [])) for key in ("seeds", "methods", "datasets", "benchmarks",
                                                                "ablations")]
    lists += [(f"wiseft.{key}", wiseft.get(key, [])) for key in ("methods", "alphas", "benchmarks")]
    lists += [(f"ablations.{group}.{key}", spec[key]) for group, spec in config.get("ablations", {}).items()
              for key in ("seeds", "methods", "datasets") if key in spec]
    lists += [(f"methods.{name}.datasets", spec["datasets"]) for name, spec in config["methods"].items()
              if "datasets" in spec]
    for key, values in lists:
        seen: list[Any] = []
        for value in values:
            if value in seen:
                raise ConfigError(f"config key {key}: {value!r} is given twice (each entry is one run; a repeat "
                                  "would train and evaluate the same models twice)")
            seen.append(value)


def _check_base_models(config: dict[str, Any]) -> None:
    """A base's model is an open_clip model config (open_clip's own or compo's), known without importing torch."""
    from compo.architectures import COMPO_CONFIGS, config_files

    known = config_files()
    for name, base in config["bases"].items():
        if base["model"] not in known:
            near = difflib.get_close_matches(base["model"], list(known), n=4, cutoff=0.6)
            raise ConfigError(f"config key bases.{name}.model: {base['model']!r} is not an open_clip model config "
                              f"(open_clip's model_configs or {COMPO_CONFIGS})"
                              + (f"; near names: {', '.join(near)}" if near else ""))
        if base.get("file") and not base.get("hub"):
            raise ConfigError(f"config key bases.{name}.file: names a file of the hub repository, but bases.{name}.hub "
                              "is not set")
        if base.get("weights") and (base.get("hub") or base.get("file")):
            raise ConfigError(f"config key bases.{name}.weights: a local file, or hub (and file): not both")
        if base["init"] == "scratch" and (base.get("weights") or base.get("hub") or base.get("format")):
            raise ConfigError(f"config key bases.{name}.init: scratch takes no weights (hub, file, weights, format)")
    if not config["study"]["methods"] and not config["study"].get("bases"):
        raise ConfigError("config key study.methods: [] should be non-empty (or study.bases name the bases to "
                          "evaluate as they are)")
    for name in config["study"].get("bases", []):
        if name not in config["bases"]:
            raise ConfigError(f"config key study.bases: {name!r} is not defined under bases")


def _check_text_positions(config: dict[str, Any]) -> None:
    """LongCLIP's text keys against the base model's text positions (compo.adapt applies them in the job)."""
    from compo.architectures import text_context_length

    for method in config["methods"]:
        recipe = resolve_method(config, method)
        text = recipe.get("text") or {}
        if not text or recipe["base"] not in config["bases"]:
            continue
        model = config["bases"][recipe["base"]]["model"]
        length, where = text_context_length(model), f"config key methods.{method}.text"
        context = text.get("context_length") or length
        if context != length:
            if context < length:
                raise ConfigError(f"{where}.context_length: {context} must exceed the {length} positions of {model} "
                                  f"(bases.{recipe['base']}.model; equal to them: no stretch)")
            keep = text.get("keep_positions", 0)
            if not 0 <= keep <= length - 2:
                raise ConfigError(f"{where}.keep_positions: {keep} must be in [0, {length - 2}] for the "
                                  f"{length}-position embedding of {model}")
        if text.get("freeze_positions", 0) > context:
            raise ConfigError(f"{where}.freeze_positions: {text['freeze_positions']} exceeds the {context} positions "
                              f"of the text embedding ({model}" + (f" stretched to {context})" if context != length
                                                                    else ")"))


def check_lora_targets(config: dict[str, Any]) -> None:
    """Every LoRA target pattern of a method matches a weight of its base model: the parameter names come
    from the model built on PyTorch's meta device (compo.architectures.weight_shapes; imports torch unless
    cached), the matching from compo.lora_patterns (torch-free: a warm DAG build imports no torch)."""
    from compo.architectures import weight_shapes
    from compo.lora_patterns import DEFAULT_LORA_TARGETS, lora_matches

    for method in config["methods"]:
        recipe = resolve_method(config, method)
        if not recipe.get("lora"):
            continue
        model = config["bases"][recipe["base"]]["model"]
        patterns = recipe["lora"].get("targets") or DEFAULT_LORA_TARGETS
        try:
            shapes = weight_shapes(model)
        except (OSError, RuntimeError, ValueError, ImportError) as error:  # e.g. a text tower only the Hub has
            log.warning("methods.%s.lora.targets: not checked before the jobs, %s cannot be built offline here "
                        "(%s); the training job checks them", method, model, str(error).splitlines()[0][:200])
            continue
        for pattern, hits in lora_matches(shapes, patterns).items():
            if not hits:
                raise ConfigError(f"config key methods.{method}.lora.targets: {pattern!r} matches no weight matrix "
                                  f"or square convolution kernel of {model} (bases.{recipe['base']}.model)")


def check_before_compute(config: dict[str, Any]) -> None:
    """The checks that need more than the config's text, run once at DAG build before any job: LoRA targets
    against the base models' parameter names (imports torch), and a results root this user can write."""
    from compo.results_root import check_writable

    check_lora_targets(config)
    check_writable(config["results"])


def _check_world_benchmarks(config: dict[str, Any]) -> None:
    """A `source: world` benchmark must be one the world writes (compo.world.benchmarks.WORLD_BENCHMARKS)."""
    generated = world_benchmarks()
    for name, spec in config["benchmarks"].items():
        if spec["source"] != "world":
            continue
        folder = world_benchmark_folder(spec)
        if folder not in generated:
            raise ConfigError(f"config key benchmarks.{name}: the world writes no {folder!r} benchmark "
                              f"(it writes {', '.join(sorted(generated))})")
        unknown = sorted(set(spec.get("pieces") or []) - set(generated[folder].get("pieces", [])))
        if unknown:
            raise ConfigError(f"config key benchmarks.{name}.pieces: the world writes no piece {unknown[0]!r} "
                              f"(it writes {', '.join(generated[folder]['pieces'])})")


def _check_schedule(train: dict[str, Any], where: str) -> None:
    if train.get("warmup", 0) > train.get("steps", 0):
        raise ConfigError(f"config key {where}.warmup: {train['warmup']} warm-up steps exceed the "
                          f"{train.get('steps', 0)} training steps ({where}.steps)")
    accum = train.get("accum_freq", 1)
    if "batch_size" in train and train["batch_size"] % accum:  # the trainer also checks it with the GPU count
        raise ConfigError(f"config key {where}.accum_freq: batch_size {train['batch_size']} does not split into "
                          f"{accum} equal micro-batches; choose an accum_freq that divides it")


def _check_validation(train: dict[str, Any], where: str, config: dict[str, Any]) -> None:
    """train.val_every needs something to validate on; val_benchmark names a configured benchmark; a holdout
    ranks one image among others (compo.validation)."""
    name = train.get("val_benchmark")
    if name is not None and name not in config["benchmarks"]:
        raise ConfigError(f"config key {where}.val_benchmark: {name!r} is not a configured benchmark "
                          f"(configured: {', '.join(sorted(config['benchmarks']))})")
    if train.get("val_holdout") == 1:
        raise ConfigError(f"config key {where}.val_holdout: 1 image; recall needs at least 2 (0: none)")
    if train.get("val_holdout") and not train.get("val_every"):
        raise ConfigError(f"config key {where}.val_holdout: {train['val_holdout']} images held out of training for a "
                          f"validation that never runs; set {where}.val_every (steps, or epoch) or remove it")
    if train.get("val_every") and not (train.get("val_holdout") or name):
        raise ConfigError(f"config key {where}.val_every: nothing to validate on; set {where}.val_holdout "
                          f"(images held out of training) or {where}.val_benchmark (a zero-shot benchmark)")


def _check_norms(section: dict[str, Any], where: str) -> None:
    """Downloaded norms need a checksum unless the config opts out with sha256: unverified."""
    from compo.concreteness import UNVERIFIED, checksum_required

    if checksum_required(section.get("norms"), section.get("sha256")):
        raise ConfigError(f"config key {where}.sha256: the norms {section['norms']} are downloaded, so their "
                          f"sha256 is required (or sha256: {UNVERIFIED} to read them unchecked)")


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """The schema, hub-released entries' paths made local (compo.artifacts.resolve_hub_paths), the checks."""
    validate_schema(config)
    _check_benchmark_keys(config)
    try:
        resolve_hub_paths(config)
    except OutsideRootError as error:
        raise ConfigError(str(error)) from error
    check_config(config)
    return config


def validate_workflow_config(config: dict[str, Any], paths: list[str | Path]) -> dict[str, Any]:
    """What the Snakefile runs on the config Snakemake loaded from `paths`: each file read strictly
    (duplicate keys, YAML errors), then the schema and the cross-reference checks."""
    files = [load_yaml(path) or {} for path in paths]
    reported = accumulated_reported([f.get("reported") for f in files if isinstance(f, dict)])
    if reported is not None:
        config["reported"] = reported
    return validate_config(config)


def load_config(*paths: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load one or more YAML files (later ones override) over the shared recipes (config/recipes.yaml), apply
    `overrides`, validate."""
    config: dict[str, Any] = {}
    files = []
    for path in paths:
        loaded = load_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: expected a mapping at the top level")
        config = deep_merge(config, loaded)
        files.append(loaded)
    reported = accumulated_reported([f.get("reported") for f in files])
    if reported is not None:
        config["reported"] = reported
    if overrides:
        config = deep_merge(config, overrides)
    return validate_config(with_shared_recipes(config))
