"""docs/adding-a-method.md stays true: its worked example, built from the guide's own code blocks in a copy of
the repository, registers itself, passes its test file and dry-runs with the study, touching only the files
the guide names."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compo.losses import discover

pytestmark = pytest.mark.slow  # a copy of the repository, a pytest run and a Snakemake dry run

GUIDE = "docs/adding-a-method.md"
# ```python file=PATH / ```yaml config=KEY: the blocks the guide asks the newcomer to write
BLOCK = re.compile(r"^```(\w+) (file|config)=(\S+)\n(.*?)^```$", re.S | re.M)


def guide_blocks(repo: Path, guide: str = GUIDE) -> list[tuple[str, str, str]]:
    """(kind, target, text) of every tagged code block of the guide, in order."""
    return [(kind, target, text) for _, kind, target, text in BLOCK.findall((repo / guide).read_text())]


def copy_repository(repo: Path, to: Path) -> None:
    for name in ("Snakefile", "pyproject.toml"):
        shutil.copy2(repo / name, to / name)
    for name in ("workflow", "config", "envs"):
        shutil.copytree(repo / name, to / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (to / "tests").mkdir()
    for name in ("conftest.py", "helpers.py", "test_losses.py"):
        shutil.copy2(repo / "tests" / name, to / "tests" / name)


def follow_the_guide(repo: Path, copy: Path, guide: str = GUIDE) -> list[str]:
    """Write the guide's files and config entries into `copy`; the paths it wrote. A `config=a.b` block is added to
    that key of config.yaml: a mapping's entries updated, a list's items appended."""
    config_path = copy / "config" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    written = []
    for kind, target, text in guide_blocks(repo, guide):
        if kind == "file":
            (copy / target).parent.mkdir(parents=True, exist_ok=True)
            (copy / target).write_text(text)
            written.append(target)
            continue
        *parents, key = target.split(".")
        section = config
        for name in parents:
            section = section.get(name, {})
        value = yaml.safe_load(text)
        if isinstance(section.get(key), dict) and isinstance(value, dict):
            section[key].update(value)
        elif isinstance(section.get(key), list) and isinstance(value, list):
            section[key] += value
        else:
            pytest.fail(f"{guide}: a block for config={target}, which config.yaml has no mapping or list at")
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return [*written, "config/config.yaml"]


def run(copy: Path, *command: str) -> subprocess.CompletedProcess:
    """`command` in the copy, its `compo` package first on the path (before this checkout's)."""
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PYTHONPATH=str(copy / "workflow"), PATH=f"{bin_dir}:{os.environ['PATH']}")
    return subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, check=False)


def test_the_guides_worked_example_builds_tests_and_dry_runs(repo: Path, tmp_path: Path) -> None:
    blocks = guide_blocks(repo)
    assert {(kind, target) for kind, target, _ in blocks} >= {
        ("file", "workflow/compo/losses/triplet.py"), ("file", "tests/test_triplet_margin.py"),
        ("config", "methods"), ("config", "claims")}
    copy = tmp_path / "repo"
    copy.mkdir()
    copy_repository(repo, copy)
    written = follow_the_guide(repo, copy)
    # one module, one test file and config.yaml: the module registers itself (no registry list edited)
    assert sorted(written) == ["config/config.yaml", "tests/test_triplet_margin.py", "workflow/compo/losses/triplet.py"]
    declared = discover(copy / "workflow" / "compo" / "losses")
    assert declared["triplet-margin"].module == "triplet" and declared["triplet-margin"].needs == {"negatives"}

    # config/README's key table from the declaration, by the command the guide names
    keys = run(copy, "compo", "loss-keys", "--write", "config/README.md")
    assert keys.returncode == 0, keys.stderr
    assert "| `methods.<name>.triplet_margin` | triplet-margin: the hinge's margin m" in (
        copy / "config" / "README.md").read_text()

    # the guide's test file, and the contract test of every registered loss (the new one on its recipe)
    tests = run(copy, sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_triplet_margin.py",
                "tests/test_losses.py", "-k", "triplet or every_registered or declarations")
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "test_every_registered_loss_returns_named_scalar_terms_summed_into_loss[triplet-margin] PASSED" in (
        tests.stdout)
    assert "test_triplet_margin.py::test_hinge_matches_the_loop_values_and_gradients PASSED" in tests.stdout

    # the study with it, and the claim that compares it: the config check passes and it trains
    dry = run(copy, "snakemake", "-n", "-p", "--cores", "1", "results/tables/claims.md")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "results/models/triplet-margin/coco/seed0/checkpoint.pt" in dry.stdout
    assert "results/eval/triplet-margin/coco/seed0/sugarcrepe.json" in dry.stdout

    # a bad margin is refused at DAG build, naming the key
    config = yaml.safe_load((copy / "config" / "config.yaml").read_text())
    config["methods"]["triplet-margin"]["triplet_margin"] = -1
    (copy / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    refused = run(copy, "snakemake", "-n", "--cores", "1")
    assert refused.returncode != 0
    assert "config key methods.triplet-margin.triplet_margin: -1 is less than the minimum of 0" in refused.stderr
