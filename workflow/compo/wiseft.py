"""WiSE-FT: weight-space interpolation between a base model and a model fine-tuned from it.

theta(alpha) = (1 - alpha) * theta_base + alpha * theta_ft, parameter by parameter. The result is written
as a normal model directory (checkpoint.pt, model.json, config.yaml, losses.csv and timings.csv with a
header and no rows), so evaluation treats it like any trained model; the folder is written whole or not
at all. alpha = 0 and 1 copy the endpoints exactly. The interpolation runs on `train.device` (float64,
so a GPU gives the same bits as the CPU).
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
import yaml

from compo.devices import resolve_device
from compo.io import atomic_folder
from compo.layout import CHECKPOINT, CONFIG_YAML, LOSSES_CSV, TIMINGS_CSV
from compo.models import (
    architecture,
    load_model,
    load_state,
    read_model_json,
    rebuild_hint,
    save_checkpoint,
    verify_model_checkpoint,
)

# no training steps: header only (the columns compo.train always writes)
LOSSES_HEADER = ["step", "epoch", "lr", "loss"]
TIMINGS_HEADER = ["step", "data_seconds", "seconds"]


class WiseFTError(ValueError):
    """The two models cannot be interpolated; the message names both directories."""


def interpolate_state(base: dict[str, torch.Tensor], finetuned: dict[str, torch.Tensor], alpha: float,
                      where: str = "") -> dict[str, torch.Tensor]:
    """(1 - alpha) * base + alpha * finetuned for floating tensors (BatchNorm running statistics
    included); other tensors must be equal, but for BatchNorm's step counters."""
    if set(base) != set(finetuned):
        only_base, only_ft = sorted(set(base) - set(finetuned)), sorted(set(finetuned) - set(base))
        raise WiseFTError(f"{where}different parameters: only in the base {only_base[:5]}, only in the "
                          f"fine-tuned model {only_ft[:5]}")
    out = {}
    for name, a in base.items():
        b = finetuned[name]
        if a.shape != b.shape:
            raise WiseFTError(f"{where}parameter {name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
        if name.endswith("num_batches_tracked"):
            # a BatchNorm's step counter (CLIP's ResNet towers), bookkeeping rather than a weight: the
            # interpolated model keeps the fine-tuned model's count (the base's at alpha 0, its endpoint)
            out[name] = (a if alpha == 0 else b).clone()
        elif not a.is_floating_point():
            if not torch.equal(a, b):
                raise WiseFTError(f"{where}non-float tensor {name} differs and cannot be interpolated")
            out[name] = a.clone()
        elif alpha == 0:  # exact endpoints (the formula would turn -0.0 into 0.0 and inf into nan)
            out[name] = a.clone()
        elif alpha == 1:
            out[name] = b.clone()
        else:
            out[name] = ((1 - alpha) * a.double() + alpha * b.double()).to(a.dtype)
    return out


def _config(model_dir: Path) -> dict | None:
    path = model_dir / CONFIG_YAML
    return yaml.safe_load(path.read_text()) if path.exists() else None


def interpolate(base_dir: str | Path, finetuned_dir: str | Path, alpha: float, out_dir: str | Path,
                device: str = "auto") -> None:
    """Write the model directory `out_dir` holding WiSE-FT's interpolation of two model directories.
    device: train.device (auto | cpu | cuda), where the weights are interpolated."""
    base_dir, finetuned_dir, out_dir = Path(base_dir), Path(finetuned_dir), Path(out_dir)
    if not 0 <= alpha <= 1:
        raise WiseFTError(f"alpha must lie in [0, 1], got {alpha}")
    where = f"{base_dir} (base) and {finetuned_dir} (fine-tuned): "
    base_meta, finetuned_meta = read_model_json(base_dir), read_model_json(finetuned_dir)
    if architecture(base_meta) != architecture(finetuned_meta):
        raise WiseFTError(f"{where}different architectures: {base_meta['model_name']} vs "
                          f"{finetuned_meta['model_name']}" + ("" if base_meta["model_name"] !=
                                                                finetuned_meta["model_name"] else
                                                                " (same name, different model configs)"))
    target = resolve_device(device, "train.device")
    for model_dir, meta in ((base_dir, base_meta), (finetuned_dir, finetuned_meta)):
        verify_model_checkpoint(model_dir, meta)  # the bytes their model.json records
    base = load_state(base_dir / CHECKPOINT, rebuild_hint(base_dir), map_location=target)
    finetuned = load_state(finetuned_dir / CHECKPOINT, rebuild_hint(finetuned_dir), map_location=target)
    state = {name: tensor.cpu() for name, tensor in interpolate_state(base, finetuned, alpha, where).items()}

    # Loading into the open_clip model checks the result is a loadable checkpoint of that architecture.
    loaded = load_model(base_dir)
    loaded.model.load_state_dict(state)
    config = {
        "wiseft": {"alpha": alpha, "base_dir": str(base_dir), "finetuned_dir": str(finetuned_dir)},
        "model_name": base_meta["model_name"],
        "base_config": _config(base_dir),
        "finetuned_config": _config(finetuned_dir),
    }
    with atomic_folder(out_dir) as folder:
        save_checkpoint(loaded.model, base_meta["model_name"], folder, config=base_meta["model_config"])
        (folder / CONFIG_YAML).write_text(yaml.safe_dump(config, sort_keys=False))
        for name, header in ((LOSSES_CSV, LOSSES_HEADER), (TIMINGS_CSV, TIMINGS_HEADER)):
            with open(folder / name, "w", newline="") as handle:
                csv.writer(handle).writerow(header)
