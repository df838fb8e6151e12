"""CLIP's InfoNCE and NegCLIP's hard-negative contrast (seed 000 Eq. 1-5).

`negclip-online` is FSC-CLIP's NegCLIP‡ baseline (seed 003 sec. 4.1): the same contrast on negatives drawn
online every step (`online_negatives`, as fsc-clip draws them) and no hard-image rows. An absent negative (a
generator that found nothing to change) is a column of logit 0 in every image's softmax by default, as the
released code computes it (github.com/ytaek-oh/fsc-clip, `src/training/losses/loss.py`: `ClipLoss` puts zero
features in its slot, `_fill_empty_negatives`); `absent_negatives: mask` leaves it out, as `negclip` does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compo.distributed import gather_with_grad, loss_rows
from compo.losses.base import TrainingLoss, encode_with_negatives, with_total
from compo.models import static_shapes

# the registry's entries (compo.losses: plain data, read without importing this module)
LOSSES = {
    "infonce": {"build": "build_infonce"},
    "negclip": {"build": "build_negclip", "needs": ["negatives"]},
    "negclip-online": {
        "build": "build_negclip_online",
        "needs": ["online_negatives"],
        "keys": {
            "online_negatives": {
                "required": True,
                "schema": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "meaning": "`negatives` entries drawn afresh every step (k per entry)",
                "source": "seed 003 sec. 4.1 (NegCLIP‡)",
            },
            "absent_negatives": {
                "schema": {"enum": ["zero-logit", "mask"]},
                "meaning": "an absent negative's column in every image's softmax: `zero-logit` (default; the "
                           "released code) or `mask` (left out, as `negclip`)",
                "source": "fsc-clip src/training/losses/loss.py (ClipLoss)",
            },
        },
    },
}
ABSENT_NEGATIVES = tuple(LOSSES["negclip-online"]["keys"]["absent_negatives"]["schema"]["enum"])  # zero-logit, mask

# --- the equations, on embeddings (tested against per-sample loops in tests/test_losses.py) --------


def infonce_terms(v: torch.Tensor, t: torch.Tensor, scale: torch.Tensor,
                  rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP's symmetric InfoNCE (DeGLA Eq. 1-2): mean image->text and text->image cross-entropies.

    v, t: [B, D] L2-normalised image / text embeddings, row i of each a positive pair; scale: the
    (exponentiated) logit scale 1/tau. The loss of Eq. 3 is 0.5 * (i2t + t2i). rows: the queries scored
    (open_clip's local_loss: this rank's rows, against every column); the means are over them.
    """
    labels = torch.arange(len(v), device=v.device)[rows]
    if rows == slice(None):
        logits = scale * v @ t.T
        return F.cross_entropy(logits, labels), F.cross_entropy(logits.T, labels)
    return F.cross_entropy(scale * v[rows] @ t.T, labels), F.cross_entropy(scale * t[rows] @ v.T, labels)


def negclip_terms(
    v: torch.Tensor, t: torch.Tensor, negatives: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor,
    rows: slice = slice(None), static: bool = False, absent: str = "mask",
) -> tuple[torch.Tensor, torch.Tensor]:
    """NegCLIP's hard-negative contrast (DeGLA Eq. 4-5): image->text softmax over the B positives plus
    every valid hard negative of the batch (all B*K slots, not only the image's own); text->image over
    the B images, as in InfoNCE.

    negatives: [B, K, D] normalised negative-caption embeddings; mask: [B, K] bool. Masked slots are
    left out of every denominator (a missing negative is never replaced by a fake one). rows: the
    queries scored (open_clip's local_loss), as in `infonce_terms`. static: every slot is a column, the
    masked ones at -inf (the same softmax; no boolean indexing, compo.models.set_static_shapes).
    absent: `mask` (default) as above; `zero-logit` keeps every masked slot as a column of logit 0 (the
    released NegCLIP‡'s zero features, `negclip-online`).
    """
    if absent not in ABSENT_NEGATIVES:
        raise ValueError(f"absent_negatives {absent!r}: expected one of {', '.join(ABSENT_NEGATIVES)}")
    labels = torch.arange(len(v), device=v.device)[rows]
    if static or absent == "zero-logit":
        columns = torch.cat([mask.new_ones(len(t)), mask.flatten()])
        logits = scale * v[rows] @ torch.cat([t, negatives.flatten(0, 1)]).T  # [B, B + B * K]
        fill = float("-inf") if absent == "mask" else 0.0
        i2t = F.cross_entropy(logits.masked_fill(~columns, fill), labels)
    else:
        candidates = torch.cat([t, negatives[mask]])  # [B + n_valid, D]
        i2t = F.cross_entropy(scale * v[rows] @ candidates.T, labels)
    t2i = F.cross_entropy(scale * t[rows] @ v.T, labels)
    return i2t, t2i


# --- modules ---------------------------------------------------------------------------------------


class InfoNCELoss(TrainingLoss):
    """CLIP's symmetric InfoNCE with the model's learned logit scale. Terms: i2t, t2i (each halved)."""

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        v = model.encode_image(batch["images"], normalize=True)
        t = model.encode_text(batch["texts"], normalize=True)
        # the global batch's embeddings under torchrun (identity in one process): see compo.distributed
        v, t = gather_with_grad(v), gather_with_grad(t)
        i2t, t2i = infonce_terms(v, t, model.logit_scale.exp(), loss_rows(len(v)))
        return with_total({"i2t": 0.5 * i2t, "t2i": 0.5 * t2i})


class NegCLIPLoss(TrainingLoss):
    """InfoNCE with the batch's hard negative captions added to every image->text softmax.
    Terms: i2t, t2i (each halved, Eq. 5); stat_negatives: valid negatives in the batch. With the recipe's
    hard_images the batch's B rows are followed by B more (`compo.batches.hard_images`: an image near each
    row's, a caption of it and that caption's negatives), scored as rows of their own, as NegCLIP's trainer
    does (its 2B images against 2B captions plus every hard negative). absent: see `negclip_terms`."""

    def __init__(self, absent: str = "mask") -> None:
        super().__init__()
        self.absent = absent  # checked by negclip_terms (and by the config's schema before any job)

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        images, texts, negatives, mask = (batch[k] for k in ("images", "texts", "negatives", "negative_mask"))
        v = model.encode_image(images, normalize=True)
        t, negatives = encode_with_negatives(model, texts, negatives, mask)
        v, t, negatives, mask = (gather_with_grad(x) for x in (v, t, negatives, mask))  # the global batch
        i2t, t2i = negclip_terms(v, t, negatives, mask, model.logit_scale.exp(), loss_rows(len(v)),
                                 static=static_shapes(model), absent=self.absent)
        n_valid = mask.sum().to(v.dtype)
        return with_total({"i2t": 0.5 * i2t, "t2i": 0.5 * t2i, "stat_negatives": n_valid})


# builders of the registry's entries (LOSSES above)
def build_infonce(recipe: dict[str, Any]) -> InfoNCELoss:
    return InfoNCELoss()


def build_negclip(recipe: dict[str, Any]) -> NegCLIPLoss:
    return NegCLIPLoss()


def build_negclip_online(recipe: dict[str, Any]) -> NegCLIPLoss:
    return NegCLIPLoss(recipe.get("absent_negatives") or "zero-logit")
