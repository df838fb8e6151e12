"""Captions of a scene and their ground truth.

A short caption is built from a `ShortPlan` (which objects it mentions with which attributes, the relations
between consecutive mentions, the background, the framing and an optional ungrounded phrase) so benchmark
negatives can edit the plan and re-render it with exactly the same template. Long captions describe every
object with all attributes, its image region and the relations, plus style sentences.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from compo.world.scene import pick, region_of, relations_between
from compo.world.vocab import (
    ABSTRACT_NOUNS,
    ATTRIBUTE_FIELDS,
    BACKGROUNDS,
    GROUNDED_WORDS,
    MOOD_ADJECTIVES,
    REGION_PHRASES,
    RELATION_PHRASES,
    STYLE_ADJECTIVES,
    STYLE_SENTENCES,
    UNGROUNDED_PREFIXES,
    UNGROUNDED_SUFFIXES,
    UNGROUNDED_WORDS,
    article,
)

FRAMINGS: tuple[str, ...] = ("", "", "there is", "a photo of", "an image of", "a picture of")
FRAMING_NOUN_PHRASES = tuple(f for f in FRAMINGS if f.endswith(" of"))  # "a photo of": a noun a swap can move
BACKGROUND_FIRST = "the {background} with"  # "the grass with a red circle and ..."
# Probability that a short caption shows each attribute of a mentioned object (the shape always shows).
SHOW_PROBABILITY = {"size": 0.5, "colour": 0.85, "pattern": 0.4}
NUMBER_NAMES = ("zero", "one", "two", "three", "four")


@dataclass(frozen=True)
class CaptionStyle:
    """How a split's short captions are written (config `world.caption_style.<split>`; each key defaults to
    the world's original style, which every split without an entry keeps byte for byte).

    framing: share of captions opening with a framing noun phrase ("a photo of", "an image of", "a picture of";
    the rest open with nothing or "there is", 2:1); None: the original uniform pick over FRAMINGS (half of
    them). ungrounded_rate: share carrying an ungrounded phrase (None: `world.ungrounded_rate`). background,
    relation, copula, background_first: probabilities of mentioning the background, of stating the relation
    between consecutive mentions (when one holds), of the "X is left of Y" sentence, of "the grass with ...".
    min_mentions / max_mentions: how many of the scene's objects a caption mentions, drawn uniformly between them
    (capped by the scene's objects). show: probability that each attribute shows."""

    framing: float | None = None
    ungrounded_rate: float | None = None
    background: float = 0.6
    relation: float = 0.7
    copula: float = 0.3
    background_first: float = 0.15
    min_mentions: int = 1
    max_mentions: int = 3
    show: tuple[tuple[str, float], ...] = tuple(SHOW_PROBABILITY.items())

    @classmethod
    def from_config(cls, entry: dict[str, Any] | None) -> CaptionStyle:
        entry = dict(entry or {})
        show = {**SHOW_PROBABILITY, **entry.pop("show", {})}
        return cls(**entry, show=tuple((f, float(show[f])) for f in ATTRIBUTE_FIELDS))

    def pick_framing(self, rng: np.random.Generator) -> str:
        if self.framing is None:
            return pick(rng, FRAMINGS)
        if rng.random() < self.framing:
            return pick(rng, FRAMING_NOUN_PHRASES)
        return pick(rng, ("", "", "there is"))


ORIGINAL_STYLE = CaptionStyle()

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass
class Caption:
    text: str
    gt_noun_phrases: list[str]
    grounded_words: list[str]
    ungrounded_words: list[str]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def make_caption(text: str, noun_phrases: list[str]) -> Caption:
    tokens = words(text)
    return Caption(
        text=text,
        gt_noun_phrases=_unique(noun_phrases),
        grounded_words=_unique([w for w in tokens if w in GROUNDED_WORDS]),
        ungrounded_words=_unique([w for w in tokens if w in UNGROUNDED_WORDS]),
    )


@dataclass
class Mention:
    """One object mention: `values` holds the shape and the attributes the caption shows."""

    obj: int
    values: dict[str, str]

    def phrase(self, determiner: str = "a") -> str:
        body = [self.values[f] for f in ATTRIBUTE_FIELDS if f in self.values] + [self.values["shape"]]
        det = article(body[0]) if determiner == "a" else determiner
        return " ".join([det, *body])


@dataclass
class ShortPlan:
    mentions: list[Mention]
    relations: list[str | None]  # relation of mention i to mention i+1, or None ("and")
    background: str | None
    framing: str = ""
    copula: bool = False  # "a red circle is to the left of a blue square"
    prefix: str | None = None  # ungrounded prefix, replaces the framing
    suffix: str | None = None
    extra: list[Mention] = field(default_factory=list)  # appended with "and" (add_obj negatives)

    def copy(self) -> ShortPlan:
        return copy.deepcopy(self)


def render_short(plan: ShortPlan) -> Caption:
    mentions = plan.mentions + plan.extra
    relations = plan.relations + [None] * len(plan.extra)
    phrases = [m.phrase() for m in mentions]
    # "a red circle is to the left of ..." is a sentence only on its own: not after a framing
    # ("there is", "a photo of"), an ungrounded prefix, or "the grass with"
    sentence = plan.copula and plan.framing == "" and plan.prefix is None
    chain = phrases[0]
    for i in range(1, len(mentions)):
        relation = relations[i - 1]
        if relation is not None:
            copula = "is " if sentence and i == 1 else ""
            chain += f" {copula}{RELATION_PHRASES[relation]} {phrases[i]}"
        else:
            chain += (" and " if i == len(mentions) - 1 else ", ") + phrases[i]
    noun_phrases = list(phrases)
    if plan.background is not None:
        noun_phrases.append(f"the {plan.background}")
    if plan.background is not None and plan.framing == BACKGROUND_FIRST:
        text = f"the {plan.background} with {chain}"
    else:
        framing = plan.prefix if plan.prefix is not None else plan.framing
        text = f"{framing} {chain}".strip()
        if plan.background is not None:
            text += f" on the {plan.background}"
    if plan.prefix is not None and plan.framing == BACKGROUND_FIRST:
        text = f"{plan.prefix} {text}"
    if plan.suffix is not None:
        text += f" {plan.suffix}"
    return make_caption(text, noun_phrases)


def sample_short_plan(rng: np.random.Generator, scene: dict[str, Any], ungrounded_rate: float,
                      style: CaptionStyle = ORIGINAL_STYLE) -> ShortPlan:
    """A short caption's plan; `style` (CaptionStyle) sets how it is written, its ungrounded_rate when it has one."""
    objects = scene["objects"]
    show = dict(style.show)
    if style.ungrounded_rate is not None:
        ungrounded_rate = style.ungrounded_rate
    most = min(len(objects), style.max_mentions)
    k = int(rng.integers(min(style.min_mentions, most), most + 1))
    chosen = [int(i) for i in rng.permutation(len(objects))[:k]]
    mentions = []
    for i in chosen:
        values = {"shape": objects[i]["shape"]}
        for f in ATTRIBUTE_FIELDS:
            if rng.random() < show[f]:
                values[f] = objects[i][f]
        mentions.append(Mention(i, values))
    relations: list[str | None] = []
    for a, b in zip(chosen, chosen[1:], strict=False):
        holding = relations_between(objects[a], objects[b])
        relations.append(pick(rng, holding) if holding and rng.random() < style.relation else None)
    background = scene["background"] if rng.random() < style.background else None
    framing = style.pick_framing(rng)
    if background is not None and rng.random() < style.background_first:
        framing = BACKGROUND_FIRST
    plan = ShortPlan(mentions, relations, background, framing, copula=k == 2 and relations[0] is not None
                     and rng.random() < style.copula)
    if rng.random() < ungrounded_rate:
        if rng.random() < 0.5:
            plan.prefix = pick(rng, UNGROUNDED_PREFIXES)
        else:
            plan.suffix = pick(rng, UNGROUNDED_SUFFIXES)
    return plan


def swap_values(plan: ShortPlan, rng: np.random.Generator, fields: tuple[str, ...]) -> ShortPlan | None:
    """Exchange one field's values between two mentions (SugarCrepe's swap): the bag of words stays the
    same; None when no two mentions state different values of a field, or the swap would change a word."""
    options = [
        (i, j, f)
        for i in range(len(plan.mentions))
        for j in range(i + 1, len(plan.mentions))
        for f in fields
        if f in plan.mentions[i].values
        and f in plan.mentions[j].values
        and plan.mentions[i].values[f] != plan.mentions[j].values[f]
    ]
    if not options:
        return None
    i, j, f = pick(rng, options)
    negative = plan.copy()
    a, b = negative.mentions[i].values, negative.mentions[j].values
    a[f], b[f] = b[f], a[f]
    # "a red circle" + "a large orange square" would change an article: keep the bag of words exactly
    if sorted(words(render_short(plan).text)) != sorted(words(render_short(negative).text)):
        return None
    return negative


def _full_phrase(obj: dict[str, Any], determiner: str = "a") -> str:
    return Mention(-1, {f: obj[f] for f in (*ATTRIBUTE_FIELDS, "shape")}).phrase(determiner)


def _style_sentence(rng: np.random.Generator, template: str) -> str:
    moods = [str(w) for w in rng.permutation(MOOD_ADJECTIVES)[:2]]
    abstracts = [str(w) for w in rng.permutation(ABSTRACT_NOUNS)[:2]]
    text = template.replace("{mood}", moods[0], 1).replace("{mood}", moods[1], 1)
    text = text.replace("{abstract}", abstracts[0], 1).replace("{abstract}", abstracts[1], 1)
    return text.replace("{style}", pick(rng, STYLE_ADJECTIVES))


def long_caption(rng: np.random.Generator, scene: dict[str, Any]) -> Caption:
    """A ShareGPT4V-like description: count and background, every object with all attributes and its
    region, one relation per related pair, and style sentences."""
    objects, background = scene["objects"], scene["background"]
    if scene["background"] not in BACKGROUNDS:
        raise ValueError(f"scene {scene.get('image_id')}: unknown background {background!r}")
    n = len(objects)
    noun = "object" if n == 1 else "objects"
    sentences = [f"The image shows {NUMBER_NAMES[n]} {noun} on the {background}."]
    styles = [str(s) for s in rng.permutation(STYLE_SENTENCES)[:3]]
    sentences.append(_style_sentence(rng, styles[0]))
    noun_phrases = [f"the {background}"]
    for obj in objects:
        phrase = _full_phrase(obj)
        noun_phrases.append(phrase)
        sentences.append(f"There is {phrase} {REGION_PHRASES[region_of(obj)]} of the image.")
    for i, j in combinations(range(n), 2):
        holding = relations_between(objects[i], objects[j])
        if holding:
            subject = "The" + _full_phrase(objects[i], "the")[3:]  # starts the sentence
            other = _full_phrase(objects[j], "the")
            noun_phrases += [subject, other]
            sentences.append(f"{subject} is {RELATION_PHRASES[pick(rng, holding)]} {other}.")
    sentences += [_style_sentence(rng, s) for s in styles[1:]]
    return make_caption(" ".join(sentences), noun_phrases)
