"""What a GPU job of the study takes from first principles, beside `compo.plan`'s estimate (issue 56): the check
that every estimate the rules ask for is within ESTIMATE_RATIO of the work (docs/paper-scale.md's table, from
tools/paper_scale_table.py; tests/test_plan.py holds the ratio).

Counted independently of the plan's FLOP tables: a transformer's forward is 2 FLOPs per parameter of its blocks
(12 d^2 a layer) per token (no attention term, no patch embedding), a training step 3 forwards (+1 with gradient
accumulation's no-grad pass, +1 for a teacher's), over the project's stated rate (`compo.plan.model_tflops`: the
H200's measured rate, the GPU's speed, the model's utilisation); decoding at the measured ms per image of each size
(`compo.plan.DECODE_MS`) over the job's decode workers, the job taking the longer of the two. An LLM shard: 2 FLOPs
per parameter and token at MFU_LLM of the GPUs' dense bf16 peak. An SDXL-Turbo image: Stability AI's published
A100 timing. Probe fits and start-up: the plan's own figures (no independent count).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compo import plan
from compo.memory import accum_freq, gpus, has_teacher, rows_per_caption

ESTIMATE_RATIO = 1.5   # every estimate within this factor of its first-principles figure
# The towers' transformer blocks: (width, layers, tokens an input). ViT-B-16-SigLIP's image tower is timm's
# vit_base_patch16_siglip_224 (196 patches, no class token); text: the open_clip config's width, layers and context.
IMAGE_TOWER = {"ViT-B-32-quickgelu": (768, 12, 50), "ViT-B-16-SigLIP": (768, 12, 196)}
# Dense bf16 tensor peak of one GPU, TFLOP/s (NVIDIA's data sheets, without sparsity).
GPU_PEAK_BF16 = {"h200": 989.0, "h100": 989.0, "a100": 312.0, "l40s": 362.0, "a40": 150.0}
MFU_LLM = 0.35         # ASSUMPTION: a batched vLLM engine's share of the peak
LLM_PARAMETERS = {"meta-llama/Llama-3.1-8B-Instruct": 8.03e9, "Qwen/Qwen3-32B": 32.8e9}
# Stability AI's SDXL-Turbo announcement (2023-11-28): a 512x512 image in 207 ms on an A100 (fp16, batch 1), of
# which the UNet's single step 67 ms; the rest (prompt encoding, VAE) 140 ms.
SDXL_A100_STEP_MS, SDXL_A100_REST_MS = 67.0, 140.0


def forward_gflops(width: int, layers: int, tokens: int) -> float:
    """A transformer's forward: 2 FLOPs per block parameter (12 d^2 a layer) per token."""
    return 2 * 12 * width**2 * layers * tokens / 1e9


def sample_gflops(recipe: dict[str, Any], model_name: str) -> float:
    """One training sample: its images and texts (`rows_per_caption`) through the towers, 3 forwards for forward
    and backward, +1 with accumulation, +1 for a teacher."""
    from compo.architectures import model_config

    text = model_config(model_name)["text_cfg"]
    context = (recipe.get("text") or {}).get("context_length") or text["context_length"]
    images, texts = rows_per_caption(recipe)
    forward = (images * forward_gflops(*IMAGE_TOWER[model_name])
               + texts * forward_gflops(text["width"], text["layers"], context))
    return forward * (3 + (accum_freq(recipe) > 1) + has_teacher(recipe))


def train_minutes(config: dict[str, Any], method: str, dataset: str, gpu_model: str | None) -> float | None:
    from compo.config import resolve_method

    recipe = resolve_method(config, method)
    model = config["bases"][recipe["base"]]["model"]
    steps, batch = recipe.get("train", {}).get("steps", 0), recipe.get("train", {}).get("batch_size", 0)
    if model not in IMAGE_TOWER:
        return None
    compute = steps * batch * sample_gflops(recipe, model) / (plan.model_tflops(model, gpu_model) * 1e3) / 60
    source = config["datasets"][dataset].get("source")
    threads = int((config.get("train") or {}).get("threads", 1))
    decode = plan.train_decode_minutes(recipe, source, threads, gpus(recipe))
    return max(compute / gpus(recipe), decode) + plan.JOB_OVERHEAD_MIN


def llm_minutes(spec: dict[str, Any], captions: int | None, gpu_model: str | None) -> float | None:
    parameters = LLM_PARAMETERS.get(spec.get("model"))
    prompt = plan.PROMPT_TOKENS.get(spec.get("generator"))
    if parameters is None or prompt is None or captions is None:
        return None
    tokens = captions / int(spec.get("shards", 1)) * int(spec.get("k", 1)) * (prompt + spec.get("max_new_tokens", 64))
    engine = int((spec.get("vllm") or {}).get("tensor_parallel_size", 1))
    peak = GPU_PEAK_BF16[str(gpu_model or plan.DEFAULT_GPU).lower()] * 1e12 * engine * MFU_LLM
    return tokens * 2 * parameters / peak / 60 + plan.JOB_OVERHEAD_MIN


def image_minutes(spec: dict[str, Any], captions: int | None, gpu_model: str | None) -> float | None:
    images = plan.negative_images(spec, captions)
    if images is None:
        return None
    edit = spec["images"]
    steps = max(1, int(edit.get("steps", 4) * edit.get("strength", 1.0)))
    pixels = (edit.get("resolution", 512) / 512) ** 2
    a100 = plan.gpu_speed("a100") / plan.gpu_speed(gpu_model)   # the A100's time, on the job's GPU
    ms = (steps * SDXL_A100_STEP_MS + SDXL_A100_REST_MS) * pixels * a100
    return images / int(edit.get("shards", 1)) * ms / 1e3 / 60 + plan.JOB_OVERHEAD_MIN


def eval_minutes(specs: Mapping[str, dict[str, Any]], model_name: str, threads: int, gpu_model: str | None
                 ) -> float | None:
    from compo.architectures import model_config

    sizes = [plan.benchmark_size(spec, name) for name, spec in specs.items()]
    if model_name not in IMAGE_TOWER or any(size is None for size in sizes):
        return None
    text = model_config(model_name)["text_cfg"]
    images, texts = sum(s.images for s in sizes), sum(s.texts for s in sizes)
    rate = plan.model_tflops(model_name, gpu_model) * 1e3
    forward = (images * forward_gflops(*IMAGE_TOWER[model_name])
               + texts * forward_gflops(text["width"], text["layers"], text["context_length"])) / rate
    decode = images * plan.DECODE_MS[plan.DEFAULT_IMAGE] / 1e3 / plan.decode_workers(threads)
    fits = sum(s.probe_train for s in sizes) / 1e5 * plan.PROBE_FIT_MIN_PER_100K / plan.gpu_speed(gpu_model)
    return max(forward, decode) / 60 + fits + plan.JOB_OVERHEAD_MIN


def job_minutes(config: dict[str, Any], rule: str, wildcards: Mapping[str, str], gpu_model: str | None = None
                ) -> float | None:
    """First-principles minutes of one job (None: a rule without a figure: CPU rules)."""
    if rule == "train":
        return train_minutes(config, wildcards["method"], wildcards["dataset"], gpu_model)
    if rule == "pretrain":
        return plan.JOB_OVERHEAD_MIN   # exports the pretrained weights: start-up only
    if rule in ("negatives_shard", "negative_images_shard"):
        spec = config["negatives"][wildcards["generator"]]
        captions = plan.dataset_captions(config["datasets"][wildcards["dataset"]])
        return (llm_minutes if rule == "negatives_shard" else image_minutes)(spec, captions, gpu_model)
    if rule in ("evaluate", "evaluate_wiseft"):
        specs = {name: config["benchmarks"][name] for name in plan.eval_benchmarks(config, rule)}
        threads = int((config.get("evaluate") or {}).get("threads", 1))
        return eval_minutes(specs, plan.model_of(config, wildcards["model"]), threads, gpu_model)
    if rule == "concreteplant_table":
        return concreteplant_minutes(config, wildcards["dataset"], gpu_model)
    return None


def concreteplant_minutes(config: dict[str, Any], dataset: str, gpu_model: str | None) -> float | None:
    captions = plan.dataset_captions(config["datasets"][dataset])
    policies = [s for s in config["negatives"].values() if s["generator"].startswith("concreteplant-")]
    base = config["bases"]["clip" if "clip" in config["bases"] else sorted(config["bases"])[0]]["model"]
    if captions is None or base not in IMAGE_TOWER:
        return None
    anchors, negatives = captions * len(policies), sum(plan.negative_images(s, captions) for s in policies)
    threads = int((config.get("evaluate") or {}).get("threads", 1))
    decode = (anchors * plan.DECODE_MS[plan.DEFAULT_IMAGE] + negatives * plan.DECODE_MS[plan.NEGATIVE_IMAGE]) / 1e3
    forward = (anchors + negatives) * forward_gflops(*IMAGE_TOWER[base]) / (plan.model_tflops(base, gpu_model) * 1e3)
    return max(decode / plan.decode_workers(threads), forward) / 60 + plan.JOB_OVERHEAD_MIN
