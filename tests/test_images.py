"""Images past PIL's pixel limit (compo.images.OVERSIZED_IMAGE): counted and named as such by the dataset stage
and skipped with their own reason by evaluation (issue 43)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from compo.data import build_manifest
from compo.io import read_table

# --- unclear cases end in one line naming the file, item or key ----------------------------------------


def test_an_image_past_pils_pixel_limit_is_counted_and_named_as_such(tmp_path: Path, write_manifest, loaded,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """PIL's DecompressionBombError was counted as a corrupt image (or raised naming no item): the dataset stage
    counts it in its own column and evaluation skips it with its own reason, each naming the file."""
    from PIL import Image

    from compo.evaluate.scoring import encode_image_files
    from compo.images import OVERSIZED_IMAGE

    rows = []
    for i, side in enumerate((16, 2000, 16)):
        Image.new("RGB", (side, side), "red").save(tmp_path / f"{i}.png")
        rows.append({"image_id": f"w{i}", "image_path": str(tmp_path / f"{i}.png"), "caption_id": f"w{i}-s0",
                     "caption": "a red square", "dataset": "finetune", "caption_kind": "short"})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)  # 2,000 x 2,000 pixels is past twice the limit
    world = write_manifest(rows, tmp_path / "world.parquet")
    build_manifest("coco", {"source": "world", "split": "finetune"}, out=tmp_path / "m.parquet",
                   world_manifest=world, report=tmp_path / "r.csv")
    assert read_table(tmp_path / "m.parquet", "manifest")["image_id"].tolist() == ["w0", "w2"]
    report = pd.read_csv(tmp_path / "r.csv").iloc[0]
    assert report["images_oversized"] == 1 and report["images_corrupt"] == 0
    _, rows_of, failed = encode_image_files(loaded, [tmp_path / "0.png", tmp_path / "1.png"])
    assert list(rows_of) == [tmp_path / "0.png"] and failed == {tmp_path / "1.png": OVERSIZED_IMAGE}
