"""What a training step asks of the device, counted: dispatched ops, kernel ops and host syncs, by phase.

On a GPU a step whose kernels are small is bound by the host: every dispatched op costs some microseconds
of CPU to launch, and every read of a device value (a length, a mask count, a loss) makes the host wait for
the GPU to drain, so no launch is queued ahead. `OpCounter` counts both for any code (the project's
trainer, open_clip_train's `train_one_epoch`), per step and per phase:

* dispatched: every aten op that reaches the dispatcher (a TorchDispatchMode; the backward included);
* kernel: those that are not views or bare allocations (`empty*`, metadata ops): the ones that launch work;
* syncs: the ops that wait for the device: `.item()` / `bool()` / `int()` of a tensor (`_local_scalar_dense`),
  boolean-mask indexing and `nonzero`, `unique`, `bincount`, `masked_select`, `repeat_interleave` with tensor
  repeats (their result's size is read back), copies from the device to the host, and `.tolist()`.

Phases: `data` (from the DataLoader's `__next__` to the first module call: the sampler, host-to-device
copies, the learning rate), `forward` (model and loss), `backward` (inside `Tensor.backward`), `optimizer`
(from the end of the backward to the end of `optimizer.step`: unscaling, clipping, the update) and `after`
(the rest: the scaler update, the logit-scale clamp, EMA updates, reading the logged values).

On the CPU (`proxy=True`) every tensor stands for a device tensor, so a host read outside the `data` phase
counts as the sync it would be on a GPU, but for the tensors that stay on the host in a GPU run too: the
`data` phase's (the sampler's indices, the batch's CPU tensors) and the step counts of an optimizer that is
neither fused nor capturable (torch keeps them on the CPU and reads them with `.item()`).
"""

from __future__ import annotations

import contextlib
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

PHASES = ("data", "forward", "backward", "optimizer", "after")
KINDS = ("dispatched", "kernel", "syncs")
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
               "_record_function_enter_new", "_record_function_exit", "set_", "resize_"}
READS_SIZE = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "_unique", "unique_dim",
              "unique_consecutive", "bincount"}
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}


@dataclass
class StepCount:
    """One step's counts: phase -> kind -> number, which ops synced where, and whether an optimizer stepped
    (a loss scaler skips the step whose gradients overflowed)."""

    counts: dict[str, Counter] = field(default_factory=lambda: {phase: Counter() for phase in PHASES})
    sync_sites: Counter = field(default_factory=Counter)
    stepped: bool = False

    def total(self, kind: str) -> int:
        return sum(self.counts[phase][kind] for phase in PHASES)


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]


def _on_device(tensor: torch.Tensor, proxy: bool) -> bool:
    return proxy or tensor.device.type not in ("cpu", "meta")


class _Dispatch(TorchDispatchMode):
    def __init__(self, counter: OpCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.counter.dispatched(func, args, kwargs, out)
        return out


class _Function(TorchFunctionMode):
    """Sees `.tolist()` / `.numpy()`, which read a CPU tensor without dispatching an op."""

    def __init__(self, counter: OpCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        name = getattr(func, "__name__", "")
        if name in ("tolist", "numpy") and args and isinstance(args[0], torch.Tensor):
            if args[0].device.type == "cpu" and self.counter.proxy:  # a device tensor's read dispatches a copy
                self.counter.sync(name)
        return func(*args, **(kwargs or {}))


class OpCounter:
    """Counts ops per step and phase while active (`with OpCounter(proxy) as counter:`). `steps` holds a
    StepCount per step: the first for what ran before the first DataLoader `__next__` (all of it when no
    DataLoader is read), then one per `__next__` (step i of a training loop is `steps[i + 1]`)."""

    def __init__(self, proxy: bool) -> None:
        self.proxy = proxy
        self.steps: list[StepCount] = [StepCount()]
        self.phase = "data"
        self._stack = contextlib.ExitStack()
        self._host: set[int] = set()  # ids of tensors a GPU run keeps on the host (optimizer step counts)

    # -- what an op is
    def is_sync(self, func: Any, args: Any, kwargs: dict, out: Any) -> bool:
        name = func._overloadpacket.__name__
        tensors = _tensors(args, kwargs)
        if not tensors or not _on_device(tensors[0], self.proxy) or id(tensors[0]) in self._host:
            return False
        if name in READS_SIZE:
            return True
        if name == "repeat_interleave":  # tensor repeats without output_size: the size is read back
            return func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None
        if name in INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
        if name in ("_to_copy", "copy_") and not self.proxy:
            source = tensors[1] if name == "copy_" else tensors[0]
            target = tensors[0] if name == "copy_" else out
            return source.device.type != "cpu" and isinstance(target, torch.Tensor) and target.device.type == "cpu"
        return False

    def dispatched(self, func: Any, args: Any, kwargs: dict, out: Any) -> None:
        counts = self.steps[-1].counts[self.phase]
        counts["dispatched"] += 1
        name = func._overloadpacket.__name__
        if not (func.is_view or name in ALLOCATIONS):
            counts["kernel"] += 1
        if self.phase != "data" and self.is_sync(func, args, kwargs, out):
            self.sync(name)

    def sync(self, name: str) -> None:
        if self.phase == "data":
            return
        self.steps[-1].counts[self.phase]["syncs"] += 1
        self.steps[-1].sync_sites[(self.phase, name)] += 1

    # -- phases
    def _next_batch(self) -> None:
        self.steps.append(StepCount())
        self.phase = "data"

    def __enter__(self) -> OpCounter:
        counter = self
        loader_iter = torch.utils.data.dataloader._BaseDataLoaderIter
        original_next = loader_iter.__next__

        def next_batch(iterator):  # noqa: ANN001, ANN202
            counter._next_batch()
            return original_next(iterator)

        original_backward = torch.autograd.backward

        def backward(*args, **kwargs):  # noqa: ANN202
            counter.phase = "backward"
            try:
                return original_backward(*args, **kwargs)
            finally:
                counter.phase = "optimizer"

        def module_called(module, args):  # noqa: ANN001, ANN202
            if counter.phase == "data":
                counter.phase = "forward"

        def stepping(optimizer, args, kwargs):  # noqa: ANN001, ANN202
            if not (optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")):
                counter._host.update(id(state["step"]) for state in optimizer.state.values() if "step" in state)

        def stepped(optimizer, args, kwargs):  # noqa: ANN001, ANN202
            counter.phase = "after"
            counter.steps[-1].stepped = True

        stack = self._stack.__enter__()
        loader_iter.__next__ = next_batch
        stack.callback(setattr, loader_iter, "__next__", original_next)
        torch.autograd.backward = backward
        stack.callback(setattr, torch.autograd, "backward", original_backward)
        stack.callback(torch.nn.modules.module.register_module_forward_pre_hook(module_called).remove)
        stack.callback(register_optimizer_step_pre_hook(stepping).remove)
        stack.callback(register_optimizer_step_post_hook(stepped).remove)
        stack.enter_context(_Function(self))
        stack.enter_context(_Dispatch(self))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def steady(steps: list[StepCount], skip: int) -> list[StepCount]:
    """The steady-state steps of a training loop's `steps`: after the first `skip` and after the first step
    whose optimizer stepped (its state is created there), those whose optimizer stepped (not a step a loss
    scaler skipped)."""
    first = next((i for i, step in enumerate(steps) if step.stepped), len(steps))
    return [step for step in steps[max(skip, first + 1):] if step.stepped]


def per_step(kept: list[StepCount]) -> dict[str, dict[str, float]]:
    """Medians over `kept` steps: phase -> kind -> median, with a `total` phase (the median of the steps'
    totals)."""
    table = {phase: {kind: statistics.median(s.counts[phase][kind] for s in kept) for kind in KINDS}
             for phase in PHASES}
    table["total"] = {kind: statistics.median(s.total(kind) for s in kept) for kind in KINDS}
    return table


def sync_sites(kept: list[StepCount]) -> Counter:
    """Syncs by (phase, op), summed over `kept` steps."""
    total: Counter = Counter()
    for step in kept:
        total.update(step.sync_sites)
    return total

