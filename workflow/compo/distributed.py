"""Data-parallel training under `torchrun`: one process per GPU inside one job.

Without a process group every function here is the identity (world size 1, rank 0), so the trainer
and the losses run unchanged in one process. Under `torchrun --nproc_per_node N` the trainer calls
`process_group()`, which initialises `torch.distributed` from torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT): backend nccl with one GPU per rank, gloo on CPU.

How N ranks reproduce one process on the global batch (open_clip's `gather_with_grad`, local_loss=False):

* rank r takes rows [r*B/N, (r+1)*B/N) of each global batch of B captions (`local_rows`);
* a loss passes every per-sample tensor it combines across samples through `gather_with_grad`, in
  the order rank 0, 1, ...: the gathered tensors are the global batch's, so every rank computes the
  SAME global loss value, with the same formula as one process (means over the global batch, DeGLA's
  distill summed over it);
* the backward of the gather returns to each rank the SUM over ranks of the gradient for its slice,
  i.e. N times the global loss's gradient for its own samples, while parameters a loss uses directly
  (the logit scale and bias) get the global gradient once on every rank;
* `average_gradients` then all-reduces the parameter gradients and divides by N: the N-fold slice
  gradients sum to exactly the global gradient, the direct ones average to it. The optimizer step is
  then the single-process step on every rank, and the ranks' weights stay identical.

open_clip's two options for its contrastive loss are settings (`train.local_loss`, `train.gather_with_grad`,
in effect inside `loss_options`):

* local_loss: true makes InfoNCE and NegCLIP score only this rank's rows (queries) against the gathered
  columns (`loss_rows`), B/N x B logits instead of B x B. Each rank's loss is then the mean over its own
  rows; with the gather's summed backward and the averaging below, the step is still exactly the
  single-process step (the N local means average to the global mean), and losses.csv logs the mean
  over the ranks. Losses with per-row terms over several partitions (DeGLA, Cement, FSC-CLIP, C2LIP)
  always compute the global loss.
* gather_with_grad: false gathers the other ranks' features without autograd (no backward
  communication) and keeps this rank's own rows in the graph, as open_clip's default: each rank's
  features then get the global loss's gradient once instead of N times, so after the averaging they
  carry 1/N of the single-process gradient while parameters used directly (the logit scale) carry all
  of it. Adam's update is nearly invariant to that scale; exact equivalence needs the default (true).

Gradient accumulation (`compo.accumulate`, recipe `train.accum_freq`) composes with this: `gather_with_grad`
first assembles the rank's micro-batches into its slice (the micro-batches act as ranks within the rank,
by the same argument), then gathers the slices over the ranks.

The equivalence holds for towers without BatchNorm (ViTs, the text transformer). CLIP's ModifiedResNet
towers (the embedded study's) normalise by each rank's own batch statistics in training, as open_clip's
torchrun training does without SyncBatchNorm: N ranks then train close to, not exactly as, one process
(`broadcast_module` logs a warning; the exported running statistics are rank 0's).

The gradients are averaged by an explicit all-reduce after `backward`, not by DDP: a loss reaches
the model through `encode_image`/`encode_text`/submodules rather than the module's `forward`, which
DDP's hooks are tied to, and the explicit all-reduce keeps "parameter without a gradient" (AdamW skips
it) exactly as in one process. The cost is that communication does not overlap the backward pass.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn

from compo import accumulate
from compo.devices import resolve_device

log = logging.getLogger(__name__)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
BUCKET_ELEMENTS = 1 << 25  # gradients are all-reduced in flat buckets of at most this many elements


class DistributedError(RuntimeError):
    """The distributed setup cannot train this recipe (e.g. a batch that does not split over the ranks)."""


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_main() -> bool:
    """Only the main rank writes outputs (checkpoint, losses, config, resume state)."""
    return rank() == 0


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def device(setting: str = "auto") -> torch.device:
    """The device this rank trains on (`train.device`: auto | cpu | cuda): under torchrun its own GPU
    (LOCAL_RANK), else GPU 0, or the CPU (compo.devices.resolve_device)."""
    local_rank = int(os.environ["LOCAL_RANK"]) if launched_by_torchrun() else 0
    if local_rank and setting != "cpu" and torch.cuda.is_available() and local_rank >= torch.cuda.device_count():
        raise DistributedError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs visible; start "
                               "torchrun with --nproc_per_node at most the job's GPU count")
    return resolve_device(setting, "train.device", index=local_rank)


@contextlib.contextmanager
def process_group(on: torch.device | None = None) -> Iterator[None]:
    """Initialise torch.distributed from torchrun's environment for the duration of the block: backend
    nccl when this rank trains on a GPU (`on`, default: `device()`), gloo on the CPU.

    Does nothing in a plain process, or when the caller already initialised a group (it keeps it).
    """
    if not launched_by_torchrun() or is_distributed():
        yield
        return
    on = on if on is not None else device()
    if on.type == "cuda":
        torch.cuda.set_device(on)
    backend = "nccl" if on.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    log.info("rank %d of %d (backend %s, device %s)", rank(), world_size(), backend, on)
    try:
        yield
    finally:
        dist.destroy_process_group()


_LOSS_OPTIONS = {"local_loss": False, "gather_with_grad": True}


@contextlib.contextmanager
def loss_options(local_loss: bool = False, gather_with_grad: bool = True) -> Iterator[None]:
    """open_clip's local_loss and gather_with_grad choices (module docstring) for the block."""
    saved = dict(_LOSS_OPTIONS)
    _LOSS_OPTIONS.update(local_loss=bool(local_loss), gather_with_grad=bool(gather_with_grad))
    try:
        yield
    finally:
        _LOSS_OPTIONS.update(saved)


def local_loss() -> bool:
    """Whether contrastive losses score only this rank's rows (train.local_loss, under torchrun)."""
    return _LOSS_OPTIONS["local_loss"] and world_size() > 1


def loss_rows(n_global: int) -> slice:
    """The rows of a gathered batch of `n_global` rows this rank's loss scores: its own slice under
    local_loss, else all of them."""
    if not local_loss():
        return slice(None)
    per_rank = n_global // world_size()
    return slice(rank() * per_rank, (rank() + 1) * per_rank)


def mean_over_ranks(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached values averaged over the ranks (what losses.csv logs when each rank's loss is local)."""
    if not local_loss():
        return values
    stacked = torch.stack([value.detach().float() for value in values.values()])
    dist.all_reduce(stacked)
    return dict(zip(values, stacked / world_size(), strict=True))


def local_rows(indices: Sequence[int]) -> list[int]:
    """This rank's contiguous slice of a global batch's indices: rows [r*B/N, (r+1)*B/N)."""
    n, b = world_size(), len(indices)
    if b % n:
        raise DistributedError(f"train.batch_size {b} is not divisible by the {n} ranks (GPUs); the global "
                               "batch is split evenly over them")
    per_rank = b // n
    return list(indices[rank() * per_rank : (rank() + 1) * per_rank])


def _gather_plain(x: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """The rows of `x` of every rank, concatenated in rank order (the global batch's row order).

    Rows may differ in number between ranks (e.g. the valid hard negatives of each slice). The
    backward returns each rank the sum over ranks of the gradient for its own rows (see the module
    docstring for why that, with `average_gradients`, gives the single-process gradient). Tensors
    without gradient (masks, indices) are gathered the same way. The identity without a process group.
    In an accumulated step (`compo.accumulate`) the rank's micro-batches are assembled first.
    """
    if accumulate.active():
        if accumulate.recording():  # pass 1: this micro-batch alone, no communication
            return accumulate.record(x)
        x = accumulate.assemble(x)
    return _gather_ranks(x)


def _gather_ranks(x: torch.Tensor) -> torch.Tensor:
    """`gather_with_grad` over the ranks only."""
    if not is_distributed() or world_size() == 1:
        return x
    rows = torch.tensor([len(x)], device=x.device)
    counts = [int(c) for c in _gather_plain(rows)]
    most = max(counts)
    padded = x if len(x) == most else torch.cat([x, x.new_zeros(most - len(x), *x.shape[1:])])
    if padded.dtype == torch.bool:  # not every backend all-gathers bools
        parts = [p.bool() for p in _gather_plain(padded.to(torch.uint8))]
    elif padded.requires_grad and _LOSS_OPTIONS["gather_with_grad"]:
        parts = list(dist_nn.all_gather(padded))
    else:
        parts = _gather_plain(padded.detach())
        if padded.requires_grad:  # gather_with_grad false: only this rank's own rows stay in the graph
            parts[rank()] = padded
    return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])


def gather_index(index: torch.Tensor, local_size: int) -> torch.Tensor:
    """Gather row indices into a rank's batch of `local_size` rows (e.g. a phrase's owner caption) as global
    batch indices (in an accumulated step `local_size` is a micro-batch's; a rank holds `accumulate.parts()`)."""
    if accumulate.active():
        if accumulate.recording():
            return accumulate.record(index)
        index = accumulate.assemble(index, index_rows=local_size)
    return _gather_ranks(index + rank() * local_size * accumulate.parts())


def broadcast_module(module: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (they start identical, whatever the init)."""
    if not is_distributed():
        return
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()) and is_main():
        log.warning("the model has BatchNorm layers: each of the %d ranks normalises its slice of the batch by "
                    "the slice's statistics, so training differs from one process on the global batch (see "
                    "compo.distributed)", world_size())
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)


def _buckets(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for tensor in tensors:
        if bucket and (size + tensor.numel() > BUCKET_ELEMENTS or tensor.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(tensor)
        size += tensor.numel()
    if bucket:
        yield bucket


def average_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """All-reduce the gradients of `parameters` and divide by the world size (no-op in one process).

    A parameter without a gradient on every rank keeps none (AdamW skips it, as in one process); one
    with a gradient on some rank only gets zeros for the others.
    """
    if not is_distributed() or world_size() == 1:
        return
    parameters = [p for p in parameters if p.requires_grad]
    if not parameters:
        return
    has_grad = torch.tensor([p.grad is not None for p in parameters], dtype=torch.uint8,
                            device=parameters[0].device)
    dist.all_reduce(has_grad, op=dist.ReduceOp.MAX)
    grads = []
    for parameter, any_rank in zip(parameters, has_grad.tolist(), strict=True):
        if not any_rank:
            continue
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        grads.append(parameter.grad)
    n = world_size()
    for bucket in _buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        flat /= n
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def barrier() -> None:
    if is_distributed():
        dist.barrier()
