"""SPEC (compo.evaluate.spec_benchmark, issue 47): the loader on the fixture in the release's layout, its scoring
on known similarities, and a malformed file's error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from benchmark_helpers import FIXTURES, cosine
from test_real_benchmarks import placeholders

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark, spec_benchmark
from compo.evaluate.files import SPEC_SUBSETS

pytestmark = pytest.mark.usefixtures("one_thread")


def test_spec_files_counts_and_summary() -> None:
    for subset in SPEC_SUBSETS:
        i2t = spec_benchmark.load_file(FIXTURES / "spec" / subset / "image2text.json", "i2t", Path("/s"))
        t2i = spec_benchmark.load_file(FIXTURES / "spec" / subset / "text2image.json", "t2i", Path("/s"))
        assert (len(i2t), len(t2i)) == (2, 2)
    assert i2t[1].images == (Path("/s/images/1_0.jpg"),) and len(i2t[1].texts) == 3
    assert t2i[0].images[2] == Path("/s/images/0_2.jpg") and t2i[0].right == (2,) and t2i[0].subset == "s/t2i"
    assert len(benchmark_files("spec", "b", {})) == 12 and "b/count/text2image.json" in benchmark_files("spec", "b")
    assert spec_benchmark.summary({"count/i2t": 0.5, "existence/i2t": 1.0, "count/t2i": 0.25}) == {
        "i2t": 0.75, "t2i": 0.25, "mean": 0.5}


def test_spec_runs_on_the_fixture(tmp_path: Path, loaded) -> None:
    folder = tmp_path / "spec"
    shutil.copytree(FIXTURES / "spec", folder)
    placeholders(folder, {f"{s}/images/{k}_{j}.jpg" for s in SPEC_SUBSETS for k in (0, 1) for j in (0, 1, 2)}
                 - {"count/images/1_2.jpg"})
    t2i = json.loads((folder / "existence/text2image.json").read_text())
    t2i[0]["keys"], t2i[0]["label"] = ["images/0_1.jpg"] * 3, 0  # one image three times: all tie
    (folder / "existence/text2image.json").write_text(json.dumps(t2i))

    result = run_benchmark(loaded, {"kind": "spec", "source": "files"}, folder)
    assert result.skipped == {"missing_image": 1}  # count/t2i item 1 names 1_2.jpg
    assert result.metrics["count/t2i"].n == 1 and result.metrics["count/i2t"].n == 2
    assert len(result.predictions) == 23 and result.headline == "mean"
    rows = result.predictions.set_index(["subset", "item"])
    assert rows.loc[("existence/t2i", "0"), "rank"] == 3 and not rows.loc[("existence/t2i", "0"), "correct"]
    gap = result.metrics["existence/t2i"].value - result.metrics["existence/t2i_strict"].value
    assert gap == pytest.approx(0.5)  # the released first-maximum rule counts the tie right
    i2t = np.mean([result.metrics[f"{s}/i2t"].value for s in SPEC_SUBSETS])
    t2i_mean = np.mean([result.metrics[f"{s}/t2i"].value for s in SPEC_SUBSETS])
    assert result.metrics["mean"].value == pytest.approx((i2t + t2i_mean) / 2)
    item = json.loads((folder / "count/image2text.json").read_text())[1]
    expected = cosine(loaded, folder / "count" / item["query"], item["keys"][item["label"]])
    assert rows.loc[("count/i2t", "1"), "score_pos"] == pytest.approx(expected, abs=1e-6)


def test_spec_malformed_file(tmp_path: Path) -> None:
    items = json.loads((FIXTURES / "spec/count/image2text.json").read_text())
    items[1]["label"] = 3
    (tmp_path / "image2text.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"image2text.json: item 1: 'label' must be an index into its 3 keys"):
        spec_benchmark.load_file(tmp_path / "image2text.json", "i2t", tmp_path)
    items[1]["label"], items[1]["keys"] = 0, items[1]["keys"][:2]
    (tmp_path / "image2text.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match="item 1: 2 keys, but item 0 has 3"):
        spec_benchmark.load_file(tmp_path / "image2text.json", "i2t", tmp_path)
