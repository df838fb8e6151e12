"""compo.compat: importing open_clip the way every job does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compo.compat import hidden_module

REPO = Path(__file__).resolve().parents[1]


def test_a_hidden_module_is_not_importable_in_the_block_and_is_afterwards() -> None:
    name = "compo_test_hidden_module"
    with hidden_module(name), pytest.raises(ImportError):
        __import__(name)
    assert name not in sys.modules
    with hidden_module("json"):  # imported already: left as it is
        import json  # noqa: F401


def _run(check: str) -> subprocess.CompletedProcess:
    """`check` in a fresh interpreter, as a job starts: nothing imported yet."""
    return subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(REPO / "workflow"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_open_clip_imports_timm_without_wandb_and_wandb_still_imports_after() -> None:
    """timm imports wandb when installed (~0.3 CPU-s a job); a job that reports to wandb imports it itself."""
    check = ("import sys\nfrom compo.compat import import_open_clip\nimport_open_clip()\n"
             "assert 'timm' in sys.modules and 'wandb' not in sys.modules, sorted(sys.modules)\n"
             "import wandb\nprint(wandb.__version__)\n")
    run = _run(check)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip()


def test_open_clip_imports_without_transformers_and_builds_a_hugging_face_text_tower_with_it(tmp_path: Path) -> None:
    """open_clip imports transformers only for Hugging Face text towers (~1.6 CPU-s a job): a model with one (a
    one-layer BERT from a local folder, built without downloading) imports it when built and encodes text."""
    from transformers import BertConfig

    BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
               max_position_embeddings=12).save_pretrained(tmp_path / "bert")
    check = f"""
import sys
import torch
from compo.compat import import_open_clip
open_clip = import_open_clip()
assert "transformers" not in sys.modules
text_cfg = {{"hf_model_name": {str(tmp_path / "bert")!r}, "hf_model_pretrained": False, "hf_proj_type": "linear",
            "hf_pooler_type": "mean_pooler", "context_length": 12, "vocab_size": 50}}
vision_cfg = {{"image_size": 16, "patch_size": 8, "width": 16, "layers": 1, "head_width": 8}}
model = open_clip.model.CustomTextCLIP(8, vision_cfg, text_cfg)
assert "transformers" in sys.modules and isinstance(model.text, open_clip.hf_model.HFTextEncoder)
again = open_clip.model.CustomTextCLIP(8, vision_cfg, text_cfg)  # the class itself from now on
assert type(again.text) is type(model.text)
print(tuple(model.encode_text(torch.randint(1, 50, (3, 12))).shape))
"""
    run = _run(check)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "(3, 8)"
