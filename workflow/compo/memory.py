"""The GPU memory a training job needs, from its recipe alone (issue 42): what `compo plan` prints, what the train
rule checks against the profile's `gpu_mem_gb` while the DAG is built (refusing, before anything is queued, a job
that passes GPU_MEM_USABLE of it: `check_fits`), and what config/paper.yaml's `accum_freq` and `gpus` settings are
chosen by.

Per GPU (one process of a torchrun job), in GiB (2^30 bytes, as nvidia-smi's "80 GB" counts):

* static: float32 weights, their gradients and AdamW's two moments (16 bytes a trained parameter; a LoRA
  recipe trains almost none: 4), the autocast copies of the weights under amp (2 bytes a parameter, held from the
  forward to the backward pass), DeGLA's EMA teacher (a float32 copy: weights only, no gradients).
* activations: saved tensors per image sample and per text token of each tower (`ACTIVATIONS`, measured on the
  CPU by `compo_tools.calibrate_memory`: 2-10 % below a per-layer count of the saved tensors, not an upper bound), at
  the micro-batch (`train.batch_size` / `train.gpus` / `train.accum_freq`), times the rows a loss puts through
  each tower per caption (`rows_per_caption`), texts at the recipe's full context (the trainer cuts a batch's
  tokens to its longest text: the context is the worst case), with `train.grad_checkpointing` the checkpointed
  figures.
* loss terms on the global batch (every rank gathers it; `accum_freq` computes the loss on the full batch):
  the logits, and C2LIP's XAC (image, phrase) pair tensors (`XAC_PAIR_BYTES`, every image against every phrase).
* `ALLOCATOR_MARGIN` on the batch-dependent bytes (the caching allocator's fragmentation) and `CUDA_CONTEXT_GIB`:
  assumptions, not measurements.

No torch here (the plan and the rules call it while the DAG is built); no compo.config either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compo.devices import training_precision
from compo.losses import get_loss

GIB = 2**30
# Parameters of the models config/paper.yaml uses (open_clip's; `PYTHONPATH=tools python -m
# compo_tools.calibrate_memory` prints them);
# LongCLIP's 248 positions add 88 K to ViT-B-32's: nothing at this scale.
PARAMETERS = {"ViT-B-32-quickgelu": 151_277_313, "ViT-B-16-SigLIP": 203_155_970}
CONTEXT = {"ViT-B-32-quickgelu": 77, "ViT-B-16-SigLIP": 64}
# Saved-tensor bytes (compo_tools.calibrate_memory: random weights on the CPU, the slope between batches 2 and 4,
# precision amp = bfloat16 autocast, which keeps the same bytes as float16's; 2026-11-26, 2-core CPU,
# torch 2.13, open_clip 3.3.0; `PYTHONPATH=tools python -m compo_tools.calibrate_memory`): per image sample at
# 224 px, per text token at the model's context; `_ckpt`: with gradient checkpointing (saved outside the blocks +
# the blocks' inputs + one block recomputed at a time, measured from the same run).
ACTIVATIONS: dict[str, dict[str, dict[str, float]]] = {
    "ViT-B-32-quickgelu": {
        "amp": {"image": 19.0027e6, "image_ckpt": 2.9931e6, "text": 0.2538e6, "text_ckpt": 0.0506e6},
        "fp32": {"image": 37.9661e6, "image_ckpt": 5.9821e6, "text": 0.4599e6, "text_ckpt": 0.0723e6},
    },
    "ViT-B-16-SigLIP": {
        "amp": {"image": 67.0066e6, "image_ckpt": 14.4848e6, "text": 0.3357e6, "text_ckpt": 0.0677e6},
        "fp32": {"image": 118.8051e6, "image_ckpt": 19.9207e6, "text": 0.5968e6, "text_ckpt": 0.0922e6},
    },
}
# Checkpointing keeps 1/6.3 of ViT-B-32's image bytes, 1/5.0 of its text bytes (1/4.6 and 1/5.0 for SigLIP's).
# Per token, the text figures hold at other widths (the CPU's attention keeps no L x L matrix: a tiny tower gave
# 15.4 KB a token at 32 and at 77 tokens), so LongCLIP's 248 positions scale the 77-token figure linearly.
# C2LIP's XAC, bytes per (image, phrase) pair: ViT-B-16-SigLIP's 196 patches of 768 (compo_tools.calibrate_memory,
# the phrases doubled at 4 images; same run). The trainer's XAC builds the whole pair tensor on the global batch.
XAC_PAIR_BYTES = {"amp": 3868.0, "fp32": 6952.0}
# compo.batches.MAX_PHRASES_PER_CAPTION (torch is imported there; tests/test_memory.py keeps them equal)
PHRASES_PER_CAPTION = 8
XAC_CHUNK_PAIRS = 1 << 16  # compo.losses.c2lip.XAC_CHUNK_PAIRS (no torch here: tests/test_memory.py checks)
# The share of a GPU's memory a training job may be planned to use (`check_fits`): the model is not an upper bound.
# Its activations were calibrated on the CPU (random weights) and run 2-10 % below a per-layer count of the tensors
# autograd saves (siglip-ft on one GPU: 77.2 GiB here, 79.3 by that count; issue 56); an "80 GB" card leaves a
# process about 79.2 GiB; the allocator's fragmentation may pass ALLOCATOR_MARGIN. At 92 % of the card the ~10 %
# the model may miss stays on it (73.6 of 80 GiB).
GPU_MEM_USABLE = 0.92
LOGIT_COPIES = 4             # float32 logits, their softmax / sigmoid, and their gradient, on the global batch
ALLOCATOR_MARGIN = 1.15      # assumption: the caching allocator's fragmentation on the batch-dependent bytes
CUDA_CONTEXT_GIB = 1.0       # assumption: CUDA context, cuBLAS / cuDNN workspaces


@dataclass(frozen=True)
class TrainMemory:
    """The GiB one GPU of a training job needs, by part."""

    method: str
    model: str
    micro_batch: int
    static: float
    activations: float
    loss_terms: float

    @property
    def total(self) -> float:
        return self.static + ALLOCATOR_MARGIN * (self.activations + self.loss_terms) + CUDA_CONTEXT_GIB


def _train(recipe: dict[str, Any]) -> dict[str, Any]:
    return recipe.get("train") or {}


def gpus(recipe: dict[str, Any]) -> int:
    """The GPUs a recipe trains on (`train.gpus`, default 1): the train rule's `gpu` resource."""
    return int(_train(recipe).get("gpus", 1))


def accum_freq(recipe: dict[str, Any]) -> int:
    return int(_train(recipe).get("accum_freq", 1))


def rows_per_caption(recipe: dict[str, Any]) -> tuple[float, float]:
    """(images, texts) each caption of a batch puts through the towers with gradients, from the loss's declared
    batch parts (compo.losses): hard negatives add k texts (negclip, degla, cement), online negatives k per
    generator (fsc-clip), Cement's negative images k images, C2LIP's noun phrases up to PHRASES_PER_CAPTION
    texts; NegCLIP's `hard_images` doubles the rows (each caption brings an image, its caption and negatives)."""
    needs = get_loss(recipe.get("loss", "infonce")).needs
    k = int(recipe.get("k") or 1)
    images, texts = 1.0, 1.0
    if "negatives" in needs:
        texts += k
    if "online_negatives" in needs:
        texts += k * len(recipe.get("online_negatives") or [])
    if "cement_pairs" in needs:
        images += k
    if "noun_phrases" in needs:
        texts += PHRASES_PER_CAPTION
    if recipe.get("hard_images") is not None:
        images, texts = 2 * images, 2 * texts
    return images, texts


def has_teacher(recipe: dict[str, Any]) -> bool:
    """DeGLA with TGC or distillation keeps an EMA teacher (a weights copy; its forward pass each step)."""
    weights = recipe.get("weights") or {}
    return recipe.get("loss") == "degla" and (weights.get("tgc", 0) > 0 or weights.get("distill", 0) > 0)


def train_memory(recipe: dict[str, Any], model: str, settings: dict[str, Any]) -> TrainMemory | None:
    """The GiB per GPU of a training job of `recipe` (a resolved method) on `model`, under the config's `train:`
    settings (precision, grad_checkpointing; the recipe's own win); None where there are no measured figures for
    the model."""
    if model not in ACTIVATIONS or model not in PARAMETERS:
        return None
    amp = training_precision(recipe, str(settings.get("precision", "fp32"))).startswith("amp")
    figures = ACTIVATIONS[model]["amp" if amp else "fp32"]
    checkpointed = bool(settings.get("grad_checkpointing", False) or _train(recipe).get("grad_checkpointing", False))
    params = PARAMETERS[model]
    per_param = (4.0 if recipe.get("lora") else 16.0) + (2.0 if amp else 0.0) + (4.0 if has_teacher(recipe) else 0.0)
    batch = int(_train(recipe).get("batch_size", 0))
    micro = max(1, batch // gpus(recipe) // accum_freq(recipe))
    context = int((recipe.get("text") or {}).get("context_length") or CONTEXT[model])
    images, texts = rows_per_caption(recipe)
    suffix = "_ckpt" if checkpointed else ""
    activations = micro * (images * figures["image" + suffix] + texts * context * figures["text" + suffix])
    loss_terms = LOGIT_COPIES * 4.0 * (batch * images) * (batch * texts)
    weights = recipe.get("weights") or {}
    if "noun_phrases" in get_loss(recipe.get("loss", "infonce")).needs and weights.get("xac", 0) > 0:
        # XAC's pair matrix in checkpointed chunks (losses/c2lip.py): one chunk's pairs held at a time
        pairs = min(batch * batch * PHRASES_PER_CAPTION, XAC_CHUNK_PAIRS)
        loss_terms += pairs * XAC_PAIR_BYTES["amp" if amp else "fp32"]
    return TrainMemory(str(recipe.get("name")), model, micro, params * per_param / GIB, activations / GIB,
                       loss_terms / GIB)


def usable_gb(gpu_mem_gb: float) -> float:
    """The GiB of a GPU of `gpu_mem_gb` a training job may be planned to use (GPU_MEM_USABLE of it)."""
    return gpu_mem_gb * GPU_MEM_USABLE


def check_fits(recipe: dict[str, Any], model: str, settings: dict[str, Any], gpu_mem_gb: float) -> str | None:
    """None when a training job of `recipe` fits a GPU of `gpu_mem_gb` GiB within the margin (`usable_gb`; or there
    is no figure for its model); else a one-line refusal naming the method, the GiB needed, the GPU's and the
    margin's, and what to set: the smallest `accum_freq` that fits, and the smallest with
    `train.grad_checkpointing` (fewer extra passes), or more GPUs; when neither fits, the loss's global-batch
    terms alone exceed the GPU: a smaller batch."""
    needed = train_memory(recipe, model, settings)
    limit = usable_gb(gpu_mem_gb)
    if needed is None or needed.total <= limit:
        return None
    name = needed.method
    head = (f"method {name}: needs {needed.total:.1f} GB of GPU memory per GPU (weights and optimizer "
            f"{needed.static:.1f}, activations {needed.activations:.1f} at micro-batch {needed.micro_batch}, loss "
            f"terms {needed.loss_terms:.1f}; compo.memory), the GPU has {gpu_mem_gb:g} GB, of which a job is planned "
            f"to use at most {limit:.1f} ({GPU_MEM_USABLE * 100:g} %: the model's CPU-calibrated activations run up to "
            "10 % below a count of the saved tensors)")
    per_rank = int(_train(recipe).get("batch_size", 0)) // gpus(recipe)
    options = []
    for checkpointing in sorted({bool(settings.get("grad_checkpointing", False)), True}):
        for freq in (f for f in range(accum_freq(recipe), per_rank + 1) if per_rank % f == 0):
            trial = {**recipe, "train": {**_train(recipe), "accum_freq": freq}}
            fits = train_memory(trial, model, {**settings, "grad_checkpointing": checkpointing})
            if fits is not None and fits.total <= limit:
                what = [f"methods.{name}.train.accum_freq: {freq}"] if freq != accum_freq(recipe) else []
                if checkpointing and not settings.get("grad_checkpointing", False):
                    what.insert(0, "train.grad_checkpointing: true")
                options.append(f"{' and '.join(what)} ({fits.total:.1f} GB)")
                break
    if options:
        return f"{head}: set {', or '.join(options)}, or train on more GPUs (methods.{name}.train.gpus)"
    return (f"{head}: its loss's global-batch terms alone need {needed.loss_terms:.1f} GB; lower "
            f"methods.{name}.train.batch_size or use a GPU with more memory")


def evaluate_memory_gb(model: str, batch_size: int, probe_images: int, classes: int, feature_dim: int,
                       logit_copies: int = 4, logit_bytes: int = 8) -> float | None:
    """GiB of an evaluation job's GPU: the model's float32 weights, one batch's features through the towers
    without gradients (no saved tensors: a tenth of a training step's per-sample bytes, an assumption), the
    linear probe's training features (`probe_images` x `feature_dim` float32) and its logits held
    `logit_copies` times (the float64 L-BFGS probe: logits, their softmax, the gradient and L-BFGS's line-search
    copy; `logit_bytes` 8). The probe's bound is the evaluation engineer's (issue 42 item 3); this states what it
    is today. None without figures for the model."""
    if model not in ACTIVATIONS:
        return None
    weights = 4.0 * PARAMETERS[model]
    batch = batch_size * ACTIVATIONS[model]["amp"]["image"] / 10
    probe = probe_images * feature_dim * 4.0 + logit_copies * probe_images * classes * float(logit_bytes)
    return (weights + ALLOCATOR_MARGIN * (batch + probe)) / GIB + CUDA_CONTEXT_GIB

