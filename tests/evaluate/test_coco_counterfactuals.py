"""COCO-Counterfactuals (compo.evaluate.coco_counterfactuals, issue 47): FSC-CLIP's 30 % sample and retrieval
R@1 on a fixture in the release's layout (tests/fixtures/raw)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from benchmark_helpers import RAW

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark
from compo.evaluate import coco_counterfactuals as coco_cf
from compo.images import open_image
from compo.models import encode_images, encode_texts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_coco_counterfactuals_sample_is_fsc_clips_thirty_percent() -> None:
    examples = coco_cf.load_examples(RAW / "coco_counterfactuals" / "data" / "examples.jsonl")
    assert len(examples) == 10 and benchmark_files("coco_counterfactuals", "b", {}) == ["b/data/examples.jsonl"]
    drawn = coco_cf.sample(examples, 0.3, seed=0)
    assert len(drawn) == 3 and drawn == coco_cf.sample(examples, 0.3, seed=0) != coco_cf.sample(examples, 0.3, 1)
    assert len(coco_cf.sample([{}] * 17_410, 0.3, seed=0)) == 5_223  # FSC-CLIP: 5,223 of 17,410


def test_coco_counterfactuals_retrieval_r1(tmp_path: Path, loaded) -> None:
    shutil.copytree(RAW / "coco_counterfactuals", tmp_path, dirs_exist_ok=True)
    spec = {"kind": "coco_counterfactuals", "source": "files", "fraction": 1.0}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.metrics["i2t_r1"].n == 20 and result.metrics["t2i_r1"].n == 20 and result.headline == "r1_mean"
    records = [json.loads(line) for line in (tmp_path / "data" / "examples.jsonl").read_text().splitlines()]
    captions = [r[f"caption_{k}"] for r in records for k in (0, 1)]
    images = [open_image(tmp_path / "images" / f"{r[f'image_{k}']}.jpg") for r in records for k in (0, 1)]
    s = (encode_images(loaded, images).double() @ encode_texts(loaded, captions).double().T).numpy()
    i2t = np.mean([(np.delete(s[i], i) < s[i, i]).all() for i in range(20)])
    t2i = np.mean([(np.delete(s[:, j], j) < s[j, j]).all() for j in range(20)])
    assert result.metrics["i2t_r1"].value == pytest.approx(i2t) and result.metrics["t2i_r1"].value == pytest.approx(t2i)
    assert result.metrics["r1_mean"].value == pytest.approx((i2t + t2i) / 2)

    # example 0's two images made identical: each ties the other's caption, so neither is a strict top-1 hit
    shutil.copy(tmp_path / "images" / "0_0.jpg", tmp_path / "images" / "0_1.jpg")
    ranks = run_benchmark(loaded, spec, tmp_path).predictions.set_index(["subset", "item"])["rank"]
    assert ranks[("i2t", "0/0")] >= 2 and ranks[("i2t", "0/1")] >= 2

    (tmp_path / "data" / "examples.jsonl").write_text(json.dumps({"id": 1, "image_0": "a", "image_1": "b"}) + "\n")
    with pytest.raises(BenchmarkError, match=r"examples.jsonl: line 1: missing field\(s\) caption_0, caption_1"):
        run_benchmark(loaded, spec, tmp_path)
