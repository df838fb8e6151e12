"""Retrieval's reader (compo.evaluate.retrieval): one file under two ids and captions without text are refused
(issue 43)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


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
