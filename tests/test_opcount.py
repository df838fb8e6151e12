"""compo_tools.opcount (ops, kernels and host syncs per step and phase) and tools/bench_throughput.py --count-ops'
narrowed model."""

from __future__ import annotations

import pytest
import torch
from helpers import load_script

from compo_tools.opcount import OpCounter, per_step, steady


def _bench():  # noqa: ANN202 - the script as a module
    return load_script("tools/bench_throughput.py")


def test_what_counts_as_a_sync_a_kernel_and_a_view() -> None:
    x = torch.randn(6, 4)
    with OpCounter(proxy=True) as counter:
        torch.nn.Linear(4, 4)(x)  # a module call: the forward phase starts
        x.t()  # a view: dispatched, no kernel
        torch.empty(3)  # an allocation: dispatched, no kernel
        y = x * 2  # a kernel
        y[y > 0]  # boolean indexing reads the count back
        y.sum().item()  # a scalar read
        y.tolist()  # a read without an op on the CPU
        torch.unique(y)
        y[torch.tensor([0, 1])]  # integer indexing: no read
    forward = counter.steps[0].counts["forward"]
    assert dict(counter.steps[0].sync_sites) == {("forward", "index"): 1, ("forward", "_local_scalar_dense"): 1,
                                                 ("forward", "tolist"): 1, ("forward", "_unique2"): 1}
    assert forward["syncs"] == 4 and forward["dispatched"] - forward["kernel"] >= 3  # t, empty, a view of Linear
    with OpCounter(proxy=False) as on_cpu:  # CPU tensors of a real CPU run: nothing waits for a device
        torch.nn.Linear(4, 4)(x)
        x[x > 0].sum().item()
    assert on_cpu.steps[0].counts["forward"]["syncs"] == 0


def test_phases_steps_and_the_host_step_counts_of_a_foreach_optimizer() -> None:
    model = torch.nn.Linear(4, 2)
    optimizers = {"foreach": torch.optim.AdamW(model.parameters(), foreach=True)}
    loader = torch.utils.data.DataLoader(torch.randn(12, 4), batch_size=4)
    with OpCounter(proxy=True) as counter:
        for batch in loader:
            batch.sum().item()  # data phase: host work on a GPU too, not a sync
            loss = model(batch).square().mean()
            loss.backward()
            optimizers["foreach"].step()
            optimizers["foreach"].zero_grad()
            loss.item()  # after the step: the logged value
    # before the loop, 3 steps, and the __next__ that ends the loop
    assert [step.stepped for step in counter.steps] == [False, True, True, True, False]
    first, later = counter.steps[1], counter.steps[2]
    # the first step creates the optimizer's state (its step counts read back); later ones read them from the host
    assert first.sync_sites[("optimizer", "_local_scalar_dense")] > 0
    assert dict(later.sync_sites) == {("after", "_local_scalar_dense"): 1}
    assert all(later.counts[phase]["dispatched"] > 0 for phase in ("data", "forward", "backward", "optimizer"))
    assert steady(counter.steps[1:], 0) == counter.steps[2:4]  # after the optimizer's first step
    assert per_step(counter.steps[2:])["total"]["syncs"] == 1


@pytest.mark.slow
def test_the_narrowed_proxy_dispatches_the_full_models_ops() -> None:
    """--count-ops' default divides every width of ViT-B-32-quickgelu by 16: the same ops per step as the full
    model, for the project's static-shape step (forward, backward, fused AdamW) and open_clip's own model + loss."""
    from compo.batches import cut_token_width
    from compo.losses import TOTAL, get_loss
    from compo.models import create_model, get_tokenizer, open_clip, set_static_shapes, text_width_multiple
    from compo.train import build_optimizer

    bench = _bench()
    counts = {}
    tokens = get_tokenizer("ViT-B-32-quickgelu")(["a red circle left of a blue square", "a tree"])
    for narrow in (1, 16):
        name, _ = bench.narrowed_config("ViT-B-32-quickgelu", narrow)
        model = set_static_shapes(create_model(name, "scratch", 0), True).train()
        batch = {"images": torch.randn(2, 3, 224, 224), "texts": tokens.clone()}
        cut_token_width(batch, text_width_multiple(model))
        loss = get_loss("infonce").build({})
        optimizer = build_optimizer(model.named_parameters(), {"lr": 1e-4, "weight_decay": 0.1}, fused=True)
        open_clip_loss = open_clip().ClipLoss()
        with OpCounter(proxy=True) as counter:
            with torch.autocast("cpu", dtype=torch.float16):
                total = loss(model, batch)[TOTAL]
            total.backward()
            optimizer.step()
            optimizer.step()  # the second: with its state
            with torch.autocast("cpu", dtype=torch.float16):
                image, text, scale = model.forward(batch["images"], tokens)[:3]  # open_clip's own (77 tokens)
                open_clip_loss(image, text, scale).backward()
        counts[narrow] = {phase: dict(c) for phase, c in counter.steps[0].counts.items()}
    assert counts[1] == counts[16]
