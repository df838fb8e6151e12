"""The cost plan: every GPU job's estimate from the config (training from the measured H200 rate and each recipe's
FLOPs, LLM shards from their tokens, SDXL shards from their images, evaluations from their images), walltimes
with a margin, a dry run read into jobs per rule and submitted jobs (groups once, local rules not at all), and the
paper study's plan under the SLURM profile, which README shows."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from compo.config import resolve_method
from compo.memory import PARAMETERS
from compo.plan import (
    DECODE_MS,
    EFFECTIVE_TFLOPS,
    IMAGE_GFLOPS,
    JOB_OVERHEAD_MIN,
    LLM_TOKENS_PER_S,
    PNG_BYTES_512,
    PROMPT_TOKENS,
    README_BEGIN,
    README_END,
    SDXL_IMAGE_STEPS_PER_S,
    TAR_MEMBER_BYTES,
    WALLTIME_MARGIN,
    Job,
    benchmark_size,
    dataset_captions,
    eval_minutes,
    image_shard_minutes,
    job_minutes,
    job_writes,
    llm_shard_minutes,
    local_rules,
    parse_dry_run,
    partition_note,
    plan,
    plan_rows,
    readme_section,
    runtime_minutes,
    step_gflops,
    text_gflops,
    train_minutes,
    walltime_minutes,
)

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "config" / "paper.yaml"
B32 = "ViT-B-32-quickgelu"


def test_training_estimates_follow_the_measured_rate_and_the_recipes_flops(paper: dict) -> None:
    clip_ft = resolve_method(paper, "clip-ft")
    # clip-ft: one image and one 77-token text a sample, forward and backward (3 forwards) at 78.5 TFLOP/s on an H200
    per_sample = 3 * (IMAGE_GFLOPS[B32] + text_gflops(B32, 77))
    assert step_gflops(clip_ft, B32) == pytest.approx(per_sample)
    compute = clip_ft["train"]["steps"] * 256 * per_sample / (EFFECTIVE_TFLOPS * 1e3) / 60
    assert train_minutes(clip_ft, B32, "h200") == pytest.approx(compute + JOB_OVERHEAD_MIN)
    assert train_minutes(clip_ft, B32) == pytest.approx(2 * compute + JOB_OVERHEAD_MIN)  # no GPU named: an A100's 0.5
    ratio = {m: step_gflops(resolve_method(paper, m), B32) / per_sample
             for m in ("negclip", "cement", "fsc-clip", "longclip", "lss", "degla", "degla-cn")}
    # 2N images and 2N texts a step, not 1.38x; accum_freq 2: 4 forwards, not 3 (the no-grad feature pass)
    assert ratio["cement"] == pytest.approx(2.0 * 4 / 3)
    assert ratio["lss"] == pytest.approx(1.0) and 1.85 < ratio["longclip"] * 3 / 4 < 2.0   # 248 tokens: ~1.9x
    image, text = IMAGE_GFLOPS[B32], text_gflops(B32, 77)
    assert ratio["negclip"] == pytest.approx(2 * (image + 2 * text) / (image + text))   # hard images' rows, k 1
    assert ratio["fsc-clip"] == pytest.approx((image + 4 * text) / (image + text))     # 3 online negatives
    assert ratio["degla"] == pytest.approx(ratio["degla-cn"] * 4 / 3)   # the EMA teacher's forward
    siglip = resolve_method(paper, "siglip-ft")
    assert train_minutes(siglip, "ViT-B-16-SigLIP", "h200") > 10 * train_minutes(clip_ft, B32, "h200")
    assert train_minutes(paper["bases"]["clip"], B32) == JOB_OVERHEAD_MIN  # exported, not trained
    assert train_minutes(clip_ft, "compo-tiny-clip") is None  # no figure for that model


def test_llm_image_and_evaluation_estimates_from_their_counts(paper: dict) -> None:
    coco = dataset_captions(paper["datasets"]["coco"])
    assert coco == 414_113 and dataset_captions(paper["datasets"]["cc3m-100k"]) == 100_000
    degla = paper["negatives"]["degla-llm"]
    tokens = coco / 16 * 4 * (PROMPT_TOKENS["degla-llm"] + 96)
    rate = LLM_TOKENS_PER_S[("meta-llama/Llama-3.1-8B-Instruct", "vllm")]
    assert llm_shard_minutes(degla, coco, "h100") == pytest.approx(tokens / rate / 60 + JOB_OVERHEAD_MIN)
    assert llm_shard_minutes({**degla, "model": "org/unknown"}, coco) is None
    images = paper["negatives"]["concrete-hc"]     # 4 steps at strength 0.9: 3 denoising steps an image
    assert image_shard_minutes(images, coco, "h200") == pytest.approx(
        coco / 16 * 3 / SDXL_IMAGE_STEPS_PER_S / 60 + JOB_OVERHEAD_MIN)
    probe = {"kind": "linear_probe", "format": "cifar10"}   # 50,000 train + 10,000 test images, one fit
    # threads 2: one decode worker (one CPU feeds the GPU); threads 5: four
    one, four = eval_minutes({"probe": probe}, B32, 2, "h200"), eval_minutes({"probe": probe}, B32, 5, "h200")
    assert one == pytest.approx(60_000 * DECODE_MS["jpeg 640x480"] / 1e3 / 60 + 1.0 + JOB_OVERHEAD_MIN)
    assert eval_minutes({"probe": probe}, B32, 1, "h200") == pytest.approx(one)   # one CPU: the process decodes
    fixed = 1.0 + JOB_OVERHEAD_MIN   # the fit and the start-up
    assert four - fixed == pytest.approx((one - fixed) / 4)   # decode workers are the bound
    # a real benchmark the plan cannot size is an error naming it, not a silent 0 (a world one has no figure)
    with pytest.raises(ValueError, match="benchmark 'odd' .*kind 'zeroshot'.*no size figure"):
        eval_minutes({"odd": {"kind": "zeroshot", "source": "files", "dataset": "unknown"}}, B32)
    with pytest.raises(ValueError, match="benchmark 'new' .*kind 'mmvp_vlm'"):
        eval_minutes({"new": {"kind": "mmvp_vlm", "source": "files"}}, B32)
    assert eval_minutes({"w": {"kind": "zeroshot", "source": "world"}}, B32) is None
    # ImageInWords: IIW-400's 400 images; the union with DOCCI_Test and DCI_Test FLAIR / LoTLIP score, 612
    iiw = paper["benchmarks"]["iiw_retrieval"]
    assert benchmark_size(iiw).images == 400
    assert benchmark_size({**iiw, "subsets": ["IIW-400", "DOCCI_Test", "DCI_Test"]}).images == 612
    # every benchmark of the paper study has a figure; the rules ask for these through job_minutes
    assert job_minutes(paper, "evaluate", {"model": "negclip/coco/seed0"}) > 60
    assert job_minutes(paper, "wiseft", {"method": "negclip"}) < 5


def test_fsc_clip_benchmarks_are_sized_at_their_releases(paper: dict) -> None:
    """Issue 47: FSC-CLIP's sets count their release's images and texts (../shared/benchmarks/README.md), ELEVATER's
    tasks their test splits, every real benchmark of paper.yaml has a figure, and texts cost their forward."""
    from compo.architectures import text_context_length
    from compo.evaluate.eqben import RELEASED_SUBSETS as EQBEN_SUBSETS

    sizes = {name: benchmark_size(spec, name) for name, spec in paper["benchmarks"].items()}   # none raises
    assert sizes["imagecode"][:2] == (1_039 * 10, 2_302)
    assert sizes["svo_probes"][:2] == (2 * 22_162, 22_162)
    assert sizes["coco_counterfactuals"][:2] == (10_446, 10_446)    # FSC-CLIP's 30% of 17,410: 5,223 examples
    capped = sum(min(n, 20_000) for n in EQBEN_SUBSETS.values())   # AG and YouCook2 cut to 20,000 pairs
    assert sizes["eqben"][:2] == (2 * capped, 2 * capped) and capped == 49_327
    assert sizes["spec"][:2] == (15_000, 15_000)
    assert sizes["whatsup"].images == 412 + 408 + 2_247 + 440 + 1_160 + 291
    assert benchmark_size({**paper["benchmarks"]["vl_checklist"], "max_num": 2000}).images == 56 * 1_000
    assert sizes["elevater_imagenet"].images == 50_000 and sizes["elevater_country211"].images == 21_100
    assert sizes["elevater_cifar10"] == sizes["cifar10"]   # by format: the same test split
    # texts: their forward at the model's context, on top of the images' decode
    spec = {"imagecode": paper["benchmarks"]["imagecode"]}
    decode = 10_390 * DECODE_MS["jpeg 640x480"] / 1e3 / 60   # threads 1: the process decodes
    texts = 2_302 * text_gflops(B32, text_context_length(B32)) / (EFFECTIVE_TFLOPS * 1e3) / 60
    assert eval_minutes(spec, B32, 1, "h200") == pytest.approx(decode + texts + JOB_OVERHEAD_MIN)
    # the WiSE-FT models keep Figure 4's axes: every configured member of fsc-comp and fsc-zs
    wiseft = set(paper["wiseft"]["benchmarks"])
    for composite in ("fsc-comp", "fsc-zs"):
        members = {entry.split("/")[0] for entry in paper["composites"][composite]} - {"composite"}
        assert members & set(paper["benchmarks"]) <= wiseft
    assert {"aro_relation", "aro_attribution", "coco_order", "flickr_order"} <= wiseft   # composite/aro's
    assert set(paper["wiseft"]["benchmarks"]) <= set(paper["study"]["benchmarks"])


def test_image_shards_write_one_tar_each_or_a_png_each(paper: dict) -> None:
    """negatives.<name>.images.format: tar (default) writes a shard job's PNGs as one file; png one file each."""
    wildcards = {"generator": "concrete-hc", "dataset": "coco"}
    per_shard = dataset_captions(paper["datasets"]["coco"]) / paper["negatives"]["concrete-hc"]["images"]["shards"]
    assert job_writes(paper, "negative_images_shard", wildcards) == pytest.approx(
        (per_shard * (PNG_BYTES_512 + TAR_MEMBER_BYTES), 3))  # the tar, the rows, the report
    pngs = copy.deepcopy(paper)
    pngs["negatives"]["concrete-hc"]["images"]["format"] = "png"
    disk, files = job_writes(pngs, "negative_images_shard", wildcards)
    assert disk == pytest.approx(per_shard * PNG_BYTES_512) and files == math.ceil(per_shard) + 2 > 25_000


def test_prompt_tokens_match_the_templates() -> None:
    """PROMPT_TOKENS: the prompt templates at ~4 characters a token (a COCO caption in them)."""
    from compo.llm.prompts import DEGLA_RULES, concreteplant_prompt, degla_prompt

    caption = "A man riding a red bicycle down a city street next to parked cars."
    degla = max(len(degla_prompt(caption, t)) for t in DEGLA_RULES) / 4
    assert degla == pytest.approx(PROMPT_TOKENS["degla-llm"], rel=0.3)
    concrete = len(concreteplant_prompt(caption, "red", "attribute", "hc")) / 4
    assert concrete == pytest.approx(PROMPT_TOKENS["concreteplant-hc"], rel=0.3)


def test_walltimes_carry_the_margin_and_grow_with_the_attempt() -> None:
    assert walltime_minutes(100.0) == 100 * WALLTIME_MARGIN
    assert walltime_minutes(100.0, attempt=2) == 2 * 100 * WALLTIME_MARGIN
    assert walltime_minutes(1.0) == 10 and walltime_minutes(JOB_OVERHEAD_MIN) <= 2 * JOB_OVERHEAD_MIN
    assert walltime_minutes(None) == 24 * 60


def test_a_retry_never_asks_past_the_partitions_limit() -> None:
    """siglip-ft on one A100 before issue 56: 20.3 / 40.7 / 61.0 h on attempts 1-3; under a 48 h max_runtime the
    third asks for 48 h (the job resumes from its checkpoint), and so does a job without an estimate."""
    estimate = 1220 / WALLTIME_MARGIN
    assert [walltime_minutes(estimate, attempt) for attempt in (1, 2, 3)] == [1220, 2440, 3660]
    assert [walltime_minutes(estimate, attempt, 2880) for attempt in (1, 2, 3)] == [1220, 2440, 2880]
    assert walltime_minutes(None, 3, 2880) == 2880 and walltime_minutes(10_000.0, 1, 2880) == 2880


def test_partition_limits_read_as_profiles_and_slurm_write_them() -> None:
    assert [runtime_minutes(v) for v in (2880, "2880", "48h", "2d", "2880m", "2-00:00:00", "2-0", "48:00:00",
                                         "1-12:30")] == [2880] * 8 + [2190]
    assert runtime_minutes(None) is None
    for bad in ("48 hours", "0", "1:30", -5, True, "infinite"):  # SLURM's MM:SS is refused: easily read as H:MM
        with pytest.raises(ValueError, match=r"set-resources.train.max_runtime: .* is not a walltime"):
            runtime_minutes(bad, "set-resources.train.max_runtime")


def test_the_plan_names_the_jobs_that_need_a_longer_partition() -> None:
    jobs = [Job("train", {"method": m, "dataset": "cc3m", "seed": "0"}, {"gpu": "1", "max_runtime": "48h"})
            for m in ("siglip-ft", "siglip-ft", "clip-ft")]
    jobs.append(Job("evaluate", {"model": "clip-ft/coco/seed0"}, {"gpu": "1", "max_runtime": "48h"}))
    estimates = {0: 40 * 60.0, 1: 40 * 60.0, 2: 60.0, 3: None}  # 40 h: 56 h asked on a first attempt (x 1.4)
    note = partition_note(jobs, estimates)
    assert note.startswith("retries ask for attempt x the first walltime, at most the profile's max_runtime (48 h)")
    assert "2 job(s) would need a longer partition: train siglip-ft (2 jobs, 56 h asked of 48)" in note
    assert "clip-ft" not in note and "evaluate" not in note
    assert partition_note(jobs[2:], {0: 60.0, 1: None}).endswith("every first attempt fits it")
    unnamed = [Job(j.rule, j.wildcards, {"gpu": "1"}) for j in jobs]
    assert "names no max_runtime" in partition_note(unnamed, estimates)
    assert "train siglip-ft (2 jobs, 56 h asked of 48)" in partition_note(unnamed, estimates)


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
    jobs = parse_dry_run(DRY_RUN, local={"aggregate"})
    assert [(j.rule, j.group) for j in jobs] == [("train", None), ("negatives_shard", None), ("evaluate_wiseft", 1),
                                                ("wiseft", 1), ("aggregate", None)]
    assert jobs[0].wildcards == {"method": "clip-ft", "dataset": "coco", "seed": "0"}
    rows = {r.rule: r for r in plan_rows(jobs, {0: 47.2, 1: 300.0}, {0: (6e8, 5)})}
    assert rows["train"].requested_gpu_h == pytest.approx(71 / 60) and rows["train"].estimated_gpu_h == 47.2 / 60
    assert rows["train"].disk_bytes == 6e8 and rows["train"].files == 5
    assert rows["negatives_shard"].requested_gpu_h == pytest.approx(24) and rows["negatives_shard"].gpus == 2
    assert rows["negatives_shard"].estimated_gpu_h == pytest.approx(10)   # 2 GPUs x 5 h
    assert rows["evaluate_wiseft"].estimated_gpu_h is None  # no estimate given
    assert rows["evaluate_wiseft"].submitted == 0 and rows["(group jobs)"].submitted == 1
    assert rows["(group jobs)"].longest_h == pytest.approx(75 / 60)  # a group's members run one after another
    assert rows["aggregate"].gpus == 0 and rows["aggregate"].submitted == 0  # a local rule is not submitted


def test_local_rules_are_read_from_the_snakefile() -> None:
    assert {"all", "aggregate", "negatives_gather"} <= local_rules(str(REPO / "Snakefile"))
    assert "train" not in local_rules(str(REPO / "Snakefile")) and "rule" not in local_rules(str(REPO / "Snakefile"))


@pytest.fixture(scope="module")
def paper_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    return plan([str(PAPER)], str(REPO / "workflow" / "profiles" / "slurm"), str(REPO / "Snakefile"),
                str(tmp_path_factory.mktemp("plan")))


@pytest.mark.slow
def test_the_paper_study_plan_under_the_slurm_profile(paper_plan: tuple, paper: dict) -> None:
    """Planned before any data is downloaded (stand-ins for the raw inputs): every GPU rule asks for at most
    2x its estimated GPU-hours, WiSE-FT interpolations run on the CPU inside tens of group jobs, the LLM shards
    ask for their engine's GPUs, local rules are not submitted, and README shows this very plan."""
    rows, notes = paper_plan
    by_rule = {r.rule: r for r in rows}
    for row in rows:
        if row.gpus:
            assert row.estimated_gpu_h and row.requested_gpu_h <= 2 * row.estimated_gpu_h, row
    trajectories = len(paper["wiseft"]["methods"]) * len(paper["study"]["seeds"])
    assert by_rule["evaluate_wiseft"].jobs == trajectories * len(paper["wiseft"]["alphas"])
    assert by_rule["evaluate_wiseft"].submitted == 0
    assert by_rule["wiseft"].gpus == 0 and by_rule["wiseft"].submitted == 0
    assert by_rule["(group jobs)"].submitted == trajectories  # one job a trajectory: its 11 models in turn
    tp = {n: s.get("vllm", {}).get("tensor_parallel_size", 1) for n, s in paper["negatives"].items()
          if s.get("backend") == "vllm"}
    assert by_rule["negatives_shard"].gpus == max(tp.values())
    assert by_rule["aggregate"].submitted == 0 and by_rule["all"].submitted == 0
    # format tar: a shard job's PNGs are one tar (+ its rows and report), not a file each (248,448 before)
    images = by_rule["negative_images_shard"]
    assert images.files == 3 * images.jobs and images.disk_bytes > 100e9
    assert "2,680.8 samples/s measured" in notes and "ASSUMPTION" in notes
    readme = (REPO / "README.md").read_text()
    block = readme.split(README_BEGIN)[1].split(README_END)[0].strip("\n").rstrip()
    assert block == readme_section(rows, notes), (
        "README's plan is stale: compo plan --configfile config/paper.yaml --profile workflow/profiles/slurm "
        "--write-readme README.md")


def test_the_profiles_leave_gpu_walltimes_to_the_plan() -> None:
    for name in ("slurm", "slurm-test"):
        profile = yaml.safe_load((REPO / "workflow" / "profiles" / name / "config.yaml").read_text())
        rules = ("train", "pretrain", "negatives_shard", "negative_images_shard", "evaluate", "evaluate_wiseft",
                 "wiseft")
        for rule in rules:
            assert "runtime" not in profile["set-resources"].get(rule, {}), (name, rule)
        assert "gpu" not in profile["set-resources"]["negatives_shard"], name  # the rule asks for the engine's GPUs
        assert "gpu" not in profile["set-resources"]["wiseft"], name  # a CPU weight average


@pytest.mark.slow
def test_the_flop_table_matches_the_models() -> None:
    """IMAGE_GFLOPS and compo.memory.PARAMETERS recounted, and text_gflops' projections against FlopCounterMode at the
    model's context (which does not count the attention's scores: the formula's 4 L d term)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from compo.architectures import model_config as config_of
    from compo.models import open_clip

    for name, gflops in IMAGE_GFLOPS.items():
        model = open_clip().create_model(name)
        size = model.visual.image_size
        size = size[0] if isinstance(size, tuple | list) else size
        text = config_of(name)["text_cfg"]
        context, width, layers = text.get("context_length", 77), text["width"], text["layers"]
        with FlopCounterMode(display=False) as image:
            model.encode_image(torch.zeros(1, 3, size, size))
        with FlopCounterMode(display=False) as counted:
            model.encode_text(torch.zeros(1, context, dtype=torch.long))
        assert image.get_total_flops() / 1e9 == pytest.approx(gflops, abs=0.01), name
        attention = layers * 4 * context**2 * width / 1e9
        assert counted.get_total_flops() / 1e9 == pytest.approx(text_gflops(name, context) - attention, rel=0.01)
        assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name], name


def test_jobs_of_rules_without_wildcards_parse() -> None:
    assert parse_dry_run("rule all:\n    resources: tmpdir=/tmp\n") == [Job("all", {}, {"tmpdir": "/tmp"})]


def test_a_local_run_is_planned_in_cpu_minutes_and_disk_not_gpu_hours(tmp_path: Path) -> None:
    """The default study under the local profile (or none): no walltimes, no GPU-hours; the CPU minutes its last
    run measured, per rule, from the jobs' timing files."""
    from compo.plan import RuleRow, format_local_plan, is_local_run, local_notes, measured_cpu_minutes

    assert is_local_run(None) and is_local_run(str(REPO / "workflow" / "profiles" / "local"))
    assert not is_local_run(str(REPO / "workflow" / "profiles" / "slurm"))
    rows = [RuleRow("train", jobs=2, cpus=1, disk_bytes=2e6, files=4), RuleRow("claims", jobs=1)]
    assert "No run measured yet" in local_notes(rows, tmp_path / "results")
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for path, cpu in (("train/negclip/coco/seed0.tsv", 60), ("train/base-clip/tiny/seed0.tsv", 30),
                      ("train/negclip/coco/seed1.tsv", 90)):
        tsv = tmp_path / "results" / "timing" / path
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text(header + f"1\t0:00:01\t1\t1\t1\t1\t0\t0\t1\t{cpu}\n")
    assert measured_cpu_minutes(tmp_path / "results") == {"train": 2.5, "pretrain": 0.5}
    assert "2.5 in all; train 2.5" in local_notes(rows, tmp_path / "results")
    table = format_local_plan(rows)
    assert "GPU" not in table and "walltime" not in table and "2.0 MB" in table


@pytest.mark.parametrize("gpu_model", ["a100", "h200"])
def test_every_gpu_jobs_estimate_is_within_1_5x_of_its_first_principles_figure(paper: dict, gpu_model: str) -> None:
    """Each kind of GPU job of the paper study (every method on each of its datasets, every LLM and image
    generator's shard, an evaluation of each base model, its WiSE-FT evaluation, ConcretePlant's table): the
    plan's estimate (what the rules ask for, over the margin) is within ESTIMATE_RATIO of a first-principles count
    of its work (compo.first_principles: parameters x tokens over the stated rate, decode at the measured cost,
    published LLM and SDXL figures). No timing: both read the config."""
    from compo_tools import first_principles

    jobs = [("train", {"method": m, "dataset": d}) for m in paper["methods"]
            for d in resolve_method(paper, m).get("datasets", [])]
    for name, spec in paper["negatives"].items():
        if spec.get("backend"):
            jobs.append(("negatives_shard", {"generator": name, "dataset": "coco"}))
        if spec.get("images"):
            jobs.append(("negative_images_shard", {"generator": name, "dataset": "coco"}))
    for model in ("clip-ft/coco/seed0", "siglip-ft/cc3m-dreamlip/seed0"):
        jobs += [("evaluate", {"model": model}), ("evaluate_wiseft", {"model": model})]
    jobs.append(("concreteplant_table", {"dataset": "coco-train-longest"}))
    assert {rule for rule, _ in jobs} >= {"train", "negatives_shard", "negative_images_shard", "evaluate"}
    ratios = {}
    for rule, wildcards in jobs:
        estimate = job_minutes(paper, rule, wildcards, None, gpu_model)
        work = first_principles.job_minutes(paper, rule, wildcards, gpu_model)
        assert estimate is not None and work is not None, (rule, wildcards)
        ratios[rule, tuple(wildcards.values())] = estimate / work
    outside = {job: round(r, 2) for job, r in ratios.items()
               if not 1 / first_principles.ESTIMATE_RATIO <= r <= first_principles.ESTIMATE_RATIO}
    assert not outside, outside


def test_the_first_principles_count_sees_decode_and_accumulation(paper: dict) -> None:
    """The two terms the estimates missed (issue 56): ShareGPT4V's SA-1B images make LSS decode-bound on its
    8-CPU ranks, and an accumulating recipe pays a fourth forward."""
    from compo.plan import train_decode_minutes
    from compo_tools import first_principles

    lss = resolve_method(paper, "lss")
    decode = train_decode_minutes(lss, "sharegpt4v", paper["train"]["threads"])
    assert decode > train_minutes(lss, B32, "a100") - JOB_OVERHEAD_MIN   # decode, not compute, bounds it
    assert train_decode_minutes(lss, "coco", 8) < decode / 2            # COCO's 640x480 against SA-1B's mix
    cement = resolve_method(paper, "cement")
    assert first_principles.sample_gflops(cement, B32) == pytest.approx(
        first_principles.sample_gflops({**cement, "train": {**cement["train"], "accum_freq": 1}}, B32) * 4 / 3)
