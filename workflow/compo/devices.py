"""Where tensors live and in which precision they are computed: one setting for every stage.

A device setting (`train.device`, `evaluate.device`, an LLM generator's `device`) is `auto`, `cpu` or
`cuda`: `auto` picks the GPU when torch sees one, else the CPU, with a warning line saying so (a GPU job
that cannot see its GPU would otherwise train on the CPU without a word); `cuda` without a GPU is an
error naming the key, CUDA_VISIBLE_DEVICES and the SLURM job, raised where the stage starts.
Training, WiSE-FT, evaluation, ConcretePlant's Table 1 and the transformers LLM backend all
resolve it here (`resolve_device`), so they agree on what `auto` means.

Precision follows open_clip's `--precision`: `fp32` computes in float32; `amp` runs the forward pass
under autocast to float16 with a gradient scaler (loss scaling keeps small float16 gradients from
flushing to zero); `amp_bf16` autocasts to bfloat16, whose float32-sized exponent needs no scaler.
Parameters and optimizer state stay float32 in every mode. Evaluation adds `auto`: `amp` on a GPU (as
CLIP_benchmark encodes, under autocast) and `fp32` on the CPU, where float16 matmuls are slow and the
embedded study's results are defined in float32.

The setting names are torch-free (the config check, run while Snakemake builds the DAG, reads them);
the functions import torch when called.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "amp", "amp_bf16")
EVAL_PRECISIONS = ("auto", *PRECISIONS)
SHAPES = ("auto", "dynamic", "static")  # train.shapes (compo.models.set_static_shapes)


log = logging.getLogger(__name__)


class DeviceError(ValueError):
    """A device or precision setting cannot be honoured; the message names the config key."""


def no_gpu_reason() -> str:
    """Why torch sees no GPU, as far as this process can tell: torch's CUDA build, CUDA_VISIBLE_DEVICES and
    the SLURM job (a job without a GPU in its allocation, or a container started without --nv, sees none)."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    job = os.environ.get("SLURM_JOB_ID")
    words = [f"torch {torch.__version__} sees no CUDA GPU (CUDA build: {torch.version.cuda or 'no'}",
             f"CUDA_VISIBLE_DEVICES={'unset' if visible is None else repr(visible)}"]
    if job:
        words.append(f"SLURM job {job} with GPUs {os.environ.get('SLURM_GPUS_ON_NODE') or 'none'}")
    return ", ".join(words) + ")"


def resolve_device(setting: str = "auto", key: str = "device", index: int = 0) -> torch.device:
    """The torch device a setting names (`index`: the GPU of this process, e.g. torchrun's LOCAL_RANK)."""
    import torch

    if setting not in DEVICES:
        raise DeviceError(f"config key {key}: {setting!r} is not a device (expected one of {', '.join(DEVICES)})")
    if setting == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if setting == "auto":
            log.warning("config key %s: auto runs on the CPU: %s", key, no_gpu_reason())
            return torch.device("cpu")
        raise DeviceError(f"config key {key}: cuda, but {no_gpu_reason()}; run the job where a GPU is visible "
                          "(a GPU partition and a `gpu` resource in the profile; Apptainer's --nv in a container) "
                          "or set the key to auto or cpu")
    if index >= torch.cuda.device_count():
        raise DeviceError(f"config key {key}: GPU {index} requested but {torch.cuda.device_count()} visible")
    use_shape_agnostic_attention()
    return torch.device("cuda", index)


def use_shape_agnostic_attention() -> None:
    """Keep scaled-dot-product attention off cuDNN's backend (flash / memory-efficient kernels instead).

    The text tower runs only up to each batch's longest caption (`compo.models`), so its sequence length
    changes from batch to batch. cuDNN's attention builds an execution plan for every new shape, about
    6 ms of CPU in the forward and 8 ms in the backward of each of the 12 layers of a ViT-B-32 text tower,
    which left an H100 idle most of a training step (tools/bench_throughput.py, docs/embedded-study.md).
    The other kernels need no per-shape plan. Global and idempotent: every GPU stage resolves its device here.
    """
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)


def check_precision(precision: str, key: str = "train.precision", allowed: tuple[str, ...] = PRECISIONS) -> str:
    if precision not in allowed:
        raise DeviceError(f"config key {key}: {precision!r} is not a precision (expected one of {', '.join(allowed)})")
    return precision


def training_precision(recipe: dict[str, Any], study: str) -> str:
    """The precision a recipe trains in: its own `train.precision` (a method's, inherited like its other train
    keys: C2LIP's released script runs bf16), else the study's `train.precision` (`study`). The trainer and the
    GPU memory model (compo.memory, compo plan) both read it here."""
    own = (recipe.get("train") or {}).get("precision")
    if own is None:
        return check_precision(study)
    return check_precision(own, f"methods.{recipe.get('name', '<recipe>')}.train.precision")


def eval_precision(precision: str, device: torch.device, key: str = "evaluate.precision") -> str:
    """An evaluation precision with `auto` resolved: amp on a GPU, fp32 on the CPU."""
    check_precision(precision, key, EVAL_PRECISIONS)
    if precision == "auto":
        return "amp" if device.type == "cuda" else "fp32"
    return precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype autocast computes in under `precision`; None for fp32 (no autocast)."""
    import torch

    return {"fp32": None, "amp": torch.float16, "amp_bf16": torch.bfloat16}[check_precision(precision)]


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """open_clip's autocast for `precision` on `device` (nothing under fp32)."""
    import torch

    dtype = autocast_dtype(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device.type, dtype=dtype):
        yield


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """The loss scaler `amp` (float16) needs, as open_clip; None for fp32 and amp_bf16."""
    import torch

    return torch.amp.GradScaler(device.type) if check_precision(precision) == "amp" else None


def static_shapes(setting: str, device: torch.device, key: str = "train.shapes") -> bool:
    """Whether training runs with static shapes (`train.shapes`; compo.models.set_static_shapes): `auto` is
    static on a GPU, where a step is bound by the host's kernel launches and a read of a device value waits
    for the GPU, and dynamic on the CPU, where the per-length text groups do a third less arithmetic."""
    check_shapes(setting, key)
    return setting == "static" or (setting == "auto" and device.type == "cuda")


def check_shapes(setting: str, key: str = "train.shapes") -> str:
    if setting not in SHAPES:
        raise DeviceError(f"config key {key}: {setting!r} is not a shapes setting (expected one of "
                          f"{', '.join(SHAPES)})")
    return setting


def fused_optimizer(device: torch.device) -> bool:
    """AdamW's fused kernels on a GPU (one launch per parameter group, no host read of the loss scaler's
    inf check); on the CPU the multi-tensor update, which the CPU study's bit-for-bit results rest on."""
    return device.type == "cuda"


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity (a SLURM job's cgroup), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def rank_cpus(threads: int | None, ranks: int = 1, available: int | None = None) -> int:
    """One rank's share of a job's CPUs: the job's `threads` (the CPUs its rule asked for; None: every CPU
    available), at most the `available` ones (default: this process's, `available_cpus`), split over its `ranks`
    (torchrun's processes, which share the job's CPUs); at least 1."""
    available = available_cpus() if available is None else available
    cpus = available if threads is None else min(max(1, int(threads)), available)
    return max(1, cpus // max(1, int(ranks)))


def data_workers(threads: int, device: torch.device) -> int:
    """DataLoader worker processes for a process of `threads` cores (a rank's share of the job: `rank_cpus`):
    on a GPU every core but the one feeding it decodes and transforms images (none with one core: the process
    decodes itself); on the CPU the cores compute, and one worker (when the process has more than one core)
    decodes ahead of the step, competing with it only until its images are cached."""
    threads = max(1, int(threads))
    if device.type == "cuda":
        return threads - 1
    return 1 if threads > 1 else 0


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads from the job's `threads` (unchanged when None)."""
    import torch

    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
