"""How much the study can see: the coverage of the claims' intervals, simulated at the study's own design.

A difference claim compares two methods fine-tuned over a few seeds (nested in one or a few pretrained bases)
and scored on a benchmark's fixed items. `Design` is a generative model of one such comparison, on the
probability scale, with the variance components the claims' interval has to carry:

    p[m, k, s, i] = clip(q[i] + effect[m] + e[m, i] + w[m, k] + u[m, k, s], 0, 1);   correct ~ Bernoulli(p)

q (item easiness, shared by both methods; a Beta over the item population), e (method x item: what one
method gets right that the other does not), w (method x base), u (method x fine-tuning seed), the Bernoulli
(a model's own item-level noise). `fit_design` estimates the components from two methods' per-item scores
(moments: covariances across items within and between the methods, spreads of the seeds and bases), and
`coverage` draws whole studies from a design, builds the interval with `compo.stats.INTERVALS` (the code the
claims run), and counts how often it holds the true difference, E[p_a] - E[p_b] over items, bases and seeds
(by Monte Carlo, clipping included). tools/interval_coverage.py prints the figures; docs/intervals.md and
docs/embedded-study.md quote them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from compo.stats import INTERVALS, ItemScores, Measure


@dataclass(frozen=True)
class Design:
    """One comparison's design (seeds per base, bases, items) and variance components (probability scale).

    accuracy: the reference method's mean accuracy; item_var: variance of q over items; method_item_var:
    of e; base_var: of w; seed_var: of u."""

    seeds: int
    bases: int
    items: int
    accuracy: float
    item_var: float
    method_item_var: float
    base_var: float
    seed_var: float

    def with_design(self, seeds: int | None = None, bases: int | None = None, items: int | None = None) -> Design:
        return replace(self, seeds=seeds or self.seeds, bases=bases or self.bases, items=items or self.items)


def _item_easiness(design: Design, rng: np.random.Generator, n: int) -> np.ndarray:
    """q over `n` items: a Beta with the design's mean accuracy and item variance (a point mass if none)."""
    mean, var = design.accuracy, design.item_var
    if var <= 0:
        return np.full(n, mean)
    common = mean * (1 - mean) / min(var, 0.99 * mean * (1 - mean)) - 1
    return rng.beta(mean * common, (1 - mean) * common, size=n)


def _probabilities(design: Design, effect: float, rng: np.random.Generator, q: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """p for methods a (shifted by `effect`) and b: [bases * seeds, items] each, instances base-major."""
    shape = (design.bases, design.seeds)
    out = []
    for shift in (effect, 0.0):
        e = rng.normal(0, math.sqrt(design.method_item_var), len(q))
        w = rng.normal(0, math.sqrt(design.base_var), design.bases)
        u = rng.normal(0, math.sqrt(design.seed_var), shape)
        level = (w[:, None] + u).reshape(-1, 1)
        out.append(np.clip(q[None] + shift + e[None] + level, 0, 1))
    return out[0], out[1]


def true_difference(design: Design, effect: float, draws: int = 200, seed: int = 0) -> float:
    """E[p_a] - E[p_b] over the populations of items, bases and seeds (Monte Carlo, clipping included; 0 when
    the two methods do not differ, the model being symmetric)."""
    if effect == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    big = design.with_design(seeds=16, bases=16)
    total = 0.0
    for _ in range(draws):
        p_a, p_b = _probabilities(big, effect, rng, _item_easiness(design, rng, 500))
        total += p_a.mean() - p_b.mean()
    return total / draws


def simulate(design: Design, effect: float, rng: np.random.Generator) -> tuple[Measure, Measure, np.ndarray]:
    """One study drawn from the design: each method's per-item correctness [bases * seeds, items] as a measure,
    and each seed's base label (seeds numbered as `study.base_seeds` lays them out: seed s on base s mod n)."""
    p_a, p_b = _probabilities(design, effect, rng, _item_easiness(design, rng, design.items))
    strata = np.zeros(design.items, dtype=int)
    measures = [[ItemScores((rng.random(p.shape) < p).astype(float), strata, items="simulated")] for p in (p_a, p_b)]
    labels = np.repeat(np.arange(design.bases), design.seeds)
    return measures[0], measures[1], labels


def coverage(design: Design, effect: float, interval: str, simulations: int = 1000, draws: int = 1000,
             seed: int = 0, truth: float | None = None, bases_fixed: bool = True) -> dict[str, float]:
    """The share of `simulations` studies drawn from `design` whose interval (`compo.stats.INTERVALS[interval]`,
    built as the claims build it) holds the true difference; also the intervals' mean width and the share that
    exclude zero (the power at this effect). All in the effect's unit (fractions).

    `bases_fixed` (the claims' estimand): the truth is the effect on the study's own bases. Their method x base
    terms are then constants of the comparison, part of the effect it estimates, and the studies are drawn
    without them (base_var 0: shifting a base's probabilities by a constant changes the interval's sampling
    distribution only through clipping). Otherwise the truth is the effect over the population of bases."""
    design = replace(design, base_var=0.0) if bases_fixed else design
    build: Callable = INTERVALS[interval]
    truth = true_difference(design, effect, seed=seed + 1) if truth is None else truth
    rng = np.random.default_rng(seed)
    held = width = excluded = 0
    for sim in range(simulations):
        a, b, labels = simulate(design, effect, rng)
        bases = labels if design.bases > 1 else None
        result = build(a, b, design.seeds * design.bases, draws=draws, seed=sim, bases=bases)
        held += result.low <= truth <= result.high
        width += result.high - result.low
        excluded += not result.low <= 0 <= result.high
    return {"coverage": held / simulations, "width": width / simulations, "power": excluded / simulations,
            "truth": truth}


def fit_design(a: np.ndarray, b: np.ndarray, labels: np.ndarray) -> Design:
    """Variance components of `Design` from two methods' per-item correctness [instances, items] (0/1) over the
    same items, `labels` the base of each instance (the same layout for both). Moments, each clipped at 0:
    item_var from the covariance across items between an instance of a and one of b; method_item_var from the
    covariance between two instances of one method, less item_var; seed_var from the spread of the instances'
    accuracies within a base, less the Bernoulli part; base_var from the spread of the bases' mean accuracies,
    less what the seeds put into it (0 with one base: not estimable)."""
    a, b, labels = np.asarray(a, float), np.asarray(b, float), np.asarray(labels)
    n = a.shape[1]

    def cross(x: np.ndarray, y: np.ndarray, same: bool) -> float:
        values = [np.cov(x[i], y[j])[0, 1] for i in range(len(x)) for j in range(len(y)) if not (same and i == j)]
        return float(np.mean(values))

    item_var = max(0.0, cross(a, b, same=False))
    within = [cross(m, m, same=True) for m in (a, b)]
    method_item_var = max(0.0, float(np.mean(within)) - item_var)
    accuracy = float(b.mean())
    seed_parts, base_parts = [], []
    bases = np.unique(labels)
    per_base = len(labels) // len(bases)
    for m in (a, b):
        scores = m.mean(axis=1)
        bernoulli = max(0.0, scores.mean() * (1 - scores.mean()) - float(np.mean(within))) / n
        spread = np.mean([scores[labels == k].var(ddof=1) for k in bases]) if per_base > 1 else 0.0
        seed_parts.append(max(0.0, spread - bernoulli))
        if len(bases) > 1:
            means = np.array([scores[labels == k].mean() for k in bases])
            base_parts.append(max(0.0, means.var(ddof=1) - (spread if per_base > 1 else bernoulli) / per_base))
    return Design(seeds=per_base, bases=len(bases), items=n, accuracy=accuracy, item_var=item_var,
                  method_item_var=method_item_var, base_var=float(np.mean(base_parts)) if base_parts else 0.0,
                  seed_var=float(np.mean(seed_parts)))
