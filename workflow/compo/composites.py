"""Composite metrics (config `composites`): the one home of how a composite's members resolve.

A member is a `benchmark/metric` or `composite/<name>`, another composite: a nested composite is the mean of
its members' means, as FSC-CLIP's Comp is the mean over its 11 benchmarks of each benchmark's average over its
subtasks (seed 003; a flat mean over every subtask would weight a benchmark by its number of subtasks)."""

from __future__ import annotations

COMPOSITE = "composite"


def _nested(member: str) -> str | None:
    family, _, name = member.partition("/")
    return name if family == COMPOSITE else None


def check_composites(composites: dict[str, list[str]], benchmarks: list[str] | None = None
                     ) -> list[tuple[str, str]]:
    """Problems as (config key, message): a nested member must name a defined composite, without cycles; a
    `benchmark/metric` member one of `benchmarks` (when given) with a metric (else the composite would be
    computed for no model and vanish from every table)."""
    problems = []
    for name, members in composites.items():
        for member in members:
            inner = _nested(member)
            benchmark, _, metric = member.partition("/")
            if inner is not None and inner not in composites:
                problems.append((f"composites.{name}", f"{member!r}: no composite {inner!r} is defined"))
            elif inner is None and not (benchmark and metric):
                problems.append((f"composites.{name}", f"{member!r}: expected benchmark/metric or composite/<name>"))
            elif inner is None and benchmarks is not None and benchmark not in benchmarks:
                problems.append((f"composites.{name}", f"{member!r}: no benchmark {benchmark!r} is defined under "
                                                       f"benchmarks"))
    if not problems:
        try:
            composite_order(composites)
        except ValueError as error:
            problems.append(("composites", str(error)))
    return problems


def composite_order(composites: dict[str, list[str]]) -> list[str]:
    """The composites' names, each after the composites it lists (computed in this order)."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ValueError(f"composites form a cycle: {' -> '.join([*visiting, name])}")
        if name not in composites:
            raise ValueError(f"composite {name!r} is not defined under composites")
        visiting.append(name)
        for member in composites[name]:
            inner = _nested(member)
            if inner is not None:
                visit(inner)
        visiting.pop()
        order.append(name)

    for name in composites:
        visit(name)
    return order


def leaf_members(name: str, composites: dict[str, list[str]]) -> list[str]:
    """The `benchmark/metric` entries behind composite `name`, nested composites expanded (each once)."""
    leaves: list[str] = []
    for member in composites.get(name, []):
        inner = _nested(member)
        leaves += leaf_members(inner, composites) if inner is not None else [member]
    return list(dict.fromkeys(leaves))
