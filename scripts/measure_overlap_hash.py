"""Measure the overlap guard's perceptual hash (compo.overlap) on real photographs: how far copies (re-encodes,
resizes) and different images lie apart, and what one image costs to fingerprint. docs/overlap-guard.md holds
the numbers this printed.

    nice -n 10 python scripts/measure_overlap_hash.py PHOTOS_DIR [--negatives DIR ...] [--repeats 5]

Each photograph of PHOTOS_DIR, brought to COCO's size (long side 640, JPEG quality 90: the "benchmark image"),
is copied as a training set might hold it: JPEG quality 95 / 75 / 50, PNG, WebP 80, half and double size and
224 px short side (each resized copy saved as JPEG 90), and half size at quality 50. Different images: every
pair of photographs, and of their four quadrants (a quadrant never paired with its own photograph), and of the
images of each --negatives folder (e.g. many photographs of one layout) with each other and with the photographs.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

from PIL import Image, ImageOps

from compo.overlap import NEAR_BITS, data_fingerprint, fingerprints, hamming, near_pairs

EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".bmp"}


def encode(image: Image.Image, fmt: str = "JPEG", **options: int) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def resized(image: Image.Image, factor: float | None = None, short: int | None = None) -> Image.Image:
    w, h = image.size
    scale = factor if factor is not None else short / min(w, h)  # type: ignore[operator]
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC)


COPIES: dict[str, Callable[[Image.Image], bytes]] = {
    "jpeg q95": lambda im: encode(im, quality=95),
    "jpeg q75": lambda im: encode(im, quality=75),
    "jpeg q50": lambda im: encode(im, quality=50),
    "png": lambda im: encode(im, "PNG"),
    "webp q80": lambda im: encode(im, "WEBP", quality=80),
    "resize 0.5x": lambda im: encode(resized(im, 0.5), quality=90),
    "resize 2x": lambda im: encode(resized(im, 2.0), quality=90),
    "resize 224 short side": lambda im: encode(resized(im, short=224), quality=90),
    "resize 0.5x, jpeg q50": lambda im: encode(resized(im, 0.5), quality=50),
}


def coco_like(path: Path) -> bytes:
    """The photograph as a COCO-size JPEG (long side at most 640, quality 90)."""
    with Image.open(path) as image:
        image = image.convert("RGB")
    if max(image.size) > 640:
        image = resized(image, 640 / max(image.size))
    return encode(image, quality=90)


def quadrants(data: bytes) -> list[bytes]:
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
    w, h = image.size
    boxes = [(0, 0, w // 2, h // 2), (w // 2, 0, w, h // 2), (0, h // 2, w // 2, h), (w // 2, h // 2, w, h)]
    return [encode(image.crop(box), quality=90) for box in boxes]


def images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in EXTENSIONS)


def percentile(values: list[int], q: float) -> int:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("photos", type=Path)
    parser.add_argument("--negatives", type=Path, action="append", default=[])
    parser.add_argument("--repeats", type=int, default=5, help="timing runs (the median is reported)")
    args = parser.parse_args()

    originals = {p.stem: coco_like(p) for p in images_in(args.photos)}
    hashes = {name: data_fingerprint(data).phash for name, data in originals.items()}
    flat = sorted(name for name, h in hashes.items() if h is None)
    print(f"{len(originals)} photographs ({len(flat)} flat, no hash: {flat})")
    hashed = {name: h for name, h in hashes.items() if h is not None}

    print(f"\ncopies: Hamming distance to the original (threshold {NEAR_BITS})")
    print(f"{'copy':24s} {'n':>3s} {'median':>6s} {'max':>4s} {'caught':>7s}")
    worst: dict[str, tuple[int, str]] = {}
    copy_distances: list[int] = []
    for label, make in COPIES.items():
        distances = []
        for name, h in hashed.items():
            with Image.open(io.BytesIO(originals[name])) as image:
                copy = data_fingerprint(make(image.convert("RGB"))).phash
            d = 64 if copy is None else hamming(h, copy)
            distances.append(d)
            worst[label] = max(worst.get(label, (-1, "")), (d, name))
        copy_distances += distances
        caught = sum(d <= NEAR_BITS for d in distances)
        print(f"{label:24s} {len(distances):3d} {statistics.median(distances):6.1f} {max(distances):4d} "
              f"{caught:3d}/{len(distances):<3d}  (farthest: {worst[label][1]})")

    different: dict[str, list[tuple[int, str, str]]] = {}
    pieces = {f"{name}[q{i}]": crop for name, data in originals.items() for i, crop in enumerate(quadrants(data))}
    piece_hashes = {k: data_fingerprint(v).phash for k, v in pieces.items()}
    pool = {**hashed, **{k: h for k, h in piece_hashes.items() if h is not None}}
    different["photographs and their quadrants"] = [
        (hamming(pool[a], pool[b]), a, b) for a, b in combinations(sorted(pool), 2)
        if a.split("[")[0] != b.split("[")[0] or ("[" in a and "[" in b)]  # a quadrant is part of its photograph
    for folder in args.negatives:
        extra = {f"{folder.name}/{p.name}": data_fingerprint(p.read_bytes()).phash for p in images_in(folder)}
        extra = {k: h for k, h in extra.items() if h is not None}
        different[f"{folder.name} ({len(extra)} images), among themselves"] = [
            (hamming(extra[a], extra[b]), a, b) for a, b in combinations(sorted(extra), 2)]
        different[f"{folder.name} against the photographs"] = [
            (hamming(extra[a], hashed[b]), a, b) for a in extra for b in hashed]

    print(f"\ndifferent images: Hamming distance (threshold {NEAR_BITS})")
    for label, pairs in different.items():
        values = [d for d, _, _ in pairs]
        closest = min(pairs)
        matched = sum(d <= NEAR_BITS for d in values)
        print(f"{label}: {len(pairs):,} pairs, min {closest[0]} ({closest[1]} / {closest[2]}), 1st percentile "
              f"{percentile(values, 0.01)}, median {statistics.median(values)}, within the threshold {matched} "
              f"({matched / len(pairs):.2e})")
        print("  pairs within d:", {d: sum(v <= d for v in values) for d in range(0, 17, 2)})
    print("copies within d:", {d: sum(v <= d for v in copy_distances) for d in range(0, 9)},
          f"of {len(copy_distances)}")

    # cost: read + sha256 + decode + hash of a 640x480 JPEG (quality 90 and 95; COCO's average 160 KB is nearer
    # 95) from files, median of `repeats` runs, with 1 and 2 threads
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for quality in (90, 95):
            paths = []
            for name, data in originals.items():
                with Image.open(io.BytesIO(data)) as image:  # COCO's commonest size, 640x480
                    jpeg = encode(ImageOps.fit(image.convert("RGB"), (640, 480)), quality=quality)
                for copy in range(10):  # 10 files of each (a job reads each path once)
                    paths.append(Path(folder) / f"{name}-q{quality}-{copy}.jpg")
                    paths[-1].write_bytes(jpeg)
            mean_kb = statistics.mean(p.stat().st_size for p in paths) / 1e3
            # CPU time (the machine this ran on was shared: wall time measures the neighbours too)
            for threads in (1, 2):
                runs, walls = [], []
                for _ in range(args.repeats):
                    start, wall = time.process_time(), time.perf_counter()
                    fingerprints(paths, threads)
                    runs.append((time.process_time() - start) / len(paths))
                    walls.append((time.perf_counter() - wall) / len(paths))
                print(f"cost, quality {quality} ({mean_kb:.0f} KB mean), {threads} thread(s): "
                      f"{statistics.median(runs) * 1e3:.2f} CPU ms an image, {statistics.median(walls) * 1e3:.2f} "
                      f"ms wall (medians of {args.repeats} runs over {len(paths)} files; CPU "
                      f"{[round(r * 1e3, 2) for r in runs]})")
            full = []
            for _ in range(args.repeats):
                start = time.process_time()
                for path in paths[::10]:
                    with Image.open(path) as image:
                        image.convert("RGB")
                full.append((time.process_time() - start) / len(paths[::10]))
            print(f"  a full RGB decode instead (what an evaluation does): {statistics.median(full) * 1e3:.2f} CPU ms")

    # matching at COCO size: 100,000 benchmark hashes against 123,287 training hashes (uniform random hashes)
    import numpy as np

    rng = np.random.default_rng(0)
    training = rng.integers(0, 2**64, 123_287, dtype=np.uint64)
    benchmark = rng.integers(0, 2**64, 100_000, dtype=np.uint64)
    times = []
    for _ in range(args.repeats):
        start = time.process_time()
        pairs = near_pairs(benchmark, training)
        times.append(time.process_time() - start)
    print(f"matching: 100,000 hashes against 123,287 in {statistics.median(times):.2f} CPU s (median of "
          f"{args.repeats}; {len(pairs)} near pairs among random hashes)")

if __name__ == "__main__":
    main()
