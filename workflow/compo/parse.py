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
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from compo.io import iter_table, table_writer

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

# The columns of a `parse` row that ParsedCaption.from_row reads
ROW_COLUMNS = ("caption", "tokens", "lemmas", "pos", "tags", "deps", "heads", "noun_phrase_starts", "noun_phrase_ends")


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
        return list(self.iter_texts(texts, processes))

    def iter_texts(self, texts: Iterable[str], processes: int = 1) -> Iterator[ParsedCaption]:
        """`parse_texts` as a stream: each caption's analysis as soon as spaCy has it, in order."""
        docs = self.nlp.pipe(texts, batch_size=self.batch_size, n_process=max(1, int(processes)))
        return (ParsedCaption.from_doc(doc) for doc in docs)

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


class NounPhraseTally:
    """Counts and micro-averaged noun-phrase precision / recall / F1 against the ground truth, per group ('all' and
    each caption_kind), added to caption by caption (a manifest of millions is never held whole)."""

    FIELDS = ("captions", "parsed", "no_words", "no_noun_phrase", "with_gt_noun_phrases", "np_true_positive",
              "np_predicted", "np_ground_truth")

    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {"all": Counter()}

    def add(self, caption_kind: str | None, n_words: int, noun_phrases: Sequence[str],
            gt_noun_phrases: Sequence[str] | None) -> None:
        caption = Counter(captions=1, parsed=int(n_words > 0), no_words=int(n_words == 0),
                          no_noun_phrase=int(len(noun_phrases) == 0))
        if gt_noun_phrases is not None:
            tp, predicted, gold = noun_phrase_matches(list(noun_phrases), list(gt_noun_phrases))
            caption.update(with_gt_noun_phrases=1, np_true_positive=tp, np_predicted=predicted, np_ground_truth=gold)
        for group in ("all", "unknown" if caption_kind is None or pd.isna(caption_kind) else caption_kind):
            self.counts.setdefault(group, Counter()).update(caption)

    def report(self) -> pd.DataFrame:
        records = []
        for name in ["all", *sorted(g for g in self.counts if g != "all")]:
            count = {field: int(self.counts[name][field]) for field in self.FIELDS}
            tp = count["np_true_positive"]
            precision, recall = _ratio(tp, count["np_predicted"]), _ratio(tp, count["np_ground_truth"])
            with_gt = count["with_gt_noun_phrases"]
            f1 = _ratio(2 * precision * recall, precision + recall) if tp else _ratio(0.0, with_gt)
            records.append({"group": name, **count, "np_precision": precision, "np_recall": recall, "np_f1": f1})
        return pd.DataFrame.from_records(records)


def noun_phrase_report(rows: pd.DataFrame) -> pd.DataFrame:
    """Per group ('all' and each caption_kind): counts and micro-averaged NP precision/recall/F1.

    `rows` needs columns caption_kind, n_words, noun_phrases, gt_noun_phrases (None where unknown).
    """
    tally = NounPhraseTally()
    for kind, n_words, predicted, truth in zip(rows["caption_kind"], rows["n_words"], rows["noun_phrases"],
                                               rows["gt_noun_phrases"], strict=True):
        tally.add(kind, n_words, predicted, truth)
    return tally.report()


PARSE_CHUNK = 10_000  # captions read, parsed and written at a time: the stage's memory, whatever the manifest's size


def parse_manifest(manifest: str | Path, out: str | Path, report: str | Path, spacy_model: str,
                   batch_size: int, processes: int = 1, chunk: int = PARSE_CHUNK) -> None:
    """Parse every caption of `manifest` (in `processes` spaCy processes: the job's CPUs); write the `parse`
    table to `out` and the NP report CSV. The manifest is read, and the table written, `chunk` captions at a time
    (one spaCy stream over all of them), so the peak memory does not grow with the manifest."""
    parser = Parser(spacy_model, batch_size=batch_size)
    pending: deque[tuple[str, Any, Any]] = deque()  # of the captions handed to spaCy, in order: id, kind, truth

    def captions() -> Iterator[str]:
        for frame in iter_table(manifest, "manifest", chunk):  # the contract refuses empty captions
            pending.extend(zip(frame["caption_id"], frame["caption_kind"], frame["gt_noun_phrases"], strict=True))
            yield from frame["caption"]

    tally, rows = NounPhraseTally(), []
    with table_writer(out, "parse") as write:
        for parsed in parser.iter_texts(captions(), processes):
            caption_id, kind, truth = pending.popleft()
            rows.append(parsed.to_row(caption_id))
            tally.add(kind, rows[-1]["n_words"], rows[-1]["noun_phrases"], None if truth is None else list(truth))
            if len(rows) == chunk:
                write(_parse_frame(rows))
                rows = []
        if rows or not tally.counts["all"]["captions"]:
            write(_parse_frame(rows))

    summary = tally.report()
    Path(report).parent.mkdir(parents=True, exist_ok=True)
    summary.to_csv(report, index=False)
    overall = summary.iloc[0]
    log.info("parsed %d captions from %s: %d without words, %d without a noun phrase; "
             "NP P/R/F1 %.3f/%.3f/%.3f",
             overall["captions"], manifest, overall["no_words"], overall["no_noun_phrase"],
             overall["np_precision"], overall["np_recall"], overall["np_f1"])


def _parse_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=PARSE_COLUMNS)
    return table.astype({"caption_id": str, "caption": str, "n_words": "int64", "yngve_mean": "float64",
                         "yngve_max": "int64"})
