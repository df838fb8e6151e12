"""Linear probe (Radford et al., 2021, section 3.2): logistic regression on frozen image features.

Files: the train and test splits in one of zero-shot's formats (`compo.evaluate.zeroshot`,
`spec["format"]`): two ImageFolder trees `{benchmark_dir}/train/{class}/*` and `{benchmark_dir}/test/
{class}/*` with the same class folders (and `classnames.json`, as for zero-shot), or CIFAR-10/100's
python pickles (training batches and test batch) read by torchvision.
Features are the model's L2-normalised image embeddings. The classifier is multinomial logistic
regression fitted by full-batch L-BFGS (strong Wolfe line search) in float64, minimising
    mean cross-entropy + lambda / 2 * ||W||^2   (the bias is not penalised),
i.e. scikit-learn's LogisticRegression(C = 1 / (lambda * n_train)). As CLIP swept its C on a validation
split, lambda is chosen from `L2_GRID` by accuracy on a seeded, per-class 20% hold-out of the training
images (ties go to the larger lambda), then the probe is refitted on every training image and scored on
test. Top-1 with ties against the model; "mean_per_class" averages the per-class accuracies.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from compo.evaluate.common import BenchmarkError, BenchmarkResult, Metric, log_skips, pessimistic_rank
from compo.evaluate.zeroshot import embed_labelled, load_split
from compo.models import LoadedModel

log = logging.getLogger(__name__)

PROTOCOL = "linear-probe-lbfgs-l2-validated"
SPLITS = ("train", "test")
L2_GRID = tuple(10.0**k for k in range(-6, 1))
VALIDATION_FRACTION = 0.2
MAX_ITER = 500


def fit_softmax_regression(features: torch.Tensor, labels: torch.Tensor, n_classes: int, l2: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights [D, C] and bias [C] minimising mean cross-entropy + l2 / 2 * ||W||^2 (float64 L-BFGS)."""
    features = features.double()
    weight = torch.zeros(features.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1, max_iter=MAX_ITER, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(features @ weight + bias, labels) + l2 / 2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weight.detach(), bias.detach()


def validation_mask(labels: torch.Tensor, seed: int) -> torch.Tensor:
    """A seeded hold-out: VALIDATION_FRACTION of each class with at least two images (at least one)."""
    rng = np.random.default_rng(seed)
    mask = torch.zeros(len(labels), dtype=torch.bool)
    for label in labels.unique().tolist():
        members = np.flatnonzero(labels.numpy() == label)
        if len(members) >= 2:
            n_val = max(1, round(VALIDATION_FRACTION * len(members)))
            mask[rng.choice(members, size=n_val, replace=False)] = True
    return mask


def choose_l2(features: torch.Tensor, labels: torch.Tensor, n_classes: int, seed: int) -> float:
    held_out = validation_mask(labels, seed)
    if not held_out.any() or held_out.all():
        return L2_GRID[-1]
    best, best_accuracy = L2_GRID[-1], -1.0
    for l2 in sorted(L2_GRID, reverse=True):  # strict > keeps the larger lambda on ties
        weight, bias = fit_softmax_regression(features[~held_out], labels[~held_out], n_classes, l2)
        accuracy = float(((features[held_out] @ weight + bias).argmax(1) == labels[held_out]).double().mean())
        if accuracy > best_accuracy:
            best, best_accuracy = l2, accuracy
    return best


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    data = {}
    for split in SPLITS:
        labelled = load_split(spec, benchmark_dir, split)
        emb, kept = embed_labelled(loaded, labelled, skipped, examples)
        if not kept:
            raise BenchmarkError(f"{benchmark_dir}: every {split} image is missing or unreadable")
        data[split] = (labelled, kept, emb, torch.tensor([labelled.labels[index] for index in kept]))
    if data["train"][0].class_ids != data["test"][0].class_ids:
        raise BenchmarkError(f"{benchmark_dir}: train and test have different classes "
                             f"({len(data['train'][0].class_ids)} vs {len(data['test'][0].class_ids)})")
    log_skips("linear_probe", skipped, examples)
    classes = data["train"][0].class_ids

    _, _, train_x, train_y = data["train"]
    l2 = choose_l2(train_x, train_y, len(classes), int(spec.get("seed", 0)))
    weight, bias = fit_softmax_regression(train_x, train_y, len(classes), l2)
    log.info("linear_probe: lambda=%g chosen on a %.0f%% hold-out of %d training images", l2,
             100 * VALIDATION_FRACTION, len(train_y))

    test, kept, test_x, test_y = data["test"]
    logits = test_x @ weight + bias
    true = logits.gather(1, test_y[:, None]).squeeze(1)
    wrong = torch.ones_like(logits, dtype=torch.bool).scatter_(1, test_y[:, None], False)
    ranks = pessimistic_rank(true, logits, wrong)
    predictions = pd.DataFrame({
        "subset": [classes[label] for label in test_y.tolist()],
        "item": [test.items[index] for index in kept],
        "correct": (ranks == 1).numpy(), "score_pos": true.numpy(),
        "score_neg": logits.masked_fill(~wrong, float("-inf")).max(dim=1).values.numpy(),
        "rank": ranks.numpy(),
    })
    per_class = predictions.groupby("subset")["correct"].mean()
    metrics = {"top1": Metric(float(predictions["correct"].mean()), len(predictions)),
               "mean_per_class": Metric(float(per_class.mean()), len(predictions))}
    return BenchmarkResult(PROTOCOL, "top1", metrics, predictions, dict(skipped))
