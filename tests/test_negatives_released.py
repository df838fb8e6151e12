"""compo.negatives.released: DeGLA's released negatives read from its file (layout of its data loader)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_negatives import _write_inputs

from compo.io import read_table
from compo.negatives import build_generator, generate_negatives
from compo.parse import Parser

CAPTIONS = ["a small red circle to the left of a large blue square", "a red circle", "a  large blue  square"]


def _release(path: Path, records: list) -> Path:
    path.write_text(json.dumps(records))
    return path


def test_the_stage_writes_the_first_k_in_released_order(tmp_path: Path, parser: Parser) -> None:
    release = _release(tmp_path / "DeGLA.json", [
        {"image_id": 1, "original": CAPTIONS[0], "enhanced": ["n1", "n2", "n3", "n4", "n5"]},
        # matched with whitespace collapsed; its own caption, an empty and a repeated rewrite are dropped
        {"image_id": 2, "original": "a large blue square",
         "enhanced": ["a large blue square", "\u200b", "a small blue square", "a small blue square", "b"]},
        {"image_id": 3, "original": "a large blue square", "enhanced": ["other"]},  # the same text again
    ])
    _write_inputs(tmp_path, parser, CAPTIONS, [None] * 3)
    spec = {"generator": "degla-released", "k": 4, "path": str(release)}
    generate_negatives(tmp_path / "manifest.parquet", tmp_path / "parse.parquet", spec, seed=0,
                       out=tmp_path / "neg.parquet", report=tmp_path / "report.csv")
    table = read_table(tmp_path / "neg.parquet", "negatives").set_index(["caption_id", "slot"])
    assert [table.at[("cap0", s), "negative"] for s in range(4)] == ["n1", "n2", "n3", "n4"]
    assert (table.loc["cap0", "type"] == "released").all()
    assert table.loc["cap1", "reason"].tolist() == ["not_in_release"] * 4 and not table.loc["cap1", "valid"].any()
    cap2 = table.loc["cap2"]
    assert cap2["negative"].tolist()[:2] == ["a small blue square", "b"] and cap2["valid"].tolist() == [1, 1, 0, 0]
    report = pd.read_csv(tmp_path / "report.csv").set_index("group").loc["all"]
    assert report["captions_without_valid_negative"] == 1
    generator = build_generator(spec)
    assert len(generator.negatives) == 2 and generator.ambiguous == {"a large blue square"}


@pytest.mark.parametrize(("content", "message"), [
    (None, r"path .*missing\.json: file not found"),
    ("{not json", r"path .*missing\.json: not a JSON file"),
    ("[]", r"path .*missing\.json: expected a non-empty JSON list"),
    ('[{"original": "a", "enhanced": "b"}]',
     r"path .*missing\.json: record 0: expected \{'original': a string, 'enhanced': a list"),
])
def test_a_bad_release_names_the_file_and_the_record(tmp_path: Path, content: str | None,
                                                    message: str) -> None:
    path = tmp_path / "missing.json"
    if content is not None:
        path.write_text(content)
    generator = build_generator({"generator": "degla-released", "k": 4, "path": str(path)})  # read when used
    with pytest.raises(ValueError, match=rf"^{message}"):
        _ = generator.negatives


def test_the_caption_and_negatives_keys_are_options(tmp_path: Path, parser: Parser) -> None:
    """NegCLIP's loader in the same repository reads `caption` and `enhanced`."""
    release = _release(tmp_path / "n.json", [{"caption": CAPTIONS[1], "enhanced": ["a blue circle"]}])
    generator = build_generator({"generator": "degla-released", "k": 1, "path": str(release),
                                 "caption_key": "caption"})
    parsed = parser.parse_texts([CAPTIONS[1]])[0]
    assert [n.text for n in generator.generate(parsed, None, 1)] == ["a blue circle"]
