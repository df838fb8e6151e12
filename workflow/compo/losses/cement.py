"""Cement loss (seed 002, section 2.3, Eq. 2-5): InfoNCE over anchors and their hard-negative pairs,
with a concreteness-dependent margin on each sample's hard-negative logit. Slipform = Cement with the
Fermi-Dirac margin, trained on ConcretePlant's highly concrete negatives (D_hc).

The batch holds N anchors (v_i, t_i) and, per anchor, one hard-negative pair (v_i', t_i') (recipe
`k: 1`: the first valid negative of the caption). Over the 2N samples, with s = logit scale * cosine,

  L = -1/(2N) sum_{i=1}^{2N} [ log exp(s_ii) / Z_i^{v->t} + log exp(s_ii) / Z_i^{t->v} ]       (Eq. 5)
  Z_i^{v->t} = exp(s_ii) + exp(s_ii' + m_i) + sum_{j not in {i, i'}} exp(s_ij)

i.e. `v2t + t2v`, each a mean over its query rows (not halved, as Eq. 5 is written: the gradient with
respect to s_ii is -(1 - p_ii)/(2N), Eq. 2 up to the 1/(2N)). Every sample is a query: an anchor's
hard negative is its negative pair, and a negative's hard negative is its anchor; both rows of a pair
get the pair's margin m_i, computed from the concreteness c_i of the negative's keyword:

  fermi-dirac  m_i = (m_max - m_min) / (1 + exp((c~ - c_i)/tau_m)) + m_min        (Eq. 4)
  inverse      m_i = (m_max - m_min) / (1 + exp((c_i - c~)/tau_m)) + m_min        (the ablation)
  static       m_i = value;   none  m_i = 0 (plain InfoNCE over the 2N pairs)

A negative without concreteness (keyword not in the norms) gets m = 0 under fermi-dirac / inverse,
counted in `stat_null_concreteness`.

Missing parts are masked, never faked:
* a caption without a valid negative contributes its anchor only (no hard negative in its rows);
* a negative caption without an image (`negative_image` null: e.g. a text-only generator) cannot be
  a query (its positive image is missing), and its image is no candidate: the text
  stays only in the v->t partition of its own anchor, as that anchor's margin-shifted hard negative.
  The anchor's t->v row then has no hard negative. Query rows: N + (negatives with an image).

Gradient shares (Eq. 3, logged every step as stat_ terms, margin-injected probabilities, over every
query row of both directions): stat_pull = mean(1 - p_ii), stat_hard_push = mean(p_ii') (0 for rows
without a hard negative), stat_easy_push = mean(sum_{j not in {i, i'}} p_ij); pull = hard + easy per row.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compo.distributed import gather_with_grad
from compo.losses.base import TrainingLoss, encode_with_negatives, with_total
from compo.models import static_shapes

# the registry's entry (compo.losses: plain data, read without importing this module)
LOSSES = {
    "cement": {
        "build": "build",
        "needs": ["negatives", "cement_pairs"],
        "keys": {
            "margin": {
                "required": True,
                "schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["kind"],
                    "properties": {
                        "kind": {"enum": ["fermi-dirac", "static", "inverse", "none"]},
                        "m_min": {"type": "number", "x-not-above": "m_max"},
                        "m_max": {"type": "number"},
                        "c_tilde": {"type": "number"},
                        "tau_m": {"type": "number", "exclusiveMinimum": 0},
                        "value": {"type": "number"},
                    },
                    # the keys each kind reads
                    "allOf": [
                        {"if": {"properties": {"kind": {"enum": ["fermi-dirac", "inverse"]}}},
                         "then": {"required": ["m_min", "m_max", "c_tilde", "tau_m"],
                                  "x-message": "margin kinds fermi-dirac and inverse read m_min, m_max, c_tilde "
                                               "and tau_m"}},
                        {"if": {"properties": {"kind": {"const": "static"}}},
                         "then": {"required": ["value"], "x-message": "margin kind static reads value"}},
                    ],
                },
                "meaning": "`kind` fermi-dirac / static / inverse / none, `m_min`, `m_max` ([-2, 2]), `c_tilde` (4), "
                           "`tau_m` (0.15), `value` (static, 1)",
                "source": "seed 002 Eq. 4-5",
            },
        },
        "recipe": {"properties": {"k": {"const": 1, "x-message": "cement pairs each anchor with one hard negative: "
                                                                  "k must be 1"}},
                   "required": ["k"]},
    },
}
MARGIN_KEYS = ("m_min", "m_max", "c_tilde", "tau_m")  # what the Fermi-Dirac margins read (declared above)

# --- margins (Eq. 4) -------------------------------------------------------------------------------


def pair_margins(concreteness: torch.Tensor, margin: dict[str, Any]) -> torch.Tensor:
    """The margin m_i of each pair from its negative's concreteness c_i ([N], NaN where unknown -> m 0)."""
    kind = margin["kind"]
    if kind == "none":
        return torch.zeros_like(concreteness)
    if kind == "static":
        return torch.full_like(concreteness, float(margin["value"]))
    m_min, m_max, c_tilde, tau_m = (float(margin[key]) for key in MARGIN_KEYS)
    # 1 / (1 + exp((c~ - c)/tau)) = sigmoid((c - c~)/tau): the same function, without exp overflow
    sign = 1.0 if kind == "fermi-dirac" else -1.0
    m = (m_max - m_min) * torch.sigmoid(sign * (concreteness - c_tilde) / tau_m) + m_min
    return torch.nan_to_num(m, nan=0.0)


# --- the equations, on logits and embeddings (tested against loops in tests/test_cement.py) --------


def margin_infonce(
    logits: torch.Tensor, hard: torch.Tensor, margin: torch.Tensor, allowed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over rows r of -log softmax(logits[r] + m_r at column hard[r])[r] (positives on the diagonal).

    logits: [R, C] (C >= R); hard: [R] column of each row's hard negative, -1 for none; margin: [R];
    allowed: [R, C] bool, False for columns left out of a row's partition. Returns the loss and the
    margin-injected probabilities p [R, C] (detached; 0 where not allowed).
    """
    rows = torch.arange(len(logits), device=logits.device)
    has_hard = hard >= 0
    shift = torch.zeros_like(logits)
    shift[rows[has_hard], hard[has_hard]] = margin[has_hard].to(logits.dtype)
    shifted = logits + shift
    if allowed is not None:
        shifted = shifted.masked_fill(~allowed, float("-inf"))
    return F.cross_entropy(shifted, rows), shifted.detach().softmax(dim=-1)


def gradient_shares(probabilities: torch.Tensor, hard: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row: positive pull 1 - p_ii, hard-negative push p_ii', easy push sum_{j not in {i, i'}} p_ij."""
    rows = torch.arange(len(probabilities), device=probabilities.device)
    has_hard = hard >= 0
    pull = 1 - probabilities[rows, rows]
    hard_push = torch.where(has_hard, probabilities[rows, hard.clamp(min=0)], torch.zeros_like(pull))
    easy = probabilities.clone()
    easy[rows, rows] = 0
    easy[rows[has_hard], hard[has_hard]] = 0
    return pull, hard_push, easy.sum(dim=-1)


def cement_terms(
    v: torch.Tensor,
    t: torch.Tensor,
    negative_v: torch.Tensor,
    negative_t: torch.Tensor,
    text_mask: torch.Tensor,
    image_mask: torch.Tensor,
    margin: torch.Tensor,
    scale: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Eq. 5 on normalised embeddings: v, t [N, D] anchors; negative_v, negative_t [N, D] each anchor's
    hard-negative image / caption (rows used only where image_mask / text_mask); margin [N].

    Returns v2t, t2v (each a mean over its query rows) and per-row pull, hard_push, easy_push of both
    directions concatenated (v->t rows first).
    """
    if bool((image_mask & ~text_mask).any()):
        raise ValueError("a negative image without its negative caption")
    n = len(v)
    paired = image_mask.nonzero().squeeze(1)  # anchors whose negative is a full (image, caption) pair
    text_only = (text_mask & ~image_mask).nonzero().squeeze(1)
    m, e = len(paired), len(text_only)
    images = torch.cat([v, negative_v[paired]])  # the n + m query samples: anchors, then negative pairs
    texts = torch.cat([t, negative_t[paired]])
    samples = n + m
    hard = torch.full((samples,), -1, dtype=torch.long, device=v.device)
    hard[paired] = n + torch.arange(m, device=v.device)
    hard[n:] = paired
    row_margin = torch.cat([margin, margin[paired]])  # both samples of a pair share its margin

    # v->t: text-only negatives are extra columns, each allowed in its own anchor's row only
    extra_columns = samples + torch.arange(e, device=v.device)
    hard_v2t = hard.clone()
    hard_v2t[text_only] = extra_columns
    allowed = torch.ones(samples, samples + e, dtype=torch.bool, device=v.device)
    allowed[:, samples:] = False
    allowed[text_only, extra_columns] = True
    candidates = torch.cat([texts, negative_t[text_only]])
    v2t, p_v2t = margin_infonce(scale * images @ candidates.T, hard_v2t, row_margin, allowed)
    t2v, p_t2v = margin_infonce(scale * texts @ images.T, hard, row_margin)
    shares = [torch.cat(pair) for pair in zip(gradient_shares(p_v2t, hard_v2t), gradient_shares(p_t2v, hard),
                                              strict=True)]
    return {"v2t": v2t, "t2v": t2v, "pull": shares[0], "hard_push": shares[1], "easy_push": shares[2]}


def cement_terms_static(
    v: torch.Tensor,
    t: torch.Tensor,
    negative_v: torch.Tensor,
    negative_t: torch.Tensor,
    text_mask: torch.Tensor,
    image_mask: torch.Tensor,
    margin: torch.Tensor,
    scale: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """`cement_terms` in fixed shapes (compo.models.set_static_shapes): the 2N rows and columns of every
    anchor and every slot's negative pair, those without a pair masked out of the softmaxes and weighted 0 in
    the means, so no count is read back from the device. The same values up to float rounding; per-row
    shares of both directions (v->t rows first) come with `rows`, the weight (0 or 1) of each."""
    n = len(v)
    index = torch.arange(n, device=v.device)
    paired, text_only = image_mask, text_mask & ~image_mask
    images, texts = torch.cat([v, negative_v]), torch.cat([t, negative_t])  # sample i + n: anchor i's pair
    sample = torch.cat([torch.ones_like(paired), paired])  # a query row and a candidate column
    hard = torch.cat([torch.where(paired, index + n, -1), torch.where(paired, index, -1)])
    row_margin = torch.cat([margin, margin])
    # v->t: a text-only negative is a column of its own anchor's row only, as that row's hard negative
    hard_v2t = torch.cat([torch.where(text_mask, index + n, -1), hard[n:]])
    own = torch.zeros(2 * n, 2 * n, dtype=torch.bool, device=v.device)
    own[index, index + n] = text_only
    allowed_v2t = sample.unsqueeze(0) | own
    v2t, p_v2t = _margin_rows(scale * images @ texts.T, hard_v2t, row_margin, allowed_v2t, sample)
    t2v, p_t2v = _margin_rows(scale * texts @ images.T, hard, row_margin, sample.unsqueeze(0), sample)
    shares = [torch.cat(pair) for pair in zip(_static_shares(p_v2t, hard_v2t), _static_shares(p_t2v, hard),
                                              strict=True)]
    return {"v2t": v2t, "t2v": t2v, "pull": shares[0], "hard_push": shares[1], "easy_push": shares[2],
            "rows": torch.cat([sample, sample]).to(v.dtype)}


def _margin_rows(logits: torch.Tensor, hard: torch.Tensor, margin: torch.Tensor, allowed: torch.Tensor,
                 rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`margin_infonce` over the rows marked in `rows` (mean over them), in fixed shapes; a row left out
    keeps every column (finite, weight 0)."""
    has_hard = hard >= 0
    shift = torch.zeros_like(logits).scatter(1, hard.clamp(min=0).unsqueeze(1),
                                             torch.where(has_hard, margin.to(logits.dtype), 0).unsqueeze(1))
    shifted = (logits + shift).masked_fill(~(allowed | ~rows.unsqueeze(1)), float("-inf"))
    labels = torch.arange(len(logits), device=logits.device)
    losses = F.cross_entropy(shifted, labels, reduction="none")
    return (losses * rows).sum() / rows.sum(), shifted.detach().softmax(dim=-1)


def _static_shares(probabilities: torch.Tensor, hard: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`gradient_shares` without boolean indexing."""
    p_own = probabilities.diagonal()
    hard_push = torch.where(hard >= 0, probabilities.gather(1, hard.clamp(min=0).unsqueeze(1))[:, 0], 0)
    return 1 - p_own, hard_push, probabilities.sum(dim=-1) - p_own - hard_push


# --- the module ------------------------------------------------------------------------------------


class CementLoss(TrainingLoss):
    """Terms: v2t, t2v (Eq. 5); stat_pull, stat_hard_push, stat_easy_push (Eq. 3 shares), stat_hard_share
    (hard push / pull), stat_margin (mean margin over pairs with a negative), stat_negatives,
    stat_negative_images, stat_null_concreteness (negatives whose margin fell back to 0)."""

    def __init__(self, margin: dict[str, Any]) -> None:
        super().__init__()
        self.margin = dict(margin)

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if batch["negative_mask"].shape[1] != 1:
            raise ValueError(f"cement pairs each anchor with one hard negative (k 1), got "
                             f"{batch['negative_mask'].shape[1]} slots")
        text_mask = batch["negative_mask"][:, 0]
        image_mask = batch["negative_image_mask"][:, 0]
        n, static = len(text_mask), static_shapes(model)
        # one image-encoder pass over the anchors and the negative images (packed in image_mask order)
        embedded = model.encode_image(torch.cat([batch["images"], batch["negative_images"]]), normalize=True)
        v = embedded[:n]
        if static:  # row i's image is packed image number (images of rows before i); no count read back
            packed = embedded[n:]
            at = (image_mask.cumsum(0) - 1).clamp(min=0, max=max(len(packed) - 1, 0))
            negative_v = torch.where(image_mask.unsqueeze(1), packed[at], 0) if len(packed) else torch.zeros_like(v)
        else:
            negative_v = embedded.new_zeros(v.shape)
            negative_v[image_mask] = embedded[n:]
        t, negatives = encode_with_negatives(model, batch["texts"], batch["negatives"], batch["negative_mask"])
        concreteness = batch["negative_concreteness"][:, 0].to(v.dtype)
        # the 2N partition of the global batch under torchrun (identity in one process)
        v, t, negative_v, negative_t, text_mask, image_mask, concreteness = (gather_with_grad(x) for x in (
            v, t, negative_v, negatives[:, 0], text_mask, image_mask, concreteness))
        margin = pair_margins(concreteness, self.margin)
        terms = (cement_terms_static if static else cement_terms)(v, t, negative_v, negative_t, text_mask, image_mask,
                                                                  margin, model.logit_scale.exp())
        if static:
            rows = terms["rows"]
            pull, hard_push, easy_push = ((terms[name] * rows).sum() / rows.sum()
                                          for name in ("pull", "hard_push", "easy_push"))
            mean_margin = (margin * text_mask).sum() / text_mask.sum().clamp(min=1)
        else:
            pull, hard_push, easy_push = (terms[name].mean() for name in ("pull", "hard_push", "easy_push"))
            mean_margin = margin[text_mask].mean() if text_mask.any() else v.new_zeros(())
        null = (text_mask & concreteness.isnan()).sum() if self.margin["kind"] in ("fermi-dirac", "inverse") else 0
        return with_total({
            "v2t": terms["v2t"], "t2v": terms["t2v"],
            "stat_pull": pull, "stat_hard_push": hard_push, "stat_easy_push": easy_push,
            "stat_hard_share": hard_push / pull,
            "stat_margin": mean_margin,
            "stat_negatives": text_mask.sum().to(v.dtype),
            "stat_negative_images": image_mask.sum().to(v.dtype),
            "stat_null_concreteness": null.to(v.dtype) if torch.is_tensor(null) else v.new_zeros(()),
        })


def build(recipe: dict[str, Any]) -> CementLoss:
    return CementLoss(recipe["margin"])
