"""The one trainer: pretraining a base and fine-tuning every method run through `train`.

A method differs from another only by its loss module (`compo.losses`), what its batches carry
(`compo.batches`) and which parameters train (the loss's `trainable_parameters`); the loop, optimizer,
schedule, precision, logging, checkpointing and resuming are shared. A run goes through named steps on
one `Run` (its state): `build` (model, loss, optimizer, data), `resume`, then per step `take_step`,
`record` (losses.csv row, log line) and `save_resume_state`, and finally `export`.

Outputs in `out_dir`, written whole or not at all (a temporary folder moved into place last, so a run
that dies, e.g. on a full disk, leaves no model folder): `checkpoint.pt` + `model.json` (plain open_clip
loads them), `config.yaml` (the resolved recipe, seed, settings, inputs and their hashes, versions),
`losses.csv` (one row per step: loss terms only, so the same seed and inputs give the same bytes, as
they give the same `checkpoint.pt`) and `timings.csv` (per step: seconds waiting for data, seconds in
all). While running, `.<out_dir name>.resume/state.pt` next to `out_dir` holds a resumable state every
`checkpoint_every` steps; a rerun continues from it and gives the same weights and losses as an
uninterrupted run. The state records the recipe, seed, precision, the sha256 of every input file and the
package's code hash (compo.provenance); a state saved for other inputs (a manifest changed at the same path,
another base) is set aside with a log line saying what differs, and the run starts over; one saved under other
code is refused, naming the files that changed. A state that cannot be read (a damaged file) is
moved to `.<out_dir name>.resume.unreadable-<time>` with a log line naming it, and the run starts over.

With the recipe's `train.val_every` the run validates as it goes (`compo.validation`: recall on images held out
of the training data by `train.val_holdout`, a configured benchmark's headline), rows in the live folder's
`validation.csv`; it changes neither the weights nor losses.csv.

Under `torchrun --nproc_per_node N` the same entry trains data-parallel (`compo.distributed`): rank r
takes its slice of each global batch of `train.batch_size` captions, the losses gather features over
the ranks, gradients are averaged, and N ranks give the weights and losses of one process. Only rank 0
writes outputs; the resume state does not depend on N.

With the recipe's `train.accum_freq` M > 1 a step's batch (each rank's slice) comes as M micro-batches and
the loss is still the full batch's (`compo.accumulate`): the same step up to float rounding, with one
micro-batch's activations held at a time. The recipe's `train.grad_checkpointing` turns on the towers'
gradient checkpointing as the machine setting does.

Machine settings (the config's `train:` section, `Settings`): threads (the job's CPUs, which torchrun's ranks
split: `compo.devices.rank_cpus`), checkpoint_every, log_every,
device (auto | cpu | cuda), precision (fp32 | amp | amp_bf16, as open_clip's `--precision`; a recipe's own
`train.precision` wins: C2LIP's released script runs bf16),
grad_checkpointing, channels_last (the convolution weights' memory layout), workers (DataLoader
processes; default: a rank's CPUs but the one feeding its GPU), local_loss and gather_with_grad (open_clip's
choices for the contrastive loss under torchrun), shapes (auto | dynamic | static: how the text tower and the losses
shape their tensors, `compo.models.set_static_shapes`) and compile (torch.compile of the loss and model).

A step reads values back from the device once, at its end: the loss terms (losses.csv's row, in one
transfer), whose total is then checked to be finite. On a GPU with static shapes nothing else waits for
the device mid-step (no length, mask count or loss check read back), and AdamW runs fused, so the host
queues the whole step ahead of the GPU.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib.metadata
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.profiler import record_function

from compo import distributed, shards
from compo.accumulate import accumulated_step
from compo.adapt import adapt_model, export_model
from compo.batches import TrainingData, batch_loader
from compo.devices import (
    autocast,
    check_precision,
    check_shapes,
    data_workers,
    fused_optimizer,
    grad_scaler,
    rank_cpus,
    set_threads,
    static_shapes,
    training_precision,
)
from compo.images import image_size
from compo.io import atomic_folder, read_table, write_text
from compo.layout import BASE_PREFIX, CONFIG_YAML, LOSSES_CSV, MODEL_JSON, TIMINGS_CSV, parse_model_id
from compo.losses import TOTAL, TrainingLoss, get_loss, needs_of
from compo.models import (
    CheckpointError,
    LoadedModel,
    create_base,
    get_tokenizer,
    image_transform,
    load_model,
    load_state,
    save_checkpoint,
    save_state,
    set_static_shapes,
    text_width_multiple,
)
from compo.monitor import Monitor, check_report_to, loss_columns
from compo.paths import private_dir
from compo.progress import progress
from compo.provenance import changed_code_files, code_files, code_sha256, file_sha256, package_version
from compo.validation import ValBenchmark, Validator, holdout_images, val_every

log = logging.getLogger(__name__)

RESUME_STATE = "state.pt"
RESUME_HASH = "state.sha256"  # the sha256 of state.pt when it was saved
NEXT = ".next"  # a resume state (and its hash) being saved, before it is renamed into place
RESUME_KEYS = {"identity", "step", "model", "optimizer", "loss_module", "scaler", "rng", "rows", "timings"}
MAX_LOGIT_SCALE = math.log(100)  # open_clip clamps the learned temperature to 1/100 after each step
# Decoded, transformed training images kept in memory, over all processes of a run (DataLoader workers
# each keep their share): the embedded study's 64 px images need 49 KB each, 1,500-4,000 per dataset.
IMAGE_CACHE_BYTES = 2 << 30
TIMING_COLUMNS = ["step", "data_seconds", "seconds"]


class TrainingError(RuntimeError):
    """Training cannot go on (bad recipe, diverged loss, batch that does not split over the ranks)."""


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


def build_optimizer(named: Iterator[tuple[str, nn.Parameter]], hp: dict[str, Any],
                    fused: bool = False) -> torch.optim.AdamW:
    """AdamW over two groups (decayed or not). Its multi-tensor (foreach) update is the per-parameter
    update, bit for bit, in a few calls instead of ten per parameter: torch picks it only on GPUs.
    fused: one kernel per group instead (`compo.devices.fused_optimizer`: on a GPU), the same update up to
    float rounding, which also takes the loss scaler's inf check without reading it back to the host."""
    decay, no_decay = [], []
    for name, parameter in named:
        (no_decay if _no_weight_decay(name, parameter) else decay).append(parameter)
    return torch.optim.AdamW(
        [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": hp["weight_decay"]}],
        lr=hp["lr"],
        betas=(hp.get("beta1", 0.9), hp.get("beta2", 0.98)),
        eps=hp.get("eps", 1e-6),
        foreach=None if fused else True,
        fused=True if fused else None,
    )


# --- what a run reads and how it runs ------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """The files a run reads (None: not used). Their contents identify a resumable state."""

    manifest: str | None = None
    negatives: str | None = None
    init_dir: str | None = None
    parse: str | None = None
    concreteness: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Settings:
    """The config's `train:` section: how a run uses the machine (config/README.md documents each key)."""

    threads: int | None = None
    checkpoint_every: int | None = None
    log_every: int = 1
    device: str = "auto"
    precision: str = "fp32"
    grad_checkpointing: bool = False
    channels_last: bool = True          # convolution weights in NHWC layout (oneDNN's and cuDNN's fast path)
    workers: int | None = None          # DataLoader processes; None: from threads (compo.devices)
    local_loss: bool = False
    gather_with_grad: bool = True
    shapes: str = "auto"                # auto | dynamic | static (compo.devices.static_shapes)
    compile: bool = False               # torch.compile the loss with the model it calls
    report_to: tuple[str, ...] = ("tensorboard",)  # live metrics besides losses.csv (compo.monitor)
    stage_shards: bool = False          # copy the manifest's tar shards to $TMPDIR at start (compo.shards)

    @classmethod
    def from_config(cls, section: dict[str, Any] | None) -> Settings:
        section = dict(section or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise TrainingError(f"config key train.{unknown[0]}: unknown setting (known: {', '.join(sorted(known))})")
        if "report_to" in section:
            check_report_to(section["report_to"])
            section["report_to"] = tuple(section["report_to"])
        settings = cls(**section)
        check_precision(settings.precision)
        check_shapes(settings.shapes)
        return settings


@dataclass
class Run:
    """One training run's state: what `build` made, and how far it got."""

    recipe: dict[str, Any]
    seed: int
    out: Path
    inputs: Inputs
    settings: Settings
    model: nn.Module
    model_name: str
    device: torch.device = torch.device("cpu")
    loss: TrainingLoss | None = None
    compute_loss: Callable[[nn.Module, dict], dict[str, torch.Tensor]] | None = None  # the loss, or compiled
    optimizer: torch.optim.Optimizer | None = None
    scaler: torch.amp.GradScaler | None = None
    data: TrainingData | None = None
    workers: int = 0                                       # DataLoader processes building batches
    trained: list[nn.Parameter] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)
    step: int = 0                                          # steps done
    rows: list[dict[str, float]] = field(default_factory=list)     # losses.csv
    timings: list[dict[str, float]] = field(default_factory=list)  # timings.csv
    monitor: Monitor | None = None                         # live metrics (main process, when a folder is given)
    validator: Validator | None = None                     # train.val_every (main process; compo.validation)
    validation: list[dict[str, float]] = field(default_factory=list)  # validation.csv

    @property
    def hp(self) -> dict[str, Any]:
        return self.recipe.get("train", {})  # a base exported from pretrained weights has none

    @property
    def steps(self) -> int:
        return int(self.hp.get("steps", 0))

    @property
    def accum_freq(self) -> int:
        """Micro-batches per step (recipe `train.accum_freq`, compo.accumulate)."""
        return int(self.hp.get("accum_freq", 1))

    @property
    def precision(self) -> str:
        """The recipe's `train.precision`, else the machine's (compo.devices.training_precision)."""
        return training_precision(self.recipe, self.settings.precision)

    @property
    def grad_checkpointing(self) -> bool:
        """The machine's `train.grad_checkpointing`, or the recipe's `train.grad_checkpointing` (a recipe that
        needs it to fit its GPU)."""
        return bool(self.settings.grad_checkpointing or self.hp.get("grad_checkpointing", False))

    @property
    def name(self) -> str:
        return str(self.recipe.get("name", self.recipe.get("model")))


# --- the entry point -------------------------------------------------------------------------------------


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
    live: str | None = None,
    val_benchmark: dict[str, Any] | None = None,
) -> None:
    """Train `recipe` (a base or a resolved method recipe) and write the model directory `out_dir`.

    settings: the config's `train:` section (see `Settings`).
    on_step: called with the number of steps done after each step (and its resume checkpoint).
    live: the folder of the run's live metrics (compo.monitor: losses.csv as it grows, TensorBoard, W&B).
    val_benchmark: the benchmark the recipe's `train.val_benchmark` names ({"name", "spec", "dir",
    "templates"}, compo.validation.ValBenchmark).
    Started by torchrun, it trains data-parallel over the ranks (see `compo.distributed`).
    """
    machine = Settings.from_config(settings)
    inputs = Inputs(manifest, negatives, init_dir, parse, concreteness)
    device = distributed.device(machine.device)
    with distributed.process_group(device), distributed.loss_options(machine.local_loss, machine.gather_with_grad):
        # torchrun's ranks share the job's CPUs: each computes with its share (no threads given: torch's default)
        set_threads(None if machine.threads is None else rank_cpus(machine.threads, distributed.world_size()))
        stage_dir = open_stage_dir(Path(out_dir), machine, inputs)
        try:
            run = build(recipe, seed, Path(out_dir), inputs, machine, device, stage_dir)
            if run.steps > 0:
                resume(run)
                if distributed.is_main():
                    run.validator = build_validator(run, val_benchmark)
                if live is not None and distributed.is_main():
                    run.monitor = Monitor(live, machine.report_to, name=f"{run.name} {Path(out_dir).name}",
                                          config={"recipe": recipe, "seed": seed}, rows=run.rows,
                                          validation=run.validation if run.validator is not None else None)
                try:
                    train_steps(run, on_step)
                finally:
                    if run.monitor is not None:
                        run.monitor.close()
            else:
                log.info("steps = 0: exporting the initial model %s unchanged", run.model_name)
            if distributed.is_main():
                export(run, settings or {})
            distributed.barrier()  # every rank has read its last staged image
        finally:
            # the job's staged copies go when it ends, trained or failed (one node: rank 0 is the node's); a killed
            # job's are swept by a later job (compo.shards.STALE_DAYS)
            if stage_dir is not None and distributed.is_main():
                shards.remove_stage_folder(stage_dir)


def train_steps(run: Run, on_step: Callable[[int], None] | None = None) -> None:
    """The steps from `run.step` to the recipe's last, each recorded and checkpointed when due."""
    batches = iter(batch_loader(run.data, int(run.hp["batch_size"]), run.seed, run.step, run.steps, run.workers,
                                pin_memory=run.device.type == "cuda", parts=run.accum_freq))
    bar = progress(None, total=run.steps, initial=run.step, desc=f"train {run.out.name}", unit="step",
                   disable=not distributed.is_main())
    run.model.train()
    while run.step < run.steps:
        began = time.perf_counter()
        with record_function("data"):
            step, micro_batches = next(batches)
        loaded = time.perf_counter()
        row = take_step(run, step, micro_batches)
        record(run, row, data_seconds=loaded - began, seconds=time.perf_counter() - began)
        if run.validator is not None and run.validator.due(run.step, run.steps):  # before the state saves it
            validate(run, row["epoch"])
        bar.update()
        bar.set_postfix(loss=f"{row[TOTAL]:.4f}", refresh=False)
        every = run.settings.checkpoint_every
        if every and run.step % int(every) == 0 and run.step < run.steps and distributed.is_main():
            save_resume_state(run)
        if on_step is not None:
            on_step(run.step)
    bar.close()
    run.model.to("cpu").eval()  # exported checkpoints load on any machine


# --- build -----------------------------------------------------------------------------------------------


def build(recipe: dict[str, Any], seed: int, out: Path, inputs: Inputs, settings: Settings,
          device: torch.device, stage_dir: Path | None = None) -> Run:
    """The run's model (adapted to the recipe) and, when it trains, its loss, optimizer and data (`stage_dir`: the
    job's node-local folder, `open_stage_dir`'s when not given; `train` removes it when the job ends)."""
    model, model_name = _start_model(recipe, seed, inputs.init_dir, out)
    model, model_name = adapt_model(model, model_name, recipe, seed=seed)
    set_static_shapes(model, static_shapes(settings.shapes, device))
    run = Run(recipe, seed, out, inputs, settings, model, model_name, device)
    if run.steps == 0:
        return run
    batch_size = int(run.hp["batch_size"])
    if inputs.manifest is None:
        raise TrainingError(f"{run.name}: {run.steps} steps need a manifest")
    if batch_size % distributed.world_size():
        raise TrainingError(f"{run.name}: train.batch_size {batch_size} is not divisible by the "
                            f"{distributed.world_size()} ranks (GPUs) it is split over")
    if run.accum_freq < 1 or batch_size % (distributed.world_size() * run.accum_freq):
        raise TrainingError(f"{run.name}: train.batch_size {batch_size} does not split into train.accum_freq "
                            f"{run.accum_freq} equal micro-batches on each of {distributed.world_size()} ranks "
                            "(GPUs); choose a batch size divisible by accum_freq x GPUs")
    spec = get_loss(recipe.get("loss", "infonce"))  # a base is pretrained with plain InfoNCE
    run.loss = spec.build(recipe)
    cpus = rank_cpus(settings.threads, distributed.world_size())
    run.workers = settings.workers if settings.workers is not None else data_workers(cpus, device)
    if distributed.is_main():
        log.info("%d CPUs a rank (%d ranks): %d image-decoding workers each", cpus, distributed.world_size(),
                 run.workers)
    stage_dir = stage_dir or open_stage_dir(out, settings, inputs)
    run.data = TrainingData(inputs.manifest, get_tokenizer(model_name), image_transform(model), needs_of(recipe),
                            negatives=inputs.negatives, k=recipe.get("k"), recipe=recipe, seed=seed,
                            parse=inputs.parse, concreteness=inputs.concreteness,
                            cache_bytes=IMAGE_CACHE_BYTES // (1 + run.workers),
                            text_width_multiple=text_width_multiple(model),
                            stage_dir=stage_dir if settings.stage_shards else None,
                            holdout=int(run.hp.get("val_holdout", 0)),
                            # the ranks' memory-mapped copies of the parse table: one a node, shared
                            tables_dir=stage_dir / "tables" if stage_dir and (inputs.parse or inputs.concreteness)
                            else None)
    if len(run.data) // batch_size == 0:  # the last partial batch of an epoch is dropped, as open_clip
        raise TrainingError(f"{inputs.manifest}: {len(run.data)} captions, fewer than one batch of {batch_size}")

    torch.manual_seed(seed)
    model.to(device)
    if settings.channels_last:  # convolutions (ResNet towers, a ViT's patch embedding) pick their NHWC kernels
        model.to(memory_format=torch.channels_last)
    distributed.broadcast_module(model)  # the ranks start from rank 0's weights (before a teacher copy)
    find_image_neighbours(run.data, model, recipe, device, run.workers)
    if run.grad_checkpointing:
        model.set_grad_checkpointing(True)
    run.loss.setup(model)
    run.compute_loss = torch.compile(run.loss) if settings.compile else run.loss
    run.optimizer = build_optimizer(run.loss.trainable_parameters(model), run.hp, fused=fused_optimizer(device))
    run.scaler = grad_scaler(device, run.precision)
    run.trained = [parameter for group in run.optimizer.param_groups for parameter in group["params"]]
    # What must match for a saved state to be continued: the recipe, seed, precision and input contents
    # (not the machine settings: threads, device, workers, checkpointing do not change what is learned).
    run.identity = {"recipe": recipe, "seed": seed, "precision": run.precision,
                    "inputs": input_hashes(inputs), "code": code_sha256()}
    return run


def shard_stage_dir(out: str | Path) -> Path:
    """Where `train.stage_shards` copies a job's tar shards: a folder of this user's and this job's only (each level
    mode 0700: with TMPDIR unset it was /tmp/compo-shards, shared by every user of the node and every job, so a file
    planted there was trained on) under node-local $TMPDIR (SLURM sets it per job on most clusters), else the
    system's. The job: SLURM's job id (its ranks share the copies), else the run's output folder `out` (a rerun
    finds its copies). A copy is trusted only when it matches the size and sha256 its manifest records
    (`compo.shards.stage`). Its `tables/` holds the memory-mapped copies of the parse table the ranks share
    (`compo.caption_rows`)."""
    job = os.environ.get("SLURM_JOB_ID")
    job = f"slurm-{job}" if job and job.isascii() and job.isdigit() else \
        "run-" + hashlib.sha256(str(Path(out).resolve()).encode()).hexdigest()[:16]
    user = private_dir(Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / f"compo-shards-{os.getuid()}")
    return private_dir(user / job)


def open_stage_dir(out: Path, settings: Settings, inputs: Inputs) -> Path | None:
    """The job's node-local folder (`shard_stage_dir`) when it stages shards or the parse tables' copies, touched (in
    use: the sweep spares it) after this user's folders of killed jobs are swept (`shards.sweep_stale_folders`);
    None when the job stages nothing. `train` removes it when the job ends."""
    if not (settings.stage_shards or inputs.parse or inputs.concreteness):
        return None
    folder = shard_stage_dir(out)
    os.utime(folder)
    if distributed.is_main():
        shards.sweep_stale_folders(folder.parent, keep=folder)
    return folder


def find_image_neighbours(data: TrainingData, model: nn.Module, recipe: dict[str, Any],
                          device: torch.device | None = None, workers: int = 0) -> None:
    """When the recipe asks for NegCLIP's nearest images (`hard_images: N`), find them with `model`, the
    model the run starts from (in eval mode: its BatchNorm statistics, not a batch's), `workers` processes
    decoding the images; else nothing."""
    n = recipe.get("hard_images")
    if not isinstance(n, int):
        return
    started, training = time.perf_counter(), model.training
    model.eval()
    data.find_image_neighbours(lambda images: model.encode_image(images.to(device or images.device)), n,
                               workers=workers)
    model.train(training)
    log.info("hard_images: the %d nearest of each of %d images found in %.1f s", n, len(data.image_neighbours),
             time.perf_counter() - started)


def _start_model(recipe: dict[str, Any], seed: int, init_dir: str | None, out: Path) -> tuple[nn.Module, str]:
    if is_base_recipe(recipe):
        # the base's config name, for errors: the workflow writes a base to models/base-<name>/<tag>/seed<s>
        parsed = parse_model_id("/".join(Path(out).parts[-3:]))
        name = parsed.method.removeprefix(BASE_PREFIX) if parsed and parsed.method.startswith(BASE_PREFIX) else None
        return create_base(recipe, seed, name)
    if init_dir is None:
        raise TrainingError(f"method {recipe.get('name')!r} needs init_dir (its base's model directory)")
    loaded = load_model(init_dir)
    return loaded.model, loaded.model_name


def input_hashes(inputs: Inputs) -> dict[str, str | None]:
    """sha256 of every input file's contents (a model directory: its model.json, which records its checkpoint's
    sha256, checked when the model loads: the checkpoint is hashed once). The manifest's images are
    identified by path and size: hashing a real dataset's images at every start would take minutes."""
    hashes: dict[str, str | None] = {}
    for name, path in inputs.as_dict().items():
        if path is None:
            hashes[name] = None
        elif name == "init_dir":
            hashes[name] = file_sha256(Path(path) / MODEL_JSON)
        else:
            hashes[name] = file_sha256(path)
    if inputs.manifest is not None:
        images = read_table(inputs.manifest, "manifest")["image_path"].drop_duplicates()
        listing = "\n".join(f"{p}\t{image_size(p)}" for p in images)
        hashes["images"] = hashlib.sha256(listing.encode()).hexdigest()
    return hashes


def build_validator(run: Run, benchmark: dict[str, Any] | None) -> Validator | None:
    """The run's validation (recipe `train.val_every`), scoring `run.model` as it trains; None when off."""
    every = val_every(run.hp, len(run.data) // int(run.hp["batch_size"]))
    if not every:
        return None
    wanted = run.hp.get("val_benchmark")
    if wanted and (benchmark is None or benchmark.get("name") != wanted):
        raise TrainingError(f"{run.name}: recipe key train.val_benchmark names {wanted!r}, but the run was given "
                            f"{'no benchmark' if benchmark is None else repr(benchmark.get('name'))} (--val-benchmark)")
    loaded = LoadedModel(run.model, run.model_name, get_tokenizer(run.model_name), image_transform(run.model),
                         run.device, run.precision, workers=run.workers)
    return Validator(every, loaded, holdout_images(run.data.held_out),
                     ValBenchmark.from_arg(benchmark) if wanted else None, f"{run.inputs.manifest} (held out)")


def validate(run: Run, epoch: int) -> None:
    """Score the model now (compo.validation) and keep the row (validation.csv, the monitor's `val/`)."""
    row = run.validator(run.step, epoch)
    run.validation.append(row)
    if run.monitor is not None:
        run.monitor.log_validation(row, run.validation)


# --- resume ----------------------------------------------------------------------------------------------


def resume_dir(out: Path) -> Path:
    """Where a run keeps its resumable state: next to its model folder, which exists only when complete."""
    return out.parent / f".{out.name}.resume"


def resume(run: Run) -> None:
    """Continue from the saved state of this run, if there is one; a state of another run (recipe, seed,
    precision or input contents differ) is set aside with a log line saying what differs."""
    path = resume_dir(run.out) / RESUME_STATE
    if not path.exists():
        return
    aside = path.parent.with_name(f"{path.parent.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        recorded = path.with_name(RESUME_HASH)
        saved_hash = recorded.read_text().strip() if recorded.exists() else None
        pending = path.with_name(f"{RESUME_HASH}{NEXT}")  # the hash of a save killed between its two renames
        actual = file_sha256(path)
        # read only: every rank checks, and the next save replaces both files
        if actual != saved_hash and not (pending.exists() and pending.read_text().strip() == actual):
            why = f"no {RESUME_HASH}" if saved_hash is None else f"{RESUME_HASH} records another"
            raise CheckpointError(f"{path}: its bytes are not those saved ({why}): damaged or replaced since; set "
                                  f"aside as {aside}; starting over from step 0")
        state = load_state(path, f"set aside as {aside}; starting over from step 0")
        missing = sorted(RESUME_KEYS - set(state)) if isinstance(state, dict) else sorted(RESUME_KEYS)
        if missing:
            raise CheckpointError(f"{path}: cannot be read as a resume state (no {', '.join(missing)}); set aside "
                                  f"as {aside}; starting over from step 0")
    except CheckpointError as error:  # a damaged state would fail every rerun: keep it for a look, start over
        log.warning("%s", error)
        distributed.barrier()  # every rank has tried it before rank 0 moves it
        if distributed.is_main():
            path.parent.rename(aside)
        return
    saved = state.get("identity", {})
    if saved.get("code") != run.identity["code"]:
        refuse_other_code(path, saved.get("code"), state.get("code_files"))
    if saved != run.identity:
        differs = sorted(key for key in set(saved) | set(run.identity) if saved.get(key) != run.identity.get(key))
        inputs = [name for name in run.identity["inputs"]
                  if saved.get("inputs", {}).get(name) != run.identity["inputs"][name]]
        what = ", ".join(f"inputs.{name}" for name in inputs) if differs == ["inputs"] else ", ".join(differs)
        log.warning("%s: saved by a run with other %s; starting over from step 0", path, what)
        distributed.barrier()  # every rank has read it before rank 0 removes it
        if distributed.is_main():
            shutil.rmtree(path.parent, ignore_errors=True)
        return
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.loss.load_state_dict(state["loss_module"])
    if run.scaler is not None and state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    run.rows, run.timings, run.step = state["rows"], state["timings"], state["step"]
    run.validation = state.get("validation", [])  # rows past the saved step are dropped with the state's step
    log.info("resuming %s from step %d", path, run.step)


def refuse_other_code(path: Path, saved: str | None, saved_files: dict[str, str] | None) -> None:
    """A resume state saved under other code (a changed loss, say) is not continued: the weights would mix
    what two versions of the code learned. TrainingError naming the files that changed and what to do."""
    changed = changed_code_files(saved_files)
    what = f"changed: {', '.join(changed[:10])}{' ...' if len(changed) > 10 else ''}" if changed else \
        "the files that changed were not recorded"
    raise TrainingError(f"{path}: saved under other code (compo code sha256 {saved or 'not recorded'}, now "
                        f"{code_sha256()} in compo {package_version()}; {what} under workflow/compo); restore "
                        f"that code to continue, or delete {path.parent} to start over under this code")


def save_resume_state(run: Run) -> None:
    store_resume_state({
        "code_files": code_files(),  # names what changed when a rerun runs other code (refuse_other_code)
        "identity": run.identity, "step": run.step, "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(), "loss_module": run.loss.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler is not None else {},
        "rng": torch.get_rng_state(), "rows": run.rows, "timings": run.timings,
        "validation": run.validation,
    }, run.out)


def store_resume_state(state: dict[str, Any], out: Path) -> None:
    """Save a resume state of the run writing `out`, with the sha256 of its bytes as written beside it: a state
    damaged later (a truncated copy, a flipped bit) is not resumed. The new state and its hash are written beside
    the old pair (`.next`) and then renamed into place, state first: a job killed at any point leaves a state.pt
    whose bytes one of the two hash files records (a kill between the renames had left a sound state that the
    old hash, or none on the first save, disowned: the requeued job started over)."""
    folder = resume_dir(out)
    state_next, hash_next = folder / f"{RESUME_STATE}{NEXT}", folder / f"{RESUME_HASH}{NEXT}"
    save_state(state, state_next)
    write_text(file_sha256(state_next) + "\n", hash_next)
    os.replace(state_next, folder / RESUME_STATE)
    os.replace(hash_next, folder / RESUME_HASH)


# --- one step ----------------------------------------------------------------------------------------------


def take_step(run: Run, step: int, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """One optimizer step on the batch of step `step`, given as its `run.accum_freq` micro-batches; returns its
    losses.csv row."""
    hp, model, optimizer = run.hp, run.model, run.optimizer
    micro_batches = [{name: tensor.to(run.device, non_blocking=True) for name, tensor in batch.items()}
                     for batch in micro_batches]
    epoch = step // (len(run.data) // int(hp["batch_size"]))
    lr = cosine_lr(step, hp["lr"], int(hp["warmup"]), run.steps)
    for group in optimizer.param_groups:
        group["lr"] = lr


    def forward(micro_batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with record_function("forward"), autocast(run.device, run.precision):
            return run.compute_loss(model, micro_batch)

    def backward(loss: torch.Tensor) -> None:
        with record_function("backward"):
            (run.scaler.scale(loss) if run.scaler is not None else loss).backward()

    optimizer.zero_grad(set_to_none=True)
    # one micro-batch: forward, backward; more (train.accum_freq): the full batch's loss, micro-batch by
    # micro-batch (compo.accumulate), the gradients summed before the one optimizer step
    terms = accumulated_step(forward, micro_batches, model, backward, TOTAL)
    with record_function("optimizer"):
        distributed.average_gradients(run.trained)  # every rank's loss is the global one: compo.distributed
        if run.scaler is not None:
            run.scaler.unscale_(optimizer)  # clip the true gradients
        if hp.get("grad_clip"):
            nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        if run.scaler is not None:
            run.scaler.step(optimizer)  # skipped when the scaled gradients overflowed
            run.scaler.update()
        else:
            optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
        run.loss.after_optimizer_step(model)
    values = host_values(distributed.mean_over_ranks(terms))  # the step's one read of device values
    if not math.isfinite(values[TOTAL]):  # before the step is recorded, checkpointed or counted as done
        raise TrainingError(f"step {step + 1}: loss is not finite "
                            f"({', '.join(f'{name}={value:.4g}' for name, value in values.items())})")
    run.step = step + 1
    return {"step": step + 1, "epoch": epoch, "lr": lr, **values}


def host_values(terms: dict[str, torch.Tensor]) -> dict[str, float]:
    """The terms as Python floats, read from the device in one transfer (float64: each value exactly)."""
    device = next(iter(terms.values())).device
    stacked = torch.stack([value.detach().to(device=device, dtype=torch.float64) for value in terms.values()])
    return dict(zip(terms, stacked.tolist(), strict=True))


def record(run: Run, row: dict[str, float], data_seconds: float, seconds: float) -> None:
    """Keep a step's losses.csv and timings.csv rows; log them every `log_every` steps."""
    run.rows.append(row)
    run.timings.append({"step": row["step"], "data_seconds": data_seconds, "seconds": seconds})
    if run.monitor is not None:
        run.monitor.log(row, {"samples_per_s": int(run.hp["batch_size"]) / max(seconds, 1e-9),
                              "data_seconds": data_seconds, "logit_scale": _logit_scale(run.model)}, run.rows)
    if row["step"] % int(run.settings.log_every) == 0 and distributed.is_main():
        if run.monitor is not None:
            run.monitor.flush()
        log.info("step %d/%d epoch %d lr %.3g %s seconds=%.3f (data %.3f)", row["step"], run.steps, row["epoch"],
                 row["lr"], " ".join(f"{k}={v:.4f}" for k, v in row.items() if k not in ("step", "epoch", "lr")),
                 seconds, data_seconds)


def _logit_scale(model: nn.Module) -> float:
    """The learned temperature's scale exp(t) (NaN for a model without one); one read per step, after the
    step's own end-of-step read, so it adds no wait mid-step."""
    scale = getattr(model, "logit_scale", None)
    return math.nan if scale is None else float(scale.detach().exp())


# --- export ------------------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    # compo-study: pyproject.toml's version and the sources' hash (compo.provenance), as model.json records them;
    # TorchVersion is a str subclass yaml refuses
    versions = {"torch": str(torch.__version__), "compo-study": package_version(), "compo_code_sha256": code_sha256()}
    try:
        versions["open_clip_torch"] = importlib.metadata.version("open_clip_torch")
    except importlib.metadata.PackageNotFoundError:
        versions["open_clip_torch"] = "unknown"
    return versions


def _write_rows(rows: list[dict[str, float]], columns: list[str], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def export(run: Run, settings: dict[str, Any]) -> None:
    """Write the model folder (whole, or not at all) and drop the resume state."""
    model, model_name = export_model(run.model, run.model_name, run.recipe)
    config = {
        "recipe": run.recipe,
        "seed": run.seed,
        "settings": settings,
        "inputs": run.inputs.as_dict(),
        "input_sha256": run.identity.get("inputs") or input_hashes(run.inputs),
        "model_name": model_name,
        "versions": _versions(),
    }
    if run.data is not None and len(run.data.held_out):  # recipe train.val_holdout: what training never saw
        config["holdout"] = {"images": int(run.data.held_out["image_path"].nunique()),
                             "captions": len(run.data.held_out), "training_captions": len(run.data)}
    try:
        with atomic_folder(run.out) as folder:
            save_checkpoint(model, model_name, folder)
            (folder / CONFIG_YAML).write_text(yaml.safe_dump(config, sort_keys=False))
            _write_rows(run.rows, loss_columns(run.rows), folder / LOSSES_CSV)
            _write_rows(run.timings, TIMING_COLUMNS, folder / TIMINGS_CSV)
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
        needed = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        free = shutil.disk_usage(run.out.parent).free
        raise TrainingError(f"{run.out}: the model folder could not be written ({error}); the checkpoint "
                            f"needs {needed / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are free on that file "
                            "system: free space there or set `results` to a larger disk. Nothing was left "
                            "behind; the resume state (if any) is kept") from error
    shutil.rmtree(resume_dir(run.out), ignore_errors=True)
