"""Evaluating one model on one benchmark: `evaluate` is the entry point of `compo evaluate`.

One loader per benchmark kind (a module here with `run(loaded, benchmark_dir, spec, templates) ->
BenchmarkResult`) reads the real benchmark's file format, which the synthetic world also writes. The
result is one self-describing JSON per model and benchmark:

    {"model": "negclip/coco/seed0", "benchmark": "sugarcrepe", "kind": "sugarcrepe",
     "protocol": "sugarcrepe-itm-strict", "headline": "overall",
     "metrics": {"replace_obj": {"value": 0.71, "n": 200}, ...}, "skipped": {"missing_image": 3}}

Metric values are fractions in [0, 1]; `n` is the number of items behind each. Per-item predictions go
to a parquet table (contract `predictions`, plus a `rank` column: the pessimistic rank of the right
candidate, so `correct` is `rank == 1`). Skipped items (missing or unreadable images) are counted by
reason in "skipped" and the log; a benchmark (or SugarCrepe subset) left with no item is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from compo.evaluate import (
    aro,
    linear_probe,
    long_retrieval,
    retrieval,
    sugarcrepe,
    sugarcrepe_pp,
    valse,
    winoground,
    zeroshot,
)
from compo.evaluate.common import BenchmarkError, BenchmarkResult, Metric, pessimistic_rank
from compo.io import write_json, write_table
from compo.models import LoadedModel, load_model

__all__ = ["LOADERS", "BenchmarkError", "BenchmarkResult", "Metric", "evaluate", "pessimistic_rank",
           "benchmark_files", "result_record", "run_benchmark"]

log = logging.getLogger(__name__)

LOADERS: dict[str, Callable[..., BenchmarkResult]] = {
    "sugarcrepe": sugarcrepe.run,
    "zeroshot": zeroshot.run,
    "retrieval": retrieval.run,
    "sugarcrepe_pp": sugarcrepe_pp.run,
    "winoground": winoground.run,
    "aro_relation": aro.run_relation,
    "aro_attribution": aro.run_attribution,
    "aro_order": aro.run_order,
    "valse": valse.run,
    "linear_probe": linear_probe.run,
    "long_retrieval": long_retrieval.run,
}


def benchmark_files(kind: str, benchmark_dir: str, spec: dict[str, Any] | None = None) -> list[str]:
    """The files that define a benchmark of this kind in `benchmark_dir` (evaluation reruns when they
    change); `spec` (the config entry) is needed only for VALSE's `pieces`."""
    files: dict[str, list[str]] = {
        "sugarcrepe": [f"{subset}.json" for subset in sugarcrepe.SUBSETS],
        "sugarcrepe_pp": [f"{subset}.json" for subset in sugarcrepe_pp.SUBSETS],
        "zeroshot": [zeroshot.CLASSNAMES],
        "linear_probe": [zeroshot.CLASSNAMES],
        "retrieval": [retrieval.DATASET_JSON],
        "long_retrieval": [retrieval.DATASET_JSON],
        "aro_order": [retrieval.DATASET_JSON],
        "winoground": [winoground.EXAMPLES],
        "aro_relation": [aro.RELATION_FILE],
        "aro_attribution": [aro.ATTRIBUTION_FILE],
        "valse": [f"{piece}.json" for piece in valse.pieces_of(spec or {})],
    }
    if kind not in files:
        raise BenchmarkError(f"benchmark kind {kind!r} unknown (known: {', '.join(sorted(files))})")
    return [f"{benchmark_dir}/{name}" for name in files[kind]]


def run_benchmark(loaded: LoadedModel, spec: dict[str, Any], benchmark_dir: str | Path,
                  templates: list[str] | None = None) -> BenchmarkResult:
    kind = spec.get("kind")
    if kind not in LOADERS:
        raise BenchmarkError(f"benchmark kind {kind!r} unknown (known: {', '.join(sorted(LOADERS))})")
    benchmark_dir = Path(benchmark_dir)
    if not benchmark_dir.is_dir():
        raise BenchmarkError(f"{benchmark_dir}: benchmark folder not found")
    return LOADERS[kind](loaded, benchmark_dir, spec, templates)


def result_record(result: BenchmarkResult, model_id: str, benchmark: str, kind: str) -> dict[str, Any]:
    return {
        "model": model_id,
        "benchmark": benchmark,
        "kind": kind,
        "protocol": result.protocol,
        "headline": result.headline,
        "metrics": {name: asdict(metric) for name, metric in result.metrics.items()},
        "skipped": dict(result.skipped),
    }


def evaluate(model_dir: str | Path, benchmark: str, spec: dict[str, Any], benchmark_dir: str | Path,
             out: str | Path, predictions: str | Path, templates: list[str] | None = None, *,
             model_id: str, settings: dict[str, Any] | None = None) -> None:
    """Evaluate the model in `model_dir` on benchmark `benchmark` (config entry `spec`, files in
    `benchmark_dir`); write the result JSON to `out` and per-item predictions to `predictions`."""
    evaluate_many(model_dir, {benchmark: {"spec": spec, "dir": str(benchmark_dir), "out": str(out),
                                          "predictions": str(predictions)}}, templates, model_id=model_id,
                  settings=settings)


def load_for_evaluation(model_dir: str | Path, settings: dict[str, Any] | None = None) -> LoadedModel:
    """The model of `model_dir` as evaluation encodes with it. settings: the config's `evaluate:` section
    (device, precision, threads: torch threads, and DataLoader workers decoding images on a GPU)."""
    from compo.devices import data_workers, set_threads

    settings = settings or {}
    if "threads" in settings:
        set_threads(settings["threads"])  # fixed, so results do not depend on the machine's core count
    loaded = load_model(model_dir, settings.get("device", "auto"), settings.get("precision", "auto"))
    if loaded.device.type != "cuda":
        return loaded  # on the CPU the job's threads encode; decoding stays in this process
    return replace(loaded, workers=data_workers(settings.get("threads", 1), loaded.device))


def evaluate_many(model_dir: str | Path, benchmarks: dict[str, dict[str, Any]],
                  templates: list[str] | None = None, *, model_id: str,
                  settings: dict[str, Any] | None = None) -> None:
    """Evaluate one model on several benchmarks, loading it once. `benchmarks` maps each benchmark name
    to {spec, dir, out, predictions}; one result JSON and one predictions table per benchmark.
    settings: the config's `evaluate:` section (see `load_for_evaluation`)."""
    from compo.evaluate.text import protocol_suffix, with_text_protocol

    # a recipe's evaluation-time text handling (LongCLIP-70: inputs truncated to 70 words)
    loaded = with_text_protocol(load_for_evaluation(model_dir, settings), model_dir)
    suffix = protocol_suffix(model_dir)
    for benchmark, job in benchmarks.items():
        spec = job["spec"]
        result = run_benchmark(loaded, spec, job["dir"], templates)
        record = result_record(result, model_id, benchmark, spec["kind"])
        record["protocol"] += suffix
        summary = ", ".join(f"{name}={m.value:.4f} (n={m.n})" for name, m in result.metrics.items())
        log.info("%s on %s: %s", model_id, benchmark, summary)
        write_table(result.predictions, job["predictions"], "predictions")
        write_json(record, job["out"])
