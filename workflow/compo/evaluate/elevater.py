"""ELEVATER's class names and prompt templates (FSC-CLIP's 21 zero-shot tasks, seed 003 Table 9), read from the
user's copy of the released toolkit (github.com/Computer-Vision-in-the-Wild/Elevater_Toolkit_IC,
`vision_benchmark/datasets/prompts.py`): module-level lists `<name>_classes` / `<name>_templates` and the dicts
`class_map` / `template_map` (ELEVATER dataset name, e.g. `cifar-10`, `imagenet-1k` -> one of those lists), as the
toolkit's `evaluation/feature.py` looks them up at its yaml's `DATASET.DATASET`. The file is parsed with `ast` and
its literals read with `ast.literal_eval`: it is never imported or run. A class given as a list of synonyms is
named by its first, as feature.py does."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from compo.evaluate.files import BenchmarkError

CLASS_MAP = "class_map"
TEMPLATE_MAP = "template_map"


def is_elevater_file(path: Path) -> bool:
    """A class-name or template file given as the toolkit's prompts.py (by its .py suffix)."""
    return path.suffix == ".py"


def _entries(path: Path, name: str) -> dict[str, ast.expr]:
    """The toolkit's `name` dict (class_map or template_map): dataset -> the expression of its list, a literal or
    a module-level name bound to one (a name is resolved here, the literal read when a dataset asks for it)."""
    if not path.is_file():
        raise BenchmarkError(f"{path}: ELEVATER prompts file not found (the toolkit's "
                             "vision_benchmark/datasets/prompts.py)")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as error:
        raise BenchmarkError(f"{path}: not a readable Python file ({error})") from error
    bound = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)}
    table = bound.get(name)
    if not isinstance(table, ast.Dict):
        raise BenchmarkError(f"{path}: expected a module-level dict {name!r} (dataset -> list), as the toolkit has")
    out: dict[str, ast.expr] = {}
    for key, value in zip(table.keys, table.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise BenchmarkError(f"{path}: {name} has a key that is not a string literal")
        node = bound.get(value.id) if isinstance(value, ast.Name) else value
        if node is None:
            raise BenchmarkError(f"{path}: {name}[{key.value!r}]: {value.id!r} is not assigned at the module's "
                                 "top level")
        out[key.value] = node
    return out


def dataset_list(path: Path, name: str, dataset: str | None) -> list[Any]:
    """`name`'s list for ELEVATER dataset `dataset` (the benchmark key `dataset`)."""
    table = _entries(path, name)
    if not dataset:
        raise BenchmarkError(f"{path}: ELEVATER's {name} needs the benchmark key 'dataset' (ELEVATER's name, e.g. "
                             f"cifar-10; the file has {', '.join(sorted(table)[:8])}, ...)")
    if dataset not in table:
        raise BenchmarkError(f"{path}: {name} has no dataset {dataset!r} (has {', '.join(sorted(table))})")
    try:
        items = ast.literal_eval(table[dataset])
    except ValueError as error:
        raise BenchmarkError(f"{path}: {name}[{dataset!r}]: expected a list literal ({error})") from error
    if not isinstance(items, list):
        raise BenchmarkError(f"{path}: {name}[{dataset!r}]: expected a list, got {type(items).__name__}")
    return items


def class_names(path: Path, dataset: str | None) -> list[str]:
    """The dataset's class names in label order, a synonym list named by its first entry."""
    names = []
    for i, entry in enumerate(dataset_list(path, CLASS_MAP, dataset)):
        name = entry[0] if isinstance(entry, list) and entry else entry
        if not isinstance(name, str):
            raise BenchmarkError(f"{path}: class_map[{dataset!r}][{i}] is not a class name: {entry!r}")
        names.append(name)
    return names


def templates(path: Path, dataset: str | None) -> list[str]:
    return dataset_list(path, TEMPLATE_MAP, dataset)
