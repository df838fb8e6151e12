"""SDXL-Turbo img2img image negatives for real data (compo.negatives.diffusion) with a tiny randomly
initialised SDXL-style pipeline built here (diffusers' StableDiffusionXLImg2ImgPipeline: two CLIP text
encoders, a text_time-conditioned UNet, a VAE, Euler ancestral), no download: the module on its own. The rules
(ConcretePlant's tables -> image shards -> the gathered table with images) run in the whole paper study on stand-ins:
tests/test_whole_study.py checks their tables and shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from artifact_fixtures import SDXL_SIZE as SIZE
from artifact_fixtures import build_tiny_sdxl
from PIL import Image

from compo.images import image_source
from compo.io import read_table, write_table
from compo.negatives import build_generator, gather_negatives
from compo.negatives.diffusion import DiffusionSettings, generate_negative_images, load_pipeline, png_bytes, row_seed
from compo.shards import member_index, member_path, split_member

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_sdxl(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("tiny-sdxl")
    build_tiny_sdxl(folder)
    return str(folder)


def tables(root: Path) -> tuple[Path, Path]:
    """Three anchors (one unreadable) and their negatives: valid, invalid and a second slot."""
    rows, negatives = [], []
    for i in range(3):
        path = root / "images" / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        if i == 2:
            path.write_bytes(b"not a jpeg")
        else:
            Image.fromarray(np.random.default_rng(i).integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(path)
        rows.append({"image_id": f"i{i}", "image_path": str(path), "caption_id": f"c/{i}", "caption": "a red cat",
                     "dataset": "toy", "caption_kind": "short", "scene": None, "gt_noun_phrases": None,
                     "grounded_words": None, "ungrounded_words": None})
        for slot, (text, valid) in enumerate([("a blue cat", True), (None, False)] if i != 1 else
                                             [("a red dog", True), ("a green cat", True)]):
            negatives.append({"caption_id": f"c/{i}", "slot": slot, "negative": text,
                              "type": "object" if valid else "none", "keyword": "cat|dog" if valid else None,
                              "concreteness": 4.5 if valid else None, "generator": "concreteplant-hc",
                              "valid": valid, "reason": "ok" if valid else "exhausted", "truth": "unknown",
                              "negative_image": None})
    write_table(pd.DataFrame(rows), root / "manifest.parquet", "manifest")
    table = pd.DataFrame(negatives).astype({"concreteness": "float64"})
    table["negative_image"] = table["negative_image"].astype(object)
    write_table(table, root / "negatives.parquet", "negatives")
    return root / "manifest.parquet", root / "negatives.parquet"


def spec(model: str, **extra) -> dict:
    return {"generator": "sdxl-turbo", "model": model, "strength": 0.9, "steps": 2, "resolution": SIZE,
            "batch_size": 1, **extra}


def test_settings_are_checked_with_the_config_entry() -> None:
    assert DiffusionSettings.from_spec({}) == DiffusionSettings()  # stabilityai/sdxl-turbo, 0.9, 4 steps, 512
    for bad, match in (({"strength": 1.5}, "strength"), ({"steps": 1, "strength": 0.5}, "no denoising step"),
                       ({"resolution": 100}, "multiple of 8"), ({"generator": "dalle"}, "not an image generator"),
                       ({"sampler": "ddim"}, "unknown option"), ({"format": "zip"}, r"format: 'zip' \(expected tar")):
        with pytest.raises(ValueError, match=match):
            DiffusionSettings.from_spec(bad)
    entry = {"generator": "concreteplant-hc", "k": 1, "images": {"strength": 2.0}}
    with pytest.raises(ValueError, match=r"negatives\.x\.images\.strength"):
        build_generator(entry, where="negatives.x")
    with pytest.raises(ValueError, match="expected true .* or a mapping"):
        build_generator({**entry, "images": "sdxl"}, where="negatives.x")


def test_image_negatives_written_next_to_the_negatives_and_recorded(tmp_path: Path, tiny_sdxl: str) -> None:
    """Format tar (the default): the shard job's images are the members of one tar its rows name."""
    manifest, negatives = tables(tmp_path)
    settings = DiffusionSettings.from_spec(spec(tiny_sdxl))
    pipeline = load_pipeline(settings, device="cpu")
    generate_negative_images(negatives, manifest, spec(tiny_sdxl), 0, tmp_path / "out.parquet", tmp_path / "out.csv",
                             tmp_path / "concrete-hc.images" / "0", pipeline=pipeline)
    table = read_table(tmp_path / "out.parquet", "negatives")
    written = table.set_index(["caption_id", "slot"])["negative_image"]
    folder = tmp_path / "concrete-hc.images" / "0"
    shard = folder / "images.tar"
    assert written[("c/0", 0)] == member_path(shard, "c_0__0.png")
    assert written[("c/1", 1)] == member_path(shard, "c_1__1.png")
    assert pd.isna(written[("c/0", 1)])  # an invalid slot has no image
    assert pd.isna(written[("c/2", 0)])  # the anchor cannot be read: no image, counted in the log
    assert [p.name for p in folder.iterdir()] == ["images.tar"]  # one file, not a PNG each
    assert sorted(member_index(shard)) == ["c_0__0.png", "c_1__0.png", "c_1__1.png"]
    image = Image.open(image_source(written[("c/0", 0)]))
    assert image.format == "PNG"
    assert image.size == (SIZE, SIZE) and image.mode == "RGB"
    anchor = np.asarray(Image.open(tmp_path / "images" / "0.jpg").convert("RGB").resize((SIZE, SIZE)), dtype=float)
    assert np.abs(np.asarray(image, dtype=float) - anchor).mean() > 1  # the pipeline changed the image
    # the text columns are the text stage's, untouched
    pd.testing.assert_frame_equal(table.drop(columns="negative_image"),
                                  read_table(negatives, "negatives").drop(columns="negative_image"))
    # one row by hand: the pipeline on the anchor, centre-cropped and resized, with the row's own seed
    from PIL import ImageOps

    crop = ImageOps.fit(Image.open(tmp_path / "images" / "1.jpg").convert("RGB"), (SIZE, SIZE),
                        Image.Resampling.BICUBIC)
    generator = torch.Generator().manual_seed(row_seed(0, "c/1", 1))
    [by_hand] = pipeline(prompt=["a green cat"], image=[crop], strength=0.9, num_inference_steps=2, guidance_scale=0.0,
                         generator=[generator], output_type="pil").images
    assert np.array_equal(np.asarray(by_hand), np.asarray(Image.open(image_source(written[("c/1", 1)]))))
    # format png: the same encoded bytes, a file each
    generate_negative_images(negatives, manifest, spec(tiny_sdxl, format="png"), 0, tmp_path / "png.parquet",
                             tmp_path / "png.csv", tmp_path / "png", pipeline=pipeline)
    files = read_table(tmp_path / "png.parquet", "negatives").set_index(["caption_id", "slot"])["negative_image"]
    assert files[("c/1", 1)] == str(tmp_path / "png" / "c_1__1.png") and files.notna().sum() == 3
    assert Path(files[("c/1", 1)]).read_bytes() == png_bytes(by_hand) == image_source(written[("c/1", 1)]).read()


def test_a_shard_job_that_fails_leaves_no_tar(tmp_path: Path, tiny_sdxl: str) -> None:
    """The pipeline dies on its second batch: the image made so far is in no shard that looks complete."""
    manifest, negatives = tables(tmp_path)
    pipeline = load_pipeline(DiffusionSettings.from_spec(spec(tiny_sdxl)), device="cpu")
    calls = []

    def dies_on_second_batch(**kwargs):  # the real pipeline, then a fault injected (a GPU job's OOM)
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory")
        return pipeline(**kwargs)

    with pytest.raises(RuntimeError, match="out of memory"):
        generate_negative_images(negatives, manifest, spec(tiny_sdxl), 0, tmp_path / "out.parquet",
                                 tmp_path / "out.csv", tmp_path / "images" / "0", pipeline=dies_on_second_batch)
    assert list((tmp_path / "images" / "0").iterdir()) == [] and not (tmp_path / "out.parquet").exists()


def test_shards_gather_to_the_unsharded_images(tmp_path: Path, tiny_sdxl: str) -> None:
    manifest, negatives = tables(tmp_path)
    pipeline = load_pipeline(DiffusionSettings.from_spec(spec(tiny_sdxl)), device="cpu")
    generate_negative_images(negatives, manifest, spec(tiny_sdxl), 5, tmp_path / "all.parquet", tmp_path / "all.csv",
                             tmp_path / "all", pipeline=pipeline)
    for shard in range(2):
        generate_negative_images(negatives, manifest, spec(tiny_sdxl), 5, tmp_path / f"s{shard}.parquet",
                                 tmp_path / f"s{shard}.csv", tmp_path / f"s{shard}", shard=shard, n_shards=2,
                                 pipeline=pipeline)
    gather_negatives([tmp_path / "s0.parquet", tmp_path / "s1.parquet"], tmp_path / "gathered.parquet",
                     tmp_path / "gathered.csv", [tmp_path / "s0.csv", tmp_path / "s1.csv"])
    whole = read_table(tmp_path / "all.parquet", "negatives")
    gathered = read_table(tmp_path / "gathered.parquet", "negatives")
    pd.testing.assert_frame_equal(whole.drop(columns="negative_image"), gathered.drop(columns="negative_image"))
    for a, b in zip(whole["negative_image"], gathered["negative_image"], strict=True):
        assert pd.isna(a) == pd.isna(b)
        if not pd.isna(a):  # each shard's members in its own tar
            assert split_member(a)[1] == split_member(b)[1] and Path(split_member(b)[0]).parent.name in ("s0", "s1")
            assert np.array_equal(np.asarray(Image.open(image_source(a))), np.asarray(Image.open(image_source(b))))
