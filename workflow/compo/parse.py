"""spaCy analysis of captions: tokens, lemmas, POS, dependency heads, noun phrases, Yngve depth.

`parse_manifest` is the workflow stage (manifest -> `parse` table + a noun-phrase quality report);
`Parser.parse_texts` parses strings in memory for the negative generators and FSC-CLIP's online
negatives; `ParsedCaption.from_row` rebuilds the same object from a row of the `parse` table, so
offline and online code paths see one representation.

Yngve depth (Yngve 1960) adapted to dependency trees, the caption-complexity measure of the
long-caption study (seed 004). Every head word and its dependents form one constituent whose members,
in sentence order, are the head word itself and the subtree of each dependent. Within a constituent of
L members, the member at position p has L - 1 - p members still pending to its right. A word's depth
is the sum of those pending counts along the path from its sentence root to the word, ending with the
word's own position inside its own constituent. "a red circle" (circle heads a and red) gives
a=2, red=1, circle=0, exactly the constituency-tree Yngve depths of (NP a red circle). Each sentence
root starts at 0 (a multi-sentence caption is a forest), punctuation stays in the tree as a leaf (as
in Penn-Treebank trees), and the caption's mean and max are taken over non-punctuation tokens.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from compo.io import read_table, write_table

log = logging.getLogger(__name__)

# Seed 002, section 2.2 (footnote): the POS tags whose tokens can be perturbation keywords.
KEYWORD_POS = frozenset({"NOUN", "PROPN", "ADJ", "NUM", "ADP", "VERB"})
# Components the parse never reads; excluding them (not just disabling) also skips loading them.
EXCLUDED_COMPONENTS = ("ner", "senter")
REQUIRED_COMPONENTS = ("tok2vec", "tagger", "attribute_ruler", "lemmatizer", "parser")
# Leading words dropped before comparing noun phrases with the ground truth: the world's phrases and
# spaCy's noun chunks disagree on whether "a"/"the" belong to the phrase, and the determiner carries
# no content the comparison is about.
DETERMINERS = frozenset(
    {"a", "an", "the", "this", "that", "these", "those", "some", "any", "each", "every", "its", "their",
     "his", "her", "our", "my", "your"}
)
PARSE_COLUMNS = ["caption_id", "caption", "tokens", "lemmas", "pos", "tags", "deps", "heads", "noun_phrases",
                 "noun_phrase_starts", "noun_phrase_ends", "keyword_candidates", "n_words", "yngve_mean",
                 "yngve_max"]


@dataclass
class ParsedCaption:
    """One caption's spaCy analysis; token-level lists are aligned."""

    caption: str
    tokens: list[str]
    lemmas: list[str]
    pos: list[str]
    tags: list[str]
    deps: list[str]
    heads: list[int]
    noun_phrase_spans: list[tuple[int, int]] = field(default_factory=list)  # token [start, end)

    @property
    def noun_phrases(self) -> list[str]:
        offsets = self.token_offsets()
        return [self.caption[offsets[s][0]:offsets[e - 1][1]] for s, e in self.noun_phrase_spans]

    @property
    def keyword_candidates(self) -> list[int]:
        return [i for i, p in enumerate(self.pos) if p in KEYWORD_POS]

    @property
    def word_indices(self) -> list[int]:
        return [i for i, p in enumerate(self.pos) if p != "PUNCT" and not self.tokens[i].isspace()]

    @property
    def n_words(self) -> int:
        return len(self.word_indices)

    def yngve(self) -> tuple[float, int]:
        """Mean and max Yngve depth over words (0.0, 0 for a caption without words)."""
        depths = yngve_depths(self.heads)
        words = [depths[i] for i in self.word_indices]
        if not words:
            return 0.0, 0
        return sum(words) / len(words), max(words)

    def token_offsets(self) -> list[tuple[int, int]]:
        """Character [start, end) of each token in `caption` (spaCy tokens are verbatim substrings)."""
        offsets, position = [], 0
        for token in self.tokens:
            start = self.caption.find(token, position)
            if start < 0:
                raise ValueError(f"token {token!r} not found in caption {self.caption!r} after {position}")
            offsets.append((start, start + len(token)))
            position = start + len(token)
        return offsets

    def to_row(self, caption_id: str) -> dict[str, Any]:
        mean, deepest = self.yngve()
        return {
            "caption_id": caption_id,
            "caption": self.caption,
            "tokens": self.tokens,
            "lemmas": self.lemmas,
            "pos": self.pos,
            "tags": self.tags,
            "deps": self.deps,
            "heads": self.heads,
            "noun_phrases": self.noun_phrases,
            "noun_phrase_starts": [s for s, _ in self.noun_phrase_spans],
            "noun_phrase_ends": [e for _, e in self.noun_phrase_spans],
            "keyword_candidates": self.keyword_candidates,
            "n_words": self.n_words,
            "yngve_mean": mean,
            "yngve_max": deepest,
        }

    @classmethod
    def from_row(cls, row: Any) -> ParsedCaption:
        """Rebuild from a row (mapping or pandas row) of the `parse` table."""
        return cls(
            caption=row["caption"],
            tokens=list(row["tokens"]),
            lemmas=list(row["lemmas"]),
            pos=list(row["pos"]),
            tags=list(row["tags"]),
            deps=list(row["deps"]),
            heads=[int(h) for h in row["heads"]],
            noun_phrase_spans=[(int(s), int(e)) for s, e in zip(row["noun_phrase_starts"],
                                                                row["noun_phrase_ends"], strict=True)],
        )

    @classmethod
    def from_doc(cls, doc: Any) -> ParsedCaption:
        return cls(
            caption=doc.text,
            tokens=[t.text for t in doc],
            lemmas=[t.lemma_ for t in doc],
            pos=[t.pos_ for t in doc],
            tags=[t.tag_ for t in doc],
            deps=[t.dep_ for t in doc],
            heads=[t.head.i for t in doc],
            noun_phrase_spans=[(chunk.start, chunk.end) for chunk in doc.noun_chunks],
        )


def yngve_depths(heads: Sequence[int]) -> list[int]:
    """Yngve depth of every token of a dependency forest (`heads[i] == i` marks a root).

    Definition in the module docstring. Raises ValueError on a head out of range or a cycle.
    """
    n = len(heads)
    children: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i, h in enumerate(heads):
        if not 0 <= h < n:
            raise ValueError(f"head {h} of token {i} is out of range for {n} tokens")
        if h == i:
            roots.append(i)
        else:
            children[h].append(i)

    depths = [-1] * n
    stack = [(root, 0) for root in roots]  # (head word, depth offset of its constituent)
    while stack:
        head, offset = stack.pop()
        members = sorted([head, *children[head]])
        for position, member in enumerate(members):
            pending = len(members) - 1 - position
            if member == head:
                depths[head] = offset + pending
            else:
                stack.append((member, offset + pending))
    if -1 in depths:
        unreachable = depths.index(-1)
        raise ValueError(f"dependency heads {list(heads)} contain a cycle (token {unreachable} unreachable)")
    return depths


@cache
def load_spacy(model: str) -> Any:
    """The spaCy pipeline `model` without the components the parse does not need (cached per process)."""
    import spacy

    try:
        nlp = spacy.load(model, exclude=list(EXCLUDED_COMPONENTS))
    except OSError as error:
        raise OSError(f"spaCy model {model!r} not installed (config parse.spacy_model): {error}") from error
    missing = [c for c in REQUIRED_COMPONENTS if c not in nlp.pipe_names]
    if missing:
        raise ValueError(f"spaCy model {model!r} lacks components {missing} (needed for lemmas, noun chunks)")
    return nlp


class Parser:
    """Parses strings in memory with one spaCy pipeline; the workflow stage and online code share it."""

    def __init__(self, spacy_model: str, batch_size: int = 256):
        self.nlp = load_spacy(spacy_model)
        self.batch_size = batch_size

    def parse_texts(self, texts: Iterable[str], processes: int = 1) -> list[ParsedCaption]:
        """Parsed in order; `processes` > 1 parses batches in that many worker processes (spaCy's n_process),
        the same analyses as one process (each caption is parsed on its own)."""
        docs = self.nlp.pipe(texts, batch_size=self.batch_size, n_process=max(1, int(processes)))
        return [ParsedCaption.from_doc(doc) for doc in docs]

    def parse_text(self, text: str) -> ParsedCaption:
        return ParsedCaption.from_doc(self.nlp(text))


def normalise_phrase(phrase: str) -> str:
    """Lower-case, collapse whitespace, drop leading determiners (see DETERMINERS)."""
    words = re.findall(r"[\w'-]+", phrase.lower())
    while words and words[0] in DETERMINERS:
        words = words[1:]
    return " ".join(words)


def noun_phrase_matches(predicted: Sequence[str], truth: Sequence[str]) -> tuple[int, int, int]:
    """(true positives, predicted, ground truth) counting normalised phrases as multisets."""
    pred = Counter(p for p in map(normalise_phrase, predicted) if p)
    gold = Counter(g for g in map(normalise_phrase, truth) if g)
    return sum((pred & gold).values()), sum(pred.values()), sum(gold.values())


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def noun_phrase_report(rows: pd.DataFrame) -> pd.DataFrame:
    """Per group ('all' and each caption_kind): counts and micro-averaged NP precision/recall/F1.

    `rows` needs columns caption_kind, n_words, noun_phrases, gt_noun_phrases (None where unknown).
    """
    kinds = rows["caption_kind"].fillna("unknown")
    groups = [("all", rows)] + [(kind, rows[kinds == kind]) for kind in sorted(kinds.unique())]
    records = []
    for name, group in groups:
        tp = n_pred = n_gold = with_gt = 0
        for predicted, truth in zip(group["noun_phrases"], group["gt_noun_phrases"], strict=True):
            if truth is None:
                continue
            with_gt += 1
            t, p, g = noun_phrase_matches(list(predicted), list(truth))
            tp, n_pred, n_gold = tp + t, n_pred + p, n_gold + g
        precision, recall = _ratio(tp, n_pred), _ratio(tp, n_gold)
        records.append({
            "group": name,
            "captions": len(group),
            "parsed": int((group["n_words"] > 0).sum()),
            "no_words": int((group["n_words"] == 0).sum()),
            "no_noun_phrase": int(sum(len(p) == 0 for p in group["noun_phrases"])),
            "with_gt_noun_phrases": with_gt,
            "np_true_positive": tp,
            "np_predicted": n_pred,
            "np_ground_truth": n_gold,
            "np_precision": precision,
            "np_recall": recall,
            "np_f1": _ratio(2 * precision * recall, precision + recall) if tp else _ratio(0.0, with_gt),
        })
    return pd.DataFrame.from_records(records)


def parse_manifest(manifest: str | Path, out: str | Path, report: str | Path, spacy_model: str,
                   batch_size: int, processes: int = 1) -> None:
    """Parse every caption of `manifest` (in `processes` spaCy processes: the job's CPUs); write the `parse`
    table to `out` and the NP report CSV."""
    frame = read_table(manifest, "manifest")  # the contract refuses empty captions

    parser = Parser(spacy_model, batch_size=batch_size)
    parsed = parser.parse_texts(frame["caption"].tolist(), processes)
    table = pd.DataFrame([p.to_row(cid) for p, cid in zip(parsed, frame["caption_id"], strict=True)],
                         columns=PARSE_COLUMNS)
    table = table.astype({"caption_id": str, "caption": str, "n_words": "int64", "yngve_mean": "float64",
                          "yngve_max": "int64"})
    write_table(table, out, "parse")

    gt = frame["gt_noun_phrases"].map(lambda v: None if v is None else list(v))
    summary = noun_phrase_report(pd.DataFrame({
        "caption_kind": frame["caption_kind"], "n_words": table["n_words"],
        "noun_phrases": table["noun_phrases"], "gt_noun_phrases": gt,
    }))
    Path(report).parent.mkdir(parents=True, exist_ok=True)
    summary.to_csv(report, index=False)
    overall = summary.iloc[0]
    log.info("parsed %d captions from %s: %d without words, %d without a noun phrase; "
             "NP P/R/F1 %.3f/%.3f/%.3f",
             overall["captions"], manifest, overall["no_words"], overall["no_noun_phrase"],
             overall["np_precision"], overall["np_recall"], overall["np_f1"])
