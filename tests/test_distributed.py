"""Data-parallel training under torchrun: 2 CPU ranks (gloo) at global batch 2B reproduce one process.

One `torchrun --nproc_per_node 2` run of this file (as a script: `worker`) computes one step of several
losses on the first global batch and trains DeGLA for 3 steps (crashing after step 2 and resuming); the
test compares them with the same computations in one process (pytest's): loss terms, parameter
gradients, losses.csv and final weights.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import perturb_teacher, tiny_training_data

from compo import distributed
from compo.accumulate import accumulated_step, split_rows
from compo.batches import TrainingData, epoch_order
from compo.losses import TOTAL, get_loss
from compo.models import get_tokenizer, image_transform, load_model
from compo.train import TrainingError, resume_dir, train

BATCH = 4  # the global batch: 2 captions per rank
RANKS = 2
SEED = 0
SETTINGS = {"threads": 1, "checkpoint_every": 2, "log_every": 1}
HP = {"steps": 3, "batch_size": BATCH, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1, "grad_clip": 1.0}
SWAP = {"generator": "negclip-swap", "k": 1, "kinds": ["noun_chunk", "noun", "adjective"]}
ONLINE = {"swap": SWAP, "replace": {"generator": "wordnet-replace", "k": 1}}
# One recipe per loss whose formula couples samples; the step comparison runs each.
CASES = {
    "infonce": {"name": "infonce", "base": "clip", "loss": "infonce", "train": HP},
    "negclip": {"name": "negclip", "base": "clip", "loss": "negclip", "negatives": "swap", "k": 2,
                "train": HP},
    "degla": {"name": "degla", "base": "clip", "loss": "degla", "negatives": "swap", "k": 2, "ema": 0.9,
              "weights": {"igc": 0.2, "tgc": 0.2, "distill": 0.05}, "train": HP},
    "cement": {"name": "cement", "base": "clip", "loss": "cement", "negatives": "swap", "k": 1,
               "margin": {"kind": "fermi-dirac", "m_min": 0.0, "m_max": 1.0, "c_tilde": 3.0, "tau_m": 0.5},
               "train": HP},
    "c2lip": {"name": "c2lip", "base": "sigmoid", "loss": "c2lip", "weights": {"npc": 1.0, "xac": 0.1},
              "train": HP},
    "fsc-clip": {"name": "fsc-clip", "base": "clip", "loss": "fsc-clip", "online_negatives": list(ONLINE),
                 "online_negative_specs": ONLINE, "k": 1, "weights": {"global": 0.5, "local": 0.2},
                 "focal_gamma": 2.0, "label_smoothing": 0.02, "train": HP},
}
# ViT towers: the equivalence needs a model without BatchNorm (the study's ResNet towers normalise by
# per-rank batch statistics under torchrun, as open_clip does without SyncBatchNorm)
BASE_MODELS = {"clip": "compo-tiny-vit-clip", "sigmoid": "compo-tiny-vit-sigmoid"}
# open_clip's choices for the contrastive losses (train.local_loss, train.gather_with_grad) on 2 ranks
LOSS_OPTIONS = {"infonce:local": {"local_loss": True}, "negclip:local": {"local_loss": True},
                "infonce:no-grad-gather": {"gather_with_grad": False}}
# gradient accumulation within each rank (accum_freq 2: one caption a micro-batch): phrase owners are indices
ACCUMULATED = ("c2lip", "degla")
# The full 3-step train() comparison trains DeGLA (EMA teacher, distill). With AdamW's default eps 1e-6 a
# weight whose gradient is ~1e-6 (a rarely used token embedding) moves by ~lr whatever the gradient's
# rounding, so float32 sums in another order show up as ~0.01 lr in the weights; eps 1e-3 keeps the
# update proportional to the gradient there, which makes the weights a sharp check (and sensitive to a
# wrongly scaled gradient, which Adam's normalisation, and gradient clipping, would otherwise hide).
TRAINED = "degla"
# It validates every step on 2 held-out images (compo.validation): rank 0 alone under torchrun, which must leave
# the ranks in step and the weights those of one process.
TRAINED_RECIPE = {**CASES[TRAINED], "train": {**HP, "eps": 1e-3, "grad_clip": None, "val_every": 1, "val_holdout": 2}}


# --- data ---------------------------------------------------------------------------------------------


def make_data(root: Path, write_manifest) -> dict[str, str]:  # noqa: ANN001
    """The shared tiny training set (helpers.tiny_training_data) and the two tiny base models (exported
    untrained)."""
    data = tiny_training_data(root, write_manifest)
    for base, model in BASE_MODELS.items():
        recipe = {"model": model, "init": "scratch", "dataset": "tiny", "train": {**HP, "steps": 0}}
        train(recipe, None, str(root / f"base-{base}"), seed=SEED, settings=SETTINGS)
    return data


def _negatives(data: dict[str, str], recipe: dict) -> str | None:
    return data["negatives"] if recipe.get("negatives") else None


def _training_data(data: dict[str, str], recipe: dict, model: torch.nn.Module,
                   model_name: str) -> TrainingData:
    return TrainingData(data["manifest"], get_tokenizer(model_name), image_transform(model),
                        get_loss(recipe["loss"]).needs, negatives=_negatives(data, recipe), k=recipe.get("k"),
                        recipe=recipe, seed=SEED, parse=data["parse"])


# --- what both the ranks and the single process compute -------------------------------------------------


def one_step(data: dict[str, str], recipe: dict, parts: int = 1) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The loss terms and the (rank-averaged) parameter gradients of one step on the first global batch, each
    rank's slice in `parts` micro-batches (gradient accumulation, compo.accumulate)."""
    loaded = load_model(Path(data["root"]) / f"base-{recipe['base']}")
    model = loaded.model.train()
    loss = get_loss(recipe["loss"]).build(recipe)
    loss.setup(model)
    perturb_teacher(loss)  # a teacher unlike the student, so distill has a gradient
    training = _training_data(data, recipe, model, loaded.model_name)
    indices = epoch_order(len(training), SEED, 0)[:BATCH].tolist()
    micro_batches = [training.batch(rows, step=0) for rows in split_rows(distributed.local_rows(indices), parts)]
    terms = accumulated_step(lambda batch: loss(model, batch), micro_batches, model, lambda total: total.backward(),
                             TOTAL)
    distributed.average_gradients(model.parameters())
    terms = distributed.mean_over_ranks(terms)  # local_loss: each rank's loss is its rows' mean
    return ({name: value.item() for name, value in terms.items()},
            {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})


class _Crash(RuntimeError):
    pass


def _crash_at(step: int):
    def on_step(done: int) -> None:
        if done == step:
            raise _Crash(done)
    return on_step


def train_method(data: dict[str, str], out: Path, recipe: dict, on_step=None) -> None:
    train(recipe, data["manifest"], str(out), seed=SEED, negatives=_negatives(data, recipe),
          init_dir=str(Path(data["root"]) / f"base-{recipe['base']}"), settings=SETTINGS, parse=data["parse"],
          on_step=on_step)


def worker(data_json: str, out: str) -> None:
    """Run under torchrun: the step of every case, a 3-step training (crash after step 2, resume) and
    a batch that does not split over the ranks; rank 0 saves what it saw to `out`."""
    torch.set_num_threads(1)
    data = json.loads(data_json)
    torch.distributed.init_process_group("gloo")
    try:
        steps = {name: one_step(data, recipe) for name, recipe in CASES.items()}
        for name, options in LOSS_OPTIONS.items():
            with distributed.loss_options(**options):
                steps[name] = one_step(data, CASES[name.split(":")[0]])
        for name in ACCUMULATED:  # micro-batches of one caption, assembled per rank, then gathered over the ranks
            steps[f"{name}:accum"] = one_step(data, CASES[name], parts=BATCH // RANKS)
        model_dir = Path(out).parent / "trained-2ranks"
        try:
            train_method(data, model_dir, TRAINED_RECIPE, on_step=_crash_at(2))
        except _Crash:
            pass
        distributed.barrier()  # rank 0 has written the resume state of step 2
        resumed_from = (resume_dir(model_dir) / "state.pt").exists()
        train_method(data, model_dir, TRAINED_RECIPE)
        try:
            odd_recipe = {**CASES["infonce"], "train": {**HP, "batch_size": 3}}
            train_method(data, Path(out).parent / "odd", odd_recipe)
            odd = "no error"
        except TrainingError as error:
            odd = str(error)
        if distributed.is_main():
            torch.save({"steps": steps, "resumed_from": resumed_from, "odd": odd,
                        "ranks": distributed.world_size()}, out)
    finally:
        torch.distributed.destroy_process_group()


# --- the tests --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory, write_manifest) -> dict:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("distributed")
    data = make_data(root, write_manifest)
    out = root / "ranks.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
               __file__, json.dumps(data), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, check=False)
    seconds = time.perf_counter() - began
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    single = {name: one_step(data, recipe) for name, recipe in CASES.items()}
    train_method(data, root / "trained-1rank", TRAINED_RECIPE)
    print(f"torchrun 2 ranks: {seconds:.1f} s")
    return {"data": data, "root": root, "ranks": torch.load(out, weights_only=False), "single": single}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (elementwise ratios blow up on gradients that cancel to ~0)."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.slow
def test_two_ranks_give_the_global_batch_loss_and_gradients(runs, name):
    assert runs["ranks"]["ranks"] == RANKS
    terms, grads = runs["ranks"]["steps"][name]
    reference_terms, reference_grads = runs["single"][name]
    assert terms.keys() == reference_terms.keys()
    for term, value in reference_terms.items():
        assert math.isfinite(value)
        assert terms[term] == pytest.approx(value, rel=1e-5, abs=1e-6), term
    assert grads.keys() == reference_grads.keys() and len(grads) > 10
    worst = max(_relative(grads[p], reference_grads[p]) for p in reference_grads)
    largest = max(float((grads[p] - reference_grads[p]).abs().max()) for p in reference_grads)
    loss_diff = max(abs(terms[term] - value) for term, value in reference_terms.items())
    print(f"{name}: loss {terms[TOTAL]:.6f} vs {reference_terms[TOTAL]:.6f} (terms: max abs diff {loss_diff:.1e},"
          f" relative {loss_diff / abs(reference_terms[TOTAL]):.1e}); gradients max abs diff {largest:.2e}, "
          f"max relative (per tensor) {worst:.2e}")
    assert worst < 1e-4, name  # every tensor's: none lost or scaled (a factor N or 1/N would show here)


@pytest.mark.parametrize("name", [name for name in LOSS_OPTIONS if name.endswith(":local")])
@pytest.mark.slow
def test_local_loss_on_two_ranks_is_the_global_step(runs, name):
    """Each rank scores only its own rows against all columns; the rank-mean of the losses and the
    averaged gradients are the single process's."""
    terms, grads = runs["ranks"]["steps"][name]
    reference_terms, reference_grads = runs["single"][name.split(":")[0]]
    for term, value in reference_terms.items():
        assert terms[term] == pytest.approx(value, rel=1e-5, abs=1e-6), term
    assert grads.keys() == reference_grads.keys()
    assert max(_relative(grads[p], reference_grads[p]) for p in reference_grads) < 1e-4


@pytest.mark.parametrize("name", ACCUMULATED)
@pytest.mark.slow
def test_accumulation_on_two_ranks_is_the_global_step(runs, name):
    """Each rank's slice in micro-batches (compo.accumulate), then gathered over the ranks: the single process's
    loss and gradients on the global batch."""
    terms, grads = runs["ranks"]["steps"][f"{name}:accum"]
    reference_terms, reference_grads = runs["single"][name]
    for term, value in reference_terms.items():
        assert terms[term] == pytest.approx(value, rel=1e-5, abs=1e-6), term
    assert grads.keys() == reference_grads.keys()
    assert max(_relative(grads[p], reference_grads[p]) for p in reference_grads) < 1e-4


@pytest.mark.slow
def test_gather_without_grad_is_open_clips_scaled_gradient(runs):
    """gather_with_grad false: the same loss; features get the global loss's gradient once per rank, so
    after averaging over 2 ranks the tower parameters carry half of it, the logit scale all of it."""
    terms, grads = runs["ranks"]["steps"]["infonce:no-grad-gather"]
    reference_terms, reference_grads = runs["single"]["infonce"]
    assert terms[TOTAL] == pytest.approx(reference_terms[TOTAL], rel=1e-5)
    assert _relative(grads["logit_scale"], reference_grads["logit_scale"]) < 1e-4
    towers = [p for p in reference_grads if p != "logit_scale"]
    assert max(_relative(grads[p], reference_grads[p] / RANKS) for p in towers) < 1e-4


@pytest.mark.slow
def test_terms_that_couple_samples_are_really_exercised(runs):
    terms = runs["single"]
    assert terms["degla"][0]["distill"] > 0 and terms["degla"][0]["tgc"] > 0  # the teacher differs
    assert terms["cement"][0]["stat_negative_images"] > 0 and terms["c2lip"][0]["stat_phrases"] > 0
    assert terms["fsc-clip"][0]["stat_negatives"] > 0 and terms["negclip"][0]["stat_negatives"] > 0


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path / "losses.csv") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_training_on_two_ranks_with_a_resume_equals_one_process(runs):
    root = runs["root"]
    assert runs["ranks"]["resumed_from"]  # the second run really continued rank 0's resume state
    ranks, single = _rows(root / "trained-2ranks"), _rows(root / "trained-1rank")
    assert [r["step"] for r in ranks] == ["1", "2", "3"] and list(ranks[0]) == list(single[0])
    for row, reference in zip(ranks, single, strict=True):
        for column in set(reference) - {"seconds"}:
            assert float(row[column]) == pytest.approx(float(reference[column]), rel=1e-5, abs=1e-6), column
    weights = torch.load(root / "trained-2ranks" / "checkpoint.pt", weights_only=True)
    reference = torch.load(root / "trained-1rank" / "checkpoint.pt", weights_only=True)
    assert weights.keys() == reference.keys()
    difference = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
    print(f"train {TRAINED} 3 steps: max abs weight difference {difference:.2e}")
    assert difference < 1e-5
    assert not resume_dir(root / "trained-2ranks").exists()


@pytest.mark.slow
def test_a_batch_that_does_not_split_over_the_ranks_is_refused(runs):
    assert "batch_size 3 is not divisible by the 2 ranks" in runs["ranks"]["odd"]


@pytest.mark.slow
def test_online_negatives_of_a_slice_are_those_of_the_whole_batch(runs):
    recipe = CASES["fsc-clip"]
    loaded = load_model(Path(runs["data"]["root"]) / "base-clip")
    training = _training_data(runs["data"], recipe, loaded.model, loaded.model_name)
    indices = [5, 0, 7, 2, 3, 6]
    whole = training.batch(indices, step=4)
    halves = [training.batch(indices[:3], step=4), training.batch(indices[3:], step=4)]
    for key in ("negatives", "negative_mask"):
        assert torch.equal(whole[key], torch.cat([half[key] for half in halves]))
    assert whole["negative_mask"].any()


def test_without_a_process_group_everything_is_the_identity():
    x = torch.randn(3, 2, requires_grad=True)
    assert not distributed.is_distributed() and distributed.world_size() == 1 and distributed.is_main()
    assert distributed.gather_with_grad(x) is x
    assert distributed.local_rows([4, 1, 2]) == [4, 1, 2]
    assert torch.equal(distributed.gather_index(torch.tensor([0, 2]), 3), torch.tensor([0, 2]))


@pytest.mark.slow
def test_the_train_rules_start_torchrun_only_with_more_than_one_gpu(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    command = [str(Path(sys.executable).parent / "snakemake"), "-s", str(repo / "Snakefile"), "--directory",
               str(tmp_path), "--configfile", str(repo / "config" / "config.yaml"),
               str(repo / "tests" / "e2e" / "config.yaml"), "--cores", "2", "-n", "-p",
               "--set-resources", "train:gpu=2", "pretrain:gpu=1", "--",
               "results/models/negclip/coco/seed0/checkpoint.pt"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    shell = result.stdout + result.stderr
    # the method job (2 GPUs) under torchrun, calling the same entry; its base's job (1 GPU) plain
    assert shell.count("torchrun --standalone --nproc_per_node 2 -m compo -- train --recipe") == 1, shell[-3000:]
    pretrain = shell.split("rule pretrain:")[1].split("rule ")[0]
    assert "Shell command: python -m compo train --recipe" in pretrain and "torchrun" not in pretrain
    # the command as the rule writes it reaches compo's parser whole (without `--`, torchrun's own parser stopped
    # on compo's `--log`: "ambiguous option: --log could match --log-dir, ...")
    launched = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node",
                               "1", "-m", "compo", "--", "train", "--log", str(tmp_path / "x.log"), "--help"],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
    assert launched.returncode == 0 and "usage: compo train" in launched.stdout, launched.stderr[-2000:]


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
