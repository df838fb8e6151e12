"""Loading, validating and resolving the study configuration.

The JSON schema (`workflow/schemas/config.schema.yaml`) checks keys and types; `check_config` adds the
cross-references a schema cannot express (a method's parent, base and negatives exist, the study names
defined datasets and methods). `resolve_method` flattens a method's inheritance chain into one recipe.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from compo.io import SCHEMA_DIR

CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def validate_schema(config: dict[str, Any]) -> None:
    schema = yaml.safe_load(CONFIG_SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        raise ConfigError(f"config key {_key_path(first)}: {first.message}")


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


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
    if recipe.get("online_negatives"):
        # the trainer draws these every step, so it needs the generators' config entries
        recipe["online_negative_specs"] = {
            n: config["negatives"][n] for n in recipe["online_negatives"] if n in config["negatives"]
        }
    return recipe


REQUIRED_RECIPE_KEYS = ("base", "loss", "train")
REQUIRED_TRAIN_KEYS = ("steps", "batch_size", "lr", "warmup", "weight_decay")


def check_config(config: dict[str, Any]) -> None:
    """Cross-reference checks after the schema; raise ConfigError naming the key."""
    study = config["study"]
    for key, pool in (("datasets", "datasets"), ("methods", "methods"), ("benchmarks", "benchmarks")):
        for name in study[key]:
            if name not in config[pool]:
                raise ConfigError(f"config key study.{key}: {name!r} is not defined under {pool}")
    for key, pool in (("methods", "methods"), ("benchmarks", "benchmarks")):
        for name in config.get("wiseft", {}).get(key, []):
            if name not in config[pool]:
                raise ConfigError(f"config key wiseft.{key}: {name!r} is not defined under {pool}")
    for group in study.get("ablations", []):
        if group not in config.get("ablations", {}):
            raise ConfigError(f"config key study.ablations: {group!r} is not defined under ablations")
    for group, spec in config.get("ablations", {}).items():
        for key, pool in (("methods", "methods"), ("datasets", "datasets")):
            for name in spec.get(key, []):
                if name not in config[pool]:
                    raise ConfigError(f"config key ablations.{group}.{key}: {name!r} is not defined under {pool}")
    for base_name, base in config["bases"].items():
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
        negatives = recipe.get("negatives")
        if negatives is not None and negatives not in config["negatives"]:
            raise ConfigError(f"config key methods.{method}.negatives: unknown generator {negatives!r}")
        for name in recipe.get("online_negatives") or []:
            if name not in config["negatives"]:
                raise ConfigError(f"config key methods.{method}.online_negatives: {name!r} is not under negatives")
        from compo.losses import check_recipe  # the loss registry knows each loss's parameters

        for key, message in check_recipe(recipe):
            raise ConfigError(f"config key methods.{method}.{key}: {message}")
    from compo.claims import check_claims  # the claims module knows what a claim may name

    for key, message in check_claims(config):
        raise ConfigError(f"config key {key}: {message}")
    if any(b["source"] == "world" for b in config["benchmarks"].values()) or any(
        d["source"] == "world" for d in config["datasets"].values()
    ):
        if "world" not in config:
            raise ConfigError("config key world: datasets or benchmarks use source world but world is missing")
    for name, dataset in config["datasets"].items():
        if dataset["source"] == "world" and dataset.get("split") not in config.get("world", {}).get("splits", {}):
            raise ConfigError(f"config key datasets.{name}.split: must name a world split")


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    validate_schema(config)
    check_config(config)
    return config


def load_config(*paths: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load one or more YAML files (later ones override), apply `overrides`, validate."""
    config: dict[str, Any] = {}
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} not found")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: expected a mapping at the top level")
        config = deep_merge(config, loaded)
    if overrides:
        config = deep_merge(config, overrides)
    return validate_config(config)
