"""Validation during training (open_clip_train's `--val-frequency` / `--zeroshot-frequency`), from the recipe's
`train.val_every` (steps, or `epoch`; 0 or absent: off), `train.val_holdout` and `train.val_benchmark`.

Every `val_every` steps (and after the last) the model being trained is scored, in eval mode without gradients,
by the evaluation's own scorers (no second implementation): image-text recall R@1/R@5 both ways on the held-out
images (`compo.evaluate.retrieval.score`) and the headline metric of one configured benchmark
(`compo.evaluate.run_benchmark`: a zero-shot set's top-1, its class prompts embedded once per validation; or,
as FSC-CLIP's released code validates every epoch, SugarCrepe's accuracy), in column `<benchmark>_<metric>`.
A row per validation goes to `validation.csv` in the run's live folder and to the monitor (TensorBoard `val/...`,
W&B).

The holdout: `val_holdout` N distinct images of the manifest, drawn by the run's seed alone (not the epoch
orders' stream), are taken out of the training data with every caption of theirs, so no batch holds a held-out
image or caption (a held-out caption whose image another caption trains on would inflate recall).

Validation leaves the training trajectory as it was: the torch random state is forked around it (its DataLoader
draws a base seed) and every module's train/eval mode is restored, so with the same holdout the checkpoint and
losses are those of a run without validation. Under torchrun only rank 0 validates (the other ranks wait in the
next step's gradient all-reduce); the model's weights are the same on every rank, so its scores are the run's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from compo.evaluate import retrieval, run_benchmark
from compo.evaluate.retrieval import RetrievalImage
from compo.models import LoadedModel

log = logging.getLogger(__name__)

VALIDATION_CSV = "validation.csv"
HOLDOUT_STREAM = 44  # SeedSequence([seed, HOLDOUT_STREAM]): apart from epoch_order's SeedSequence([seed, epoch])
RETRIEVAL_COLUMNS = ("i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5")
COLUMNS = ("step", "epoch", *RETRIEVAL_COLUMNS)  # then the benchmark's `<name>_<headline metric>`


class ValidationError(ValueError):
    """The validation settings of a recipe cannot be used; the message names the key."""


def val_every(hp: dict[str, Any], steps_per_epoch: int) -> int:
    """The recipe's `train.val_every` in steps (`epoch`: the steps of one epoch); 0 when off."""
    every = hp.get("val_every") or 0
    if every == "epoch":
        return steps_per_epoch
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValidationError(f"recipe key train.val_every: {every!r} should be a number of steps (0: off) or 'epoch'")
    return every


def split_holdout(rows: pd.DataFrame, n: int, seed: int, where: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training rows, held-out rows) of a manifest: `n` distinct images drawn by `seed`, with all their
    captions, held out; both in manifest order, re-indexed from 0."""
    images = rows["image_path"].drop_duplicates().tolist()
    if n < 2 or n >= len(images):
        raise ValidationError(f"{where}: recipe key train.val_holdout {n}: expected at least 2 images (recall "
                              f"ranks one image among the others) and fewer than the manifest's {len(images)}")
    order = np.random.default_rng(np.random.SeedSequence([seed, HOLDOUT_STREAM])).permutation(len(images))
    held = rows["image_path"].isin({images[i] for i in order[:n]})
    return rows[~held].reset_index(drop=True), rows[held].reset_index(drop=True)


def holdout_images(rows: pd.DataFrame) -> list[RetrievalImage]:
    """The held-out rows as retrieval's test images (each image with its captions, in manifest order)."""
    grouped = rows.groupby("image_path", sort=False)
    return [RetrievalImage(str(group["image_id"].iloc[0]), Path(str(path)), group["caption_id"].astype(str).tolist(),
                           group["caption"].tolist())
            for path, group in grouped]


@dataclass(frozen=True)
class ValBenchmark:
    """The configured benchmark a run validates on: its name, config entry, folder and the config's zero-shot
    templates (the train rule passes them as the evaluate rule does)."""

    name: str
    spec: dict[str, Any]
    dir: str
    templates: list[str] | None = None

    @classmethod
    def from_arg(cls, value: dict[str, Any]) -> ValBenchmark:
        if not (isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("spec"), dict)
                and isinstance(value.get("dir"), str)):
            raise ValidationError(f"--val-benchmark: expected {{\"name\", \"spec\", \"dir\", \"templates\"}}, "
                                  f"got {str(value)[:80]}")
        return cls(value["name"], value["spec"], value["dir"], value.get("templates"))


class Validator:
    """Scores a training model every `every` steps on the holdout and/or the zero-shot benchmark."""

    def __init__(self, every: int, loaded: LoadedModel, holdout: list[RetrievalImage],
                 benchmark: ValBenchmark | None, where: str | Path) -> None:
        if not holdout and benchmark is None:
            raise ValidationError(f"{where}: recipe key train.val_every {every}: nothing to validate on; set "
                                  "train.val_holdout (images held out of training) or train.val_benchmark")
        self.every, self.loaded, self.holdout, self.benchmark, self.where = every, loaded, holdout, benchmark, where

    def due(self, step: int, steps: int) -> bool:
        return step % self.every == 0 or step == steps

    def __call__(self, step: int, epoch: int) -> dict[str, float]:
        """One validation row; the model's modes and the torch random state are as they were on return."""
        model, device = self.loaded.model, self.loaded.device
        modes = [(module, module.training) for module in model.modules()]
        started = time.perf_counter()
        model.eval()
        try:
            devices = [device.index if device.index is not None else torch.cuda.current_device()] \
                if device.type == "cuda" else []
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                row: dict[str, float] = {"step": step, "epoch": epoch}
                if self.holdout:
                    metrics = retrieval.score(self.loaded, self.holdout, Path(self.where)).metrics
                    row |= {column: metrics[column].value for column in RETRIEVAL_COLUMNS}
                if self.benchmark is not None:
                    result = run_benchmark(self.loaded, self.benchmark.spec, self.benchmark.dir,
                                           self.benchmark.templates)
                    row[f"{self.benchmark.name}_{result.headline}"] = result.metrics[result.headline].value
        finally:
            for module, training in modes:
                module.train(training)
        log.info("validation at step %d: %s (%.1f s)", step,
                 " ".join(f"{k}={v:.4f}" for k, v in row.items() if k not in ("step", "epoch")),
                 time.perf_counter() - started)
        return row
