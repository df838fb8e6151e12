"""Tiny labelled image sets laid out exactly as their releases are on disk (torchvision's `root` layouts,
CLIP_benchmark's webdataset export, COCO's instances files): a few images per class, the real split-file
formats, and one listed test image whose file is missing (the loaders skip and count it).

Each writer returns {role: [(item, label), ...]} in the order the release lists them (COCO: label = the
sorted category ids of the image). Used by tests/evaluate/test_labelled.py and tests/paper_fixtures.py.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.io import savemat

Expected = dict[str, list[tuple[str, object]]]


def image(path: Path, seed: int, fmt: str = "JPEG") -> bytes:
    """A 24x24 image whose pixels follow from `seed`, written to `path` (when given) and returned."""
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def food101(root: Path) -> Expected:
    base = root / "food-101"
    classes = ["apple_pie", "baby_back_ribs", "beignets"]
    out: Expected = {}
    for split, first in (("train", 100), ("test", 200)):
        meta = {c: [f"{c}/{first + 10 * k + i}" for i in range(2)] for k, c in enumerate(classes)}
        _write(base / "meta" / f"{split}.json", json.dumps(meta))
        out[split] = [(item, k) for k, c in enumerate(classes) for item in meta[c]]
        for item, _ in out[split]:
            if item != "beignets/221":  # listed, file missing
                image(base / "images" / f"{item}.jpg", sum(map(ord, item)))
    return out


def oxford_pets(root: Path) -> Expected:
    base = root / "oxford-iiit-pet"
    breeds = [("Abyssinian", 1), ("american_bulldog", 2), ("Bengal", 1)]  # (breed, species: 1 cat, 2 dog)
    out: Expected = {}
    for split, numbers in (("trainval", (1, 2)), ("test", (3, 4))):
        rows = [(f"{breed}_{n}", k) for k, (breed, _) in enumerate(breeds) for n in numbers]
        _write(base / "annotations" / f"{split}.txt",
               "".join(f"{item} {k + 1} {breeds[k][1]} {k + 1}\n" for item, k in rows))
        out["train" if split == "trainval" else split] = rows
        for item, _ in rows:
            if item != "Bengal_4":
                image(base / "images" / f"{item}.jpg", len(item) * 7 + int(item.rsplit("_", 1)[1]))
    return out


def flowers102(root: Path) -> Expected:
    base = root / "flowers-102"
    labels = np.array([1, 2, 3, 1, 2, 3, 1, 2, 3, 3], dtype=np.uint8)  # image k+1 has labels[k]
    sets = {"trnid": [1, 2, 3], "valid": [4, 5, 6], "tstid": [7, 8, 9, 10]}
    base.mkdir(parents=True, exist_ok=True)
    savemat(base / "imagelabels.mat", {"labels": labels[None, :]})
    savemat(base / "setid.mat", {k: np.array(v, dtype=np.uint16)[None, :] for k, v in sets.items()})
    for i in range(1, len(labels) + 1):
        if i != 10:
            image(base / "jpg" / f"image_{i:05d}.jpg", i)
    return {role: [(f"image_{i:05d}", int(labels[i - 1]) - 1) for i in sets[key]]
            for role, key in (("train", "trnid"), ("val", "valid"), ("test", "tstid"))}


def sun397(root: Path) -> Expected:
    classes = ["/a/abbey", "/a/apartment_building/outdoor", "/b/bakery/shop"]
    _write(root / "SUN397" / "ClassName.txt", "".join(c + "\n" for c in classes))
    out: Expected = {}
    for split, tag in (("Training", "tr"), ("Testing", "te")):
        rows = [(f"{c.lstrip('/')}/sun_{tag}{k}{i}.jpg", k) for k, c in enumerate(classes) for i in range(2)]
        _write(root / "Partitions" / f"{split}_01.txt", "".join(f"/{item}\n" for item, _ in rows))
        out["train" if split == "Training" else "test"] = rows
    for role in out:
        for item, _ in out[role]:
            if item != "b/bakery/shop/sun_te21.jpg":
                image(root / "SUN397" / item, sum(map(ord, item)))
    # images of another partition exist on disk and are not listed
    image(root / "SUN397" / "a" / "abbey" / "sun_other.jpg", 5)
    return out


def stanford_cars(root: Path) -> Expected:
    base = root / "stanford_cars"
    names = np.array(["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Audi R8 Coupe 2012"], dtype=object)
    (base / "devkit").mkdir(parents=True)
    savemat(base / "devkit" / "cars_meta.mat", {"class_names": names[None, :]})
    out: Expected = {}
    fields = [("bbox_x1", "O"), ("bbox_y1", "O"), ("bbox_x2", "O"), ("bbox_y2", "O"), ("class", "O"), ("fname", "O")]
    for split, target in (("train", base / "devkit" / "cars_train_annos.mat"),
                          ("test", base / "cars_test_annos_withlabels.mat")):
        rows = [(f"{split[:2]}{i:05d}.jpg", i % 3) for i in range(1, 7)]
        records = np.zeros((1, len(rows)), dtype=fields)
        for j, (name, label) in enumerate(rows):
            records[0, j] = (np.uint8(1), np.uint8(2), np.uint8(20), np.uint8(22), np.uint8(label + 1), name)
        savemat(target, {"annotations": records})
        out[split] = rows
        for name, _ in rows:
            if name != "te00006.jpg":
                image(base / f"cars_{split}" / name, sum(map(ord, name)))
    return out


def dtd(root: Path) -> Expected:
    data = root / "dtd" / "dtd"
    classes = ["banded", "blotchy", "zigzagged"]
    out: Expected = {}
    for split, start in (("train", 1), ("val", 11), ("test", 21)):
        rows = [(f"{c}/{c}_{start + i:04d}.jpg", k) for k, c in enumerate(classes) for i in range(2)]
        _write(data / "labels" / f"{split}1.txt", "".join(item + "\n" for item, _ in rows))
        _write(data / "labels" / f"{split}2.txt", "".join(item + "\n" for item, _ in reversed(rows)))
        out[split] = rows
        for item, _ in rows:
            if item != "zigzagged/zigzagged_0022.jpg":
                image(data / "images" / item, sum(map(ord, item)))
    return out


def fgvc_aircraft(root: Path) -> Expected:
    data = root / "fgvc-aircraft-2013b" / "data"
    variants = ["707-320", "A300B4", "Cessna 172"]  # a variant name may hold a space
    _write(data / "variants.txt", "".join(v + "\n" for v in variants))
    out: Expected = {}
    for split, first in (("train", 1000000), ("val", 2000000), ("test", 3000000)):
        rows = [(f"{first + 10 * k + i:07d}", k) for k in range(3) for i in range(2)]
        _write(data / f"images_variant_{split}.txt", "".join(f"{item} {variants[k]}\n" for item, k in rows))
        out[split] = rows
        for item, _ in rows:
            if item != "3000021":
                image(data / "images" / f"{item}.jpg", int(item) % 1009)
    _write(data / "images_variant_trainval.txt",
           "".join(f"{item} {variants[k]}\n" for item, k in out["train"] + out["val"]))
    return out


def caltech101(root: Path) -> Expected:
    """Four images per class, BACKGROUND_Google included; no split files (the loader draws them)."""
    folder = root / "caltech101" / "101_ObjectCategories"
    classes = ["BACKGROUND_Google", "Faces", "accordion"]
    for k, name in enumerate(classes):
        for i in range(1, 5):
            image(folder / name / f"image_{i:04d}.jpg", 10 * k + i)
    return {"all": [(f"{c}/image_{i:04d}.jpg", k) for k, c in enumerate(classes) for i in range(1, 5)]}


def wds(root: Path, splits: tuple[str, ...] = ("train", "test"), n_classes: int = 3, per_class: int = 2,
        image_format: str = "webp") -> Expected:
    """CLIP_benchmark's export: <split>/nshards.txt, <split>/<shard>.tar of s%07d.<image> + s%07d.cls
    (one shard per 4 samples here), classnames.txt."""
    out: Expected = {}
    extension = {"webp": "webp", "png": "png", "jpeg": "jpg"}[image_format]
    for s, split in enumerate(splits):
        samples = [(f"s{i:07d}", i % n_classes) for i in range(n_classes * per_class)]
        shards = [samples[i:i + 4] for i in range(0, len(samples), 4)]
        (root / split).mkdir(parents=True, exist_ok=True)
        for shard, rows in enumerate(shards):
            with tarfile.open(root / split / f"{shard}.tar", "w") as tar:
                for key, label in rows:
                    for name, data in ((f"{key}.{extension}", image(None, 100 * s + int(key[1:]),
                                                                    image_format.upper())),
                                       (f"{key}.cls", str(label).encode())):
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        _write(root / split / "nshards.txt", str(len(shards)))
        out[split] = [(f"{shard}/{key}", label) for shard, rows in enumerate(shards) for key, label in rows]
    _write(root / "classnames.txt", "".join(f"class {c}\n" for c in range(n_classes)))
    return out


def coco_multilabel(root: Path) -> Expected:
    """instances_{train2014,val2014}.json with three categories (ids 1, 3, 18, listed out of order); one
    image per split has no annotation; images under <root>/<split>/."""
    categories = [{"id": 18, "name": "dog", "supercategory": "animal"},
                  {"id": 1, "name": "person", "supercategory": "person"},
                  {"id": 3, "name": "car", "supercategory": "vehicle"}]
    out: Expected = {}
    for split, labels in (("train2014", [[1], [3], [18], [1, 18], [3, 18], [1, 3], []]),
                          ("val2014", [[1], [3, 18], [18], [1, 3], []])):
        images, annotations = [], []
        for i, cats in enumerate(labels):
            image_id = 9 + 7 * i
            name = f"COCO_{split}_{image_id:012d}.jpg"
            images.append({"id": image_id, "file_name": name, "height": 24, "width": 24})
            annotations += [{"id": len(annotations) + 1, "image_id": image_id, "category_id": c, "iscrowd": 0,
                             "bbox": [0, 0, 5, 5], "area": 25} for c in cats for _ in range(1 + (c == 18))]
            image(root / split / name, 31 * image_id + sum(cats))
        _write(root / "annotations" / f"instances_{split}.json",
               json.dumps({"info": {}, "licenses": [], "images": images, "annotations": annotations,
                           "categories": categories}))
        out["train" if split == "train2014" else "test"] = [(str(9 + 7 * i), sorted(c)) for i, c in enumerate(labels)]
    return out


WRITERS: dict[str, Callable[[Path], Expected]] = {
    "food101": food101, "oxford_pets": oxford_pets, "flowers102": flowers102, "sun397": sun397,
    "stanford_cars": stanford_cars, "dtd": dtd, "fgvc_aircraft": fgvc_aircraft, "caltech101": caltech101,
    "wds": wds, "coco_multilabel": coco_multilabel,
}
