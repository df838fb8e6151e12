"""Long-caption retrieval (compo.evaluate.long_retrieval) on the releases' layouts: Urban1k, DOCCI, DCI (sDCI
summaries), ShareGPT4V-1k and ImageInWords, scored by a tiny random model and checked against plain loops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_helpers import LONG, r1_loop, write_image

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared


def check_r1(result, loaded, images: list[Path], captions: list[str]) -> None:
    i2t, t2i = r1_loop(loaded, images, captions)
    assert result.headline == "r1"
    assert result.metrics["i2t_r1"].value == pytest.approx(i2t) and result.metrics["t2i_r1"].value == pytest.approx(t2i)
    assert result.metrics["r1"].value == pytest.approx((i2t + t2i) / 2)
    assert {"i2t_r5", "t2i_r10"} <= set(result.metrics)


def test_urban1k_layout_and_max_words(tmp_path: Path, loaded) -> None:
    for n, caption in enumerate(LONG, start=1):
        write_image(tmp_path / "image" / f"{n}.jpg", 40 + n)
        (tmp_path / "caption").mkdir(exist_ok=True)
        (tmp_path / "caption" / f"{n}.txt").write_text(caption + "\n")
    (tmp_path / "caption" / "10.txt").write_text("A caption whose image was never downloaded.")
    spec = {"kind": "long_retrieval", "source": "files", "format": "urban1k"}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.skipped == {"missing_image": 1}  # 10.jpg
    check_r1(result, loaded, [tmp_path / "image" / f"{n}.jpg" for n in range(1, 5)], LONG)
    assert result.predictions.loc[result.predictions["subset"] == "i2t", "item"].tolist() == ["1", "2", "3", "4"]
    short = run_benchmark(loaded, {**spec, "max_words": 5}, tmp_path)
    check_r1(short, loaded, [tmp_path / "image" / f"{n}.jpg" for n in range(1, 5)],
             [" ".join(c.split()[:5]) for c in LONG])
    assert benchmark_files("long_retrieval", str(tmp_path), spec) == [f"{tmp_path}/caption"]


def test_docci_test_split(tmp_path: Path, loaded) -> None:
    lines = [{"example_id": f"{split}_{i}", "split": split, "image_file": f"{split}_{i}.jpg", "description": text}
             for i, (split, text) in enumerate([("train", "a training image"), ("test", LONG[0]), ("test", LONG[1]),
                                                ("qual_dev", "a dev image"), ("test", LONG[2])])]
    for line in lines:
        write_image(tmp_path / "images" / line["image_file"], len(line["example_id"]) + lines.index(line))
    (tmp_path / "docci_descriptions.jsonlines").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = run_benchmark(loaded, {"kind": "long_retrieval", "source": "files", "format": "docci"}, tmp_path)
    test = [line for line in lines if line["split"] == "test"]
    check_r1(result, loaded, [tmp_path / "images" / x["image_file"] for x in test], [x["description"] for x in test])
    assert result.metrics["i2t_r1"].n == 3


def test_dci_test_split_with_sdci_summaries(tmp_path: Path, loaded) -> None:
    root = tmp_path / "densely_captioned_images"
    entries = {"sa_1": LONG[0], "sa_2": LONG[1], "sa_3": None, "sa_4": LONG[2], "sa_5": "a training summary"}
    for k, (entry, summary) in enumerate(entries.items()):
        write_image(root / "photos" / f"{entry}.jpg", 70 + k)
        data = {"image": f"{entry}.jpg", "short_caption": "short", "extra_caption": "", "mask_data": {}}
        if summary is not None:
            data["summaries"] = {"base": [summary, "another summary"]}
        (root / "complete").mkdir(parents=True, exist_ok=True)
        (root / "complete" / f"{entry}.json").write_text(json.dumps(data))
    (root / "splits.json").write_text(json.dumps({"train": ["sa_5.json"], "valid": [],
                                                  "test": ["sa_1.json", "sa_2.json", "sa_3.json", "sa_4.json"]}))
    result = run_benchmark(loaded, {"kind": "long_retrieval", "source": "files", "format": "dci"}, root)
    assert result.skipped == {"no_summary": 1}
    check_r1(result, loaded, [root / "photos" / f"sa_{n}.jpg" for n in (1, 2, 4)], [LONG[0], LONG[1], LONG[2]])


def test_sharegpt4v_1k_is_the_first_records(tmp_path: Path, loaded) -> None:
    records = [{"id": f"r{i}", "image": f"coco/{i}.jpg",
                "conversations": [{"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": text}]}
               for i, text in enumerate(LONG + ["a record after the test set"])]
    for i in range(len(records)):
        write_image(tmp_path / "coco" / f"{i}.jpg", 90 + i)
    (tmp_path / "share-captioner_coco_lcs_sam_1246k_1107.json").write_text(json.dumps(records))
    spec = {"kind": "long_retrieval", "source": "files", "format": "sharegpt4v", "holdout": 4}
    result = run_benchmark(loaded, spec, tmp_path)
    check_r1(result, loaded, [tmp_path / "coco" / f"{i}.jpg" for i in range(4)], LONG)
    assert benchmark_files("long_retrieval", str(tmp_path), spec) == [
        f"{tmp_path}/share-captioner_coco_lcs_sam_1246k_1107.json"]
    # a holdout past the file's records: the test set would be smaller than asked (it was, silently)
    with pytest.raises(BenchmarkError, match=r"1107\.json: benchmark key holdout 9: the file holds 5 record\(s\)"):
        run_benchmark(loaded, {**spec, "holdout": 9}, tmp_path)


def iiw_line(key: str, text: str, field: str = "image/key") -> str:
    """A data.jsonl line as google/imageinwords datasets/ releases it (the fields a reader must pass over too)."""
    return json.dumps({"IIW": text, "IIW-P5B": "a model's description", field: key,
                       "iiw-human-sxs-gpt4v": {"metrics/Comprehensiveness": "Neutral"},
                       "objects": [{"label": "cube", "normalized_coords": ["0", "0", "9", "9"]}]})


def test_iiw_400_and_the_union_of_human_authored_subsets(tmp_path: Path, loaded) -> None:
    keys = ["aar_test_04600", "aar_test_04601", "aar_test_04602"]
    for k, key in enumerate(keys):
        write_image(tmp_path / "docci_aar" / f"{key}.jpg", 110 + k)
    (tmp_path / "IIW-400").mkdir()
    lines = [iiw_line(key, LONG[k]) for k, key in enumerate(keys)] + ["", iiw_line(keys[1], "seen again")]
    (tmp_path / "IIW-400" / "data.jsonl").write_text("\n".join(lines) + "\n")
    spec = {"kind": "long_retrieval", "source": "files", "format": "iiw"}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.skipped == {"duplicate": 1}
    check_r1(result, loaded, [tmp_path / "docci_aar" / f"{key}.jpg" for key in keys], LONG[:3])
    assert result.predictions.loc[result.predictions["subset"] == "i2t", "item"].tolist() == keys
    assert benchmark_files("long_retrieval", str(tmp_path), spec) == [f"{tmp_path}/IIW-400/data.jsonl"]

    # DCI_Test names its image by `image` with the extension; a union is one test set over both folders
    write_image(tmp_path / "dci" / "sa_1.jpg", 120)
    (tmp_path / "DCI_Test").mkdir()
    (tmp_path / "DCI_Test" / "data.jsonl").write_text(iiw_line("sa_1.jpg", LONG[3], field="image") + "\n")
    union = {**spec, "subsets": ["IIW-400", "DCI_Test"]}
    result = run_benchmark(loaded, union, tmp_path)
    check_r1(result, loaded, [*(tmp_path / "docci_aar" / f"{key}.jpg" for key in keys), tmp_path / "dci" / "sa_1.jpg"],
             LONG)
    assert benchmark_files("long_retrieval", str(tmp_path), union) == [
        f"{tmp_path}/IIW-400/data.jsonl", f"{tmp_path}/DCI_Test/data.jsonl"]


@pytest.mark.parametrize(("line", "expected"), [
    ('{"IIW": "a text", "image/key": "aar_1"', "data.jsonl:2: not a JSON object"),
    ('{"IIW": "  ", "image/key": "aar_1"}', "data.jsonl:2: expected a non-empty 'image/key'"),
    ('{"IIW-P5B": "a text", "image/key": "aar_1"}', "data.jsonl:2: expected a non-empty 'image/key'"),
    ('["aar_1", "a text"]', "data.jsonl:2: expected a non-empty 'image/key'"),
])
def test_iiw_malformed_lines_name_file_and_line(tmp_path: Path, loaded, line: str, expected: str) -> None:
    (tmp_path / "IIW-400").mkdir()
    (tmp_path / "IIW-400" / "data.jsonl").write_text(iiw_line("aar_0", LONG[0]) + "\n" + line + "\n")
    with pytest.raises(BenchmarkError, match=f"IIW-400/{expected}"):
        run_benchmark(loaded, {"kind": "long_retrieval", "source": "files", "format": "iiw"}, tmp_path)


def test_iiw_subsets_and_missing_file_are_named(tmp_path: Path, loaded) -> None:
    spec = {"kind": "long_retrieval", "source": "files", "format": "iiw"}
    with pytest.raises(BenchmarkError, match=r"IIW-400/data.jsonl: ImageInWords IIW-400 file not found"):
        run_benchmark(loaded, spec, tmp_path)
    with pytest.raises(BenchmarkError, match="'subsets' must be a non-empty list of distinct names among IIW-400"):
        benchmark_files("long_retrieval", str(tmp_path), {**spec, "subsets": ["CM_3600"]})
