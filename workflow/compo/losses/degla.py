"""DeGLA (seed 000): hard-negative global contrast + IGC + TGC + EMA self-distillation (Eq. 4-10).

L_all = L_base + lambda1 * L_IGC + lambda2 * L_TGC + lambda3 * L_Distill  (Eq. 10), with

* L_base: NegCLIP's hard-negative contrast (Eq. 4-5, `compo.losses.clip.negclip_terms`);
* L_IGC (Eq. 8): per image, a softmax over its own positive caption and its own K valid negatives;
* L_TGC (Eq. 9): per caption, anchor the student's t_i, positive the EMA teacher's t_i*, negatives the
  student's embeddings of negatives. By default as the released code pairs them (`tgc_pairing: released`,
  `released_tgc_negatives`): it lays the negatives out caption by caption (src/training/train.py line 115,
  `neg_text.view(-1, L)`) and unmasks, for caption i, the columns i, N+i, 2N+i, 3N+i (src/open_clip/loss.py
  line 156, `mask_0.repeat(1, self.neg_text)`): mostly other captions' negatives, while its IGC over the same
  layout unmasks caption i's own four (line 168, `repeat_interleave`). The published numbers come from that
  code, so it is the default; `tgc_pairing: own` is Eq. 9's reading (t_i against the SAME caption's negatives);
* L_Distill (Eq. 7): squared L2 distances between student and teacher embeddings of the images, the
  positives and the valid negatives, SUMMED over the batch as the equation is written (not averaged:
  lambda3 = 0.005 was tuned with that reduction at batch 256, so it scales with the batch size).

IGC and TGC are averaged over the captions that have at least one valid negative: a caption without
one would be a 1-way softmax (loss 0, no gradient) and is left out of the mean rather than diluting it.
IGC uses the student's learned logit scale as 1/tau, like L_base. TGC uses a FIXED scale of 10.0 by default,
as the released code does (github.com/xiaoxing2001/DeGLA, commit 1c5e960, `src/open_clip/loss.py`,
`get_text_local_loss`: `logit_scale = 10.0` overrides the argument); the paper's Eq. 9 writes the same tau
as the other terms, so recipe `tgc_scale: learned` takes the student's learned scale instead.

The teacher is an EMA copy of the model (Eq. 6, alpha = recipe `ema`), made in `setup`, updated after
every optimizer step, never trained; it is a submodule of the loss, so resume checkpoints carry it.
A term whose weight is 0 is not computed, and no teacher exists when TGC and distill are both 0
(the Table 7 ablations are recipes with some weights set to 0).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compo.accumulate import once_per_step
from compo.distributed import gather_with_grad
from compo.losses.base import TrainingLoss, encode_with_negatives, with_total
from compo.losses.clip import negclip_terms
from compo.models import static_shapes

# the registry's entry (compo.losses: plain data, read without importing this module)
LOSSES = {
    "degla": {
        "build": "build",
        "needs": ["negatives"],
        "keys": {
            "weights": {
                "required": True,
                "schema": {"type": "object", "additionalProperties": False, "required": ["igc", "tgc", "distill"],
                           "properties": {"igc": {"type": "number", "minimum": 0},
                                          "tgc": {"type": "number", "minimum": 0},
                                          "distill": {"type": "number", "minimum": 0}}},
                "meaning": "`{igc, tgc, distill}` (0.1, 0.1, 0.005); a weight of 0 skips its term",
                "source": "seed 000 Eq. 10",
            },
            "tgc_scale": {
                "schema": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"const": "learned"}]},
                "meaning": "TGC's 1/tau: a fixed number (default 10.0, the released code) or `learned` (the "
                           "model's logit scale, as Eq. 9 reads)",
                "source": "DeGLA src/open_clip/loss.py get_text_local_loss; seed 000 Eq. 9",
            },
            "tgc_pairing": {
                "schema": {"enum": ["own", "released"]},
                "meaning": "TGC's negatives for caption i: `released` (default: the released code's columns i, "
                           "N+i, 2N+i, ... of the caption-major negatives, mostly other captions') or `own` (its "
                           "own, as Eq. 9 reads)",
                "source": "DeGLA src/open_clip/loss.py get_text_local_loss (line 156); seed 000 Eq. 9",
            },
            "ema": {
                "schema": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "meaning": "the EMA teacher's decay alpha (paper 0.9996; scaled to the short default run)",
                "source": "seed 000 Eq. 6",
            },
        },
        # the teacher exists only for TGC and distill: then its decay is needed
        "recipe": {
            "if": {"properties": {"weights": {"anyOf": [
                {"properties": {"tgc": {"exclusiveMinimum": 0}}, "required": ["tgc"]},
                {"properties": {"distill": {"exclusiveMinimum": 0}}, "required": ["distill"]}]}}},
            "then": {"required": ["ema"], "x-message": "loss degla needs the EMA teacher's alpha (ema) when "
                                                       "weights.tgc or weights.distill > 0"},
        },
    },
}
TERMS = tuple(LOSSES["degla"]["keys"]["weights"]["schema"]["properties"])  # igc, tgc, distill
RELEASED_TGC_SCALE = 10.0  # the released code's fixed TGC scale (module docstring)

# --- the equations, on embeddings (tested against per-sample loops in tests/test_degla.py) ---------


def grounded_contrast(
    anchor: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor,
    static: bool = False,
) -> torch.Tensor:
    """-log exp(s a_i.p_i) / (exp(s a_i.p_i) + sum_k valid exp(s a_i.n_ik)), averaged over the rows i
    with at least one valid negative (IGC, Eq. 8: anchor v_i, positive t_i; TGC, Eq. 9: anchor t_i,
    positive the teacher's t_i*). Zero when no row has a negative.

    anchor, positive: [B, D]; negatives: [B, K, D] (row i's own negatives); mask: [B, K] bool.
    static: every row computed (a row without negatives has loss exactly 0) and the mean taken over the
    rows with one, without reading their count back (compo.models.set_static_shapes).
    """
    rows = mask.any(dim=1)
    if static:
        positive_logit = scale * (anchor * positive).sum(-1, keepdim=True)
        negative_logits = (scale * torch.einsum("rd,rkd->rk", anchor, negatives)).masked_fill(~mask, float("-inf"))
        logits = torch.cat([positive_logit, negative_logits], dim=1)
        losses = F.cross_entropy(logits, logits.new_zeros(len(logits), dtype=torch.long), reduction="none")
        return (losses * rows).sum() / rows.sum().clamp(min=1)
    if not rows.any():
        return anchor.new_zeros(())
    anchor, positive, negatives, mask = anchor[rows], positive[rows], negatives[rows], mask[rows]
    positive_logit = scale * (anchor * positive).sum(-1, keepdim=True)  # [R, 1]
    negative_logits = scale * torch.einsum("rd,rkd->rk", anchor, negatives)
    negative_logits = negative_logits.masked_fill(~mask, float("-inf"))  # a missing slot is no candidate
    logits = torch.cat([positive_logit, negative_logits], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def distill_term(
    student: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    teacher: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    mask: torch.Tensor,
    static: bool = False,
) -> torch.Tensor:
    """Eq. 7: sum_i ||v_i - v_i*||^2 + ||t_i - t_i*||^2 + sum_k valid ||t_ik - t_ik*||^2 (a batch SUM).

    student, teacher: (images [B, D], positives [B, D], negatives [B, K, D]) normalised embeddings.
    static: the masked slots zeroed instead of left out (no boolean indexing).
    """
    (v, t, negatives), (v_star, t_star, negatives_star) = student, teacher
    images = (v - v_star).pow(2).sum()
    positives = (t - t_star).pow(2).sum()
    if static:
        hard = ((negatives - negatives_star).pow(2).sum(-1) * mask).sum()
    else:
        hard = (negatives[mask] - negatives_star[mask]).pow(2).sum()
    return images + positives + hard


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, alpha: float) -> None:
    """Eq. 6: teacher = alpha * teacher + (1 - alpha) * student, parameter by parameter; buffers copied.
    (Multi-tensor ops: the same elementwise mul and add per parameter, in two calls.)"""
    t_params, s_params = list(teacher.parameters()), list(student.parameters())
    if len(t_params) != len(s_params):
        raise ValueError(f"EMA teacher has {len(t_params)} parameters, the student {len(s_params)}")
    torch._foreach_mul_(t_params, alpha)
    torch._foreach_add_(t_params, [p.detach() for p in s_params], alpha=1 - alpha)
    for t_buffer, s_buffer in zip(teacher.buffers(), student.buffers(), strict=True):
        t_buffer.copy_(s_buffer)


def released_tgc_negatives(negatives: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The released code's TGC candidates (module docstring): over the negatives laid out caption by caption
    ([N * K] rows, caption i's at i*K .. i*K + K-1), caption i takes rows i, N+i, ..., (K-1)N+i. Returns them as
    [N, K, D] and their mask [N, K], for `grounded_contrast`."""
    n, k = mask.shape
    rows = torch.arange(k, device=mask.device)[None, :] * n + torch.arange(n, device=mask.device)[:, None]
    return negatives.reshape(n * k, -1)[rows], mask.reshape(n * k)[rows]


# --- the module ------------------------------------------------------------------------------------


class DeGLALoss(TrainingLoss):
    """Terms: i2t, t2i (L_base, each halved), igc, tgc, distill (each weighted; a zero weight is absent);
    stat_negatives: valid negatives in the batch."""

    def __init__(self, weights: dict[str, float], ema: float | None,
                 tgc_scale: float | str = RELEASED_TGC_SCALE, tgc_pairing: str = "released") -> None:
        super().__init__()
        self.weights = {term: float(weights.get(term, 0.0)) for term in TERMS}
        self.ema = ema
        if tgc_scale != "learned" and not (isinstance(tgc_scale, int | float) and tgc_scale > 0):
            raise ValueError(f"degla: tgc_scale {tgc_scale!r}: expected a positive number or 'learned'")
        self.tgc_scale = tgc_scale
        if tgc_pairing not in ("own", "released"):
            raise ValueError(f"degla: tgc_pairing {tgc_pairing!r}: expected 'own' or 'released'")
        self.tgc_pairing = tgc_pairing
        self.teacher: nn.Module | None = None
        if self.needs_teacher and ema is None:
            raise ValueError("degla: weights.tgc or weights.distill > 0 needs an EMA teacher (recipe `ema`)")

    @property
    def needs_teacher(self) -> bool:
        return self.weights["tgc"] > 0 or self.weights["distill"] > 0

    def setup(self, model: nn.Module) -> None:
        if self.needs_teacher:
            self.teacher = copy.deepcopy(model)
            self.teacher.requires_grad_(False)

    @torch.no_grad()
    def after_optimizer_step(self, model: nn.Module) -> None:
        if self.teacher is not None:
            ema_update(self.teacher, model, float(self.ema))

    @torch.no_grad()
    def teacher_features(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor | None, torch.Tensor,
                                                                         torch.Tensor | None]:
        """The teacher's embeddings of this batch (images, positives, negatives), only what the active terms
        use (images and negatives: distill only)."""
        if self.weights["distill"] > 0:
            t_star, negatives_star = encode_with_negatives(
                self.teacher, batch["texts"], batch["negatives"], batch["negative_mask"])
            return self.teacher.encode_image(batch["images"], normalize=True), t_star, negatives_star
        return None, self.teacher.encode_text(batch["texts"], normalize=True), None

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.teacher is not None:
            # the teacher runs in the student's mode: with BatchNorm (CLIP's ResNet towers) an eval-mode
            # teacher would normalise by running statistics while the student uses the batch's, so the two
            # would differ at step 0 although their weights are equal; the running statistics the
            # teacher's forward updates are overwritten by the student's at each EMA step
            self.teacher.train(model.training)
        mask = batch["negative_mask"]
        v = model.encode_image(batch["images"], normalize=True)
        t, negatives = encode_with_negatives(model, batch["texts"], batch["negatives"], mask)
        # every term on the global batch under torchrun (identity in one process), distill summed over it
        v, t, negatives, mask = (gather_with_grad(x) for x in (v, t, negatives, mask))
        scale, static = model.logit_scale.exp(), static_shapes(model)
        i2t, t2i = negclip_terms(v, t, negatives, mask, scale, static=static)
        terms = {"i2t": 0.5 * i2t, "t2i": 0.5 * t2i}
        if self.weights["igc"] > 0:
            terms["igc"] = self.weights["igc"] * grounded_contrast(v, t, negatives, mask, scale, static)
        if self.teacher is not None:
            # once per step also under gradient accumulation (compo.accumulate: reused in its second pass)
            v_star, t_star, negatives_star = once_per_step(lambda: self.teacher_features(batch))
            with torch.no_grad():
                if self.weights["distill"] > 0:
                    v_star, negatives_star = gather_with_grad(v_star), gather_with_grad(negatives_star)
                t_star = gather_with_grad(t_star)
            if self.weights["tgc"] > 0:
                tgc_scale = scale if self.tgc_scale == "learned" else scale.new_tensor(float(self.tgc_scale))
                pairs = (negatives, mask) if self.tgc_pairing == "own" else released_tgc_negatives(negatives, mask)
                terms["tgc"] = self.weights["tgc"] * grounded_contrast(t, t_star, *pairs, tgc_scale, static)
            if self.weights["distill"] > 0:
                terms["distill"] = self.weights["distill"] * distill_term(
                    (v, t, negatives), (v_star, t_star, negatives_star), mask, static)
        terms["stat_negatives"] = mask.sum().to(v.dtype)
        return with_total(terms)


def build(recipe: dict[str, Any]) -> DeGLALoss:
    return DeGLALoss(recipe["weights"], recipe.get("ema"), recipe.get("tgc_scale", RELEASED_TGC_SCALE),
                     recipe.get("tgc_pairing", "released"))
