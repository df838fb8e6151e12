"""The cost plan: training estimates from the measured rate, walltimes with a margin, a dry run read into jobs
per rule and submitted jobs (groups counted once), and the paper study's plan under the SLURM profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from compo.config import load_config, resolve_method
from compo.plan import (
    LOSS_FLOP_RATIO,
    MEASURED_SAMPLES_PER_S,
    MODEL_GFLOPS,
    WALLTIME_MARGIN,
    Job,
    parse_dry_run,
    plan,
    plan_rows,
    train_minutes,
    walltime_minutes,
)

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "config" / "paper.yaml"


def test_training_estimates_follow_the_measured_rate() -> None:
    config = load_config(PAPER)
    clip_ft = resolve_method(config, "clip-ft")
    # clip-ft is the measured case itself: 5 epochs of COCO at batch 256 over 1,002 samples/s
    expected = clip_ft["train"]["steps"] * 256 / MEASURED_SAMPLES_PER_S / 60
    assert train_minutes(clip_ft, "ViT-B-32-quickgelu") == pytest.approx(expected)
    degla = resolve_method(config, "degla")
    assert train_minutes(degla, "ViT-B-32-quickgelu") == pytest.approx(expected * LOSS_FLOP_RATIO["degla"])
    siglip = resolve_method(config, "siglip-ft")
    ratio = MODEL_GFLOPS["ViT-B-16-SigLIP"] / MODEL_GFLOPS["ViT-B-32-quickgelu"]
    assert train_minutes(siglip, "ViT-B-16-SigLIP") == pytest.approx(19531 * 768 / MEASURED_SAMPLES_PER_S * ratio / 60)
    assert train_minutes(config["bases"]["clip"], "ViT-B-32-quickgelu") == 0.0  # exported, not trained
    assert train_minutes(clip_ft, "compo-tiny-clip") is None  # no figure for that model


def test_walltimes_carry_the_margin_and_grow_with_the_attempt() -> None:
    assert walltime_minutes(100.0) == 100 * WALLTIME_MARGIN
    assert walltime_minutes(100.0, attempt=2) == 2 * 100 * WALLTIME_MARGIN
    assert walltime_minutes(1.0) == 30 and walltime_minutes(0.0) == 30
    assert walltime_minutes(None) == 24 * 60


DRY_RUN = """\
[Wed Nov 25 15:32:30 2026]
rule train:
    wildcards: method=clip-ft, dataset=coco, seed=0
    resources: tmpdir=/tmp, mem_mb=64000, slurm_partition=gpu, runtime=71, gpu=1, tasks_per_gpu=0

[Wed Nov 25 15:32:30 2026]
rule negatives_shard:
    wildcards: dataset=coco, generator=concrete-hc, shard=3
    resources: tmpdir=/tmp, runtime=720, gpu=2, tasks_per_gpu=0

[Wed Nov 25 15:32:52 2026] Group job evaluations (jobs in lexicogr. order):

    [Wed Nov 25 15:32:52 2026]
    rule evaluate_wiseft:
        wildcards: model=wiseft-negclip-a0.5/coco/seed0
        resources: tmpdir=/tmp, runtime=60, gpu=1, gpu_slot=1
    [Wed Nov 25 15:32:52 2026]
    rule wiseft:
        wildcards: method=negclip, alpha=0.5, dataset=coco, seed=0
        resources: tmpdir=/tmp, runtime=15, gpu=1, gpu_slot=1

[Wed Nov 25 15:32:53 2026]
localrule aggregate:
    resources: tmpdir=/tmp, runtime=30
"""


def test_a_dry_run_reads_into_rules_and_submitted_jobs() -> None:
    jobs = parse_dry_run(DRY_RUN)
    assert [(j.rule, j.group) for j in jobs] == [("train", None), ("negatives_shard", None), ("evaluate_wiseft", 1),
                                                ("wiseft", 1), ("aggregate", None)]
    assert jobs[0].wildcards == {"method": "clip-ft", "dataset": "coco", "seed": "0"}
    rows = {r.rule: r for r in plan_rows(jobs, {0: 47.2})}
    assert rows["train"].requested_gpu_h == pytest.approx(71 / 60) and rows["train"].estimated_gpu_h == 47.2 / 60
    assert rows["negatives_shard"].requested_gpu_h == pytest.approx(24) and rows["negatives_shard"].gpus == 2
    assert rows["negatives_shard"].estimated_gpu_h is None  # no measured figure
    assert rows["evaluate_wiseft"].submitted == 0 and rows["(group jobs)"].submitted == 1
    assert rows["(group jobs)"].longest_h == pytest.approx(75 / 60)  # a group's members run one after another
    assert rows["aggregate"].gpus == 0 and rows["aggregate"].submitted == 1


@pytest.mark.slow
def test_the_paper_study_plan_under_the_slurm_profile(tmp_path: Path) -> None:
    """Planned before any data is downloaded (stand-ins for the raw inputs): the WiSE-FT interpolations and their
    evaluations run as tens of group jobs, the LLM shards ask for their engine's GPUs, and no training job asks
    for 24 h by default."""
    rows, notes = plan([str(PAPER)], str(REPO / "workflow" / "profiles" / "slurm"), str(REPO / "Snakefile"),
                       str(tmp_path))
    by_rule = {r.rule: r for r in rows}
    assert by_rule["evaluate_wiseft"].jobs > 100 and by_rule["evaluate_wiseft"].submitted == 0
    assert by_rule["wiseft"].submitted == 0 and 10 <= by_rule["(group jobs)"].submitted < 100
    config = load_config(PAPER)
    tp = {n: s.get("vllm", {}).get("tensor_parallel_size", 1) for n, s in config["negatives"].items()
          if s.get("backend") == "vllm"}
    assert by_rule["negatives_shard"].gpus == max(tp.values())
    assert by_rule["train"].estimated_gpu_h and by_rule["train"].longest_h < 48
    assert "1,002 samples/s measured" in notes


def test_the_profiles_leave_training_walltimes_to_the_plan() -> None:
    for name in ("slurm", "slurm-test"):
        profile = yaml.safe_load((REPO / "workflow" / "profiles" / name / "config.yaml").read_text())
        for rule in ("train", "pretrain"):
            assert "runtime" not in profile["set-resources"].get(rule, {}), (name, rule)
        assert "gpu" not in profile["set-resources"]["negatives_shard"], name  # the rule asks for the engine's GPUs


@pytest.mark.slow
def test_the_flop_table_matches_the_models() -> None:
    """MODEL_GFLOPS recounted: one image and one full-context text through each tower, forward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from compo.models import model_config, open_clip

    for name, gflops in MODEL_GFLOPS.items():
        model = open_clip().create_model(name)
        size = model.visual.image_size
        size = size[0] if isinstance(size, tuple | list) else size
        context = model_config(name)["text_cfg"].get("context_length", 77)
        with FlopCounterMode(display=False) as image:
            model.encode_image(torch.zeros(1, 3, size, size))
        with FlopCounterMode(display=False) as text:
            model.encode_text(torch.zeros(1, context, dtype=torch.long))
        assert (image.get_total_flops() + text.get_total_flops()) / 1e9 == pytest.approx(gflops, abs=0.01), name


def test_jobs_of_rules_without_wildcards_parse() -> None:
    assert parse_dry_run("rule all:\n    resources: tmpdir=/tmp\n") == [Job("all", {}, {"tmpdir": "/tmp"})]
