"""Decode cost per image size and format, as the evaluation and the trainer pay it (issue 56, "Estimates from the
work"): one image read from disk, decoded in full to RGB (`compo.images.open_image`) and preprocessed by open_clip's
eval transform at 224 px (CLIP: resize the short side, centre crop; SigLIP: squash), to a normalised tensor.

The images are generated here (no dataset on this machine): a photo-like field (colour noise summed over octaves,
power falling as 1/f, as natural images' spectra do) saved as JPEG at the quality that gives a target of bytes a
pixel (COCO's 160 KB mean at 640x480: 0.52 B/px), and as PNG for the 512 px negative images the SDXL generator
writes. Prints one row per (format, size): file KB, the median and quartiles of the CPU ms an image took (the
process's CPU time: what a worker with a core of its own takes, less sensitive than the wall clock to other work on
a shared machine) and the wall-clock median, over `--repeats` rounds of `--images` distinct files, one process,
one thread.

    python tools/measure_decode.py [--images 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

# (label, format, width, height, bytes a pixel aimed at; PNG: lossless, no target)
CASES = [
    ("coco-like", "JPEG", 640, 480, 0.52),
    ("imagenet-like", "JPEG", 500, 375, 0.6),
    ("sa1b-like", "JPEG", 1500, 2250, 0.52),
    ("docci-like", "JPEG", 1536, 2048, 0.52),
    ("sdxl-negative", "PNG", 512, 512, None),
]


def photo_like(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """An RGB field whose spectrum falls as 1/f (a photo's), with a little sensor noise."""
    field = np.zeros((height, width, 3), np.float32)
    scale, amplitude = 4, 1.0
    while scale < max(width, height):
        coarse = rng.standard_normal((scale * height // max(width, height) + 2, scale + 2, 3)).astype(np.float32)
        layer = np.asarray(Image.fromarray(((coarse - coarse.min()) / np.ptp(coarse) * 255).astype(np.uint8))
                           .resize((width, height), Image.BICUBIC), np.float32) / 255 - 0.5
        field += amplitude * layer
        scale, amplitude = scale * 2, amplitude * 0.6
    field += rng.normal(0, 0.02, field.shape).astype(np.float32)
    field = (field - field.min()) / np.ptp(field)
    return Image.fromarray((field * 255).astype(np.uint8), "RGB")


def save_near(image: Image.Image, fmt: str, per_pixel: float | None) -> bytes:
    """The image encoded as `fmt`; JPEG at the quality whose size is nearest `per_pixel` bytes a pixel."""
    if fmt == "PNG":
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        return buffer.getvalue()
    target = per_pixel * image.width * image.height
    best = None
    for quality in range(40, 98, 3):
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=quality)
        if best is None or abs(len(buffer.getvalue()) - target) < abs(len(best) - target):
            best = buffer.getvalue()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from compo.compat import import_open_clip
    from compo.images import open_image

    image_transform = import_open_clip().transform.image_transform

    torch.set_num_threads(1)
    transforms = {"clip": image_transform(224, is_train=False),
                  "siglip": image_transform(224, is_train=False, mean=(0.5,) * 3, std=(0.5,) * 3,
                                            resize_mode="squash")}
    rng = np.random.default_rng(0)
    print("case            format  size        KB   transform   CPU ms median (q1-q3)   wall ms   images/s a worker")
    with tempfile.TemporaryDirectory() as folder:
        for label, fmt, width, height, per_pixel in CASES:
            files = []
            for index in range(args.images):
                data = save_near(photo_like(width, height, rng), fmt, per_pixel)
                path = Path(folder) / f"{label}-{index}.{fmt.lower()}"
                path.write_bytes(data)
                files.append(path)
            kb = statistics.mean(p.stat().st_size for p in files) / 1e3
            for name, transform in transforms.items():
                times, cpu = [], []
                for _ in range(args.repeats):
                    for path in files:
                        start, start_cpu = time.perf_counter(), time.process_time()
                        transform(open_image(path))
                        cpu.append((time.process_time() - start_cpu) * 1e3)
                        times.append((time.perf_counter() - start) * 1e3)
                q1, median, q3 = statistics.quantiles(cpu, n=4)
                print(f"{label:15s} {fmt:6s} {width}x{height:<6d} {kb:6.0f}   {name:9s} {median:6.1f} "
                      f"({q1:.1f}-{q3:.1f})   {statistics.median(times):6.1f}       {1e3 / median:7.0f}")


if __name__ == "__main__":
    main()
