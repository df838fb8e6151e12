"""Model adaptation around training: which parameters train and how the text tower is shaped.

A recipe may change the model before training (`adapt_model`) and fold the change back for export
(`export_model`) so that every checkpoint stays loadable by plain open_clip. Without such keys the model
trains in full and is exported as it is. Recipe keys:

* `lora: {rank, alpha, targets}` (FSC-CLIP seed 003, LSS-LoRA seed 004): low-rank adapters
  W + (alpha / rank) * B @ A on the matched weights; only the adapters train, the base weights stay
  bit-identical; export merges the adapters into the weights. `targets` are glob patterns over parameter
  names; the default (`DEFAULT_LORA_TARGETS`) adapts every attention and MLP linear layer of BOTH towers:
  the packed q/k/v input projection `attn.in_proj_weight` of `nn.MultiheadAttention` (one adapter on the
  packed [3d, d] matrix), `attn.out_proj.weight`, `mlp.c_fc.weight` and `mlp.c_proj.weight`. Biases,
  layer norms, embeddings, projections and the logit scale stay frozen. A target may also be a square
  convolution kernel [out, in, k, k] such as the patch embedding `visual.conv1.weight` (FSC-CLIP's
  released code adapts it too): its adapter is loralib's Conv2d form, A [rank k, in k], B [out k, rank k],
  the delta (B @ A) reshaped to the kernel. The adapters are
  `torch.nn.utils.parametrize` parametrizations, which also reach `in_proj_weight` (open_clip's attention
  reads it as a raw tensor, so a module wrapper would not).
* `text: {context_length, keep_positions, freeze_positions}` (LongCLIP, seed 004): the text positional
  embedding is stretched to `context_length` (`stretch_positions`) under a derived open_clip config
  (`<model>-ctx<L>`, registered so the tokenizer pads to L and `model.json` carries the config), and its
  first `freeze_positions` rows get no gradient (their rows stay bit-identical: a zero gradient gives a
  zero AdamW step, and the trainer never decays parameters named "*embedding*").
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from compo.lora_patterns import DEFAULT_LORA_TARGETS, lora_matches
from compo.models import compute_pooled_text_only, context_model_name, model_config, open_clip


class AdaptError(ValueError):
    """The recipe cannot be applied to this model; the message names the recipe key."""


# --- LoRA --------------------------------------------------------------------------------------------


class LoRA(nn.Module):
    """A parametrization W -> W + (alpha / rank) * B @ A with A [rank, in], B [out, rank]; for a square
    convolution kernel [out, in, k, k], A [rank k, in k] and B [out k, rank k], the product reshaped to
    the kernel (loralib's Conv2d).

    B starts at zero (the adapted model starts equal to the base, as in Hu et al. 2022); A starts as
    nn.Linear's default (Kaiming uniform), drawn from `generator`.
    """

    def __init__(self, weight: torch.Tensor, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        kernel = weight.shape[2] if weight.ndim == 4 else 1
        out_features, in_features = weight.shape[0] * kernel, weight.shape[1] * kernel
        bound = 1 / math.sqrt(in_features)  # kaiming_uniform_(a=sqrt(5)) on [rank k, in k]
        a = (torch.rand(rank * kernel, in_features, generator=generator, dtype=torch.float64) * 2 - 1) * bound
        self.lora_A = nn.Parameter(a.to(weight.dtype).to(weight.device))
        self.lora_B = nn.Parameter(weight.new_zeros(out_features, rank * kernel))
        self.scaling = alpha / rank
        self.shape = tuple(weight.shape)

    def delta(self) -> torch.Tensor:
        return (self.scaling * (self.lora_B @ self.lora_A)).reshape(self.shape)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.delta()


def lora_targets(model: nn.Module, patterns: list[str] | tuple[str, ...]) -> list[str]:
    """Names of the weight matrices and square convolution kernels matched by the glob `patterns`;
    every pattern must match one."""
    matched: list[str] = []
    for pattern, hits in lora_matches({n: tuple(p.shape) for n, p in model.named_parameters()}, patterns).items():
        if not hits:
            raise AdaptError(f"recipe key lora.targets: pattern {pattern!r} matches no weight matrix or square "
                             "convolution kernel of the model")
        matched += [n for n in hits if n not in matched]
    return matched


def add_lora(model: nn.Module, rank: int, alpha: float, targets: list[str] | tuple[str, ...] = DEFAULT_LORA_TARGETS,
             seed: int = 0) -> list[str]:
    """Freeze `model` and put a LoRA adapter on every target weight; returns the adapted names."""
    names = lora_targets(model, targets)
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for name in names:  # sorted by the model's own order, so the draws do not depend on pattern order
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        parametrize.register_parametrization(owner, attribute,
                                             LoRA(getattr(owner, attribute), rank, alpha, generator))
    return names


# --- positional embedding: LongCLIP's stretch and freeze ---------------------------------------------


def stretch_positions(positions: torch.Tensor, context_length: int, keep: int) -> torch.Tensor:
    """LongCLIP's knowledge-preserving stretch of a [L, D] positional embedding to [context_length, D].

    Rows < keep are copied. New row j >= keep sits at old coordinate x = keep + (j - keep) * r with
    r = (L - keep) / (context_length - keep) (1/4 for 77 -> 248 with keep 20), and is the linear
    interpolation of the old rows floor(x) and floor(x) + 1; past the last old row (x > L - 1, the final
    3 rows for 77 -> 248) the last segment's slope extrapolates.
    """
    length = positions.shape[0]
    if not 0 <= keep < length - 1:
        raise AdaptError(f"recipe key text.keep_positions: {keep} must be in [0, {length - 2}] for a "
                         f"{length}-position embedding")
    if context_length <= length:
        raise AdaptError(f"recipe key text.context_length: {context_length} must exceed the model's {length}")
    j = torch.arange(keep, context_length, dtype=torch.float64)
    x = keep + (j - keep) * (length - keep) / (context_length - keep)
    left = x.floor().long().clamp(max=length - 2)
    weight = (x - left).unsqueeze(1).to(positions.dtype)
    stretched = (1 - weight) * positions[left] + weight * positions[left + 1]
    return torch.cat([positions[:keep], stretched])


class FrozenRows(nn.Module):
    """A parametrization that pins the first rows of a weight to a copy taken when it is registered.

    The effective weight is [copy; W[rows:]]: no gradient reaches W[:rows], and whatever an optimizer
    does to W[:rows] (AdamW's weight decay included) cannot show in the model or its export.
    """

    def __init__(self, weight: torch.Tensor, rows: int) -> None:
        super().__init__()
        self.register_buffer("frozen", weight[:rows].detach().clone())

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.frozen, weight[len(self.frozen):]])


def freeze_rows(owner: nn.Module, attribute: str, rows: int) -> None:
    """Pin the first `rows` rows of `owner.<attribute>` (see FrozenRows)."""
    parametrize.register_parametrization(owner, attribute, FrozenRows(getattr(owner, attribute), rows))


def remove_adaptations(model: nn.Module) -> nn.Module:
    """Fold every LoRA adapter (W + (alpha/r) B A) and frozen-row pin into plain weights: the model is plain
    open_clip again."""
    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            for attribute in list(module.parametrizations.keys()):
                parametrize.remove_parametrizations(module, attribute, leave_parametrized=True)
    return model


def _text_tower(model: nn.Module) -> nn.Module:
    # CLIP keeps the text positional embedding at the top level, CustomTextCLIP inside model.text.
    holder = model.text if hasattr(model, "text") and hasattr(model.text, "positional_embedding") else model
    if getattr(holder, "positional_embedding", None) is None:
        raise AdaptError("recipe key text: the model has no text positional embedding")
    return holder


def stretch_context(model: nn.Module, model_name: str, context_length: int, keep: int) -> tuple[nn.Module, str]:
    """A model with a `context_length` text context under a derived config, weights carried over."""
    name = context_model_name(model_name, context_length)
    positions = _text_tower(model).positional_embedding
    key = next(name for name, p in model.named_parameters() if p is positions)
    state = model.state_dict()
    state[key] = stretch_positions(state[key], context_length, keep)
    stretched = compute_pooled_text_only(open_clip().create_model(name))
    stretched.load_state_dict(state)
    stretched.visual.preprocess_cfg = model.visual.preprocess_cfg  # the weights' image mean, std and resize
    return stretched, name


# --- the hooks the trainer calls ---------------------------------------------------------------------


def adapt_model(model: nn.Module, model_name: str, recipe: dict[str, Any], seed: int = 0) -> tuple[nn.Module, str]:
    """The model (and its open_clip config name) as the recipe trains it.

    seed: seeds the LoRA adapters' initial A matrices.
    """
    text = recipe.get("text") or {}
    if text.get("context_length") and text["context_length"] != model_config(model_name)["text_cfg"].get(
            "context_length", 77):
        model, model_name = stretch_context(model, model_name, int(text["context_length"]),
                                            int(text.get("keep_positions", 0)))
    if text.get("freeze_positions"):
        tower = _text_tower(model)
        if text["freeze_positions"] > tower.positional_embedding.shape[0]:
            raise AdaptError(f"recipe key text.freeze_positions: {text['freeze_positions']} exceeds the "
                             f"{tower.positional_embedding.shape[0]} positions of the model")
        freeze_rows(tower, "positional_embedding", int(text["freeze_positions"]))
    lora = recipe.get("lora")
    if lora:
        rank = int(lora["rank"])
        add_lora(model, rank, float(lora.get("alpha", rank)), tuple(lora.get("targets") or DEFAULT_LORA_TARGETS),
                 seed=seed)
    return model, model_name


def export_model(model: nn.Module, model_name: str, recipe: dict[str, Any]) -> tuple[nn.Module, str]:
    """The trained model as a plain open_clip model for its checkpoint (LoRA merged into the weights, frozen
    rows written back)."""
    return remove_adaptations(model), model_name
