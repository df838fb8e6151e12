"""Winoground (compo.evaluate.winoground) on a fixture in the released format, checked against a plain
loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from benchmark_helpers import embed_image, embed_text, sentence, write_image

from compo.evaluate import BenchmarkError, run_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared


def write_winoground(root: Path, n: int = 6) -> list[dict]:
    rng = np.random.default_rng(3)
    examples = []
    for i in range(n):
        for k in range(2):
            write_image(root / "images" / f"ex_{i}_img_{k}.png", 10 * i + k)
        # fine-grained tags that look like collapsed ones: grouping must use collapsed_tag only
        examples.append({"id": i, "image_0": f"ex_{i}_img_0", "image_1": f"ex_{i}_img_1",
                         "caption_0": sentence(rng), "caption_1": sentence(rng), "tag": ("Object", "Relation")[i % 2],
                         "secondary_tag": "", "num_main_preds": 1 + (i % 3 == 0),
                         "collapsed_tag": ("Relation", "Relation", "Object", "Both", "Object", "Relation")[i]})
    examples[2]["caption_1"] = examples[2]["caption_0"]  # a tie: text and group wrong
    (root / "examples.jsonl").write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    return examples


def test_winoground_matches_plain_loop(tmp_path: Path, loaded) -> None:
    examples = write_winoground(tmp_path / "wg")
    result = run_benchmark(loaded, {"kind": "winoground", "source": "files"}, tmp_path / "wg")
    expected = {"text": [], "image": [], "group": []}
    for ex in examples:
        i = [embed_image(loaded, tmp_path / "wg" / "images" / f"{ex[f'image_{k}']}.png") for k in range(2)]
        c = [embed_text(loaded, ex[f"caption_{k}"]) for k in range(2)]
        s = [[float(c[a] @ i[b]) for b in range(2)] for a in range(2)]
        text = s[0][0] > s[1][0] + 1e-9 and s[1][1] > s[0][1] + 1e-9
        image = s[0][0] > s[0][1] + 1e-9 and s[1][1] > s[1][0] + 1e-9
        for name, value in (("text", text), ("image", image), ("group", text and image)):
            expected[name].append(value)
    groups = {"relation": [0, 1, 5], "object": [2, 4], "both": [3], "1_main_preds": [1, 2, 4, 5],
              "2_main_preds": [0, 3]}
    for name, values in expected.items():
        assert result.metrics[name].value == pytest.approx(np.mean(values)) and result.metrics[name].n == 6
        for suffix, members in groups.items():
            metric = result.metrics[f"{name}_{suffix}"]
            assert metric.n == len(members) and metric.value == pytest.approx(np.mean([values[i] for i in members]))
    assert expected["text"][2] is False
    rows = result.predictions
    assert not rows[(rows["item"] == "2") & (rows["subset"] == "text")]["correct"].item()


def test_winoground_bad_lines_are_named(tmp_path: Path, loaded) -> None:
    examples = write_winoground(tmp_path / "wg")
    del examples[3]["caption_1"]
    (tmp_path / "wg" / "examples.jsonl").write_text("\n".join(json.dumps(e) for e in examples))
    with pytest.raises(BenchmarkError, match=r"examples\.jsonl: line 4 \(example 3\): missing field\(s\) caption_1"):
        run_benchmark(loaded, {"kind": "winoground", "source": "files"}, tmp_path / "wg")
    examples[3]["caption_1"], examples[1]["num_main_preds"] = "x", "1"
    (tmp_path / "wg" / "examples.jsonl").write_text("\n".join(json.dumps(e) for e in examples))
    with pytest.raises(BenchmarkError, match=r"line 2 \(example 1\): field 'num_main_preds' must be a positive"):
        run_benchmark(loaded, {"kind": "winoground", "source": "files"}, tmp_path / "wg")


def test_a_winoground_caption_of_invisible_characters_is_refused(tmp_path: Path) -> None:
    from compo.evaluate.files import BenchmarkError
    from compo.evaluate.winoground import load_examples

    example = {"id": 0, "image_0": "ex_0_img_0", "image_1": "ex_0_img_1", "caption_0": "a cube on a ball",
               "caption_1": "\ufeff\u2066\u2069", "tag": "Object", "collapsed_tag": "Object", "num_main_preds": 1}
    (tmp_path / "examples.jsonl").write_text(json.dumps(example) + "\n")
    with pytest.raises(BenchmarkError, match=r"examples\.jsonl: line 1 \(example 0\): field 'caption_1' must be a "
                                             "caption with a visible letter or digit"):
        load_examples(tmp_path / "examples.jsonl")
