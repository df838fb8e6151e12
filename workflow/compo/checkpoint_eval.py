"""`compo eval`: evaluate checkpoints on benchmarks without writing a config, as CLIP_benchmark's `eval` does.

A checkpoint is an open_clip model name with `--pretrained`: a weights file (open_clip's state dict, an
open_clip_train checkpoint, a safetensors file; `--format longclip` for Long-CLIP's release) or an open_clip
pretrained tag read from the config's model cache (`compo prefetch`). It is loaded as the study loads a base
(`compo.models.load_base`) and scored by the study's own `compo.evaluate.evaluate_many`, so the result JSONs
and predictions are the study's, under OUT/<name>/. Benchmarks are a config's entries by name (their folder
as the rules resolve it, `compo.layout.benchmark_dir`) or a folder of a kind given directly (the kind's
defaults). Everything named is checked before any model loads. OUT/results.csv holds one row per (model,
benchmark, metric), as CLIP_benchmark's `build` writes its table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from compo.config import ConfigError, safe_name_problem, validate_schema
from compo.evaluate.files import BenchmarkError
from compo.evaluate.kinds import benchmark_files, kind_of
from compo.io import atomic_path
from compo.layout import EVAL_INDEX, benchmark_dir, predictions_path

FORMATS = ("open_clip", "longclip")  # bases.<name>.format: the layouts compo.models.create_base reads
WEIGHTS_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
RESULTS_CSV = "results.csv"
# one row per (model, benchmark, metric); `headline`: the metric that summarises the benchmark (the printed table's)
CSV_COLUMNS = ["model", "pretrained", "benchmark", "kind", "metric", "value", "n", "headline"]


@dataclass(frozen=True)
class Checkpoint:
    """One model to evaluate: its output folder's `name`, the open_clip `model`, `pretrained` as given, and
    the base keys it loads with (compo.models.load_base)."""

    name: str
    model: str
    pretrained: str
    base: dict[str, Any]


def _is_file_argument(pretrained: str) -> bool:
    return ("/" in pretrained or pretrained.endswith(WEIGHTS_SUFFIXES) or pretrained.startswith("~")
            or Path(pretrained).exists())


def default_name(model: str, pretrained: str) -> str:
    """OUT/<name>: the model and the weights file's stem (or the tag), as a config name."""
    stem = Path(pretrained).stem if _is_file_argument(pretrained) else pretrained
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{model}-{stem}")


def checkpoints(models: list[str], pretrained: list[str], formats: list[str] | None = None,
                names: list[str] | None = None) -> list[Checkpoint]:
    """Pair each `--model` with its `--pretrained` (and `--format`, `--name`: one each, or one `--format` for
    all); every weights file is checked to open (compo.models.check_weights_file) and every model name to be
    open_clip's, before anything loads."""
    from compo.models import check_weights_file, model_config, pretrained_weights_source

    formats, names = formats or [], names or []
    if not models or len(models) != len(pretrained):
        raise ValueError(f"give each --model its --pretrained: {len(models)} --model, {len(pretrained)} --pretrained")
    if len(formats) not in (0, 1, len(models)):
        raise ValueError(f"--format: give one for every model or one for all ({len(formats)} for {len(models)})")
    if names and len(names) != len(models):
        raise ValueError(f"--name: give one for every model ({len(names)} for {len(models)})")
    formats = formats * len(models) if len(formats) == 1 else formats or ["open_clip"] * len(models)
    found: list[Checkpoint] = []
    for i, (model, weights) in enumerate(zip(models, pretrained, strict=True)):
        model_config(model)  # an unknown name is an error naming it
        if formats[i] not in FORMATS:
            raise ValueError(f"--format {formats[i]!r}: expected one of {', '.join(FORMATS)}")
        if _is_file_argument(weights):
            path = check_weights_file(weights, f"--pretrained (of --model {model})")
            base = {"model": model, "init": "released", "weights": str(path), "format": formats[i]}
        else:  # an open_clip tag: its weights come from the model cache, as a base's do
            try:
                pretrained_weights_source(model, weights)
            except ValueError as error:
                raise ValueError(f"--pretrained {weights!r}: no such weights file, nor an open_clip tag of "
                                 f"{model} ({error})") from None
            base = {"model": model, "init": weights, "format": formats[i]}
        name = names[i] if names else default_name(model, weights)
        problem = safe_name_problem(name)
        if problem is not None:
            raise ValueError(f"--name: {problem}")
        found.append(Checkpoint(name, model, weights, base))
    repeated = sorted({c.name for c in found if [d.name for d in found].count(c.name) > 1})
    if repeated:
        raise ValueError(f"two models would write OUT/{repeated[0]}: give each a --name")
    return found


def check_weights_resolve(found: list[Checkpoint]) -> None:
    """Each open_clip tag's weights found in the model cache, and opening, before any model loads (a file
    named directly was checked by `checkpoints`)."""
    from compo.artifacts import ArtifactMissing
    from compo.models import base_file, check_weights_file

    for checkpoint in found:
        if checkpoint.base.get("weights"):
            continue
        where = f"--pretrained {checkpoint.pretrained} (of --model {checkpoint.model})"
        try:
            path = base_file(checkpoint.base)
        except ArtifactMissing as error:
            raise ValueError(f"{where}: {error}") from None
        check_weights_file(path, where)


def benchmark_jobs(config: dict[str, Any], names: list[str], folders: list[str]) -> dict[str, dict[str, Any]]:
    """{benchmark: {spec, dir}}: the config's benchmarks `names` (folder as the rules resolve it) and the
    `KIND=PATH` folders (the kind's defaults, named by the kind). Unknown names or kinds, a repeated name and a
    benchmark whose files are missing are errors before any model loads."""
    known = config.get("benchmarks", {})
    jobs: dict[str, dict[str, Any]] = {}
    for name in names:
        if name not in known:
            raise ConfigError(f"--benchmarks {name}: not a benchmark of the config (known: {', '.join(known)}); "
                              "or give a folder with --benchmark-dir KIND=PATH")
        if name in jobs:
            raise ValueError(f"--benchmarks {name}: named twice")
        jobs[name] = {"spec": known[name], "dir": benchmark_dir(config["results"], known[name])}
    direct: dict[str, dict[str, Any]] = {}
    for item in folders:
        kind, sep, path = item.partition("=")
        if not sep or not kind or not path:
            raise ValueError(f"--benchmark-dir {item!r}: expected KIND=PATH")
        kind_of(kind)  # an unknown kind is an error listing the known ones
        if kind in jobs or kind in direct:
            raise ValueError(f"--benchmark-dir {item}: benchmark {kind} named twice")
        direct[kind] = {"kind": kind, "source": "files", "path": path}
    if direct:  # the defaults must make a valid entry (a kind needing more keys says which)
        validate_schema({**config, "benchmarks": {**known, **direct}})
    jobs |= {kind: {"spec": spec, "dir": spec["path"]} for kind, spec in direct.items()}
    if not jobs:
        raise ValueError("name benchmarks: --benchmarks NAME ... and/or --benchmark-dir KIND=PATH")
    for name, job in jobs.items():
        if not Path(job["dir"]).is_dir():
            hint = (" (a world benchmark: the workflow writes it, snakemake world_benchmarks)"
                    if job["spec"]["source"] == "world" else "")
            raise BenchmarkError(f"benchmark {name}: folder {job['dir']} not found{hint}")
        missing = [f for f in benchmark_files(job["spec"]["kind"], job["dir"], job["spec"]) if not Path(f).exists()]
        if missing:
            raise BenchmarkError(f"benchmark {name}: {len(missing)} of its files missing, first {missing[0]}")
    return jobs


def evaluate_checkpoints(found: list[Checkpoint], jobs: dict[str, dict[str, Any]], out: str | Path,
                         templates: list[str] | None, settings: dict[str, Any],
                         truncate_words: int | None = None) -> pd.DataFrame:
    """Each checkpoint on each benchmark (compo.evaluate.evaluate_many, the study's evaluation): result JSONs,
    predictions and the evaluation index under OUT/<name>/, and OUT/results.csv (CSV_COLUMNS), returned."""
    from compo.evaluate import evaluate_many

    out = Path(out)
    rows = []
    for checkpoint in found:
        folder = out / checkpoint.name
        model_jobs = {name: {**job, "out": str(folder / f"{name}.json"),
                             "predictions": predictions_path(folder / f"{name}.json")} for name, job in jobs.items()}
        records = evaluate_many(checkpoint.base, model_jobs, templates, model_id=checkpoint.name,
                                truncate_words=truncate_words, settings=settings, index=folder / EVAL_INDEX)
        rows += [{"model": checkpoint.name, "pretrained": checkpoint.pretrained, "benchmark": record["benchmark"],
                  "kind": record["kind"], "metric": metric, "value": value["value"], "n": value["n"],
                  "headline": metric == record["headline"]}
                 for record in records for metric, value in record["metrics"].items()]
    table = pd.DataFrame(rows, columns=CSV_COLUMNS)
    with atomic_path(out / RESULTS_CSV) as tmp:
        table.to_csv(tmp, index=False)
    return table


def headline_table(table: pd.DataFrame) -> str:
    """The printed summary: one line per (model, benchmark) with its headline metric."""
    rows = table[table["headline"]]
    width = max([len("model"), *rows["model"].str.len()])
    bench = max([len("benchmark"), *rows["benchmark"].str.len()])
    lines = [f"{'model':{width}s}  {'benchmark':{bench}s}  {'metric':14s}  {'value':>7s}  {'n':>7s}"]
    lines += [f"{r.model:{width}s}  {r.benchmark:{bench}s}  {r.metric:14s}  {r.value:7.4f}  {r.n:7d}"
              for r in rows.itertuples()]
    return "\n".join(lines)
