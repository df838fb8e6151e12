"""A recipe's text handling at evaluation time (LongCLIP_70, seed 004: inputs truncated to 70 words).

A method recipe may set `text.truncate_words: N`; its models are then evaluated on texts cut to their
first N whitespace-separated words, before the model's own tokenizer (which still truncates to its
context). Training is unaffected: LongCLIP_70 is LongCLIP evaluated under this protocol. The evaluation
rule reads N from the recipe and passes it on (`compo evaluate --truncate-words N`):
`loaded = with_text_protocol(load_model(model_dir), N)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from compo.models import LoadedModel


def truncate_words(text: str, n_words: int) -> str:
    """The first `n_words` whitespace-separated words of `text`, joined by single spaces."""
    return " ".join(text.split()[:n_words])


def truncating_tokenizer(tokenizer: Callable[..., torch.Tensor], n_words: int) -> Callable[..., torch.Tensor]:
    def tokenize(texts: str | list[str], *args: Any, **kwargs: Any) -> torch.Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        return tokenizer([truncate_words(text, n_words) for text in texts], *args, **kwargs)

    return tokenize


def _check(n_words: int | None) -> None:
    if n_words is not None and (not isinstance(n_words, int) or n_words < 1):
        raise ValueError(f"text protocol: truncate_words must be a positive integer, got {n_words!r}")


def with_text_protocol(loaded: LoadedModel, n_words: int | None) -> LoadedModel:
    """`loaded` whose tokenizer cuts texts to `n_words` words (unchanged for None)."""
    _check(n_words)
    if n_words is None:
        return loaded
    return replace(loaded, tokenizer=truncating_tokenizer(loaded.tokenizer, n_words))


def protocol_suffix(n_words: int | None) -> str:
    """A suffix for the result's protocol name, e.g. "+truncate70" ("" without text handling)."""
    _check(n_words)
    return "" if n_words is None else f"+truncate{n_words}"
