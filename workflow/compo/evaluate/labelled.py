"""Labelled image sets read from the files their users have, for zero-shot classification and linear probes.

`benchmarks.<name>.path` is the folder passed to torchvision's dataset class as `root` (CLIP_benchmark's
`--dataset_root`); each release sits in the sub-folder torchvision extracts it to
(`compo.evaluate.files.labelled_files` lists the annotation files, `LABELLED_SPLITS` the split names):

* `food101`: `food-101/meta/{train,test}.json` ({class: ["class/id", ...]}), images
  `food-101/images/<class>/<id>.jpg`; classes in sorted order.
* `oxford_pets`: `oxford-iiit-pet/annotations/{trainval,test}.txt` (`Image CLASS-ID SPECIES BREED-ID`,
  class ids from 1), images `oxford-iiit-pet/images/<Image>.jpg`.
* `flowers102`: `flowers-102/imagelabels.mat` (`labels`, from 1) and `setid.mat` (`trnid` / `valid` /
  `tstid`), images `flowers-102/jpg/image_%05d.jpg`; the release has no class names.
* `sun397`: `SUN397/ClassName.txt` (`/a/abbey`, ...), images `SUN397/a/abbey/sun_*.jpg`, and the split
  lists of the separate Partitions download, `Partitions/{Training,Testing}_%02d.txt` (`/a/abbey/sun_*.jpg`),
  partition `partition` (default 1: 50 + 50 images per class, Kornblith et al. 2019 and CLIP).
* `stanford_cars`: `stanford_cars/devkit/cars_meta.mat` (`class_names`), `devkit/cars_train_annos.mat` and
  `cars_test_annos_withlabels.mat` (`annotations`: `class` from 1, `fname`), images `cars_{train,test}/`.
* `dtd`: `dtd/dtd/labels/{train,val,test}<partition>.txt` (`class/image.jpg`), images `dtd/dtd/images/`;
  classes in sorted order.
* `fgvc_aircraft`: `fgvc-aircraft-2013b/data/variants.txt` and `images_variant_{train,val,trainval,test}.txt`
  (`<id> <variant>`), images `data/images/<id>.jpg`.
* `caltech101`: `caltech101/101_ObjectCategories/<class>/image_*.jpg`, every folder a class in sorted order,
  BACKGROUND_Google included (CLIP_benchmark's Caltech101, whose 102 class names follow that order). The
  release has no split: `train` draws `train_per_class` images (default 30, Kornblith et al. and CLIP) of each
  class with a generator seeded by `seed` (default 0), `test` is the rest.
* `wds`: CLIP_benchmark's webdataset export (`clip_benchmark_export_wds`, and its prebuilt `wds_*` sets):
  `<split>/nshards.txt` and `<split>/0.tar` ... holding `<key>.webp|png|jpg|jpeg` and `<key>.cls` (the label,
  an integer as text), with `classnames.txt` (one per line, label order) beside the split folders. The split
  folder is named by the `--split` the export was given: VTAB's `train800`, `val200`, `train800val200`, `test`.
  Read with the training shards' reader (`compo.shards.samples`): a key given again in its shard keeps its
  first sample (skipped and counted as `repeated_key`); a shard cut short is an error naming it.
* `coco_multilabel`: COCO's `annotations/instances_{train2014,val2014}.json` (images, annotations with
  `category_id`, categories); the labels of an image are the categories of its annotations (multi-label),
  images at `image_root/<split>/<file_name>` (default image_root: `path`).
* `elevater`: ELEVATER's own releases, as its toolkit downloads them with the `vision-datasets` package
  (github.com/microsoft/vision-datasets): `dataset_info` is the DATASET_INFO json (the toolkit's
  `vision_benchmark/resources/datasets/vision_datasets.json`, a list of entries), read at the entry named
  `dataset` (its latest `version`); its files lie under `path/<root_folder>`. Type `classification_multiclass`
  or `classification_multilabel`; format `iris` (default: an index file of `<image> <label>[,<label>...]` lines,
  labels from 0, and a `labelmap` file of class names, one a line) or `coco` (a COCO json: images with
  `file_name` and optional `zip_file`, annotations with `category_id`, categories ordered by id). An image
  `<archive>.zip@<member>` is read from the zip in place. The labels are the release's own ids, the order
  ELEVATER's `prompts.py` class lists follow (a multiclass image with several keeps its first, as ELEVATER).

Every listed image is kept in the listed order; an image file that is missing or cannot be decoded is
skipped and counted when it is encoded (`compo.evaluate.common`). A malformed split file is an error
naming the file and line.
"""

from __future__ import annotations

import logging
import zipfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compo.evaluate.common import TarMember, item_path, read_json_file, read_text_file
from compo.evaluate.files import CALTECH_FOLDER, LABELLED_SPLITS, BenchmarkError, labelled_files, partition, split_name
from compo.images import OutsideRoot, ZipMember, zip_members
from compo.shards import ShardError, member_path, open_member, samples

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ("webp", "png", "jpg", "jpeg")  # what CLIP_benchmark's wds reader decodes
CALTECH_TRAIN_PER_CLASS = 30


@dataclass
class RawSplit:
    """One split of a labelled set as its release gives it."""

    class_ids: list[str]               # per label, the release's class key
    own_names: list[str] | None        # per label, the name the release (or torchvision) gives; None: none
    items: list[str]                   # per sample, its id in the predictions table
    images: list[Path | TarMember | ZipMember]
    labels: list[int]                  # single-label sets
    targets: np.ndarray | None = None  # multi-label sets: [N, C] bool
    skipped: dict[str, int] = field(default_factory=dict)  # samples the reader skipped, by reason (counted)
    skip_examples: dict[str, list[str]] = field(default_factory=dict)  # a few of them, by reason


def read_split(spec: dict[str, Any], root: Path, role: str) -> RawSplit | None:
    """The `role` split ("train" / "val" / "test") of the labelled set in `spec["format"]` under `root`;
    None when the release has no split for that role (no validation split)."""
    fmt = spec.get("format")
    split = split_name(spec, role)
    if split is None:
        if role == "val":
            return None
        raise BenchmarkError(f"{root}: format {fmt} has no {role!r} split (benchmark key 'splits': "
                             f"{', '.join(f'{k}: {v}' for k, v in LABELLED_SPLITS[fmt].items())})")
    for path in labelled_files(spec, root, role):
        if not path.exists():
            raise BenchmarkError(f"{path}: {fmt} {split} split file not found (expected the release as "
                                 f"torchvision extracts it under {root})")
    return READERS[fmt](spec, root, split)


def _lines(path: Path, what: str) -> list[tuple[int, str]]:
    return [(number, line.strip()) for number, line in enumerate(read_text_file(path, what).splitlines(), 1)
            if line.strip()]


def _split_error(path: Path, number: int, expected: str, line: str) -> BenchmarkError:
    return BenchmarkError(f"{path}: line {number}: expected {expected}, got {line[:80]!r}")


def _food101(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    path = root / "food-101" / "meta" / f"{split}.json"
    meta = read_json_file(path, "Food-101 split file")
    if not isinstance(meta, dict) or not all(isinstance(v, list) for v in meta.values()):
        raise BenchmarkError(f"{path}: expected an object of class -> list of 'class/image' ids")
    classes = sorted(meta)
    images_root = root / "food-101" / "images"
    items, images, labels = [], [], []
    for label, name in enumerate(classes):
        for image_id in meta[name]:
            if not isinstance(image_id, str) or not image_id:
                raise BenchmarkError(f"{path}: class {name!r}: image ids must be non-empty strings")
            items.append(image_id)
            images.append(item_path(images_root, f"{image_id}.jpg"))
            labels.append(label)
    # CLIP_benchmark's names: torchvision's classes with "_" as spaces
    return RawSplit(classes, [c.replace("_", " ") for c in classes], items, images, labels)


def _oxford_pets(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    path = root / "oxford-iiit-pet" / "annotations" / f"{split}.txt"
    by_label: dict[int, str] = {}
    items, labels = [], []
    for number, line in _lines(path, "Oxford-IIIT Pet split file"):
        fields = line.split()
        if len(fields) != 4 or not fields[1].isdigit() or int(fields[1]) < 1:
            raise _split_error(path, number, "'Image CLASS-ID SPECIES BREED-ID' with CLASS-ID from 1", line)
        label = int(fields[1]) - 1
        by_label.setdefault(label, fields[0].rsplit("_", 1)[0])
        items.append(fields[0])
        labels.append(label)
    if sorted(by_label) != list(range(len(by_label))):
        raise BenchmarkError(f"{path}: class ids are not 1..{len(by_label)}")
    breeds = [by_label[label] for label in range(len(by_label))]
    images = [item_path(root / "oxford-iiit-pet" / "images", f"{item}.jpg") for item in items]
    # torchvision's names: the breed of the image ids, title-cased
    return RawSplit(breeds, [" ".join(p.title() for p in b.split("_")) for b in breeds], items, images, labels)


def _load_mat(path: Path) -> dict[str, Any]:
    from scipy.io import loadmat

    try:
        return loadmat(path, squeeze_me=True)
    except (OSError, ValueError, TypeError) as error:
        raise BenchmarkError(f"{path}: not a MATLAB .mat file scipy can read ({error})") from error


def _mat_field(data: dict[str, Any], key: str, path: Path) -> Any:
    if key not in data:
        present = ", ".join(k for k in data if not k.startswith("__"))
        raise BenchmarkError(f"{path}: no variable {key!r} (has {present})")
    return data[key]


def _flowers102(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    folder = root / "flowers-102"
    set_key = {"train": "trnid", "val": "valid", "test": "tstid"}.get(split)
    if set_key is None:
        raise BenchmarkError(f"{folder}: Flowers-102 splits are train, val, test, not {split!r}")
    ids = np.atleast_1d(_mat_field(_load_mat(folder / "setid.mat"), set_key, folder / "setid.mat")).astype(int)
    all_labels = np.atleast_1d(_mat_field(_load_mat(folder / "imagelabels.mat"), "labels",
                                          folder / "imagelabels.mat")).astype(int)
    n_classes = int(all_labels.max())
    bad = [int(i) for i in ids if not 1 <= i <= len(all_labels)]
    if bad or all_labels.min() < 1:
        raise BenchmarkError(f"{folder / 'setid.mat'}: image id {bad[0] if bad else '?'} has no label in "
                             f"imagelabels.mat (1..{len(all_labels)}, labels from 1)")
    items = [f"image_{i:05d}" for i in ids]
    images = [folder / "jpg" / f"{item}.jpg" for item in items]
    labels = [int(all_labels[i - 1]) - 1 for i in ids]
    return RawSplit([str(c) for c in range(1, n_classes + 1)], None, items, images, labels)


def _sun397(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    names_path = root / "SUN397" / "ClassName.txt"
    classes = [line.lstrip("/") for _, line in _lines(names_path, "SUN397 class list")]
    index = {c: i for i, c in enumerate(classes)}
    path = root / "Partitions" / f"{split}_{partition(spec):02d}.txt"
    items, images, labels = [], [], []
    for number, line in _lines(path, "SUN397 partition file"):
        relative = line.lstrip("/")
        category = relative.rsplit("/", 1)[0]
        if category not in index:
            raise _split_error(path, number, f"an image of a class in {names_path.name}", line)
        items.append(relative)
        images.append(item_path(root / "SUN397", relative))
        labels.append(index[category])
    # CLIP_benchmark's names: torchvision's ("abbey", "apartment_building/outdoor") with "_" and "/" as spaces
    names = [c.split("/", 1)[1].replace("_", " ").replace("/", " ") for c in classes]
    return RawSplit(classes, names, items, images, labels)


def _stanford_cars(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    base = root / "stanford_cars"
    meta = base / "devkit" / "cars_meta.mat"
    classes = [str(c) for c in np.atleast_1d(_mat_field(_load_mat(meta), "class_names", meta))]
    if split not in ("train", "test"):
        raise BenchmarkError(f"{base}: Stanford Cars splits are train and test, not {split!r}")
    path = base / ("devkit/cars_train_annos.mat" if split == "train" else "cars_test_annos_withlabels.mat")
    annotations = np.atleast_1d(_mat_field(_load_mat(path), "annotations", path))
    items, images, labels = [], [], []
    for number, record in enumerate(annotations, 1):
        try:
            label, name = int(record["class"]) - 1, str(record["fname"])
        except (ValueError, IndexError, KeyError) as error:
            raise BenchmarkError(f"{path}: annotation {number} lacks 'class' / 'fname' ({error})") from error
        if not 0 <= label < len(classes):
            raise BenchmarkError(f"{path}: annotation {number}: class {label + 1} not in 1..{len(classes)}")
        items.append(name)
        images.append(item_path(base / f"cars_{split}", name))
        labels.append(label)
    return RawSplit(classes, classes, items, images, labels)


def _dtd(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    data = root / "dtd" / "dtd"
    path = data / "labels" / f"{split}{partition(spec)}.txt"
    rows = []
    for number, line in _lines(path, "DTD split file"):
        if line.count("/") != 1:
            raise _split_error(path, number, "'class/image.jpg'", line)
        rows.append(line.split("/"))
    classes = sorted({c for c, _ in rows})
    index = {c: i for i, c in enumerate(classes)}
    items = [f"{c}/{name}" for c, name in rows]
    images = [item_path(data / "images", c, name) for c, name in rows]
    return RawSplit(classes, classes, items, images, [index[c] for c, _ in rows])


def _fgvc_aircraft(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    data = root / "fgvc-aircraft-2013b" / "data"
    classes = [line for _, line in _lines(data / "variants.txt", "FGVC-Aircraft variant list")]
    index = {c: i for i, c in enumerate(classes)}
    path = data / f"images_variant_{split}.txt"
    items, labels = [], []
    for number, line in _lines(path, "FGVC-Aircraft split file"):
        image_id, _, variant = line.partition(" ")
        if variant not in index:
            raise _split_error(path, number, "'<image id> <variant of variants.txt>'", line)
        items.append(image_id)
        labels.append(index[variant])
    images = [item_path(data / "images", f"{item}.jpg") for item in items]
    return RawSplit(classes, classes, items, images, labels)


def _caltech101(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    folder = root / CALTECH_FOLDER
    if split not in ("train", "test"):
        raise BenchmarkError(f"{folder}: Caltech101's splits here are train and test, not {split!r}")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    per_class = spec.get("train_per_class", CALTECH_TRAIN_PER_CLASS)
    rng = np.random.default_rng(spec.get("seed", 0))
    items, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(p.name for p in (folder / name).iterdir() if p.suffix.lower() == ".jpg")
        drawn = set(rng.choice(len(files), size=min(per_class, len(files)), replace=False).tolist())
        chosen = [f for i, f in enumerate(files) if (i in drawn) == (split == "train")]
        items += [f"{name}/{f}" for f in chosen]
        labels += [label] * len(chosen)
    return RawSplit(classes, None, items, [folder / item for item in items], labels)


REPEATED_KEY = "repeated_key"  # a webdataset key given again in its shard: the repeat is skipped


def _wds(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    """Read with the training shards' reader (`compo.shards.samples`: members grouped as webdataset groups them,
    the end-of-archive marker checked): a key given again in its shard (in a row, later, or a member twice in
    one sample) keeps its first sample, with that sample's own image and label (a member name stored twice
    means its first member); the repeat is skipped and counted (REPEATED_KEY). A shard cut short is an error
    naming it."""
    nshards_path = root / split / "nshards.txt"
    text = read_text_file(nshards_path, "webdataset shard count").strip()
    if not text.isdigit() or int(text) < 1:
        raise BenchmarkError(f"{nshards_path}: expected the number of shards, got {text[:40]!r}")
    items, images, labels = [], [], []
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    for shard in range(int(text)):
        archive = root / split / f"{shard}.tar"
        if not archive.is_file():
            raise BenchmarkError(f"{archive}: shard {shard} of {text} not found")
        seen: set[str] = set()
        try:
            for sample in samples(archive, read=("cls",)):
                key = f"{shard}/{sample.key}"
                if sample.key in seen:
                    skipped[REPEATED_KEY] += 1
                    examples[REPEATED_KEY].append(f"{archive}: key {sample.key}")
                    continue
                seen.add(sample.key)
                image = next((sample.members[e] for e in IMAGE_EXTENSIONS if e in sample.members), None)
                if "cls" not in sample.texts or image is None:
                    raise BenchmarkError(f"{archive}: sample {sample.key} lacks its .cls label or its image "
                                         f"(.{', .'.join(IMAGE_EXTENSIONS)}); it has .{', .'.join(sample.members)} (a "
                                         "key given again in its shard keeps its first sample)")
                label = sample.texts["cls"].decode("utf-8", "replace").strip()
                if not label.isascii() or not label.isdigit():
                    raise BenchmarkError(f"{archive}: sample {sample.key}: .cls must be a label >= 0, got {label!r}")
                items.append(key)
                images.append(open_member(member_path(archive, image)))
                labels.append(int(label))
        except (ShardError, OSError) as error:  # each names the shard: cut short, damaged, not a tar
            raise BenchmarkError(str(error)) from error
    if not items:
        raise BenchmarkError(f"{root / split}: no samples in the shards")
    for reason, count in skipped.items():
        log.warning("%s: skipped %d sample(s): %s (kept each key's first sample; e.g. %s)", root / split, count,
                    reason, ", ".join(examples[reason][:3]))
    names_path = root / "classnames.txt"
    names = [line for _, line in _lines(names_path, "class names")] if names_path.is_file() else None
    n_classes = len(names) if names else max(labels) + 1
    if max(labels) >= n_classes:
        raise BenchmarkError(f"{names_path}: {n_classes} class names but a label {max(labels)} in {root / split}")
    return RawSplit([str(c) for c in range(n_classes)], names, items, images, labels, skipped=dict(skipped),
                    skip_examples={reason: found[:3] for reason, found in examples.items()})


def _coco_multilabel(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    path = root / "annotations" / f"instances_{split}.json"
    data = read_json_file(path, "COCO instances file")
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations",
                                                                                      "categories")):
        raise BenchmarkError(f"{path}: expected COCO instances JSON (lists images, annotations, categories)")
    try:
        categories = sorted((int(c["id"]), str(c["name"])) for c in data["categories"])
        image_rows = [(int(i["id"]), str(i["file_name"])) for i in data["images"]]
        pairs = [(int(a["image_id"]), int(a["category_id"])) for a in data["annotations"]]
    except (KeyError, TypeError, ValueError) as error:
        raise BenchmarkError(f"{path}: a category, image or annotation lacks a field ({error!r})") from error
    column = {cid: k for k, (cid, _) in enumerate(categories)}
    row = {image_id: k for k, (image_id, _) in enumerate(image_rows)}
    targets = np.zeros((len(image_rows), len(categories)), dtype=bool)
    for image_id, category in pairs:
        if image_id not in row or category not in column:
            raise BenchmarkError(f"{path}: an annotation names image {image_id} or category {category}, "
                                 "which the file does not list")
        targets[row[image_id], column[category]] = True
    images_root = Path(spec.get("image_root") or root) / split
    names = [name for _, name in categories]
    return RawSplit(names, names, [str(i) for i, _ in image_rows],
                    [item_path(images_root, name) for _, name in image_rows], [], targets=targets)


ELEVATER_TYPES = {"classification_multiclass": False, "classification_multilabel": True}  # -> multi-label


def _elevater_entry(spec: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """The DATASET_INFO entry named `spec["dataset"]` (its latest version) and the file it came from."""
    if not spec.get("dataset_info") or not spec.get("dataset"):
        raise BenchmarkError("format elevater needs the benchmark keys 'dataset_info' (the DATASET_INFO json, e.g. "
                             "the toolkit's vision_benchmark/resources/datasets/vision_datasets.json) and 'dataset' "
                             "(ELEVATER's name, e.g. cifar-100)")
    path = Path(spec["dataset_info"])
    data = read_json_file(path, "ELEVATER DATASET_INFO file")
    entries = data if isinstance(data, list) else [data]
    if not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
        raise BenchmarkError(f"{path}: expected a DATASET_INFO object or a list of them, each with a 'name'")
    named = [e for e in entries if e["name"] == spec["dataset"]]
    if not named:
        known = ", ".join(sorted(e["name"] for e in entries))
        raise BenchmarkError(f"{path}: no dataset {spec['dataset']!r} (has {known})")
    entry = max(named, key=lambda e: e.get("version", 0) if isinstance(e.get("version"), int) else 0)
    if entry.get("type") not in ELEVATER_TYPES:
        raise BenchmarkError(f"{path}: {spec['dataset']}: type {entry.get('type')!r} is not one of "
                             f"{', '.join(ELEVATER_TYPES)}")
    if entry.get("format", "iris") not in ("iris", "coco") or not isinstance(entry.get("root_folder", ""), str):
        raise BenchmarkError(f"{path}: {spec['dataset']}: format {entry.get('format')!r} is not iris or coco")
    return entry, path


def _elevater_image(base: Path, reference: str, archives: dict[Path, dict[str, ZipMember]],
                    where: str) -> Path | ZipMember:
    """An image `archive.zip@member` (read in the zip) or a path, under the release's folder `base`."""
    if "@" not in reference:
        return item_path(base, reference)
    archive_name, member = reference.split("@", 1)
    archive = item_path(base, archive_name)
    if isinstance(archive, OutsideRoot):
        return archive  # never read: counted outside its root
    if archive not in archives:
        try:
            archives[archive] = zip_members(archive)
        except (OSError, zipfile.BadZipFile) as error:
            raise BenchmarkError(f"{archive}: zip archive {where} names is missing or unreadable ({error})") from error
    return archives[archive].get(member) or ZipMember(archive, member, -1, 0, 0)


def _elevater_labels(found: list[int], n_classes: int, multilabel: bool, where: str) -> list[int]:
    """An image's labels; a multiclass image keeps its first, as ELEVATER's `multiclass_to_int` does."""
    if not multilabel and not found:
        raise BenchmarkError(f"{where}: a multiclass image needs a label, got none")
    if any(not 0 <= label < n_classes for label in found):
        raise BenchmarkError(f"{where}: label outside 0..{n_classes - 1}")
    if not multilabel and len(found) > 1:
        log.warning("%s: a multiclass image with %d labels: its first is used, as ELEVATER does", where, len(found))
    return found if multilabel else found[:1]


def _elevater(spec: dict[str, Any], root: Path, split: str) -> RawSplit:
    entry, info_path = _elevater_entry(spec)
    dataset = spec["dataset"]
    if not isinstance(entry.get(split), dict) or not isinstance(entry[split].get("index_path"), str):
        raise BenchmarkError(f"{info_path}: {dataset} has no {split!r} split with an index_path")
    base = root / entry.get("root_folder", "")
    index = base / entry[split]["index_path"]
    multilabel = ELEVATER_TYPES[entry["type"]]
    archives: dict[Path, dict[str, ZipMember]] = {}
    rows: list[tuple[str, Path | ZipMember, list[int]]] = []
    if entry.get("format", "iris") == "coco":
        data = read_json_file(index, "ELEVATER COCO index")
        try:
            categories = sorted((int(c["id"]), str(c["name"])) for c in data["categories"])
            images = sorted((int(i["id"]), str(i["file_name"]), i.get("zip_file")) for i in data["images"])
            pairs = [(int(a["image_id"]), int(a["category_id"])) for a in data["annotations"]]
        except (KeyError, TypeError, ValueError) as error:
            raise BenchmarkError(f"{index}: expected a COCO json (images with id and file_name, annotations with "
                                 f"image_id and category_id, categories with id and name): {error!r}") from error
        names = [name for _, name in categories]
        position = {cid: k for k, (cid, _) in enumerate(categories)}
        found: dict[int, list[int]] = {image_id: [] for image_id, _, _ in images}
        for image_id, category in pairs:
            if image_id not in found or category not in position:
                raise BenchmarkError(f"{index}: an annotation names image {image_id} or category {category}, "
                                     "which the file does not list")
            found[image_id].append(position[category])
        for image_id, file_name, zip_file in images:
            reference = f"{zip_file}@{file_name}" if zip_file else file_name
            labels = _elevater_labels(found[image_id], len(names), multilabel, f"{index}: image {image_id}")
            rows.append((str(image_id), _elevater_image(base, reference, archives, str(index)), labels))
        own: list[str] | None = names
    else:
        own = None
        if entry.get("labelmap"):
            own = [line for _, line in _lines(base / entry["labelmap"], "ELEVATER labelmap")]
        parsed = []
        for number, line in _lines(index, "ELEVATER index file"):
            reference, _, labels = line.rpartition(" ")  # only the image path may hold spaces, as vision-datasets
            if not reference:  # an image without labels (multi-label sets may list one)
                reference, labels = line, ""
            fields = labels.split(",") if labels else []
            if not all(x.isdigit() for x in fields) or not fields and not multilabel:
                raise _split_error(index, number, "'<image> <label>[,<label>...]' (labels from 0)", line)
            found_labels = [int(x) for x in fields]
            parsed.append((number, reference, found_labels))
        n_classes = len(own) if own else max((max(f, default=0) for _, _, f in parsed), default=0) + 1
        for number, reference, found_labels in parsed:
            labels = _elevater_labels(found_labels, n_classes, multilabel, f"{index}: line {number}")
            rows.append((reference, _elevater_image(base, reference, archives, str(index)), labels))
        names = own or [str(c) for c in range(n_classes)]
    if not rows:
        raise BenchmarkError(f"{index}: no images listed")
    items = [item for item, _, _ in rows]
    images = [image for _, image, _ in rows]
    if not multilabel:
        return RawSplit(names, own, items, images, [labels[0] for _, _, labels in rows])
    targets = np.zeros((len(rows), len(names)), dtype=bool)
    for k, (_, _, labels) in enumerate(rows):
        targets[k, labels] = True
    return RawSplit(names, own, items, images, [], targets=targets)


READERS = {"food101": _food101, "oxford_pets": _oxford_pets, "flowers102": _flowers102, "sun397": _sun397,
           "stanford_cars": _stanford_cars, "dtd": _dtd, "fgvc_aircraft": _fgvc_aircraft,
           "caltech101": _caltech101, "wds": _wds, "coco_multilabel": _coco_multilabel, "elevater": _elevater}
assert set(READERS) == set(LABELLED_SPLITS)
