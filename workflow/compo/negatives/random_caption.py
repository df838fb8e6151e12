"""Random negatives: another caption of the dataset in the hard-negative slot (the negative control).

NegCLIP's recipe with this generator keeps everything about the hard-negative slot (one more text per
image in the image->text softmax) except its hardness: the negative is a caption of some other image,
so it differs from the positive in everything at once and teaches nothing about binding. If such a
model gains on SugarCrepe swap over plain fine-tuning, the gain came from the extra slot, not from hard
negatives (DESIGN section 8, the negative control).

A caption's negative is drawn uniformly, with its own RNG, from the other captions of the dataset (the
whole parse table, also when one shard is generated) whose text differs. Captions of the same image are not excluded
(the parse table carries no image ids): with thousands of captions such a draw is rare, and the world's
truth checker labels it (truth "true": an accidental hard positive) in the negatives report.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from compo.negatives.base import Negative, NegativeGenerator, Proposal, register
from compo.parse import ParsedCaption


@register("random-caption")
class RandomCaptionGenerator(NegativeGenerator):
    """k distinct other captions of the dataset per caption (type "random")."""

    def sample_batch(self, parsed: Sequence[ParsedCaption], rngs: Sequence[random.Random], k: int,
                     rows: Sequence[int] | None = None) -> list[tuple[list[Negative], Proposal]]:
        texts = [p.caption for p in parsed]
        distinct = sorted(set(texts))  # the pool: every caption of the table, also for one shard's rows
        rows = range(len(parsed)) if rows is None else rows
        out = []
        for text, rng in ((texts[i], rngs[i]) for i in rows):
            proposal = Proposal()
            others = len(distinct) - 1  # every distinct text but the caption's own
            chosen: list[str] = []
            while len(chosen) < min(k, others):
                candidate = distinct[rng.randrange(len(distinct))]
                if candidate != text and candidate not in chosen:
                    chosen.append(candidate)
            negatives = [Negative(candidate, "random", "") for candidate in chosen]
            proposal.by_type["random"] = list(negatives)
            out.append((negatives, proposal))
        return out

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        raise ValueError("random-caption negatives are drawn from the other captions of the dataset: they need "
                         "the whole batch (sample_batch), so they cannot be drawn online for one caption")
