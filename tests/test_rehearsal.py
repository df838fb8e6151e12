"""workflow/scripts/rehearse_scale.py on the CPU: each recipe's towers at its (scaled) batch, micro-batch and
context, the peak measured beside compo.memory's prediction (issue 42 item 10; the GPU run is the rehearsal)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

from rehearse_scale import isolated, main, rehearse_recipe  # noqa: E402


def test_the_embedded_recipes_rehearse_with_their_rows_and_context(capsys) -> None:
    from compo.config import load_config

    config = load_config(REPO / "config" / "config.yaml")
    cpu = torch.device("cpu")
    plain = isolated(rehearse_recipe, config, "clip-ft", cpu, 2, 0.25)
    long = isolated(rehearse_recipe, config, "longclip", cpu, 2, 0.25)
    assert plain["micro_batch"] == plain["batch"] and plain["samples_per_s"] > 0 and plain["measured_gb"] > 0
    assert long["context"] == 248 and long["model"].endswith("-ctx248")
    main(["--configfile", str(REPO / "config" / "config.yaml"), "--device", "cpu", "--steps", "2",
          "--methods", "negclip", "--batch-scale", "0.25"])
    assert "method=negclip" in capsys.readouterr().out


@pytest.mark.slow
def test_a_paper_recipe_at_a_small_batch_is_predicted_by_the_memory_model() -> None:
    """ViT-B-32 at batch 4 (1/64 of clip-ft's 256) on the CPU in fp32: the memory model's prediction for that
    batch is the measured peak's order (weights, AdamW and 4 samples' activations: about 2.5 GB)."""
    from compo.config import load_config

    config = load_config(REPO / "config" / "paper.yaml")
    config["train"] = {**config["train"], "precision": "fp32"}
    row = isolated(rehearse_recipe, config, "clip-ft", torch.device("cpu"), 2, 1 / 64)
    assert row["batch"] == 4 and row["predicted_gb"] is not None
    assert 0.5 * row["predicted_gb"] < row["measured_gb"] < 1.5 * row["predicted_gb"], row
