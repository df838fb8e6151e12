"""The cost plan of a study on a cluster: jobs per rule, the GPUs and walltime each asks for, the GPU-hours
requested against an estimate of what each GPU job takes, and the disk and files each rule writes.

Every GPU job's walltime is estimated from the config alone (`job_minutes`; the rules ask for it times
`WALLTIME_MARGIN`, times the attempt, so a retry after a timeout asks for more), on the GPU the profile names
(`gpu_model`; `GPU_SPEED`, relative to the H200 the trainer was measured on):
* training: the step's FLOPs over the trainer's measured FLOP rate. Measured: this trainer, ViT-B-32-quickgelu at
  224 px, batch 256, amp, eager, one H200: 2,680.8 samples/s, a step of 7.5 TFLOP (docs/embedded-study.md, "On a
  GPU after issue 36"). A recipe's step counts every image and text its loss encodes (hard images, offline and
  online negatives, noun phrases, Cement's negative images, DeGLA's teacher) at the recipe's text context
  (`text.context_length`, else the model's), forward and backward 3x a forward; a tower's forward FLOPs are
  `IMAGE_GFLOPS` (counted) and, for text, the transformer's 24 d^2 + 4 L d per token and layer. Full context is
  an upper bound: a batch's texts are cut to its longest (train.shapes static);
* LLM shards: captions x k x (prompt + max_new_tokens) tokens over `LLM_TOKENS_PER_S` of the model and engine;
* SDXL-Turbo image shards: images x denoising steps over `SDXL_IMAGE_STEPS_PER_S`;
* evaluation: the images its benchmarks decode (`benchmark_size`) at `DECODE_MS` (measured) over its decode workers
  (the job's threads - 1), bounded by the model's forward rate, their texts' forward, plus the probes' fits; a
  real benchmark the plan cannot size is an error.
* decoding bounds training too: a job takes the longer of its compute and its images' decoding (each source's
  sizes, `SOURCE_IMAGES`) over its ranks' workers; gradient accumulation adds its no-grad pass (4 forwards);
  ViT-B-16-SigLIP runs at its own utilisation (`MODEL_UTILISATION`). `compo.first_principles` counts every GPU
  job apart from these tables (tests keep the two within 1.5x).
Figures marked ASSUMPTION were not measured by this project (docs/paper-costs.md, "Cost plan"). No torch here: the
rules call this module while the DAG is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from compo.doc_sections import replace_between
from compo.evaluate.files import BenchmarkError
from compo.evaluate.kinds import BenchmarkSize, kind_of
from compo.memory import GPU_MEM_USABLE, PARAMETERS, accum_freq, gpus, has_teacher, rows_per_caption, usable_gb
from compo.resource_use import read_uses
from compo.study import Study

# --- measured and assumed rates --------------------------------------------------------------------------------
MEASURED_SAMPLES_PER_S = 2680.8     # this trainer, one H200, ViT-B-32-quickgelu, 224 px, batch 256, amp, eager
MEASURED_MODEL = "ViT-B-32-quickgelu"
MEASURED_GPU = "h200"
MEASURED_STEP_TFLOP, MEASURED_BATCH = 7.5, 256   # the measured step's FLOPs (the benchmark's short world captions)
# The trainer's FLOP rate on the measured GPU (78.5 TFLOP/s), which every GPU job's compute is divided by.
EFFECTIVE_TFLOPS = MEASURED_SAMPLES_PER_S * MEASURED_STEP_TFLOP / MEASURED_BATCH
# A GPU's speed relative to the H200 (the profile's gpu_model, lower case). h200: measured. ASSUMPTIONS: h100 as
# the H200 (the same dense bf16 peak; its 1,002 samples/s predates issue 36's trainer), a100 and l40s 0.5, a40
# 0.3 (about a third of the H100's bf16 peak, less host-bound). A profile that names no GPU gets a100's speed.
GPU_SPEED = {"h200": 1.0, "h100": 1.0, "a100": 0.5, "l40s": 0.5, "a40": 0.3}
DEFAULT_GPU = "a100"
# Forward GFLOPs of one image (FlopCounterMode; tests/test_plan.py recounts); parameters: compo.memory's.
IMAGE_GFLOPS = {"ViT-B-32-quickgelu": 8.725, "ViT-B-16-SigLIP": 34.0}
# A model's FLOP rate relative to the measured ViT-B-32-quickgelu's. ASSUMPTION for ViT-B-16-SigLIP, from timm's
# published benchmarks (huggingface/pytorch-image-models results/, samples/s x GMACs): vit_base_patch16_siglip_224
# against vit_base_patch32_clip_quickgelu_224, inference, amp, batch 1024: 1.10 (RTX 5090, torch 2.9.1), 1.17
# (RTX 4090, torch 2.4.0); training (vit_base_patch16_224 against vit_base_patch32_224, RTX 3090): 0.91. Its 196
# patches make larger GEMMs, but not several times faster ones.
MODEL_UTILISATION = {"ViT-B-32-quickgelu": 1.0, "ViT-B-16-SigLIP": 1.1}
# ASSUMPTIONS (not measured here): vLLM tokens/s (prompt + generated, max_num_seqs 256) of one engine on an
# H100/H200-class GPU, the engine spanning its tensor_parallel_size GPUs; keyed by (model, backend). Source:
# ~12,500 generated tokens/s for Llama-3.1-8B (bf16) on one H100 80GB (third-party vLLM benchmarks collected at
# https://www.morphllm.com/vllm-benchmarks); prompt tokens at prefill's compute bound, ~50 % of the 989 TFLOP/s
# bf16 peak at 2 FLOPs a parameter and token (~31,000/s for 8 B). degla-llm's 240 prompt + 96 generated tokens:
# ~21,800/s, taken as 16,000. Qwen3-32B on 2 GPUs: generated 12,500 x 8.0 / 32.8 B x 2 GPUs ~ 6,100, prefill
# ~15,000, 300 + 64 tokens: ~11,900, taken as 8,000 (tensor parallelism's all-reduces).
LLM_TOKENS_PER_S = {("meta-llama/Llama-3.1-8B-Instruct", "vllm"): 16_000.0, ("Qwen/Qwen3-32B", "vllm"): 8_000.0}
# Prompt tokens of one request (the templates of compo.llm.prompts at ~4 characters a token, DeGLA's with its five
# examples a type; tests recount).
PROMPT_TOKENS = {"degla-llm": 240, "concreteplant-hc": 300, "concreteplant-lc": 300, "concreteplant-wo": 300}
# ASSUMPTION: SDXL-Turbo img2img UNet image-steps a second at 512 px, batch 16, fp16, on one H100/H200-class GPU
# (VAE decode and PNG writing included; ~8 images/s at 3 steps); a 512 px PNG of 0.42 MB (issue 42's 0.7-0.9 TB
# for 1.95 M).
SDXL_IMAGE_STEPS_PER_S = 25.0
PNG_BYTES_512 = 0.42e6
TAR_MEMBER_BYTES = 512 + 256  # a tar member's header block and its data's mean padding to 512 B
# Measured here (tools/measure_decode.py, docs/paper-scale.md "Estimates from the work"): the CPU ms one
# worker takes to read an image, decode it whole to RGB (compo.images.open_image) and preprocess it to 224 px
# (open_clip's eval transform); generated photo-like images, one thread, medians of the process's CPU time.
DECODE_MS = {"jpeg 500x375": 4.4, "jpeg 640x480": 5.5, "jpeg 1500x2250": 39.6, "jpeg 1536x2048": 37.5,
             "png 512x512": 6.9}
# ASSUMPTIONS: the images of a training source by size (their releases' typical sizes; share of each class):
# ShareGPT4V's 1.25 M captions, 46 % on SA-1B's 1500x2250 images (the rest COCO, LLaVA's and web images); DCI on
# SA-1B's; DOCCI's 1536x2048 photographs. Every other source and every benchmark: COCO's 640x480 (web images,
# CC3M's and LAION-COCO's, are as large or smaller).
SOURCE_IMAGES = {"sharegpt4v": {"jpeg 1500x2250": 0.46, "jpeg 640x480": 0.54}, "dci": {"jpeg 1500x2250": 1.0},
                 "docci": {"jpeg 1536x2048": 1.0}}
DEFAULT_IMAGE = "jpeg 640x480"
NEGATIVE_IMAGE = "png 512x512"   # SDXL-Turbo's negative images (Cement's pairs, ConcretePlant's table)
PROBE_FIT_MIN_PER_100K = 2.0
# Measured (docs/overlap-guard.md): the overlap guard reads, sha256s, decodes at reduced scale and hashes a 640x480
# JPEG of COCO's 160 KB mean in 1.5 CPU ms on a quiet core, 2.2 on a loaded one: 450 images a second a thread.
OVERLAP_IMAGES_PER_S = 450.0
JOB_OVERHEAD_MIN = 5.0      # a job's start: imports, model load, writing its outputs (every estimate carries it)
# The walltime asked over the estimate. 1.4: the estimates count what once made up the margin (decode at measured
# costs, accumulation's extra pass, the real decode workers) and stay within 1.5x of a first-principles count
# (compo.first_principles); a retry asks attempt x this (at most the partition's limit).
WALLTIME_MARGIN = 1.4
DEFAULT_PARTITION_HOURS = 48   # the plan's note, where the profile names no max_runtime: a usual partition limit
MIN_WALLTIME_MIN = 10
FALLBACK_WALLTIME_MIN = 24 * 60    # a job without an estimate
WISEFT_MINUTES = 2.0        # a weight average of two checkpoints, on the CPU

# Captions of the training sets (published counts; `sample` overrides): (source, split, caption) -> captions.
DATASET_CAPTIONS = {("coco", "train+restval", None): 566_747, ("coco", "train", None): 414_113,
                    ("coco", "train", "longest"): 82_783, ("cc3m", None, None): 3_000_000,
                    ("sharegpt4v", None, None): 1_246_901, ("docci", "train", None): 9_647, ("dci", None, None): 7_805,
                    ("localized-narratives", None, None): 134_272, ("laion-coco", None, None): 100_000}


def gpu_speed(gpu_model: str | None) -> float:
    """A GPU's speed relative to the measured H200 (`GPU_SPEED`); none named or unknown: DEFAULT_GPU's."""
    return GPU_SPEED.get(str(gpu_model or DEFAULT_GPU).lower(), GPU_SPEED[DEFAULT_GPU])


def text_gflops(model_name: str, context: int) -> float:
    """Forward GFLOPs of one text of `context` tokens: 24 d^2 (projections and MLP) + 4 L d (attention) per
    token and layer, from the model's open_clip config."""
    from compo.architectures import model_config

    text = model_config(model_name)["text_cfg"]
    width, layers = text["width"], text["layers"]
    return layers * context * (24 * width**2 + 4 * context * width) / 1e9


def step_gflops(recipe: dict[str, Any], model_name: str) -> float:
    """GFLOPs of one sample of a training step: forward and backward (3 forwards) of every image and text its
    loss encodes (`compo.memory.rows_per_caption`, the rows the memory model counts too), the forward of a
    teacher's, and with gradient accumulation (`train.accum_freq` > 1) the no-grad forward that first computes
    every micro-batch's features for the full batch's loss (+1/3: 4 forwards)."""
    from compo.architectures import text_context_length

    images, texts = rows_per_caption(recipe)
    context = (recipe.get("text") or {}).get("context_length") or text_context_length(model_name)
    forward = images * IMAGE_GFLOPS[model_name] + texts * text_gflops(model_name, context)
    passes = 4 if accum_freq(recipe) > 1 else 3
    return passes * forward + (forward if has_teacher(recipe) else 0.0)


def decode_ms(source: str | None) -> float:
    """Mean ms one worker takes to decode and preprocess an image of a training source (`SOURCE_IMAGES`; others,
    and benchmarks: `DEFAULT_IMAGE`)."""
    shares = SOURCE_IMAGES.get(str(source), {DEFAULT_IMAGE: 1.0})
    return sum(share * DECODE_MS[size] for size, share in shares.items())


def decode_workers(threads: int | None) -> int:
    """Decode workers of a process on a GPU with `threads` CPUs: every one but the one feeding the GPU
    (`compo.devices.data_workers`), at least one (with one CPU the process decodes itself)."""
    return max(1, int(threads or 1) - 1)


def train_decode_minutes(recipe: dict[str, Any], source: str | None, rank_threads: int | None, gpus: int = 1
                         ) -> float:
    """Minutes a training job's decode workers take for its images: every step's own images (twice with NegCLIP's
    hard images) at the source's decode cost, Cement's negative images as 512 px PNGs, over the job's workers
    (`gpus` ranks of `rank_threads` CPUs each)."""
    steps, batch = recipe.get("train", {}).get("steps", 0), recipe.get("train", {}).get("batch_size", 0)
    images, _ = rows_per_caption(recipe)
    own = 2.0 if recipe.get("hard_images") is not None else 1.0
    per_sample = own * decode_ms(source) + (images - own) * DECODE_MS[NEGATIVE_IMAGE]
    return steps * batch * per_sample / 1e3 / (gpus * decode_workers(rank_threads)) / 60


def model_tflops(model_name: str, gpu_model: str | None = None) -> float:
    """The trainer's FLOP rate for `model_name` on `gpu_model`: the measured rate x the model's utilisation
    relative to the measured model x the GPU's speed."""
    return EFFECTIVE_TFLOPS * MODEL_UTILISATION.get(model_name, 1.0) * gpu_speed(gpu_model)


def train_minutes(recipe: dict[str, Any], model_name: str, gpu_model: str | None = None, gpus: int = 1,
                  source: str | None = None, rank_threads: int | None = None) -> float | None:
    """Estimated minutes of a training job on `gpus` GPUs of `gpu_model` (ideal data-parallel scaling; None: no
    figure for its model): its compute, or where longer its decode workers' (`train_decode_minutes`: images of
    training source `source`, `rank_threads` CPUs a rank; no source: compute only). A base exported from
    pretrained weights (0 steps) takes its start-up only."""
    steps, batch = recipe.get("train", {}).get("steps", 0), recipe.get("train", {}).get("batch_size", 0)
    if steps == 0:
        return JOB_OVERHEAD_MIN
    if model_name not in IMAGE_GFLOPS:
        return None
    compute = steps * batch * step_gflops(recipe, model_name) / (model_tflops(model_name, gpu_model) * 1e3) / 60
    decode = 0.0 if source is None else train_decode_minutes(recipe, source, rank_threads, gpus)
    return max(compute / gpus, decode) + JOB_OVERHEAD_MIN


def dataset_captions(spec: dict[str, Any]) -> int | None:
    """Captions of a training set (`DATASET_CAPTIONS`; a `sample` caps them); None: no figure."""
    source, split, caption = spec.get("source"), spec.get("split"), spec.get("caption")
    count = DATASET_CAPTIONS.get((source, split, caption)) or DATASET_CAPTIONS.get((source, None, None))
    if spec.get("sample"):
        count = min(count or spec["sample"], int(spec["sample"]))
    return count


def llm_shard_minutes(spec: dict[str, Any], captions: int | None, gpu_model: str | None = None) -> float | None:
    """An LLM shard: its captions x k x (prompt + max_new_tokens) tokens over the engine's rate."""
    rate = LLM_TOKENS_PER_S.get((spec.get("model"), spec.get("backend", "vllm")))
    prompt = PROMPT_TOKENS.get(spec.get("generator"))
    if rate is None or prompt is None or captions is None:
        return None
    tokens = captions / int(spec.get("shards", 1)) * int(spec.get("k", 1)) * (prompt + spec.get("max_new_tokens", 64))
    return tokens / (rate * gpu_speed(gpu_model)) / 60 + JOB_OVERHEAD_MIN


def negative_images(spec: dict[str, Any], captions: int | None) -> int | None:
    """Images an SDXL-Turbo generator writes: one per negative (at most captions x k)."""
    return None if captions is None else captions * int(spec.get("k", 1))


def image_shard_minutes(spec: dict[str, Any], captions: int | None, gpu_model: str | None = None) -> float | None:
    """An SDXL-Turbo image shard: its images x img2img's denoising steps (steps x strength) over the rate,
    scaled by the pixels against 512 px."""
    images = negative_images(spec, captions)
    if images is None:
        return None
    edit = spec["images"]
    steps = max(1, int(edit.get("steps", 4) * edit.get("strength", 1.0)))
    pixels = (edit.get("resolution", 512) / 512) ** 2
    seconds = images / int(edit.get("shards", 1)) * steps * pixels / (SDXL_IMAGE_STEPS_PER_S * gpu_speed(gpu_model))
    return seconds / 60 + JOB_OVERHEAD_MIN


def benchmark_size(spec: dict[str, Any], name: str = "?") -> BenchmarkSize | None:
    """The images and texts an evaluation of benchmark `name` encodes, as its kind declares them at the release's
    size (`compo.evaluate.kinds`). A real benchmark (source files) the plan cannot size is an error naming it; a
    world benchmark without a figure is None (no estimate)."""
    try:
        declaration = kind_of(spec.get("kind"))
    except BenchmarkError as error:
        raise ValueError(f"compo plan: benchmark {name!r} ({error})") from error
    size = declaration.size(spec)
    if size is None and spec.get("source") != "world":
        raise ValueError(f"compo plan: benchmark {name!r} (kind {spec.get('kind')!r}, format {spec.get('format')!r}, "
                         f"dataset {spec.get('dataset')!r}) has no size figure: add its release's images and texts "
                         "to its kind's declared size")
    return size


def eval_minutes(specs: Mapping[str, dict[str, Any]], model_name: str, threads: int = 1,
                 gpu_model: str | None = None) -> float | None:
    """An evaluation job of `threads` CPUs on the benchmarks `specs` (name -> spec): their images decoded by its
    `decode_workers` at DEFAULT_IMAGE's cost (bounded by the model's forward rate), their texts' forward at the
    model's context, and their probes fitted. A real benchmark without a size figure is an error
    (`benchmark_size`)."""
    from compo.architectures import text_context_length

    counts = [benchmark_size(spec, name) for name, spec in specs.items()]
    if model_name not in IMAGE_GFLOPS or any(c is None for c in counts):
        return None
    images, texts = sum(c.images for c in counts), sum(c.texts for c in counts)
    probe_train = sum(c.probe_train for c in counts)
    flops = model_tflops(model_name, gpu_model) * 1e3   # GFLOP/s
    rate = min(decode_workers(threads) * 1e3 / DECODE_MS[DEFAULT_IMAGE], flops / IMAGE_GFLOPS[model_name])
    text_seconds = texts * text_gflops(model_name, text_context_length(model_name)) / flops
    return ((images / rate + text_seconds) / 60 + probe_train / 1e5 * PROBE_FIT_MIN_PER_100K / gpu_speed(gpu_model)
            + JOB_OVERHEAD_MIN)


def walltime_minutes(estimate: float | None, attempt: int = 1, max_minutes: float | None = None) -> int:
    """The walltime a job asks for: the estimate times the margin (and the attempt), at least MIN_WALLTIME_MIN, at
    most `max_minutes` (the partition's limit the profile names, `max_runtime`: a retry never asks past it; a
    training job resumes from its checkpoint, so each capped attempt still gets further)."""
    if estimate is None:
        minutes = FALLBACK_WALLTIME_MIN * attempt
    else:
        minutes = int(max(MIN_WALLTIME_MIN, math.ceil(estimate * WALLTIME_MARGIN)) * attempt)
    return minutes if max_minutes is None else min(minutes, int(max_minutes))


def runtime_minutes(value: Any, where: str = "max_runtime") -> float | None:
    """Minutes of a walltime as a profile writes it: a number (minutes), "30m", "48h", "2d", or SLURM's
    D-HH[:MM[:SS]] or HH:MM:SS; None for None. Anything else is an error naming `where`."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    text = str(value).strip().lower()
    unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([mhd]?)", text)
    if unit and float(unit.group(1)) > 0:
        return float(unit.group(1)) * {"": 1, "m": 1, "h": 60, "d": 24 * 60}[unit.group(2)]
    # SLURM's days-hours[:minutes[:seconds]] and hours:minutes:seconds (its MM:SS is left out: easily misread)
    clock = re.fullmatch(r"(\d+)-(\d+)(?::(\d{2}))?(?::(\d{2}))?", text) or \
        re.fullmatch(r"()(\d+):(\d{2}):(\d{2})", text)
    if clock:
        days, hours, minutes, seconds = (int(g or 0) for g in clock.groups())
        total = days * 24 * 60 + hours * 60 + minutes + seconds / 60
        if total > 0:
            return total
    raise ValueError(f"{where}: {value!r} is not a walltime (expected minutes, e.g. 2880, or \"48h\", \"2d\", "
                     "\"2-00:00:00\")")


# --- a job's estimate and what it writes ---------------------------------------------------------------------------


def model_of(config: dict[str, Any], model_id: str) -> str:
    """The open_clip model of a model id (a base, a fine-tune or a WiSE-FT model)."""
    return Study(config).model_name(model_id)


def eval_benchmarks(config: dict[str, Any], rule: str) -> list[str]:
    """The benchmarks of an evaluation rule's jobs (WiSE-FT models: `wiseft.benchmarks`, default the study's)."""
    study = Study(config)
    return study.wiseft_benchmarks if rule == "evaluate_wiseft" else study.eval_benchmarks


def job_minutes(config: dict[str, Any], rule: str, wildcards: Mapping[str, str], threads: int | None = None,
                gpu_model: str | None = None) -> float | None:
    """Estimated minutes of one job of `rule` on the GPU `gpu_model` (the rules ask for this x the margin);
    None: no figure (the rule asks for FALLBACK_WALLTIME_MIN), or a rule this plan does not estimate.
    `threads`: an evaluation's decode workers (None: config evaluate.threads, as the rules set them)."""
    from compo.config import resolve_method

    if rule == "train":
        recipe = resolve_method(config, wildcards["method"])
        source = (config["datasets"].get(wildcards.get("dataset")) or {}).get("source")
        # a rank's CPUs: the config's train.threads (the slurm profile's cpus_per_gpu, which scales with the GPUs)
        rank_threads = int((config.get("train") or {}).get("threads", 1))
        return train_minutes(recipe, config["bases"][recipe["base"]]["model"], gpu_model, gpus(recipe), source,
                             rank_threads)
    if rule == "pretrain":
        base = config["bases"][wildcards["base"]]
        return train_minutes(base, base["model"], gpu_model)
    if rule in ("negatives_shard", "negative_images_shard"):
        spec = config["negatives"][wildcards["generator"]]
        captions = dataset_captions(config["datasets"][wildcards["dataset"]])
        shard = llm_shard_minutes if rule == "negatives_shard" else image_shard_minutes
        return shard(spec, captions, gpu_model)
    if rule in ("evaluate", "evaluate_wiseft"):
        specs = {name: config["benchmarks"][name] for name in eval_benchmarks(config, rule)}
        threads = threads or int((config.get("evaluate") or {}).get("threads", 1))
        return eval_minutes(specs, model_of(config, wildcards["model"]), threads, gpu_model)
    if rule == "concreteplant_table":
        return concreteplant_minutes(config, wildcards["dataset"], threads, gpu_model)
    if rule == "wiseft":
        return WISEFT_MINUTES
    if rule == "overlap":
        return overlap_minutes(config, wildcards["dataset"], threads)
    return None


def overlap_minutes(config: dict[str, Any], dataset: str, threads: int | None = None) -> float | None:
    """The overlap guard of a training set: its images (at most one a caption) and those of every benchmark the
    study evaluates on that lists images, each read and hashed once at OVERLAP_IMAGES_PER_S a thread."""
    captions = dataset_captions(config["datasets"][dataset])
    if captions is None:
        return None
    specs = [(name, config["benchmarks"][name]) for name in Study(config).overlap_benchmarks()]
    sizes = [benchmark_size(spec, name) for name, spec in specs if kind_of(spec.get("kind")).images is not None]
    images = captions + sum(size.images for size in sizes if size is not None)  # world benchmarks: small
    workers = threads or int((config.get("overlap") or {}).get("threads", 4))
    return images / (OVERLAP_IMAGES_PER_S * max(1, workers)) / 60 + JOB_OVERHEAD_MIN


def concreteplant_minutes(config: dict[str, Any], dataset: str, threads: int | None = None,
                          gpu_model: str | None = None) -> float | None:
    """Seed 002 Table 1 on the base model: every ConcretePlant generator's caption / negative pairs, their
    images decoded (the anchors once per policy, each negative image, a 512 px PNG, once) by the job's decode
    workers, bounded by the base's forward rate."""
    study = Study(config)
    captions = dataset_captions(config["datasets"][dataset])
    policies = [config["negatives"][name] for name in study.concreteplant_generators().values()]
    base = config["bases"][study.concreteplant_base()]["model"]
    if captions is None or not policies or base not in IMAGE_GFLOPS:
        return None
    negatives = sum(negative_images(spec, captions) for spec in policies)
    workers = decode_workers(threads or int((config.get("evaluate") or {}).get("threads", 1)))
    decode = (captions * len(policies) * DECODE_MS[DEFAULT_IMAGE] + negatives * DECODE_MS[NEGATIVE_IMAGE]) / 1e3
    forward = (captions * len(policies) + negatives) * IMAGE_GFLOPS[base] / (model_tflops(base, gpu_model) * 1e3)
    return max(decode / workers, forward) / 60 + JOB_OVERHEAD_MIN


def job_writes(config: dict[str, Any], rule: str, wildcards: Mapping[str, str]) -> tuple[float, int] | None:
    """(bytes, files) a job leaves on disk; None for rules the plan does not size (small tables)."""
    from compo import layout
    from compo.config import resolve_method

    if rule in ("train", "wiseft"):
        recipe = resolve_method(config, wildcards["method"])
        return PARAMETERS.get(config["bases"][recipe["base"]]["model"], 0) * 4, len(layout.MODEL_FILES)
    if rule == "pretrain":
        return PARAMETERS.get(config["bases"][wildcards["base"]]["model"], 0) * 4, len(layout.MODEL_FILES)
    if rule == "negative_images_shard":
        from compo.negatives.diffusion import DiffusionSettings

        spec = config["negatives"][wildcards["generator"]]
        settings = DiffusionSettings.from_spec(spec["images"], f"negatives.{wildcards['generator']}.images")
        images = negative_images(spec, dataset_captions(config["datasets"][wildcards["dataset"]])) or 0
        per_shard = images / settings.shards
        pixels = (settings.resolution / 512) ** 2
        # + the shard's rows and report; format tar: its PNGs are one file (a 512 B header and padding each)
        if settings.format == "tar":
            return per_shard * (PNG_BYTES_512 * pixels + TAR_MEMBER_BYTES), 1 + 2
        return per_shard * PNG_BYTES_512 * pixels, math.ceil(per_shard) + 2
    if rule == "negatives_shard":
        spec = config["negatives"][wildcards["generator"]]
        captions = dataset_captions(config["datasets"][wildcards["dataset"]]) or 0
        return captions / int(spec.get("shards", 1)) * int(spec.get("k", 1)) * 200, 2   # ~200 B a negative's row
    if rule in ("evaluate", "evaluate_wiseft"):
        names = eval_benchmarks(config, rule)
        sizes = [benchmark_size(config["benchmarks"][n], n) for n in names]
        images = sum(size.images for size in sizes if size is not None)   # world benchmarks: no figure
        return images * 50, 2 * len(names)   # a JSON and a predictions table each; ~50 B a prediction
    return None


# --- reading a dry run -----------------------------------------------------------------------------------


@dataclass
class Job:
    """One job of a dry run: its rule, wildcards, resources, threads, the group job it runs in (None: its own)
    and whether it runs on the submitting host (a localrule: not submitted)."""

    rule: str
    wildcards: dict[str, str] = field(default_factory=dict)
    resources: dict[str, str] = field(default_factory=dict)
    group: int | None = None
    threads: int | None = None    # printed by the dry run only in some versions
    local: bool = False


def _pairs(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in re.split(r",\s*", text.strip()) if "=" in part)


def local_rules(snakefile: str) -> set[str]:
    """The rules a cluster run keeps on the submitting host: the `localrules:` statements of the Snakefile and
    of the rule files next to it (a dry run prints them as any rule)."""
    from pathlib import Path

    path = Path(snakefile)
    names: set[str] = set()
    for file in [path, *sorted((path.parent / "workflow" / "rules").glob("*.smk"))]:
        if file.is_file():
            for inline, block in re.findall(r"^localrules:([ \t\w,]*)\n((?:[ \t]+[\w, \t]+\n)*)", file.read_text(),
                                            re.MULTILINE):
                names |= set(re.findall(r"\w+", inline + block))
    return names


def parse_dry_run(output: str, local: set[str] | frozenset[str] = frozenset()) -> list[Job]:
    """The jobs of `snakemake -n` output (rule blocks, with the group job each belongs to; `local`: the local
    rules, besides those printed as `localrule`)."""
    jobs: list[Job] = []
    group, current = None, None
    groups = 0
    for line in output.splitlines():
        if re.search(r"\] Group job \S+", line):
            groups += 1
            group = groups
            continue
        match = re.match(r"^(\s*)(local)?rule (\w+):$", line)
        if match:
            if not match.group(1):  # a rule block at the margin is not in a group
                group = None
            current = Job(match.group(3), group=group, local=bool(match.group(2)) or match.group(3) in local)
            jobs.append(current)
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("wildcards: "):
            current.wildcards = _pairs(stripped[len("wildcards: "):])
        elif stripped.startswith("resources: "):
            current.resources = _pairs(stripped[len("resources: "):])
        elif stripped.startswith("threads: "):
            current.threads = int(stripped[len("threads: "):])
    return jobs


@dataclass
class RuleRow:
    rule: str
    jobs: int = 0
    submitted: int = 0          # SLURM jobs: a group job counts once, a local job not at all
    gpus: int = 0               # per job (the largest)
    requested_gpu_h: float = 0.0
    estimated_gpu_h: float | None = 0.0
    longest_h: float = 0.0      # the longest walltime one job asks for (a group's members: each its own)
    longest_estimate_h: float | None = 0.0   # the longest estimated job (None: a job without a figure)
    disk_bytes: float | None = None
    files: int | None = None
    gpu_mem: str = ""           # GPU memory one job needs / its GPU's, GiB (compo.memory; training jobs)
    cpus: int | None = None     # the most CPUs one job asks for (cpus_per_task, else its threads)
    mem_mb: float | None = None  # the most host memory one job asks for (mem_mb)


def plan_rows(jobs: list[Job], estimates: dict[int, float | None],
              writes: dict[int, tuple[float, int] | None] | None = None) -> list[RuleRow]:
    """Per rule: jobs, submitted jobs, GPUs, walltime and GPU-hours requested and estimated (`estimates`: job
    index -> estimated minutes, None where there is no figure; a job missing from it has none either), and
    the disk and files written (`writes`: job index -> (bytes, files))."""
    rows: dict[str, RuleRow] = {}
    group_minutes: dict[int, float] = {}
    for index, job in enumerate(jobs):
        row = rows.setdefault(job.rule, RuleRow(job.rule))
        row.jobs += 1
        gpus = int(job.resources.get("gpu", 0) or 0)
        minutes = float(job.resources.get("runtime", 0) or 0)
        row.gpus = max(row.gpus, gpus)
        cpus = job.resources.get("cpus_per_task") or job.threads
        if cpus is not None:
            row.cpus = max(row.cpus or 0, int(cpus))
        if job.resources.get("mem_mb"):
            row.mem_mb = max(row.mem_mb or 0, float(job.resources["mem_mb"]))
        row.requested_gpu_h += gpus * minutes / 60
        row.longest_h = max(row.longest_h, minutes / 60)
        if job.group is not None:
            group_minutes[job.group] = group_minutes.get(job.group, 0) + minutes
        elif not job.local:
            row.submitted += 1
        estimate = estimates.get(index)
        if row.longest_estimate_h is not None:
            row.longest_estimate_h = None if estimate is None else max(row.longest_estimate_h, estimate / 60)
        if row.estimated_gpu_h is not None and gpus:
            row.estimated_gpu_h = None if estimate is None else row.estimated_gpu_h + gpus * estimate / 60
        written = (writes or {}).get(index)
        if written is not None:
            row.disk_bytes = (row.disk_bytes or 0) + written[0]
            row.files = (row.files or 0) + written[1]
    if group_minutes:
        grouped = RuleRow("(group jobs)", submitted=len(group_minutes), longest_h=max(group_minutes.values()) / 60)
        grouped.longest_estimate_h = None
        rows[grouped.rule] = grouped
    return list(rows.values())


def _size(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value / 1e3:,.0f} KB"


def format_local_plan(rows: list[RuleRow]) -> str:
    """A local run's plan: jobs, CPUs, disk and files per rule (no walltimes, no GPU-hours: nothing is asked of a
    scheduler)."""
    lines = [f"{'rule':26s} {'jobs':>5s} {'CPUs':>4s} {'disk':>9s} {'files':>9s}"]
    for row in sorted(rows, key=lambda r: (r.disk_bytes is None, -(r.disk_bytes or 0), r.rule)):
        lines.append(f"{row.rule:26s} {row.jobs or '':>5} {row.cpus or '':>4} {_size(row.disk_bytes):>9s} "
                     f"{'-' if row.files is None else f'{row.files:,}':>9}")
    lines.append(f"total: {sum(r.jobs for r in rows)} jobs, run on this machine; "
                 f"{_size(sum(r.disk_bytes or 0 for r in rows))} and {sum(r.files or 0 for r in rows):,} files written")
    return "\n".join(lines)


def format_plan(rows: list[RuleRow]) -> str:
    """The plan as a table, GPU rules first, with the totals. GPUs, CPUs, host memory (mem) and walltimes are
    one job's most, asked (and estimated); GPU-hours the rule's sums."""
    gpu_rows = sorted((r for r in rows if r.gpus or r.rule == "(group jobs)"), key=lambda r: -r.requested_gpu_h)
    other = sorted((r for r in rows if not (r.gpus or r.rule == "(group jobs)")),
                   key=lambda r: (r.disk_bytes is None, r.rule))
    lines = [f"{'rule':26s} {'jobs':>5s} {'submitted':>9s} {'GPUs':>4s} {'CPUs':>4s} {'mem':>6s} "
             f"{'walltime asked':>14s} {'estimated':>9s} {'GPU-h asked':>11s} {'estimated':>9s} {'disk':>9s} "
             f"{'files':>9s} {'GPU mem':>9s}"]
    for row in [*gpu_rows, *other]:
        estimated = "-" if not row.gpus else "no figure" if row.estimated_gpu_h is None else \
            f"{row.estimated_gpu_h:,.0f}"
        longest = f"{row.longest_estimate_h:.1f}h" if row.longest_estimate_h is not None else \
            "no figure" if row.gpus else "-"
        mem = "" if row.mem_mb is None else f"{row.mem_mb / 1000:,.0f} GB"
        lines.append(f"{row.rule:26s} {row.jobs or '':>5} {row.submitted:>9d} {row.gpus or '':>4} "
                     f"{row.cpus or '':>4} {mem:>6s} {row.longest_h:>13.1f}h {longest:>9s} "
                     f"{row.requested_gpu_h:>11,.0f} {estimated:>9s} "
                     f"{_size(row.disk_bytes):>9s} {'-' if row.files is None else f'{row.files:,}':>9} "
                     f"{row.gpu_mem:>9s}")
    gpu_jobs = sum(r.submitted for r in rows if r.gpus and r.rule != "(group jobs)")
    gpu_jobs += next((r.submitted for r in rows if r.rule == "(group jobs)"), 0)
    requested = sum(r.requested_gpu_h for r in rows)
    estimates = [r.estimated_gpu_h for r in rows if r.gpus]
    estimate = "some without an estimate" if None in estimates else f"{sum(estimates):,.0f} estimated"
    disk = sum(r.disk_bytes or 0 for r in rows)
    files = sum(r.files or 0 for r in rows)
    lines.append(f"total: {sum(r.jobs for r in rows)} jobs, {sum(r.submitted for r in rows)} submitted, "
                 f"{gpu_jobs} asking for GPUs; GPU-hours {requested:,.0f} requested, {estimate}; "
                 f"{_size(disk)} and {files:,} files written")
    return "\n".join(lines)


def job_estimate(config: dict[str, Any], job: Job) -> float | None:
    """Estimated minutes of a dry run's job (`job_minutes` on the GPU its resources name)."""
    return job_minutes(config, job.rule, job.wildcards, job.threads, job.resources.get("gpu_model"))


def placeholder_overlay(config: dict[str, Any], root: Any) -> dict[str, Any]:
    """A config overlay that points every missing raw input at an empty stand-in under `root`, so the DAG
    of a study can be planned before its data is downloaded (the stand-ins are never read: a dry run). A
    benchmark whose folder or files are missing gets a stand-in folder holding every file its kind reads."""
    from pathlib import Path

    from compo.evaluate.kinds import benchmark_files
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
            command += ["--workflow-profile", str(Path(profile).resolve())]
        run = subprocess.run(command, capture_output=True, text=True, check=False,
                             env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                                  STAND_INS_ENV: "1"})
    if run.returncode != 0:
        lines = (run.stdout + run.stderr).strip().splitlines()
        # a job refused at DAG build for its GPU memory (common.smk get_train_gpus) says what to set; an error
        # while the workflow is read prints "ValueError in file ..., line N:" and its message on the next line
        errors = [line.strip() for line in lines if re.match(r"\s*\w*(Error|Exception): ", line)]
        errors += [f"{match.group(1)}: {following.strip()}" for line, following in zip(lines, lines[1:], strict=False)
                   if (match := re.match(r"(\w*(?:Error|Exception)) in file .*, line \d+:$", line.strip()))]
        why = next((line.strip() for line in lines if "refused, does not fit its GPU" in line),
                   errors[-1] if errors else lines[-1])
        raise RuntimeError(f"the dry run failed: {why}")
    return run.stdout + run.stderr


def is_local_run(profile: str | None) -> bool:
    """Whether a study runs on this machine: no profile, or one naming no executor (workflow/profiles/local)."""
    if not profile:
        return True
    from compo.profiles import profile_settings

    return profile_settings(profile).get("executor", "local") in ("local", "dryrun")


class Measured(NamedTuple):
    """What the jobs of one rule measured in a run (their resource records, compo.resource_use)."""

    jobs: int
    cpu_s: float        # the jobs' CPU seconds, summed
    max_rss_mb: float   # the largest resident set one job reached


def measured_by_rule(results: str | Path) -> dict[str, Measured]:
    """Per rule, what the last run under `results` measured (its jobs' records: timing/**/*.tsv)."""
    measured: dict[str, Measured] = {}
    for use in read_uses(results):
        jobs, cpu, rss = measured.get(use.rule, Measured(0, 0.0, 0.0))
        measured[use.rule] = Measured(jobs + 1, cpu + use.cpu_s, max(rss, use.max_rss_mb))
    return measured


def measured_cpu_minutes(results: str | Path) -> dict[str, float]:
    """CPU minutes per rule of the last run under `results` (its jobs' records: timing/**/*.tsv)."""
    return {rule: m.cpu_s / 60 for rule, m in measured_by_rule(results).items()}


def local_notes(rows: list[RuleRow], results: str | Path) -> str:
    """What a local run's plan says instead of walltimes and GPU-hours: the CPU minutes the last run measured."""
    measured = measured_cpu_minutes(results)
    known = [r.rule for r in rows if r.rule in measured]
    if not known:
        return (f"local run: every job runs on this machine; no walltime or GPU-hours are asked. No run measured yet "
                f"under {results} (its jobs' timing files give CPU minutes per rule once one has run)")
    total = sum(measured[r] for r in known)
    per_rule = ", ".join(f"{r} {measured[r]:,.1f}" for r in sorted(known, key=lambda r: -measured[r])[:6])
    return (f"local run: every job runs on this machine; no walltime or GPU-hours are asked. CPU minutes measured "
            f"by the last run under {results} (its timing files, {len(known)} rules): {total:,.1f} in all; {per_rule}")


def plan(configfiles: list[str], profile: str | None, snakefile: str, workdir: str) -> tuple[list[RuleRow], str]:
    """The plan of a study under a profile: the rows and the notes printed under them."""
    from compo.config import load_config

    if profile:
        from compo.profiles import profile_file

        profile_file(profile)   # a missing profile is an error naming it (the dry run checks its rule names)
    config = load_config(*configfiles)
    jobs = parse_dry_run(dry_run(configfiles, profile, snakefile, workdir), local_rules(snakefile))
    estimates = {i: job_estimate(config, job) for i, job in enumerate(jobs)}
    writes = {i: job_writes(config, job.rule, job.wildcards) for i, job in enumerate(jobs)}
    rows = plan_rows(jobs, estimates, writes)
    if is_local_run(profile):
        return rows, local_notes(rows, Path(workdir) / config["results"])
    gpu_models = sorted({str(j.resources.get("gpu_model", DEFAULT_GPU)).lower() for j in jobs
                         if int(j.resources.get("gpu", 0) or 0)})
    memory_column(config, jobs, rows)
    notes = [f"estimated on {', '.join(gpu_models) or DEFAULT_GPU} (the profile's gpu_model; none named: "
             f"{DEFAULT_GPU}); GPU speed relative to the measured {MEASURED_GPU}: "
             + ", ".join(f"{g} {GPU_SPEED[g]:g}" for g in GPU_SPEED) + f" ({MEASURED_GPU} measured, the others "
             "assumptions); the rules ask for the estimate x "
             f"{WALLTIME_MARGIN:g} (at least {MIN_WALLTIME_MIN} min), each estimate carrying {JOB_OVERHEAD_MIN:g} min "
             "of start-up",
             f"training: {MEASURED_SAMPLES_PER_S:,.1f} samples/s measured for {MEASURED_MODEL} (this trainer, one "
             f"{MEASURED_GPU.upper()}, amp, batch {MEASURED_BATCH}, eager: {EFFECTIVE_TFLOPS:.1f} TFLOP/s), each "
             "recipe by the FLOPs of the images and texts its loss encodes at its text context (compo.plan)",
             "LLM shards (ASSUMPTIONS, vLLM tokens/s of one engine): " + ", ".join(
                 f"{model} {rate:,.0f}" for (model, _), rate in LLM_TOKENS_PER_S.items())
             + f"; SDXL-Turbo (ASSUMPTION): {SDXL_IMAGE_STEPS_PER_S:g} image-steps/s at 512 px; evaluation "
             f"(measured here): {DECODE_MS[DEFAULT_IMAGE]:g} ms an image a decode worker (evaluate.threads - 1; "
             f"training's at its source's sizes, {DECODE_MS['jpeg 1500x2250']:g} ms at SA-1B's 1500x2250), probe fits "
             f"{PROBE_FIT_MIN_PER_100K:g} GPU-min per 100,000 features",
             f"overlap guard: {OVERLAP_IMAGES_PER_S:g} images/s a thread measured (read, sha256, decoded at reduced "
             "scale, perceptual hash), the training set's captions bounding its images",
             "disk: checkpoints (fp32 weights), negative images as 512 px PNGs (format tar: one shard a job), "
             "evaluation predictions; local rules run on the submitting host and are not counted as submitted"]
    notes.append(partition_note(jobs, estimates))
    if any(row.gpu_mem for row in rows):
        notes.append(f"GPU mem: the most GiB one training job needs per GPU (compo.memory) / the "
                     f"{GPU_MEM_USABLE * 100:g} % of the profile's gpu_mem_gb a job may be planned to use (the model, "
                     "calibrated on the CPU, may miss ~10 %)")
    return rows, "\n".join(notes)


def job_label(job: Job) -> str:
    """A job by its rule and what it is of (method, base, generator or model)."""
    of = next((job.wildcards[k] for k in ("method", "base", "generator", "model") if k in job.wildcards), "")
    return f"{job.rule} {of}".strip()


def partition_note(jobs: list[Job], estimates: dict[int, float | None]) -> str:
    """The plan's note on the partitions' time limit (a job's `max_runtime`, which the rules cap every attempt's
    walltime at): the jobs whose first attempt (estimate x the margin) would need a longer partition. Without a
    max_runtime, against DEFAULT_PARTITION_HOURS, a usual limit, and saying retries are uncapped."""
    over: dict[str, tuple[int, float, float]] = {}
    limits = set()
    for index, job in enumerate(jobs):
        estimate = estimates.get(index)
        if estimate is None:
            continue
        named = runtime_minutes(job.resources.get("max_runtime"), f"{job_label(job)}: max_runtime")
        limits.add(named)
        limit = named or DEFAULT_PARTITION_HOURS * 60
        first = walltime_minutes(estimate)
        if first > limit:
            count, longest, _ = over.get(job_label(job), (0, 0.0, limit))
            over[job_label(job)] = (count + 1, max(longest, first), limit)
    if None in limits:
        head = (f"the profile names no max_runtime (its partitions' time limit): retries ask for attempt x the "
                f"first walltime, uncapped; against {DEFAULT_PARTITION_HOURS} h, a usual limit")
    else:
        head = ("retries ask for attempt x the first walltime, at most the profile's max_runtime ("
                + ", ".join(f"{m / 60:g} h" for m in sorted(limits)) + ")")
    if not over:
        return f"{head}: every first attempt fits it"
    listed = ", ".join(f"{label} ({count} job{'s' if count > 1 else ''}, {longest / 60:.0f} h asked of {limit / 60:g})"
                       for label, (count, longest, limit) in sorted(over.items()))
    return (f"{head}: {sum(c for c, _, _ in over.values())} job(s) would need a longer partition: {listed}; they "
            "ask for the limit (training resumes from its checkpoint on a retry), or give the method more GPUs "
            "(methods.<name>.train.gpus) or a partition with a longer limit")


# --- README's plan section, generated ------------------------------------------------------------------------------
README_BEGIN, README_END = "<!-- compo plan: begin -->", "<!-- compo plan: end -->"


def readme_section(rows: list[RuleRow], notes: str, indent: str = "   ") -> str:
    """README step 4's plan table and notes (between README_BEGIN and README_END), indented as a code block."""
    import textwrap

    lines = [*format_plan(rows).splitlines(),
             *(wrapped for note in notes.splitlines() for wrapped in textwrap.wrap(note, 112, subsequent_indent="  "))]
    return "\n".join([f"{indent}```", *(f"{indent}{line}" for line in lines), f"{indent}```"])


def write_readme(readme: Any, section: str) -> bool:
    """Put `section` between the markers of `readme` (a path); True when the file changed."""
    return replace_between(readme, README_BEGIN, f"   {README_END}", section)


# --- GPU memory (compo.memory) ------------------------------------------------------------------------------


def memory_column(config: dict[str, Any], jobs: list[Job], rows: list[RuleRow]) -> None:
    """Fill the train row's "GPU mem needed/usable": the largest GPU memory one of its jobs needs (compo.memory)
    against the share of the profile's `gpu_mem_gb` a job may be planned to use (`usable_gb`; a job that does not
    fit is refused while the DAG is built, so the dry run fails first, naming what to set: common.smk
    get_train_gpus)."""
    from compo.config import resolve_method
    from compo.memory import train_memory

    needs: list[float | None] = []
    gpus: set[float] = set()
    for job in jobs:
        if job.rule != "train":
            continue
        recipe = resolve_method(config, job.wildcards["method"])
        needed = train_memory(recipe, config["bases"][recipe["base"]]["model"], config.get("train") or {})
        needs.append(None if needed is None else needed.total)
        if job.resources.get("gpu_mem_gb"):
            gpus.add(float(job.resources["gpu_mem_gb"]))
    known = [n for n in needs if n is not None]
    column = (f"{max(known):.1f}" if known else "no figure") + (f"/{usable_gb(min(gpus)):.1f}" if gpus else "")
    for row in rows:
        if row.rule == "train" and needs:
            row.gpu_mem = column
