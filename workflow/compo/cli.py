"""`compo <stage>`: every workflow stage as a command, the single entry point the Snakemake rules call.

Structured settings (a config section) are passed as JSON strings so a rule hands over exactly the
part of the config its stage depends on. Each stage writes its log with `--log` (stderr otherwise).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from error


def _setup_logging(log: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    rank = int(os.environ.get("RANK", "0"))  # under torchrun every rank logs: one file each
    if log and rank > 0:
        log = f"{log}.rank{rank}"
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        handlers=handlers, force=True)


def _cmd_world(a: argparse.Namespace) -> None:
    from compo.world import generate_split

    generate_split(a.split, a.world, seed=a.seed, out_dir=a.out)


def _cmd_benchmarks(a: argparse.Namespace) -> None:
    from compo.world import generate_benchmarks

    generate_benchmarks(a.world, seed=a.seed, out_dir=a.out)


def _cmd_dataset(a: argparse.Namespace) -> None:
    from compo.data import build_manifest

    build_manifest(a.name, a.spec, out=a.out, world_manifest=a.world_manifest, report=a.report)


def _cmd_parse(a: argparse.Namespace) -> None:
    from compo.parse import parse_manifest

    parse_manifest(a.manifest, out=a.out, report=a.report, spacy_model=a.spacy_model, batch_size=a.batch_size)


def _cmd_concreteness(a: argparse.Namespace) -> None:
    from compo.concreteness import score_parse

    score_parse(a.parse, out=a.out, norms=a.norms, sha256=a.sha256, seed=a.seed)


def _cmd_negatives(a: argparse.Namespace) -> None:
    from compo.negatives import generate_negatives

    generate_negatives(a.manifest, a.parse, a.spec, seed=a.seed, out=a.out, report=a.report,
                       concreteness=a.concreteness, shard=a.shard, n_shards=a.n_shards)


def _cmd_negatives_gather(a: argparse.Namespace) -> None:
    from compo.negatives import gather_negatives

    gather_negatives(a.shards, a.out, a.report, a.shard_reports)


def _cmd_negatives_quality(a: argparse.Namespace) -> None:
    from compo.negatives import combine_reports

    if len(a.names) != len(a.reports):
        raise SystemExit(f"--names ({len(a.names)}) and --reports ({len(a.reports)}) must pair up")
    combine_reports(dict(zip(a.names, a.reports, strict=True)), a.out)


def _cmd_attributes(a: argparse.Namespace) -> None:
    from compo.concreteness import write_dataset_attributes

    write_dataset_attributes(a.manifest, a.parse, a.out, a.dataset, norms=a.norms, sha256=a.sha256)


def _cmd_train(a: argparse.Namespace) -> None:
    from compo.train import train

    train(a.recipe, manifest=a.manifest, out_dir=a.out, seed=a.seed, negatives=a.negatives,
          init_dir=a.init_dir, settings=a.settings, parse=a.parse, concreteness=a.concreteness)


def _cmd_evaluate(a: argparse.Namespace) -> None:
    from compo.evaluate import evaluate_many

    out_dir = Path(a.out_dir)
    jobs = {
        name: {"spec": entry["spec"], "dir": entry["dir"], "out": str(out_dir / f"{name}.json"),
               "predictions": str(out_dir / f"{name}.predictions.parquet")}
        for name, entry in a.benchmarks.items()
    }
    settings = {"threads": a.threads, "device": a.device, "precision": a.precision}
    evaluate_many(a.model_dir, jobs, a.templates, model_id=a.model_id, settings=settings)


def _cmd_concreteplant_table(a: argparse.Namespace) -> None:
    from compo.evaluate.pairs import concreteplant_table

    negatives = dict(item.split("=", 1) for item in a.negatives)
    concreteplant_table(a.concreteness, a.manifest, negatives, a.model_dir, a.out, a.pairs,
                        settings={"device": a.device, "precision": a.precision})


def _cmd_wiseft(a: argparse.Namespace) -> None:
    from compo.wiseft import interpolate

    interpolate(a.base_dir, a.finetuned_dir, a.alpha, a.out, device=a.device)


def _cmd_aggregate(a: argparse.Namespace) -> None:
    from compo.stats import aggregate

    aggregate(a.inputs, out_dir=a.out, composites=a.composites)


def _cmd_claims(a: argparse.Namespace) -> None:
    from compo.claims import write_claims

    losses = dict(item.split("=", 1) for item in a.losses or [])
    write_claims(a.claims, a.composites, a.inputs, a.out, losses=losses, pairs=a.pairs, draws=a.draws,
                 seed=a.seed)


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], None], str]] = {
    "world": (_cmd_world, "generate one split of the synthetic world (images, manifest, scenes)"),
    "benchmarks": (_cmd_benchmarks, "generate the synthetic benchmarks in the real benchmarks' formats"),
    "dataset": (_cmd_dataset, "write a training dataset's manifest (from the world or raw files)"),
    "parse": (_cmd_parse, "parse captions with spaCy"),
    "concreteness": (_cmd_concreteness, "look up Brysbaert concreteness of keyword candidates"),
    "negatives": (_cmd_negatives, "generate hard negative captions (one shard of them)"),
    "negatives-gather": (_cmd_negatives_gather, "merge a generator's shards into one negatives table"),
    "negatives-quality": (_cmd_negatives_quality, "one quality table over every generator's report"),
    "attributes": (_cmd_attributes, "dataset attributes: images, caption length, vocabulary, Yngve depth"),
    "train": (_cmd_train, "pretrain or fine-tune a model with one recipe"),
    "evaluate": (_cmd_evaluate, "evaluate a model on benchmarks (one JSON + predictions each)"),
    "wiseft": (_cmd_wiseft, "interpolate a fine-tuned model with its base (WiSE-FT)"),
    "concreteplant-table": (_cmd_concreteplant_table, "seed 002 Table 1: D_hc/D_lc/D_wo statistics and I2T/T2I"),
    "aggregate": (_cmd_aggregate, "flatten evaluation JSONs into tables (mean and CI over seeds)"),
    "claims": (_cmd_claims, "measure the seed papers' claims: effects, CIs, Holm-adjusted p, verdicts"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p: dict[str, argparse.ArgumentParser] = {}
    for name, (_, help_text) in COMMANDS.items():
        p[name] = sub.add_parser(name, help=help_text)
        p[name].add_argument("--log", help="also write the log to this file")

    p["world"].add_argument("--split", required=True)
    p["world"].add_argument("--world", type=_json, required=True, help="the config's world section (JSON)")
    p["world"].add_argument("--seed", type=int, required=True)
    p["world"].add_argument("--out", required=True, help="output folder")

    p["benchmarks"].add_argument("--world", type=_json, required=True)
    p["benchmarks"].add_argument("--seed", type=int, required=True)
    p["benchmarks"].add_argument("--out", required=True)

    p["dataset"].add_argument("--name", required=True)
    p["dataset"].add_argument("--spec", type=_json, required=True, help="the dataset's config entry (JSON)")
    p["dataset"].add_argument("--world-manifest", help="world split manifest, for source: world")
    p["dataset"].add_argument("--out", required=True)
    p["dataset"].add_argument("--report", required=True, help="CSV with kept/skipped counts")

    p["parse"].add_argument("--manifest", required=True)
    p["parse"].add_argument("--spacy-model", required=True)
    p["parse"].add_argument("--batch-size", type=int, default=256)
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
    p["negatives"].add_argument("--shard", type=int, default=0, help="this shard (a contiguous caption block)")
    p["negatives"].add_argument("--n-shards", type=int, default=1)

    p["negatives-gather"].add_argument("--shards", nargs="+", required=True, help="shard tables, in order")
    p["negatives-gather"].add_argument("--shard-reports", nargs="+", required=True)
    p["negatives-gather"].add_argument("--out", required=True)
    p["negatives-gather"].add_argument("--report", required=True)

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
    p["train"].add_argument("--seed", type=int, required=True)
    p["train"].add_argument("--settings", type=_json, default={}, help="the config's train section")
    p["train"].add_argument("--out", required=True, help="model directory")

    p["evaluate"].add_argument("--model-dir", required=True)
    p["evaluate"].add_argument("--model-id", required=True, help="method/dataset/seedN")
    p["evaluate"].add_argument("--benchmarks", type=_json, required=True,
                               help='{"<name>": {"spec": <config entry>, "dir": <benchmark folder>}, ...}')
    p["evaluate"].add_argument("--templates", type=_json, default=None, help="zero-shot prompt templates")
    p["evaluate"].add_argument("--threads", type=int, default=1, help="torch threads")
    for name in ("evaluate", "concreteplant-table"):
        p[name].add_argument("--device", default="auto", help="evaluate.device: auto | cpu | cuda")
        p[name].add_argument("--precision", default="auto", help="evaluate.precision: auto | fp32 | amp | amp_bf16")
    p["evaluate"].add_argument("--out-dir", required=True, help="writes <name>.json, <name>.predictions.parquet")

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

    p["aggregate"].add_argument("--inputs", nargs="+", required=True, help="evaluation JSON files")
    p["aggregate"].add_argument("--out", required=True, help="tables folder")
    p["aggregate"].add_argument("--composites", type=_json, default={}, help="the config's composites (JSON)")

    p["claims"].add_argument("--claims", type=_json, required=True, help="the config's claims (JSON)")
    p["claims"].add_argument("--composites", type=_json, default={}, help="the config's composites (JSON)")
    p["claims"].add_argument("--inputs", nargs="+", required=True,
                             help="evaluation JSONs (their predictions tables next to them)")
    p["claims"].add_argument("--losses", nargs="*", help="model_id=losses.csv of the trained models")
    p["claims"].add_argument("--pairs", default=None, help="ConcretePlant's per-pair table of the base model")
    p["claims"].add_argument("--draws", type=int, default=2000, help="bootstrap replicates")
    p["claims"].add_argument("--seed", type=int, default=0, help="seeds the bootstrap")
    p["claims"].add_argument("--out", required=True, help="tables folder (claims.csv, claims.md)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log)
    COMMANDS[args.command][0](args)


if __name__ == "__main__":
    main()
