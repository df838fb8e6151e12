"""Source `csv` (issue 58 item 3): your own image-caption pairs as open_clip's `--dataset-type csv` reads them, a
.csv, .tsv or .parquet table with `filepath` / `title` columns (or those `image_key` / `caption_key` name) and an
optional separator, read through the dataset rule's entry point with real tables and real images; image paths kept
inside `image_root`; a missing column, a bad row and a key on the wrong source are errors naming what is wrong."""

from __future__ import annotations

import copy
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from compo.config import ConfigError, validate_config
from compo.data import RawDataError, build_manifest
from compo.inputs import malformed_inputs
from compo.io import read_table

COLOURS = ["red", "green", "blue", "yellow"]
# (image path as the table gives it, caption): a caption with the separator, quotes and a line break in it
ROWS = [("images/0.png", 'a red square, "quoted"'), ("images/1.png", "a green square"),
        ("images/sub/2.png", "a blue square\non two lines"), ("images/1.png", "another caption of the green one"),
        ("images/3.png", "a yellow square")]


def _images(root: Path) -> Path:
    for i, colour in enumerate(COLOURS):
        path = root / ("images/sub" if i == 2 else "images") / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (24, 24), colour).save(path)
    return root


def _write(path: Path, rows: list[tuple[str, ...]], header=("filepath", "title"), separator: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pd.DataFrame(rows, columns=list(header)).to_parquet(path)
        return path
    with path.open("w", encoding="utf-8", newline="") as handle:  # open_clip's files: pandas' quoting
        writer = csv.writer(handle, delimiter=separator or ("\t" if path.suffix == ".tsv" else ","))
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _build(tmp_path: Path, spec: dict, name: str = "mine") -> tuple[pd.DataFrame, dict]:
    out, report = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
    build_manifest("mine", spec, out=out, report=report)
    return read_table(out, "manifest"), pd.read_csv(report).iloc[0].to_dict()


def _colour(path: str) -> str:
    pixel = Image.open(path).convert("RGB").getpixel((5, 5))
    return next(c for c in COLOURS if Image.new("RGB", (1, 1), c).getpixel((0, 0)) == pixel)


def test_csv_tsv_and_parquet_give_one_manifest_through_the_dataset_rules_entry_point(tmp_path):
    root = _images(tmp_path / "data")
    tables = [_write(root / "train.csv", ROWS), _write(root / "train.tsv", ROWS), _write(root / "train.parquet", ROWS)]
    # the dataset rule's command, as the Snakefile runs it (compo.cli -> compo.data.build_manifest)
    spec = {"source": "csv", "path": str(tables[0])}
    subprocess.run([sys.executable, "-m", "compo", "dataset", "--name", "mine", "--spec", json.dumps(spec),
                    "--out", str(tmp_path / "rule.parquet"), "--report", str(tmp_path / "rule.csv")], check=True)
    frame = read_table(tmp_path / "rule.parquet", "manifest")
    report = pd.read_csv(tmp_path / "rule.csv").iloc[0].to_dict()
    assert report["source"] == "csv" and report["records_read"] == 5 and report["images_read"] == 4
    assert report["images_kept"] == 4 and report["captions_kept"] == 5
    # the table's captions (whitespace collapsed, as every source's), each with its own image, in file order
    assert frame["caption"].tolist() == ['a red square, "quoted"', "a green square", "another caption of the green one",
                                         "a blue square on two lines", "a yellow square"]
    assert frame["image_path"].tolist() == [str(root / p) for p in ("images/0.png", "images/1.png", "images/1.png",
                                                                   "images/sub/2.png", "images/3.png")]
    assert [_colour(p) for p in frame["image_path"]] == ["red", "green", "green", "blue", "yellow"]
    assert set(frame["caption_kind"]) == {"short"} and frame["image_id"][0] == "images/0.png"
    for table in tables[1:]:
        other, _ = _build(tmp_path, {"source": "csv", "path": str(table)}, table.suffix[1:])
        pd.testing.assert_frame_equal(other, frame)


def test_other_columns_separators_and_captions_long(tmp_path):
    """open_clip's defaults are a tab and filepath/title whatever the suffix: a .csv of tabs reads with
    `separator`; other column names with image_key / caption_key (the others are ignored); a .txt with `|`."""
    root = _images(tmp_path / "data")
    tabs = _write(root / "openclip.csv", ROWS, separator="\t")
    frame, _ = _build(tmp_path, {"source": "csv", "path": str(tabs), "separator": "\t"}, "tabs")
    assert len(frame) == 5
    named = _write(root / "named.parquet", [(p, c, "x") for p, c in ROWS], header=("img", "text", "other"))
    long, _ = _build(tmp_path, {"source": "csv", "path": str(named), "image_key": "img", "caption_key": "text",
                                "captions": "long"}, "named")
    assert long["caption"].tolist() == frame["caption"].tolist() and set(long["caption_kind"]) == {"long"}
    piped = _write(root / "pairs.txt", ROWS, separator="|")
    assert len(_build(tmp_path, {"source": "csv", "path": str(piped), "separator": "|"}, "piped")[0]) == 5
    with pytest.raises(RawDataError, match=r"pairs\.txt: source csv reads \.csv, \.tsv or \.parquet files; for another "
                                           r"suffix give the dataset's `separator`"):
        _build(tmp_path, {"source": "csv", "path": str(piped)}, "no-separator")


def test_image_paths_stay_inside_image_root_and_bad_items_are_counted(tmp_path):
    """The project's containment rule (compo.images.item_path): '..', an absolute path elsewhere and a link out
    of the root are counted outside it; an absolute path inside counts. Missing and corrupt images, empty and
    invisible captions are counted, and a row repeated whole is read once."""
    root = _images(tmp_path / "data")
    outside = tmp_path / "outside.png"
    Image.new("RGB", (8, 8), "red").save(outside)
    (root / "images" / "link.png").symlink_to(outside)
    (root / "images" / "broken.png").write_bytes(b"\x89PNG not really")
    rows = [("images/0.png", "kept"), ("../outside.png", "dot-dot"), (str(outside), "absolute elsewhere"),
            ("images/link.png", "a link out"), (str(root / "images/3.png"), "absolute inside"),
            ("images/gone.png", "missing"), ("images/broken.png", "corrupt"), ("images/1.png", ""),
            ("images/sub/2.png", "\u3164"), ("images/0.png", "kept")]
    table = _write(root / "pairs.csv", rows)
    frame, report = _build(tmp_path, {"source": "csv", "path": str(table), "image_root": str(root)})
    assert frame["caption"].tolist() == ["kept", "absolute inside"]
    assert report["images_outside_root"] == 3 and report["images_missing_file"] == 1
    assert report["images_corrupt"] == 1 and report["records_repeated"] == 1
    assert report["captions_empty"] == 1 and report["captions_no_text"] == 1 and report["images_no_caption"] == 2


@pytest.mark.parametrize(("table", "spec", "message"), [
    ("pairs.csv", {}, r"pairs\.csv: image_key 'filepath' \(the default, as open_clip's\) names no column of the "
                      r"table; columns found: 'image', 'caption'$"),
    ("pairs.csv", {"image_key": "image"}, r"caption_key 'title' \(the default, as open_clip's\) names no column"),
    ("pairs.parquet", {"image_key": "image", "caption_key": "text"},
     r"pairs\.parquet: caption_key 'text' names no column of the table; columns found: 'image', 'caption'$"),
    ("tabs.csv", {}, r"columns found: 'image\\tcaption'; one column only: is the file separated by another "
                     r"character\? \(set `separator`\)"),
])
def test_a_missing_column_names_the_file_the_key_and_the_columns_found(tmp_path, table, spec, message):
    root = _images(tmp_path / "data")
    path = _write(root / table, ROWS[:2], header=("image", "caption"), separator="\t" if table == "tabs.csv" else None)
    with pytest.raises(RawDataError, match=message):
        _build(tmp_path, {"source": "csv", "path": str(path), **spec})
    # `compo inputs` and the DAG build's format check read the table's first rows with the same reader
    config = {"datasets": {"mine": {"source": "csv", "path": str(path), **spec}}, "benchmarks": {}}
    problems = [problem for _, problem in malformed_inputs(config)]
    assert len(problems) == 1 and re.search(message, problems[0]), problems


@pytest.mark.parametrize(("rows", "message"), [
    ([("", "a caption")], r"pairs\.csv: line 2: empty image cell \(column 'filepath'\)"),
    ([("images/0.png", "ok"), ("https://example.org/1.jpg", "a url")],
     r"pairs\.csv: line 3: column 'filepath' holds a URL \(https://example\.org/1\.jpg\); source csv reads image "
     r"files: download them first"),
    ([("images/0.png", "ok"), ("images/1.png", "a caption", "a third field")],
     r"pairs\.csv: line 3: 3 fields, the header has 2 \(separator ','\)"),
])
def test_a_bad_row_is_an_error_naming_its_line(tmp_path, rows, message):
    root = _images(tmp_path / "data")
    with pytest.raises(RawDataError, match=message):
        _build(tmp_path, {"source": "csv", "path": str(_write(root / "pairs.csv", rows))})


def test_a_column_named_twice_is_an_error(tmp_path):
    path = _write(tmp_path / "pairs.csv", [("a.png", "x", "y")], header=("filepath", "title", "title"))
    with pytest.raises(RawDataError, match=r"pairs\.csv: line 1: column 'title' named twice in the header"):
        _build(tmp_path, {"source": "csv", "path": str(path)})


@pytest.mark.parametrize(("entry", "key", "message"), [
    ({"source": "coco", "path": "x.json", "image_key": "img"}, "datasets.mine.image_key",
     "applies to source csv only"),
    ({"source": "cc3m", "path": "x.tsv", "separator": ","}, "datasets.mine.separator", "applies to source csv only"),
    ({"source": "csv", "path": "x.csv", "separator": "\\t"}, "datasets.mine.separator", "expected one character"),
    ({"source": "csv", "path": "x.csv", "image_key": ""}, "datasets.mine.image_key", "'' should be non-empty"),
])
def test_a_csv_key_on_another_source_or_malformed_is_a_config_error(config, entry, key, message):
    bad = copy.deepcopy(config)
    bad["datasets"]["mine"] = entry
    with pytest.raises(ConfigError, match=rf"config key {key.replace('.', chr(92) + '.')}: {message}"):
        validate_config(bad)
    good = copy.deepcopy(config)
    good["datasets"]["mine"] = {"source": "csv", "path": "x.csv", "image_key": "img", "caption_key": "text",
                                "separator": "\t"}
    validate_config(good)
