"""The cost plan of a study on a cluster: jobs per rule, the GPUs and walltime each asks for, the GPU-hours
requested, and an estimate of what the training jobs take from measured throughput.

Training time is estimated as samples / rate, where the rate is the one measured on a GPU (this trainer,
ViT-B-32-quickgelu at 224 px, batch 256, amp, one H100: 1,002 samples/s; docs/embedded-study.md, "On a GPU"),
scaled by the model's forward FLOPs per sample relative to that model (`MODEL_GFLOPS`, counted with torch's
FlopCounterMode on one image and one full-context text; tests/test_plan.py recounts them) and by the loss's
step FLOPs relative to InfoNCE's (`LOSS_FLOP_RATIO`, counted by workflow/scripts/bench_methods.py on the
embedded models: an upper bound at ViT-B scale, where the image tower is a larger share of a step). The train
and pretrain rules ask for that estimate times `WALLTIME_MARGIN` (times the attempt, so a retry after a
timeout asks for more). Rules without a measured rate (evaluation, LLM and image shards) keep the profile's
walltime, and the plan says so. No torch here: the rules call it while the DAG is built.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

MEASURED_SAMPLES_PER_S = 1002.0     # this trainer, one H100, ViT-B-32-quickgelu, 224 px, batch 256, amp
MEASURED_MODEL = "ViT-B-32-quickgelu"
# Forward GFLOPs of one image and one full-context text (FlopCounterMode; tests/test_plan.py recounts).
MODEL_GFLOPS = {"ViT-B-32-quickgelu": 14.54, "ViT-B-16-SigLIP": 44.87}
# A step's FLOPs relative to InfoNCE's (clip-ft) on the embedded models (bench_methods.py, 2026-11-25):
# negclip 30.3 / 11.7 GFLOP with its hard images; siglip is the SigLIP base's own loss (c2lip is over it).
LOSS_FLOP_RATIO = {"infonce": 1.0, "siglip": 1.0, "negclip": 2.6, "cement": 1.38, "degla": 2.75, "fsc-clip": 2.32,
                   "c2lip": 2.18}
WALLTIME_MARGIN = 1.5
MIN_WALLTIME_MIN = 30
FALLBACK_WALLTIME_MIN = 24 * 60    # a model or loss without an estimate
GPU_RULES = ("pretrain", "train", "evaluate", "evaluate_wiseft", "wiseft", "negatives_shard",
             "negative_images_shard", "concreteplant_table")


def train_minutes(recipe: dict[str, Any], model_name: str) -> float | None:
    """Estimated minutes of a training job on one GPU of the measured kind (None: no figure for its model or
    loss). A base exported from pretrained weights (0 steps) takes no training time."""
    steps, batch = recipe.get("train", {}).get("steps", 0), recipe.get("train", {}).get("batch_size", 0)
    if steps == 0:
        return 0.0
    loss = recipe.get("loss", "infonce")
    if model_name not in MODEL_GFLOPS or loss not in LOSS_FLOP_RATIO:
        return None
    rate = MEASURED_SAMPLES_PER_S * MODEL_GFLOPS[MEASURED_MODEL] / MODEL_GFLOPS[model_name] / LOSS_FLOP_RATIO[loss]
    return steps * batch / rate / 60


def walltime_minutes(estimate: float | None, attempt: int = 1) -> int:
    """The walltime a job asks for: the estimate times the margin (and the attempt), at least MIN_WALLTIME_MIN."""
    if estimate is None:
        return FALLBACK_WALLTIME_MIN * attempt
    return int(max(MIN_WALLTIME_MIN, math.ceil(estimate * WALLTIME_MARGIN)) * attempt)


# --- reading a dry run -----------------------------------------------------------------------------------


@dataclass
class Job:
    """One job of a dry run: its rule, wildcards, resources, and the group job it runs in (None: its own)."""

    rule: str
    wildcards: dict[str, str] = field(default_factory=dict)
    resources: dict[str, str] = field(default_factory=dict)
    group: int | None = None


def _pairs(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in re.split(r",\s*", text.strip()) if "=" in part)


def parse_dry_run(output: str) -> list[Job]:
    """The jobs of `snakemake -n` output (rule blocks, with the group job each belongs to)."""
    jobs: list[Job] = []
    group, current = None, None
    groups = 0
    for line in output.splitlines():
        if re.search(r"\] Group job \S+", line):
            groups += 1
            group = groups
            continue
        match = re.match(r"^(\s*)(?:local)?rule (\w+):$", line)
        if match:
            if not match.group(1):  # a rule block at the margin is not in a group
                group = None
            current = Job(match.group(2), group=group)
            jobs.append(current)
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("wildcards: "):
            current.wildcards = _pairs(stripped[len("wildcards: "):])
        elif stripped.startswith("resources: "):
            current.resources = _pairs(stripped[len("resources: "):])
    return jobs


@dataclass
class RuleRow:
    rule: str
    jobs: int = 0
    submitted: int = 0          # SLURM jobs: a group job counts once
    gpus: int = 0               # per job (the largest)
    requested_gpu_h: float = 0.0
    estimated_gpu_h: float | None = 0.0
    longest_h: float = 0.0      # the longest walltime one submitted job asks for


def plan_rows(jobs: list[Job], estimates: dict[int, float | None]) -> list[RuleRow]:
    """Per rule: jobs, submitted jobs, GPUs, GPU-hours requested and estimated (`estimates`: job index ->
    estimated minutes, None where there is no figure; a job missing from it has no estimate either)."""
    rows: dict[str, RuleRow] = {}
    group_minutes: dict[int, float] = {}
    for index, job in enumerate(jobs):
        row = rows.setdefault(job.rule, RuleRow(job.rule))
        row.jobs += 1
        gpus = int(job.resources.get("gpu", 0) or 0)
        minutes = float(job.resources.get("runtime", 0) or 0)
        row.gpus = max(row.gpus, gpus)
        row.requested_gpu_h += gpus * minutes / 60
        if job.group is None:
            row.submitted += 1
            row.longest_h = max(row.longest_h, minutes / 60)
        else:
            group_minutes[job.group] = group_minutes.get(job.group, 0) + minutes
        estimate = estimates.get(index)
        if row.estimated_gpu_h is not None and gpus:  # minutes on one GPU: N GPUs share them (ideal scaling)
            row.estimated_gpu_h = None if estimate is None else row.estimated_gpu_h + estimate / 60
    if group_minutes:
        grouped = RuleRow("(group jobs)", submitted=len(group_minutes), longest_h=max(group_minutes.values()) / 60)
        rows[grouped.rule] = grouped
    return list(rows.values())


def format_plan(rows: list[RuleRow]) -> str:
    """The plan as a table, GPU rules first, with the totals."""
    gpu_rows = sorted((r for r in rows if r.gpus or r.rule == "(group jobs)"), key=lambda r: -r.requested_gpu_h)
    other = sorted((r for r in rows if not (r.gpus or r.rule == "(group jobs)")), key=lambda r: r.rule)
    lines = [f"{'rule':26s} {'jobs':>6s} {'submitted':>9s} {'GPUs/job':>8s} {'longest walltime':>16s} "
             f"{'GPU-h requested':>15s} {'GPU-h estimated':>15s}"]
    for row in [*gpu_rows, *other]:
        estimated = "-" if not row.gpus else "no figure" if row.estimated_gpu_h is None else \
            f"{row.estimated_gpu_h:,.0f}"
        lines.append(f"{row.rule:26s} {row.jobs or '':>6} {row.submitted:>9d} {row.gpus or '':>8} "
                     f"{row.longest_h:>15.1f}h {row.requested_gpu_h:>15,.0f} {estimated:>15s}")
    gpu_jobs = sum(r.submitted for r in rows if r.gpus and r.rule != "(group jobs)")
    gpu_jobs += next((r.submitted for r in rows if r.rule == "(group jobs)"), 0)
    requested = sum(r.requested_gpu_h for r in rows)
    lines.append(f"total: {sum(r.jobs for r in rows)} jobs, {sum(r.submitted for r in rows)} submitted, "
                 f"{gpu_jobs} asking for GPUs, {requested:,.0f} GPU-hours requested")
    return "\n".join(lines)


def job_estimate(config: dict[str, Any], job: Job) -> float | None:
    """Estimated minutes of a dry run's training job on one GPU (`train_minutes`); None for other rules."""
    from compo.config import resolve_method

    if job.rule == "train":
        recipe = resolve_method(config, job.wildcards["method"])
        return train_minutes(recipe, config["bases"][recipe["base"]]["model"])
    if job.rule == "pretrain":
        base = config["bases"][job.wildcards["base"]]
        return train_minutes(base, base["model"])
    return None


def placeholder_overlay(config: dict[str, Any], root: Any) -> dict[str, Any]:
    """A config overlay that points every missing raw input at an empty stand-in under `root`, so the DAG
    of a study can be planned before its data is downloaded (the stand-ins are never read: a dry run). A
    benchmark whose folder or files are missing gets a stand-in folder holding every file its kind reads."""
    from pathlib import Path

    from compo.evaluate.files import benchmark_files
    from compo.inputs import missing_inputs, template

    root = Path(root)
    moved, folders = [], {}
    for index, item in enumerate(missing_inputs(config)):
        parts = item.key.split(".")
        if parts[0] == "benchmarks" and parts[-1] == "path":
            folders[parts[1]] = root / f"benchmark-{parts[1]}"
            continue
        target = root / f"{index:04d}" / Path(item.path.replace("*", "0").replace("?", "0")).name
        if "folder" in item.what:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        moved.append(type(item)(item.key, str(target), item.what))
    overlay = template(moved)
    for name, folder in folders.items():
        overlay.setdefault("benchmarks", {}).setdefault(name, {})["path"] = str(folder)
        spec = {**config["benchmarks"][name], **overlay["benchmarks"][name]}
        folder.mkdir(parents=True, exist_ok=True)
        for file in benchmark_files(spec["kind"], str(folder), spec):
            if Path(file).is_relative_to(folder):
                Path(file).parent.mkdir(parents=True, exist_ok=True)
                Path(file).touch()
    return overlay


def dry_run(configfiles: list[str], profile: str | None, snakefile: str, workdir: str) -> str:
    """`snakemake -n` of the study (with stand-ins for raw inputs not downloaded yet); its output."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import yaml

    from compo.config import load_config
    from compo.inputs import STAND_INS_ENV

    config = load_config(*configfiles)
    snakemake = Path(sys.executable).parent / "snakemake"
    command = [str(snakemake) if snakemake.exists() else shutil.which("snakemake") or "snakemake", "-s", snakefile,
               "--directory", workdir, "-n", "--configfile", *configfiles]
    with tempfile.TemporaryDirectory() as stand_ins:
        overlay = placeholder_overlay(config, stand_ins)
        if overlay:
            path = Path(stand_ins) / "stand-ins.yaml"
            path.write_text(yaml.safe_dump(overlay))
            command.append(str(path))
        if profile:
            command += ["--workflow-profile", profile]
        run = subprocess.run(command, capture_output=True, text=True, check=False,
                             env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                                  STAND_INS_ENV: "1"})
    if run.returncode != 0:
        raise RuntimeError(f"the dry run failed: {(run.stdout + run.stderr).strip().splitlines()[-1]}")
    return run.stdout + run.stderr


def plan(configfiles: list[str], profile: str | None, snakefile: str, workdir: str) -> tuple[list[RuleRow], str]:
    """The plan of a study under a profile: the rows and the notes printed under them."""
    from compo.config import load_config

    config = load_config(*configfiles)
    jobs = parse_dry_run(dry_run(configfiles, profile, snakefile, workdir))
    estimates = {i: job_estimate(config, job) for i, job in enumerate(jobs)}
    rows = plan_rows(jobs, estimates)
    slow = [(j.wildcards.get("method") or j.wildcards.get("base"), minutes) for i, j in enumerate(jobs)
            if (minutes := estimates.get(i)) and minutes * WALLTIME_MARGIN > 48 * 60]
    notes = [f"estimated: {MEASURED_SAMPLES_PER_S:,.0f} samples/s measured for {MEASURED_MODEL} (this trainer, one "
             "H100, amp, batch 256), scaled by each model's and loss's FLOPs (compo.plan); evaluation, LLM and image "
             "shards have no measured figure: their walltime is the profile's, not an estimate"]
    if slow:
        worst = max(slow, key=lambda item: item[1])
        notes.append(f"{len(slow)} training job(s) estimated over 48 h on one GPU (longest: {worst[0]}, "
                     f"{worst[1] / 60:.0f} h): give rule train more GPUs in the profile (gpu: N runs torchrun)")
    return rows, "\n".join(notes)
