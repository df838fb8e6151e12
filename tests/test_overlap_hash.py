"""The overlap guard's perceptual hash and shards (compo.overlap, issue 59): re-encoded and resized copies of real
photographs caught at the stated threshold, different photographs kept apart, near hashes found without
comparing all pairs, training images inside webdataset tar shards compared, and the plan's figure."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from compo.overlap import (
    NEAR_BITS,
    OverlapError,
    check_overlap,
    coco_id,
    compare,
    data_fingerprint,
    hamming,
    near_pairs,
    perceptual_hash,
)

REPO = Path(__file__).resolve().parents[1]
PHOTOS = sorted((REPO / "tests" / "fixtures" / "photos").glob("*.jpg"))

# the copies and quadrants the measurement (docs/overlap-guard.md) made, made here the same way
_spec = importlib.util.spec_from_file_location("measure_overlap_hash", REPO / "scripts" / "measure_overlap_hash.py")
measure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measure)


def _rgb(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def test_the_hash_is_the_dct_phash_scipy_computes() -> None:
    """imagehash's phash (scipy's DCT of the 32x32 grayscale, the 8x8 low block against its median), bit for bit."""
    from scipy.fftpack import dct

    assert len(PHOTOS) == 8
    for path in PHOTOS:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L").resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64)
            low = dct(dct(pixels, axis=0), axis=1)[:8, :8]
            expected = int("".join("1" if bit else "0" for bit in (low > np.median(low)).ravel()), 2)
            assert perceptual_hash(image) == expected, path.name


def test_reencoded_and_resized_copies_of_real_photographs_are_caught() -> None:
    """JPEG quality 95 / 75 / 50, PNG, WebP, half, double and 224 px short side: each within NEAR_BITS of its
    photograph (the copy's bytes differ, so only the perceptual hash finds it)."""
    assert NEAR_BITS == 6
    for path in PHOTOS:
        data = path.read_bytes()
        original = data_fingerprint(data)
        for label, make in measure.COPIES.items():
            copy = data_fingerprint(make(_rgb(data)))
            assert copy.sha256 != original.sha256 and copy.phash is not None, (path.name, label)
            assert hamming(original.phash, copy.phash) <= NEAR_BITS, (path.name, label)


def test_different_photographs_and_their_quadrants_are_not_matched() -> None:
    """8 photographs and their 32 quadrants (a quadrant not paired with its own photograph): 748 pairs, every one
    farther than NEAR_BITS (the closest, 18 bits, far beyond a copy's 4)."""
    pool = {p.stem: data_fingerprint(p.read_bytes()).phash for p in PHOTOS}
    for path in PHOTOS:
        for i, crop in enumerate(measure.quadrants(path.read_bytes())):
            pool[f"{path.stem}[{i}]"] = data_fingerprint(crop).phash
    pairs = [(a, b) for a, b in combinations(pool, 2) if a.split("[")[0] != b.split("[")[0] or "[" in a and "[" in b]
    assert len(pairs) == 748
    closest = min((hamming(pool[a], pool[b]), a, b) for a, b in pairs)
    assert closest[0] > NEAR_BITS + 4, closest


def test_a_flat_image_has_no_hash() -> None:
    """A flat image's DCT is ~0 and its signs noise: no hash (compared by bytes only), where a faint gradient has."""
    flat = io.BytesIO()
    Image.new("RGB", (64, 48), (120, 30, 200)).save(flat, "PNG")
    assert data_fingerprint(flat.getvalue()).phash is None
    ramp = io.BytesIO()
    Image.fromarray(np.tile(np.arange(64, dtype=np.uint8) * 2, (48, 1))).save(ramp, "PNG")
    assert data_fingerprint(ramp.getvalue()).phash is not None
    assert data_fingerprint(b"not an image").phash is None and data_fingerprint(b"not an image").sha256


@pytest.mark.parametrize("bits", [0, 3, NEAR_BITS, 9])
def test_near_pairs_are_exactly_the_pairs_within_the_threshold(bits: int) -> None:
    """Multi-index hashing against all pairs: random hashes with planted neighbours at 0-10 bits, some crowded into
    one band's bucket; `cap` 5 makes it check a few candidates at a time."""
    rng = np.random.default_rng(bits)
    targets = rng.integers(0, 2**64, 2000, dtype=np.uint64)
    queries = rng.integers(0, 2**64, 1500, dtype=np.uint64)
    for i in range(300):
        value = int(targets[i * 5])
        for bit in rng.choice(64, size=int(rng.integers(0, 11)), replace=False):
            value ^= 1 << int(bit)
        queries[i * 4] = value
    targets[1500:1800] = (targets[1500:1800] & ~np.uint64(0xFFFF)) | np.uint64(0xBEEF)
    queries[1300:1400] = (queries[1300:1400] & ~np.uint64(0xFFFF)) | np.uint64(0xBEEF)
    brute = set(zip(*np.nonzero(np.bitwise_count(queries[:, None] ^ targets[None, :]) <= bits), strict=True))
    assert len(brute) > 10  # planted: 1 in 11 at each distance 0-10
    for cap in (5, 1 << 22):
        found = {(int(q), int(t)) for q, t in near_pairs(queries, targets, bits, cap=cap)}
        assert found == {(int(q), int(t)) for q, t in brute}, cap


def test_an_npy_frame_is_hashed_as_the_image_the_scorer_reads(tmp_path: Path) -> None:
    """EqBen's YouCook2 frames are BGR numpy arrays (compo.images): hashed as the image they show, so the JPEG of
    one in a training set is caught."""
    with Image.open(PHOTOS[0]) as image:
        np.save(tmp_path / "frame.npy", np.asarray(image.convert("RGB"))[:, :, ::-1])
    (tmp_path / "frame.jpg").write_bytes(PHOTOS[0].read_bytes())
    found = compare([tmp_path / "frame.jpg"], [tmp_path / "frame.npy"])
    assert found.by_perceptual_hash == {tmp_path / "frame.npy"} and not found.unhashed


def test_coco_ids_of_shard_members() -> None:
    assert coco_id("shards/00000.tar#COCO_val2014_000000000042.jpg") == 42
    assert coco_id("shards/00000.tar#train2017/000000391895.jpg") == 391895
    assert coco_id("shards/COCO_val2014_000000000042.tar#000000001.jpg") is None  # the shard's name is no image


@pytest.fixture()
def shard_study(tmp_path: Path, write_manifest) -> dict:
    """A SugarCrepe-format benchmark of 5 real photographs, and a training set of a webdataset shard (img2dataset's
    layout) and a file: in the shard a JPEG quality-50 copy of one benchmark photograph, a byte copy of another,
    a member named by the COCO id of a third (another photograph inside); as a file a half-size copy of a fourth
    and an unrelated photograph; one row names a shard that is gone, one a shard cut short."""
    photo = {p.stem: p for p in PHOTOS}
    bench = tmp_path / "sugarcrepe"
    (bench / "images").mkdir(parents=True)
    names = {"astronaut": "a.jpg", "chelsea": "b.jpg", "rocket": "000000000042.jpg", "hubble_deep_field": "d.jpg",
             "retina": "e.jpg"}
    for stem, name in names.items():
        (bench / "images" / name).write_bytes(photo[stem].read_bytes())
    for subset in ("replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att"):
        items = {str(k): {"filename": f, "caption": "c", "negative_caption": "n"} for k, f in enumerate(names.values())}
        (bench / f"{subset}.json").write_text(json.dumps(items))

    shard = tmp_path / "train" / "00000.tar"
    shard.parent.mkdir()
    members = {"000000000.jpg": measure.COPIES["jpeg q50"](_rgb(photo["astronaut"].read_bytes())),
               "000000001.jpg": photo["chelsea"].read_bytes(),
               "COCO_val2014_000000000042.jpg": photo["coffee"].read_bytes()}
    with tarfile.open(shard, "w") as tar:
        for name, data in members.items():
            for member, payload in ((name, data), (name.rsplit(".", 1)[0] + ".txt", b"a photo")):
                info = tarfile.TarInfo(member)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    files = {"e-half.jpg": measure.COPIES["resize 0.5x"](_rgb(photo["retina"].read_bytes())),
             "brick.jpg": photo["brick"].read_bytes()}
    for name, data in files.items():
        (shard.parent / name).write_bytes(data)
    paths = [f"{shard}#{name}" for name in members] + [str(shard.parent / name) for name in files]
    paths.append(f"{tmp_path / 'gone.tar'}#000000009.jpg")
    cut = tmp_path / "cut.tar"  # a shard cut short (no end-of-archive marker): not read, counted
    cut.write_bytes(shard.read_bytes()[:2048])
    paths.append(f"{cut}#000000000.jpg")
    rows = [{"image_id": str(i), "image_path": p, "caption_id": f"{i}-0", "caption": "a photo", "dataset": "d"}
            for i, p in enumerate(paths)]
    return {"manifest": write_manifest(rows, tmp_path / "manifest.parquet"), "bench": bench,
            "benchmarks": {"sugarcrepe": {"spec": {"kind": "sugarcrepe", "source": "files"}, "dir": str(bench)}},
            "out": tmp_path / "overlap" / "d.csv"}


def test_the_guard_compares_shard_members_by_bytes_hash_and_coco_id(shard_study: dict,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(OverlapError) as error:
        check_overlap("d", shard_study["manifest"], shard_study["benchmarks"], shard_study["out"])
    assert ("sugarcrepe: 4 of its 5 images (1 by COCO id, 1 by content, 2 by perceptual hash (re-encoded or resized "
            "copies)") in str(error.value)
    assert not shard_study["out"].exists()
    table = check_overlap("d", shard_study["manifest"], shard_study["benchmarks"], shard_study["out"],
                          accept=[{"dataset": "d", "benchmark": "sugarcrepe"}])
    row = table.set_index("benchmark").loc["sugarcrepe"]
    assert (row["by_coco_id"], row["by_content"], row["by_perceptual_hash"], row["overlap"]) == (1, 1, 2, 4)
    # the gone and the cut shard's images are counted and said, not dropped; every benchmark image was hashed
    assert (row["training_images"], row["training_unhashed"], row["benchmark_unhashed"]) == (7, 2, 0)
    assert "cut.tar cannot be read" in caplog.text and "expected a member header" in caplog.text
    assert "dataset d: 2 of its 7 images have no perceptual hash" in caplog.text
    images = shard_study["bench"] / "images"
    examples = set(row["examples"].split("; "))
    assert str(images / "d.jpg") not in examples and str(images / "000000000042.jpg") in examples


def test_without_the_copies_the_shard_passes(shard_study: dict, tmp_path: Path, write_manifest) -> None:
    """The unrelated photographs alone (one in the shard, one a file) are no overlap: nothing matched by chance."""
    shard = tmp_path / "clean.tar"
    with tarfile.open(shard, "w") as tar:
        data = (REPO / "tests" / "fixtures" / "photos" / "camera.jpg").read_bytes()
        info = tarfile.TarInfo("000000000.jpg")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    rows = [{"image_id": str(i), "image_path": p, "caption_id": f"{i}-0", "caption": "a photo", "dataset": "d"}
            for i, p in enumerate([f"{shard}#000000000.jpg", str(tmp_path / "train" / "brick.jpg")])]
    manifest = write_manifest(rows, tmp_path / "clean.parquet")
    table = check_overlap("d", manifest, shard_study["benchmarks"], shard_study["out"])
    assert table["overlap"].tolist() == [0] and table["training_unhashed"].tolist() == [0]


def test_the_plan_times_the_guard_from_the_measured_rate(paper: dict) -> None:
    """compo plan: the training set's captions (an upper bound of its images) and every listed benchmark image,
    at OVERLAP_IMAGES_PER_S a thread; zero-shot and probe sets (class folders) are not read."""
    from compo.evaluate.kinds import kind_of
    from compo.plan import JOB_OVERHEAD_MIN, OVERLAP_IMAGES_PER_S, benchmark_size, dataset_captions, job_minutes

    names = dict.fromkeys([*paper["study"]["benchmarks"], *(paper.get("wiseft") or {}).get("benchmarks", [])])
    listed = [n for n in names if kind_of(paper["benchmarks"][n]["kind"]).images is not None]
    assert 0 < len(listed) < len(names)
    images = dataset_captions(paper["datasets"]["coco"]) + sum(
        benchmark_size(paper["benchmarks"][n], n).images for n in listed)
    minutes = job_minutes(paper, "overlap", {"dataset": "coco"}, threads=4)
    assert minutes == pytest.approx(images / (OVERLAP_IMAGES_PER_S * 4) / 60 + JOB_OVERHEAD_MIN)
    assert 10 < minutes < 60  # ~0.6 M images read: well inside the 4 h the SLURM profile asks


def test_a_near_hash_is_a_copy_only_when_its_colours_agree(tmp_path: Path) -> None:
    """The hash reads grayscale: two scenes of a flat ground and a square that differ in the square's colour only
    (as the generated world's differ) hash alike, and are not one image; a re-encoded copy of either still is."""
    from compo.overlap import COLOUR_LEVELS

    def scene(colour: tuple[int, int, int], path: Path) -> Path:
        image = Image.new("RGB", (64, 64), (90, 90, 90))
        image.paste(colour, (16, 16, 48, 48))
        image.save(path)
        return path

    # one grayscale (PIL's L of both squares is 131), other hues: one perceptual hash
    red, green = scene((220, 100, 60), tmp_path / "red.png"), scene((60, 143, 255), tmp_path / "green.png")
    assert data_fingerprint(red.read_bytes()).phash == data_fingerprint(green.read_bytes()).phash
    assert not compare([red], [green]).by_perceptual_hash
    copy = tmp_path / "green-q75.jpg"
    with Image.open(green) as image:
        image.save(copy, quality=75)
    assert compare([copy], [green]).by_perceptual_hash == {green}
    assert COLOUR_LEVELS < 46  # the world's closest pair of different scenes measured (docs/overlap-guard.md)
