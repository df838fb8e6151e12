"""What NegCLIP's swap negatives ask of a model: the world's captions against real COCO captions.

The positive control (docs/embedded-study.md) asks NegCLIP's swap negatives to teach
SugarCrepe swap-att, whose items exchange two values of one attribute between objects ("a red cube and a blue
ball" -> "a blue cube and a red ball"). This script measures how often a swap negative is of that kind, under the
scheme of NegCLIP's released generator: per caption one random pair of each span kind (noun chunks longer than two
tokens, verb phrases, NN nouns, NNS nouns, adverbs, adjectives), and a training step draws one of them uniformly.
So a caption's share of a class is the mean over its span kinds of the share of that kind's pairs in the class.

It reports the shares on two caption sets parsed by the same spaCy model:
  --world-parse   the study's parse table (results/parse/coco.parquet: the world's fine-tuning captions)
  --sugarcrepe    the positive captions of SugarCrepe's released files: COCO val2017 captions, the text
                  NegCLIP's own COCO training captions come from
and, with --negatives (results/negatives/coco/swap.parquet), the study's own draw: its usable negatives (valid,
not proven true of the image), one drawn uniformly per caption and step, as the negclip method trains.

A pair's class, from the span kind and the two words (the same lexicon for both caption sets):
  same-kind attributes   two adjectives of one attribute kind (colour, size, pattern): SugarCrepe swap-att's kind
  cross-kind attributes  two adjectives, not of one kind ("a white red cross"), which the text alone gives away
  nouns                  two nouns, neither a framing word (in the world: shapes and backgrounds)
  nouns with a framing   one noun is "photo", "image", "picture", ...
  noun phrases, verb phrases, adverbs

Usage: python experiments/diagnose_swaps.py --world-parse results/parse/coco.parquet
           --negatives results/negatives/coco/swap.parquet --sugarcrepe ../shared/benchmarks/sugarcrepe
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))  # compo_tools, the measurement package

from compo.io import read_table  # noqa: E402
from compo.negatives.swap import span_groups  # noqa: E402
from compo.parse import ParsedCaption, Parser  # noqa: E402
from compo_tools.measure import FRAMING_NOUNS, sugarcrepe_positives  # noqa: E402

# Attribute words by kind: the world's values plus the other basic colour terms and common sizes of COCO captions.
ATTRIBUTE_KIND = {
    **{w: "colour" for w in ("red", "green", "blue", "yellow", "purple", "orange", "white", "black", "brown",
                             "pink", "grey", "gray", "silver", "gold", "golden", "tan", "beige")},
    **{w: "size" for w in ("small", "large", "big", "little", "tiny", "huge", "giant", "tall", "short")},
    **{w: "pattern" for w in ("plain", "striped", "dotted", "spotted", "checkered", "plaid", "polka")},
}
# NegCLIP's released generator: one swap per span kind, with NN and NNS nouns as two kinds.
NEGCLIP_KINDS = ("noun_chunk", "verb_phrase", "noun", "adverb", "adjective")
CLASSES = ("same-kind attributes", "cross-kind attributes", "nouns", "nouns with a framing word", "noun phrases",
           "verb phrases", "adverbs")


def swap_class(kind: str, first: str, second: str) -> str:
    """The class (see the module doc) of a swap of span kind `kind` between the texts `first` and `second`."""
    a, b = first.lower(), second.lower()
    if kind == "adjective":
        same = a in ATTRIBUTE_KIND and ATTRIBUTE_KIND[a] == ATTRIBUTE_KIND.get(b)
        return "same-kind attributes" if same else "cross-kind attributes"
    if kind == "noun":
        return "nouns with a framing word" if {a, b} & FRAMING_NOUNS else "nouns"
    return {"noun_chunk": "noun phrases", "verb_phrase": "verb phrases", "adverb": "adverbs"}[kind]


def negclip_shares(captions: Iterable[ParsedCaption]) -> tuple[Counter[str], int, int]:
    """Each class's expected share of the swap negatives a training step draws under NegCLIP's released
    scheme, with the number of captions and of captions with at least one swap."""
    shares: Counter[str] = Counter()
    n_captions = n_with_swap = 0
    for parsed in captions:
        n_captions += 1
        kinds = []  # per span kind (NN and NNS apart): the classes of its pairs whose texts differ
        for kind in NEGCLIP_KINDS:
            for group in span_groups(parsed, kind):
                texts = [" ".join(parsed.tokens[s:e]) for s, e in group]
                pairs = [swap_class(kind, a, b) for i, a in enumerate(texts) for b in texts[i + 1:]
                         if a.lower() != b.lower()]
                if pairs:
                    kinds.append(pairs)
        if not kinds:
            continue
        n_with_swap += 1
        for pairs in kinds:
            for name in pairs:
                shares[name] += 1 / len(kinds) / len(pairs)
    return shares, n_captions, n_with_swap


def study_shares(negatives: Sequence[dict]) -> tuple[Counter[str], int]:
    """Each class's share of the negatives the study's negclip trains on (valid and not proven true, one
    drawn uniformly per caption), from the swap negatives table's rows; and the captions with one."""
    by_caption: dict[str, list[str]] = {}
    for row in negatives:
        if row["valid"] and row["truth"] != "true":
            first, second = row["keyword"].split("|")
            by_caption.setdefault(row["caption_id"], []).append(swap_class(row["type"], first, second))
    shares: Counter[str] = Counter()
    for names in by_caption.values():
        for name in names:
            shares[name] += 1 / len(names)
    return shares, len(by_caption)


def print_shares(title: str, shares: Counter[str], note: str) -> None:
    total = sum(shares.values())
    print(f"\n{title} ({note})")
    for name in CLASSES:
        print(f"  {name:26s} {shares[name] / total:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--world-parse", type=Path, help="the study's parse table of the fine-tuning captions")
    parser.add_argument("--negatives", type=Path, help="the study's swap negatives table")
    parser.add_argument("--sugarcrepe", type=Path, help="folder of SugarCrepe's released subset files")
    args = parser.parse_args()
    if not (args.world_parse or args.negatives or args.sugarcrepe):
        parser.error("give at least one of --world-parse, --negatives, --sugarcrepe")
    if args.world_parse:
        rows = read_table(args.world_parse, "parse").to_dict("records")
        shares, n, n_swap = negclip_shares(ParsedCaption.from_row(r) for r in rows)
        print_shares("world captions, NegCLIP's released scheme", shares,
                     f"{n_swap} of {n} captions have a swap")
    if args.negatives:
        shares, n_swap = study_shares(read_table(args.negatives, "negatives").to_dict("records"))
        print_shares("world captions, the study's negclip draw", shares, f"{n_swap} captions have a usable swap")
    if args.sugarcrepe:
        spacy_model = yaml.safe_load(args.config.read_text())["parse"]["spacy_model"]
        texts = sugarcrepe_positives(args.sugarcrepe)
        shares, n, n_swap = negclip_shares(Parser(spacy_model).parse_texts(texts))
        print_shares("COCO captions (SugarCrepe's positives), NegCLIP's released scheme", shares,
                     f"{n_swap} of {n} captions have a swap")


if __name__ == "__main__":
    main()
