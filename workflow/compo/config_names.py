"""The config's error type and its rule for names: a leaf module (it imports nothing of compo but the schema's
folder), so the low modules that need them (models, results_root) do not import compo.config, which imports them.
compo.config re-exports both."""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml

from compo.io import SCHEMA_DIR

CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


@functools.cache
def _name_rule() -> dict[str, Any]:
    return yaml.safe_load(CONFIG_SCHEMA.read_text())["definitions"]["name"]


def safe_name_problem(value: Any) -> str | None:
    """Why `value` is not a name as config names are (the schema's `definitions.name`: usable as a file name
    and a command word), or None when it is one. Names read from files (a model.json's model_name) are held
    to the same pattern before any path is built from them."""
    name = _name_rule()
    if isinstance(value, str) and re.fullmatch(name["pattern"], value):
        return None
    return f"{value!r} is not {name['x-expected']}"
