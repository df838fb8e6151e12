"""LLM negative generation shared by every backend: settings, requests, generation and validation.

A request is one prompt for one caption (a DeGLA rewrite type, or the ConcretePlant keyword prompt),
with the type the negative will carry and the keyword it must change (if any). `run_requests` sends all
requests of a shard to the backend in one batch, asks for `n` completions each, validates every
completion (`compo.llm.validate`) and returns per caption the accepted negatives (deduplicated) and a
Proposal whose `rejected` counter holds the rejections by reason; the negatives stage writes those counts
into its report and log.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compo.llm.backends import load_backend
from compo.llm.prompts import concreteplant_prompt, degla_prompt
from compo.llm.validate import Bounds, validate
from compo.parse import ParsedCaption

if TYPE_CHECKING:
    from compo.negatives.base import Negative, Proposal

BACKENDS = ("vllm", "transformers")


@dataclass(frozen=True)
class LLMSettings:
    """Config keys of an LLM generator: model, backend, shards, max_new_tokens, temperature (+ bounds), and
    device (auto | cpu | cuda, compo.devices; the transformers backend runs there, vLLM always on GPUs)."""

    model: str
    backend: str = "vllm"
    device: str = "auto"
    shards: int = 1
    max_new_tokens: int = 64
    temperature: float = 0.7
    min_ratio: float = 0.5
    max_ratio: float = 2.0

    @classmethod
    def from_options(cls, **options: Any) -> LLMSettings:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown LLM options {unknown} (known: {', '.join(sorted(known))})")
        if not options.get("model"):
            raise ValueError("LLM option model: missing (a Hugging Face name or a local folder)")
        settings = cls(**options)
        if settings.backend not in BACKENDS:
            raise ValueError(f"backend {settings.backend!r}: unknown (known: {', '.join(BACKENDS)})")
        from compo.devices import DEVICES  # here: importing torch is for the backends to do

        if settings.device not in DEVICES:
            raise ValueError(f"device {settings.device!r}: unknown (known: {', '.join(DEVICES)})")
        if int(settings.shards) < 1 or int(settings.max_new_tokens) < 1:
            raise ValueError(f"shards {settings.shards} and max_new_tokens {settings.max_new_tokens} must be >= 1")
        if not 0 <= float(settings.temperature) <= 5:
            raise ValueError(f"temperature {settings.temperature}: must be in [0, 5]")
        if not 0 < settings.min_ratio <= 1 <= settings.max_ratio:
            raise ValueError(f"min_ratio {settings.min_ratio} / max_ratio {settings.max_ratio}: "
                             "need 0 < min <= 1 <= max")
        return settings


@dataclass(frozen=True)
class Request:
    caption_index: int
    prompt: str
    type: str
    keyword: str | None = None          # must change (ConcretePlant)
    token_spans: tuple[tuple[int, int], ...] = ()


def degla_requests(parsed: Sequence[ParsedCaption], types: Sequence[str]) -> list[Request]:
    return [Request(i, degla_prompt(p.caption, t), t) for i, p in enumerate(parsed) if p.tokens for t in types]


def concreteplant_requests(parsed: Sequence[ParsedCaption], choices: Sequence[Any], policy: str,
                           k: int) -> list[Request]:
    """One request per caption with a chosen keyword (a `KeywordChoice`); the keyword as written."""
    requests = []
    for i, (p, choice) in enumerate(zip(parsed, choices, strict=True)):
        if choice is None:
            continue
        span = (choice.token, choice.token + choice.length)
        written = " ".join(p.tokens[span[0]:span[1]])
        requests.append(Request(i, concreteplant_prompt(p.caption, written, choice.category, policy),
                                choice.category, written, (span,)))
    return requests


def run_requests(settings: LLMSettings, parsed: Sequence[ParsedCaption], requests: Sequence[Request],
                 rngs: Sequence[random.Random], k: int, backend: Any = None) -> list[tuple[list[Negative], Proposal]]:
    """Generate, validate and draw up to k negatives per caption (module docstring)."""
    from compo.negatives.base import Negative, Proposal  # here: compo.negatives imports this package

    proposals = [Proposal() for _ in parsed]
    for p, proposal in zip(parsed, proposals, strict=True):
        if not p.tokens:
            proposal.rejected["no_keyword"] += 1
    covered = {r.caption_index for r in requests}
    for i, p in enumerate(parsed):
        if p.tokens and i not in covered:
            proposals[i].rejected["no_keyword"] += 1
    if requests:
        engine = backend or load_backend(settings.backend, settings.model, settings.device)
        seed = rngs[requests[0].caption_index].randrange(2**31)
        n = max(1, k if len({r.caption_index for r in requests}) == len(requests) else 1)
        completions = engine.generate([r.prompt for r in requests], n, settings.max_new_tokens,
                                      settings.temperature, seed)
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
    return [(proposal.draw(rng, k), proposal) for proposal, rng in zip(proposals, rngs, strict=True)]


__all__ = ["LLMSettings", "Request", "concreteplant_requests", "degla_requests", "run_requests"]
