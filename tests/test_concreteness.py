"""compo.concreteness: Brysbaert norms loading, checksums, lookup, the shipped subset, the stage."""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import math
import threading
from pathlib import Path

import pandas as pd
import pytest

from compo.concreteness import (
    SHIPPED_NORMS,
    NormsError,
    load_norms,
    rate_candidates,
    score_parse,
)
from compo.io import read_table, write_table
from compo.parse import Parser

# The subset script sits with the data files it writes (compo/resources/ is package data, not a package).
SUBSET_SCRIPT = SHIPPED_NORMS.parent / "make_norms_subset.py"
_spec = importlib.util.spec_from_file_location("make_norms_subset", SUBSET_SCRIPT)
subset_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(subset_script)
FULL_SHA256 = subset_script.FULL_SHA256
FULL_NORMS = Path(__file__).resolve().parents[2] / "shared" / "data" / "brysbaert2014_concreteness.tsv"
needs_full = pytest.mark.skipif(not FULL_NORMS.exists(), reason="full Brysbaert norms not on this machine")

HEADER = "Word\tBigram\tConc.M\tConc.SD\tUnknown\tTotal\tPercent_known\tSUBTLEX\tDom_Pos"
SMALL = "\r\n".join([
    HEADER,
    "circle\t0\t4.44\t0.9\t0\t30\t1.00\t1097\tNoun",
    "red\t0\t4.24\t1.0\t0\t30\t1.00\t7551\tAdjective",
    "null\t0\t1.79\t1.0\t0\t30\t1.00\t27\tAdjective",
    "coffee cup\t1\t5\t0\t0\t30\t1.00\t0\t#N/A",
    "cup\t0\t4.9\t0.3\t0\t30\t1.00\t900\tNoun",
    "coffee\t0\t4.6\t0.6\t0\t30\t1.00\t900\tNoun",
    "hope\t0\t1.25\t0.6\t0\t30\t1.00\t900\tNoun",
]) + "\r\n"


@pytest.fixture
def small_norms(tmp_path) -> tuple[Path, str]:
    path = tmp_path / "norms.tsv"
    path.write_bytes(SMALL.encode())
    return path, hashlib.sha256(SMALL.encode()).hexdigest()


def test_load_with_checksum_and_lookup(small_norms) -> None:
    path, digest = small_norms
    norms = load_norms(path, digest)
    assert len(norms) == 7
    assert norms.rating("circle") == 4.44 and norms.rating("Red") == 4.24
    assert norms.rating("null") == 1.79  # an English word, not a missing value
    assert norms.rating("coffee  cup") == 5.0
    assert norms.rating("square") is None


def test_checksum_mismatch_names_path_and_expected(small_norms) -> None:
    path, _ = small_norms
    wrong = "0" * 64
    with pytest.raises(NormsError, match=rf"{path}.*{wrong}"):
        load_norms(path, wrong)


def test_missing_file_names_path_and_expected(tmp_path) -> None:
    absent = tmp_path / "absent.tsv"
    with pytest.raises(NormsError, match=rf"{absent}: file not found.*expected sha256 {FULL_SHA256}"):
        load_norms(absent, FULL_SHA256)


def test_load_from_http_url(small_norms) -> None:
    path, digest = small_norms
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(path.parent))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
        assert load_norms(url, digest).rating("hope") == 1.25
        with pytest.raises(NormsError, match="sha256"):
            load_norms(url, "f" * 64)
        with pytest.raises(NormsError, match="download failed"):
            load_norms(url + ".missing", digest)
    finally:
        server.shutdown()
        server.server_close()


def test_two_word_expressions_then_single_words(parser: Parser, small_norms) -> None:
    norms = load_norms(*small_norms)
    p = parser.parse_text("a coffee cup near a red circle with hope and a cup")
    rated = rate_candidates(p.tokens, p.lemmas, p.keyword_candidates, norms)
    pairs = zip(rated.candidates, rated.ratings, strict=True)
    by_token = dict(zip(rated.candidate_tokens, pairs, strict=True))
    assert by_token[1] == ("coffee cup", 5.0)
    assert 2 not in by_token  # "cup" is consumed by the expression
    assert by_token[5] == ("red", 4.24) and by_token[6] == ("circle", 4.44)
    assert by_token[8] == ("hope", 1.25) and by_token[11] == ("cup", 4.9)
    assert math.isnan(by_token[3][1])  # "near" is not in these norms


def test_lemma_lookup_of_inflected_words(parser: Parser, small_norms) -> None:
    norms = load_norms(*small_norms)
    p = parser.parse_text("two circles")
    rated = rate_candidates(p.tokens, p.lemmas, p.keyword_candidates, norms)
    assert ("circle", 4.44) in zip(rated.candidates, rated.ratings, strict=True)


def test_shipped_subset_covers_the_world(parser: Parser) -> None:
    norms = load_norms()
    from compo.world import COLOURS, SHAPES

    for word in (*SHAPES, *COLOURS, "coffee cup", "traffic light"):
        assert norms.rating(word) is not None, word
    assert norms.rating("circle") > 4 and norms.rating("nostalgic") < 2.5  # grounded vs ungrounded


@needs_full
def test_shipped_subset_equals_full_rows(tmp_path) -> None:
    full = load_norms(FULL_NORMS, FULL_SHA256)
    shipped = load_norms()
    assert all(full.ratings[w] == r for w, r in shipped.ratings.items())
    wanted = {w for w in subset_script.world_vocabulary() if w in full.ratings}
    assert wanted <= set(shipped.ratings)
    full_lines = set(FULL_NORMS.read_bytes().split(b"\r\n"))
    assert set(SHIPPED_NORMS.read_bytes().split(b"\r\n")) <= full_lines  # verbatim rows, CRLF kept
    regenerated = tmp_path / "subset.tsv"
    subset_script.make_subset(FULL_NORMS, regenerated)
    assert regenerated.read_bytes() == SHIPPED_NORMS.read_bytes(), "rerun make_norms_subset.py"


def test_score_parse_writes_contract(tmp_path, parser: Parser, small_norms) -> None:
    rows = [p.to_row(f"c{i}") for i, p in enumerate(parser.parse_texts(["a red circle", "the the", "hope"]))]

    write_table(pd.DataFrame(rows), tmp_path / "parse.parquet", "parse")
    path, digest = small_norms
    score_parse(tmp_path / "parse.parquet", tmp_path / "conc.parquet", str(path), digest)
    table = read_table(tmp_path / "conc.parquet", "concreteness").set_index("caption_id")
    assert list(table.loc["c0", "candidates"]) == ["red", "circle"]
    assert table.loc["c0", "n_rated"] == 2
    assert table.loc["c0", "mean_rating"] == pytest.approx((4.24 + 4.44) / 2)
    assert table.loc["c1", "n_rated"] == 0 and pd.isna(table.loc["c1", "mean_rating"])
    assert table.loc["c2", "mean_rating"] == 1.25


# --- concreteness norms --------------------------------------------------------------------------------


NORMS_HEADER = "Word\tBigram\tConc.M\tConc.SD\tUnknown\tTotal\tPercent_known\tSUBTLEX\tDom_Pos\n"


@pytest.mark.parametrize(("rows", "expected"), [
    (["apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun", "idea\t0\t99\t1\t0\t30\t1\t100\tNoun"],
     r"line 3: Conc\.M 99\.0 is outside Brysbaert's scale 1 to 5"),
    (["apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun", "idea\t0\t-7\t1\t0\t30\t1\t100\tNoun"],
     r"line 3: Conc\.M -7\.0 is outside Brysbaert's scale 1 to 5"),
    (["apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun", "Apple\t0\t2.1\t1\t0\t30\t1\t100\tNoun"],
     r"line 3: 'apple' is rated again \(2\.1; line 2 gave 4\.9\)"),
    (["apple\t0\tnan\t0.3\t0\t30\t1\t100\tNoun"], r"line 2: Conc\.M 'nan' is not a rating"),
    (["apple\t0\t\t0.3\t0\t30\t1\t100\tNoun"], r"line 2: Conc\.M '' is not a rating"),
])
def test_norms_out_of_range_repeated_or_missing_are_errors_naming_file_and_line(tmp_path: Path, rows: list[str],
                                                                                 expected: str) -> None:
    norms = tmp_path / "norms.tsv"
    norms.write_text(NORMS_HEADER + "\n".join(rows) + "\n")
    with pytest.raises(NormsError, match=rf"^concreteness norms {norms} {expected}"):
        load_norms(norms)


def test_a_word_repeated_with_the_same_rating_is_counted_not_an_error(tmp_path: Path, caplog) -> None:
    norms = tmp_path / "norms.tsv"
    row = "apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun\n"
    norms.write_text(NORMS_HEADER + row + row)
    with caplog.at_level("WARNING", logger="compo.concreteness"):
        assert load_norms(norms).ratings == {"apple": 4.9}
    assert "1 repeated rows with the same rating skipped" in caplog.text
