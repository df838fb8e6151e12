"""SigLIP's sigmoid loss and C2LIP's concept losses (seed 001): NPC and XAC.

L = L_sigmoid(images, captions) + lambda_npc * L_npc + lambda_xac * L_xac  (paper: lambda 1 and 0.01).

* L_sigmoid: SigLIP's pairwise loss, -sum_ij log sigmoid(z_ij (s v_i.t_j + b)) with z_ij = +1 on the
  diagonal and -1 elsewhere, s the learned logit scale and b the learned logit bias.
* L_npc: the same loss between the images and every noun phrase of the batch (each spaCy noun phrase of a
  caption encoded as its own text, normalised); an image's own phrases are positives (multi-positive).
* L_xac: per (image, phrase) pair, non-parametric cross-attention: softmax over the image's projected
  patch tokens of their dot products with the phrase embedding, the attention-weighted patch vector
  (normalised) scored against the phrase with the same sigmoid loss and labels as L_npc. The pairs are
  computed in checkpointed chunks of at most XAC_CHUNK_PAIRS (`xac_logits`): memory bounded, same values.

Normalisation: every sigmoid loss sums over all (image, text) pairs and divides by the number of texts
(columns). For the square caption loss that is SigLIP's (and open_clip's SigLipLoss) "mean over images of
the sum over texts"; for the phrase losses it is per phrase, as in the released C2LIP code, which keeps
the paper's lambdas meaningful. An image whose caption has no noun phrase is a row of NPC/XAC with negatives
only, as in the released code (recipe `phraseless: keep`, the default: src/open_clip/loss.py lines 930 and 943
take every image of the batch); `phraseless: drop` leaves such rows out. Their count is logged as
`stat_no_phrases`.

Patch tokens (`concept_patch_features`): C2LIP "reuses the existing value projections and MLP from the
SigLIP attention pooling layer" (seed 001): each token is projected exactly as the pooling head would
output it if it attended to that token alone, so the patches live in the joint space of v and c.
* open_clip's ViT-B-16-SigLIP (the paper's base): a timm trunk whose pooling head is timm's MAP head
  (`AttentionPoolLatent`, one latent query). Per token: the value half of the head's key/value projection
  (`kv`) -> the head's output projection (`proj`) -> its residual MLP (x + mlp(norm(x))) -> the trunk's
  fc_norm / head and open_clip's adapter head (identity for SigLIP: `timm_proj: none`). The tokens are
  the trunk's final-norm outputs, prefix tokens split off as the head sees them.
* open_clip's own ViT with attentional pooling (vision cfg `attentional_pool: true`, one query; the tiny
  default base): ln_k -> the pooler's value projection -> its output projection -> ln_post -> proj (its
  pooler has no MLP). The class token open_clip prepends is excluded.
* a plain CLIP ViT (token or average pooling): `compo.models.image_patch_features` (ln_post + visual
  projection, class token excluded; the same patches as fsc-clip's local score).
* CLIP's ModifiedResNet (the embedded default's bases): its attention pool is the pooling head, so each
  cell of the last feature map goes through the pool's value and output projections alone
  (`compo.models.image_patch_features`).
Any other image tower (another timm pooling, a timm ResNet, an HF tower) is an error naming the model: XAC
never falls back to un-projected trunk tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from compo.distributed import gather_index, gather_with_grad
from compo.losses.base import TrainingLoss, encode_distinct_texts, with_total
from compo.models import image_patch_features, static_shapes

# the registry's entries (compo.losses: plain data, read without importing this module)
LOSSES = {
    "siglip": {"build": "build_siglip"},
    "c2lip": {
        "build": "build_c2lip",
        "needs": ["noun_phrases"],
        "keys": {
            "weights": {
                "required": True,
                "schema": {"type": "object", "additionalProperties": False, "required": ["npc", "xac"],
                           "properties": {"npc": {"type": "number", "minimum": 0},
                                          "xac": {"type": "number", "minimum": 0}},
                           "allOf": [{"not": {"properties": {"npc": {"const": 0}, "xac": {"const": 0}}},
                                      "x-message": "c2lip with npc = xac = 0 is the siglip loss; use loss: siglip"}]},
                "meaning": "`{npc, xac}` (1, 0.01)",
                "source": "seed 001",
            },
            "phraseless": {
                "schema": {"enum": ["keep", "drop"]},
                "meaning": "an image whose caption has no noun phrase in NPC / XAC: `keep` (default, the released "
                           "code: a row of negatives only) or `drop` (its row left out)",
                "source": "C2LIP src/open_clip/loss.py lines 930, 943",
            },
        },
    },
}

# --- the equations, on embeddings (tested against per-sample loops in tests/test_c2lip.py) ----------


def sigmoid_loss(logits: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """-sum_ij log sigmoid(z_ij * logits_ij) / n_texts, z = +1 where `positive` else -1.

    logits: [N images, M texts] (already s * v.t + b); positive: [N, M] bool (multi-positive allowed).
    """
    labels = positive.to(logits.dtype) * 2 - 1
    return -F.logsigmoid(labels * logits).sum() / logits.shape[1]


def pair_logits(v: torch.Tensor, t: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """s * v @ t.T + b for normalised embeddings v [N, D], t [M, D]."""
    return scale * v @ t.T + bias


def siglip_loss(v: torch.Tensor, t: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """SigLIP's loss for B image-caption pairs (row i of v and t a positive pair)."""
    positive = torch.eye(len(v), len(t), dtype=torch.bool, device=v.device)
    return sigmoid_loss(pair_logits(v, t, scale, bias), positive)


def owner_mask(owner: torch.Tensor, n_images: int) -> torch.Tensor:
    """[n_images, M] bool: True where phrase m belongs to (the caption of) image i."""
    return owner.unsqueeze(0) == torch.arange(n_images, device=owner.device).unsqueeze(1)


def cross_attention_pool(patches: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Concept-specific image vectors [N, M, D] (normalised): for image n and phrase m, the patches of n
    averaged with softmax_p(patches[n, p] . c[m]) weights (no parameters, no temperature, as C2LIP)."""
    attention = torch.einsum("npd,md->nmp", patches, c).softmax(dim=-1)
    return F.normalize(torch.einsum("nmp,npd->nmd", attention, patches), dim=-1)


# (image, phrase) pairs whose attention [P] and pooled vector [D] are live at once: XAC's memory bound. At the
# paper's global batch (768 images x 6,144 phrases, 6.8 KB a pair under bf16: issue 42) the whole matrix would
# hold 32 GB; 65,536 pairs hold about 0.45 GB, for one more XAC forward per step (the recomputation)
XAC_CHUNK_PAIRS = 1 << 16


def _xac_chunk(patches: torch.Tensor, c: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    pooled = cross_attention_pool(patches, c)
    return scale * (pooled * c.unsqueeze(0)).sum(-1) + bias


def xac_logits(patches: torch.Tensor, c: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
               chunk_pairs: int = XAC_CHUNK_PAIRS) -> torch.Tensor:
    """s * cos(v_hat(n, m), c_m) + b, [N, M]; patches [N, P, D] projected patch tokens, c [M, D] normalised.

    Computed over chunks of phrases of at most `chunk_pairs` (image, phrase) pairs; with autograd each chunk is
    checkpointed (recomputed in the backward), so only the inputs and the [N, M] logits are kept, not the
    [N, M, P] attention: the same values (each pair's logit depends on its image and phrase only)."""
    per_chunk = max(1, chunk_pairs // max(1, len(patches)))
    if len(c) <= per_chunk:
        return _xac_chunk(patches, c, scale, bias)
    chunks = []
    for start in range(0, len(c), per_chunk):
        part = c[start:start + per_chunk]
        if torch.is_grad_enabled():
            chunks.append(checkpoint(_xac_chunk, patches, part, scale, bias, use_reentrant=False))
        else:
            chunks.append(_xac_chunk(patches, part, scale, bias))
    return torch.cat(chunks, dim=1)


def _concept_loss(logits_of: Callable[[torch.Tensor], torch.Tensor], image_side: torch.Tensor, c: torch.Tensor,
                  owner: torch.Tensor, n_images: int, static: bool = False, keep: bool = True) -> torch.Tensor:
    """The multi-positive sigmoid loss over every image (`keep`: one without phrases a row of negatives, as the
    released code), or over the images whose caption has phrases (rows of the others dropped; static: computed
    and weighted 0, without boolean indexing, compo.models.set_static_shapes)."""
    if len(c) == 0:
        return image_side.sum() * 0  # no phrase in the batch: a zero that keeps the graph
    positive = owner_mask(owner, n_images)
    if keep:
        return sigmoid_loss(logits_of(image_side), positive)
    if static:
        logits = logits_of(image_side)
        labels = positive.to(logits.dtype) * 2 - 1
        counted = positive.any(1, keepdim=True)  # the images that have phrases
        return -(F.logsigmoid(labels * logits) * counted).sum() / logits.shape[1]
    has_phrases = torch.bincount(owner, minlength=n_images) > 0
    return sigmoid_loss(logits_of(image_side[has_phrases]), positive[has_phrases])


def npc_loss(v: torch.Tensor, c: torch.Tensor, owner: torch.Tensor, scale: torch.Tensor,
             bias: torch.Tensor, static: bool = False, keep: bool = True) -> torch.Tensor:
    """Noun-phrase concept loss: images v [B, D] against every phrase c [M, D]; phrase m is a positive of
    image owner[m] only. Images without phrases: rows of negatives (`keep`) or left out."""
    return _concept_loss(lambda rows: pair_logits(rows, c, scale, bias), v, c, owner, len(v), static, keep)


def xac_loss(patches: torch.Tensor, c: torch.Tensor, owner: torch.Tensor, scale: torch.Tensor,
             bias: torch.Tensor, static: bool = False, chunk_pairs: int = XAC_CHUNK_PAIRS,
             keep: bool = True) -> torch.Tensor:
    """Cross-attention concept loss: for every (image, phrase) pair the phrase-attended patch vector of the
    image [B, P, D] scored against the phrase; labels and rows as `npc_loss`; pairs in chunks (`xac_logits`)."""
    return _concept_loss(lambda rows: xac_logits(rows, c, scale, bias, chunk_pairs), patches, c, owner,
                         len(patches), static, keep)


# --- model features ----------------------------------------------------------------------------------


def _tower_name(visual: nn.Module) -> str:
    trunk = getattr(visual, "trunk", None)
    if trunk is not None:
        architecture = getattr(trunk, "default_cfg", {}).get("architecture", type(trunk).__name__)
        return f"{type(visual).__name__} (timm {architecture})"
    return type(visual).__name__


def _unsupported(visual: nn.Module, why: str) -> ValueError:
    return ValueError(f"C2LIP's XAC cannot use the image tower {_tower_name(visual)}: {why}. Supported: open_clip's "
                      "timm SigLIP (MAP head, one latent query), open_clip ViTs with a one-query attentional pooler "
                      "or token/average pooling, CLIP's ModifiedResNet (attention pool)")


def _map_head_tokens(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """open_clip TimmModel with timm's MAP head: pooled embedding and every token through the head alone."""
    visual = model.visual
    trunk = visual.trunk
    head = trunk.attn_pool
    out = model.forward_intermediates(image=images, image_indices=1, normalize_intermediates=True,
                                      image_output_fmt="NLC")
    tokens = out["image_intermediates"][-1]  # final norm applied, prefix tokens split off
    if getattr(trunk, "pool_include_prefix", False) and getattr(trunk, "num_prefix_tokens", 0):
        raise _unsupported(visual, "its MAP head also attends to the prefix tokens")
    if head.pos_embed is not None:
        tokens = tokens + head.pos_embed.unsqueeze(0).to(tokens.dtype)
    width = head.kv.out_features // 2
    values = F.linear(tokens, head.kv.weight[width:], None if head.kv.bias is None else head.kv.bias[width:])
    x = head.proj_drop(head.proj(values))  # the heads' outputs concatenated = the token's value
    if head.mlp is not None:
        x = x + head.mlp(head.norm(x))
    x = trunk.head(trunk.head_drop(trunk.fc_norm(x)))  # the rest of timm's forward_head
    return out["image_features"], visual.head(x)  # open_clip's adapter head (SigLIP: empty)


def _attentional_pool_tokens(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """open_clip ViT with a one-query attentional pooler: every grid token through the pooler alone."""
    visual = model.visual
    out = model.forward_intermediates(image=images, image_indices=1, image_output_fmt="NLC", normalize=True)
    tokens = out["image_intermediates"][-1]  # last block, class token split off
    attention = visual.attn_pool.attn
    width = attention.embed_dim
    if attention._qkv_same_embed_dim:
        value_weight = attention.in_proj_weight[2 * width :]
    else:
        value_weight = attention.v_proj_weight
    value_bias = attention.in_proj_bias[2 * width :] if attention.in_proj_bias is not None else None
    values = F.linear(visual.attn_pool.ln_k(tokens), value_weight, value_bias)
    patches = visual.ln_post(attention.out_proj(values))
    if visual.proj is not None:
        patches = patches @ visual.proj
    return out["image_features"], patches


def check_concept_tower(model: nn.Module) -> str:
    """Which patch-token recipe XAC uses for this model ("map", "attentional", "clip"); an unsupported
    image tower is a ValueError naming it."""
    visual = model.visual
    trunk = getattr(visual, "trunk", None)
    if trunk is not None:  # open_clip's TimmModel
        head = getattr(trunk, "attn_pool", None)
        if head is None or not hasattr(head, "kv") or not hasattr(head, "latent"):
            raise _unsupported(visual, "its timm trunk has no MAP (AttentionPoolLatent) pooling head")
        if head.latent.shape[1] != 1:
            raise _unsupported(visual, f"its MAP head has {head.latent.shape[1]} latent queries, not 1")
        if not hasattr(head.proj, "weight"):
            raise _unsupported(visual, "its MAP head has no output projection (pre-logits mode)")
        return "map"
    if type(visual).__name__ == "ModifiedResNet":  # CLIP-RN: the attention pool's value path per cell
        return "resnet"
    if not hasattr(visual, "transformer") or not hasattr(visual, "ln_post"):
        raise _unsupported(visual, "it is not a ViT")
    pooler = getattr(visual, "attn_pool", None)
    if pooler is not None:
        if getattr(visual, "attn_pool_contrastive", None) is not None or pooler.query.shape[0] != 1:
            raise _unsupported(visual, "its attentional pooler is not single-query (vision cfg attentional_pool: "
                                       "true, attn_pooler_queries: 1)")
        return "attentional"
    if getattr(visual, "pool_type", "tok") not in ("tok", "avg"):
        raise _unsupported(visual, f"its pool_type {visual.pool_type!r} is neither token nor average pooling")
    return "clip"


def concept_patch_features(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled image embedding (normalised, [B, D]) and the projected patch tokens C2LIP attends over
    ([B, P, D], not normalised); see the module docstring for which tokens and which projection."""
    kind = check_concept_tower(model)
    if kind == "map":
        return _map_head_tokens(model, images)
    if kind == "attentional":
        return _attentional_pool_tokens(model, images)
    return image_patch_features(model, images)


def logit_scale_and_bias(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    bias = getattr(model, "logit_bias", None)
    if bias is None:
        raise ValueError("the sigmoid loss needs a model with a learned logit bias (open_clip config key "
                         "init_logit_bias, e.g. compo-tiny-sigmoid); this model has none")
    return model.logit_scale.exp(), bias


# --- modules ---------------------------------------------------------------------------------------


class SigLIPLoss(TrainingLoss):
    """SigLIP's pairwise sigmoid loss with the model's learned scale and bias. Term: sigmoid."""

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        scale, bias = logit_scale_and_bias(model)
        v = model.encode_image(batch["images"], normalize=True)
        t = model.encode_text(batch["texts"], normalize=True)
        v, t = gather_with_grad(v), gather_with_grad(t)  # all pairs of the global batch under torchrun
        return with_total({"sigmoid": siglip_loss(v, t, scale, bias)})


class C2LIPLoss(TrainingLoss):
    """SigLIP loss + lambda_npc * NPC + lambda_xac * XAC. Terms: sigmoid, npc, xac (weighted; a term with
    weight 0 is not computed), stat_phrases (phrases in the batch), stat_no_phrases (captions without)."""

    def __init__(self, npc: float, xac: float, phraseless: str = "keep") -> None:
        super().__init__()
        self.npc, self.xac = float(npc), float(xac)
        if phraseless not in ("keep", "drop"):
            raise ValueError(f"c2lip: phraseless {phraseless!r}: expected 'keep' or 'drop'")
        self.keep = phraseless == "keep"

    def setup(self, model: nn.Module) -> None:
        if self.xac > 0:
            check_concept_tower(model)  # an unsupported image tower fails before the first step

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        scale, bias = logit_scale_and_bias(model)
        images, texts, phrases, owner = batch["images"], batch["texts"], batch["phrases"], batch["phrase_owner"]
        if self.xac > 0:
            v, patches = concept_patch_features(model, images)
        else:
            v, patches = model.encode_image(images, normalize=True), None
        embedded = encode_distinct_texts(model, torch.cat([texts, phrases]))  # one pass, each phrase once
        t, c = embedded[: len(texts)], embedded[len(texts) :]
        # the global batch under torchrun (identity in one process): images, captions, phrases and owners
        owner = gather_index(owner, len(texts))
        v, t, c = gather_with_grad(v), gather_with_grad(t), gather_with_grad(c)
        if patches is not None:
            patches = gather_with_grad(patches)
        terms = {"sigmoid": siglip_loss(v, t, scale, bias)}
        static = static_shapes(model)
        if self.npc > 0:
            terms["npc"] = self.npc * npc_loss(v, c, owner, scale, bias, static, keep=self.keep)
        if self.xac > 0:
            terms["xac"] = self.xac * xac_loss(patches, c, owner, scale, bias, static, keep=self.keep)
        if static:
            has_phrases = owner_mask(owner, len(t)).any(1)
        else:
            has_phrases = torch.bincount(owner, minlength=len(t)) > 0
        terms["stat_phrases"] = v.new_full((), float(len(c)), dtype=torch.float32)
        terms["stat_no_phrases"] = (~has_phrases).sum().to(v.dtype)
        return with_total(terms)


# builders of the registry's entries (LOSSES above)
def build_siglip(recipe: dict[str, Any]) -> SigLIPLoss:
    return SigLIPLoss()


def build_c2lip(recipe: dict[str, Any]) -> C2LIPLoss:
    return C2LIPLoss(npc=recipe["weights"]["npc"], xac=recipe["weights"]["xac"],
                     phraseless=recipe.get("phraseless", "keep"))
