"""compo.caption_rows: a table's rows by caption_id from a memory-mapped copy (training's parse lookup): the rows
read_table gives, the contract's errors, one copy shared by the ranks of a job, memory that does not grow with
the table."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compo.caption_rows import CaptionRows
from compo.io import ContractError, contract_schema, read_table
from compo.parse import PARSE_COLUMNS

WORDS = np.array("a red cube left of the blue ball and green cone under small yellow cylinder near big purple "
                 "sphere on sandy beach at noon with two dogs one cat".split())


def synthetic_parse(path: Path, n: int, words: int = 30, row_group: int = 10_000, seed: int = 0) -> Path:
    """A `parse` table of n captions of `words` tokens (drawn from WORDS; heads a chain ending in a root, three
    noun phrases each), written in row groups of `row_group` captions; built with numpy and arrow, so 10^5
    captions take a second."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(WORDS), size=(n, words))
    offsets = pa.array(np.arange(0, n * words + 1, words, dtype=np.int32))

    def strings(vocabulary: np.ndarray, indices: np.ndarray) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), pa.array(vocabulary)
                                              ).cast(pa.string())

    def lists(values: pa.Array | np.ndarray, per: int) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(np.arange(0, len(values) + 1, per, dtype=np.int32)),
                                        values if isinstance(values, pa.Array) else pa.array(values))

    flat = strings(WORDS, picks.reshape(-1))
    heads = np.minimum(np.arange(words) + 1, words - 1)  # token i heads to i + 1, the last is the root
    starts, ends = np.array([0, 5, 10]), np.array([3, 8, 13])
    # the noun phrases: spans of 1,000 distinct captions, repeated
    spans = np.array([" ".join(WORDS[row[s:e]]) for row in picks[: min(n, 1000)]
                      for s, e in zip(starts, ends, strict=True)])
    tags = {column: strings(np.array(values), np.arange(len(flat)) % 3)
            for column, values in (("pos", ["DET", "ADJ", "NOUN"]), ("tags", ["DT", "JJ", "NN"]),
                                   ("deps", ["det", "amod", "ROOT"]))}
    columns = {
        "caption_id": pa.array([f"c{i}" for i in range(n)]),
        "caption": pa.array([" ".join(WORDS[row]) for row in picks]),
        "tokens": pa.ListArray.from_arrays(offsets, flat),
        "lemmas": pa.ListArray.from_arrays(offsets, flat),
        **{column: pa.ListArray.from_arrays(offsets, values) for column, values in tags.items()},
        "heads": pa.ListArray.from_arrays(offsets, pa.array(np.tile(heads, n).astype(np.int64))),
        "noun_phrases": lists(strings(spans, np.arange(3 * n) % len(spans)), 3),
        "noun_phrase_starts": lists(np.tile(starts, n), 3),
        "noun_phrase_ends": lists(np.tile(ends, n), 3),
        "keyword_candidates": lists(np.tile(np.arange(1, 30, 3), n), 10),
        "n_words": pa.array(np.full(n, words, dtype=np.int64)),
        "yngve_mean": pa.array(rng.random(n) * 3),
        "yngve_max": pa.array(np.full(n, 3, dtype=np.int64)),
    }
    columns = {c: columns[c] for c in PARSE_COLUMNS}
    assert list(columns) == PARSE_COLUMNS
    table = pa.table(columns).cast(contract_schema("parse"))
    pq.write_table(table, path, row_group_size=row_group)
    return path


def _expected_rows(path: Path) -> dict[str, dict]:
    return {row["caption_id"]: row for row in read_table(path, "parse").to_dict("records")}


def test_rows_are_the_tables_rows(tmp_path):
    parse = synthetic_parse(tmp_path / "parse.parquet", 2_500, row_group=1_000)
    rows = CaptionRows(parse, "parse", ["tokens", "noun_phrases", "heads"], tmp_path / "tables", chunk=700)
    expected = _expected_rows(parse)
    assert len(rows) == len(expected)
    for caption_id in ("c0", "c699", "c700", "c1999", "c2499"):
        row = rows.get(caption_id)
        assert list(row) == ["caption_id", "tokens", "noun_phrases", "heads"]
        for column in ("tokens", "noun_phrases", "heads"):
            assert row[column] == list(expected[caption_id][column]), (caption_id, column)
        assert caption_id in rows
    assert rows.get("c2500") is None and "c2500" not in rows and rows.get("") is None
    every = [tokens for chunk in rows.column_chunks("tokens") for tokens in chunk]
    assert every == [list(expected[f"c{i}"]["tokens"]) for i in range(2_500)]  # table order
    # a DataLoader worker started by spawn maps the same copy, not a pickled table
    assert len(pickle.dumps(rows)) < 1_000 and pickle.loads(pickle.dumps(rows)).get("c42") == rows.get("c42")


def test_one_copy_per_source_and_columns_reused_under_the_lock(tmp_path):
    parse = synthetic_parse(tmp_path / "parse.parquet", 300)
    folder = tmp_path / "tables"
    first = CaptionRows(parse, "parse", ["noun_phrases"], folder)
    copies = sorted(folder.glob("*.arrow"))
    stamp = copies[0].stat().st_mtime_ns
    second = CaptionRows(parse, "parse", ["noun_phrases"], folder)  # another rank: reuses the copy
    assert sorted(folder.glob("*.arrow")) == copies and copies[0].stat().st_mtime_ns == stamp
    assert second.get("c7") == first.get("c7")
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    CaptionRows(parse, "parse", ["tokens"], folder)  # other columns: another copy
    synthetic_parse(parse, 310, seed=1)  # the table rewritten: a fresh copy, its rows
    os.utime(parse, ns=(stamp + 1, stamp + 1))
    fresh = CaptionRows(parse, "parse", ["noun_phrases"], folder)
    assert len(fresh) == 310 and len(list(folder.glob("*.arrow"))) == 3
    assert not list(folder.glob(".*partial*"))


def test_contract_errors_name_the_file(tmp_path):
    parse = synthetic_parse(tmp_path / "parse.parquet", 50)
    table = pq.read_table(parse)
    # a caption id in two chunks: refused as read_table refuses it, and no copy is left to be reused
    ids = table.column("caption_id").to_pylist()
    ids[40] = "c3"
    pq.write_table(table.set_column(0, "caption_id", pa.array(ids)), tmp_path / "twice.parquet")
    with pytest.raises(ContractError, match=r"twice\.parquet: column 'caption_id' must be unique .*'c3'"):
        CaptionRows(tmp_path / "twice.parquet", "parse", ["tokens"], tmp_path / "tables", chunk=20)
    assert not list((tmp_path / "tables").glob("*.npy"))
    with pytest.raises(ContractError, match=r"twice\.parquet: column 'caption_id' must be unique"):
        read_table(tmp_path / "twice.parquet", "parse")
    # a column of the contract missing, or of the wrong type: its name and the file's
    pq.write_table(table.drop(["yngve_max"]), tmp_path / "short.parquet")
    with pytest.raises(ContractError, match=r"short\.parquet: missing column 'yngve_max'"):
        CaptionRows(tmp_path / "short.parquet", "parse", ["tokens"], tmp_path / "tables")
    with pytest.raises(FileNotFoundError, match=r"absent\.parquet: table not found \(expected a parse table\)"):
        CaptionRows(tmp_path / "absent.parquet", "parse", ["tokens"], tmp_path / "tables")
    with pytest.raises(ValueError, match=r"columns \['nouns'\] are not in the parse contract"):
        CaptionRows(parse, "parse", ["nouns"], tmp_path / "tables")


MEASURE = """
import sys
from compo.caption_rows import CaptionRows
from compo.parse import ROW_COLUMNS
def status(key):  # kB; RssAnon: this process's own memory, not the file pages it maps (which the ranks share)
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])
rss, anon = status("VmRSS:"), status("RssAnon:")
rows = CaptionRows(sys.argv[1], "parse", ROW_COLUMNS, sys.argv[2], chunk=2_000)  # steady after a few chunks
peak = status("VmHWM:") - rss
for i in range(0, len(rows), 97):
    rows.get(f"c{i}")
print(peak, status("RssAnon:") - anon)
"""


@pytest.mark.slow
def test_lookup_memory_does_not_grow_with_the_table(tmp_path):
    """The lookup of a 20,000- and a 200,000-caption parse table (30 tokens a caption, the columns online negatives
    read): in the rank that copies the table (2,000 rows a chunk), the peak RSS grows by < 40 MB between the two
    and its own memory afterwards by < 25 MB (the index's 24 B a caption, the allocator's slack); a rank that finds
    the copy made holds < 12 MB, whatever the size. The dict of rows it replaces grew by 1,010 MB here."""
    grown = {}
    for n in (20_000, 200_000):
        parse = synthetic_parse(tmp_path / f"parse-{n}.parquet", n)
        for rank in ("copies", "reuses"):
            run = subprocess.run([sys.executable, "-c", MEASURE, str(parse), str(tmp_path / f"tables-{n}")],
                                 capture_output=True, text=True, check=True)
            grown[n, rank] = [int(kb) / 1024 for kb in run.stdout.split()]  # MB: peak RSS, own memory after
    (copy_peak, copy_own), (reuse_peak, reuse_own) = ([grown[200_000, rank][i] - grown[20_000, rank][i]
                                                       for i in (0, 1)] for rank in ("copies", "reuses"))
    assert copy_peak < 40 and copy_own < 25 and max(reuse_peak, reuse_own, *grown[200_000, "reuses"]) < 12, grown
