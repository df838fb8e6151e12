"""Training losses, registered by name; the one trainer (`compo.train`) runs any of them.

A loss is an `nn.Module` in open_clip's style: it returns a dict of named loss terms. Each term is
already weighted, so the total is their plain sum, also returned under "loss" (the trainer backpropagates
that key and logs every entry as a column of `losses.csv`). Entries whose name starts with `stat_` are
diagnostics (e.g. Cement's gradient shares): logged, detached, never part of the total.

Unlike open_clip's losses, a module takes `(model, batch)` instead of precomputed features, because
later methods need different features of the same batch (token/patch features for FSC-CLIP and C2LIP,
an EMA teacher's embeddings for DeGLA). A method differs from another only by

* its loss module (here),
* what the batch carries (`LossSpec.needs`, filled by `compo.batches`),
* which parameters train (`TrainingLoss.trainable_parameters`, e.g. LoRA or frozen positions),

and the hooks `setup` (once, before the first step: e.g. copy the teacher) and `after_optimizer_step`
(e.g. the EMA update) let a loss keep state; that state is the module's own `state_dict`, which the
trainer saves in resumable checkpoints.

Batch keys (tensors, B captions per batch; see `compo.batches.TrainingData.batch`):

* "images"   [B, 3, H, W] preprocessed images           (always)
* "texts"    [B, L] token ids of the positive captions   (always)
* "negatives" [B, K, L] token ids of hard negative captions, slot order; need "negatives"
* "negative_mask" [B, K] bool, True where the slot holds a valid negative; need "negatives"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TOTAL = "loss"
STAT_PREFIX = "stat_"


# --- modules ---------------------------------------------------------------------------------------


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

    One text-encoder pass over positives and valid negatives only: masked slots cost nothing.
    """
    tokens = torch.cat([texts, negatives[mask]])
    embedded = model.encode_text(tokens, normalize=True)
    t, valid = embedded[: len(texts)], embedded[len(texts) :]
    negative_embeddings = embedded.new_zeros(*mask.shape, embedded.shape[-1])
    negative_embeddings[mask] = valid
    return t, negative_embeddings


def encode_distinct_texts(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Normalised embeddings of the rows of `tokens` [N, L] -> [N, D], each distinct row encoded once
    (a batch's noun phrases repeat: "the grass"); a repeated row's gradient is the sum of its uses'."""
    distinct, inverse = torch.unique(tokens, dim=0, return_inverse=True)
    if len(distinct) == len(tokens):
        return model.encode_text(tokens, normalize=True)
    return model.encode_text(distinct, normalize=True).index_select(0, inverse)  # deterministic backward


# --- registry --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: how to build it from a recipe, what its batch must carry, what it returns.

    needs: extra batch parts `compo.batches` must attach, beyond images and texts (every part is defined
           there): "negatives" -> batch["negatives"] [B, K, L] and batch["negative_mask"] [B, K] (recipe
           `k`); "cement_pairs", "noun_phrases", "online_negatives" (see their functions there).
    requires: recipe keys the loss cannot run without; a missing one fails config validation with the
              key named (`check_recipe`). Dotted names reach into mappings, e.g. "weights.igc".
    check: optional extra validation of the recipe, returning (key, message) problems.
    """

    build: Callable[[dict[str, Any]], TrainingLoss]
    needs: frozenset[str]
    returns: str
    requires: tuple[str, ...] = ()
    check: Callable[[dict[str, Any]], list[tuple[str, str]]] | None = None


LOSSES: dict[str, LossSpec] = {}


def register(name: str, spec: LossSpec) -> None:
    if name in LOSSES:
        raise ValueError(f"loss {name!r} registered twice")
    LOSSES[name] = spec


def get_loss(name: str) -> LossSpec:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; registered: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


def _lookup(recipe: dict[str, Any], dotted: str) -> Any:
    value: Any = recipe
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            return None
        value = value[part]
    return value


def check_recipe(recipe: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with a resolved method recipe as (recipe key, message); empty when it is valid."""
    loss = recipe.get("loss")
    if loss not in LOSSES:
        return [("loss", f"unknown loss {loss!r}; registered: {', '.join(sorted(LOSSES))}")]
    spec = LOSSES[loss]
    problems = [(key, f"loss {loss} requires {key}") for key in spec.requires if _lookup(recipe, key) is None]
    if spec.check is not None and not problems:
        problems += spec.check(recipe)
    return problems


# Each module below registers its losses on import.
from compo.losses import c2lip, cement, clip, degla, fsc  # noqa: E402, F401
