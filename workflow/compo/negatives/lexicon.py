"""Word replacement by rules: WordNet 3.0 antonyms and co-hyponyms, a relation table, re-inflection.

Shared by `wordnet-replace`, `degla-rules` (its replace types) and ConcretePlant's rule backend, so all
three change a keyword the same way.

WordNet is Princeton WordNet 3.0 read by NLTK (`nltk.corpus.wordnet`). NLTK cannot download here; the
Debian packages are laid out for it by `scripts/install-wordnet.sh` under `$NLTK_DATA/corpora/wordnet`
(default `<venv>/nltk_data`). A missing WordNet raises `WordNetMissing` naming both.

Replacements of a lemma (FSC-CLIP's `replace`, after CLoVe / SugarCrepe): its direct antonyms first, then
its co-hyponyms ranked by SemCor frequency (`Lemma.count()`, ties alphabetical). Co-hyponyms of a noun or
verb are the other hyponyms of its hypernyms; of an adjective satellite ("red"), the other satellites of
its head adjective (red -> blue, green, ...). Only the most frequent sense is used (`MAX_SENSES`;
an only child such as circle under ellipse takes its hypernym's siblings),
synonyms (lemmas sharing a sense) are excluded (they would be hard positives), and only single lower-case
words are kept (no multi-word lemmas, names or abbreviations).

Prepositions and spatial words are not in WordNet: they come from `resources/relations.tsv` (longest
multi-word phrase first: "in front of" -> "behind").

Re-inflection (the replacement takes the original token's Penn tag): plural nouns (NNS) take the plural
(WordNet's noun.exc irregulars reversed, else -es after s/x/z/ch/sh, consonant+y -> -ies, else -s);
verbs: VBZ like the noun plural, VBG -ing, VBD/VBN -ed, dropping a final silent e, y -> i after a
consonant, doubling a final consonant of one-syllable consonant-vowel-consonant words (sit -> sitting);
irregular past forms come from WordNet's verb.exc reversed (for VBN a form ending in n/ne preferred, for
VBD the other; run/come/become keep the lemma as VBN). Known limit: a lemma with irregular forms missing
from verb.exc gets the regular form. An article "a"/"an" right before the replaced word is corrected to
the new word's first letter.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from compo.parse import ParsedCaption
from compo.relations import RELATIONS_TABLE, relation_at, relation_table  # noqa: F401  (re-exported)

MAX_SENSES = 1
ALL_REPLACEMENTS = 10_000  # max_per_word that keeps every replacement (ranked; a vocabulary filter cuts after)
INSTALL_SCRIPT = "scripts/install-wordnet.sh"
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_WORD = re.compile(r"[a-z]+(-[a-z]+)?")
# Irregular verbs whose past participle is the lemma itself (verb.exc lists only their other forms).
_PARTICIPLE_IS_LEMMA = frozenset({"run", "come", "become", "overcome", "outrun"})
_WN_POS = {"NOUN": "n", "PROPN": "n", "VERB": "v", "ADJ": "a"}


class WordNetMissing(RuntimeError):
    """WordNet 3.0 is not where NLTK looks for it."""


def default_nltk_data() -> Path:
    """`$NLTK_DATA` (first entry), else `nltk_data` inside the running venv."""
    if os.environ.get("NLTK_DATA"):
        return Path(os.environ["NLTK_DATA"].split(os.pathsep)[0])
    return Path(sys.prefix) / "nltk_data"


@cache
def wordnet() -> Any:
    """NLTK's WordNet reader over the laid-out Debian files (cached per process)."""
    import nltk

    root = default_nltk_data()
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    from nltk.corpus import wordnet as wn

    try:
        wn.ensure_loaded()
    except LookupError as error:
        raise WordNetMissing(
            f"WordNet 3.0 not found: expected {root / 'corpora' / 'wordnet'} (with a lexnames file); "
            f"run {INSTALL_SCRIPT} (apt-installs wordnet-base and wordnet-sense-index and lays them out "
            f"for NLTK) or point NLTK_DATA at such a folder") from error
    return wn


def _frequency(lemma: Any) -> int:
    return lemma.count()


def lexical_replacements(lemma: str, pos: str, max_n: int = 10) -> list[tuple[str, str]]:
    """(word, 'antonym' | 'cohyponym') replacements of `lemma` with spaCy POS `pos` (module docstring)."""
    return list(_lexical_replacements(lemma, pos, max_n))


@functools.cache
def _lexical_replacements(lemma: str, pos: str, max_n: int) -> tuple[tuple[str, str], ...]:
    # A pure function of WordNet: cached, because NLTK's lemma counts are binary searches of a file and
    # FSC-CLIP asks again for every caption at every training step.
    wn = wordnet()
    wn_pos = _WN_POS.get(pos)
    if wn_pos is None:
        return []
    key = lemma.lower().replace(" ", "_")
    synsets = wn.synsets(key, pos=wn_pos)[:MAX_SENSES]
    synonyms = {name.lower() for s in synsets for name in s.lemma_names()}
    antonyms: list[str] = []
    cohyponyms: dict[str, int] = {}
    for synset in synsets:
        for own in synset.lemmas():
            if own.name().lower() == key:
                antonyms.extend(a.name() for a in own.antonyms())
        if wn_pos == "a":
            heads = synset.similar_tos() if synset.pos() == "s" else []
            siblings = [s for head in heads for s in head.similar_tos()]
        else:
            siblings = [s for hyper in synset.hypernyms() for s in hyper.hyponyms()]
            if not [s for s in siblings if s != synset]:  # an only child (circle under ellipse): one level up
                siblings = [s for hyper in synset.hypernyms() for up in hyper.hypernyms() for s in up.hyponyms()
                            if s != hyper]
        for sibling in siblings:
            if sibling in synsets:
                continue
            for other in sibling.lemmas():
                cohyponyms[other.name()] = max(cohyponyms.get(other.name(), 0), _frequency(other))
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    ranked = [(w, "antonym") for w in antonyms] + \
             [(w, "cohyponym") for w, _ in sorted(cohyponyms.items(), key=lambda item: (-item[1], item[0]))]
    for word, source in ranked:
        if word in seen or word.lower() in synonyms or not _WORD.fullmatch(word):
            continue
        seen.add(word)
        out.append((word, source))
        if len(out) == max_n:
            break
    return tuple(out)


# --- inflection --------------------------------------------------------------------------------------
def _plural_rule(word: str) -> str:
    if re.search(r"(s|x|z|ch|sh)$", word):
        return word + "es"
    if re.search(r"[^aeiou]y$", word):
        return word[:-1] + "ies"
    return word + "s"


@cache
def _irregular(exc_file: str) -> dict[str, list[str]]:
    """Base form -> irregular inflected forms, reversed from WordNet's noun.exc / verb.exc."""
    path = Path(wordnet().root.path) / exc_file
    forms: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            for base in parts[1:]:
                forms.setdefault(base, []).append(parts[0])
    return forms


def pluralise(noun: str) -> str:
    irregular = [f for f in _irregular("noun.exc").get(noun, []) if "_" not in f]
    return irregular[0] if irregular else _plural_rule(noun)


def _one_syllable_cvc(verb: str) -> bool:
    return len(re.findall(r"[aeiou]+", verb)) == 1 and re.search(r"[^aeiou][aeiou][bdgklmnprt]$", verb) is not None


def inflect_verb(verb: str, tag: str) -> str:
    """`verb` (a lemma) in the form of Penn tag `tag` (VB, VBP, VBZ, VBG, VBD, VBN); rules in the docstring."""
    if tag == "VBZ":
        return _plural_rule(verb)
    irregular = [f for f in _irregular("verb.exc").get(verb, []) if "_" not in f]
    if tag == "VBG":
        ing = [f for f in irregular if f.endswith("ing")]
        if ing:
            return ing[0]
        if verb.endswith("e") and not verb.endswith(("ee", "ye", "oe")) and len(verb) > 2:
            return verb[:-1] + "ing"
        return verb + verb[-1] + "ing" if _one_syllable_cvc(verb) else verb + "ing"
    if tag in ("VBD", "VBN"):
        if tag == "VBN" and verb in _PARTICIPLE_IS_LEMMA:
            return verb
        past = [f for f in irregular if not f.endswith(("ing", "s"))]
        if past:
            participles = [f for f in past if f.endswith(("n", "ne"))]
            if tag == "VBN" and participles:
                return participles[0]
            others = [f for f in past if f not in participles]
            return (others or past)[0]
        if verb.endswith("e"):
            return verb + "d"
        if re.search(r"[^aeiou]y$", verb):
            return verb[:-1] + "ied"
        return verb + verb[-1] + "ed" if _one_syllable_cvc(verb) else verb + "ed"
    return verb


def inflect(word: str, pos: str, tag: str) -> str:
    """A replacement lemma inflected like the token it replaces."""
    if pos in ("NOUN", "PROPN") and tag in ("NNS", "NNPS"):
        return pluralise(word)
    if pos == "VERB":
        return inflect_verb(word, tag)
    return word


# --- edits on a parsed caption -----------------------------------------------------------------------
@dataclass(frozen=True)
class Edit:
    """Replace caption tokens [start, end) with `text`."""

    start: int
    end: int
    text: str
    kind: str       # noun | adjective | verb | relation | number
    source: str     # antonym | cohyponym | table


_KIND = {"NOUN": "noun", "PROPN": "noun", "ADJ": "adjective", "VERB": "verb", "NUM": "number"}


def keyword_edits(parsed: ParsedCaption, index: int, max_per_word: int = 10,
                  length: int = 1, vocabulary: frozenset[str] | None = None) -> list[Edit]:
    """Every rule replacement of the keyword starting at token `index` (`length` tokens, e.g. a two-word
    expression "coffee cup": replaced whole when WordNet knows it, else through its head, the last word).
    `vocabulary` (lower-case words): keep only replacements all of whose words are in it, the first
    `max_per_word` of them in rank order (a generator's `vocabulary: captions`); None: every replacement."""
    if vocabulary is not None:
        edits = _keyword_edits(parsed, index, ALL_REPLACEMENTS, length)
        return [e for e in edits if all(w in vocabulary for w in e.text.lower().split())][:max_per_word]
    return _keyword_edits(parsed, index, max_per_word, length)


def _keyword_edits(parsed: ParsedCaption, index: int, max_per_word: int, length: int) -> list[Edit]:
    relation = relation_at(parsed.tokens, index)
    if relation is not None and (parsed.pos[index] in ("ADP", "ADV") or length == 1):
        span, targets = relation
        return [Edit(index, index + span, t, "relation", "table") for t in targets]
    pos, tag = parsed.pos[index], parsed.tags[index]
    if pos == "NUM":
        word = parsed.tokens[index].lower()
        if word in NUMBER_WORDS:
            n = NUMBER_WORDS.index(word)
            options = [NUMBER_WORDS[i] for i in (n + 1, n - 1) if 0 <= i < len(NUMBER_WORDS)]
        elif word.isdigit():
            options = [str(int(word) + 1)] + ([str(int(word) - 1)] if int(word) > 0 else [])
        else:
            options = []
        return [Edit(index, index + 1, o, "number", "table") for o in options]
    if pos not in _KIND:
        return []
    if length > 1:
        whole = " ".join(parsed.lemmas[index:index + length])
        found = lexical_replacements(whole, pos, max_per_word)
        if found:
            return [Edit(index, index + length, w.replace("_", " "), _KIND[pos], s) for w, s in found]
        index = index + length - 1
        pos, tag = parsed.pos[index], parsed.tags[index]
        if pos not in _KIND:
            return []
    return [Edit(index, index + 1, inflect(w, pos, tag), _KIND[pos], s)
            for w, s in lexical_replacements(parsed.lemmas[index], pos, max_per_word)]


def apply_edit(parsed: ParsedCaption, edit: Edit, offsets: Sequence[tuple[int, int]] | None = None) -> str:
    """The caption with the edit applied: capitalisation kept at the start, a/an agreement fixed."""
    offsets = offsets or parsed.token_offsets()
    start, end = offsets[edit.start][0], offsets[edit.end - 1][1]
    old = parsed.caption[start:end]
    new = edit.text[0].upper() + edit.text[1:] if old[:1].isupper() and start == 0 else edit.text
    text = parsed.caption[:start] + new + parsed.caption[end:]
    if edit.start > 0 and parsed.tokens[edit.start - 1].lower() in ("a", "an"):
        a_start, a_end = offsets[edit.start - 1]
        article = "an" if new[:1].lower() in "aeiou" else "a"
        if parsed.caption[a_start:a_end][:1].isupper():
            article = article.capitalize()
        text = text[:a_start] + article + text[a_end:]
    return text
