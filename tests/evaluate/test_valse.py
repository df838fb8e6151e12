"""VALSE (compo.evaluate.valse) on a fixture in the released format, checked against a plain loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from benchmark_helpers import embed_image, embed_text, sentence, write_image

from compo.evaluate import BenchmarkError, run_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared


def test_valse_matches_plain_loop_filters_unvalidated_and_uses_dataset_roots(tmp_path: Path, loaded) -> None:
    rng = np.random.default_rng(2)
    write_image(tmp_path / "coco" / "a.jpg", 1)
    write_image(tmp_path / "images" / "b.jpg", 2)
    items = {f"rel_{i}": {"dataset": "coco" if i % 2 else "other", "image_file": "a.jpg" if i % 2 else "b.jpg",
                          "caption": sentence(rng), "foil": sentence(rng), "classes": "x", "classes_foil": "y",
                          "mturk": {"caption": 3 if i != 4 else 1, "foil": 0, "other": 0}} for i in range(6)}
    (tmp_path / "relations.json").write_text(json.dumps(items))
    foil_it = {"f0": {"dataset": "other", "image_file": "b.jpg", "caption": "a red cube", "foil": "a red cube"}}
    (tmp_path / "foil-it.json").write_text(json.dumps(foil_it))
    spec = {"kind": "valse", "source": "files", "pieces": ["relations", "foil-it"],
            "image_roots": {"coco": str(tmp_path / "coco")}}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.skipped == {"not_validated": 1}
    correct = []
    for key, item in items.items():
        if key == "rel_4":
            continue
        root = tmp_path / ("coco" if item["dataset"] == "coco" else "images")
        v = embed_image(loaded, root / item["image_file"])
        caption, foil = embed_text(loaded, item["caption"]), embed_text(loaded, item["foil"])
        correct.append(float(v @ caption) > float(v @ foil) + 1e-9)
    assert result.metrics["relations"].value == pytest.approx(np.mean(correct))
    assert result.metrics["foil-it"].value == 0.0  # caption == foil: a tie
    assert result.metrics["mean"].value == pytest.approx(np.mean(correct) / 2)
    assert len(run_benchmark(loaded, {**spec, "valid_only": False}, tmp_path).predictions) == 7
    # a piece's own root wins over its items' dataset root (the release's config.py: one folder per piece)
    write_image(tmp_path / "foil_images" / "b.jpg", 3)
    by_piece = run_benchmark(loaded, {**spec, "image_roots": {**spec["image_roots"],
                                                              "foil-it": str(tmp_path / "foil_images")}}, tmp_path)
    assert by_piece.skipped == {"not_validated": 1} and by_piece.metrics["foil-it"].n == 1
    (tmp_path / "foil_images" / "b.jpg").unlink()
    with pytest.raises(BenchmarkError, match=r"foil-it\.json: no valse item of 'foil-it' left to score.*"
                                             r"\(missing_image: 1\)"):
        run_benchmark(loaded, {**spec, "image_roots": {"foil-it": str(tmp_path / "foil_images")}}, tmp_path)
    del items["rel_2"]["foil"]
    (tmp_path / "relations.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"relations\.json: item 'rel_2': missing field\(s\) foil"):
        run_benchmark(loaded, spec, tmp_path)
