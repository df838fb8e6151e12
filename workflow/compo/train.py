"""The one trainer: pretraining a base and fine-tuning every method run through `train`.

A method differs from another only by its loss module (`compo.losses`), what its batches carry
(`compo.batches`) and which parameters train (the loss's `trainable_parameters`); the loop, optimizer,
schedule, logging, checkpointing and resuming are shared.

Outputs in `out_dir`: `checkpoint.pt` + `model.json` (plain open_clip loads them), `config.yaml` (the
resolved recipe, seed, settings, inputs, versions) and `losses.csv` (one row per step). While running,
`_resume/state.pt` holds a resumable state every `checkpoint_every` steps; a rerun continues from it and
gives the same weights and losses as an uninterrupted run.

Under `torchrun --nproc_per_node N` the same entry trains data-parallel (`compo.distributed`): rank r
takes its slice of each global batch of `train.batch_size` captions, the losses gather features over
the ranks, gradients are averaged, and N ranks give the weights and losses of one process. Only rank 0
writes outputs; the resume state does not depend on N.
"""

from __future__ import annotations

import csv
import importlib.metadata
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from tqdm import tqdm

from compo import distributed
from compo.adapt import adapt_model, export_model
from compo.batches import TrainingData, epoch_order
from compo.io import atomic_path
from compo.layout import CONFIG_YAML, LOSSES_CSV
from compo.losses import TOTAL, TrainingLoss, get_loss
from compo.models import create_model, get_tokenizer, image_transform, load_model, save_checkpoint

log = logging.getLogger(__name__)

RESUME_DIR = "_resume"
RESUME_STATE = "state.pt"
MAX_LOGIT_SCALE = math.log(100)  # open_clip clamps the learned temperature to 1/100 after each step


class TrainingError(RuntimeError):
    """Training cannot go on (bad recipe, diverged loss, incompatible resume state)."""


def is_base_recipe(recipe: dict[str, Any]) -> bool:
    """A base recipe (`bases.<name>`) names a model and its init; a method recipe names a base."""
    return "model" in recipe and "init" in recipe


def cosine_lr(step: int, base_lr: float, warmup: int, steps: int) -> float:
    """open_clip's schedule: linear warmup over `warmup` steps, then cosine decay to 0 at `steps`."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * progress)) * base_lr


def _no_weight_decay(name: str, parameter: nn.Parameter) -> bool:
    # As open_clip: gains, biases and the logit scale are not decayed; embeddings neither (the recipe).
    return parameter.ndim < 2 or "bias" in name or "logit_scale" in name or "embedding" in name


def build_optimizer(named: Iterator[tuple[str, nn.Parameter]], hp: dict[str, Any]) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for name, parameter in named:
        (no_decay if _no_weight_decay(name, parameter) else decay).append(parameter)
    return torch.optim.AdamW(
        [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": hp["weight_decay"]}],
        lr=hp["lr"],
        betas=(hp.get("beta1", 0.9), hp.get("beta2", 0.98)),
        eps=hp.get("eps", 1e-6),
    )


def _versions() -> dict[str, str]:
    versions = {"torch": str(torch.__version__)}  # TorchVersion is a str subclass yaml refuses
    for package in ("compo-study", "open_clip_torch"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return versions


def _write_losses(rows: list[dict[str, float]], path: Path) -> None:
    columns: list[str] = ["step", "epoch", "lr"]
    for row in rows:
        columns += [c for c in row if c not in columns and c not in (TOTAL, "seconds")]
    columns += [TOTAL, "seconds"]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _save_resume(path: Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def _start_model(recipe: dict[str, Any], seed: int, init_dir: str | None) -> tuple[nn.Module, str]:
    if is_base_recipe(recipe):
        return create_model(recipe["model"], recipe["init"], seed), recipe["model"]
    if init_dir is None:
        raise TrainingError(f"method {recipe.get('name')!r} needs init_dir (its base's model directory)")
    loaded = load_model(init_dir)
    return loaded.model, loaded.model_name


def train(
    recipe: dict[str, Any],
    manifest: str | None,
    out_dir: str,
    seed: int,
    negatives: str | None = None,
    init_dir: str | None = None,
    settings: dict[str, Any] | None = None,
    *,
    parse: str | None = None,
    concreteness: str | None = None,
    on_step: Callable[[int], None] | None = None,
) -> None:
    """Train `recipe` (a base or a resolved method recipe) and write the model directory `out_dir`.

    settings: the config's `train:` section (threads, checkpoint_every, log_every).
    on_step: called with the number of steps done after each step (and its resume checkpoint).
    Started by torchrun, it trains data-parallel over the ranks (see `compo.distributed`).
    """
    with distributed.process_group():
        _train(recipe, manifest, out_dir, seed, negatives, init_dir, settings, parse=parse,
               concreteness=concreteness, on_step=on_step)


def _train(
    recipe: dict[str, Any],
    manifest: str | None,
    out_dir: str,
    seed: int,
    negatives: str | None,
    init_dir: str | None,
    settings: dict[str, Any] | None,
    *,
    parse: str | None,
    concreteness: str | None,
    on_step: Callable[[int], None] | None,
) -> None:
    settings = dict(settings or {})
    out = Path(out_dir)
    hp = recipe["train"]
    steps = int(hp["steps"])
    if "threads" in settings:
        torch.set_num_threads(int(settings["threads"]))
    model, model_name = _start_model(recipe, seed, init_dir)
    model, model_name = adapt_model(model, model_name, recipe, seed=seed)
    config = {
        "recipe": recipe,
        "seed": seed,
        "settings": settings,
        "inputs": {"manifest": manifest, "negatives": negatives, "init_dir": init_dir, "parse": parse,
                   "concreteness": concreteness},
        "model_name": model_name,
        "versions": _versions(),
    }
    rows: list[dict[str, float]] = []
    if steps > 0:
        rows = _run(recipe, model, model_name, manifest, out, seed, negatives, settings, config, on_step,
                    parse=parse, concreteness=concreteness)
    else:
        log.info("steps = 0: exporting the initial model %s unchanged", model_name)
    if not distributed.is_main():
        return
    with atomic_path(out / CONFIG_YAML) as tmp:
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    _write_losses(rows, out / LOSSES_CSV)
    model, model_name = export_model(model, model_name, recipe)
    save_checkpoint(model, model_name, out)
    shutil.rmtree(out / RESUME_DIR, ignore_errors=True)


def _run(
    recipe: dict[str, Any],
    model: nn.Module,
    model_name: str,
    manifest: str | None,
    out: Path,
    seed: int,
    negatives: str | None,
    settings: dict[str, Any],
    config: dict[str, Any],
    on_step: Callable[[int], None] | None,
    parse: str | None = None,
    concreteness: str | None = None,
) -> list[dict[str, float]]:
    hp = recipe["train"]
    steps, batch_size = int(hp["steps"]), int(hp["batch_size"])
    if manifest is None:
        raise TrainingError(f"{recipe.get('name', recipe.get('model'))}: {steps} steps need a manifest")
    if batch_size % distributed.world_size():
        raise TrainingError(f"{recipe.get('name', recipe.get('model'))}: train.batch_size {batch_size} is "
                            f"not divisible by the {distributed.world_size()} ranks (GPUs) it is split over")
    spec = get_loss(recipe.get("loss", "infonce"))  # a base is pretrained with plain InfoNCE
    loss_module: TrainingLoss = spec.build(recipe)
    data = TrainingData(manifest, get_tokenizer(model_name), image_transform(model), spec.needs,
                        negatives=negatives, k=recipe.get("k"), recipe=recipe, seed=seed, parse=parse,
                        concreteness=concreteness)
    steps_per_epoch = len(data) // batch_size  # the last partial batch of an epoch is dropped, as open_clip
    if steps_per_epoch == 0:
        raise TrainingError(f"{manifest}: {len(data)} captions, fewer than one batch of {batch_size}")

    torch.manual_seed(seed)
    # The paper study's clusters train on GPUs; the embedded default on CPU (bit-exact resume holds there).
    device = distributed.device()
    model.to(device)
    distributed.broadcast_module(model)  # the ranks start from rank 0's weights (before a teacher copy)
    loss_module.setup(model)
    optimizer = build_optimizer(loss_module.trainable_parameters(model), hp)
    trained = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    checkpoint_every = settings.get("checkpoint_every")
    log_every = int(settings.get("log_every", 1))
    resume_path = out / RESUME_DIR / RESUME_STATE
    # What must match for a saved state to be continued (inputs and recipe, not the machine settings).
    identity = {"recipe": recipe, "seed": seed, "inputs": config["inputs"]}
    rows: list[dict[str, float]] = []
    start = 0
    if resume_path.exists():
        state = torch.load(resume_path, map_location="cpu", weights_only=True)
        if state["identity"] != identity:
            raise TrainingError(f"{resume_path}: saved by a different run (recipe, seed or inputs); delete "
                                f"{resume_path.parent} to start over")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loss_module.load_state_dict(state["loss_module"])
        torch.set_rng_state(state["rng"])
        rows, start = state["rows"], state["step"]
        log.info("resuming %s from step %d", resume_path, start)

    model.train()
    order_epoch, order = -1, torch.empty(0, dtype=torch.long)
    progress = tqdm(range(start, steps), initial=start, total=steps, desc=f"train {out.name}", mininterval=1,
                    disable=not distributed.is_main())
    for step in progress:
        began = time.perf_counter()
        epoch, position = divmod(step, steps_per_epoch)
        if epoch != order_epoch:
            order_epoch, order = epoch, epoch_order(len(data), seed, epoch)
        indices = distributed.local_rows(order[position * batch_size : (position + 1) * batch_size].tolist())
        batch = {name: tensor.to(device) for name, tensor in data.batch(indices, step).items()}
        lr = cosine_lr(step, hp["lr"], int(hp["warmup"]), steps)
        for group in optimizer.param_groups:
            group["lr"] = lr

        terms = loss_module(model, batch)
        total = terms[TOTAL]
        if not torch.isfinite(total):
            values = ", ".join(f"{name}={value.item():.4g}" for name, value in terms.items())
            raise TrainingError(f"step {step + 1}: loss is not finite ({values})")
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        distributed.average_gradients(trained)  # every rank's loss is the global one: see compo.distributed
        if hp.get("grad_clip"):
            nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
        loss_module.after_optimizer_step(model)

        row = {"step": step + 1, "epoch": epoch, "lr": lr}
        row.update({name: value.item() for name, value in terms.items()})
        row["seconds"] = time.perf_counter() - began
        rows.append(row)
        progress.set_postfix(loss=f"{row[TOTAL]:.4f}")
        if (step + 1) % log_every == 0 and distributed.is_main():
            log.info("step %d/%d epoch %d lr %.3g %s", step + 1, steps, epoch, lr,
                     " ".join(f"{k}={v:.4f}" for k, v in row.items() if k not in ("step", "epoch", "lr")))
        resume_due = checkpoint_every and (step + 1) % int(checkpoint_every) == 0 and step + 1 < steps
        if resume_due and distributed.is_main():
            _save_resume(resume_path, {
                "identity": identity, "step": step + 1, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "loss_module": loss_module.state_dict(),
                "rng": torch.get_rng_state(), "rows": rows,
            })
        if on_step is not None:
            on_step(step + 1)
    progress.close()
    model.to("cpu").eval()  # exported checkpoints load on any machine
    return rows
