"""LLM text generation for negatives: settings, requests (prompts), backends and output validation.

A request is one prompt for one caption (a DeGLA rewrite type, or the ConcretePlant keyword prompt),
with the type the negative will carry and the keyword it must change (if any). This package knows
nothing of the negatives stage: `compo.negatives.llm.run_requests` sends the requests to a backend,
validates every completion (`compo.llm.validate`) and turns the accepted ones into negatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compo.devices import DEVICES
from compo.llm.prompts import concreteplant_prompt, degla_prompt
from compo.parse import ParsedCaption

BACKENDS = ("vllm", "transformers")
# The vLLM engine's sizing (`vllm.LLM` arguments), the generator's `vllm` mapping; the defaults fit a model
# whose weights take at most half of one GPU (docs/paper-costs.md has a table per model and GPU).
VLLM_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1,        # GPUs one shard's engine spans (the shard job asks for as many)
    "gpu_memory_utilization": 0.9,    # share of each GPU's memory vLLM takes (weights + KV cache)
    "max_model_len": 2048,            # tokens of prompt + completion it plans the KV cache for
    "dtype": "auto",                  # the weights' own (bf16 for Llama 3.1 and Qwen3)
    "max_num_seqs": 256,              # sequences decoded at once (the batch)
}
VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")


def vllm_engine_args(options: dict[str, Any] | None) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM` (besides the model) from a generator's `vllm` mapping; an unknown
    key or a value out of range is a ValueError naming it."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(VLLM_DEFAULTS))
    if unknown:
        raise ValueError(f"vllm.{unknown[0]}: unknown (known: {', '.join(VLLM_DEFAULTS)})")
    args = {**VLLM_DEFAULTS, **options}
    for key in ("tensor_parallel_size", "max_model_len", "max_num_seqs"):
        if not isinstance(args[key], int) or args[key] < 1:
            raise ValueError(f"vllm.{key}: {args[key]!r} must be an integer >= 1")
    if not 0 < float(args["gpu_memory_utilization"]) <= 1:
        raise ValueError(f"vllm.gpu_memory_utilization: {args['gpu_memory_utilization']} must be in (0, 1]")
    if args["dtype"] not in VLLM_DTYPES:
        raise ValueError(f"vllm.dtype: {args['dtype']!r} unknown (known: {', '.join(VLLM_DTYPES)})")
    return args


@dataclass(frozen=True)
class LLMSettings:
    """Config keys of an LLM generator: model, backend, shards, max_new_tokens, temperature (+ bounds),
    device (auto | cpu | cuda, compo.devices; the transformers backend runs there, vLLM always on GPUs) and
    `vllm` (the vLLM engine's sizing, `vllm_engine_args`; only with backend vllm)."""

    model: str
    backend: str = "vllm"
    device: str = "auto"
    shards: int = 1
    max_new_tokens: int = 64
    temperature: float = 0.7
    min_ratio: float = 0.5
    max_ratio: float = 2.0
    vllm: dict[str, Any] | None = None

    @property
    def engine_args(self) -> dict[str, Any]:
        return vllm_engine_args(self.vllm)

    @property
    def gpus(self) -> int:
        """GPUs one shard needs: the vLLM engine's tensor-parallel size; the transformers backend uses one."""
        return self.engine_args["tensor_parallel_size"] if self.backend == "vllm" else 1

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
        if settings.device not in DEVICES:
            raise ValueError(f"device {settings.device!r}: unknown (known: {', '.join(DEVICES)})")
        if int(settings.shards) < 1 or int(settings.max_new_tokens) < 1:
            raise ValueError(f"shards {settings.shards} and max_new_tokens {settings.max_new_tokens} must be >= 1")
        if not 0 <= float(settings.temperature) <= 5:
            raise ValueError(f"temperature {settings.temperature}: must be in [0, 5]")
        if not 0 < settings.min_ratio <= 1 <= settings.max_ratio:
            raise ValueError(f"min_ratio {settings.min_ratio} / max_ratio {settings.max_ratio}: "
                             "need 0 < min <= 1 <= max")
        if settings.vllm is not None and settings.backend != "vllm":
            raise ValueError(f"vllm: the engine settings apply to backend vllm only (backend is {settings.backend})")
        settings.engine_args  # noqa: B018 - validates the vllm mapping now, not in the GPU job
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


def concreteplant_requests(parsed: Sequence[ParsedCaption], choices: Sequence[Any], policy: str) -> list[Request]:
    """One request per caption with a chosen keyword (a `compo.concreteness.KeywordChoice`, or None for
    none); the keyword as written in the caption."""
    requests = []
    for i, (p, choice) in enumerate(zip(parsed, choices, strict=True)):
        if choice is None:
            continue
        span = (choice.token, choice.token + choice.length)
        written = " ".join(p.tokens[span[0]:span[1]])
        requests.append(Request(i, concreteplant_prompt(p.caption, written, choice.category, policy),
                                choice.category, written, (span,)))
    return requests


__all__ = ["BACKENDS", "VLLM_DEFAULTS", "LLMSettings", "Request", "concreteplant_requests", "degla_requests",
           "vllm_engine_args"]
