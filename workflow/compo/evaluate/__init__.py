"""Evaluating one model on one benchmark: `evaluate` is the entry point of `compo evaluate`.

One module per benchmark kind reads the real benchmark's file format, which the synthetic world also writes,
and declares the kind (`compo.evaluate.kinds`: its scorer `run(loaded, benchmark_dir, spec, templates) ->
BenchmarkResult`, its files, images, size, subsets and chance level). The result is one self-describing JSON
per model and benchmark:

    {"model": "negclip/coco/seed0", "benchmark": "sugarcrepe", "kind": "sugarcrepe",
     "protocol": "sugarcrepe-itm-strict", "headline": "overall",
     "metrics": {"replace_obj": {"value": 0.71, "n": 200}, ...}, "skipped": {"missing_image": 3},
     "model_dir": "results/models/negclip/coco/seed0", "checkpoint_sha256": "9f2c..."}

Metric values are fractions in [0, 1]; `n` is the number of items behind each. Per-item predictions go
to a parquet table (contract `predictions`, plus a `rank` column: the pessimistic rank of the right
candidate, so `correct` is `rank == 1`; ARO Order's is its released argmax rank, with `rank_strict` beside
it). Skipped items (missing or unreadable images) are counted by reason in "skipped" and the log; a
benchmark (or SugarCrepe subset) left with no item is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compo.evaluate.files import BenchmarkError
from compo.evaluate.kinds import benchmark_files, declared, kind_of
from compo.io import write_json, write_table
from compo.layout import INDEX_HASHES
from compo.provenance import file_sha256

if TYPE_CHECKING:
    from compo.evaluate.common import BenchmarkResult
    from compo.models import LoadedModel

__all__ = ["BenchmarkError", "BenchmarkResult", "Metric", "evaluate", "pessimistic_rank",
           "benchmark_files", "declared", "result_record", "run_benchmark"]

log = logging.getLogger(__name__)


def loader(kind: str) -> Callable[..., BenchmarkResult]:
    """The scorer of a benchmark kind, as its module declares it (`compo.evaluate.kinds`)."""
    return kind_of(kind).run


def __getattr__(name: str) -> Any:
    """The scoring building blocks of `compo.evaluate.scoring` (torch), imported when first asked for."""
    if name in ("BenchmarkResult", "Metric"):
        from compo.evaluate import common

        return getattr(common, name)
    if name == "pessimistic_rank":
        from compo.evaluate import scoring

        return scoring.pessimistic_rank
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_benchmark(loaded: LoadedModel, spec: dict[str, Any], benchmark_dir: str | Path,
                  templates: list[str] | None = None, prepared: str | Path | None = None) -> BenchmarkResult:
    """Score `loaded` on one benchmark; `prepared`: what its kind's `prepare` wrote (rule prepare_benchmark),
    None to do that work here."""
    run = loader(spec.get("kind"))
    benchmark_dir = Path(benchmark_dir)
    if not benchmark_dir.is_dir():
        raise BenchmarkError(f"{benchmark_dir}: benchmark folder not found")
    if prepared is None:
        return run(loaded, benchmark_dir, spec, templates)
    return run(loaded, benchmark_dir, spec, templates, prepared=Path(prepared))


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
             model_id: str, truncate_words: int | None = None,
             settings: dict[str, Any] | None = None) -> None:
    """Evaluate the model in `model_dir` on benchmark `benchmark` (config entry `spec`, files in
    `benchmark_dir`); write the result JSON to `out` and per-item predictions to `predictions`."""
    evaluate_many(model_dir, {benchmark: {"spec": spec, "dir": str(benchmark_dir), "out": str(out),
                                          "predictions": str(predictions)}}, templates, model_id=model_id,
                  truncate_words=truncate_words, settings=settings)


def load_for_evaluation(model: str | Path | dict[str, Any], settings: dict[str, Any] | None = None) -> LoadedModel:
    """The model of folder `model` (or the base `model` describes: config `bases.<name>` keys, read from its
    weights file, compo.models.load_base) as evaluation encodes with it. settings: the config's `evaluate:`
    section (device, precision, threads: torch threads, and DataLoader workers decoding images on a GPU)."""
    from compo.devices import data_workers, set_threads
    from compo.models import load_base, load_model

    settings = settings or {}
    if "threads" in settings:
        set_threads(settings["threads"])  # fixed, so results do not depend on the machine's core count
    load = load_base if isinstance(model, dict) else load_model
    loaded = load(model, settings.get("device", "auto"), settings.get("precision", "auto"))
    if loaded.device.type != "cuda":
        return loaded  # on the CPU the job's threads encode; decoding stays in this process
    return replace(loaded, workers=data_workers(settings.get("threads", 1), loaded.device))


def evaluate_many(model_dir: str | Path | dict[str, Any], benchmarks: dict[str, dict[str, Any]],
                  templates: list[str] | None = None, *, model_id: str, truncate_words: int | None = None,
                  settings: dict[str, Any] | None = None, index: str | Path | None = None) -> list[dict[str, Any]]:
    """Evaluate one model on several benchmarks, loading it once. `benchmarks` maps each benchmark name
    to {spec, dir, out, predictions[, prepared]}; one result JSON and one predictions table per benchmark. `index`:
    where to write, last, the list of the result JSONs (compo.layout.EVAL_INDEX; each must sit in the index's folder).
    `truncate_words`: the text protocol of the model's recipe (LongCLIP-70: inputs cut to 70 words).
    settings: the config's `evaluate:` section (see `load_for_evaluation`). `model_dir`: a model folder, or a
    base's keys (model, init, weights or hub/file, format: `compo eval`), whose weights file the records name.
    Returns the records written, in order."""
    from compo.evaluate.text import protocol_suffix, with_text_protocol
    from compo.evaluate.zeroshot import shared_split_features
    from compo.models import NonFiniteEmbeddings, base_file
    from compo.progress import progress

    loaded = with_text_protocol(load_for_evaluation(model_dir, settings), truncate_words)
    suffix = protocol_suffix(truncate_words)
    weights = base_file(model_dir) if isinstance(model_dir, dict) else None
    records: list[dict[str, Any]] = []
    with shared_split_features():  # a split read by several benchmarks (ImageNet's) is embedded once
        for benchmark, job in progress(benchmarks.items(), total=len(benchmarks), desc=f"evaluate {model_id}",
                                       unit="benchmark", mininterval=0):
            spec = job["spec"]
            try:
                result = run_benchmark(loaded, spec, job["dir"], templates, job.get("prepared"))
            except NonFiniteEmbeddings as error:  # a diverged model: an error, never a score
                raise BenchmarkError(f"{model_id} on {benchmark}: {error}") from error
            record = result_record(result, model_id, benchmark, spec["kind"])
            record["protocol"] += suffix
            # the bytes scored: aggregation refuses the result once the model folder holds others (compo.provenance)
            where = {"weights": str(weights)} if weights else {"model_dir": str(model_dir)}
            record.update(where, checkpoint_sha256=loaded.checkpoint_sha256)
            summary = ", ".join(f"{name}={m.value:.4f} (n={m.n})" for name, m in result.metrics.items())
            log.info("%s on %s: %s", model_id, benchmark, summary)
            write_table(result.predictions, job["predictions"], "predictions")
            write_json(record, job["out"])
            records.append(record)
    if index is not None:
        outs = [Path(job["out"]) for job in benchmarks.values()]
        if any(out.parent != Path(index).parent for out in outs):
            raise ValueError(f"{index}: every result JSON must be written in the index's folder")
        # each result's bytes: a result edited after this is refused where it is read (compo.layout)
        write_json({"model": model_id, "results": [out.name for out in outs],
                    INDEX_HASHES: {out.name: file_sha256(out) for out in outs}}, index)
    return records
