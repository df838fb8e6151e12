"""NegCLIP swap (Yuksekgonul et al. 2023), as FSC-CLIP (seed 003) uses it through CLoVe's implementation.

Swap two spans of the same kind found by spaCy:
  noun_chunk   noun chunks longer than two tokens ("a red circle"; two-token chunks are noun swaps)
  noun         single nouns, singular with singular (NN) and plural with plural (NNS) so number agrees
  adjective    single ADJ tokens
  adverb       single ADV tokens
  verb_phrase  the POS pattern VERB? ADV* AUX* VERB+ (CLoVe's matcher), longest non-overlapping matches
Every unordered pair of same-kind spans whose texts differ (case-insensitively) gives one candidate;
pairs with equal text would rebuild the caption and are rejected as identical_to_caption, and a text
already produced by another pair is rejected as a duplicate.

Bounded work per caption (each candidate is a full copy of the caption, so all pairs of a long caption
are quadratic in memory and time): a caption longer than `max_caption_chars` (default 10,000 characters,
several times the longest dense captions, e.g. DOCCI's) gets no swap negative, counted as rejected
`caption_too_long` (its slots carry that reason); of each span kind at most `max_pairs` pairs (default
1,000, in reading order: first span, then second) become candidates, the rest counted as `pair_limit`.
With both limits one caption costs at most 5 kinds x 1,000 candidates x 10,000 characters
(`tools/bench_caption_memory.py` measures every stage's peak memory). The dataset stage
skips such a caption first (`datasets.<name>.max_caption_chars`, the same default): this bound is the
second line.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence

from compo.negatives.base import Negative, NegativeGenerator, Proposal, register
from compo.parse import ParsedCaption

SPAN_KINDS = ("noun_chunk", "noun", "adjective", "adverb", "verb_phrase")
# One letter per POS so the verb-phrase pattern is a regular expression over the caption's POS string.
_POS_LETTER = {"VERB": "V", "ADV": "R", "AUX": "A"}
_VERB_PHRASE = re.compile(r"V?R*A*V+")


def longest_non_overlapping(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """spaCy's filter_spans: prefer longer spans, then earlier ones; drop any span overlapping a kept one."""
    kept: list[tuple[int, int]] = []
    taken: set[int] = set()
    for start, end in sorted(spans, key=lambda s: (-(s[1] - s[0]), s[0])):
        if not taken & set(range(start, end)):
            kept.append((start, end))
            taken |= set(range(start, end))
    return sorted(kept)


def verb_phrase_spans(pos: Sequence[str]) -> list[tuple[int, int]]:
    letters = "".join(_POS_LETTER.get(p, "x") for p in pos)
    matches = [(start, end) for start in range(len(letters)) if letters[start] in "VRA"
               for end in range(start + 1, len(letters) + 1) if _VERB_PHRASE.fullmatch(letters, start, end)]
    return longest_non_overlapping(matches)


def span_groups(parsed: ParsedCaption, kind: str) -> list[list[tuple[int, int]]]:
    """Token spans of one kind, in groups whose members may be swapped with each other."""
    if kind == "noun_chunk":
        return [[(s, e) for s, e in parsed.noun_phrase_spans if e - s > 2]]
    if kind == "noun":
        return [[(i, i + 1) for i, t in enumerate(parsed.tags) if t == tag] for tag in ("NN", "NNS")]
    if kind == "adjective":
        return [[(i, i + 1) for i, p in enumerate(parsed.pos) if p == "ADJ"]]
    if kind == "adverb":
        return [[(i, i + 1) for i, p in enumerate(parsed.pos) if p == "ADV"]]
    if kind == "verb_phrase":
        return [verb_phrase_spans(parsed.pos)]
    raise ValueError(f"unknown span kind {kind!r} (known: {', '.join(SPAN_KINDS)})")


def swap_spans(caption: str, offsets: Sequence[tuple[int, int]], first: tuple[int, int],
               second: tuple[int, int], proper: Sequence[bool]) -> str:
    """`caption` with token spans `first` < `second` exchanged, whitespace between them kept.

    A span moved away from the caption's start is lower-cased at its first letter unless it begins
    with a proper noun; the span moved to the start takes the capitalisation the caption had there.
    """
    a_start, a_end = offsets[first[0]][0], offsets[first[1] - 1][1]
    b_start, b_end = offsets[second[0]][0], offsets[second[1] - 1][1]
    a_text, b_text = caption[a_start:a_end], caption[b_start:b_end]
    if a_start == 0 and a_text[:1].isupper() and not proper[first[0]] and a_text.split()[0] != "I":
        a_text, b_text = a_text[0].lower() + a_text[1:], b_text[0].upper() + b_text[1:]
    return caption[:a_start] + b_text + caption[a_end:b_start] + a_text + caption[b_end:]


MAX_CAPTION_CHARS = 10_000
MAX_PAIRS = 1_000


def _pairs(group: Sequence[tuple[int, int]]) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    for i, first in enumerate(group):
        for second in group[i + 1:]:
            yield first, second


@register("negclip-swap")
class NegClipSwap(NegativeGenerator):
    def __init__(self, kinds: Sequence[str] = SPAN_KINDS, max_caption_chars: int = MAX_CAPTION_CHARS,
                 max_pairs: int = MAX_PAIRS):
        unknown = [k for k in kinds if k not in SPAN_KINDS]
        if unknown or not kinds:
            raise ValueError(f"kinds {list(kinds)}: unknown {unknown} (known: {', '.join(SPAN_KINDS)})")
        for name, value in (("max_caption_chars", max_caption_chars), ("max_pairs", max_pairs)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.kinds = tuple(kinds)
        self.max_caption_chars, self.max_pairs = max_caption_chars, max_pairs

    def propose(self, parsed: ParsedCaption) -> Proposal:
        proposal = Proposal()
        if not parsed.tokens:
            return proposal
        if len(parsed.caption) > self.max_caption_chars:
            proposal.rejected["caption_too_long"] += 1
            return proposal
        offsets = parsed.token_offsets()
        proper = [p == "PROPN" for p in parsed.pos]
        seen = {parsed.caption}
        for kind in self.kinds:
            for group in span_groups(parsed, kind):
                n_pairs = len(group) * (len(group) - 1) // 2
                if n_pairs > self.max_pairs:
                    proposal.rejected["pair_limit"] += n_pairs - self.max_pairs
                for first, second in itertools.islice(_pairs(group), self.max_pairs):
                    first_text = " ".join(parsed.tokens[first[0]:first[1]])
                    second_text = " ".join(parsed.tokens[second[0]:second[1]])
                    if first_text.lower() == second_text.lower():
                        proposal.rejected["identical_to_caption"] += 1
                        continue
                    text = swap_spans(parsed.caption, offsets, first, second, proper)
                    if text in seen:
                        reason = "identical_to_caption" if text == parsed.caption else "duplicate"
                        proposal.rejected[reason] += 1
                        continue
                    seen.add(text)
                    keyword = f"{parsed.caption[offsets[first[0]][0]:offsets[first[1] - 1][1]]}|" \
                              f"{parsed.caption[offsets[second[0]][0]:offsets[second[1] - 1][1]]}"
                    proposal.by_type.setdefault(kind, []).append(
                        Negative(text=text, type=kind, keyword=keyword, token_spans=(first, second)))
        return proposal
