"""Preemption: a training process killed with SIGKILL mid-run resumes from its last checkpoint on rerun
and ends exactly where an uninterrupted run ends (same weights, same losses, same evaluation)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from compo.evaluate import evaluate
from compo.train import resume_dir
from compo.world import generate_benchmarks, generate_split

pytestmark = pytest.mark.slow  # trains twice and kills a Snakemake run

REPO = Path(__file__).resolve().parents[1]
STEPS, CHECKPOINT_EVERY = 12, 3


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("preempt")
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    spec = {**config["world"], "splits": {**config["world"]["splits"], "finetune": 24, "eval": 8},
            "benchmarks": {**config["world"]["benchmarks"], "sugarcrepe_per_subset": 4}}
    generate_split("finetune", spec, seed=0, out_dir=root / "world")
    generate_benchmarks(spec, seed=0, out_dir=root / "bench")
    return {"root": root, "manifest": root / "world" / "manifest.parquet", "bench": root / "bench" / "sugarcrepe"}


def train_command(world: dict[str, Path], out: Path) -> list[str]:
    recipe = {"model": "compo-tiny-clip", "init": "scratch", "dataset": "finetune",
              "train": {"steps": STEPS, "batch_size": 8, "lr": 1e-3, "warmup": 2, "weight_decay": 0.1}}
    settings = {"threads": 1, "checkpoint_every": CHECKPOINT_EVERY, "log_every": 1}
    return [sys.executable, "-m", "compo", "train", "--recipe", json.dumps(recipe), "--settings",
            json.dumps(settings), "--manifest", str(world["manifest"]), "--seed", "0", "--out", str(out)]


def run_to_end(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]


def sugarcrepe(world: dict[str, Path], model_dir: Path) -> dict:
    out = model_dir.parent / f"{model_dir.name}.json"
    evaluate(model_dir, "sugarcrepe", {"kind": "sugarcrepe", "source": "world"}, world["bench"], out,
             model_dir.parent / f"{model_dir.name}.parquet", model_id="base-clip/finetune/seed0")
    return json.loads(out.read_text())["metrics"]


def test_sigkill_then_rerun_matches_an_uninterrupted_run(world):
    straight, killed = world["root"] / "straight", world["root"] / "killed"
    run_to_end(train_command(world, straight))

    # Start the same run and SIGKILL it once it has saved a resumable checkpoint and moved past it.
    process = subprocess.Popen(train_command(world, killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    state = resume_dir(killed) / "state.pt"
    deadline = time.monotonic() + 300
    while not state.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "training finished before it could be killed: make STEPS larger"
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert state.exists() and not killed.exists()  # no partial model folder survives
    saved_step = torch.load(state, map_location="cpu", weights_only=True)["step"]
    assert 0 < saved_step < STEPS

    run_to_end(train_command(world, killed))  # the rerun resumes from the saved step
    assert not resume_dir(killed).exists()
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(killed / "checkpoint.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    columns = ["step", "epoch", "lr", "i2t", "t2i", "loss"]
    pd.testing.assert_frame_equal(pd.read_csv(straight / "losses.csv")[columns],
                                  pd.read_csv(killed / "losses.csv")[columns])
    assert sugarcrepe(world, straight) == sugarcrepe(world, killed)
