"""DeGLA's few-shot prompts: five examples per rewrite type as the seed's Figure 8 asks (<example1..5>), Figure 9's
two first, the three of ours each obeying its type's rule (checked with the study's spaCy parser)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from compo.llm.prompts import DEGLA_EXAMPLES, DEGLA_RULES, FIGURE_9_EXAMPLES, degla_prompt

# seed 000 Figure 9, verbatim: the first two examples of each type
FIGURE_9 = {
    "reshuffle": "The sun rises over the mountains, casting a golden glow.",
    "adjective_replace": "The fluffy white cat sat on the soft blue cushion.",
    "adjective_swap": "The fluffy white cat chased the sleek black dog.",
    "noun_swap": "The cat chased the dog around the garden.",
    "noun_replace": "The dog uncovered the bone in the yard.",
}
SWAPPED = {"noun_swap": {"NOUN"}, "adjective_swap": {"ADJ"}}
REPLACED = {"noun_replace": {"NOUN"}, "adjective_replace": {"ADJ"}}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _aligned_words(parser, text: str) -> tuple[list[str], list[str]]:  # noqa: ANN001 - compo.parse.Parser
    parsed = parser.parse_text(text)
    return [parsed.tokens[i].lower() for i in parsed.word_indices], [parsed.pos[i] for i in parsed.word_indices]


def test_every_prompt_carries_five_examples_figure_9s_first() -> None:
    assert set(DEGLA_EXAMPLES) == set(DEGLA_RULES)
    for rewrite_type, examples in DEGLA_EXAMPLES.items():
        assert len(examples) == 5, rewrite_type
        assert examples[0][0] == FIGURE_9[rewrite_type], rewrite_type
        prompt = degla_prompt("A dog on grass.", rewrite_type)
        assert prompt.count(" -> ") == 5 and all(f"<{a} -> {b}>" in prompt for a, b in examples), rewrite_type
        # a rewrite of every example is a different sentence, and the swaps and reshuffles keep the words
        # (Figure 9's two as well); replacements keep the length
        for original, rewritten in examples:
            assert _words(original) != _words(rewritten), original
            if rewrite_type in ("reshuffle", *SWAPPED):
                assert Counter(_words(original)) == Counter(_words(rewritten)), original
            else:
                assert len(_words(original)) == len(_words(rewritten)), original


@pytest.mark.parametrize("rewrite_type", sorted(DEGLA_RULES))
def test_our_examples_obey_their_types_rule(parser, rewrite_type: str) -> None:  # noqa: ANN001
    """Ours (after Figure 9's): a swap exchanges exactly two words of the swapped part of speech; a replacement
    changes only words of its part of speech; a reshuffle reorders the same words well beyond a single swap."""
    for original, rewritten in DEGLA_EXAMPLES[rewrite_type][FIGURE_9_EXAMPLES:]:
        if rewrite_type == "reshuffle":
            a, b = _words(original), _words(rewritten)
            assert sorted(a) == sorted(b) and sum(x != y for x, y in zip(a, b, strict=True)) > len(a) // 2, original
            continue
        words, pos = _aligned_words(parser, original)
        new, _ = _aligned_words(parser, rewritten)
        assert len(words) == len(new), original
        changed = [i for i, (x, y) in enumerate(zip(words, new, strict=True)) if x != y]
        if rewrite_type in SWAPPED:
            assert len(changed) == 2, original
            i, j = changed
            assert (words[i], words[j]) == (new[j], new[i]), original
            assert {pos[i], pos[j]} <= SWAPPED[rewrite_type], (original, pos[i], pos[j])
        else:
            assert changed and {pos[i] for i in changed} <= REPLACED[rewrite_type], (original, changed, pos)
