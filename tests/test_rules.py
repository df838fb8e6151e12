"""The rules declare exactly what their jobs read (issue 13.5) and build the DAG without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # dry runs of the real Snakemake


def _job_inputs(run_snakemake, workdir: Path, target: str) -> str:
    """The dry run's `input:` line of the job that makes `target`."""
    run = run_snakemake(workdir, "-n", "-p", target)
    assert run.returncode == 0, run.stderr[-2000:]
    blocks = run.stdout.split("\n\n")
    block = next(b for b in blocks if f"output: {target}" in b or f", {target}" in b and "output:" in b)
    return next(line for line in block.splitlines() if line.strip().startswith("input:"))


def test_train_jobs_read_only_what_their_loss_needs(tmp_path: Path, run_snakemake) -> None:
    plain = _job_inputs(run_snakemake, tmp_path, "results/models/clip-ft/coco/seed0/checkpoint.pt")
    assert "concreteness" not in plain and "parse" not in plain and "negatives" not in plain
    online = _job_inputs(run_snakemake, tmp_path, "results/models/fsc-clip/coco/seed0/checkpoint.pt")
    assert "results/parse/coco.parquet" in online and "concreteness" not in online
    pairs = _job_inputs(run_snakemake, tmp_path, "results/models/slipform/coco/seed0/checkpoint.pt")
    assert "results/negatives/coco/concrete-hc.parquet" in pairs
    assert "results/negatives/coco/concrete-hc," in pairs + "," and "concreteness" not in pairs


def test_a_fine_tuning_job_asks_for_its_methods_memory(tmp_path: Path, run_snakemake, repo: Path) -> None:
    import yaml

    memory = yaml.safe_load((repo / "config" / "config.yaml").read_text())["memory_mb"]["train"]
    run = run_snakemake(tmp_path, "-n", "results/models/c2lip/coco/seed0/checkpoint.pt",
                        "results/models/clip-ft/coco/seed0/checkpoint.pt")
    assert run.returncode == 0, run.stderr[-2000:]
    jobs = [job for job in run.stdout.split("\nrule ") if job.startswith("train:")]
    blocks = {job.split("output: ")[1].split("/coco/")[0]: job for job in jobs}
    assert f"mem_mb={memory['c2lip']}," in blocks["results/models/c2lip"]
    assert "clip-ft" not in memory and f"mem_mb={memory['default']}," in blocks["results/models/clip-ft"]


def test_each_seed_fine_tunes_and_interpolates_the_base_it_is_laid_out_on(tmp_path: Path, run_snakemake) -> None:
    """study.base_seeds [0, 1]: seed 1 starts from (and WiSE-FT returns to) base seed 1; the study evaluates
    both bases, and the statistics rules are given the layout."""
    config = tmp_path / "bases.yaml"
    config.write_text("study: {base_seeds: [0, 1], seeds: [0, 1, 2, 3]}\n")
    for seed in (0, 1):
        trained = _job_inputs(run_snakemake_with(run_snakemake, config), tmp_path,
                              f"results/models/clip-ft/coco/seed{seed}/checkpoint.pt")
        assert f"results/models/base-clip/pretrain/seed{seed}/checkpoint.pt" in trained
        assert f"base-clip/pretrain/seed{1 - seed}/" not in trained
    interpolated = _job_inputs(run_snakemake_with(run_snakemake, config), tmp_path,
                               "results/models/wiseft-negclip-a0.4/coco/seed1/checkpoint.pt")
    assert "results/models/base-clip/pretrain/seed1/checkpoint.pt" in interpolated
    run = run_snakemake(tmp_path, "-n", "-p", "results/tables/claims.md", configs=[config])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "results/eval/base-clip/pretrain/seed1/sugarcrepe.json" in run.stdout
    assert "--base-seeds '[0, 1]'" in run.stdout


def test_the_claims_job_gets_the_kinds_of_effect_in_the_configs_order(tmp_path: Path, run_snakemake,
                                                                        repo: Path) -> None:
    """effects.csv and claims.md list the kinds as the config does (binding first), not sorted by name."""
    import json
    import shlex

    import yaml

    kinds = list(yaml.safe_load((repo / "config" / "config.yaml").read_text())["effects"])
    run = run_snakemake(tmp_path, "-n", "-p", "results/tables/claims.md")
    assert run.returncode == 0, run.stderr[-2000:]
    command = shlex.split(next(line for line in run.stdout.splitlines() if "compo claims" in line))
    given = json.loads(command[command.index("--effects") + 1])
    assert [kind for kind, _ in given] == kinds and kinds != sorted(kinds)


def test_the_tables_read_one_evaluation_index_a_model(tmp_path: Path, run_snakemake) -> None:
    """aggregate reads each model's `_evaluated.json`, not its benchmark files (one DAG edge a model: the paper
    DAG's ~46,000 edges were most of its dry-run time), and an evaluation job reads its set's record of the
    benchmark files (rule benchmark_set), which reads the files."""
    aggregate = _job_inputs(run_snakemake, tmp_path, "results/tables/results.md").split("input:")[1].split(",")
    assert len(aggregate) > 20 and all(path.strip().endswith("/_evaluated.json") for path in aggregate), aggregate
    evaluate = _job_inputs(run_snakemake, tmp_path, "results/eval/negclip/coco/seed0/_evaluated.json")
    assert evaluate.split("input:")[1].split(", ") == [" results/models/negclip/coco/seed0/checkpoint.pt",
                                                       "results/benchmarks/sets/study.json"], evaluate
    record = _job_inputs(run_snakemake, tmp_path, "results/benchmarks/sets/study.json")
    assert "results/benchmarks/world/sugarcrepe/swap_att.json" in record


def run_snakemake_with(run_snakemake, config: Path):
    """`run_snakemake` with one more config file loaded after the default."""
    return lambda workdir, *args: run_snakemake(workdir, *args, configs=[config])


def test_building_the_dag_imports_no_torch(repo: Path) -> None:
    """What common.smk imports and runs while Snakemake parses the workflow: neither torch nor scipy (the
    claims' numerics), each about a second to import, paid by every dry run and every cluster job."""
    code = ("import sys; from compo.config import load_config; import compo.layout, compo.losses, "
            "compo.evaluate.files, compo.claim_specs, compo.data; load_config('config/config.yaml'); "
            "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
