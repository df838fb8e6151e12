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


def test_open_clip_imports_timm_without_wandb_and_wandb_still_imports_after() -> None:
    """timm imports wandb when installed (~0.3 CPU-s a job); a job that reports to wandb imports it itself."""
    check = ("import sys\nfrom compo.compat import import_open_clip\nimport_open_clip()\n"
             "assert 'timm' in sys.modules and 'wandb' not in sys.modules, sorted(sys.modules)\n"
             "import wandb\nprint(wandb.__version__)\n")
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False,
                         env={"PYTHONPATH": str(REPO / "workflow"), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip()
