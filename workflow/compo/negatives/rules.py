"""Rule-based generators besides the NegCLIP swap: WordNet replace, bi-gram shuffle, DeGLA's five types.

wordnet-replace (FSC-CLIP's `replace`, seed 003 appendix): every keyword candidate (seed 002's POS set)
is replaced by each of its rule replacements (`compo.negatives.lexicon`: WordNet antonyms/co-hyponyms,
the relation table for prepositions and spatial words, numbers +-1); types replace_<kind>.

bigram-shuffle (FSC-CLIP): the caption's words are cut into consecutive bi-grams (an odd last word is a
uni-gram), the bi-grams are shuffled, and the shuffle is retried (`max_tries`) until the text differs
from the caption and from the negatives already drawn. Punctuation ending the caption stays at the end,
the first letter's case follows the caption's.

degla-rules: DeGLA's five rewrite types (seed 000, Table 1 / Figure 8) done by rules instead of an LLM:
  reshuffle          the words in a random order (like bigram-shuffle with uni-grams)
  noun_swap          two nouns exchanged (NegCLIP noun swap)
  adjective_swap     two adjectives exchanged
  adjective_replace  an adjective replaced (antonym / co-hyponym)
  noun_replace       a noun replaced (antonym / co-hyponym)
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from compo.negatives.base import Negative, NegativeGenerator, Proposal, register
from compo.negatives.lexicon import Edit, apply_edit, keyword_edits
from compo.negatives.swap import NegClipSwap
from compo.parse import KEYWORD_POS, ParsedCaption

REPLACE_KINDS = ("noun", "adjective", "verb", "relation", "number")
DEGLA_TYPES = ("reshuffle", "noun_swap", "adjective_swap", "adjective_replace", "noun_replace")


def replace_proposal(parsed: ParsedCaption, kinds: Sequence[str], max_per_word: int,
                     type_name: str = "replace_{kind}", vocabulary: frozenset[str] | None = None) -> Proposal:
    """One negative per (keyword candidate, rule replacement) of the given kinds (replacements inside
    `vocabulary` only, when given: compo.negatives.lexicon.keyword_edits)."""
    proposal = Proposal()
    if not parsed.tokens:
        return proposal
    offsets = parsed.token_offsets()
    seen = {parsed.caption}
    covered = -1
    for index in range(len(parsed.tokens)):
        if index <= covered or parsed.pos[index] not in KEYWORD_POS | {"ADV"}:
            continue
        edits = [e for e in keyword_edits(parsed, index, max_per_word, vocabulary=vocabulary) if e.kind in kinds]
        if any(e.kind == "relation" for e in edits):
            covered = max(e.end for e in edits) - 1  # "in front of" is one keyword
        for edit in edits:
            text = apply_edit(parsed, edit, offsets)
            if text in seen:
                proposal.rejected["identical_to_caption" if text == parsed.caption else "duplicate"] += 1
                continue
            seen.add(text)
            old = parsed.caption[offsets[edit.start][0]:offsets[edit.end - 1][1]]
            kind = type_name.format(kind=edit.kind)
            proposal.by_type.setdefault(kind, []).append(
                Negative(text=text, type=kind, keyword=f"{old}|{edit.text}", token_spans=((edit.start, edit.end),)))
    return proposal


@register("wordnet-replace")
class WordNetReplace(NegativeGenerator):
    def __init__(self, kinds: Sequence[str] = REPLACE_KINDS, max_per_word: int = 5, vocabulary: str = "any"):
        unknown = [k for k in kinds if k not in REPLACE_KINDS]
        if unknown or not kinds:
            raise ValueError(f"kinds {list(kinds)}: unknown {unknown} (known: {', '.join(REPLACE_KINDS)})")
        if int(max_per_word) < 1:
            raise ValueError(f"max_per_word {max_per_word}: must be >= 1")
        self.kinds, self.max_per_word = tuple(kinds), int(max_per_word)
        self.set_vocabulary(vocabulary)

    def propose(self, parsed: ParsedCaption) -> Proposal:
        return replace_proposal(parsed, self.kinds, self.max_per_word, vocabulary=self.caption_words)


def _words(parsed: ParsedCaption) -> tuple[list[str], str]:
    """The caption's words (final punctuation split off, the first word lower-cased unless it is a name
    or "I", so it can move) and that punctuation."""
    indices = [i for i, t in enumerate(parsed.tokens) if not t.isspace()]
    tail = ""
    while indices and parsed.pos[indices[-1]] == "PUNCT" and parsed.tokens[indices[-1]] in ".!?":
        tail = parsed.tokens[indices.pop()] + tail
    words = [parsed.tokens[i] for i in indices]
    if words and parsed.pos[indices[0]] != "PROPN" and words[0] != "I":
        words[0] = words[0][:1].lower() + words[0][1:]
    return words, tail


def shuffled_texts(parsed: ParsedCaption, rng: random.Random, k: int, unit: int, max_tries: int,
                   proposal: Proposal, type_name: str) -> list[Negative]:
    """Up to k distinct shuffles of the caption's `unit`-grams (see module docstring)."""
    words, tail = _words(parsed)
    pieces = [words[i:i + unit] for i in range(0, len(words), unit)]
    capital = parsed.caption[:1].isupper()
    out: list[Negative] = []
    seen = {parsed.caption}
    for _ in range(k):
        for _try in range(max_tries):
            order = list(range(len(pieces)))
            rng.shuffle(order)
            text = " ".join(w for i in order for w in pieces[i]) + tail
            if capital:
                text = text[:1].upper() + text[1:]
            if text in seen:
                proposal.rejected["identical_to_caption" if text == parsed.caption else "duplicate"] += 1
                continue
            seen.add(text)
            out.append(Negative(text=text, type=type_name, keyword="", token_spans=((0, len(parsed.tokens)),)))
            break
    return out


@register("bigram-shuffle")
class BigramShuffle(NegativeGenerator):
    def __init__(self, max_tries: int = 20):
        if int(max_tries) < 1:
            raise ValueError(f"max_tries {max_tries}: must be >= 1")
        self.max_tries = int(max_tries)

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        proposal = Proposal()
        drawn = shuffled_texts(parsed, rng, k, 2, self.max_tries, proposal, "bigram_shuffle")
        proposal.by_type["bigram_shuffle"] = list(drawn)
        return drawn, proposal


@register("degla-rules")
class DeglaRules(NegativeGenerator):
    def __init__(self, types: Sequence[str] = DEGLA_TYPES, max_per_word: int = 5, max_tries: int = 20,
                 vocabulary: str = "any"):
        unknown = [t for t in types if t not in DEGLA_TYPES]
        if unknown or not types:
            raise ValueError(f"types {list(types)}: unknown {unknown} (known: {', '.join(DEGLA_TYPES)})")
        self.types, self.max_per_word, self.max_tries = tuple(types), int(max_per_word), int(max_tries)
        self.set_vocabulary(vocabulary)

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        proposal = Proposal()
        swaps = NegClipSwap(["noun", "adjective"]).propose(parsed)
        proposal.rejected.update(swaps.rejected)
        for kind, negatives in swaps.by_type.items():
            name = f"{kind}_swap"
            if name in self.types:
                proposal.by_type[name] = [Negative(n.text, name, n.keyword, n.token_spans) for n in negatives]
        replace_kinds = [t.removesuffix("_replace") for t in self.types if t.endswith("_replace")]
        if replace_kinds:
            replaced = replace_proposal(parsed, replace_kinds, self.max_per_word, "{kind}_replace",
                                        vocabulary=self.caption_words)
            proposal.rejected.update(replaced.rejected)
            proposal.by_type.update(replaced.by_type)
        if "reshuffle" in self.types:
            shuffled = shuffled_texts(parsed, rng, 1, 1, self.max_tries, proposal, "reshuffle")
            if shuffled:
                proposal.by_type["reshuffle"] = shuffled
        # a text two types produce (a swap equal to a replace) is kept once, under the first type
        seen: set[str] = set()
        for kind in sorted(proposal.by_type):
            unique = [n for n in proposal.by_type[kind] if n.text not in seen]
            proposal.rejected["duplicate"] += len(proposal.by_type[kind]) - len(unique)
            seen |= {n.text for n in unique}
            proposal.by_type[kind] = unique
        return proposal.draw(rng, k), proposal


__all__ = ["BigramShuffle", "DeglaRules", "Edit", "WordNetReplace", "replace_proposal", "shuffled_texts"]
