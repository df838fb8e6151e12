"""LLM negatives: `run_requests` (prompts -> validated, drawn negatives) and DeGLA's generator.

`run_requests` sends all requests of a shard to the backend in one batch, asks for `n` completions each,
validates every completion (`compo.llm.validate`) and returns per caption the accepted negatives
(deduplicated) drawn with the caption's RNG, and a Proposal whose `rejected` counter holds the
rejections by reason; the negatives stage writes those counts into its report and log. DeGLA's LLM
negatives (seed 000, section 3.2): one prompt per rewrite type and caption. Config: {generator:
degla-llm, k, model, backend (vllm | transformers), shards, max_new_tokens, temperature, types (default
all five), pick (first | balanced: `PICKS`)}. ConcretePlant's LLM variant is `concreteplant-*` with
`backend: vllm | transformers`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from compo.llm import LLMSettings, Request, degla_requests
from compo.llm.backends import load_backend
from compo.llm.prompts import DEGLA_RULES
from compo.llm.validate import Bounds, validate
from compo.negatives.base import Negative, NegativeGenerator, Proposal, register
from compo.parse import ParsedCaption


def run_requests(settings: LLMSettings, parsed: Sequence[ParsedCaption], requests: Sequence[Request],
                 rngs: Sequence[random.Random], k: int, backend: Any = None,
                 order: Sequence[str] | None = None) -> list[tuple[list[Negative], Proposal]]:
    """Generate, validate and draw up to k negatives per caption (module docstring); with `order` (types), the first
    k in that type order instead of a random draw (`Proposal.first`)."""
    proposals = [Proposal() for _ in parsed]
    for p, proposal in zip(parsed, proposals, strict=True):
        if not p.tokens:
            proposal.rejected["no_keyword"] += 1
    covered = {r.caption_index for r in requests}
    for i, p in enumerate(parsed):
        if p.tokens and i not in covered:
            proposals[i].rejected["no_keyword"] += 1
    if requests:
        engine = backend or load_backend(settings)
        seeds = [rngs[r.caption_index].randrange(2**31) for r in requests]  # per request: batch-independent
        n = max(1, k if len({r.caption_index for r in requests}) == len(requests) else 1)
        completions = engine.generate([r.prompt for r in requests], n, settings.max_new_tokens,
                                      settings.temperature, seeds)
        bounds = Bounds(settings.min_ratio, settings.max_ratio)
        seen: dict[int, set[str]] = {}
        for request, outputs in zip(requests, completions, strict=True):
            caption = parsed[request.caption_index].caption
            proposal = proposals[request.caption_index]
            taken = seen.setdefault(request.caption_index, {caption})
            for raw in outputs:
                text, reason = validate(raw, caption, request.prompt, request.keyword, bounds)
                if text is None:
                    proposal.rejected[reason] += 1
                elif text in taken:
                    proposal.rejected["duplicate"] += 1
                else:
                    taken.add(text)
                    proposal.by_type.setdefault(request.type, []).append(
                        Negative(text, request.type, request.keyword or "", request.token_spans))
    return [(proposal.draw(rng, k) if order is None else proposal.first(order, k), proposal)
            for proposal, rng in zip(proposals, rngs, strict=True)]


# How a caption's k negatives are taken from its rewrites, one per type (`pick`): `first`, the types in `types` order
# (default: the seed's Table 1 order, DEGLA_RULES), as DeGLA's released loader takes `enhanced[0:4]` of each caption's
# five (xiaoxing2001/DeGLA src/training/data.py lines 419-427; the release's type order is not readable here: the
# seed's Table 1 order assumed); `balanced`, k of the types drawn at random (Proposal.draw), one reading of the
# seed's "K = 4 ... due to the merging of two subtypes" (sec. 3.3, line 173), which its appendix does not detail
PICKS = ("first", "balanced")


@register("degla-llm")
class DeglaLLM(NegativeGenerator):
    def __init__(self, types: Sequence[str] = tuple(DEGLA_RULES), pick: str = "first", **llm_options: Any):
        unknown = [t for t in types if t not in DEGLA_RULES]
        if unknown or not types:
            raise ValueError(f"types {list(types)}: unknown {unknown} (known: {', '.join(DEGLA_RULES)})")
        if pick not in PICKS:
            raise ValueError(f"pick {pick!r}: expected one of {', '.join(PICKS)}")
        self.types = tuple(types)
        self.pick = pick
        self.llm = LLMSettings.from_options(**llm_options)

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        return self.sample_batch([parsed], [rng], k)[0]

    def sample_batch(self, parsed: Sequence[ParsedCaption], rngs: Sequence[random.Random], k: int,
                     rows: Sequence[int] | None = None) -> list[tuple[list[Negative], Proposal]]:
        """The rows' prompts (all five types each) in one batch; other captions play no part."""
        rows = range(len(parsed)) if rows is None else rows
        kept = [parsed[i] for i in rows]
        return run_requests(self.llm, kept, degla_requests(kept, self.types), [rngs[i] for i in rows], k,
                            order=self.types if self.pick == "first" else None)
