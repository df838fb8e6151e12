"""Table contracts: validated on write and read, errors name the file and the column."""

from __future__ import annotations

import pandas as pd
import pytest

from compo.io import ContractError, read_table, write_table


def _negatives(**overrides):
    row = {
        "caption_id": "c0", "slot": 0, "negative": "a blue circle", "type": "noun", "keyword": "circle",
        "concreteness": 4.9, "generator": "negclip-swap", "valid": True, "reason": "ok", "truth": "false",
        "negative_image": None,
    }
    row.update(overrides)
    return pd.DataFrame([row])


def test_roundtrip(tmp_path):
    path = tmp_path / "n.parquet"
    write_table(_negatives(), path, "negatives")
    assert read_table(path, "negatives").loc[0, "negative"] == "a blue circle"
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed away


def test_missing_column_names_file_and_column(tmp_path):
    with pytest.raises(ContractError, match=r"n\.parquet.*'truth'"):
        write_table(_negatives().drop(columns="truth"), tmp_path / "n.parquet", "negatives")
    assert not (tmp_path / "n.parquet").exists()


def test_wrong_type_and_nulls(tmp_path):
    with pytest.raises(ContractError, match="'slot'"):
        write_table(_negatives(slot="zero"), tmp_path / "n.parquet", "negatives")
    with pytest.raises(ContractError, match="'caption_id'.*null"):
        write_table(_negatives(caption_id=None), tmp_path / "n.parquet", "negatives")


def test_corrupt_file_is_named(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(ContractError, match="bad.parquet"):
        read_table(path, "negatives")


def test_unique_column(tmp_path):
    frame = pd.DataFrame({"caption_id": ["a", "a"], "candidates": [[], []], "candidate_tokens": [[], []],
                          "ratings": [[], []], "n_rated": [0, 0], "mean_rating": [None, None]})
    with pytest.raises(ContractError, match="unique"):
        write_table(frame, tmp_path / "c.parquet", "concreteness")


def test_empty_captions_are_refused_on_read(tmp_path):
    """A manifest with a blank caption is written by no rule, but a hand-made one must not train."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"image_id": ["i0", "i1", "i2"], "image_path": ["a.png", "b.png", "c.png"],
            "caption_id": ["c0", "c1", "c2"], "caption": ["a red cube", " \t", ""], "dataset": ["d"] * 3,
            "caption_kind": [None] * 3, "scene": [None] * 3, "gt_noun_phrases": [None] * 3,
            "grounded_words": [None] * 3, "ungrounded_words": [None] * 3}
    pq.write_table(pa.table(rows), tmp_path / "manifest.parquet")  # bypasses write_table's check
    with pytest.raises(ContractError, match=r"manifest\.parquet: column 'caption' has 2 empty value\(s\) "
                                            r"\(first at row 1\)"):
        read_table(tmp_path / "manifest.parquet", "manifest")


@pytest.mark.parametrize("umask, file_mode, folder_mode", [(0o002, 0o664, 0o775), (0o022, 0o644, 0o755),
                                                           (0o077, 0o600, 0o700)])
def test_atomic_writes_honour_the_umask(tmp_path, umask, file_mode, folder_mode):
    """Files written through a temporary name get the mode a plain open() would (mkstemp's 0600 would make a
    shared cluster folder's checkpoints, model.json and tables unreadable to the user's group)."""
    import os

    import torch

    from compo.io import atomic_folder, write_json, write_text
    from compo.models import save_state

    previous = os.umask(umask)
    try:
        write_json({"a": 1}, tmp_path / "model.json")
        write_text("x\n", tmp_path / "table.md")
        write_table(_negatives(), tmp_path / "t.parquet", "negatives")
        save_state({"w": torch.zeros(2)}, tmp_path / "checkpoint.pt")
        with atomic_folder(tmp_path / "model") as folder:
            (folder / "inside.txt").write_text("y")
    finally:
        os.umask(previous)
    for name in ("model.json", "table.md", "t.parquet", "checkpoint.pt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == file_mode, name
    assert (tmp_path / "model").stat().st_mode & 0o777 == folder_mode
