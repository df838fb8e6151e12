"""Every workflow profile names only rules the workflow has (issue 12.6): a `set-resources` or
`set-threads` entry for a rule that does not exist is silently ignored by Snakemake, so its jobs would
run without the GPU or memory the entry meant to give them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # asks the real Snakemake for the rule names

PROFILES = sorted((Path(__file__).resolve().parents[1] / "workflow" / "profiles").glob("*/config.yaml"))


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory, run_snakemake) -> set[str]:
    """The rule names of the workflow under the default config (as `snakemake --list-rules` prints them)."""
    run = run_snakemake(tmp_path_factory.mktemp("rules"), "--list-rules")
    assert run.returncode == 0, run.stderr[-2000:]
    names = {line.split()[0] for line in run.stdout.splitlines() if line and not line[0].isspace()}
    assert {"train", "evaluate", "negatives_shard", "all"} <= names
    return names


@pytest.mark.parametrize("profile", PROFILES, ids=[p.parent.name for p in PROFILES])
def test_profile_names_only_rules_of_the_workflow(profile: Path, rules: set[str]) -> None:
    config = yaml.safe_load(profile.read_text())
    for section in ("set-resources", "set-threads"):
        unknown = sorted(set(config.get(section) or {}) - rules)
        assert not unknown, f"{profile}: {section} names no rule of the workflow: {unknown}"


@pytest.mark.parametrize("name", ["slurm", "slurm-test"])
def test_llm_shards_get_a_gpu_and_memory(name: str) -> None:
    profile = Path(__file__).resolve().parents[1] / "workflow" / "profiles" / name / "config.yaml"
    shard = yaml.safe_load(profile.read_text())["set-resources"]["negatives_shard"]
    assert "gpu" not in shard and shard["mem_mb"] >= 4000  # the rule asks for its engine's GPUs


def test_every_job_of_the_default_study_fits_the_local_memory_cap() -> None:
    """The local profile caps the summed mem_mb of running jobs (the study's 4 GB budget): a job asking for
    more than the cap alone could never start, and two of the heaviest fine-tunes must not fit together."""
    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "workflow" / "profiles" / "local" / "config.yaml").read_text())
    train = yaml.safe_load((repo / "config" / "config.yaml").read_text())["memory_mb"]["train"]
    cap = profile["resources"]["mem_mb"]
    asked = {"default": profile["default-resources"]["mem_mb"],
             **{rule: spec["mem_mb"] for rule, spec in profile["set-resources"].items()},
             **{f"train {method}": mem_mb for method, mem_mb in train.items()}}
    assert "train" not in profile["set-resources"], "it would override config memory_mb.train"
    assert max(asked.values()) <= cap, asked
    assert 2 * max(train.values()) > cap
