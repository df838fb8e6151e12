"""Negatives a seed released, read from its file: DeGLA's LLM negatives (seed 000, `degla-released`).

DeGLA's README releases the hard negatives it trained on (Hugging Face `wsdwJohn1231/DeGLA`, Google Drive,
Baidu); its training script reads them as `data/DeGLA.json`. The file's layout, as the released data loader
(xiaoxing2001/DeGLA `src/training/data.py`, `COM_COCO`) reads it: a JSON list of records, each with the COCO
2014 train `image_id`, the positive caption under `original` and its LLM negatives under `enhanced`, of which
the loader takes the first four in order (K = 4). Reading that file separates DeGLA's loss from its negative
generation: the same loss on the released negatives and on `degla-llm`'s regenerated ones.

A caption of the study's manifest is matched by its text (whitespace collapsed, as the dataset stage writes
captions); its negatives are the record's first k in the released order (slot i = `enhanced[i]`), with type
`released`. A caption the file does not hold gets no negatives (reason `not_in_release`, counted in the
negatives report); a caption text the file holds twice with different negatives keeps the first record's
(counted, `ambiguous_in_release`). Negatives equal to their caption, empty or repeated are dropped (counted)
as every generator drops them.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from compo.negatives.base import Negative, NegativeGenerator, Proposal, register
from compo.parse import ParsedCaption
from compo.paths import has_visible_text

NOT_IN_RELEASE = "not_in_release"  # also Proposal.shortfall_reason's


def _collapse(text: str) -> str:
    return " ".join(text.split())


@register("degla-released")
class ReleasedNegatives(NegativeGenerator):
    """Each caption's negatives from a released file: `path` (DeGLA.json), the caption key (`original`) and
    the negatives key (`enhanced`) of its records."""

    def __init__(self, path: str, caption_key: str = "original", negatives_key: str = "enhanced") -> None:
        # the file is read when the negatives stage first samples, not when the config is loaded (a dry run or
        # `compo plan` without the data); `compo inputs` and the DAG build's preflight check it is there and parses
        self.path, self.caption_key, self.negatives_key = Path(path), caption_key, negatives_key
        self._negatives: dict[str, list[str]] | None = None
        self.ambiguous: set[str] = set()

    @property
    def negatives(self) -> dict[str, list[str]]:
        """Caption text (whitespace collapsed) -> its released negatives, read once."""
        if self._negatives is None:
            self._negatives = self._read()
        return self._negatives

    def _read(self) -> dict[str, list[str]]:
        path, caption_key, negatives_key = self.path, self.caption_key, self.negatives_key
        try:
            records = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"path {path}: file not found (DeGLA's released negatives, e.g. DeGLA.json)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"path {path}: not a JSON file ({error})") from error
        if not isinstance(records, list) or not records:
            raise ValueError(f"path {path}: expected a non-empty JSON list of records "
                             f"{{{caption_key!r}: caption, {negatives_key!r}: [negatives]}}")
        negatives: dict[str, list[str]] = {}
        for index, record in enumerate(records):
            caption = record.get(caption_key) if isinstance(record, dict) else None
            released = record.get(negatives_key) if isinstance(record, dict) else None
            if not isinstance(caption, str) or not isinstance(released, list) \
                    or not all(isinstance(n, str) for n in released):
                raise ValueError(f"path {path}: record {index}: expected {{{caption_key!r}: a string, "
                                 f"{negatives_key!r}: a list of strings}}, got {json.dumps(record)[:120]}")
            key = _collapse(caption)
            if key in negatives:
                if negatives[key] != released:
                    self.ambiguous.add(key)
                continue
            negatives[key] = released
        return negatives

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        """The first k usable negatives in the released order (no draw: `rng` is not used)."""
        proposal = Proposal()
        key = _collapse(parsed.caption)
        released = self.negatives.get(key)
        if released is None:
            proposal.rejected[NOT_IN_RELEASE] += 1
            return [], proposal
        if key in self.ambiguous:
            proposal.rejected["ambiguous_in_release"] += 1
        kept: list[Negative] = []
        seen: Counter[str] = Counter()
        for text in released:
            text = _collapse(text)
            if not has_visible_text(text):
                proposal.rejected["empty"] += 1
            elif text == key:
                proposal.rejected["identical_to_caption"] += 1
            elif seen[text]:
                proposal.rejected["duplicate"] += 1
            else:
                seen[text] += 1
                kept.append(Negative(text, "released", ""))
        proposal.by_type["released"] = list(kept)
        return kept[:k], proposal

    def propose(self, parsed: ParsedCaption) -> Proposal:
        return self.sample(parsed, random.Random(0), k=0)[1]
