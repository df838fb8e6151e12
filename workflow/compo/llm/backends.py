"""Text generation backends: vLLM (the cluster path) and Hugging Face transformers.

Both take plain prompts, wrap each in the model's chat template when the tokenizer has one (instruct
models; a base model gets the raw prompt), and return `n` sampled completions per prompt. The template is
applied with thinking disabled (`enable_thinking=False`): Qwen3 (ConcretePlant's generator in
config/paper.yaml) thinks by default, and its template then opens the answer with an empty
`<think></think>` block instead; templates without the variable ignore it. Each prompt samples with its
own seed (one per request, drawn from its caption's RNG), so a caption's completions do not depend on
which other prompts share its batch or shard. vLLM is imported only when used: it is installed by
`envs/llm.yaml`, not in the project venv.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol


class Backend(Protocol):
    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float,
                 seeds: Sequence[int]) -> list[list[str]]: ...


def chat(tokenizer: Any, prompt: str) -> str:
    """The prompt as one user turn in the tokenizer's chat template, thinking disabled (module docstring);
    the raw prompt when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
    return prompt


def import_transformers() -> Any:
    """`transformers`, imported after declaring torchvision's operator schemas: transformers imports
    torchvision, whose PyPI wheel fails on the CPU torch otherwise (see `compo.compat`)."""
    from compo.compat import declare_torchvision_ops

    declare_torchvision_ops()
    import transformers

    return transformers


class TransformersBackend:
    """`AutoModelForCausalLM` + `AutoTokenizer` from a local folder or hub name. Prompts are generated one
    at a time, each seeded with its own seed and unpadded, so a completion does not depend on the batch
    (this backend is the small-scale and test path; vLLM batches on the cluster)."""

    def __init__(self, model: str, device: str = "auto"):
        import torch

        from compo.devices import resolve_device

        transformers = import_transformers()
        self.torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = resolve_device(device, "device (LLM generator option)")
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(model).to(self.device).eval()
        except (pickle.UnpicklingError, EOFError) as error:  # torch's advice (weights_only=False) left out
            raise ValueError(f"{model}: the LLM's weights cannot be read (they hold objects other than tensors and "
                             f"plain containers, which are never unpickled: {type(error).__name__}); fetch them "
                             "again (compo prefetch) or name another model") from None

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float,
                 seeds: Sequence[int]) -> list[list[str]]:
        out: list[list[str]] = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            self.torch.manual_seed(seed)
            encoded = self.tokenizer([chat(self.tokenizer, prompt)], return_tensors="pt").to(self.device)
            with self.torch.no_grad():
                generated = self.model.generate(
                    **encoded, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                    temperature=temperature if temperature > 0 else None, num_return_sequences=n,
                    pad_token_id=self.tokenizer.pad_token_id)
            out.append(self.tokenizer.batch_decode(generated[:, encoded["input_ids"].shape[1]:],
                                                   skip_special_tokens=True))
        return out


class VLLMBackend:
    """vLLM's offline `LLM` with `SamplingParams`; the whole shard is submitted as one batch. `engine`: the
    `vllm.LLM` sizing arguments (compo.llm.vllm_engine_args: tensor parallelism, memory share, context,
    dtype, batch)."""

    def __init__(self, model: str, **engine: Any):
        try:
            from vllm import LLM
        except ImportError as error:
            raise ImportError("backend vllm needs the vllm package: run the rule with envs/llm.yaml "
                              "(snakemake --sdm conda) or choose backend: transformers") from error
        self.llm = LLM(model=model, **engine)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float,
                 seeds: Sequence[int]) -> list[list[str]]:
        from vllm import SamplingParams

        params = [SamplingParams(n=n, max_tokens=max_new_tokens, temperature=temperature, seed=seed)
                  for seed in seeds]  # one per prompt: vLLM seeds each request on its own
        results = self.llm.generate([chat(self.tokenizer, p) for p in prompts], params)
        return [[choice.text for choice in result.outputs] for result in results]


def load_backend(settings: Any) -> Backend:
    """The backend of an LLM generator's settings (compo.llm.LLMSettings), its model read from the model
    cache (compo.artifacts: jobs never download); one per process and settings."""
    return _load_backend(settings.backend, settings.model, settings.device,
                         tuple(sorted(settings.engine_args.items())))


@cache
def _load_backend(name: str, model: str, device: str, engine: tuple[tuple[str, Any], ...]) -> Backend:
    from compo.artifacts import resolve

    local = str(resolve("llm", model))
    if name == "transformers":
        return TransformersBackend(local, device=device)
    if name == "vllm":
        return VLLMBackend(local, **dict(engine))
    raise ValueError(f"LLM backend {name!r}: unknown (known: vllm, transformers)")
