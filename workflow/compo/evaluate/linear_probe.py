"""Linear probes on frozen image features: CLIP's logistic regression (Radford et al., 2021, section 3.2)
or CLIP_benchmark's epoch-trained linear layer, single- or multi-label.

Files: the train, validation (when the release has one) and test splits in one of zero-shot's formats
(`compo.evaluate.zeroshot`, `spec["format"]`): two ImageFolder trees `{benchmark_dir}/train/{class}/*` and
`{benchmark_dir}/test/{class}/*` (`splits` renames them: ImageNet's `{train: train, test: val}`), CIFAR's
python pickles, or a released layout of
`compo.evaluate.labelled` (its `splits` name the release's split of each role). Features are the model's
L2-normalised image embeddings.

`spec["solver"]`:
* `lbfgs` (default; CLIP's protocol, also VTAB's logistic regression): multinomial logistic regression
  fitted by full-batch L-BFGS (strong Wolfe line search) in float64, minimising
      mean cross-entropy + lambda / 2 * ||W||^2   (the bias is not penalised),
  i.e. scikit-learn's LogisticRegression(C = 1 / (lambda * n_train)). As CLIP swept its C on a validation
  split, lambda is chosen from `spec["l2_grid"]` (default `L2_GRID`) by accuracy on the release's validation
  split when it has one (Flowers-102, DTD, FGVC-Aircraft, VTAB's val200), else on a seeded, per-class 20%
  hold-out of the training images (ties go to the larger lambda); the probe is then refitted on train +
  validation and scored on test.
* `adamw`: CLIP_benchmark's linear probe: a linear layer trained `epochs` (10) epochs of shuffled
  mini-batches (`batch_size` 64) by AdamW (`lr` 0.1, `weight_decay`, default 0: CLIP_benchmark without a
  validation split), the learning rate cosine-decayed per step from `lr` to 0 without warm-up, seeded by
  `seed`; trained on train + validation.
Single-label sets: cross-entropy; top-1 (top-5 with more than 5 classes) with ties against the model and
"mean_per_class" (the mean of per-class accuracies). Multi-label sets (COCO): a sigmoid per class with
binary cross-entropy; "map" (the mean over classes of average precision, each class's test images ranked
by its score, a tie ranked against the class) and "top1" (the best-scoring class is one of the image's
labels); an image with no label is scored in map's negatives and counted as `image_without_labels` for
top1. The headline is `spec["headline"]` (default top1; multi-label: map).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    log_skips,
)
from compo.evaluate.files import classification_files, labelled_downloads
from compo.evaluate.kinds import POSITIVE_INT, Benchmark, BenchmarkSize, Key
from compo.evaluate.zeroshot import (
    CLASSIFICATION_HEADLINES,
    LABELLED_KEYS,
    RELEASED_TEST,
    LabelledImages,
    embed_labelled,
    headline,
    load_split,
    selections,
)

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

log = logging.getLogger(__name__)

PROTOCOLS = {"lbfgs": "linear-probe-lbfgs-l2-validated", "adamw": "linear-probe-adamw-epochs"}
SPLITS = ("train", "val", "test")
ADAMW = {"epochs": 10, "lr": 0.1, "batch_size": 64, "weight_decay": 0.0}  # CLIP_benchmark's defaults
L2_GRID = tuple(10.0**k for k in range(-6, 1))
VALIDATION_FRACTION = 0.2
MAX_ITER = 500
LBFGS_KEYS = ("max_iter", "l2_grid")  # the spec's keys only solver lbfgs reads


# Rows of logits per chunk of the L-BFGS objective: the loss and its gradient are accumulated over row chunks so
# the fit holds one chunk's float64 logits (and their autograd buffers) at a time, not N x C of them several times
# (ImageNet: 1.28 M x 1,000 float64 logits are 10 GB each; issue 42). 2^24 logit entries = 128 MB a buffer.
CHUNK_ENTRIES = 2**24


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (labels [N] class indices) or mean per-class binary cross-entropy (labels [N, C])."""
    import torch

    if labels.dim() == 2:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
    return torch.nn.functional.cross_entropy(logits, labels)


def _summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`_loss` times its element count (rows; multi-label: rows x classes): chunks' sums add up to the total."""
    import torch

    if labels.dim() == 2:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="sum")
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


def chunk_rows(n_classes: int, entries: int = CHUNK_ENTRIES) -> int:
    """Rows per chunk of the objective so a chunk holds at most `entries` logits."""
    return max(1, entries // max(1, n_classes))


def probe_objective(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    l2: float, rows: int) -> torch.Tensor:
    """The probe's objective (mean loss + l2 / 2 * ||W||^2), its gradient accumulated into weight.grad and
    bias.grad chunk by chunk (`rows` rows of logits at a time: bounded memory); returns the loss (detached)."""
    import torch

    count = labels.numel() if labels.dim() == 2 else len(labels)
    total = torch.zeros((), dtype=features.dtype, device=features.device)
    for start in range(0, len(features), rows):
        part = _summed_loss(features[start:start + rows] @ weight + bias, labels[start:start + rows]) / count
        part.backward()
        total += part.detach()
    penalty = l2 / 2 * weight.pow(2).sum()
    penalty.backward()
    return total + penalty.detach()


def fit_softmax_regression(features: torch.Tensor, labels: torch.Tensor, n_classes: int, l2: float,
                           rows: int | None = None, max_iter: int = MAX_ITER) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights [D, C] and bias [C] minimising the mean loss + l2 / 2 * ||W||^2 (float64 L-BFGS); the loss is
    cross-entropy for class indices, binary cross-entropy for multi-hot labels. The objective is evaluated
    in chunks of `rows` rows (default `chunk_rows`): memory bounded whatever the number of images."""
    import torch

    features = features.double()
    rows = rows or chunk_rows(n_classes)
    weight = torch.zeros(features.shape[1], n_classes, dtype=torch.float64, device=features.device,
                         requires_grad=True)
    bias = torch.zeros(n_classes, dtype=torch.float64, device=features.device, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1, max_iter=max_iter, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        return probe_objective(features, labels, weight, bias, l2, rows)

    optimizer.step(closure)
    return weight.detach(), bias.detach()


def fit_adamw(features: torch.Tensor, labels: torch.Tensor, n_classes: int, settings: dict[str, Any],
              seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP_benchmark's probe: a linear layer (torch's default init) trained by AdamW for `epochs` epochs of
    shuffled mini-batches, the learning rate cosine-decayed per step to 0; weights [D, C], bias [C]."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layer = torch.nn.Linear(features.shape[1], n_classes, dtype=torch.float32).to(features.device)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=settings["lr"], weight_decay=settings["weight_decay"])
    features = features.float()
    batches = -(-len(features) // settings["batch_size"])
    total = settings["epochs"] * batches
    for epoch in range(settings["epochs"]):
        order = torch.randperm(len(features), generator=generator).to(features.device)
        for b in range(batches):
            step = epoch * batches + b
            for group in optimizer.param_groups:
                group["lr"] = 0.5 * (1 + np.cos(np.pi * step / total)) * settings["lr"]
            rows = order[b * settings["batch_size"]:(b + 1) * settings["batch_size"]]
            optimizer.zero_grad()
            _loss(layer(features[rows]), labels[rows]).backward()
            optimizer.step()
    return layer.weight.detach().T.double(), layer.bias.detach().double()


def validation_mask(labels: torch.Tensor, seed: int) -> torch.Tensor:
    """A seeded hold-out: VALIDATION_FRACTION of each class with at least two images (at least one)."""
    import torch

    rng = np.random.default_rng(seed)
    mask = torch.zeros(len(labels), dtype=torch.bool)
    for label in labels.unique().tolist():
        members = np.flatnonzero(labels.cpu().numpy() == label)
        if len(members) >= 2:
            n_val = max(1, round(VALIDATION_FRACTION * len(members)))
            mask[rng.choice(members, size=n_val, replace=False)] = True
    return mask


def _validation_score(logits: torch.Tensor, labels: torch.Tensor) -> float:
    if labels.dim() == 2:
        from compo.evaluate.scoring import mean_average_precision

        return mean_average_precision(logits, labels)
    return float((logits.argmax(1) == labels).double().mean())


def choose_l2(features: torch.Tensor, labels: torch.Tensor, n_classes: int, seed: int,
              validation: tuple[torch.Tensor, torch.Tensor] | None = None, max_iter: int = MAX_ITER,
              grid: tuple[float, ...] = L2_GRID) -> float:
    """Lambda of `grid` scoring best (accuracy; multi-label: mAP) on `validation` (features, labels), or
    without one on a seeded per-class hold-out of the training set; ties go to the larger lambda."""
    import torch

    if validation is None:
        if labels.dim() == 2:
            held_out = torch.from_numpy(np.random.default_rng(seed).random(len(labels)) < VALIDATION_FRACTION)
        else:
            held_out = validation_mask(labels, seed)
        held_out = held_out.to(labels.device)
        if not held_out.any() or held_out.all():
            return max(grid)
        validation = (features[held_out], labels[held_out])
        features, labels = features[~held_out], labels[~held_out]
    best, best_score = max(grid), -1.0
    for l2 in sorted(grid, reverse=True):  # strict > keeps the larger lambda on ties
        weight, bias = fit_softmax_regression(features, labels, n_classes, l2, max_iter=max_iter)
        score = _validation_score(validation[0] @ weight + bias, validation[1])
        if score > best_score:
            best, best_score = l2, score
    return best


def _other_solvers_keys(spec: dict[str, Any]) -> tuple[list[str], str]:
    """The entry's keys its solver does not read, and why (the config check and the scorer both ask)."""
    if spec.get("solver", "lbfgs") == "lbfgs":
        return [k for k in ADAMW if k in spec], "solver adamw (solver lbfgs chooses its L2 penalty on validation)"
    return [k for k in LBFGS_KEYS if k in spec], "solver lbfgs (adamw runs `epochs`)"


def check_spec(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """A key of the other solver, as (key, message): it would be silently unused (refused at config load)."""
    keys, owner = _other_solvers_keys(spec)
    return [(key, f"belongs to {owner}") for key in keys]


def _probe_settings(spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    solver = spec.get("solver", "lbfgs")
    if solver not in PROTOCOLS:
        raise BenchmarkError(f"benchmark key 'solver': {solver!r} is not one of {', '.join(PROTOCOLS)}")
    settings = {key: spec.get(key, default) for key, default in ADAMW.items()}
    misplaced, owner = _other_solvers_keys(spec)
    if misplaced:
        raise BenchmarkError(f"benchmark keys {', '.join(misplaced)} belong to {owner}")
    settings["max_iter"] = spec.get("max_iter", MAX_ITER)
    settings["l2_grid"] = tuple(float(l2) for l2 in spec.get("l2_grid", L2_GRID))
    return solver, settings


def _targets(data: LabelledImages, kept: list[int]) -> torch.Tensor:
    import torch

    if data.targets is not None:
        return torch.from_numpy(data.targets[kept])
    return torch.tensor([data.labels[index] for index in kept])


def _check_classes(data: dict[str, tuple], benchmark_dir: Path, spec: dict[str, Any]) -> None:
    """Every split has the train split's classes, in its order, and every class has a readable training
    image (a class the probe never sees in training could never be predicted); errors name the classes."""
    import torch

    train = data["train"][0].class_ids
    for split in data:
        ids = data[split][0].class_ids
        if ids != train:
            only_train, only_split = sorted(set(train) - set(ids)), sorted(set(ids) - set(train))
            differ = (f"only in train: {', '.join(only_train[:5]) or '-'}; only in {split}: "
                      f"{', '.join(only_split[:5]) or '-'}") if only_train or only_split else "other order"
            raise BenchmarkError(f"{benchmark_dir} (format {spec.get('format') or 'imagefolder'}): train and "
                                 f"{split} have different classes ({len(train)} vs {len(ids)}; {differ}); "
                                 "expected the same class folders or labels in every split")
    labelled, kept, _, targets = data["train"]
    seen = targets.any(dim=0) if labelled.targets is not None else torch.bincount(targets, minlength=len(train)) > 0
    unseen = [train[c] for c in range(len(train)) if not bool(seen[c])]
    if unseen:
        raise BenchmarkError(f"{benchmark_dir}: {len(unseen)} class(es) without a readable training image: "
                             f"{', '.join(unseen[:5])}; expected at least one per class (the probe could never "
                             "predict them)")


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    import torch

    solver, settings = _probe_settings(spec)
    seed = int(spec.get("seed", 0))
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    data = {}
    for split in SPLITS:
        labelled = load_split(spec, benchmark_dir, split, named=False)
        if labelled is None:
            continue
        emb, kept = embed_labelled(loaded, labelled, skipped, examples)
        if not kept:
            raise BenchmarkError(f"{benchmark_dir}: every {split} image is missing or unreadable")
        data[split] = (labelled, kept, emb, _targets(labelled, kept))
    _check_classes(data, benchmark_dir, spec)
    classes = data["train"][0].class_ids
    multilabel = data["train"][0].targets is not None

    # the fit runs where the model does (a GPU: ImageNet's 1.28M features in float64 L-BFGS)
    device = loaded.device
    train_x, train_y = data["train"][2].to(device), data["train"][3].to(device)
    validation = (data["val"][2].to(device), data["val"][3].to(device)) if "val" in data else None
    fit_x = train_x if validation is None else torch.cat([train_x, validation[0]])
    fit_y = train_y if validation is None else torch.cat([train_y, validation[1]])
    if solver == "lbfgs":
        l2 = choose_l2(train_x, train_y, len(classes), seed, validation, settings["max_iter"], settings["l2_grid"])
        weight, bias = fit_softmax_regression(fit_x, fit_y, len(classes), l2, max_iter=settings["max_iter"])
        log.info("linear_probe: lambda=%g chosen on %s, refitted on %d images", l2,
                 "the validation split" if validation else f"a {100 * VALIDATION_FRACTION:.0f}% hold-out",
                 len(fit_y))
    else:
        weight, bias = fit_adamw(fit_x, fit_y, len(classes), settings, seed)

    test, kept, test_x, test_y = data["test"]
    logits = test_x @ weight.cpu() + bias.cpu()
    if multilabel:
        from compo.evaluate.scoring import multilabel_scores

        predictions, metrics = multilabel_scores(logits, test_y, [test.items[i] for i in kept], skipped)
    else:
        predictions, metrics = _single_label_scores(logits, test_y, [test.items[i] for i in kept], classes)
    log_skips("linear_probe", skipped, examples)
    return BenchmarkResult(PROTOCOLS[solver], headline(spec, metrics, "map" if multilabel else "top1"), metrics,
                           predictions, dict(skipped))


def _single_label_scores(logits: torch.Tensor, labels: torch.Tensor, items: list[str], classes: list[str]
                         ) -> tuple[pd.DataFrame, dict[str, Metric]]:
    import torch

    true = logits.gather(1, labels[:, None]).squeeze(1)
    wrong = torch.ones_like(logits, dtype=torch.bool).scatter_(1, labels[:, None], False)
    from compo.evaluate.scoring import ranked_rows

    predictions = ranked_rows(logits, true, wrong, [classes[label] for label in labels.tolist()], items)
    n = len(predictions)
    metrics = {"top1": Metric(float(predictions["correct"].mean()), n)}
    if len(classes) > 5:
        metrics["top5"] = Metric(float((predictions["rank"] <= 5).mean()), n)
    metrics["mean_per_class"] = Metric(float(predictions.groupby("subset")["correct"].mean().mean()), n)
    return predictions, metrics


# training images of the released sets, by format or dataset name (their tests: zeroshot.RELEASED_TEST)
RELEASED_TRAIN = {"imagenet1k": 1_281_167, "cifar10": 50_000, "cifar100": 50_000, "food101": 75_750,
                  "oxford_pets": 3_680, "flowers102": 2_040, "sun397": 19_850, "stanford_cars": 8_144, "dtd": 3_760,
                  "caltech101": 3_060, "fgvc_aircraft": 6_667, "coco_multilabel": 82_783}
VTAB_TRAIN, VTAB_TEST = 1_000, 20_000   # VTAB-1k's train800 + val200; its tests average ~20 K images (ASSUMPTION)


def release_size(spec: dict[str, Any]) -> BenchmarkSize | None:
    """Its training and test images; the training ones are also the probe's fit."""
    if (spec.get("format") or spec.get("dataset")) == "wds":
        return BenchmarkSize(VTAB_TRAIN + VTAB_TEST, 0, VTAB_TRAIN)
    probe = next((n for n in (spec.get("format"), spec.get("dataset")) if n in RELEASED_TRAIN), None)
    if probe is None:
        return None
    return BenchmarkSize(RELEASED_TRAIN[probe] + RELEASED_TEST[probe], 0, RELEASED_TRAIN[probe])


BENCHMARKS = (
    Benchmark(kind="linear_probe", source="CLIP_benchmark's linear_probe (and Kornblith et al.'s L-BFGS probe)",
              run=run, files=lambda spec, folder: classification_files(spec, folder, ("train", "val", "test")),
              images=None, size=release_size, headline="top1", subsets=(), chance=None,
              selections=selections,
              downloads=labelled_downloads, check=check_spec,
              keys={**LABELLED_KEYS,
                    "headline": Key({"enum": list(CLASSIFICATION_HEADLINES)}, "the reported metric: `top1` "
                                    "(default), `top5`, `mean_per_class`, `map` (the multi-label default)",
                                    "seed 000 Table 9"),
                    "solver": Key({"enum": list(PROTOCOLS)}, "`lbfgs` (default: CLIP's L2 logistic regression, its "
                                  "penalty chosen on validation) or `adamw` (CLIP_benchmark's linear layer)",
                                  "CLIP, CLIP_benchmark (seed 002's \"10-epoch linear probing\")"),
                    "max_iter": Key(POSITIVE_INT, f"lbfgs: L-BFGS iterations a fit (default {MAX_ITER})", "CLIP"),
                    "l2_grid": Key({"type": "array", "items": {"type": "number", "exclusiveMinimum": 0},
                                    "minItems": 1, "uniqueItems": True},
                                   "lbfgs: the L2 penalties (lambda) chosen from on validation (default 1e-6 to 1, "
                                   "a decade apart)", "CLIP"),
                    **{name: Key(schema, f"adamw: {name} (default {ADAMW[name]})", "CLIP_benchmark")
                       for name, schema in (("epochs", POSITIVE_INT), ("lr", {"type": "number", "minimum": 0}),
                                            ("batch_size", POSITIVE_INT),
                                            ("weight_decay", {"type": "number", "minimum": 0}))}}),
)
