"""What every loss module shares: the loss base class, the total of the terms, text encodings."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from compo.losses.terms import STAT_PREFIX, TOTAL
from compo.models import static_shapes


def with_total(terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`terms` plus their sum under "loss" (diagnostics named `stat_*` excluded)."""
    parts = [value for name, value in terms.items() if not name.startswith(STAT_PREFIX)]
    return {**terms, TOTAL: torch.stack(parts).sum()}


class TrainingLoss(nn.Module):
    """Base class: a loss computed from the model and a batch, plus the hooks a method may need."""

    def setup(self, model: nn.Module) -> None:
        """Called once before the first step (and before a resume state is loaded)."""

    def trainable_parameters(self, model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
        """The parameters the optimizer updates; full fine-tuning by default."""
        return ((name, p) for name, p in model.named_parameters() if p.requires_grad)

    @torch.no_grad()
    def after_optimizer_step(self, model: nn.Module) -> None:
        """Called after every optimizer step (e.g. an EMA teacher update)."""

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError


def encode_with_negatives(
    model: nn.Module, texts: torch.Tensor, negatives: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised embeddings of the positives [B, D] and of the negatives [B, K, D] (zeros where masked).

    One text-encoder pass over positives and valid negatives only: masked slots cost nothing. With static
    shapes (compo.models.set_static_shapes) every slot is encoded and the masked ones zeroed: no
    boolean indexing, whose result size the host would have to read from the device.
    """
    if static_shapes(model):
        embedded = model.encode_text(torch.cat([texts, negatives.flatten(0, 1)]), normalize=True)
        slots = embedded[len(texts):].unflatten(0, mask.shape)
        return embedded[: len(texts)], torch.where(mask.unsqueeze(-1), slots, torch.zeros_like(slots))
    tokens = torch.cat([texts, negatives[mask]])
    embedded = model.encode_text(tokens, normalize=True)
    t, valid = embedded[: len(texts)], embedded[len(texts) :]
    negative_embeddings = embedded.new_zeros(*mask.shape, embedded.shape[-1])
    negative_embeddings[mask] = valid
    return t, negative_embeddings


def encode_distinct_texts(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Normalised embeddings of the rows of `tokens` [N, L] -> [N, D], each distinct row encoded once
    (a batch's noun phrases repeat: "the grass"); a repeated row's gradient is the sum of its uses'.
    With static shapes every row is encoded (finding the distinct rows would read their count back)."""
    if static_shapes(model):
        return model.encode_text(tokens, normalize=True)
    distinct, inverse = torch.unique(tokens, dim=0, return_inverse=True)
    if len(distinct) == len(tokens):
        return model.encode_text(tokens, normalize=True)
    return model.encode_text(distinct, normalize=True).index_select(0, inverse)  # deterministic backward
