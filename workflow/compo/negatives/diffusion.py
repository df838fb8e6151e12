"""Image negatives for real data (seed 002, section 2.2): SDXL-Turbo img2img, v'_i = f_gen(v_i, t'_i).

Cement trains on 2N image-text pairs: every ConcretePlant negative caption t'_i needs its negative image
v'_i, "obtained by feeding v_i and t'_i to an image generative model", SDXL-Turbo, "configured with high
strength to avoid style or semantic transfer, and low inference steps to minimize computational budget".
The synthetic world re-renders its scenes exactly (`compo.negatives.images`); real data goes through
this module, with `diffusers`' `AutoPipelineForImage2Image` (SDXL-Turbo's pipeline class,
StableDiffusionXLImg2ImgPipeline).

Config (`negatives.<name>.images`, a mapping; `images: true` is the world's exact re-render):
  generator        sdxl-turbo (the one image generator)
  model            a diffusers folder or hub name (default stabilityai/sdxl-turbo)
  strength         img2img strength (default 0.9: "high"); the seed gives no number
  steps            num_inference_steps (default 4: "low", SDXL-Turbo's 1-4 step range); with strength s
                   the pipeline denoises int(steps * s) steps, which must be >= 1
  guidance_scale   0.0 (SDXL-Turbo is distilled to run without classifier-free guidance)
  resolution       the anchor is centre-cropped to a square and resized to this side (default 512, the
                   resolution SDXL-Turbo was trained at); the negative image has this size
  batch_size       rows per pipeline call (default 4)
  shards           parallel jobs, each a contiguous block of the negatives table's rows (default 1)
  dtype            float16 or float32 on CUDA (default float16); the CPU always runs float32
  format           tar (default): a job's PNGs are the members of one uncompressed tar, `image_dir/images.tar`
                   (compo.shards.ShardWriter; the paper's 248 K negatives are 48 files, not 248 K); png: one
                   file each in `image_dir`

Per row of the negatives table (the text stage's output): a valid negative gets an image, encoded as PNG
named `{caption_id}__{slot}.png` (the world's file names, `compo.negatives.images.image_name`), and its
path is recorded in the row's `negative_image`: a member path `image_dir/images.tar#<name>` (compo.shards;
training and evaluation open it by random access) or the file `image_dir/<name>`; invalid slots keep null
("not_applicable"); an anchor image that is missing or unreadable leaves the row without an image
("anchor_unreadable"), counted in the log. A job that fails leaves no shard: the tar is renamed into place
when its last image is in; a restarted job rewrites it whole.
Each row samples its noise from its own generator seeded by (seed, caption_id, slot), so a row's image
does not depend on the shard or on which rows share its batch (up to the floating-point rounding of a
batched forward pass on some devices: with batch_size 1 a shard's images equal the unsharded ones).
"""

from __future__ import annotations

import io
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
from PIL import Image, ImageOps

from compo.io import read_table, write_table
from compo.negatives.images import image_name
from compo.negatives.tables import negatives_report, shard_bounds
from compo.rng import caption_rng
from compo.shards import ShardWriter

log = logging.getLogger(__name__)

IMAGE_GENERATORS = ("sdxl-turbo",)
OUTCOMES = ("generated", "not_applicable", "anchor_unreadable")
IMAGE_FORMATS = ("tar", "png")
SHARD_NAME = "images.tar"  # the tar format's one file in a job's image folder


@dataclass(frozen=True)
class DiffusionSettings:
    """The `images` mapping of a negatives entry (module docstring)."""

    generator: str = "sdxl-turbo"
    model: str = "stabilityai/sdxl-turbo"
    strength: float = 0.9
    steps: int = 4
    guidance_scale: float = 0.0
    resolution: int = 512
    batch_size: int = 4
    shards: int = 1
    dtype: str = "float16"
    format: str = "tar"

    @classmethod
    def from_spec(cls, spec: dict[str, Any], where: str = "negatives.<name>.images") -> DiffusionSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"config key {where}: unknown option(s) {unknown} (known: {', '.join(sorted(known))})")
        settings = cls(**spec)
        if settings.generator not in IMAGE_GENERATORS:
            raise ValueError(f"config key {where}.generator: {settings.generator!r} is not an image generator "
                             f"(known: {', '.join(IMAGE_GENERATORS)})")
        if not 0 < settings.strength <= 1:
            raise ValueError(f"config key {where}.strength: {settings.strength} is not in (0, 1]")
        if int(settings.steps * settings.strength) < 1:
            raise ValueError(f"config key {where}: steps x strength = {settings.steps} x {settings.strength} "
                             "leaves no denoising step (need int(steps * strength) >= 1)")
        if settings.resolution < 8 or settings.resolution % 8:
            raise ValueError(f"config key {where}.resolution: {settings.resolution} must be a multiple of 8")
        if settings.batch_size < 1 or settings.shards < 1:
            raise ValueError(f"config key {where}: batch_size and shards must be >= 1")
        if settings.dtype not in ("float16", "float32"):
            raise ValueError(f"config key {where}.dtype: {settings.dtype!r} (expected float16 or float32)")
        if settings.format not in IMAGE_FORMATS:
            raise ValueError(f"config key {where}.format: {settings.format!r} (expected {' or '.join(IMAGE_FORMATS)})")
        return settings


def load_pipeline(settings: DiffusionSettings, device: str | None = None) -> Any:
    """The img2img pipeline of `settings.model` on `device` (CUDA when available)."""
    import torch

    from compo.compat import declare_torchvision_ops

    declare_torchvision_ops()  # diffusers imports torchvision (compo.compat)
    from diffusers import AutoPipelineForImage2Image

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.startswith("cuda") and settings.dtype == "float16" else torch.float32
    from compo.artifacts import resolve  # the pipeline's files from the model cache: jobs never download

    pipeline = AutoPipelineForImage2Image.from_pretrained(str(resolve("diffusion", settings.model)), dtype=dtype)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


def anchor_image(path: str, resolution: int) -> Image.Image | None:
    """The anchor image centre-cropped to a square of `resolution` (None if it cannot be read)."""
    try:
        with Image.open(path) as image:
            return ImageOps.fit(image.convert("RGB"), (resolution, resolution), Image.Resampling.BICUBIC)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def row_seed(seed: int, caption_id: str, slot: int) -> int:
    """The noise seed of one negatives row: depends on (seed, caption, slot) only."""
    return caption_rng(seed, f"{caption_id}\x00image{int(slot)}").getrandbits(63)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@contextmanager
def image_sink(folder: Path, image_format: str) -> Iterator[Callable[[str, bytes], str]]:
    """put(name, encoded image) -> the path a table records for it: a member of `folder/SHARD_NAME`, finished
    and renamed when the block ends (none if it raises), or a file in `folder` (format png)."""
    folder.mkdir(parents=True, exist_ok=True)
    if image_format == "png":
        def put(name: str, data: bytes) -> str:
            (folder / name).write_bytes(data)
            return str(folder / name)

        yield put
        return
    with ShardWriter(folder / SHARD_NAME) as shard:
        yield shard.add


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def edit_images(negatives: pd.DataFrame, manifest: pd.DataFrame, image_dir: str | Path,
                settings: DiffusionSettings, seed: int, pipeline: Any) -> pd.Series:
    """The negative image path of each row (None where none was made), written under `image_dir` in
    `settings.format`; aligned with `negatives.index`, `attrs["counts"]` the outcome counts (module docstring)."""
    import torch

    anchors = dict(zip(manifest["caption_id"], manifest["image_path"], strict=True))
    counts: Counter[str] = Counter({outcome: 0 for outcome in OUTCOMES})
    paths: dict[Any, str | None] = {index: None for index in negatives.index}
    todo = []  # (row index, prompt, anchor image, noise seed, image name)
    for index, row in zip(negatives.index, negatives.to_dict("records"), strict=True):
        if not row["valid"] or _missing(row["negative"]):
            counts["not_applicable"] += 1
            continue
        if row["caption_id"] not in anchors:
            raise ValueError(f"negatives row {index}: caption_id {row['caption_id']!r} is not in the manifest")
        image = anchor_image(anchors[row["caption_id"]], settings.resolution)
        if image is None:
            counts["anchor_unreadable"] += 1
            log.warning("negatives row %s: anchor image %s of %r cannot be read; no negative image", index,
                        anchors[row["caption_id"]], row["caption_id"])
            continue
        todo.append((index, row["negative"], image, row_seed(seed, row["caption_id"], row["slot"]),
                     image_name(row["caption_id"], row["slot"])))
    device = getattr(pipeline, "device", torch.device("cpu"))
    with image_sink(Path(image_dir), settings.format) as put:
        for start in range(0, len(todo), settings.batch_size):
            batch = todo[start:start + settings.batch_size]
            _, prompts, anchors_in, noise_seeds, _ = zip(*batch, strict=True)
            generators = [torch.Generator(device=device).manual_seed(noise_seed) for noise_seed in noise_seeds]
            with torch.no_grad():
                images = pipeline(prompt=list(prompts), image=list(anchors_in), strength=settings.strength,
                                  num_inference_steps=settings.steps, guidance_scale=settings.guidance_scale,
                                  generator=generators, output_type="pil").images
            for (index, _, _, _, name), image in zip(batch, images, strict=True):
                paths[index] = put(name, png_bytes(image))
                counts["generated"] += 1
    result = pd.Series([paths[index] for index in negatives.index], index=negatives.index, name="negative_image",
                       dtype=object)
    result.attrs["counts"] = dict(counts)
    log.info("%s image negatives -> %s (%s): %d generated, %d anchors unreadable, %d rows not applicable",
             settings.generator, image_dir, settings.format, counts["generated"], counts["anchor_unreadable"],
             counts["not_applicable"])
    return result


def generate_negative_images(negatives: str | Path, manifest: str | Path, spec: dict[str, Any], seed: int,
                             out: str | Path, report: str | Path, image_dir: str | Path, shard: int = 0,
                             n_shards: int = 1, pipeline: Any = None) -> None:
    """One shard of a generator's image negatives: its block of rows of the `negatives` table with
    `negative_image` filled (the negatives contract), the images under `image_dir`, and the report CSV
    of those rows (`compo.negatives.tables.negatives_report`); `compo.negatives.gather_negatives` joins the
    shards into the dataset's table of image negatives. `spec` is the entry's `images` mapping."""
    settings = DiffusionSettings.from_spec(spec)
    table = read_table(negatives, "negatives")
    first, last = shard_bounds(len(table), shard, n_shards)
    rows = table.iloc[first:last].copy()
    pipeline = pipeline if pipeline is not None else load_pipeline(settings)
    rows["negative_image"] = edit_images(rows, read_table(manifest, "manifest"), image_dir, settings, seed, pipeline)
    write_table(rows.reset_index(drop=True), out, "negatives")
    Path(report).parent.mkdir(parents=True, exist_ok=True)
    negatives_report(rows).to_csv(report, index=False)
