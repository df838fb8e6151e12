"""Text generation backends: vLLM (the cluster path) and Hugging Face transformers.

Both take plain prompts, wrap each in the model's chat template when the tokenizer has one (instruct
models; a base model gets the raw prompt), and return `n` sampled completions per prompt. vLLM is
imported only when used: it is installed by `envs/llm.yaml`, not in the project venv.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol


class Backend(Protocol):
    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[str]]: ...


def _chat(tokenizer: Any, prompt: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt


def import_transformers() -> Any:
    """`transformers`, imported after declaring torchvision's operator schemas: transformers imports
    torchvision, whose PyPI wheel fails on the CPU torch otherwise (see `compo.compat`)."""
    from compo.compat import declare_torchvision_ops

    declare_torchvision_ops()
    import transformers

    return transformers


class TransformersBackend:
    """`AutoModelForCausalLM` + `AutoTokenizer` from a local folder or hub name; batched, left-padded."""

    def __init__(self, model: str, batch_size: int = 8, device: str = "auto"):
        import torch

        from compo.devices import resolve_device

        transformers = import_transformers()
        self.torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = resolve_device(device, "device (LLM generator option)")
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model).to(self.device).eval()
        self.batch_size = batch_size

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[str]]:
        self.torch.manual_seed(seed)
        out: list[list[str]] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = [_chat(self.tokenizer, p) for p in prompts[start:start + self.batch_size]]
            encoded = self.tokenizer(batch, return_tensors="pt", padding=True).to(self.device)
            with self.torch.no_grad():
                generated = self.model.generate(
                    **encoded, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                    temperature=temperature if temperature > 0 else None, num_return_sequences=n,
                    pad_token_id=self.tokenizer.pad_token_id)
            completions = self.tokenizer.batch_decode(generated[:, encoded["input_ids"].shape[1]:],
                                                      skip_special_tokens=True)
            out.extend(completions[i * n:(i + 1) * n] for i in range(len(batch)))
        return out


class VLLMBackend:
    """vLLM's offline `LLM` with `SamplingParams`; the whole shard is submitted as one batch."""

    def __init__(self, model: str, **engine: Any):
        try:
            from vllm import LLM
        except ImportError as error:
            raise ImportError("backend vllm needs the vllm package: run the rule with envs/llm.yaml "
                              "(snakemake --sdm conda) or choose backend: transformers") from error
        self.llm = LLM(model=model, **engine)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[str]]:
        from vllm import SamplingParams

        params = SamplingParams(n=n, max_tokens=max_new_tokens, temperature=temperature, seed=seed)
        results = self.llm.generate([_chat(self.tokenizer, p) for p in prompts], params)
        return [[choice.text for choice in result.outputs] for result in results]


@cache
def load_backend(name: str, model: str, device: str = "auto") -> Backend:
    """One loaded backend per (name, model, device) and process. device: the transformers backend's
    (auto | cpu | cuda); vLLM places the model on the GPUs itself."""
    if name == "transformers":
        return TransformersBackend(model, device=device)
    if name == "vllm":
        return VLLMBackend(model)
    raise ValueError(f"LLM backend {name!r}: unknown (known: vllm, transformers)")
