"""FSC-CLIP (seed 003): InfoNCE + global and local hard-negative losses with focal loss and label smoothing.

L = L_clip + lambda_g * L_neg^g + lambda_l * L_neg^l (Eq. 11), recipe `weights: {global, local}`.

* Both hard-negative (HN) losses classify the positive caption against the caption's OWN valid negatives,
  a (1 + K_i)-way softmax per image (Eq. 3-5). Selective Calibrated Regularization (Eq. 9-10) turns the
  cross-entropy into a focal loss sum_k (1 - p_k)^gamma * (-y~_k log p_k) with smoothed labels
  y~_k = (1 - beta) y_k + beta / (1 + K_i), where K_i counts the row's VALID negatives (`focal_gamma`,
  `label_smoothing`; paper 2 and 0.02). The focal factor stays in the graph (as Lin et al. 2017). Rows
  without a valid negative are left out; the loss is the mean over the remaining rows. An ABSENT negative
  (a generator that found nothing to change in a caption that has another negative) stays in the softmax
  as a column of logit 0 by default, as the released code computes it (github.com/ytaek-oh/fsc-clip,
  commit 604015d, `src/training/losses/loss.py`: `_fill_empty_negatives` puts zero features, or a zero
  local score, in its slot and `_focal_loss_with_nsr` takes the softmax over every column, only the labels
  masked); recipe `absent_negatives: mask` leaves it out of the softmax instead, the paper's (1 + K_i)-way
  reading. Its label is 0 either way, and K_i counts the valid negatives only.
* Global score: scale * cos(v, t) of the pooled embeddings (scale = the model's learned logit scale).
* Local score (Eq. 6-8, DESIGN section 5), as the paper writes it and as the authors' released code
  (github.com/ytaek-oh/fsc-clip, `src/training/losses/loss.py`, `Local_HNLoss`) computes it: token
  features t_w after ln_final and the text projection, against patch features v_p after ln_post and the
  visual projection, class token excluded, both RAW (not normalised). Per token w:
  s_wp = t_w^T v_p (Eq. 6's similarity map), a_wp = min-max of s_w. over the patches (Eq. 6), the
  text-aligned patch v^_w = sum_p a_wp v_p / sum_p a_wp over the raw patches (Eq. 7), and
  S_l = sum_w exp(cos(v^_w, t_w) / tau) (Eq. 8) with 1 / tau = the model's logit scale, so the HN logit
  is log S_l = logsumexp_w(scale * c_w). Two choices the paper leaves open, made as the released code
  makes them: (i) a_wp is a constant: no gradient flows through the similarity map (it is detached),
  only through the weighted patch average and the cosine; (ii) the start token is not a token of the
  sum (the released code zeroes position 0 of its token mask); the end token and every word token
  are, padding is not.
  `local_aggregate: mean` (recipe key; default `sum`, the paper's Eq. 8) uses the mean over the tokens
  instead, log S_l - log W: with the sum a negative that has more tokens than its positive (a WordNet
  replacement by a multi-token word) gains a logit of about log(W' / W) by its length alone; the mean
  removes that length effect. With equal lengths both give the same softmax.
* Negatives are drawn online every step (`online_negatives`: names of config `negatives:` entries), by the
  same generator code as the offline negatives stage, `k` per generator (default 1; the paper pairs each
  caption with one negclip swap, one WordNet replace and one bi-gram shuffle). Each caption draws from
  its own stream `compo.rng.caption_rng(seed, step=, row=manifest row)` (the batch part
  `online_negatives` in `compo.batches`), so a resumed run, and torchrun ranks that each draw only
  their slice of the batch, see the same negatives as one process.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compo.distributed import gather_with_grad
from compo.losses.base import TrainingLoss, with_total
from compo.losses.clip import infonce_terms
from compo.models import image_patch_features, static_shapes, text_token_features

# the registry's entry (compo.losses: plain data, read without importing this module)
LOSSES = {
    "fsc-clip": {
        "build": "build",
        "needs": ["online_negatives"],
        "keys": {
            "weights": {
                "required": True,
                "schema": {"type": "object", "additionalProperties": False, "required": ["global", "local"],
                           "properties": {"global": {"type": "number", "minimum": 0},
                                          "local": {"type": "number", "minimum": 0}}},
                "meaning": "`{global, local}` (0.5, 0.2); a weight of 0 skips its term",
                "source": "seed 003",
            },
            "focal_gamma": {"required": True, "schema": {"type": "number", "minimum": 0},
                            "meaning": "the focal loss's gamma (2) over valid negatives", "source": "seed 003 Eq. 9"},
            "label_smoothing": {"required": True,
                                "schema": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                                "meaning": "label smoothing beta (0.02) over valid negatives",
                                "source": "seed 003 Eq. 10"},
            "online_negatives": {
                "required": True,
                "schema": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "meaning": "`negatives` entries drawn afresh every step (k per entry)",
                "source": "seed 003",
            },
            "local_aggregate": {
                "schema": {"enum": ["sum", "mean"]},
                "meaning": "the local score over tokens: `sum` (default; Eq. 8 and the released code) or `mean` "
                           "(log S_l - log W: a negative with more tokens does not gain by its length alone)",
                "source": "seed 003 Eq. 8",
            },
            "absent_negatives": {
                "schema": {"enum": ["zero-logit", "mask"]},
                "meaning": "an absent negative's slot in the HN softmax: `zero-logit` (default; the released code) "
                           "or `mask` (left out: a (1 + K_i)-way softmax, as Eq. 3-5 read)",
                "source": "fsc-clip src/training/losses/loss.py; seed 003 Eq. 3-5",
            },
        },
    },
}
WEIGHT_NAMES = tuple(LOSSES["fsc-clip"]["keys"]["weights"]["schema"]["properties"])  # global, local
LOCAL_AGGREGATES = tuple(LOSSES["fsc-clip"]["keys"]["local_aggregate"]["schema"]["enum"])  # sum, mean
ABSENT_NEGATIVES = tuple(LOSSES["fsc-clip"]["keys"]["absent_negatives"]["schema"]["enum"])  # zero-logit, mask

log = logging.getLogger(__name__)

EPS = 1e-8


# --- the equations (tested against per-sample loops in tests/test_fsc.py) ------------------------------


def token_alignment(tokens: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
    """Per-token cosine c_w = cos(v^_w, t_w) between each token and its text-aligned patch (Eq. 6-7).

    tokens [N, L, D], patches [N, P, D], both raw (row n of both belong to the same image-text pair);
    returns [N, L]. The attention weights a_wp are detached (released code). A token whose similarities
    are equal over all patches weighs every patch equally.
    """
    with torch.no_grad():
        s = tokens @ patches.transpose(1, 2)  # [N, L, P], s_wp = t_w^T v_p
        low, high = s.amin(-1, keepdim=True), s.amax(-1, keepdim=True)
        a = torch.where(high > low, (s - low) / (high - low).clamp_min(EPS), torch.ones_like(s))
        a = a / a.sum(-1, keepdim=True)  # Eq. 7's 1 / sum_p a_wp
    aligned = a @ patches  # [N, L, D]: the raw patches averaged
    return F.cosine_similarity(aligned, tokens, dim=-1, eps=EPS)


def local_logits(tokens: torch.Tensor, token_mask: torch.Tensor, patches: torch.Tensor,
                 scale: torch.Tensor, aggregate: str = "sum", static: bool = False) -> torch.Tensor:
    """Local score logits [N]: log S_l = logsumexp over the masked tokens of scale * c_w (Eq. 8), or
    with `aggregate="mean"` that minus log W (the mean over tokens). `token_mask` [N, L] marks the
    tokens that count (the caller leaves out padding and the start token). static: every column is
    scored (the padding ones masked out), not only those up to the last counted token, whose position
    the host would read back (compo.models.set_static_shapes)."""
    if aggregate not in LOCAL_AGGREGATES:
        raise ValueError(f"local_aggregate {aggregate!r}: expected one of {', '.join(LOCAL_AGGREGATES)}")
    if not static:
        used = token_mask.any(0).nonzero()
        width = int(used.max()) + 1 if len(used) else 1  # columns after the last counted token are padding
        tokens, token_mask = tokens[:, :width], token_mask[:, :width]
    z = (scale * token_alignment(tokens, patches)).masked_fill(~token_mask, -math.inf)
    logits = torch.logsumexp(z, dim=1)
    if aggregate == "mean":
        logits = logits - token_mask.sum(1).to(z.dtype).log()
    return logits


def scr_loss(logits: torch.Tensor, valid: torch.Tensor, gamma: float, beta: float,
             static: bool = False, absent: str = "zero-logit") -> torch.Tensor:
    """Focal loss with label smoothing over the positive and each row's valid negatives (Eq. 9-10).

    logits [B, 1 + K], column 0 the positive; valid [B, 1 + K] bool (column 0 True). Mean over rows with
    at least one valid negative; 0 (still in the graph) when no row has one. absent: an invalid slot of
    such a row is a column of logit 0 in the softmax (`zero-logit`, the released code) or no column
    (`mask`); its label is 0 either way. static: every row computed and the mean taken over those rows
    without reading their count back (compo.models.set_static_shapes).
    """
    if absent not in ABSENT_NEGATIVES:
        raise ValueError(f"absent_negatives {absent!r}: expected one of {', '.join(ABSENT_NEGATIVES)}")
    rows = valid[:, 1:].any(1)
    if static:
        return (_scr_rows(logits, valid, gamma, beta, absent) * rows).sum() / rows.sum().clamp(min=1)
    if not rows.any():
        return logits.sum() * 0
    return _scr_rows(logits[rows], valid[rows], gamma, beta, absent).mean()


def _scr_rows(logits: torch.Tensor, valid: torch.Tensor, gamma: float, beta: float, absent: str) -> torch.Tensor:
    """scr_loss of each row [B]."""
    fill = -math.inf if absent == "mask" else 0.0  # whatever score the slot holds, it is not the negative's
    log_p = torch.log_softmax(logits.masked_fill(~valid, fill), dim=1).masked_fill(~valid, 0)
    classes = valid.sum(1, keepdim=True).to(logits.dtype)  # 1 + K_i
    target = torch.where(valid, beta / classes, torch.zeros_like(logits))
    target[:, 0] += 1 - beta
    focal = (1 - log_p.exp()).pow(gamma)
    return (focal * -target * log_p).masked_fill(~valid, 0).sum(1)


def scatter_rows(positive: torch.Tensor, negatives: torch.Tensor, mask: torch.Tensor,
                 static: bool = False) -> torch.Tensor:
    """[B, 1 + K] from the positives' scores [B] and the valid negatives' scores [n_valid] (mask order);
    static: the scores of every slot [B * K], the masked ones left for `scr_loss` to mask out."""
    if static:
        return torch.cat([positive.unsqueeze(1), negatives.view(mask.shape)], dim=1)
    out = positive.new_zeros(mask.shape[0], 1 + mask.shape[1])
    out[:, 0] = positive
    rest = positive.new_zeros(mask.shape)
    rest[mask] = negatives
    out[:, 1:] = rest
    return out


# --- module --------------------------------------------------------------------------------------------


class FSCCLIPLoss(TrainingLoss):
    """InfoNCE + weighted global and local HN losses. Terms: i2t, t2i (halved), global_hn, local_hn
    (weighted; a term whose weight is 0 is not computed), stat_negatives (valid negatives in the batch)."""

    def __init__(self, weights: dict[str, float], gamma: float, beta: float, local_aggregate: str = "sum",
                 absent_negatives: str = "zero-logit") -> None:
        super().__init__()
        self.weights = {name: float(weights.get(name, 0.0)) for name in WEIGHT_NAMES}
        self.gamma, self.beta = float(gamma), float(beta)
        self.local_aggregate = local_aggregate
        if absent_negatives not in ABSENT_NEGATIVES:
            raise ValueError(f"fsc-clip: absent_negatives {absent_negatives!r}: expected one of "
                             f"{', '.join(ABSENT_NEGATIVES)}")
        self.absent = absent_negatives

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        texts, negatives, mask = batch["texts"], batch["negatives"], batch["negative_mask"]
        static = static_shapes(model)  # every negative slot encoded, the masked ones masked out of the losses
        v, patches = image_patch_features(model, batch["images"])
        pooled, token_feats, token_mask = text_token_features(
            model, torch.cat([texts, negatives.flatten(0, 1) if static else negatives[mask]]))
        n = len(texts)
        scale = model.logit_scale.exp()
        # InfoNCE and the HN means over the global batch under torchrun (identity in one process)
        i2t, t2i = infonce_terms(gather_with_grad(v), gather_with_grad(pooled[:n]), scale)
        terms = {"i2t": 0.5 * i2t, "t2i": 0.5 * t2i}
        valid = gather_with_grad(torch.cat([mask.new_ones(n, 1), mask], dim=1))
        rows = torch.arange(n, device=v.device)
        image_of = torch.cat([rows, rows.repeat_interleave(mask.shape[1]) if static else mask.nonzero()[:, 0]])
        # index_select, not v[image_of]: the backward of indexing with repeated rows adds in a thread-dependent
        # order on the CPU (the same seed would not give the same weights); index_select's does not
        if self.weights["global"]:
            scores = scale * (v.index_select(0, image_of) * pooled).sum(-1)
            logits = gather_with_grad(scatter_rows(scores[:n], scores[n:], mask, static))
            terms["global_hn"] = self.weights["global"] * scr_loss(logits, valid, self.gamma, self.beta, static,
                                                                 self.absent)
        if self.weights["local"]:
            counted = token_mask.clone()
            counted[:, 0] = False  # the start token is not summed (released code: attn_mask[:, 0] = 0)
            scores = local_logits(token_feats, counted, patches.index_select(0, image_of), scale,
                                  self.local_aggregate, static)
            logits = gather_with_grad(scatter_rows(scores[:n], scores[n:], mask, static))
            terms["local_hn"] = self.weights["local"] * scr_loss(logits, valid, self.gamma, self.beta, static,
                                                                 self.absent)
        terms["stat_negatives"] = valid[:, 1:].sum().to(v.dtype)
        return with_total(terms)


# --- the registry's builder (LOSSES above) ------------------------------------------------------------------


def build(recipe: dict[str, Any]) -> FSCCLIPLoss:
    return FSCCLIPLoss(recipe["weights"], recipe["focal_gamma"], recipe["label_smoothing"],
                       recipe.get("local_aggregate") or "sum", recipe.get("absent_negatives") or "zero-logit")
