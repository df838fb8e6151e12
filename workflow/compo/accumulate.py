"""Gradient accumulation over micro-batches with the FULL batch's loss (recipe key `train.accum_freq`).

A step's batch of `batch_size` captions (this rank's slice under torchrun) is built as `accum_freq`
micro-batches of equal size, each by `compo.batches` as a batch of its own rows (every batch part:
negatives, phrases, packed negative images, hard-image rows). As open_clip_train's `accum_freq`:

1. a first pass without autograd runs the loss on every micro-batch and keeps the per-sample tensors
   the loss combines across samples, i.e. every tensor it passes through `compo.distributed.gather_with_grad`
   (image and text embeddings, negatives, masks, phrase owners, per-row scores: whatever the loss
   declares global by gathering it); the loss values of this pass are thrown away;
2. then, per micro-batch, the loss runs again with autograd: each gather returns the whole batch, this
   micro-batch's rows freshly computed (in the graph) and the others' rows from the first pass (constants),
   so the loss is the full batch's, every negative of the full batch kept; its backward frees the
   micro-batch's activations before the next one starts. One optimizer step follows.

Why the gradient is the big batch's: the loss L(f_1..f_M, theta) depends on the micro-batches' features
f_j and directly on some parameters (the logit scale and bias). Pass j backpropagates L / M with the
gradient into f_j multiplied by M (`_ScaleGradient`): f_j gets dL/df_j once over the M passes and a direct
parameter dL/dtheta / M in each of M passes, once in all. This is `compo.distributed`'s argument with the
micro-batches as ranks (the gather's summed backward gives a rank's features N times the gradient, the
average divides by N), and the two compose: under torchrun the micro-batches are assembled first into the
rank's slice, which the ranks then gather (in pass 2 only: pass 1 never communicates).

What is not equal to the big batch: BatchNorm towers (CLIP's ResNets) normalise each micro-batch by its own
statistics (as they normalise each rank's slice) and update their running statistics once per micro-batch
of pass 2 (pass 1 restores them); dropout would draw other masks in the two passes (the study's towers
have none); everything else is equal up to float rounding (sums in another order).

Loss state computed from the batch that does not need a gradient and must not be computed twice (DeGLA's EMA
teacher's embeddings) goes through `once_per_step`: computed in pass 1, reused in pass 2.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")


class AccumulationError(RuntimeError):
    """The two passes over a micro-batch disagree (a loss whose gathers depend on values, not on shapes)."""


@dataclass
class _Passes:
    """The state of one accumulated step: which micro-batch runs, in which pass, and what pass 1 kept."""

    parts: int
    position: int = 0
    recording: bool = True
    calls: int = 0  # gathers of the current micro-batch so far
    onces: int = 0  # once_per_step calls of the current micro-batch so far
    gathered: list[list[torch.Tensor]] = field(default_factory=list)  # [micro-batch][call]
    kept: list[list[object]] = field(default_factory=list)  # once_per_step results, [micro-batch][call]

    def begin(self, position: int, recording: bool) -> None:
        self.position, self.recording, self.calls, self.onces = position, recording, 0, 0
        if recording:
            self.gathered.append([])
            self.kept.append([])

    def end(self) -> None:
        if not self.recording and self.calls != len(self.gathered[self.position]):
            raise AccumulationError(f"micro-batch {self.position}: the loss gathered {self.calls} tensors with "
                                    f"autograd and {len(self.gathered[self.position])} in the first pass; a loss "
                                    "must gather the same tensors whatever their values")


_ACTIVE: _Passes | None = None


def active() -> bool:
    """Whether an accumulated step is running (a plain read of a global: torch.compile guards on it, no break)."""
    return _ACTIVE is not None


def parts() -> int:
    """Micro-batches of the current step (1 outside an accumulated step)."""
    return _ACTIVE.parts if _ACTIVE is not None else 1


def recording() -> bool:
    """Whether the first (no-grad) pass is running: gathers keep their tensor and return it unchanged."""
    return _ACTIVE is not None and _ACTIVE.recording


@torch.compiler.disable  # Python-side bookkeeping: runs eagerly under train.compile
def record(x: torch.Tensor) -> torch.Tensor:
    """Pass 1: keep `x`, this micro-batch's rows of a gathered tensor; the loss goes on with them alone."""
    _ACTIVE.gathered[_ACTIVE.position].append(x.detach())
    return x


class _ScaleGradient(torch.autograd.Function):
    """The identity whose backward multiplies the gradient by `factor` (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:  # noqa: ANN001
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad * ctx.factor, None


@torch.compiler.disable
def assemble(x: torch.Tensor, index_rows: int | None = None) -> torch.Tensor:
    """Pass 2: the rows of `x` of every micro-batch in order, this micro-batch's `x` in the graph (its gradient
    scaled by the number of micro-batches) and the others' from pass 1. index_rows: `x` holds row indices into a
    micro-batch of that many rows (e.g. a phrase's caption), shifted to index the assembled batch. The identity
    outside an accumulated step."""
    state = _ACTIVE
    if state is None:
        return x
    call = state.calls
    state.calls += 1
    if call >= len(state.gathered[state.position]):
        raise AccumulationError(f"micro-batch {state.position}: the loss gathered more tensors with autograd "
                                f"than in the first pass ({call + 1} > {len(state.gathered[state.position])})")
    parts_ = [kept[call] for kept in state.gathered]
    first = parts_[state.position]
    if first.shape != x.shape or first.dtype != x.dtype:
        raise AccumulationError(f"micro-batch {state.position}: gathered tensor {call} is {tuple(x.shape)} "
                                f"{x.dtype} with autograd but was {tuple(first.shape)} {first.dtype} in the first "
                                "pass")
    parts_[state.position] = _ScaleGradient.apply(x, float(state.parts)) if x.requires_grad else x
    if index_rows is not None:
        parts_ = [part + j * index_rows for j, part in enumerate(parts_)]
    return torch.cat(parts_)


def once_per_step(compute: Callable[[], T]) -> T:
    """`compute()` (features without gradient, e.g. an EMA teacher's embeddings of this micro-batch): run in
    pass 1 and its result returned again in pass 2, so an accumulated step computes it once per micro-batch,
    as the plain step does. Gather its results outside `compute`."""
    return compute() if _ACTIVE is None else _once(compute)


@torch.compiler.disable
def _once(compute: Callable[[], T]) -> T:
    state = _ACTIVE
    call = state.onces
    state.onces += 1
    if state.recording:
        result = compute()
        state.kept[state.position].append(result)
        return result
    return state.kept[state.position][call]  # type: ignore[return-value]


@contextlib.contextmanager
def _batchnorm_statistics_kept(model: nn.Module) -> Iterator[None]:
    """Restore the BatchNorm running statistics after the block (pass 1 must not update them)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [{name: b.clone() for name, b in m.named_buffers(recurse=False) if b is not None} for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for module, buffers in zip(norms, saved, strict=True):
                for name, value in buffers.items():
                    getattr(module, name).copy_(value)


def accumulated_step(forward: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
                     micro_batches: Sequence[dict[str, torch.Tensor]], model: nn.Module,
                     backward: Callable[[torch.Tensor], None], total: str) -> dict[str, torch.Tensor]:
    """Backpropagate the full batch's loss over `micro_batches` (see the module docstring); returns the loss
    terms of the full batch (detached, as the last micro-batch's pass computed them).

    forward: the loss of one micro-batch (the trainer's, under its autocast); backward: what the trainer does
    with a loss tensor (scaled by its GradScaler); total: the key of the terms' total. With one micro-batch this
    is the plain step: forward, backward."""
    global _ACTIVE
    if len(micro_batches) == 1:
        terms = forward(micro_batches[0])
        backward(terms[total])
        return terms
    if _ACTIVE is not None:
        raise AccumulationError("an accumulated step is already running")
    state = _ACTIVE = _Passes(len(micro_batches))
    try:
        with torch.no_grad(), _batchnorm_statistics_kept(model):
            for position, batch in enumerate(micro_batches):
                state.begin(position, recording=True)
                forward(batch)
                state.end()
        for position, batch in enumerate(micro_batches):
            state.begin(position, recording=False)
            terms = forward(batch)
            state.end()
            backward(terms[total] / state.parts)
            terms = {name: value.detach() for name, value in terms.items()}
    finally:
        _ACTIVE = None
    return terms


def split_rows(rows: Sequence[int], parts_: int, where: str = "train.accum_freq") -> list[list[int]]:
    """`rows` (a rank's slice of a global batch) as `parts_` contiguous micro-batches of equal size."""
    if parts_ < 1 or len(rows) % parts_:
        raise AccumulationError(f"{where} {parts_}: the {len(rows)} captions of a step (per rank) do not split into "
                                f"{parts_} equal micro-batches; choose train.batch_size divisible by accum_freq times "
                                "the number of GPUs")
    size = len(rows) // parts_
    return [list(rows[i * size:(i + 1) * size]) for i in range(parts_)]
