"""Training losses, registered by name; the one trainer (`compo.train`) runs any of them.

A loss is an `nn.Module` in open_clip's style: it returns a dict of named loss terms. Each term is
already weighted, so the total is their plain sum, also returned under "loss" (the trainer backpropagates
that key and logs every entry as a column of `losses.csv`). Entries whose name starts with `stat_` are
diagnostics (e.g. Cement's gradient shares): logged, detached, never part of the total.

Unlike open_clip's losses, a module takes `(model, batch)` instead of precomputed features, because
later methods need different features of the same batch (token/patch features for FSC-CLIP and C2LIP,
an EMA teacher's embeddings for DeGLA). A method differs from another only by

* its loss module (a module of this package; `compo.losses.base` holds what they share),
* what the batch carries (its declaration's `needs`, filled by `compo.batches`),
* which parameters train (`TrainingLoss.trainable_parameters`, e.g. LoRA or frozen positions),

and the hooks `setup` (once, before the first step: e.g. copy the teacher) and `after_optimizer_step`
(e.g. the EMA update) let a loss keep state; that state is the module's own `state_dict`, which the
trainer saves in resumable checkpoints. docs/adding-a-method.md walks through adding one.

Every module of this package that assigns a top-level `LOSSES = {...}` registers the losses in it: the
registry (`LOSSES` here) is read from those declarations, never listed by hand. A declaration is plain
data (literals only), read from the module's source without importing it, so the config check and the
Snakemake rules (which inputs a training job reads, `PARSE_NEEDS` / `IMAGE_NEEDS`) use it while the DAG is
built, without torch; `LossSpec.build` imports the module. Per loss name:

    "build": the function of the module that makes the loss from the resolved recipe (a dict)
    "needs": batch parts beyond images and texts (`compo.batches`, section "batch parts"): "negatives"
             (the offline hard negatives; the recipe then requires `negatives` and reads `k`),
             "cement_pairs", "noun_phrases", "online_negatives"
    "keys":  the loss's own recipe keys: {key: {"schema": JSON schema of its value, "required": bool,
             "meaning": ..., "source": ...}}; meaning and source are config/README's row (`compo loss-keys`)
    "recipe": optional JSON schema over the whole resolved recipe, for relations between keys
             (e.g. `if`/`then`; `x-message` words the error, see `compo.schema`)

A key some loss declares is an error on a recipe whose loss does not (it would be silently unused).

Batch keys (tensors, B rows per batch; see `compo.batches.TrainingData.batch`):

* "images"   [B, 3, H, W] preprocessed images           (always)
* "texts"    [B, L] token ids of the positive captions   (always)
* "negatives" [B, K, L] token ids of hard negative captions, slot order; need "negatives"
* "negative_mask" [B, K] bool, True where the slot holds a valid negative; need "negatives"

With the recipe's `hard_images` the batch has more rows than captions drawn (each caption's hard image
with a caption of it and its negatives, `compo.batches.hard_images`), for a loss that needs no batch part
beyond "negatives".
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compo.doc_sections import replace_between
from compo.losses.terms import STAT_PREFIX, TOTAL  # noqa: F401  (re-exported)
from compo.schema import problems

if TYPE_CHECKING:
    from compo.losses.base import TrainingLoss

ONLINE_SPECS_KEY = "online_negative_specs"  # name -> config `negatives:` entry, filled by the recipe resolver
DECLARATION = "LOSSES"  # the top-level name a loss module declares its losses under
# batch parts that bring more rows, not per-row extras: the only parts hard-image rows can carry
ROW_PARTS = frozenset({"negatives"})


@dataclass(frozen=True)
class LossSpec:
    """A registered loss, as its module declares it (see the package docstring)."""

    name: str
    module: str
    builder: str
    needs: frozenset[str] = frozenset()
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)

    def build(self, recipe: dict[str, Any]) -> TrainingLoss:
        return getattr(importlib.import_module(f"compo.losses.{self.module}"), self.builder)(recipe)

    def recipe_schema(self) -> dict[str, Any]:
        """The JSON schema a resolved recipe of this loss meets: its keys' values and `recipe`."""
        return {"type": "object", "properties": {key: spec.get("schema", {}) for key, spec in self.keys.items()},
                "allOf": [self.recipe]}


class DeclarationError(ValueError):
    """A loss module's declaration is not plain data or not complete; the message names the file."""


def read_declaration(path: Path) -> dict[str, Any]:
    """The `LOSSES = {...}` a module assigns at its top level ({} when it declares none), read from its
    source without running it."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == DECLARATION for t in targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError as error:
                raise DeclarationError(f"{path}:{node.lineno}: {DECLARATION} must be plain data (literals "
                                       f"only: it is read without importing the module): {error}") from None
    return {}


def discover(package_dir: Path = Path(__file__).parent) -> dict[str, LossSpec]:
    """Every loss declared by the modules of this package, by name."""
    found: dict[str, LossSpec] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules([str(package_dir)])):
        path = package_dir / f"{module}.py"
        for name, entry in read_declaration(path).items():
            unknown = set(entry) - {"build", "needs", "keys", "recipe"}
            if unknown or "build" not in entry:
                raise DeclarationError(f"{path}: {DECLARATION}[{name!r}] needs 'build' and may have 'needs', "
                                       f"'keys', 'recipe' (got {', '.join(sorted(entry))})")
            if name in found:
                raise DeclarationError(f"{path}: loss {name!r} is also declared in compo/losses/"
                                       f"{found[name].module}.py")
            found[name] = LossSpec(name, module, entry["build"], frozenset(entry.get("needs", ())),
                                   entry.get("keys", {}), entry.get("recipe", {}))
    return found


LOSSES: dict[str, LossSpec] = discover()

# Recipe keys only some losses read (the others, e.g. base, train, lora, text, apply to every method).
LOSS_KEYS = tuple(sorted({key for spec in LOSSES.values() for key in spec.keys}))

# The dataset tables a training job reads besides its manifest, by the batch parts its loss needs.
PARSE_NEEDS = frozenset({"noun_phrases", "online_negatives"})   # the parse table (noun phrases, tokens)
IMAGE_NEEDS = frozenset({"cement_pairs"})                       # the negatives' rendered images


def get_loss(name: str) -> LossSpec:
    """The registered loss `name` (its implementation is imported by `LossSpec.build`)."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; registered: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


def needs_of(recipe: dict[str, Any]) -> frozenset[str]:
    """The batch parts a recipe's training needs: its loss's, plus hard_images when the recipe asks for them."""
    spec = get_loss(recipe.get("loss", "infonce"))
    return spec.needs | ({"hard_images"} if recipe.get("hard_images") is not None else frozenset())


def method_keys_schema() -> dict[str, Any]:
    """The loss keys as properties of a method in the config schema: any value there (a method may set part
    of a mapping its parent sets); the resolved recipe is checked against its loss's schema (`check_recipe`)."""
    return {key: {"description": f"read by loss {', '.join(s.name for s in LOSSES.values() if key in s.keys)}"}
            for key in LOSS_KEYS}


def _unused(recipe: dict[str, Any], spec: LossSpec) -> list[tuple[str, str]]:
    """Keys set on the recipe that its loss would silently not read, each with why."""
    reads = sorted(spec.keys)
    problems_ = [(key, f"loss {spec.name} does not use {key} (it reads {', '.join(reads) or 'no such key'}); "
                       "remove it or pick a loss that uses it")
                 for key in LOSS_KEYS if recipe.get(key) is not None and key not in spec.keys]
    if recipe.get("negatives") and "negatives" not in spec.needs:
        why = ("draws its negatives online (online_negatives); set negatives: null" if "online_negatives" in
               spec.needs else "reads no hard negatives; set negatives: null or pick a loss that needs them")
        problems_.append(("negatives", f"loss {spec.name} {why}"))
    if recipe.get("k") is not None and not spec.needs & {"negatives", "online_negatives"}:
        problems_.append(("k", f"loss {spec.name} reads no negatives, so no k; remove it"))
    extras = sorted(spec.needs - ROW_PARTS)
    if recipe.get("hard_images") is not None and extras:
        problems_.append(("hard_images", f"loss {spec.name} needs batch parts the hard-image rows do not carry "
                                         f"({', '.join(extras)}): hard_images adds rows of images, captions and "
                                         "their offline negatives only"))
    return problems_


def check_recipe(recipe: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with a resolved method recipe as (recipe key, message); empty when it is valid."""
    loss = recipe.get("loss")
    if loss not in LOSSES:
        return [("loss", f"unknown loss {loss!r}; registered: {', '.join(sorted(LOSSES))}")]
    spec = LOSSES[loss]
    unused = _unused(recipe, spec)
    if unused:
        return unused
    required = [key for key, entry in spec.keys.items() if entry.get("required")]
    required += ["negatives"] if "negatives" in spec.needs else []
    missing = [(key, f"loss {loss} requires {key}") for key in required if recipe.get(key) is None]
    if missing:
        return missing
    present = {key: value for key, value in recipe.items() if value is not None}
    return [(key, f"loss {loss} requires {key}" if message == "required" else message)
            for key, message in problems(spec.recipe_schema(), present, name_keys=True)]


def loss_keys_table() -> list[str]:
    """config/README's table of the loss keys, one row per key (a row per loss that reads it), from the
    declarations: what `compo loss-keys` prints."""
    rows = ["| key | loss: meaning | source |", "|---|---|---|"]
    for key in LOSS_KEYS:
        readers = [spec for spec in LOSSES.values() if key in spec.keys]
        meaning = "; ".join(f"{s.name}: {s.keys[key].get('meaning', '')}" for s in readers)
        sources = dict.fromkeys(s.keys[key].get("source", "") for s in readers if s.keys[key].get("source"))
        rows.append(f"| `methods.<name>.{key}` | {meaning} | {', '.join(sources)} |")
    return rows


README_MARKERS = ("<!-- loss keys: begin (written by compo loss-keys) -->", "<!-- loss keys: end -->")


def write_loss_keys_table(path: Path) -> None:
    """Replace the table between README_MARKERS in `path` (config/README.md) by `loss_keys_table()`."""
    replace_between(path, *README_MARKERS, "\n".join(loss_keys_table()))


def __getattr__(name: str) -> Any:
    """What the loss modules share (`compo.losses.base`, torch), imported when first asked for."""
    if name in ("TrainingLoss", "with_total", "encode_with_negatives", "encode_distinct_texts"):
        from compo.losses import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
