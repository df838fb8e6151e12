"""`compo <stage>`: every workflow stage as a command, the single entry point the Snakemake rules call.

Structured settings (a config section) are passed as JSON strings so a rule hands over exactly the
part of the config its stage depends on.

Output: with `--log FILE` everything the stage writes to stderr (its log lines, warnings of the libraries
it calls, progress bars) goes to FILE, so a rule's log holds the whole story. A failure prints one line
to the terminal saying what is wrong and where (`compo train: ConfigError: config key ...`) and exits
with status 1; the traceback goes to the log, or to the terminal as well with `--debug`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from compo import forkserver
from compo.layout import rank_path
from compo.resource_use import write_use

log = logging.getLogger("compo.cli")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from error


@contextlib.contextmanager
def _stderr_to(path: str | None) -> Iterator[TextIO]:
    """Point the process's stderr (file descriptor 2, so C libraries and subprocesses too) at `path`
    for the block; yields a stream to the terminal's stderr. Without `path` stderr stays as it is."""
    if not path:
        yield sys.stderr
        return
    path = rank_path(path)  # under torchrun every rank logs: one file each
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved_fd = os.dup(2)
    saved_stream = sys.stderr
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115  (fd 2, restored below)
    terminal = open(saved_fd, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        yield terminal
    finally:
        sys.stderr.flush()
        terminal.flush()
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        sys.stderr = saved_stream


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        handlers=[logging.StreamHandler(sys.stderr)], force=True)


# What a job that ran out of memory or disk should change, by command.
MEMORY_ADVICE = {
    "train": "raise mem_mb of rules train / pretrain in the workflow profile, or lower the recipe's "
             "train.batch_size",
    "evaluate": "raise mem_mb of rule evaluate in the workflow profile",
    "negatives": "raise mem_mb of rule negatives in the workflow profile (very long captions: see "
                 "negatives.<name>.max_caption_chars)",
}


def _mb(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:,.0f} MB"


def describe_failure(command: str, error: BaseException) -> str:
    """One line: what went wrong, where, and for memory or disk exhaustion how much and what to change."""
    from compo.io import is_disk_full

    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, MemoryError) or (isinstance(error, RuntimeError) and (
            "not enough memory" in text or "out of memory" in text.lower())):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        limit_text = "" if limit == resource.RLIM_INFINITY else f" of the {_mb(limit)} address-space limit"
        advice = MEMORY_ADVICE.get(command, f"raise mem_mb of the rule running `compo {command}`")
        detail = f" ({text})" if text != "MemoryError" else ""
        return (f"out of memory{detail}; peak resident memory {_mb(peak)}{limit_text}: {advice}")
    if is_disk_full(error):
        where = Path(error.filename or ".")
        folder = next((p for p in [where, *where.parents] if p.exists()), Path("."))
        free = shutil.disk_usage(folder).free
        return (f"disk full writing {error.filename or '(unnamed file)'}: {error.strerror}; "
                f"{_mb(free)} free on {folder}: free space there or set the config key `results` to a "
                "larger disk")
    return f"{type(error).__name__}: {text}"


def _cmd_world(a: argparse.Namespace) -> None:
    from compo.world import generate_split

    generate_split(a.split, a.world, seed=a.seed, out_dir=a.out)


def _cmd_benchmarks(a: argparse.Namespace) -> None:
    from compo.world import generate_benchmarks

    generate_benchmarks(a.world, seed=a.seed, out_dir=a.out)


def _cmd_prepare_benchmark(a: argparse.Namespace) -> None:
    from compo.evaluate.kinds import kind_of

    if not isinstance(a.spec, dict):
        raise ValueError(f"--spec: expected the benchmark's config entry (a JSON object), got "
                         f"{json.dumps(a.spec)[:80]}")
    prepare = kind_of(a.spec.get("kind")).prepare
    if prepare is None:
        raise ValueError(f"--spec: benchmark kind {a.spec.get('kind')!r} has no model-independent preparation")
    prepare(a.spec, Path(a.dir), Path(a.out))


def _cmd_benchmark_set(a: argparse.Namespace) -> None:
    from compo.evaluate.files import write_benchmark_set

    write_benchmark_set(a.benchmarks, a.out)


def _cmd_dataset(a: argparse.Namespace) -> None:
    from compo.data import build_manifest

    build_manifest(a.name, a.spec, out=a.out, world_manifest=a.world_manifest, report=a.report, threads=a.threads)


def _cmd_overlap(a: argparse.Namespace) -> None:
    from compo.overlap import check_overlap

    check_overlap(a.name, a.manifest, a.benchmarks, a.out, accept=a.accept, threads=a.threads)


def _cmd_parse(a: argparse.Namespace) -> None:
    from compo.parse import parse_manifest

    parse_manifest(a.manifest, out=a.out, report=a.report, spacy_model=a.spacy_model, batch_size=a.batch_size,
                   processes=a.threads)


def _cmd_concreteness(a: argparse.Namespace) -> None:
    from compo.concreteness import score_parse

    score_parse(a.parse, out=a.out, norms=a.norms, sha256=a.sha256, seed=a.seed)


def _cmd_negatives(a: argparse.Namespace) -> None:
    from compo.negatives import generate_negatives

    generate_negatives(a.manifest, a.parse, a.spec, seed=a.seed, out=a.out, report=a.report,
                       concreteness=a.concreteness, shard=a.shard, n_shards=a.n_shards, images_dir=a.images_dir)


def _cmd_negatives_gather(a: argparse.Namespace) -> None:
    from compo.negatives import gather_negatives

    gather_negatives(a.shards, a.out, a.report, a.shard_reports)


def _cmd_negative_images(a: argparse.Namespace) -> None:
    from compo.negatives.diffusion import generate_negative_images

    generate_negative_images(a.negatives, a.manifest, a.spec, seed=a.seed, out=a.out, report=a.report,
                             image_dir=a.images, shard=a.shard, n_shards=a.n_shards)


def _cmd_negatives_quality(a: argparse.Namespace) -> None:
    from compo.negatives import combine_reports

    if len(a.names) != len(a.reports):
        raise SystemExit(f"--names ({len(a.names)}) and --reports ({len(a.reports)}) must pair up")
    combine_reports(dict(zip(a.names, a.reports, strict=True)), a.out)


def _cmd_attributes(a: argparse.Namespace) -> None:
    from compo.concreteness import write_dataset_attributes

    write_dataset_attributes(a.manifest, a.parse, a.out, a.dataset, norms=a.norms, sha256=a.sha256)


def _cmd_train(a: argparse.Namespace) -> None:
    from compo.monitor import live_dir
    from compo.train import train

    settings = a.settings if a.threads is None else {**a.settings, "threads": a.threads}
    train(a.recipe, manifest=a.manifest, out_dir=a.out, seed=a.seed, negatives=a.negatives,
          init_dir=a.init_dir, settings=settings, parse=a.parse, concreteness=a.concreteness,
          live=None if a.log is None else str(live_dir(a.log)), val_benchmark=a.val_benchmark)


def _cmd_evaluate(a: argparse.Namespace) -> None:
    from compo.evaluate import evaluate_many
    from compo.layout import EVAL_INDEX, predictions_path

    out_dir = Path(a.out_dir)
    if not isinstance(a.benchmarks, dict):
        raise ValueError(f"--benchmarks: expected a JSON object {{name: {{\"spec\": ..., \"dir\": ...}}}}, got "
                         f"{json.dumps(a.benchmarks)[:80]}")
    for name, entry in a.benchmarks.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("spec"), dict) and isinstance(entry.get("dir"), str)):
            raise ValueError(f"--benchmarks: entry {name!r} should be {{\"spec\": {{...}}, \"dir\": \"<folder>\"}}, "
                             f"got {json.dumps(entry)[:80]}")
    jobs = {
        name: {"spec": entry["spec"], "dir": entry["dir"], "out": str(out_dir / f"{name}.json"),
               "predictions": predictions_path(out_dir / f"{name}.json"), "prepared": entry.get("prepared")}
        for name, entry in a.benchmarks.items()
    }
    settings = {"threads": a.threads, "device": a.device, "precision": a.precision}
    evaluate_many(a.model_dir, jobs, a.templates, model_id=a.model_id, truncate_words=a.truncate_words,
                  settings=settings, index=out_dir / EVAL_INDEX)


def _cmd_eval(a: argparse.Namespace) -> None:
    from compo.artifacts import job_environment, model_cache
    from compo.checkpoint_eval import (
        RESULTS_CSV,
        benchmark_jobs,
        check_weights_resolve,
        checkpoints,
        evaluate_checkpoints,
        headline_table,
    )
    from compo.config import load_config

    # every check before any model loads: the weights files, the models, the benchmarks and their files
    config = load_config(*a.configfile)
    os.environ.update(job_environment(model_cache(config)))  # an open_clip tag's weights: the config's cache
    found = checkpoints(a.model or [], a.pretrained or [], a.format, a.name)
    check_weights_resolve(found)
    jobs = benchmark_jobs(config, a.benchmarks or [], a.benchmark_dir or [])
    settings = {**config.get("evaluate", {}), **{key: value for key, value in
                                                 {"device": a.device, "precision": a.precision,
                                                  "threads": a.threads}.items() if value is not None}}
    table = evaluate_checkpoints(found, jobs, a.out, config.get("zeroshot_templates"), settings,
                                 truncate_words=a.truncate_words)
    print(headline_table(table))
    print(f"{len(table)} rows -> {Path(a.out) / RESULTS_CSV}; result JSONs and predictions in {a.out}/<model>/")


def _cmd_concreteplant_table(a: argparse.Namespace) -> None:
    from compo.evaluate.pairs import concreteplant_table

    negatives = dict(item.split("=", 1) for item in a.negatives)
    concreteplant_table(a.concreteness, a.manifest, negatives, a.model_dir, a.out, a.pairs,
                        settings={"threads": a.threads, "device": a.device, "precision": a.precision})


def _cmd_wiseft(a: argparse.Namespace) -> None:
    from compo.wiseft import interpolate

    interpolate(a.base_dir, a.finetuned_dir, a.alpha, a.out, device=a.device)


def _cmd_aggregate(a: argparse.Namespace) -> None:
    from compo.stats import aggregate

    aggregate(a.inputs, out_dir=a.out, composites=a.composites, base_seeds=a.base_seeds, reported=a.reported,
              reproduction_jsons=a.reproduction_inputs)


def _cmd_claims(a: argparse.Namespace) -> None:
    from compo.claims import write_claims

    losses = dict(item.split("=", 1) for item in a.losses or [])
    write_claims(a.claims, a.composites, a.inputs, a.out, losses=losses, pairs=a.pairs, draws=a.draws,
                 seed=a.seed, base_seeds=a.base_seeds, effects=None if a.effects is None else dict(a.effects))


def _cmd_figures(a: argparse.Namespace) -> None:
    from compo.figures import FigureInputs, draw_figures

    inputs = FigureInputs(summary=a.summary, claims=a.claims, kinds=a.kinds, correlations=a.correlations,
                          losses=a.losses, quality=a.quality, pairs=a.pairs, attributes=a.attributes,
                          order=a.order, compositional=a.compositional, zero_shot=a.zero_shot,
                          effects=a.effects)
    draw_figures(inputs, a.out, shown_dir=a.shown)


def _cmd_report_tables(a: argparse.Namespace) -> None:
    from compo.report import write_report_tables

    write_report_tables(a.out, claims=a.claims, summary=a.summary,
                        tables={"quality": a.quality, "parse": a.parse, "concreteplant": a.concreteplant,
                                "overlap": a.overlap},
                        order=a.order, effects=a.effects, landing=a.landing)


def _cmd_inputs(a: argparse.Namespace) -> None:
    from compo.config import load_config
    from compo.inputs import input_status, key_summary, raw_inputs, template_text

    config = load_config(*a.configfile)
    items = raw_inputs(config)
    if a.summary:
        print("\n".join(key_summary(items)))
    elif a.template:
        print(template_text(config, items), end="")
    else:
        status = input_status(config)
        for item, word in status:
            print(f"{word:8s} {item.key}: {item.path}" + (f" (hub dataset {item.hub}: compo prefetch)" if item.hub
                                                          else "")
                  + (" (inside a missing folder)" if word == "absent" else ""))
        missing = sum(word == "MISSING" for _, word in status)
        absent = sum(word == "absent" for _, word in status)
        print(f"{len(items)} raw inputs, {missing} missing" + (f" ({absent} more inside them)" if absent else ""))
        if missing:
            raise SystemExit(1)


def _cmd_loss_keys(a: argparse.Namespace) -> None:
    from compo.losses import loss_keys_table, write_loss_keys_table

    if a.write:
        write_loss_keys_table(a.write)
    else:
        print("\n".join(loss_keys_table()))


def _cmd_benchmark_keys(a: argparse.Namespace) -> None:
    from compo.evaluate.kinds import keys_table, write_keys_table

    if a.write:
        write_keys_table(a.write)
    else:
        print("\n".join(keys_table()))


def _cmd_prefetch(a: argparse.Namespace) -> None:
    from compo.artifacts import model_cache, read_manifest
    from compo.config import load_config
    from compo.prefetch import config_artifacts, hub_size, prefetch

    config = load_config(*a.configfile)
    cache = Path(a.cache).resolve() if a.cache else model_cache(config)
    if a.list:
        recorded = read_manifest(cache)["artifacts"]
        for artifact in config_artifacts(config):
            entry = recorded.get(artifact.id)
            size = f"{entry['bytes'] / 1e9:.2f} GB, cached" if entry else hub_size(artifact)
            print(f"{artifact.id}  ({size})  named by {', '.join(artifact.keys)}")
        print(f"cache: {cache}")
        return
    manifest = prefetch(config, cache, source_dir=Path(a.source) if a.source else None)
    total = sum(entry["bytes"] for entry in manifest["artifacts"].values())
    print(f"{len(manifest['artifacts'])} artifacts, {total / 1e9:.2f} GB in {cache} (manifest compo-prefetch.json)")


def _cmd_plan(a: argparse.Namespace) -> None:
    from compo.plan import format_local_plan, format_plan, is_local_run, plan, readme_section, write_readme

    rows, notes = plan(a.configfile, a.profile, a.snakefile, a.directory)
    print(format_local_plan(rows) if is_local_run(a.profile) else format_plan(rows))
    print(notes)
    if a.write_readme:
        changed = write_readme(a.write_readme, readme_section(rows, notes))
        print(f"{a.write_readme}: plan section {'rewritten' if changed else 'unchanged'}")


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], None], str]] = {
    "world": (_cmd_world, "generate one split of the synthetic world (images, manifest, scenes)"),
    "benchmarks": (_cmd_benchmarks, "generate the synthetic benchmarks in the real benchmarks' formats"),
    "benchmark-set": (_cmd_benchmark_set, "record the files of an evaluation set (what its evaluations rerun on)"),
    "prepare-benchmark": (_cmd_prepare_benchmark, "a benchmark kind's model-independent work, done once for every "
                          "evaluation (ARO Order's caption perturbations)"),
    "dataset": (_cmd_dataset, "write a training dataset's manifest (from the world or raw files)"),
    "overlap": (_cmd_overlap, "stop when a training dataset holds benchmark images (COCO ids, bytes, image hashes)"),
    "parse": (_cmd_parse, "parse captions with spaCy"),
    "concreteness": (_cmd_concreteness, "look up Brysbaert concreteness of keyword candidates"),
    "negatives": (_cmd_negatives, "generate hard negative captions (one shard of them)"),
    "negatives-gather": (_cmd_negatives_gather, "merge a generator's shards into one negatives table"),
    "negative-images": (_cmd_negative_images, "SDXL-Turbo img2img negative images (one shard of them)"),
    "negatives-quality": (_cmd_negatives_quality, "one quality table over every generator's report"),
    "attributes": (_cmd_attributes, "dataset attributes: images, caption length, vocabulary, Yngve depth"),
    "train": (_cmd_train, "pretrain or fine-tune a model with one recipe"),
    "evaluate": (_cmd_evaluate, "evaluate a model on benchmarks (one JSON + predictions each)"),
    "eval": (_cmd_eval, "evaluate checkpoints (open_clip name + weights file or tag) on benchmarks, no config "
                        "to write: a table, result JSONs, predictions and results.csv"),
    "wiseft": (_cmd_wiseft, "interpolate a fine-tuned model with its base (WiSE-FT)"),
    "concreteplant-table": (_cmd_concreteplant_table, "seed 002 Table 1: D_hc/D_lc/D_wo statistics and I2T/T2I"),
    "aggregate": (_cmd_aggregate, "flatten evaluation JSONs into tables (mean and CI over seeds)"),
    "claims": (_cmd_claims, "measure the seed papers' claims: effects, CIs, Holm-adjusted p, verdicts"),
    "figures": (_cmd_figures, "the study's figures (PNG and PDF) from its tables"),
    "report-tables": (_cmd_report_tables, "the report's tables as HTML pages"),
    "inputs": (_cmd_inputs, "every raw input a config names, with its key: present or missing"),
    "loss-keys": (_cmd_loss_keys, "config/README's table of each loss's own recipe keys, from the loss modules"),
    "benchmark-keys": (_cmd_benchmark_keys, "config/README's table of the benchmark kinds and their own keys, from "
                                            "the modules of compo.evaluate"),
    "prefetch": (_cmd_prefetch, "fetch every external model the config needs into the model cache (login node)"),
    "plan": (_cmd_plan, "jobs, GPUs, walltimes and GPU-hours of a study under a profile, and their estimate"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p: dict[str, argparse.ArgumentParser] = {}
    for name, (_, help_text) in COMMANDS.items():
        p[name] = sub.add_parser(name, help=help_text)
        p[name].add_argument("--log", help="write the log (everything on stderr, tracebacks) to this file")
        p[name].add_argument("--debug", action="store_true", help="print a failure's traceback on the terminal")
        p[name].add_argument("--timing", help="record the job's wall, CPU seconds and peak memory in this TSV at exit "
                                              "(compo.resource_use)")

    p["world"].add_argument("--split", required=True)
    p["world"].add_argument("--world", type=_json, required=True, help="the config's world section (JSON)")
    p["world"].add_argument("--seed", type=int, required=True)
    p["world"].add_argument("--out", required=True, help="output folder")

    p["benchmarks"].add_argument("--world", type=_json, required=True)
    p["benchmarks"].add_argument("--seed", type=int, required=True)
    p["benchmarks"].add_argument("--out", required=True)
    p["benchmark-set"].add_argument("--benchmarks", type=_json, required=True, help="{benchmark: [files]} (JSON)")
    p["benchmark-set"].add_argument("--out", required=True, help="the set's record (JSON)")
    p["prepare-benchmark"].add_argument("--spec", type=_json, required=True, help="the benchmark's config entry (JSON)")
    p["prepare-benchmark"].add_argument("--dir", required=True, help="the benchmark's folder")
    p["prepare-benchmark"].add_argument("--out", required=True, help="what its evaluations read (JSON)")

    p["dataset"].add_argument("--name", required=True)
    p["dataset"].add_argument("--spec", type=_json, required=True, help="the dataset's config entry (JSON)")
    p["dataset"].add_argument("--world-manifest", help="world split manifest, for source: world")
    p["dataset"].add_argument("--out", required=True)
    p["dataset"].add_argument("--report", required=True, help="CSV with kept/skipped counts")
    p["dataset"].add_argument("--threads", type=int, default=1, help="threads decoding the listed images")
    p["overlap"].add_argument("--name", required=True, help="the training dataset's config name")
    p["overlap"].add_argument("--manifest", type=Path, required=True, help="its manifest.parquet")
    p["overlap"].add_argument("--benchmarks", type=_json, required=True,
                              help='the benchmarks to compare with, {name: {"spec", "dir"}} (JSON)')
    p["overlap"].add_argument("--accept", type=_json, default=[], help="config overlap.accept (JSON)")
    p["overlap"].add_argument("--threads", type=int, default=1, help="threads reading, decoding and hashing images")
    p["overlap"].add_argument("--out", type=Path, required=True, help="the overlap table (CSV)")

    p["parse"].add_argument("--manifest", required=True)
    p["parse"].add_argument("--spacy-model", required=True)
    p["parse"].add_argument("--batch-size", type=int, default=256)
    p["parse"].add_argument("--threads", type=int, default=1, help="the job's CPUs: spaCy processes")
    p["parse"].add_argument("--out", required=True)
    p["parse"].add_argument("--report", required=True, help="CSV: noun-phrase precision/recall, skips")

    p["concreteness"].add_argument("--parse", required=True)
    p["concreteness"].add_argument("--norms", default=None, help="Brysbaert TSV path or URL (default: shipped)")
    p["concreteness"].add_argument("--sha256", default=None)
    p["concreteness"].add_argument("--seed", type=int, default=0, help="seeds ConcretePlant's keyword choice")
    p["concreteness"].add_argument("--out", required=True)

    p["negatives"].add_argument("--manifest", required=True)
    p["negatives"].add_argument("--parse", required=True)
    p["negatives"].add_argument("--concreteness", default=None)
    p["negatives"].add_argument("--spec", type=_json, required=True, help="the generator's config entry")
    p["negatives"].add_argument("--seed", type=int, required=True)
    p["negatives"].add_argument("--out", required=True)
    p["negatives"].add_argument("--report", required=True, help="CSV: validity and truth rates")
    p["negatives"].add_argument("--images-dir", default=None,
                                help="folder of the image negatives (images: true); written even when empty")
    p["negatives"].add_argument("--shard", type=int, default=0, help="this shard (a contiguous caption block)")
    p["negatives"].add_argument("--n-shards", type=int, default=1)

    p["negatives-gather"].add_argument("--shards", nargs="+", required=True, help="shard tables, in order")
    p["negatives-gather"].add_argument("--shard-reports", nargs="+", required=True)
    p["negatives-gather"].add_argument("--out", required=True)
    p["negatives-gather"].add_argument("--report", required=True)

    p["negative-images"].add_argument("--negatives", required=True, help="the generator's negatives table")
    p["negative-images"].add_argument("--manifest", required=True)
    p["negative-images"].add_argument("--spec", type=_json, required=True, help="the entry's images mapping")
    p["negative-images"].add_argument("--seed", type=int, required=True)
    p["negative-images"].add_argument("--shard", type=int, default=0, help="this shard (a block of rows)")
    p["negative-images"].add_argument("--n-shards", type=int, default=1)
    p["negative-images"].add_argument("--images", required=True, help="folder of this shard's images")
    p["negative-images"].add_argument("--out", required=True, help="the shard's rows with negative_image")
    p["negative-images"].add_argument("--report", required=True)

    p["negatives-quality"].add_argument("--names", nargs="+", required=True, help="generator config names")
    p["negatives-quality"].add_argument("--reports", nargs="+", required=True, help="their report CSVs")
    p["negatives-quality"].add_argument("--out", required=True)

    p["attributes"].add_argument("--manifest", required=True)
    p["attributes"].add_argument("--parse", required=True)
    p["attributes"].add_argument("--dataset", required=True)
    p["attributes"].add_argument("--norms", default=None)
    p["attributes"].add_argument("--sha256", default=None)
    p["attributes"].add_argument("--out", required=True)

    p["train"].add_argument("--recipe", type=_json, required=True, help="resolved method or base recipe")
    p["train"].add_argument("--manifest", default=None, help="training manifest (not needed for 0 steps)")
    p["train"].add_argument("--negatives", default=None)
    p["train"].add_argument("--init-dir", default=None, help="model directory to start from")
    p["train"].add_argument("--parse", default=None, help="the dataset's parse table (noun phrases, online negatives)")
    p["train"].add_argument("--concreteness", default=None, help="the dataset's concreteness table")
    p["train"].add_argument("--val-benchmark", type=_json, default=None,
                            help="the zero-shot benchmark the recipe's train.val_benchmark names: "
                                 "{\"name\", \"spec\", \"dir\", \"templates\"} (JSON)")
    p["train"].add_argument("--seed", type=int, required=True)
    p["train"].add_argument("--settings", type=_json, default={}, help="the config's train section")
    p["train"].add_argument("--threads", type=int, default=None,
                            help="the job's CPUs over all its ranks (instead of the settings' threads): each rank "
                                 "takes its share, one CPU feeding its GPU and the others decoding images")
    p["train"].add_argument("--out", required=True, help="model directory")

    p["evaluate"].add_argument("--model-dir", required=True)
    p["evaluate"].add_argument("--model-id", required=True, help="method/dataset/seedN")
    p["evaluate"].add_argument("--benchmarks", type=_json, required=True,
                               help='{"<name>": {"spec": <config entry>, "dir": <benchmark folder>}, ...}')
    p["evaluate"].add_argument("--templates", type=_json, default=None, help="zero-shot prompt templates")
    for name in ("evaluate", "concreteplant-table"):
        p[name].add_argument("--threads", type=int, default=1,
                             help="the job's CPUs: torch threads; on a GPU, the image-decoding workers too")
        p[name].add_argument("--device", default="auto", help="evaluate.device: auto | cpu | cuda")
        p[name].add_argument("--precision", default="auto", help="evaluate.precision: auto | fp32 | amp | amp_bf16")
    p["evaluate"].add_argument("--truncate-words", type=int, default=None,
                               help="text protocol of the model's recipe: cut texts to N words (LongCLIP-70)")
    p["evaluate"].add_argument("--out-dir", required=True,
                               help="writes <name>.json and predictions/<name>.parquet each, then _evaluated.json")

    p["concreteplant-table"].add_argument("--concreteness", required=True)
    p["concreteplant-table"].add_argument("--manifest", required=True)
    p["concreteplant-table"].add_argument("--negatives", nargs="+", required=True, help="policy=negatives table")
    p["concreteplant-table"].add_argument("--model-dir", required=True, help="the model scored on the pairs")
    p["concreteplant-table"].add_argument("--out", required=True)
    p["concreteplant-table"].add_argument("--pairs", help="also write the per-pair scores (CSV) here")

    p["wiseft"].add_argument("--base-dir", required=True, help="the base model directory")
    p["wiseft"].add_argument("--finetuned-dir", required=True, help="the fine-tuned model directory")
    p["wiseft"].add_argument("--alpha", type=float, required=True, help="0: base, 1: fine-tuned")
    p["wiseft"].add_argument("--out", required=True, help="model directory")
    p["wiseft"].add_argument("--device", default="auto", help="train.device: auto | cpu | cuda")

    p["aggregate"].add_argument("--inputs", nargs="+", required=True,
                                help="evaluation JSON files, or a model's _evaluated.json for all of its results")
    p["aggregate"].add_argument("--reproduction-inputs", nargs="*", default=[],
                                help="more models' evaluation indexes, read by the reproduction table only (ablations)")
    p["aggregate"].add_argument("--out", required=True, help="tables folder")
    p["aggregate"].add_argument("--composites", type=_json, default={}, help="the config's composites (JSON)")
    p["aggregate"].add_argument("--reported", type=_json, default=[], help="the config's reported numbers (JSON)")
    p["aggregate"].add_argument("--base-seeds", type=_json, default=None,
                                help="the config's study.base_seeds (JSON list; default: one base)")

    p["claims"].add_argument("--claims", type=_json, required=True, help="the config's claims (JSON)")
    p["claims"].add_argument("--composites", type=_json, default={}, help="the config's composites (JSON)")
    p["claims"].add_argument("--inputs", nargs="+", required=True,
                             help="evaluation JSONs (their predictions beside them), or a model's _evaluated.json")
    p["claims"].add_argument("--losses", nargs="*", help="model_id=losses.csv of the trained models")
    p["claims"].add_argument("--pairs", default=None, help="ConcretePlant's per-pair table of the base model")
    p["claims"].add_argument("--draws", type=int, default=2000, help="bootstrap replicates")
    p["claims"].add_argument("--seed", type=int, default=0, help="seeds the bootstrap")
    p["claims"].add_argument("--base-seeds", type=_json, default=None,
                             help="the config's study.base_seeds (JSON list; default: one base)")
    p["claims"].add_argument("--effects", type=_json, default=None,
                             help="the config's effects as [kind, spec] pairs in its order (JSON)")
    p["claims"].add_argument("--out", required=True, help="tables folder (claims.csv, effects.csv, claims.md)")

    for name in ("figures", "report-tables"):
        p[name].add_argument("--summary", type=Path, help="results.csv (mean and CI over seeds)")
        p[name].add_argument("--claims", type=Path, help="claims.csv")
        p[name].add_argument("--effects", type=Path, help="effects.csv: the kinds of effect and their controls")
        p[name].add_argument("--order", nargs="*", default=[], help="methods in the config's order")
        p[name].add_argument("--quality", nargs="*", type=Path, default=[], help="negatives/{dataset}/quality.csv")
        p[name].add_argument("--out", required=True, help="output folder")
    p["figures"].add_argument("--correlations", type=Path, help="correlations.csv")
    p["figures"].add_argument("--kinds", type=_json, default={}, help="{benchmark: kind} of the config (JSON)")
    p["figures"].add_argument("--losses", nargs="*", type=Path, default=[], help="every model's losses.csv")
    p["figures"].add_argument("--pairs", nargs="*", type=Path, default=[], help="concreteplant/{dataset}.pairs.csv")
    p["figures"].add_argument("--attributes", nargs="*", type=Path, default=[], help="datasets/{dataset}.csv")
    p["figures"].add_argument("--compositional", default="compositional", help="composite on the y axes")
    p["figures"].add_argument("--zero-shot", default="zero-shot", help="composite on the x axes")
    p["figures"].add_argument("--shown", type=Path,
                              help="folder of the report's figures: {name}/{name}.png for each figure drawn, an empty "
                                   "{name}/ for each notice")
    p["report-tables"].add_argument("--parse", nargs="*", type=Path, default=[], help="parse/{dataset}.csv")
    p["report-tables"].add_argument("--concreteplant", nargs="*", type=Path, default=[],
                                    help="concreteplant/{dataset}.csv")
    p["report-tables"].add_argument("--landing", type=Path,
                                    help="the workflow description (workflow/report/workflow.rst): write the report's "
                                         "landing page workflow.rst, the answer first")
    p["report-tables"].add_argument("--overlap", nargs="*", type=Path, default=[], help="overlap/{dataset}.csv")
    p["eval"].add_argument("--model", action="append", help="an open_clip model name (repeat for more models)")
    p["eval"].add_argument("--pretrained", action="append",
                           help="its weights: a file (open_clip state dict, open_clip_train checkpoint, "
                                "safetensors) or an open_clip tag in the model cache; one per --model")
    p["eval"].add_argument("--format", action="append",
                           help="the weights' layout: open_clip (default) or longclip; one for all or one per --model")
    p["eval"].add_argument("--name", action="append", help="the output folder's name of each model "
                                                           "(default <model>-<file stem or tag>)")
    p["eval"].add_argument("--benchmarks", nargs="+", help="benchmark names of the config")
    p["eval"].add_argument("--benchmark-dir", action="append", metavar="KIND=PATH",
                           help="a benchmark folder of a kind, read with the kind's defaults (repeatable)")
    p["eval"].add_argument("--configfile", nargs="+", default=["config/config.yaml"],
                           help="config files naming the benchmarks, in order (default config/config.yaml)")
    p["eval"].add_argument("--out", required=True, help="output folder: <model>/<benchmark>.json, results.csv")
    p["eval"].add_argument("--device", help="auto, cpu or cuda (default: the config's evaluate.device)")
    p["eval"].add_argument("--precision", help="auto, fp32, amp or amp_bf16 (default: the config's)")
    p["eval"].add_argument("--threads", type=int, help="torch threads (default: the config's evaluate.threads)")
    p["eval"].add_argument("--truncate-words", type=int, default=None,
                           help="cut texts to this many words (LongCLIP-70's protocol)")
    p["inputs"].add_argument("--configfile", nargs="+", required=True, help="the study's config files, in order")
    shape = p["inputs"].add_mutually_exclusive_group()
    shape.add_argument("--template", action="store_true", help="print a config overlay setting every key (edit it)")
    shape.add_argument("--summary", action="store_true", help="print the keys only, one line per key pattern")
    p["loss-keys"].add_argument("--write", type=Path, help="replace the table in this file (config/README.md)")
    p["benchmark-keys"].add_argument("--write", type=Path, help="replace the table in this file (config/README.md)")
    p["prefetch"].add_argument("--configfile", nargs="+", required=True, help="the study's config files, in order")
    p["prefetch"].add_argument("--cache", help="the model cache (default: config key model_cache, else $HF_HOME)")
    p["prefetch"].add_argument("--from", dest="source",
                               help="import the models from this folder (<org>/<name>/ each) instead of the hub")
    p["prefetch"].add_argument("--list", action="store_true", help="list the artifacts and their sizes only")
    p["plan"].add_argument("--configfile", nargs="+", default=["config/config.yaml"],
                           help="the study's config files, in order (default config/config.yaml, as snakemake's)")
    p["plan"].add_argument("--profile", help="the workflow profile the study runs with (e.g. workflow/profiles/slurm)")
    p["plan"].add_argument("--snakefile", default="Snakefile", help="the workflow's Snakefile")
    p["plan"].add_argument("--directory", default=".", help="the working directory of the run (relative paths)")
    p["plan"].add_argument("--write-readme", type=Path, metavar="README",
                           help="also write the plan between README's `compo plan` markers (tests/test_plan.py "
                                "checks README.md against config/paper.yaml under workflow/profiles/slurm)")
    return parser


# Imported once by a local run's fork server (compo.forkserver), not by each job: what most commands import
PREIMPORTED = ("torch", "pandas", "pyarrow.parquet", "compo.train", "compo.evaluate", "compo.wiseft", "compo.stats",
               "compo.negatives", "compo.data", "compo.parse", "compo.world", "compo.overlap", "compo.claims",
               "compo.figures", "compo.report", "compo.concreteness")


def main(argv: list[str] | None = None) -> None:
    """The `compo` command. Run as a program (no `argv`) in a local run, it asks the run's fork server to run it
    (compo.forkserver) and exits as that job does; otherwise, or where none can, it runs here."""
    if argv is None:
        if sys.argv[1:2] == [forkserver.SERVE_FLAG]:
            forkserver.serve(*sys.argv[2:4], run=run, preimport=_preimport)
            return
        if sys.argv[1:2] != ["prefetch"]:  # the only command that goes online: the server's imports are offline
            status = forkserver.run_served(sys.argv, [sys.executable, "-m", "compo", forkserver.SERVE_FLAG])
            if status is not None:
                forkserver.exit_as(status)
    run(sys.argv[1:] if argv is None else argv)


def _offline() -> None:
    """Only prefetch downloads (compo.prefetch); the Snakefile sets these too."""
    from compo.artifacts import OFFLINE_ENV

    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def _preimport() -> None:
    """The fork server's imports: what this environment installs of them. A stage's conda env (envs/*.yaml) lacks
    the other stages' packages (stats.yaml has no torch); what fails to import there, its jobs never import."""
    import importlib

    _offline()
    try:
        from compo.compat import import_open_clip

        import_open_clip()  # first: open_clip with the packages compat hides hidden
    except ImportError:
        pass
    for name in PREIMPORTED:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def run(argv: list[str]) -> None:
    """Run the command line `argv` (without the program's name) in this process."""
    args = build_parser().parse_args(argv)
    if args.command != "prefetch":
        _offline()
    with _stderr_to(args.log) as terminal:
        _setup_logging()
        try:
            COMMANDS[args.command][0](args)
        except Exception as error:
            line = f"compo {args.command}: {describe_failure(args.command, error)}"
            if args.log:  # the full story goes to the rule's log
                log.error("%s\n%s", line, traceback.format_exc().rstrip())
                line += f" (traceback in {args.log})"
            print(line, file=terminal)
            if args.debug:
                traceback.print_exc(file=terminal)
            raise SystemExit(1) from None
        finally:
            if args.timing:
                write_use(args.timing)


if __name__ == "__main__":
    main()
