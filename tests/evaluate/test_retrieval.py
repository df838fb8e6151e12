"""Retrieval's reader (compo.evaluate.retrieval): Karpathy files under their released names, scored by a tiny
random model against a plain loop; one file under two ids and captions without text are refused (issue 43)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_helpers import LONG, r1_loop, write_image

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark


def test_retrieval_refuses_one_file_under_two_ids_and_captions_without_text(tmp_path: Path) -> None:
    """One image file under two ids made exact ties counted against the model; empty raw captions were scored."""
    from compo.evaluate import retrieval
    from compo.evaluate.files import BenchmarkError

    images = [{"imgid": i, "filename": f"{i}.png", "split": "test", "sentences": [{"raw": f"image {i}"}]}
              for i in range(3)]
    images.append({**images[0], "imgid": 3})
    (tmp_path / "dataset.json").write_text(json.dumps({"images": images}))
    spec = {"kind": "retrieval", "source": "world"}
    with pytest.raises(BenchmarkError, match=r"dataset\.json: 1 image file\(s\) \(under different image ids\) given "
                                             r"more than once: .*images/0\.png \(2x\)"):
        retrieval.score(None, retrieval.karpathy_images(spec, tmp_path), tmp_path / "dataset.json")
    for raw in ("", "\u200b\u200b", 101):
        images[3] = {**images[1], "imgid": 3, "filename": "3.png", "sentences": [{"raw": raw}]}
        (tmp_path / "dataset.json").write_text(json.dumps({"images": images}))
        with pytest.raises(BenchmarkError, match=r"dataset\.json: image 3: sentences\[0\]: field 'raw' must be a "
                                                 "caption with a visible letter or digit"):
            retrieval.karpathy_images(spec, tmp_path)


@pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared
def test_karpathy_files_keep_their_released_names(tmp_path: Path, loaded) -> None:
    images = []
    for i in range(3):
        write_image(tmp_path / "images" / f"{i}.jpg", 200 + i)
        images.append({"imgid": i, "filename": f"{i}.jpg", "split": "test", "sentences": [{"raw": LONG[i]}]})
    (tmp_path / "dataset_flickr30k.json").write_text(json.dumps({"images": images}))
    spec = {"kind": "retrieval", "source": "files", "file": "dataset_flickr30k.json"}
    result = run_benchmark(loaded, spec, tmp_path)
    i2t, t2i = r1_loop(loaded, [tmp_path / "images" / f"{i}.jpg" for i in range(3)], LONG[:3])
    assert result.metrics["i2t_r1"].value == pytest.approx(i2t) and result.metrics["t2i_r1"].value == pytest.approx(t2i)
    assert benchmark_files("retrieval", str(tmp_path), spec) == [f"{tmp_path}/dataset_flickr30k.json"]
    with pytest.raises(BenchmarkError, match=r"dataset\.json: Karpathy-format dataset file not found"):
        run_benchmark(loaded, {"kind": "retrieval", "source": "files"}, tmp_path)
