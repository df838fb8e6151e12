"""The relation table (`resources/relations.tsv`): spatial and interaction phrases and their replacements.

Prepositions and spatial words are not in WordNet, so both the ConcretePlant keyword choice
(`compo.concreteness`: is a token part of a relation?) and the rule replacements
(`compo.negatives.lexicon`) read them from this table. It lives outside both so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

RELATIONS_TABLE = Path(__file__).resolve().parent / "resources" / "relations.tsv"


@cache
def relation_table(path: Path = RELATIONS_TABLE) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Relation phrase (as a word tuple) -> its replacements, from the shipped TSV."""
    table: dict[tuple[str, ...], tuple[str, ...]] = {}
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 2 or not fields[1].strip():
            raise ValueError(f"{path}: row {number} {line!r}: expected 'relation<TAB>replacements'")
        table[tuple(fields[0].split())] = tuple(r.strip() for r in fields[1].split("|"))
    return table


def relation_at(words: Sequence[str], index: int) -> tuple[int, tuple[str, ...]] | None:
    """(length, replacements) of the longest relation phrase of the table starting at word `index`."""
    table = relation_table()
    longest = max(len(k) for k in table)
    for length in range(min(longest, len(words) - index), 0, -1):
        key = tuple(w.lower() for w in words[index:index + length])
        if key in table:
            return length, table[key]
    return None
