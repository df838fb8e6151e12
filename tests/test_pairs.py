"""Seed 002 Table 1's per-pair scores and I2T / T2I accuracy on negative pairs, against a direct per-pair loop."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from compo.evaluate.pairs import pair_accuracy, pair_scores
from compo.models import create_model, encode_images, encode_texts, load_model, save_checkpoint
from compo.world import generate_split

REPO = Path(__file__).resolve().parents[1]


def test_pair_scores_match_a_loop_and_count_ties_as_wrong(tmp_path):
    world = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["world"]
    world = {**world, "splits": {**world["splits"], "finetune": 6}}
    generate_split("finetune", world, seed=3, out_dir=tmp_path / "w")
    manifest = pd.read_parquet(tmp_path / "w" / "manifest.parquet").query("caption_kind == 'short'").head(8)
    save_checkpoint(create_model("compo-tiny-clip", "scratch", seed=5), "compo-tiny-clip", tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    images = list(manifest["image_path"])
    pairs = pd.DataFrame({
        "image_path": images,
        "caption": list(manifest["caption"]),
        "negative": list(manifest["caption"].iloc[::-1]),
        "negative_image": [images[(i + 1) % len(images)] if i % 2 else None for i in range(len(images))],
    })
    pairs.loc[0, "negative"] = pairs.loc[0, "caption"]  # a tie: counted wrong
    scores = pair_scores(loaded, pairs)
    result = pair_accuracy(scores)

    def embed_image(path):
        with Image.open(path) as image:
            return encode_images(loaded, [image.convert("RGB")])[0].double()

    def embed_text(text):
        return encode_texts(loaded, [text])[0].double()

    i2t = [float(embed_image(r.image_path) @ embed_text(r.caption)) > float(embed_image(r.image_path)
           @ embed_text(r.negative)) + 1e-9 for r in pairs.itertuples()]
    t2i = [float(embed_text(r.caption) @ embed_image(r.image_path)) > float(embed_text(r.caption)
           @ embed_image(r.negative_image)) + 1e-9 for r in pairs.itertuples() if isinstance(r.negative_image, str)]
    assert not i2t[0]
    positive = [float(embed_image(r.image_path) @ embed_text(r.caption)) for r in pairs.itertuples()]
    assert scores["score_pos"].tolist() == pytest.approx(positive, abs=1e-6)
    assert scores["score_neg"].iloc[0] == pytest.approx(positive[0], abs=1e-6)
    assert scores["i2t_correct"].tolist() == i2t
    assert scores["t2i_correct"].isna().tolist() == [not isinstance(p, str) for p in pairs["negative_image"]]
    assert scores["t2i_correct"].dropna().tolist() == t2i
    assert result["n_i2t"] == len(pairs) and result["i2t"] == sum(i2t) / len(i2t)
    assert result["n_t2i"] == len(t2i) and result["t2i"] == sum(t2i) / len(t2i)
    assert torch.isfinite(torch.tensor(result["i2t"]))


def test_pair_accuracy_counts_only_pairs_with_a_negative_image_for_t2i():
    scores = pd.DataFrame({"i2t_correct": [True, False, True, True],
                           "t2i_correct": pd.array([True, None, False, None], dtype="boolean")})
    assert pair_accuracy(scores) == {"i2t": 0.75, "n_i2t": 4, "t2i": 0.5, "n_t2i": 2}
    empty = pair_accuracy(scores.iloc[:0])
    assert empty["n_i2t"] == 0 and empty["n_t2i"] == 0 and math.isnan(empty["i2t"]) and math.isnan(empty["t2i"])


def test_pair_scores_in_chunks_equal_the_whole_table(tmp_path):
    """The bounded-memory path (a few pairs per chunk, images out of order) gives the one-chunk path's scores."""
    world = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["world"]
    world = {**world, "splits": {**world["splits"], "finetune": 6}}
    generate_split("finetune", world, seed=4, out_dir=tmp_path / "w")
    manifest = pd.read_parquet(tmp_path / "w" / "manifest.parquet").head(10)
    save_checkpoint(create_model("compo-tiny-clip", "scratch", seed=5), "compo-tiny-clip", tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    images = list(manifest["image_path"])
    pairs = pd.DataFrame({
        "image_path": images[::-1],
        "caption": list(manifest["caption"]),
        "negative": list(manifest["caption"].iloc[::-1]),
        "negative_image": [images[(i + 3) % len(images)] if i % 3 else None for i in range(len(images))],
    }, index=range(100, 100 + len(images)))
    whole = pair_scores(loaded, pairs, chunk=len(pairs))
    chunked = pair_scores(loaded, pairs, chunk=3)
    assert chunked.index.equals(pairs.index) and chunked.dtypes.equals(whole.dtypes)
    pd.testing.assert_frame_equal(chunked, whole, check_exact=False, atol=1e-6)
    assert chunked["t2i_correct"].isna().sum() == 4
