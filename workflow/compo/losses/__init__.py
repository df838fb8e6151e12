"""Training losses, registered by name; the one trainer (`compo.train`) runs any of them.

A loss is an `nn.Module` in open_clip's style: it returns a dict of named loss terms. Each term is
already weighted, so the total is their plain sum, also returned under "loss" (the trainer backpropagates
that key and logs every entry as a column of `losses.csv`). Entries whose name starts with `stat_` are
diagnostics (e.g. Cement's gradient shares): logged, detached, never part of the total.

Unlike open_clip's losses, a module takes `(model, batch)` instead of precomputed features, because
later methods need different features of the same batch (token/patch features for FSC-CLIP and C2LIP,
an EMA teacher's embeddings for DeGLA). A method differs from another only by

* its loss module (a module of this package; `compo.losses.base` holds what they share),
* what the batch carries (`LossSpec.needs`, filled by `compo.batches`),
* which parameters train (`TrainingLoss.trainable_parameters`, e.g. LoRA or frozen positions),

and the hooks `setup` (once, before the first step: e.g. copy the teacher) and `after_optimizer_step`
(e.g. the EMA update) let a loss keep state; that state is the module's own `state_dict`, which the
trainer saves in resumable checkpoints.

The registry below (`LOSSES`) is each loss's contract: its implementation, batch needs, the recipe keys
it requires or reads, and its recipe check. It imports no torch, so the config check and the Snakemake
rules (which inputs a training job reads, `PARSE_NEEDS` / `IMAGE_NEEDS`) use it while the DAG is built;
`LossSpec.build` imports the implementation. The batch parts a loss needs are all defined in one place,
`compo.batches` (section "batch parts"), which builds them from these names.

Batch keys (tensors, B captions per batch; see `compo.batches.TrainingData.batch`):

* "images"   [B, 3, H, W] preprocessed images           (always)
* "texts"    [B, L] token ids of the positive captions   (always)
* "negatives" [B, K, L] token ids of hard negative captions, slot order; need "negatives"
* "negative_mask" [B, K] bool, True where the slot holds a valid negative; need "negatives"
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compo.losses.base import TrainingLoss

TOTAL = "loss"
STAT_PREFIX = "stat_"


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: how to build it from a recipe, what its batch must carry, what it returns.

    builder: "module:function" in this package, called with the resolved recipe (imported on first use).
    needs: extra batch parts `compo.batches` must attach, beyond images and texts (every part is defined
           there): "negatives" -> batch["negatives"] [B, K, L] and batch["negative_mask"] [B, K] (recipe
           `k`); "cement_pairs", "noun_phrases", "online_negatives" (see their functions there).
    requires: recipe keys the loss cannot run without; a missing one fails config validation with the
              key named (`check_recipe`). Dotted names reach into mappings, e.g. "weights.igc".
    optional: loss-specific recipe keys it reads when present (e.g. DeGLA's `ema`). A loss-specific key
              (LOSS_KEYS) that is neither required nor optional is an error: it would be silently unused.
    check: optional extra validation of the recipe, returning (key, message) problems.
    """

    builder: str
    needs: frozenset[str]
    returns: str
    requires: tuple[str, ...] = ()
    check: Callable[[dict[str, Any]], list[tuple[str, str]]] | None = None
    optional: tuple[str, ...] = ()

    def build(self, recipe: dict[str, Any]) -> TrainingLoss:
        module, function = self.builder.split(":")
        return getattr(importlib.import_module(f"compo.losses.{module}"), function)(recipe)


# --- recipe checks (each loss's own) --------------------------------------------------------------------
DEGLA_TERMS = ("igc", "tgc", "distill")
MARGIN_KINDS = ("fermi-dirac", "static", "inverse", "none")
# recipe keys (under `margin`) each margin kind reads
MARGIN_KEYS = {"fermi-dirac": ("m_min", "m_max", "c_tilde", "tau_m"), "inverse": ("m_min", "m_max", "c_tilde", "tau_m"),
               "static": ("value",), "none": ()}
FSC_WEIGHTS = ("global", "local")
FSC_LOCAL_AGGREGATES = ("sum", "mean")
ONLINE_SPECS_KEY = "online_negative_specs"  # name -> config `negatives:` entry, filled by the recipe resolver


def _check_degla(recipe: dict[str, Any]) -> list[tuple[str, str]]:
    weights = recipe["weights"]
    problems = [(f"weights.{name}", f"loss degla has no term {name!r} (terms: {', '.join(DEGLA_TERMS)})")
                for name in weights if name not in DEGLA_TERMS]
    if (weights.get("tgc", 0) > 0 or weights.get("distill", 0) > 0) and recipe.get("ema") is None:
        problems.append(("ema", "loss degla needs the EMA teacher's alpha when weights.tgc or weights.distill > 0"))
    return problems


def _check_cement(recipe: dict[str, Any]) -> list[tuple[str, str]]:
    margin = recipe["margin"]
    kind = margin["kind"]
    if kind not in MARGIN_KINDS:
        return [("margin.kind", f"unknown margin kind {kind!r} (kinds: {', '.join(MARGIN_KINDS)})")]
    problems = [(f"margin.{key}", f"margin kind {kind} requires margin.{key}")
                for key in MARGIN_KEYS[kind] if margin.get(key) is None]
    if problems:
        return problems
    if kind in ("fermi-dirac", "inverse"):
        if margin["m_min"] > margin["m_max"]:
            problems.append(("margin.m_min", f"m_min {margin['m_min']} is above m_max {margin['m_max']}"))
        if margin["tau_m"] <= 0:
            problems.append(("margin.tau_m", f"tau_m must be > 0, got {margin['tau_m']}"))
    if recipe.get("k") != 1:
        problems.append(("k", f"cement pairs each anchor with one hard negative: k must be 1, got {recipe.get('k')}"))
    return problems


def _check_fsc(recipe: dict[str, Any]) -> list[tuple[str, str]]:
    problems = [(f"weights.{name}", f"fsc-clip has no weight {name!r} (known: {', '.join(FSC_WEIGHTS)})")
                for name in recipe["weights"] if name not in FSC_WEIGHTS]
    names = recipe["online_negatives"]
    if not names:
        problems.append(("online_negatives", "fsc-clip needs at least one negatives entry"))
    specs = recipe.get(ONLINE_SPECS_KEY)
    if specs is not None:
        problems += [("online_negatives", f"{name!r} is not defined under negatives") for name in names
                     if name not in specs]
    aggregate = recipe.get("local_aggregate")
    if aggregate is not None and aggregate not in FSC_LOCAL_AGGREGATES:
        problems.append(("local_aggregate", f"{aggregate!r} is not one of {', '.join(FSC_LOCAL_AGGREGATES)}"))
    if recipe.get("negatives"):
        problems.append(("negatives", "fsc-clip draws its negatives online (online_negatives); set negatives: null"))
    return problems


def needs_of(recipe: dict[str, Any]) -> frozenset[str]:
    """The batch parts a recipe's training needs: its loss's, plus hard_images when the recipe asks for them."""
    spec = get_loss(recipe.get("loss", "infonce"))
    return spec.needs | ({"hard_images"} if recipe.get("hard_images") is not None else frozenset())


def _check_c2lip(recipe: dict[str, Any]) -> list[tuple[str, str]]:
    weights = recipe["weights"]
    if weights["npc"] == 0 and weights["xac"] == 0:
        return [("weights", "c2lip with npc = xac = 0 is the siglip loss; use loss: siglip")]
    return []


# --- registry --------------------------------------------------------------------------------------
LOSSES: dict[str, LossSpec] = {
    # batch: images, texts. returns: i2t, t2i, loss.
    "infonce": LossSpec("clip:build_infonce", frozenset(), "i2t, t2i, loss"),
    # batch: images, texts, negatives, negative_mask. returns: i2t, t2i, stat_negatives, loss.
    "negclip": LossSpec("clip:build_negclip", frozenset({"negatives"}), "i2t, t2i, stat_negatives, loss",
                        requires=("negatives",), optional=("hard_images",)),
    # batch: images, texts, negatives, negative_mask. returns: i2t, t2i, igc, tgc, distill (weight > 0
    # only), stat_negatives, loss.
    "degla": LossSpec("degla:build", frozenset({"negatives"}), "i2t, t2i, igc, tgc, distill, stat_negatives, loss",
                      requires=("negatives", "weights.igc", "weights.tgc", "weights.distill"), check=_check_degla,
                      optional=("ema",)),
    # batch: images, texts, negatives, negative_mask, negative_concreteness, negative_image_mask,
    # negative_images. returns: v2t, t2v, stat_pull, stat_hard_push, stat_easy_push, stat_hard_share,
    # stat_margin, stat_negatives, stat_negative_images, stat_null_concreteness, loss.
    "cement": LossSpec("cement:build", frozenset({"negatives", "cement_pairs"}),
                       "v2t, t2v, stat_pull, stat_hard_push, stat_easy_push, stat_hard_share, stat_margin, "
                       "stat_negatives, stat_negative_images, stat_null_concreteness, loss",
                       requires=("negatives", "k", "margin.kind"), check=_check_cement),
    # batch: images, texts, negatives, negative_mask (online). returns: i2t, t2i, global_hn, local_hn,
    # stat_negatives, loss.
    "fsc-clip": LossSpec("fsc:build", frozenset({"online_negatives"}),
                         "i2t, t2i, global_hn, local_hn, stat_negatives, loss",
                         requires=("weights.global", "weights.local", "focal_gamma", "label_smoothing",
                                   "online_negatives"),
                         check=_check_fsc, optional=("local_aggregate",)),
    # batch: images, texts. returns: sigmoid, loss.
    "siglip": LossSpec("c2lip:build_siglip", frozenset(), "sigmoid, loss"),
    # batch: images, texts, phrases, phrase_owner. returns: sigmoid, npc, xac, stat_phrases,
    # stat_no_phrases, loss.
    "c2lip": LossSpec("c2lip:build_c2lip", frozenset({"noun_phrases"}),
                      "sigmoid, npc, xac, stat_phrases, stat_no_phrases, loss",
                      requires=("weights.npc", "weights.xac"), check=_check_c2lip),
}

# Recipe keys only some losses read (the others, e.g. base, train, lora, text, apply to every method).
LOSS_KEYS = ("negatives", "k", "weights", "ema", "focal_gamma", "label_smoothing", "online_negatives", "margin",
             "local_aggregate", "hard_images")

# The dataset tables a training job reads besides its manifest, by the batch parts its loss needs.
PARSE_NEEDS = frozenset({"noun_phrases", "online_negatives"})   # the parse table (noun phrases, tokens)
IMAGE_NEEDS = frozenset({"cement_pairs"})                       # the negatives' rendered images


def get_loss(name: str) -> LossSpec:
    """The registered loss `name` (its implementation is imported by `LossSpec.build`)."""
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
    reads = {key.split(".")[0] for key in (*spec.requires, *spec.optional)}
    if reads & {"negatives", "online_negatives"}:
        reads.add("k")  # negatives per caption
    unused = [key for key in LOSS_KEYS if recipe.get(key) is not None and key not in reads]
    weights = {key.split(".", 1)[1] for key in (*spec.requires, *spec.optional) if key.startswith("weights.")}
    unused += [f"weights.{name}" for name in recipe.get("weights") or {} if "weights" in reads and name not in weights]
    if unused:
        return [(key, f"loss {loss} does not use {key} (it reads {', '.join(sorted(reads)) or 'no such key'}); "
                      "remove it or pick a loss that uses it") for key in unused]
    problems = [(key, f"loss {loss} requires {key}") for key in spec.requires if _lookup(recipe, key) is None]
    if spec.check is not None and not problems:
        problems += spec.check(recipe)
    return problems


def __getattr__(name: str) -> Any:
    """What the loss modules share (`compo.losses.base`, torch), imported when first asked for."""
    if name in ("TrainingLoss", "with_total", "encode_with_negatives", "encode_distinct_texts"):
        from compo.losses import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
