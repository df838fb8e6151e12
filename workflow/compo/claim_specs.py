"""What a claim declares (config `claims:`) and the checks on those declarations.

The claims' meaning (metrics, kinds, verdicts) is documented in `compo.claims`, which measures them. This
module holds no numerics, so the workflow checks its config and builds the DAG without scipy or pandas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compo.composites import leaf_members
from compo.layout import base_method


@dataclass
class Claim:
    id: str
    statement: str
    compare: list[Any] | str
    metric: str | list[str]
    expected: str
    role: str = "claim"
    source: str = ""
    kind: str = "difference"
    margin: float = 0.0
    dataset: str | None = None
    reads: list[str] | None = None  # kinds of effect; default: those whose metrics hold the claim's metric
    reported: float | None = None  # a control: the effect its literature source reports (points)

    @classmethod
    def from_config(cls, entry: dict[str, Any]) -> Claim:
        return cls(**entry)

    def metrics(self) -> list[str]:
        return [self.metric] if isinstance(self.metric, str) else list(self.metric)

    def comparison(self) -> str:
        if isinstance(self.compare, str):
            return f"{self.compare} (across methods)"
        a, b = self.compare
        return f"{a} vs {b}"


# --- checks on config `claims` --------------------------------------------------------------------------------------

CONCRETEPLANT_POLICIES = ("hc", "lc", "wo")


def study_claims(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The claims this study measures: every entry of config `claims`, or those `study.claims` names."""
    claims = config.get("claims", [])
    wanted = config["study"].get("claims")
    return claims if wanted is None else [c for c in claims if c["id"] in wanted]


def check_claims(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with config `claims` as (config key, message): ids unique, every compared method in the
    study (bases as base-<name>), every metric defined, each kind's shape."""
    problems: list[tuple[str, str]] = check_effects(config)
    study = config["study"]
    known = set(study["methods"]) | {base_method(b) for b in config["bases"]}
    wiseft = set(config.get("wiseft", {}).get("methods", []))
    benchmarks = set(study["benchmarks"])
    composites = config.get("composites", {})
    # a composite a measured claim reads must be computable from the study's benchmarks (the others are
    # computed for the models that have every member; the aggregate log counts the models left out)
    used = {m.partition("/")[2] for c in study_claims(config) if isinstance(c.get("metric"), str | list)
            for m in ([c["metric"]] if isinstance(c["metric"], str) else c["metric"]) if m.startswith("composite/")}
    for name in composites:
        for member in leaf_members(name, composites):
            if name in used and member.split("/", 1)[0] not in benchmarks:
                problems.append((f"composites.{name}", f"{member!r}: benchmark not in study.benchmarks"))
    ids = [c.get("id") for c in config.get("claims", [])]
    for name in config["study"].get("claims") or []:
        if name not in ids:
            problems.append(("study.claims", f"{name!r} is not the id of an entry of claims"))
    selected = {c.get("id") for c in study_claims(config)}
    seen: set[str] = set()
    for index, entry in enumerate(config.get("claims", [])):
        key = f"claims[{index}]"
        if entry.get("id") not in selected:
            continue  # a claim this study does not measure may compare methods it does not run
        claim = Claim.from_config(entry)
        if claim.id in seen:
            problems.append((f"{key}.id", f"duplicate claim id {claim.id!r}"))
        seen.add(claim.id)
        metrics = [claim.metric] if isinstance(claim.metric, str) else list(claim.metric)
        for metric in metrics:
            family, _, name = metric.partition("/")
            if family == "composite" and name not in composites:
                problems.append((f"{key}.metric", f"composite {name!r} is not defined under composites"))
            elif family not in ("composite", "training", "concreteplant") and family not in benchmarks:
                problems.append((f"{key}.metric", f"{metric!r}: {family!r} is not in study.benchmarks (nor "
                                 "composite/, training/, concreteplant/)"))
        pair_metric = metrics[0].startswith("concreteplant/")
        if claim.kind == "correlation":
            if len(metrics) != 2:
                problems.append((f"{key}.metric", "a correlation needs two metrics [x, y]"))
            names = [] if claim.compare == "study" else list(claim.compare)
        elif claim.compare == "study" or len(claim.compare) != 2:
            problems.append((f"{key}.compare", f"a {claim.kind} compares exactly two entries [a, b]"))
            continue
        else:
            names = [c for c in claim.compare if not isinstance(c, int | float)]
            if claim.kind == "trajectory" and (len(metrics) != 2 or len(names) != 2):
                problems.append((key, "a trajectory needs two methods and two metrics [x, y]"))
            if claim.kind == "trajectory":
                for name in names:
                    if name not in wiseft:
                        problems.append((f"{key}.compare", f"{name!r} is not in wiseft.methods"))
                # the WiSE-FT models are scored on wiseft.benchmarks only: both axes must be among them
                scored = set(config.get("wiseft", {}).get("benchmarks", []))
                for metric in metrics:
                    family, _, name = metric.partition("/")
                    needed = [m.split("/", 1)[0] for m in leaf_members(name, composites)] \
                        if family == "composite" else [family]
                    missing = sorted(set(needed) - scored)
                    if missing:
                        problems.append((f"{key}.metric", f"{metric!r} needs {missing} in wiseft.benchmarks"))
        if isinstance(claim.compare, list) and isinstance(claim.compare[0], int | float):
            problems.append((f"{key}.compare", "the first entry must name a method (a reference value comes second)"))
        for name in names:
            pool = CONCRETEPLANT_POLICIES if pair_metric else known
            if name not in pool:
                what = "a ConcretePlant policy (hc, lc, wo)" if pair_metric else "a study method or base-<base>"
                problems.append((f"{key}.compare", f"{name!r} is not {what}"))
    return problems


# --- kinds of effect (config `effects`) -------------------------------------------------------------------------
#
# A kind groups the metrics that show one kind of effect (binding, word order, lexical replacement, ...) and names
# the controls that show this testbed can see an effect of that kind (positive: a method whose effect of this kind
# the literature reports) and does not invent one (negative), or says why it needs none (`direct`). A claim reads
# the kinds whose metrics hold its metric (every member of a composite), or those it names under `reads`.

FAMILIES = ("training", "concreteplant")  # metric families that are not benchmarks


def metric_members(metric: str, composites: dict[str, list[str]]) -> list[str]:
    """The benchmark metrics behind `metric`: a composite's members (nested ones expanded), else the metric."""
    family, _, name = metric.partition("/")
    return leaf_members(name, composites) if family == "composite" else [metric]


def kinds_of_metric(metric: str, effects: dict[str, Any], composites: dict[str, list[str]]) -> list[str]:
    """The kinds whose `metrics` hold a member of `metric` (an entry `benchmark` holds every metric of it)."""
    kinds = []
    for member in metric_members(metric, composites):
        family = member.partition("/")[0]
        kinds += [kind for kind, spec in effects.items() if member in spec["metrics"] or family in spec["metrics"]]
    return list(dict.fromkeys(kinds))


def claim_kinds(claim: Claim, effects: dict[str, Any], composites: dict[str, list[str]]) -> list[str]:
    """The kinds of effect the claim reads: its `reads`, else those of its metrics."""
    if claim.reads is not None:
        return list(claim.reads)
    return list(dict.fromkeys(k for m in claim.metrics() for k in kinds_of_metric(m, effects, composites)))


def check_effects(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with config `effects` and the kinds the study's claims read, as (config key, message)."""
    effects = config.get("effects")
    if not effects:
        return []
    problems: list[tuple[str, str]] = []
    composites = config.get("composites", {})
    benchmarks = set(config.get("benchmarks", {}))
    roles = {c.get("id"): c.get("role", "claim") for c in config.get("claims", [])}
    for kind, spec in effects.items():
        key = f"effects.{kind}"
        controls = "positive" in spec or "negative" in spec
        if controls == ("direct" in spec) or ("positive" in spec) != ("negative" in spec):
            problems.append((key, "give both a positive and a negative control, or `direct` (why the kind needs "
                                  "none), not both"))
        for side in ("positive", "negative"):
            for name in spec.get(side, []) if roles else []:  # a config without claims measures no kind
                if roles.get(name) != "control":
                    what = "is not the id of a claim" if name not in roles else "is not a claim of role control"
                    problems.append((f"{key}.{side}", f"{name!r} {what}"))
        for entry in spec["metrics"]:
            if entry.partition("/")[0] not in benchmarks | set(FAMILIES):
                problems.append((f"{key}.metrics", f"{entry!r}: {entry.partition('/')[0]!r} is not a benchmark "
                                 f"(nor {', '.join(FAMILIES)})"))
    selected = {c.get("id") for c in study_claims(config)}
    for index, entry in enumerate(config.get("claims", [])):
        if entry.get("id") not in selected or entry.get("role", "claim") == "control":
            continue
        claim = Claim.from_config(entry)
        for kind in claim.reads or []:
            if kind not in effects:
                problems.append((f"claims[{index}].reads", f"{kind!r} is not a kind of effect (effects: "
                                 f"{', '.join(effects)})"))
        if claim.reads is None:
            for metric in claim.metrics():
                for member in metric_members(metric, composites):
                    if not kinds_of_metric(member, effects, composites):
                        problems.append((f"claims[{index}].metric", f"{member!r} is in no kind of effect: list it "
                                         "(or its benchmark) under an effects.<kind>.metrics, or name the kinds "
                                         "under the claim's reads"))
    return problems
