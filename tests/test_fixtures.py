"""The test suite's shared fixtures live once, in tests/conftest.py (and helpers in tests/helpers.py)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

# each of these modules builds its own training data under this name (different rows, negatives, parses)
PER_MODULE = {"data"}


def _fixtures(path: Path) -> list[str]:
    def is_fixture(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return isinstance(target, ast.Attribute) and target.attr == "fixture"

    return [node.name for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and any(is_fixture(d) for d in node.decorator_list)]


def test_no_fixture_is_defined_twice(repo: Path) -> None:
    where = defaultdict(list)
    for path in sorted((repo / "tests").glob("*.py")):
        for name in _fixtures(path):
            where[name].append(path.name)
    twice = {name: files for name, files in where.items() if len(files) > 1 and name not in PER_MODULE}
    assert not twice, f"define these once in tests/conftest.py: {twice}"
