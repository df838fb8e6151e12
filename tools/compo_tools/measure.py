"""What a caption set offers compositional training: the world's fine-tuning captions beside real COCO captions.

Issue 45 (item 1). For any caption set, parsed by the project's spaCy parser (`compo.parse`), this module counts
caption features and classifies every draw of the rule negative generators; `tools/measure_captions.py`
prints the world beside COCO (SugarCrepe's released positives). One lexicon serves both caption sets.

Caption features (per caption, from the parse):
  object             a noun chunk whose root is a NOUN/PROPN that is not a framing word (FRAMING_NOUNS: "photo",
                     "picture", ...), not an ungrounded word (the world's lexicon `UNGROUNDED_WORDS`: "mood",
                     "idea", "beautiful", ...) and not a location noun (LOCATION_NOUNS: "left", "top", ...). The
                     world's backgrounds ("the grass") are objects, as COCO's "the street" is.
  attributed object  an object whose chunk holds a modifier (dep amod, or POS ADJ) that is not an ungrounded word
                     ("a red circle", "a striped shirt"; "a beautiful woman" is not)
  relation mention   a preposition other than "of" (dep prep/agent) or a verb whose object (pobj/dobj; through a
                     location noun and its "of": "to the left of X") is an object, and whose subject is an object:
                     the noun it attaches to or the verb's nsubj, else the nearest object before it ("a dog on a
                     bench", "a man riding a horse"; "a photo of a dog" and "a plate of food" have none)

A draw's kind, from the caption tokens it changed (`Negative.token_spans`). Each token has a role: framing (a
framing or ungrounded word), relation (a location noun, a preposition, a verb), attribute (amod or ADJ), object
(another noun), or other. A span's role is framing if it holds a framing token, else its root token's role (the
token whose head lies outside the span). Then, in order:
  shuffle                                 one span covering the whole caption (bi-gram shuffle, reshuffle)
  framing or ungrounded                   some changed span is framing ("a star of a red photo")
  two spans (swaps):
    attribute swap between objects        two attributes of two different objects (SugarCrepe swap-att's form)
    attribute swap within an object       two attributes of one object ("a large red star" -> "a red large star")
    relation swap                         the two objects of one relation mention exchanged ("a circle above a
                                          square" -> "a square above a circle", ARO VG-Relation's form), or two
                                          relation spans exchanged (prepositions, verbs, "left"/"right")
    object swap                           two objects not related by one mention ("a cat and a dog")
    other swap                            any other pair (adverbs, an object with an attribute, ...)
  one span (replacements): attribute / object / relation / other replace, by the span's role
A draw is one negative drawn uniformly from a caption's negatives (the study's generators with their configured
k; training draws one of them per step), so each caption with a negative weighs one, split among its negatives.
A replacement is "in the caption set's vocabulary" when its new word occurs in the set's own captions.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from compo.negatives.base import Negative, NegativeGenerator
from compo.parse import ParsedCaption
from compo.world.vocab import UNGROUNDED_WORDS

FRAMING_NOUNS = frozenset({"photo", "image", "picture", "photograph", "view", "shot", "closeup", "scene"})
LOCATION_NOUNS = frozenset({"left", "right", "top", "bottom", "front", "back", "side", "middle", "center", "centre",
                            "corner"})
NOT_OBJECT = FRAMING_NOUNS | UNGROUNDED_WORDS | LOCATION_NOUNS
RELATION_DEPS = frozenset({"prep", "agent"})
OBJECT_DEPS = frozenset({"pobj", "dobj"})

SHUFFLE, FRAMING = "shuffle", "framing or ungrounded"
ATT_BETWEEN, ATT_WITHIN = "attribute swap between objects", "attribute swap within an object"
RELATION_SWAP, OBJECT_SWAP, OTHER_SWAP = "relation swap", "object swap", "other swap"
REPLACE_KINDS = {"attribute": "attribute replace", "object": "object replace", "relation": "relation replace",
                 "other": "other replace"}
DRAW_KINDS = (ATT_BETWEEN, ATT_WITHIN, OBJECT_SWAP, RELATION_SWAP, OTHER_SWAP, *REPLACE_KINDS.values(), FRAMING,
              SHUFFLE)


def _root(parsed: ParsedCaption, start: int, end: int) -> int:
    """The first token of [start, end) whose head lies outside it (the span's syntactic root)."""
    for i in range(start, end):
        if not start <= parsed.heads[i] < end or parsed.heads[i] == i:
            return i
    return end - 1


def object_chunks(parsed: ParsedCaption) -> list[tuple[int, int]]:
    """The noun chunks that name an object (module docstring), as token spans."""
    chunks = []
    for start, end in parsed.noun_phrase_spans:
        root = _root(parsed, start, end)
        if parsed.pos[root] in ("NOUN", "PROPN") and parsed.tokens[root].lower() not in NOT_OBJECT:
            chunks.append((start, end))
    return chunks


def _is_attribute(parsed: ParsedCaption, i: int) -> bool:
    return (parsed.deps[i] == "amod" or parsed.pos[i] == "ADJ") and parsed.tokens[i].lower() not in UNGROUNDED_WORDS


def _relation_object(parsed: ParsedCaption, i: int) -> int | None:
    """The token a relation word `i` relates to: its pobj/dobj child, followed through a location noun's "of"."""
    children = [c for c in range(len(parsed.tokens)) if parsed.heads[c] == i and c != i]
    target = next((c for c in children if parsed.deps[c] in OBJECT_DEPS), None)
    while target is not None and parsed.tokens[target].lower() in LOCATION_NOUNS:
        of = next((c for c in range(len(parsed.tokens)) if parsed.heads[c] == target and c != target
                   and parsed.deps[c] in RELATION_DEPS), None)
        target = None if of is None else next(
            (c for c in range(len(parsed.tokens)) if parsed.heads[c] == of and parsed.deps[c] == "pobj"), None)
    return target


def _subject(parsed: ParsedCaption, i: int, roots: dict[int, int], target: int) -> int | None:
    """The object root a relation word `i` starts from: its syntactic subject (the noun a preposition or a
    participle attaches to, a verb's nsubj), else the nearest object before `i` (spaCy often attaches the world's
    "to the left of" to a framing noun: "a photo of a circle to the left of a square")."""
    def subject_of(verb: int) -> int | None:
        nsubj = next((c for c, h in enumerate(parsed.heads) if h == verb and c != verb
                      and parsed.deps[c] in ("nsubj", "nsubjpass") and c in roots), None)
        if nsubj is None and parsed.deps[verb] in ("acl", "relcl") and parsed.heads[verb] in roots:
            return parsed.heads[verb]
        return nsubj

    head = parsed.heads[i]
    if parsed.pos[i] == "VERB":
        found = subject_of(i)
    elif head in roots:
        found = head
    else:
        found = subject_of(head) if parsed.pos[head] in ("VERB", "AUX") else None
    if found is None or found == target:
        before = [r for r, start in roots.items() if start < i and r < i and r != target]
        found = max(before) if before else None
    return found


def relation_mentions(parsed: ParsedCaption) -> list[tuple[int, int, int]]:
    """(relation word, subject object's root, object's root) of every relation mention (module docstring)."""
    roots = {_root(parsed, s, e): s for s, e in object_chunks(parsed)}
    found = []
    for i, pos in enumerate(parsed.pos):
        if not ((pos == "ADP" and parsed.deps[i] in RELATION_DEPS) or pos == "VERB"):
            continue
        if parsed.tokens[i].lower() == "of" or parsed.tokens[parsed.heads[i]].lower() in LOCATION_NOUNS:
            continue  # "a plate of food", "a group of people": no relation; "to the left of X": counted at "to"
        target = _relation_object(parsed, i)
        if target not in roots:
            continue
        subject = _subject(parsed, i, roots, target)
        if subject is not None:
            found.append((i, subject, target))
    return found


@dataclass
class CaptionFeatures:
    objects: int
    attributed_objects: int
    relations: int


def caption_features(parsed: ParsedCaption) -> CaptionFeatures:
    chunks = object_chunks(parsed)
    attributed = sum(any(_is_attribute(parsed, i) for i in range(s, e) if i != _root(parsed, s, e)) for s, e in chunks)
    return CaptionFeatures(len(chunks), attributed, len(relation_mentions(parsed)))


def _token_role(parsed: ParsedCaption, i: int) -> str:
    word = parsed.tokens[i].lower()
    if word in FRAMING_NOUNS or word in UNGROUNDED_WORDS:
        return "framing"
    if word in LOCATION_NOUNS or parsed.pos[i] in ("ADP", "VERB"):
        return "relation"
    if _is_attribute(parsed, i):
        return "attribute"
    if parsed.pos[i] in ("NOUN", "PROPN"):
        return "object"
    return "other"


def _span_role(parsed: ParsedCaption, span: tuple[int, int]) -> str:
    if any(_token_role(parsed, i) == "framing" for i in range(*span)):
        return "framing"
    return _token_role(parsed, _root(parsed, *span))


def draw_kind(parsed: ParsedCaption, negative: Negative) -> str:
    """The kind (module docstring) of `negative`, a negative of the caption `parsed`."""
    spans = sorted(negative.token_spans)
    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] >= len(parsed.tokens) > 1:
        return SHUFFLE
    roles = [_span_role(parsed, span) for span in spans]
    if "framing" in roles:
        return FRAMING
    if len(spans) == 1:
        return REPLACE_KINDS[roles[0]]
    if len(spans) != 2:
        return OTHER_SWAP
    (a, b), (first, second) = roles, spans
    if a == b == "attribute":
        return ATT_WITHIN if parsed.heads[first[0]] == parsed.heads[second[0]] else ATT_BETWEEN
    if a == b == "object":
        swapped = {_root(parsed, *first), _root(parsed, *second)}
        related = any(swapped == {subject, target} for _, subject, target in relation_mentions(parsed))
        return RELATION_SWAP if related else OBJECT_SWAP
    if a == b == "relation":
        return RELATION_SWAP
    return OTHER_SWAP


@dataclass
class GeneratorMeasure:
    """One generator's draws on a caption set: kind shares, truth shares, replacements in the set's vocabulary."""

    captions_with_draw: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    truth: Counter[str] = field(default_factory=Counter)  # false / true / unknown, weighted like the kinds
    replacements: float = 0.0
    in_vocabulary: float = 0.0

    def share(self, counter: Counter[str], key: str) -> float:
        return counter[key] / self.captions_with_draw if self.captions_with_draw else math.nan


def measure_generator(generator: NegativeGenerator, parsed: Sequence[ParsedCaption], rngs: Sequence[random.Random],
                      k: int, truth: Callable[[int, str], str] | None = None) -> GeneratorMeasure:
    """Draws of `generator` (k per caption, one RNG per caption) classified by kind; `truth(row, text)` gives the
    world's verdict ('false' / 'true' / 'unknown') on a negative of caption `row` (None: caption sets without
    scenes, every draw 'unknown')."""
    vocabulary = {t.lower() for p in parsed for t in p.tokens}
    generator.use_caption_words(vocabulary)  # a generator set to `vocabulary: captions` replaces inside it
    measure = GeneratorMeasure()
    for row, (drawn, _) in enumerate(generator.sample_batch(parsed, rngs, k)):
        if not drawn:
            continue
        measure.captions_with_draw += 1
        weight = 1 / len(drawn)
        for negative in drawn:
            kind = draw_kind(parsed[row], negative)
            measure.kinds[kind] += weight
            measure.truth[truth(row, negative.text) if truth else "unknown"] += weight
            if kind in REPLACE_KINDS.values() and "|" in negative.keyword:
                measure.replacements += weight
                new = negative.keyword.split("|", 1)[1].lower().split()
                measure.in_vocabulary += weight * all(w in vocabulary for w in new)
    return measure


@dataclass
class CaptionSetFeatures:
    captions: int
    objects: float          # mean per caption
    attributed: float       # mean per caption
    relations: float        # mean per caption
    two_objects: float      # share of captions with >= 2 objects
    two_attributed: float   # share with >= 2 attributed objects
    with_relation: float    # share with >= 1 relation mention


def caption_set_features(parsed: Sequence[ParsedCaption]) -> CaptionSetFeatures:
    if not parsed:
        raise ValueError("caption set is empty: nothing to measure")
    features = [caption_features(p) for p in parsed]
    n = len(features)
    return CaptionSetFeatures(
        captions=n,
        objects=sum(f.objects for f in features) / n,
        attributed=sum(f.attributed_objects for f in features) / n,
        relations=sum(f.relations for f in features) / n,
        two_objects=sum(f.objects >= 2 for f in features) / n,
        two_attributed=sum(f.attributed_objects >= 2 for f in features) / n,
        with_relation=sum(f.relations >= 1 for f in features) / n,
    )


def sugarcrepe_positives(folder: Path) -> list[str]:
    """The distinct positive captions (COCO val2017 captions) of SugarCrepe's released subset files in `folder`,
    read and checked by the benchmark's own loader, whitespace collapsed, in subset order."""
    from compo.evaluate.sugarcrepe import SUBSETS, load_subset  # the evaluation stack: imported only here

    captions: dict[str, None] = {}
    for subset in SUBSETS:
        for item in load_subset(Path(folder) / f"{subset}.json").values():
            captions.setdefault(" ".join(item["caption"].split()), None)
    return list(captions)
