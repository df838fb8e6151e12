"""What every negative generator shares: the Negative record, the registry, per-caption RNGs.

A generator is a class registered under a config name (`negatives.<name>.generator`), built from its
config entry. It implements `propose(parsed) -> Proposal` (or `sample(parsed, rng, k)` when its
candidates are themselves random): every distinct valid negative it can make
for the caption, grouped by type, and the candidates it discarded counted by reason. The shared
`generate(parsed, rng, k)` draws at most k of them (through `sample`); the negatives stage and FSC-CLIP's
online negatives (fresh ones every training step) both call it, so the two paths cannot drift apart.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compo.parse import ParsedCaption


@dataclass(frozen=True)
class Negative:
    text: str
    type: str                       # what was changed, e.g. the swapped span kind
    keyword: str                    # the changed words, e.g. "red|blue" for a swap
    token_spans: tuple[tuple[int, int], ...] = field(default=())  # caption tokens [start, end) changed


@dataclass
class Proposal:
    """All distinct valid negatives of one caption by type, and rejected candidates by reason."""

    by_type: dict[str, list[Negative]] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)

    @property
    def n_valid(self) -> int:
        return sum(len(v) for v in self.by_type.values())

    def shortfall_reason(self) -> str:
        """Why fewer than k negatives could be drawn (the reason written on unfilled slots)."""
        if self.rejected["duplicate"]:
            return "duplicate"
        if self.rejected["identical_to_caption"]:
            return "identical_to_caption"
        return "exhausted" if self.n_valid else "no_swappable_pair"

    def draw(self, rng: random.Random, k: int) -> list[Negative]:
        """Up to k negatives, balanced over types: visit the types in a random order, round-robin,
        taking a random unused negative of each; so a long caption with many adjectives still gets
        noun and noun-phrase swaps (NegCLIP draws one swap per span kind, then samples among them)."""
        pools = {t: list(negs) for t, negs in sorted(self.by_type.items()) if negs}
        order = sorted(pools)
        rng.shuffle(order)
        drawn: list[Negative] = []
        while len(drawn) < k and order:
            for kind in list(order):
                if len(drawn) == k:
                    break
                pool = pools[kind]
                drawn.append(pool.pop(rng.randrange(len(pool))))
                if not pool:
                    order.remove(kind)
        return drawn


class NegativeGenerator:
    """Base of every generator: subclasses implement `propose`; `generate` is shared."""

    name = ""

    def propose(self, parsed: ParsedCaption) -> Proposal:
        raise NotImplementedError

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        """At most k negatives and the proposal they came from (its rejection counts). Generators whose
        candidates depend on randomness (shuffles, concreteness sampling) override this."""
        proposal = self.propose(parsed)
        return proposal.draw(rng, k), proposal

    def sample_batch(self, parsed: Sequence[ParsedCaption], rngs: Sequence[random.Random],
                     k: int) -> list[tuple[list[Negative], Proposal]]:
        """`sample` over many captions; LLM generators override it to batch their prompts."""
        return [self.sample(p, r, k) for p, r in zip(parsed, rngs, strict=True)]

    def generate(self, parsed: ParsedCaption, rng: random.Random, k: int) -> list[Negative]:
        """At most k distinct valid negatives of `parsed`, drawn with `rng` (see Proposal.draw)."""
        return self.sample(parsed, rng, k)[0]


GENERATORS: dict[str, type[NegativeGenerator]] = {}
# Keys of a generator's config entry read by the negatives stage, not by the generator.
STAGE_KEYS = ("generator", "k", "images")


def register(name: str) -> Callable[[type[NegativeGenerator]], type[NegativeGenerator]]:
    def decorate(cls: type[NegativeGenerator]) -> type[NegativeGenerator]:
        if name in GENERATORS:
            raise ValueError(f"negative generator {name!r} registered twice")
        cls.name = name
        GENERATORS[name] = cls
        return cls

    return decorate


def build_generator(spec: dict[str, Any], where: str = "negatives.<name>") -> NegativeGenerator:
    """The generator named by `spec['generator']`, configured by the rest of the entry (STAGE_KEYS excluded)."""
    name = spec.get("generator")
    if name not in GENERATORS:
        known = ", ".join(sorted(GENERATORS))
        raise ValueError(f"config key {where}.generator: unknown generator {name!r} (known: {known})")
    options = {key: value for key, value in spec.items() if key not in STAGE_KEYS}
    try:
        return GENERATORS[name](**options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"config key {where}: bad options for generator {name!r}: {error}") from error


def caption_rng(seed: int, caption_id: str | None = None, *, step: int | None = None,
                row: int | None = None) -> random.Random:
    """The random stream of one caption, the only source of randomness a caption's negatives use, so
    they do not depend on which other captions share a shard, a batch or a rank's slice of it:

    * `caption_rng(seed, caption_id)`: the offline negatives stage (and ConcretePlant's keyword choice),
      keyed by the caption id;
    * `caption_rng(seed, step=step, row=row)`: what training draws online at `step` for the caption in
      manifest row `row` (FSC-CLIP's negatives, fresh every step), the same on a resumed run.
    """
    if caption_id is not None and step is None and row is None:
        digest = hashlib.sha256(f"{seed}\x00{caption_id}".encode()).digest()
        return random.Random(int.from_bytes(digest[:16], "big"))
    if caption_id is None and step is not None and row is not None:
        stream = np.random.default_rng(np.random.SeedSequence([seed, step, 1, row]))
        return random.Random(int(stream.integers(2**63)))
    raise ValueError("caption_rng: give the caption_id (offline) or step and row (online), not both")
