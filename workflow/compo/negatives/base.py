"""What every negative generator shares: the Negative record, the registry, per-caption RNGs.

A generator is a class registered under a config name (`negatives.<name>.generator`), built from its
config entry. It implements `propose(parsed) -> Proposal` (or `sample(parsed, rng, k)` when its
candidates are themselves random): every distinct valid negative it can make
for the caption, grouped by type, and the candidates it discarded counted by reason. The shared
`generate(parsed, rng, k)` draws at most k of them (through `sample`); the negatives stage and FSC-CLIP's
online negatives (fresh ones every training step) both call it, so the two paths cannot drift apart.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compo.parse import ParsedCaption
from compo.rng import caption_rng  # noqa: F401  (re-exported: the negatives stage's streams)


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
        if self.rejected["caption_too_long"]:
            return "caption_too_long"
        if self.rejected["not_in_release"]:  # a released file's generator: the file has no record of the caption
            return "not_in_release"
        if self.rejected["duplicate"]:
            return "duplicate"
        if self.rejected["identical_to_caption"]:
            return "identical_to_caption"
        return "exhausted" if self.n_valid else "no_swappable_pair"

    def first(self, types: Sequence[str], k: int) -> list[Negative]:
        """Up to k negatives in `types` order, the first valid one of each type, then the next of each (in that order
        again) while fewer than k: DeGLA's released loader takes `enhanced[0:4]` of each caption's list."""
        pools = [list(self.by_type.get(t, [])) for t in types]
        drawn: list[Negative] = []
        while len(drawn) < k and any(pools):
            for pool in pools:
                if pool and len(drawn) < k:
                    drawn.append(pool.pop(0))
        return drawn

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


VOCABULARIES = ("any", "captions")


class NegativeGenerator:
    """Base of every generator: subclasses implement `propose`; `generate` is shared.

    Generators that replace words take the option `vocabulary`: `any` (a replacement may be any word of the
    lexicon, as the seeds' released code) or `captions` (only words of the caption set the negatives are made
    for: in the synthetic world a replacement must be a word the world can show). Whoever draws negatives hands
    the generator the whole set's words first (`use_caption_words`: the negatives stage, training's online
    negatives, the caption measure)."""

    name = ""
    restrict_to_caption_words = False  # vocabulary: captions
    _caption_words: frozenset[str] | None = None

    def set_vocabulary(self, vocabulary: str) -> None:
        if vocabulary not in VOCABULARIES:
            raise ValueError(f"vocabulary {vocabulary!r}: expected one of {', '.join(VOCABULARIES)}")
        self.restrict_to_caption_words = vocabulary == "captions"

    def use_caption_words(self, words: Iterable[str]) -> None:
        """The words (tokens) of the caption set drawn for, kept lower-cased by a `vocabulary: captions` one."""
        if self.restrict_to_caption_words:
            self._caption_words = frozenset(w.lower() for w in words)

    @property
    def caption_words(self) -> frozenset[str] | None:
        """The vocabulary replacements must stay in (None: any word)."""
        if not self.restrict_to_caption_words:
            return None
        if self._caption_words is None:
            raise ValueError(f"generator {self.name!r} with vocabulary: captions was given no caption set's "
                             "words (use_caption_words)")
        return self._caption_words

    def propose(self, parsed: ParsedCaption) -> Proposal:
        raise NotImplementedError

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        """At most k negatives and the proposal they came from (its rejection counts). Generators whose
        candidates depend on randomness (shuffles, concreteness sampling) override this."""
        proposal = self.propose(parsed)
        return proposal.draw(rng, k), proposal

    def sample_batch(self, parsed: Sequence[ParsedCaption], rngs: Sequence[random.Random], k: int,
                     rows: Sequence[int] | None = None) -> list[tuple[list[Negative], Proposal]]:
        """`sample` for the captions `rows` (indices into `parsed`, default all), in that order.

        `parsed` (and `rngs`, one per caption) is the whole table in order, also when only a shard's
        rows are generated: a generator whose draws depend on other captions (ConcretePlant's global
        ARO-category quotas, random-caption's pool) uses all of it, so a shard draws for its rows exactly
        what the unsharded run draws. LLM generators override it to batch their prompts."""
        rows = range(len(parsed)) if rows is None else rows
        return [self.sample(parsed[i], rngs[i], k) for i in rows]

    def generate(self, parsed: ParsedCaption, rng: random.Random, k: int) -> list[Negative]:
        """At most k distinct valid negatives of `parsed`, drawn with `rng` (see Proposal.draw)."""
        return self.sample(parsed, rng, k)[0]


GENERATORS: dict[str, type[NegativeGenerator]] = {}
# Keys of a generator's config entry read by the negatives stage, not by the generator.
STAGE_KEYS = ("generator", "k", "images", "hub")  # hub: where compo prefetch fetches `path` from


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
    images = spec.get("images")
    if isinstance(images, dict):  # SDXL-Turbo image negatives (real data): checked with the entry
        from compo.negatives.diffusion import DiffusionSettings

        DiffusionSettings.from_spec(images, where=f"{where}.images")
    elif images is not None and not isinstance(images, bool):
        raise ValueError(f"config key {where}.images: expected true (the world's exact re-render) or a mapping "
                         f"(SDXL-Turbo settings), got {images!r}")
    options = {key: value for key, value in spec.items() if key not in STAGE_KEYS}
    try:
        return GENERATORS[name](**options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"config key {where}: bad options for generator {name!r}: {error}") from error
