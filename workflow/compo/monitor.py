"""Live metrics of a training run, written while it runs (open_clip_train's `--report-to`).

A training job of 10-40 hours must show its loss curve, learning rate and throughput as it goes, not only
when its model folder is exported. `Monitor` writes, under the run's live folder (the rule's log path without
`.log`, e.g. `results/logs/train/negclip/coco/seed0/`):
- `losses.csv`: the model folder's losses.csv as it grows, one row per step (rewritten whole on resume, so it
  always equals the rows the run holds);
- TensorBoard event files (`train.report_to` holds `tensorboard`): every loss term and `stat_` diagnostic
  under `train/`, and `train/lr`, `train/logit_scale`, `train/samples_per_s`, `train/data_seconds` (view with
  `tensorboard --logdir results/logs/train`);
- a Weights & Biases run (`wandb`) in the mode `WANDB_MODE` says (`offline`: files under the live folder, sent
  later with `wandb sync`; nothing is sent unless the user sets online mode and a key);
- `validation.csv` when the recipe validates (`train.val_every`, compo.validation): one row per validation, its
  scores also TensorBoard's and W&B's `val/...` (rewritten whole on resume, as losses.csv).
Only the main process of a distributed run writes.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compo.losses import TOTAL

REPORTERS = ("tensorboard", "wandb")
LIVE_LOSSES = "losses.csv"


def check_report_to(report_to: Sequence[str]) -> None:
    """Config key train.report_to: a list of REPORTERS."""
    unknown = [name for name in report_to if name not in REPORTERS]
    if unknown:
        raise ValueError(f"config key train.report_to: {unknown[0]!r} is not one of {', '.join(REPORTERS)}")


def live_dir(log_path: str | Path) -> Path:
    """The live folder of a job whose log is `log_path`: the same path without its `.log` suffix."""
    path = Path(log_path)
    return path.with_suffix("") if path.suffix == ".log" else path.with_name(path.name + ".live")


class Monitor:
    """Writes a run's rows as they come (losses.csv, TensorBoard, W&B); `close` flushes everything."""

    def __init__(self, folder: str | Path, report_to: Sequence[str], name: str, config: dict[str, Any],
                 rows: list[dict[str, float]] | None = None,
                 validation: list[dict[str, float]] | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] = []
        self._rewrite(rows or [])
        if validation is not None:  # the run validates: the rows it holds (a resumed run's, up to its step)
            self._write_validation(validation)
        first = int(rows[-1]["step"]) + 1 if rows else None
        self.tensorboard = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: after a resume, TensorBoard drops the events a killed run wrote past the resumed step
            self.tensorboard = SummaryWriter(str(self.folder / "tensorboard"), purge_step=first, flush_secs=30)
        self.wandb = None
        if "wandb" in report_to:
            import wandb

            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "compo-study"), name=name,
                                    dir=str(self.folder), config=config, resume="allow",
                                    mode=os.environ.get("WANDB_MODE", "offline"))

    def _rewrite(self, rows: list[dict[str, float]]) -> None:
        self.columns = loss_columns(rows)
        with open(self.folder / LIVE_LOSSES, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.columns, restval="")
            writer.writeheader()
            writer.writerows(rows)

    def log(self, row: dict[str, float], extra: dict[str, float], rows: list[dict[str, float]]) -> None:
        """One step: its losses.csv `row` (appended; the file is rewritten when a new column appears, from all
        `rows` so far) and `extra` scalars (learning-rate-free figures such as samples/s and the logit scale)."""
        if set(row) - set(self.columns) or not rows[:-1]:  # a new column, or the first row: the header too
            self._rewrite(rows)
        else:
            with open(self.folder / LIVE_LOSSES, "a", newline="") as handle:
                csv.DictWriter(handle, fieldnames=self.columns, restval="").writerow(row)
        step = int(row["step"])
        scalars = {key: value for key, value in {**row, **extra}.items() if key not in ("step", "epoch")}
        if self.tensorboard is not None:
            for key, value in scalars.items():
                self.tensorboard.add_scalar(f"train/{key}", value, step)
        if self.wandb is not None:
            self.wandb.log({f"train/{key}": value for key, value in scalars.items()}, step=step)

    def log_validation(self, row: dict[str, float], rows: list[dict[str, float]]) -> None:
        """One validation: validation.csv rewritten from all `rows` (a handful per run), `val/` scalars."""
        self._write_validation(rows)
        step = int(row["step"])
        scalars = {key: value for key, value in row.items() if key not in ("step", "epoch")}
        if self.tensorboard is not None:
            for key, value in scalars.items():
                self.tensorboard.add_scalar(f"val/{key}", value, step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log({f"val/{key}": value for key, value in scalars.items()}, step=step)

    def _write_validation(self, rows: list[dict[str, float]]) -> None:
        from compo.validation import COLUMNS, VALIDATION_CSV

        columns = [c for c in COLUMNS if any(c in row for row in rows)] or list(COLUMNS[:2])
        columns += [c for c in dict.fromkeys(c for row in rows for c in row) if c not in columns]
        with open(self.folder / VALIDATION_CSV, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)

    def flush(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def loss_columns(rows: list[dict[str, float]]) -> list[str]:
    """losses.csv's columns: step, epoch, lr, the loss terms in first-seen order, the total last."""
    columns: list[str] = ["step", "epoch", "lr"]
    for row in rows:
        columns += [c for c in row if c not in columns and c != TOTAL]
    return [*columns, TOTAL]
