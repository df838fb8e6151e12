"""tools/rehearse_scale.py on the CPU: each recipe's towers at its (scaled) batch, micro-batch and
context, the peak measured beside compo.memory's prediction (issue 42 item 10; the GPU run is the rehearsal).
The script runs in a fresh interpreter: it forks a child per recipe, which is safe before torch starts threads."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "rehearse_scale.py"


def _rehearse(tmp_path: Path, config: str, *args: str) -> dict[str, dict[str, str]]:
    out = tmp_path / "rehearsal.csv"
    run = subprocess.run([sys.executable, str(SCRIPT), "--configfile", str(REPO / "config" / config), "--device",
                          "cpu", "--steps", "2", "--out", str(out), *args], capture_output=True, text=True,
                         check=False, env={**os.environ, "PYTHONPATH": str(REPO / "workflow")}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(out, newline="") as handle:
        return {row["method"]: row for row in csv.DictReader(handle)}


def test_the_embedded_recipes_rehearse_with_their_rows_and_context(tmp_path: Path) -> None:
    rows = _rehearse(tmp_path, "config.yaml", "--methods", "clip-ft", "longclip", "--batch-scale", "0.25")
    plain, long = rows["clip-ft"], rows["longclip"]
    assert plain["micro_batch"] == plain["batch"] and float(plain["samples_per_s"]) > 0
    assert float(plain["measured_gb"]) > 0
    assert long["context"] == "248" and long["model"].endswith("-ctx248")


@pytest.mark.slow
def test_a_paper_recipe_at_a_small_batch_is_predicted_by_the_memory_model(tmp_path: Path) -> None:
    """ViT-B-32 at batch 4 (1/64 of clip-ft's 256) on the CPU in fp32: the memory model's prediction for that
    batch is the measured peak's order (weights, AdamW and 4 samples' activations: about 2.5 GB)."""
    overlay = tmp_path / "fp32.yaml"
    overlay.write_text("train: {precision: fp32}\n")
    out = tmp_path / "rehearsal.csv"
    run = subprocess.run([sys.executable, str(SCRIPT), "--configfile", str(REPO / "config" / "paper.yaml"),
                          str(overlay), "--device", "cpu", "--steps", "2", "--methods", "clip-ft", "--batch-scale",
                          str(1 / 64), "--out", str(out)], capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO / "workflow")}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(out, newline="") as handle:
        row = next(csv.DictReader(handle))
    assert row["batch"] == "4" and row["predicted_gb"]
    predicted, measured = float(row["predicted_gb"]), float(row["measured_gb"])
    assert 0.5 * predicted < measured < 1.5 * predicted, row
