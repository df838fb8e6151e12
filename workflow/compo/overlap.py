"""No benchmark image in a training set: the guard that runs before any model trains on a dataset.

Every training dataset's images (its manifest: files, or members of webdataset tar shards, `<shard>.tar#<member>`,
compo.shards) are compared with every evaluated benchmark's images, three ways:

* COCO ids read from the file (or member) names, where both sides name COCO images:
  `COCO_train2014_000000057870.jpg` (2014, Karpathy's files) or `000000057870.jpg` (2017, SugarCrepe's val2017
  names). The 2014 and 2017 releases share their ids, so a Karpathy restval image (val2014) and a SugarCrepe image
  (val2017) with the same id are one image. This needs no file on disk (the real Karpathy split lists are names
  only).
* A content hash (sha256 of the stored bytes) of every image that exists, whatever its name: byte copies.
* A perceptual hash (`perceptual_hash`: a 64-bit DCT hash of the image's 32x32 grayscale) of every image that
  decodes: two images whose hashes differ in at most `NEAR_BITS` bits are one image re-encoded or resized
  (JPEG quality, PNG, WebP, half or double size, 224 px short side: all caught on real photographs; crops, flips
  and rotations are not). The threshold and its measured catch and false-match rates: docs/overlap-guard.md.
  Near hashes are found by multi-index hashing (`near_pairs`: lookups of the hash's four 16-bit bands and their
  one-bit neighbours), never by comparing all pairs.

Each image is read and decoded once per job (`fingerprints`: its sha256 and perceptual hash; JPEGs decoded at
1/2 to 1/8 scale in the DCT, which is all a 32x32 hash needs), whichever benchmarks list it. An image that is
missing or does not decode is compared by name (and bytes, where it exists) only, and counted in the table.

The result is one row per benchmark (`{results}/tables/overlap/{dataset}.csv`: the counts, how they were found,
a few examples, and whether the overlap was accepted). A benchmark image found in the training set stops the
workflow before training, naming the dataset, the benchmark and the count, unless the config accepts that pair
(`overlap.accept: [{dataset, benchmark}]`, e.g. to reproduce a seed that trained on it); the table, and the
report's data page, show the accepted overlaps. A benchmark's images are those its kind's declaration lists
(`compo.evaluate.kinds`: the whole release, before any sampling the scorer does); kinds whose images are class
folders (`zeroshot`, `linear_probe`) declare none and are listed as not compared.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from itertools import combinations
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from PIL import Image

from compo.evaluate.kinds import benchmark_images
from compo.images import OutsideRoot, open_image
from compo.io import read_table, write_text
from compo.shards import member_index, open_member, split_member

log = logging.getLogger(__name__)

COCO_2014 = re.compile(r"^COCO_[a-z]+20\d\d_(\d+)\.(?:jpe?g|png)$", re.IGNORECASE)
COCO_2017 = re.compile(r"^(\d{12})\.jpe?g$", re.IGNORECASE)
COLUMNS = ["dataset", "benchmark", "kind", "training_images", "benchmark_images", "by_coco_id", "by_content",
           "by_perceptual_hash", "overlap", "accepted", "training_unhashed", "benchmark_unhashed", "examples"]
EXAMPLES = 3

# The perceptual hash: the signs, against their median, of the 8x8 lowest DCT frequencies of the image's 32x32
# grayscale (the `imagehash` package's phash, recomputed here without the dependency: a test checks it against
# scipy's DCT). Two images are one when their hashes differ in at most NEAR_BITS of the 64 bits (the median splits
# the bits 32 / 32, so distances are even): measured on 22 real photographs (docs/overlap-guard.md,
# scripts/measure_overlap_hash.py), their re-encodes and resizes differ in at most 6 bits, different photographs
# (and their quadrants) in at least 10 but for a stereo pair of one scene (4), aligned 25 px faces in at least 8.
HASH_SIDE, LOW = 32, 8
NEAR_BITS = 6
BANDS = 4                       # multi-index: the 64 bits as 4 bands of 16, each looked up exactly +- a few bits
DRAFT = (2 * HASH_SIDE, 2 * HASH_SIDE)   # a JPEG is decoded by DCT scaling to no less than this
FLAT_STD = 2.0                  # grayscale levels (0-255): below, an image has no perceptual hash
# A near hash is confirmed in colour: the two images' 8x8 RGB thumbnails (box means) differ by at most COLOUR_LEVELS
# in every cell and channel. The hash reads grayscale only, and the generated world's scenes (a few flat shapes on
# a plain ground) hash within NEAR_BITS of other scenes whose shapes differ in colour or place: measured, the copies
# of the 8 test photographs (every kind above) stay within 5 levels, the world's near-hash pairs of different scenes
# differ by 46 to 172 (docs/overlap-guard.md).
THUMB_SIDE = 8
COLOUR_LEVELS = 16


class OverlapError(RuntimeError):
    """A benchmark's images are in a training set and the config does not accept it."""


def coco_id(path: str | Path) -> int | None:
    """The COCO image id a file name (or a shard member's base name) carries (2014 or 2017 naming), else None."""
    member = split_member(path)
    name = PurePosixPath(member[1]).name if member is not None else Path(path).name
    match = COCO_2014.match(name) or COCO_2017.match(name)
    return int(match.group(1)) if match else None


# --- what an image is: its bytes' sha256 and its perceptual hash ----------------------------------------------


@cache
def _dct_rows() -> np.ndarray:
    """The LOW lowest rows of the (unscaled) DCT-II matrix of size HASH_SIDE: scipy's dct up to a constant."""
    k, n = np.arange(LOW)[:, None], np.arange(HASH_SIDE)[None, :]
    return np.cos(np.pi * k * (2 * n + 1) / (2 * HASH_SIDE))


def perceptual_hash(image: Image.Image) -> int | None:
    """The 64-bit DCT hash of an image (bit 63 the first coefficient, row by row): the signs, against their
    median, of the 8x8 lowest frequencies of its 32x32 grayscale (LANCZOS). None for a flat image (grayscale
    standard deviation under FLAT_STD levels): its frequencies are ~0 and their signs noise, so every flat image
    would hash alike; it is compared by name and bytes only."""
    pixels = np.asarray(image.convert("L").resize((HASH_SIDE, HASH_SIDE), Image.Resampling.LANCZOS),
                        dtype=np.float64)
    if pixels.std() < FLAT_STD:
        return None
    rows = _dct_rows()
    low = rows @ pixels @ rows.T
    bits = (low > np.median(low)).ravel()
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def colour_thumbnail(image: Image.Image) -> bytes:
    """The image's THUMB_SIDE x THUMB_SIDE RGB box means, the colour check of a near hash."""
    return image.convert("RGB").resize((THUMB_SIDE, THUMB_SIDE), Image.Resampling.BOX).tobytes()


def same_colours(a: bytes | None, b: bytes | None) -> bool:
    """Whether two colour thumbnails differ by at most COLOUR_LEVELS in every cell and channel."""
    if a is None or b is None:
        return False
    return int(np.abs(np.frombuffer(a, np.uint8).astype(np.int16) - np.frombuffer(b, np.uint8)).max()) <= COLOUR_LEVELS


@dataclass(frozen=True)
class Fingerprint:
    """An image's sha256 (None: not readable), perceptual hash (None: not readable, not decodable or flat) and
    colour thumbnail (None where there is no hash)."""

    sha256: str | None
    phash: int | None
    colours: bytes | None = None


def picture_fingerprint(digest: str, image: Image.Image) -> Fingerprint:
    phash = perceptual_hash(image)
    return Fingerprint(digest, phash, None if phash is None else colour_thumbnail(image))


def image_bytes(path: str | Path) -> bytes:
    """The stored bytes of an image file or shard member; OSError when it is not there. A path outside its
    benchmark's image root (compo.images.OutsideRoot) is never read."""
    if isinstance(path, OutsideRoot):
        raise PermissionError(f"{path}: outside its image root, not read")
    if split_member(path) is not None:
        return open_member(path).read()
    return Path(path).read_bytes()


def fingerprint(path: str | Path) -> Fingerprint:
    """The fingerprint of an image file or shard member (nothing for one that is not there)."""
    try:
        data = image_bytes(path)
    except OSError:
        return Fingerprint(None, None)
    if split_member(path) is None and Path(path).suffix == ".npy":  # EqBen's YouCook2 frames, as the scorer reads them
        frame = open_image(path)
        digest = hashlib.sha256(data).hexdigest()
        return Fingerprint(digest, None) if isinstance(frame, str) else picture_fingerprint(digest, frame)
    return data_fingerprint(data)


def data_fingerprint(data: bytes) -> Fingerprint:
    """The fingerprint of an image's stored bytes."""
    digest = hashlib.sha256(data).hexdigest()
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.draft("RGB", DRAFT)  # JPEG: scaled in the DCT (4-8x less to decode)
            return picture_fingerprint(digest, image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return Fingerprint(digest, None)


def fingerprints(paths: Iterable[str | Path], threads: int = 1,
                 known: dict[str, Fingerprint] | None = None) -> dict[str, Fingerprint]:
    """Every path's fingerprint (`known`: those already computed, extended in place), `threads` at a time (PIL
    decodes without the GIL). Shards are indexed once each before their members are read; the members of a shard
    that cannot be indexed (missing, damaged) are not read (each would rescan it)."""
    known = {} if known is None else known
    todo = {str(p): p for p in paths if str(p) not in known}  # the paths themselves: an OutsideRoot stays one
    shards = sorted({member[0] for member in map(split_member, todo) if member is not None})
    with ThreadPoolExecutor(max(1, threads)) as pool:
        errors = dict(zip(shards, pool.map(_index_shard, shards), strict=True))
        for shard, error in errors.items():
            if error:
                log.warning("shard %s cannot be read (%s): its images are compared by name only", shard, error)
        unread = {key for key in todo if (member := split_member(key)) is not None and errors[member[0]]}
        known.update(dict.fromkeys(unread, Fingerprint(None, None)))
        paths = [(key, path) for key, path in todo.items() if key not in unread]
        chunks = [paths[i:i + 256] for i in range(0, len(paths), 256)]  # a future per 256 images, not per image
        for chunk in pool.map(lambda chunk: [(key, fingerprint(path)) for key, path in chunk], chunks):
            known.update(chunk)
    return known


def _index_shard(shard: str) -> str:
    try:
        member_index(shard)
    except OSError as error:
        return str(error)
    return ""


# --- near hashes without comparing all pairs -----------------------------------------------------------------


@cache
def _band_masks(radius: int) -> np.ndarray:
    """Every 16-bit mask of at most `radius` bits set."""
    return np.array([sum(1 << bit for bit in bits) for r in range(radius + 1)
                     for bits in combinations(range(16), r)], dtype=np.uint64)


def near_pairs(queries: np.ndarray, targets: np.ndarray, bits: int = NEAR_BITS, cap: int = 1 << 22
               ) -> np.ndarray:
    """(query index, target index) of every pair of 64-bit hashes (uint64 arrays) within `bits` of each other:
    multi-index hashing (Norouzi et al. 2012), never all pairs. Two hashes within `bits` agree within
    bits // BANDS bits on at least one of their BANDS 16-bit bands (pigeonhole), so each query looks up, band by
    band, the targets whose band is within that radius of its own (1, 17 or 137 keys for 0-3, 4-7 or 8-11 bits:
    bucket offsets, no search) and keeps those within `bits` on all 64. Candidates are checked `cap` at a time
    (memory stays bounded however the hashes crowd into a few buckets)."""
    queries, targets = np.asarray(queries, dtype=np.uint64), np.asarray(targets, dtype=np.uint64)
    found = [np.empty((0, 2), dtype=np.int64)]
    for band in range(BANDS):
        shift = np.uint64(16 * band)
        keys = ((targets >> shift) & np.uint64(0xFFFF)).astype(np.int64)
        order = np.argsort(keys, kind="stable")
        starts = np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=1 << 16))])
        own = (queries >> shift) & np.uint64(0xFFFF)
        for mask in _band_masks(bits // BANDS):
            key = (own ^ mask).astype(np.int64)
            low, counts = starts[key], starts[key + 1] - starts[key]
            ends = np.cumsum(counts)
            first = 0
            while first < len(queries) and ends[-1] > (ends[first - 1] if first else 0):
                done = ends[first - 1] if first else 0
                last = max(first + 1, int(np.searchsorted(ends, done + cap, "right")))
                rows = np.repeat(np.arange(first, last), counts[first:last])
                within = np.arange(len(rows)) - np.repeat(ends[first:last] - counts[first:last] - done,
                                                          counts[first:last])
                cols = order[np.repeat(low[first:last], counts[first:last]) + within]
                close = np.bitwise_count(queries[rows] ^ targets[cols]) <= bits
                found.append(np.stack([rows[close], cols[close]], axis=1))
                first = last
    return np.unique(np.concatenate(found), axis=0)


# --- comparing two sets ---------------------------------------------------------------------------------------


class Comparison(NamedTuple):
    """The benchmark images found in a training set, each a set of benchmark paths, and the benchmark images
    without a perceptual hash (missing or not decodable: compared by name, and bytes where readable, only)."""

    by_coco_id: set[Path]
    by_content: set[Path]
    by_perceptual_hash: set[Path]    # re-encoded or resized copies (not byte-equal)
    unhashed: set[Path]


class TrainingSet:
    """A training set's images as the guard compares them: COCO ids, sha256s and perceptual hashes, read once
    per dataset whatever the number of benchmarks."""

    def __init__(self, images: Iterable[str | Path], threads: int = 1,
                 known: dict[str, Fingerprint] | None = None) -> None:
        self.images = list(dict.fromkeys(map(str, images)))
        self.prints = fingerprints(self.images, threads, known)
        self.ids = {i for i in map(coco_id, self.images) if i is not None}
        ours = [self.prints[p] for p in self.images]
        self.sha256 = {f.sha256 for f in ours if f.sha256 is not None}
        self.hashes = np.array(sorted({f.phash for f in ours if f.phash is not None}), dtype=np.uint64)
        self.colours: dict[int, list[bytes]] = {}
        for f in ours:
            if f.phash is not None:
                self.colours.setdefault(f.phash, []).append(f.colours)
        self.unhashed = sum(f.phash is None for f in ours)

    def compare(self, benchmark: Iterable[str | Path], threads: int = 1) -> Comparison:
        bench = list(dict.fromkeys(p if isinstance(p, Path) else Path(p) for p in benchmark))
        known = fingerprints(bench, threads, self.prints)
        prints = [known[str(p)] for p in bench]
        by_id = {p for p in bench if coco_id(p) in self.ids}
        by_content = {p for p, f in zip(bench, prints, strict=True) if f.sha256 in self.sha256}
        theirs = np.array(sorted({f.phash for f in prints if f.phash is not None}), dtype=np.uint64)
        near: dict[int, list[int]] = {}
        for i, j in near_pairs(theirs, self.hashes):
            near.setdefault(int(theirs[i]), []).append(int(self.hashes[j]))
        # a near hash is a copy when the colours agree too (the hash is grayscale: see COLOUR_LEVELS)
        by_hash = {p for p, f in zip(bench, prints, strict=True)
                   if any(same_colours(f.colours, c) for h in near.get(f.phash, ()) for c in self.colours[h])}
        by_hash -= by_content
        return Comparison(by_id, by_content, by_hash, {p for p, f in zip(bench, prints, strict=True)
                                                       if f.phash is None})


def compare(training: Iterable[str | Path], benchmark: Iterable[str | Path], threads: int = 1) -> Comparison:
    """The benchmark images found in `training` (image paths or shard member paths)."""
    return TrainingSet(training, threads).compare(benchmark, threads)


# --- the guard ------------------------------------------------------------------------------------------------


def accepted_pairs(accept: list[dict[str, str]] | None) -> set[tuple[str, str]]:
    return {(entry["dataset"], entry["benchmark"]) for entry in accept or []}


def overlap_table(dataset: str, training: list[str], benchmarks: dict[str, dict[str, Any]],
                  accept: list[dict[str, str]] | None = None, threads: int = 1) -> pd.DataFrame:
    """One row per benchmark ({name: {"spec", "dir"}}): how many of its images are in `training` (image paths)."""
    accepted, rows = accepted_pairs(accept), []
    ours = TrainingSet(training, threads)
    for name, entry in benchmarks.items():
        spec = entry["spec"]
        images = benchmark_images(spec["kind"], spec, entry["dir"])
        row = {"dataset": dataset, "benchmark": name, "kind": spec["kind"], "training_images": len(ours.images),
               "accepted": (dataset, name) in accepted, "training_unhashed": ours.unhashed}
        if images is None:
            rows.append({**row, "benchmark_images": 0, "by_coco_id": 0, "by_content": 0, "by_perceptual_hash": 0,
                         "overlap": 0, "benchmark_unhashed": 0, "examples": "not compared (class folders)"})
            continue
        found = ours.compare(images, threads)
        union = sorted(found.by_coco_id | found.by_content | found.by_perceptual_hash)
        rows.append({**row, "benchmark_images": len(set(images)), "by_coco_id": len(found.by_coco_id),
                     "by_content": len(found.by_content), "by_perceptual_hash": len(found.by_perceptual_hash),
                     "overlap": len(union), "benchmark_unhashed": len(found.unhashed),
                     "examples": "; ".join(str(p) for p in union[:EXAMPLES])})
    return pd.DataFrame(rows, columns=COLUMNS)


def refused(table: pd.DataFrame) -> pd.DataFrame:
    return table[(table["overlap"] > 0) & ~table["accepted"]]


def check_overlap(dataset: str, manifest: str | Path, benchmarks: dict[str, dict[str, Any]], out: str | Path,
                  accept: list[dict[str, str]] | None = None, threads: int = 1) -> pd.DataFrame:
    """Compare a dataset's manifest with the benchmarks, write the table to `out` when nothing is refused, and
    raise OverlapError naming each refused benchmark and its count otherwise (no table: training must not start)."""
    images = [str(p) for p in read_table(manifest, "manifest")["image_path"].drop_duplicates()]
    table = overlap_table(dataset, images, benchmarks, accept, threads)
    if len(table) and table["training_unhashed"].iloc[0]:
        log.warning("dataset %s: %d of its %d images have no perceptual hash (missing, not decodable or flat): "
                    "compared by name, and bytes where readable, only", dataset,
                    table["training_unhashed"].iloc[0], len(images))
    for row in table.itertuples():
        if row.benchmark_unhashed:
            log.warning("benchmark %s: %d of its %d images have no perceptual hash (missing, not decodable or flat):"
                        " compared by name, and bytes where readable, only", row.benchmark, row.benchmark_unhashed,
                        row.benchmark_images)
        if row.overlap:
            log.warning("dataset %s: %d of benchmark %s's %d images are training images%s (e.g. %s)", dataset,
                        row.overlap, row.benchmark, row.benchmark_images, " (accepted)" if row.accepted else "",
                        row.examples)
    bad = refused(table)
    if len(bad):
        lines = [f"{r.benchmark}: {r.overlap} of its {r.benchmark_images} images ({r.by_coco_id} by COCO id, "
                 f"{r.by_content} by content, {r.by_perceptual_hash} by perceptual hash (re-encoded or resized "
                 f"copies); e.g. {r.examples})" for r in bad.itertuples()]
        raise OverlapError(f"dataset {dataset} ({manifest}) contains benchmark images, so no model trains on it:\n  "
                           + "\n  ".join(lines) + "\nUse a training split without them, or accept a named overlap "
                           f"in the config: overlap: {{accept: [{{dataset: {dataset}, benchmark: "
                           f"{bad.iloc[0]['benchmark']}}}]}}")
    write_text(table.to_csv(index=False), out)
    return table
