"""The world's fine-tuning captions beside real COCO captions: objects, attributes, relations, and what the rule
negative generators draw from each (issue 45, item 1; the definitions are `compo_tools.measure`'s docstring).

World: the fine-tuning dataset's manifest and parse table from the study's results folder when both exist, else
built here in a temporary folder by the workflow's own stages (world split, manifest, spaCy parse). COCO: the
distinct positive captions of SugarCrepe's released subset files (--sugarcrepe; not shipped with the project).
Every rule generator of the config's `negatives:` runs with its configured settings on both caption sets (the
random-caption control and LLM backends are skipped). Whether a negative is false of its image is known only in
the world (its truth checker); for COCO the table says so.

Usage: python tools/measure_captions.py --configfile config/config.yaml [overlay.yaml ...]
           [--sugarcrepe ../shared/benchmarks/sugarcrepe] [--limit N] [--out table.md]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from compo.config import load_config
from compo.data import build_manifest
from compo.io import read_table
from compo.negatives import build_generator, caption_rng, truth_label
from compo.parse import ParsedCaption, Parser
from compo.world import generate_split
from compo_tools.measure import (
    DRAW_KINDS,
    CaptionSetFeatures,
    GeneratorMeasure,
    caption_set_features,
    measure_generator,
    sugarcrepe_positives,
)

REPO = Path(__file__).resolve().parents[1]
SKIPPED_GENERATORS = ("random-caption",)  # no words change: another caption entirely


class CaptionSet:
    def __init__(self, name: str, ids: list[str], parsed: list[ParsedCaption], scenes: list[str | None] | None):
        self.name, self.ids, self.parsed, self.scenes = name, ids, parsed, scenes


def world_captions(config: dict, dataset: str, limit: int | None, parser: Parser) -> CaptionSet:
    """The fine-tuning dataset's captions with their scenes: from results/ when built, else generated here."""
    spec = config["datasets"].get(dataset)
    if spec is None or spec.get("source") != "world":
        raise SystemExit(f"config key datasets.{dataset}: expected a dataset with source: world, got {spec!r}")
    results = Path(config["results"])
    if not results.is_absolute():
        results = REPO / results
    manifest_path = results / "data" / dataset / "manifest.parquet"
    parse_path = results / "parse" / f"{dataset}.parquet"
    if manifest_path.exists() and parse_path.exists():
        print(f"world: reading {manifest_path} and {parse_path}")
        frame = read_table(manifest_path, "manifest")
        rows = read_table(parse_path, "parse").to_dict("records")[:limit]
        parsed = [ParsedCaption.from_row(r) for r in rows]
        ids = [r["caption_id"] for r in rows]
        scenes = frame.set_index("caption_id").loc[ids, "scene"].tolist()
        return CaptionSet("world", ids, parsed, scenes)
    world = dict(config["world"])
    split = spec["split"]
    if limit is not None:  # enough images for `limit` captions (a split's first images do not depend on its size)
        images = min(world["splits"][split], math.ceil(limit / world["short_captions"]))
        world["splits"] = {**world["splits"], split: images}
    with tempfile.TemporaryDirectory() as folder:
        print(f"world: generating split {split!r} ({world['splits'][split]} images) in a temporary folder")
        generate_split(split, world, int(config["seed"]), Path(folder) / "world")
        build_manifest(dataset, spec, Path(folder) / "manifest.parquet", Path(folder) / "world" / "manifest.parquet")
        frame = read_table(Path(folder) / "manifest.parquet", "manifest").iloc[:limit]
    parsed = parser.parse_texts(frame["caption"].tolist())
    return CaptionSet("world", frame["caption_id"].tolist(), parsed, frame["scene"].tolist())


def coco_captions(folder: Path, limit: int | None, parser: Parser) -> CaptionSet:
    texts = sugarcrepe_positives(folder)[:limit]
    return CaptionSet("COCO", [f"sugarcrepe-{i}" for i in range(len(texts))], parser.parse_texts(texts), None)


def rule_generators(config: dict, names: list[str] | None) -> list[str]:
    """The config's rule generators (`names`, default all), the random-caption control and LLM backends left out."""
    rules = [name for name, spec in config["negatives"].items()
             if spec["generator"] not in SKIPPED_GENERATORS and spec.get("backend", "rules") == "rules"]
    unknown = sorted(set(names or []) - set(rules))
    if unknown:
        raise SystemExit(f"--negatives {' '.join(unknown)}: not a rule generator of the config's negatives: "
                         f"(known: {', '.join(rules)})")
    return [name for name in rules if names is None or name in names]


def measure(config: dict, captions: CaptionSet, names: list[str]) -> dict[str, GeneratorMeasure]:
    """The draws of the generators `names` on `captions` (fresh generators: ConcretePlant's quotas run per set)."""
    out = {}
    seed = int(config["seed"])
    scenes = None if captions.scenes is None else [None if s is None else json.loads(s) for s in captions.scenes]
    truth = None if scenes is None else (lambda row, text: truth_label(scenes[row], text))
    for name in names:
        spec = config["negatives"][name]
        rngs = [caption_rng(seed, cid) for cid in captions.ids]
        out[name] = measure_generator(build_generator(spec, f"negatives.{name}"), captions.parsed, rngs,
                                      int(spec["k"]), truth)
    return out


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f} %"


def table(config: dict, world: tuple[CaptionSetFeatures, dict[str, GeneratorMeasure]],
          coco: tuple[CaptionSetFeatures, dict[str, GeneratorMeasure]] | None) -> str:
    """The markdown table: one row per feature, the world and COCO side by side."""
    (wf, wg), (cf, cg) = world, coco or (None, {})
    absent = "not given (--sugarcrepe)"
    lines = [f"| feature | world ({wf.captions:,} captions) | COCO ({cf.captions:,} captions) |" if cf else
             f"| feature | world ({wf.captions:,} captions) | COCO |", "|---|---|---|"]

    def row(label: str, w: str, c: str) -> None:
        lines.append(f"| {label} | {w} | {c if cf else absent} |")

    for label, key, pct in (("objects per caption", "objects", False),
                            ("attributed objects per caption", "attributed", False),
                            ("relation mentions per caption", "relations", False),
                            ("captions with >= 2 objects", "two_objects", True),
                            ("captions with >= 2 attributed objects", "two_attributed", True),
                            ("captions with a relation mention", "with_relation", True)):
        show = _pct if pct else (lambda v: f"{v:.2f}")
        row(label, show(getattr(wf, key)), show(getattr(cf, key)) if cf else "")
    for name, w in wg.items():
        c = cg.get(name)
        spec = config["negatives"][name]
        row(f"**{name}** ({spec['generator']}, k={spec['k']}): captions with a draw",
            f"{w.captions_with_draw:,} of {wf.captions:,}", f"{c.captions_with_draw:,} of {cf.captions:,}" if c else "")
        for kind in DRAW_KINDS:
            if w.kinds[kind] or (c and c.kinds[kind]):
                row(f"{name}: {kind}", _pct(w.share(w.kinds, kind)), _pct(c.share(c.kinds, kind)) if c else "")
        if w.replacements or (c and c.replacements):
            row(f"{name}: replacement in the set's own vocabulary",
                _pct(w.in_vocabulary / w.replacements if w.replacements else math.nan),
                _pct(c.in_vocabulary / c.replacements if c and c.replacements else math.nan))
        row(f"{name}: false of the image (world's truth)", _pct(w.share(w.truth, "false")),
            "untestable (no scene)")
        row(f"{name}: true of the image (dropped in training)", _pct(w.share(w.truth, "true")),
            "untestable (no scene)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", type=Path, nargs="+", default=[REPO / "config" / "config.yaml"],
                        help="the config and any overlays, in order")
    parser.add_argument("--sugarcrepe", type=Path, help="folder of SugarCrepe's released subset files (COCO)")
    parser.add_argument("--limit", type=int, help="first N captions of each caption set")
    parser.add_argument("--dataset", help="the world's fine-tuning dataset (default: the study's first)")
    parser.add_argument("--negatives", nargs="+", help="config names of the generators (default: every rule one)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be a positive number of captions, got {args.limit}")
    config = load_config(*args.configfile)
    dataset = args.dataset or config["study"]["datasets"][0]
    names = rule_generators(config, args.negatives)
    started = time.perf_counter()
    spacy = Parser(config["parse"]["spacy_model"], batch_size=int(config["parse"]["batch_size"]))
    world = world_captions(config, dataset, args.limit, spacy)
    sides = [(caption_set_features(world.parsed), measure(config, world, names))]
    if args.sugarcrepe is not None:
        coco = coco_captions(args.sugarcrepe, args.limit, spacy)
        sides.append((caption_set_features(coco.parsed), measure(config, coco, names)))
    text = table(config, sides[0], sides[1] if len(sides) > 1 else None)
    print(text, end="")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
