"""Zero-shot classification as in CLIP (Radford et al., 2021): each class is the renormalised mean of
its prompt-template embeddings, each image is assigned the class it is most similar to.

The labelled images (also read by `compo.evaluate.linear_probe`) come in the formats users have,
`spec["format"]`:

* `imagefolder` (default): `{benchmark_dir}/{class_folder}/*.png` (other common image suffixes too),
  classes in sorted folder order as torchvision's ImageFolder. ImageNet's validation set in synset
  folders (`n01440764/...JPEG`, torchvision's ImageNet `val/` layout) is one: with CLIP_benchmark's
  `imagenet1k` class names, listed in sorted-synset order, each folder gets its name.
* `cifar10`, `cifar100`: the python pickles (`cifar-10-batches-py/`, `cifar-100-python/` under
  `benchmark_dir`), test split, read as torchvision's CIFAR10 / CIFAR100 read them but through a restricted
  unpickler (`restricted_unpickle`: numpy arrays, lists, dicts, strings and numbers only, so no file runs
  code); each file's md5 is checked against torchvision's list first (`spec["verify"]: false` skips that
  check, for a re-packed copy; the unpickler stays restricted).
* the released layouts of `compo.evaluate.labelled` (Food-101, Oxford-IIIT Pet, Flowers-102, SUN397,
  Stanford Cars, DTD, FGVC-Aircraft, Caltech101 as torchvision reads them; CLIP_benchmark's webdataset
  export; COCO's instances files; ELEVATER's own release, `format: elevater`): zero-shot scores
  `spec["split"]` (default test).

Class names (`spec["classnames"]`, a file; default `{benchmark_dir}/classnames.json` for an
ImageFolder, else the release's own names as CLIP_benchmark uses them: CIFAR's, Food-101's and SUN397's
with "_" (and SUN397's "/") as spaces, Stanford Cars', DTD's, FGVC-Aircraft's variants, the wds export's
classnames.txt; Flowers-102 and Caltech101 have none, so they need the file):
a JSON object folder -> name; a JSON list or a `.txt` file (one name a line) in class order; or
CLIP_benchmark's `en_classnames.json` (dataset -> list), read at `spec["dataset"]` (e.g. imagenet1k).
Templates: `spec["templates"]`, CLIP_benchmark's `en_zeroshot_classification_templates.json` (dataset ->
list, read at `spec["dataset"]`, falling back to `imagenet1k` as CLIP_benchmark does) or a JSON list;
or ELEVATER's `prompts.py` (a `.py` file: class names and templates at ELEVATER's dataset name,
compo.evaluate.elevater);
otherwise the config's `zeroshot_templates`. A template holds its class name as `{c}` (CLIP_benchmark)
or `{}` (CLIP).
Top-1 (and top-5 when there are more than 5 classes) with ties counted against the model (`ties: pessimistic`,
the default) or, for ELEVATER's sets (format elevater, default `ties: first`), as ELEVATER's scorer counts them:
its vision-evaluation TopKAccuracyEvaluator reads `np.argsort(-probabilities)[:, :k]`, which puts the first of
tied classes first (`class_ranks`); and the mean
per-class accuracy (`mean_per_class`, CLIP's metric for Pets, Flowers, Caltech101 and Aircraft); a two-class set
also `roc_auc` (ELEVATER's Hateful Memes metric). A multi-label set (VOC 2007) gets the probe's strict `map` and
`top1` (compo.evaluate.linear_probe) and ELEVATER's `map_11point`. ELEVATER's two metrics score what its
`clip_zeroshot_evaluator.py` scores: the softmax over classes of 100 x the cosine similarities (its fixed scale,
not the model's own). The headline is `spec["headline"]` (default top1; multi-label map_11point).
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import pickle
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from PIL import Image

from compo.evaluate import elevater
from compo.evaluate.common import (
    BenchmarkError,
    BenchmarkResult,
    Metric,
    log_skips,
    read_json_file,
)
from compo.evaluate.files import (  # noqa: F401
    CIFAR_LAYOUT,
    CLASSIFICATION_FORMATS,
    CLASSNAMES,
    LABELLED_SPLITS,
    cifar_files,
    classification_files,
    classnames_file,
    labelled_downloads,
)
from compo.evaluate.kinds import POSITIVE_INT, Benchmark, BenchmarkSize, Key, Selection
from compo.layout import WORLD_ZEROSHOT_ATTRIBUTES
from compo.paths import repeated

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

log = logging.getLogger(__name__)

PROTOCOL = "clip-zeroshot-template-ensemble"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
FORMATS = CLASSIFICATION_FORMATS
TEMPLATE_FALLBACK = "imagenet1k"  # CLIP_benchmark's templates for a dataset it has none for
BATCH = 256
ELEVATER_SCALE = 100.0  # ELEVATER's clip_zeroshot_evaluator: softmax(100 * image @ text), for every model
MAP_POINTS = 11


@dataclass
class LabelledImages:
    """One split of a classification set, samples in a fixed order: image files or in-memory pixels."""

    class_ids: list[str]             # per label: the folder (ImageFolder) or class name (CIFAR)
    class_names: list[str]           # per label: the name the prompts use
    items: list[str]                 # per sample: its id in the predictions table
    labels: list[int]
    paths: list[Path] | None = None  # image files (or tar members)
    pixels: np.ndarray | None = None  # CIFAR: [N, H, W, 3] uint8
    targets: np.ndarray | None = None  # multi-label sets: [N, C] bool (labels is empty)
    skipped: dict[str, int] = field(default_factory=dict)  # samples its reader skipped, by reason
    skip_examples: dict[str, list[str]] = field(default_factory=dict)


# --- class names and templates ----------------------------------------------------------------------

def _dataset_entry(table: dict[str, Any], spec: dict[str, Any], path: Path, what: str,
                   fallback: str | None = None) -> Any:
    dataset = spec.get("dataset")
    if not dataset:
        raise BenchmarkError(f"{path}: a {what} file keyed by dataset needs the benchmark key 'dataset' "
                             f"(e.g. imagenet1k; the file has {', '.join(sorted(table)[:8])}, ...)")
    for key in (dataset, fallback):
        if key in table:
            return table[key]
    raise BenchmarkError(f"{path}: no {what} for dataset {dataset!r}")


def class_names(spec: dict[str, Any], benchmark_dir: Path, class_ids: list[str],
                own: list[str] | None = None, folder: Path | None = None) -> list[str]:
    """The prompt name of each class id (in label order), from the class-name file or `own` names."""
    path = classnames_file(spec, benchmark_dir)
    if path is None:
        if own is None:
            raise BenchmarkError(f"{benchmark_dir}: format {spec.get('format')} has no class names of its own: "
                                 "set the benchmark key 'classnames' (and 'dataset': CLIP_benchmark's "
                                 "en_classnames.json has flowers, caltech101, pets, ...)")
        return list(own)
    if elevater.is_elevater_file(path):  # ELEVATER's prompts.py: class_map at its dataset name
        names: Any = elevater.class_names(path, spec.get("dataset"))
    elif path.suffix == ".txt":
        if not path.is_file():
            raise BenchmarkError(f"{path}: class names file not found")
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        names = read_json_file(path, "class names file")
    # a released table (CLIP_benchmark's, ELEVATER's): its duplicate or empty names are kept, with a warning
    released = elevater.is_elevater_file(path) or (
        isinstance(names, dict) and bool(names) and all(isinstance(v, list) for v in names.values()))
    if isinstance(names, dict) and released:
        names = _dataset_entry(names, spec, path, "class names")  # CLIP_benchmark: dataset -> list
    if isinstance(names, dict):  # class id -> name
        unnamed = [c for c in class_ids if c not in names]
        unknown = sorted(set(names) - set(class_ids))
        if unnamed:
            raise BenchmarkError(f"{path}: folder(s) {', '.join(unnamed[:5])} in {folder or benchmark_dir} "
                                 "have no class name")
        if unknown:
            raise BenchmarkError(f"{path}: class(es) {', '.join(unknown[:5])} have no folder in "
                                 f"{folder or benchmark_dir}")
        names = [names[c] for c in class_ids]
    if not isinstance(names, list) or len(names) != len(class_ids):
        count = len(names) if isinstance(names, list) else type(names).__name__
        raise BenchmarkError(f"{path}: expected {len(class_ids)} class names (one per class, in class order), "
                             f"got {count}")
    bad = [i for i, name in enumerate(names) if not isinstance(name, str) or not (name.strip() or released)]
    if bad:
        raise BenchmarkError(f"{path}: class {class_ids[bad[0]]!r} needs a non-empty name")
    for i in (i for i, name in enumerate(names) if not name.strip()):  # as released (clevr_closest_object_distance)
        log.warning("%s: class %r of %s has an empty name, used as released", path, class_ids[i], spec.get("dataset"))
    _check_distinct_names(names, class_ids, path, released)
    return names


def _check_distinct_names(names: list[str], class_ids: list[str], path: Path, released: bool) -> None:
    """Two classes with one name get one prompt embedding, so their images always tie (counted wrong): an
    error naming them, except in CLIP_benchmark's released table, whose imagenet1k names 'missile' and
    'sunglasses' twice each (a warning there: the released protocol is kept)."""
    twice = repeated(names)
    if not twice:
        return
    shown = "; ".join(f"{name!r} for {', '.join(c for c, n in zip(class_ids, names, strict=True) if n == name)}"
                      for name in list(twice)[:5])
    if not released:
        raise BenchmarkError(f"{path}: {len(twice)} class name(s) given to more than one class ({shown}); "
                             "expected one name per class (their images would always tie)")
    log.warning("%s: %d class name(s) shared by several classes as released (%s): their images tie", path,
                len(twice), shown)


def check_templates(templates: list[str] | None, where: str = "config key zeroshot_templates") -> list[str]:
    if not templates or not isinstance(templates, list):
        raise BenchmarkError(f"zero-shot evaluation needs prompt templates ({where})")
    for template in templates:
        if not isinstance(template, str) or template.count("{c}") + template.count("{}") != 1:
            raise BenchmarkError(f"{where}: template {template!r} must contain exactly one '{{c}}' or '{{}}'")
    return list(templates)


def prompt_templates(spec: dict[str, Any], templates: list[str] | None) -> list[str]:
    """The benchmark's own templates (a CLIP_benchmark file or ELEVATER's prompts.py), else the config's."""
    if not spec.get("templates"):
        return check_templates(templates)
    path = Path(spec["templates"])
    if elevater.is_elevater_file(path):
        return check_templates(elevater.templates(path, spec.get("dataset")), str(path))
    table = read_json_file(path, "zero-shot templates file")
    if isinstance(table, dict):
        table = _dataset_entry(table, spec, path, "templates", fallback=TEMPLATE_FALLBACK)
    return check_templates(table, str(path))


def fill(template: str, name: str) -> str:
    return template.replace("{c}", name) if "{c}" in template else template.replace("{}", name)


def class_embeddings(loaded: LoadedModel, names: list[str], templates: list[str]) -> torch.Tensor:
    """[C, D]: per class, mean of its L2-normalised template embeddings, renormalised (CLIP's ensemble)."""
    from compo.models import encode_texts, normalized

    prompts = [fill(template, name) for name in names for template in templates]
    embeddings = encode_texts(loaded, prompts).reshape(len(names), len(templates), -1)
    return normalized(embeddings.double().mean(dim=1))


# --- labelled images ------------------------------------------------------------------------------------

def _image_folder(spec: dict[str, Any], benchmark_dir: Path, root: Path, named: bool = True) -> LabelledImages:
    if not root.is_dir():
        raise BenchmarkError(f"{root}: ImageFolder not found")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    if len(folders) < 2:
        raise BenchmarkError(f"{root}: expected at least 2 class folders, found {len(folders)}")
    names = class_names(spec, benchmark_dir, folders, folder=root) if named else folders
    paths, labels = [], []
    for label, folder in enumerate(folders):
        files = sorted(p for p in (root / folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        paths += files
        labels += [label] * len(files)
    if not paths:
        raise BenchmarkError(f"{root}: no images in the class folders")
    items = [str(path.relative_to(benchmark_dir)) for path in paths]
    return LabelledImages(folders, names, items, labels, paths=paths)


# The globals a CIFAR python pickle names: numpy arrays (their reconstructor, ndarray, dtype) inside dicts
# and lists of strings, bytes and numbers. The released files are Python 2 pickles (numpy.core.multiarray);
# numpy 2 writes numpy._core.multiarray, and protocol 2 writes bytes through _codecs.encode.
_NUMPY_RECONSTRUCT = np.zeros(1).__reduce__()[0]
_NUMPY_SCALAR = np.float64(0).__reduce__()[0]
CIFAR_PICKLE_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): codecs.encode,
    **{(module, "_reconstruct"): _NUMPY_RECONSTRUCT for module in ("numpy.core.multiarray", "numpy._core.multiarray")},
    **{(module, "scalar"): _NUMPY_SCALAR for module in ("numpy.core.multiarray", "numpy._core.multiarray")},
}


class _CifarUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves only CIFAR_PICKLE_GLOBALS: any other global a file names (os.system,
    builtins.eval, a class) is refused before it is looked up, so no code in the file can run."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return CIFAR_PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused: the pickle asks for {module}.{name}; a CIFAR file holds only "
                                         "numpy arrays, lists, dicts, strings and numbers") from None


def restricted_unpickle(path: Path) -> Any:
    """The object pickled in `path`, read through `_CifarUnpickler` (as torchvision reads CIFAR: latin1)."""
    try:
        with open(path, "rb") as handle:
            return _CifarUnpickler(handle, encoding="latin1").load()
    except pickle.UnpicklingError as error:
        raise BenchmarkError(f"{path}: {error}") from None
    except (EOFError, OSError, ValueError, TypeError, AttributeError, IndexError, KeyError) as error:
        raise BenchmarkError(f"{path}: not a readable CIFAR pickle ({type(error).__name__}: {error})") from None


def _released_md5(name: str) -> tuple[dict[str, str], str]:
    """torchvision's md5 of each released file of a CIFAR version, and the class-name key of its meta file."""
    from compo.models import open_clip

    open_clip()  # imports torchvision on the CPU torch build
    from torchvision.datasets import CIFAR10, CIFAR100

    reader = {"cifar10": CIFAR10, "cifar100": CIFAR100}[name]
    md5 = {file: digest for file, digest in (*reader.train_list, *reader.test_list)}
    return md5 | {reader.meta["filename"]: reader.meta["md5"]}, reader.meta["key"]


def _check_md5(path: Path, expected: str) -> None:
    digest = hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()
    if digest != expected:
        raise BenchmarkError(f"{path}: md5 {digest} is not the released file's {expected} (torchvision's list): "
                             "the file is damaged or not the python version from cs.toronto.edu/~kriz/cifar.html; "
                             "download and extract it again")


def _cifar_entry(path: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    entry = restricted_unpickle(path)
    if not isinstance(entry, dict) or not any(key in entry for key in keys):
        raise BenchmarkError(f"{path}: expected a CIFAR dict with {' or '.join(keys)}")
    return entry


def _cifar(spec: dict[str, Any], benchmark_dir: Path, name: str, train: bool) -> LabelledImages:
    """A CIFAR split from the released python pickles, read as torchvision reads them (data [n, 3072] in
    channel planes; labels, or fine_labels for CIFAR-100; class names from the meta file) but through
    `restricted_unpickle`, with each file's md5 checked first unless `verify: false`."""
    *batches, meta_path = paths = cifar_files(name, benchmark_dir, train)
    missing = [path for path in paths if not path.is_file()]
    if missing:
        raise BenchmarkError(f"{missing[0]}: {name} file not found (expected the python version's folder "
                             f"extracted under {benchmark_dir})")
    released, names_key = _released_md5(name)
    if spec.get("verify", True):
        for path in paths:
            _check_md5(path, released[path.name])
    ids = _cifar_entry(meta_path, (names_key,))[names_key]
    if not isinstance(ids, list) or not ids or not all(isinstance(c, str) for c in ids):
        raise BenchmarkError(f"{meta_path}: {names_key} should be a list of class names")
    chunks, labels = [], []
    for path in batches:
        entry = _cifar_entry(path, ("data",))
        data, batch_labels = entry["data"], entry.get("labels", entry.get("fine_labels"))
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            raise BenchmarkError(f"{path}: data should be a uint8 array [n, 3072], got "
                                 f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}")
        if not isinstance(batch_labels, list) or len(batch_labels) != len(data) or not all(
                isinstance(label, int) and 0 <= label < len(ids) for label in batch_labels):
            raise BenchmarkError(f"{path}: labels should be {len(data)} class indices in [0, {len(ids) - 1}]")
        chunks.append(data)
        labels += batch_labels
    pixels = np.vstack(chunks).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
    split = "train" if train else "test"
    items = [f"{split}/{index}" for index in range(len(labels))]
    return LabelledImages(ids, class_names(spec, benchmark_dir, ids, own=ids), items, labels, pixels=pixels)


def load_split(spec: dict[str, Any], benchmark_dir: Path, split: str | None = None,
               named: bool = True) -> LabelledImages | None:
    """The labelled images of `split` ("train" / "val" / "test"; None: the zero-shot set) in the spec's
    format; None for "val" when the release has no validation split. `named=False`: the classes keep their ids
    as names (a linear probe prompts no class, so a release without names of its own needs no class-name file)."""
    fmt = spec.get("format") or "imagefolder"
    if fmt not in FORMATS:
        raise BenchmarkError(f"{benchmark_dir}: unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt in LABELLED_SPLITS:
        from compo.evaluate.labelled import read_split

        raw = read_split(spec, benchmark_dir, split or spec.get("split", "test"))
        if raw is None:
            return None
        names = raw.class_ids if raw.targets is not None or not named else class_names(
            spec, benchmark_dir, raw.class_ids, own=raw.own_names)
        return LabelledImages(raw.class_ids, names, raw.items, raw.labels, paths=raw.images, targets=raw.targets,
                              skipped=raw.skipped, skip_examples=raw.skip_examples)
    if split == "val":
        return None  # an ImageFolder or CIFAR has no validation split: the probe holds out part of train
    if fmt == "imagefolder":  # the probe's split folders (`splits` renames them: ImageNet's test is val/)
        folder = (spec.get("splits") or {}).get(split) or split
        return _image_folder(spec, benchmark_dir, benchmark_dir / folder if split else benchmark_dir, named)
    return _cifar(spec, benchmark_dir, fmt, train=split == "train")


input_files = classification_files


# Inside `shared_split_features` (one evaluation job: `compo.evaluate.evaluate_many`), the float32 image
# embeddings of each labelled split embedded so far, per model: a split read by several benchmarks (ImageNet's
# val/ by zero-shot and both probes, its train/ by the two probes) is decoded and encoded once per job (issue 42).
# The encoder's output is float32, so keeping it in float32 loses nothing. Outside a job nothing is kept (files
# may change between two calls).
_SPLIT_FEATURES: dict[tuple, tuple[torch.Tensor, dict[Any, int], dict[Any, str]]] | None = None


@contextmanager
def shared_split_features() -> Iterator[None]:
    """Within the block, a labelled split is embedded once per model and shared by the benchmarks reading it."""
    global _SPLIT_FEATURES
    outer, _SPLIT_FEATURES = _SPLIT_FEATURES, {} if _SPLIT_FEATURES is None else _SPLIT_FEATURES
    try:
        yield
    finally:
        _SPLIT_FEATURES = outer


def _split_key(data: LabelledImages) -> tuple:
    if data.pixels is not None:
        return ("pixels", data.pixels.shape, hashlib.sha256(np.ascontiguousarray(data.pixels).data).hexdigest())
    assert data.paths is not None
    return ("paths", tuple(data.paths))


def _embed_split(loaded: LoadedModel, data: LabelledImages) -> tuple[torch.Tensor, dict[Any, int], dict[Any, str]]:
    """Float32 embeddings of a split's distinct images, the row of each readable image, the skip reason of each
    unreadable one (CIFAR: every sample by index); inside `shared_split_features`, computed once per model and
    split."""
    import torch

    from compo.evaluate.scoring import encode_image_files
    from compo.models import encode_images

    key = None if _SPLIT_FEATURES is None else (id(loaded.model), *_split_key(data))
    if key in (_SPLIT_FEATURES or {}):
        return _SPLIT_FEATURES[key]
    if data.pixels is not None:
        chunks = [encode_images(loaded, [Image.fromarray(a) for a in data.pixels[start : start + BATCH]])
                  for start in range(0, len(data.pixels), BATCH)]
        embedded = (torch.cat(chunks), {index: index for index in range(len(data.pixels))}, {})
    else:
        emb, row, failed = encode_image_files(loaded, data.paths)
        embedded = (emb.float(), row, failed)
    if _SPLIT_FEATURES is not None:
        _SPLIT_FEATURES[key] = embedded
    return embedded


def embed_labelled(loaded: LoadedModel, data: LabelledImages, skipped: Counter,
                   examples: dict[str, list[str]]) -> tuple[torch.Tensor, list[int]]:
    """Image embeddings [n_kept, D] (float64) and the sample indices they belong to; unreadable files
    are counted in `skipped`, with the samples its reader skipped. A split already embedded by this model in this
    job is not decoded again."""
    skipped.update(data.skipped)
    for reason, found in data.skip_examples.items():
        examples[reason] += found
    emb, row, failed = _embed_split(loaded, data)
    if data.pixels is not None:
        return emb.double(), list(range(len(data.pixels)))
    assert data.paths is not None
    for path, reason in failed.items():
        skipped[reason] += 1
        examples[reason].append(str(path))
    kept = [index for index, path in enumerate(data.paths) if path in row]
    return emb[[row[data.paths[index]] for index in kept]].double(), kept


# --- ELEVATER's metrics (vision_benchmark/evaluation/metric.py: `roc_auc`, `11point_mAP`) -------------------------

def elevater_probabilities(scores: torch.Tensor) -> np.ndarray:
    """[N, C] class probabilities as ELEVATER scores them: softmax over classes of 100 x cosine similarity."""
    import torch

    return torch.softmax(ELEVATER_SCALE * scores.double(), dim=1).numpy()


def roc_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve of `score` for the boolean `positive`: the chance that a positive outscores a
    negative, a tie counting one half (the Mann-Whitney statistic; what scikit-learn's roc_auc_score gives, which
    ELEVATER calls with the positive class's probability)."""
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        raise BenchmarkError(f"roc_auc needs positives and negatives, got {n_pos} and {n_neg}")
    _, inverse, counts = np.unique(np.asarray(score, dtype=float), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # tied scores share their mean rank: a tie counts half
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def map_n_points(targets: np.ndarray, scores: np.ndarray, n_points: int = MAP_POINTS) -> float:
    """ELEVATER's N-point interpolated mean average precision (vision-evaluation's
    MeanAveragePrecisionNPointsEvaluator): per class with a positive, the mean over the recall levels
    linspace(1, 0, n_points) of the highest precision at a recall >= the level on the class's precision-recall
    curve, the mean over those classes. The curve (scikit-learn's precision_recall_curve, as that code uses) has
    a point at each distinct score (tied images enter together) and ends at recall 0 with precision 1, so the
    level 0 always counts precision 1 (the VOC devkit's 11-point AP has no such end point)."""
    targets, scores = np.asarray(targets, dtype=bool), np.asarray(scores, dtype=float)
    if targets.shape != scores.shape or targets.ndim != 2:
        raise BenchmarkError(f"map_n_points: targets {targets.shape} and scores {scores.shape} must be one [N, C]")
    levels = np.linspace(1, 0, n_points)  # the same floats as ELEVATER's, compared as it compares them
    per_class = []
    for c in np.flatnonzero(targets.any(axis=0)):
        order = np.argsort(-scores[:, c], kind="stable")
        ranked, hits = scores[order, c], targets[order, c]
        true_pos, false_pos = np.cumsum(hits), np.cumsum(~hits)
        cuts = np.r_[np.flatnonzero(np.diff(ranked) != 0), len(ranked) - 1]  # the last image of each score
        precision = np.r_[true_pos[cuts] / (true_pos[cuts] + false_pos[cuts]), 1.0]
        recall = np.r_[true_pos[cuts] / true_pos[-1], 0.0]
        per_class.append(np.mean([precision[recall >= level].max() for level in levels]))
    if not per_class:
        raise BenchmarkError("map_n_points: no image has a label")
    return float(np.mean(per_class))


TIE_RULES = ("pessimistic", "first")


def tie_rule(spec: dict[str, Any]) -> str:
    """How a tie between the true class and another is scored: benchmark key `ties`, by default `first` for
    ELEVATER's sets (its scorer's argsort puts the first tied class first) and `pessimistic` (counted against
    the model, the project's rule) for the others."""
    rule = spec.get("ties") or ("first" if spec.get("format") == "elevater" else "pessimistic")
    if rule not in TIE_RULES:
        raise BenchmarkError(f"benchmark key 'ties': {rule!r} is not one of {', '.join(TIE_RULES)}")
    return rule


def class_ranks(spec: dict[str, Any], scores: torch.Tensor, labels: torch.Tensor, true_scores: torch.Tensor,
                wrong: torch.Tensor) -> torch.Tensor:
    """Each image's rank of its true class [N] among the class scores [N, C], ties scored by `tie_rule`."""
    from compo.evaluate.scoring import first_max_rank, pessimistic_rank

    if tie_rule(spec) == "first":
        return first_max_rank(scores, labels)
    return pessimistic_rank(true_scores, scores, wrong)


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    import torch

    templates = prompt_templates(spec, templates)
    data = load_split(spec, benchmark_dir)
    assert data is not None
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    images, kept = embed_labelled(loaded, data, skipped, examples)
    log_skips("zeroshot", skipped, examples)
    if not kept:
        raise BenchmarkError(f"{benchmark_dir}: every image is missing or unreadable")
    scores = images @ class_embeddings(loaded, data.class_names, templates).T
    if data.targets is not None:
        return _multilabel(spec, data, kept, scores, skipped)

    labels = torch.tensor([data.labels[index] for index in kept])
    true_scores = scores.gather(1, labels[:, None]).squeeze(1)
    wrong = torch.ones_like(scores, dtype=torch.bool).scatter_(1, labels[:, None], False)
    ranks = class_ranks(spec, scores, labels, true_scores, wrong)
    best_wrong = scores.masked_fill(~wrong, float("-inf")).max(dim=1).values

    predictions = pd.DataFrame({
        "subset": [data.class_ids[label] for label in labels.tolist()],
        "item": [data.items[index] for index in kept],
        "correct": (ranks == 1).numpy(),
        "score_pos": true_scores.numpy(),
        "score_neg": best_wrong.numpy(),
        "rank": ranks.numpy(),
    })
    n = len(predictions)
    metrics = {"top1": Metric(float((ranks <= 1).double().mean()), n)}
    if len(data.class_ids) > 5:
        metrics["top5"] = Metric(float((ranks <= 5).double().mean()), n)
    metrics["mean_per_class"] = Metric(float(predictions.groupby("subset")["correct"].mean().mean()), n)
    if len(data.class_ids) == 2:  # label 1 is the positive class (Hateful Memes' hateful)
        metrics["roc_auc"] = Metric(roc_auc(labels.numpy() == 1, elevater_probabilities(scores)[:, 1]), n)
    return BenchmarkResult(PROTOCOL, headline(spec, metrics), metrics, predictions, dict(skipped))


def _multilabel(spec: dict[str, Any], data: LabelledImages, kept: list[int], scores: torch.Tensor,
                skipped: Counter) -> BenchmarkResult:
    import torch

    from compo.evaluate.scoring import multilabel_scores

    assert data.targets is not None
    targets = data.targets[kept]
    predictions, metrics = multilabel_scores(scores, torch.from_numpy(targets), [data.items[i] for i in kept],
                                             skipped)
    metrics["map_11point"] = Metric(map_n_points(targets, elevater_probabilities(scores)), len(kept))
    return BenchmarkResult(PROTOCOL, headline(spec, metrics, "map_11point"), metrics, predictions, dict(skipped))


def headline(spec: dict[str, Any], metrics: dict[str, Metric], default: str = "top1") -> str:
    """The metric a benchmark reports first (`spec["headline"]`, e.g. Table 9's mean per class)."""
    name = spec.get("headline") or default
    if name not in metrics:
        raise BenchmarkError(f"benchmark key 'headline': {name!r} is not one of its metrics "
                             f"({', '.join(metrics)})")
    return name


# test images of the released sets, by format (or by dataset: paper_fixtures' stand-ins keep the real set's name)
RELEASED_TEST = {"imagenet1k": 50_000, "cifar10": 10_000, "cifar100": 10_000, "food101": 25_250,
                 "oxford_pets": 3_669, "flowers102": 6_149, "sun397": 19_850, "stanford_cars": 8_041, "dtd": 1_880,
                 "caltech101": 6_085, "fgvc_aircraft": 3_333, "coco_multilabel": 40_504,
                 # CLIP_benchmark's dataset names of the same test sets (format wds: its hub exports)
                 "pets": 3_669, "flowers": 6_149, "cars": 8_041}
# ELEVATER's test splits (format elevater; its toolkit's vision_datasets.json, test num_images), by dataset name
ELEVATER_TEST = {"voc-2007-classification": 4_952, "gtsrb": 12_630, "country211": 21_100, "rendered-sst2": 1_821,
                 "kitti-distance": 711, "eurosat_clip": 5_000, "resisc45_clip": 25_200, "caltech-101": 6_084,
                 "cifar-10": 10_000, "cifar-100": 10_000, "dtd": 1_880, "fgvc-aircraft-2013b-variants102": 3_333,
                 "food-101": 25_250, "mnist": 10_000, "oxford-flower-102": 6_149, "oxford-iiit-pets": 3_669,
                 "patch-camelyon": 32_768, "stanford-cars": 8_041, "fer-2013": 3_589, "hateful-memes": 500,
                 "imagenet-1k": 50_000}


def release_size(spec: dict[str, Any]) -> BenchmarkSize | None:
    """Its test images (class prompts are not counted: they take seconds)."""
    if (spec.get("format") or spec.get("dataset")) == "elevater":
        test = ELEVATER_TEST.get(spec.get("dataset"))
    else:
        test = RELEASED_TEST.get(spec.get("format")) or RELEASED_TEST.get(spec.get("dataset"))
    return BenchmarkSize(test, 0, 0) if test else None


SPLIT_NAME = {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_.+-]+$"}
CLASSIFICATION_HEADLINES = ("top1", "top5", "mean_per_class", "map")
# the keys of a labelled release, read alike by zero-shot classification and the linear probe (compo.evaluate.labelled)
LABELLED_KEYS = {
    "format": Key({"enum": list(CLASSIFICATION_FORMATS)},
                  "`imagefolder` (default; also ImageNet's synset folders), `cifar10`, `cifar100` (python pickles, as "
                  "torchvision reads them, through a restricted unpickler), the releases as torchvision extracts them "
                  "under `path`: `food101`, `oxford_pets`, `flowers102`, `sun397` (with the Partitions lists), "
                  "`stanford_cars`, `dtd`, `fgvc_aircraft`, `caltech101`; `wds` (CLIP_benchmark's webdataset export: "
                  "`<split>/nshards.txt`, tar shards, `classnames.txt`); `coco_multilabel` (COCO "
                  "`annotations/instances_<split>.json`); `elevater` (ELEVATER's releases as its toolkit downloads "
                  "them: images read inside their zips, labels the release's ids); layouts in "
                  "`compo/evaluate/labelled.py`", "torchvision, CLIP_benchmark, ELEVATER"),
    "verify": Key({"type": "boolean"}, "CIFAR: check each file's md5 against torchvision's list (default true); false "
                  "reads a re-packed copy (either way through the restricted unpickler)", "torchvision"),
    "splits": Key({"type": "object", "additionalProperties": False,
                   "properties": {role: SPLIT_NAME for role in ("train", "val", "test")}},
                  "the release's split of each role `{train, val, test}` (defaults per format: Table 9's, e.g. Pets "
                  "`trainval`; a `val` split picks the probe's L2 penalty, then it refits on train + val; null: none)",
                  "seed 000 Table 9, Kornblith et al. 2019"),
    "partition": Key({"type": "integer", "minimum": 1, "maximum": 10}, "SUN397's / DTD's partition (default 1)",
                     "torchvision"),
    "train_per_class": Key(POSITIVE_INT, "Caltech101's training images drawn per class with `seed` (default 30; "
                           "the rest is its test set)", "VTAB, Kornblith et al. 2019"),
    "seed": Key({"type": "integer", "minimum": 0}, "the seed of Caltech101's draw (default 0)"),
    "classnames": Key({"type": ["string", "null"]}, "the class-name file (folder -> name JSON, list JSON, `.txt`, or "
                      "CLIP_benchmark's `en_classnames.json`, read at `dataset`)", "CLIP_benchmark"),
    "dataset": Key({"type": ["string", "null"]}, "the dataset's name in the class-name, templates and DATASET_INFO "
                   "files (e.g. `imagenet1k`, `cifar10`)", "CLIP_benchmark, ELEVATER"),
    "dataset_info": Key({"type": "string"}, "format `elevater`: ELEVATER's DATASET_INFO json (its toolkit's "
                        "`vision_benchmark/resources/datasets/vision_datasets.json`), read at `dataset`; `path` is "
                        "the folder its `root_folder`s lie under", "ELEVATER, vision-datasets"),
}
ZEROSHOT_KEYS = {
    **LABELLED_KEYS,
    "attribute": Key({"enum": list(WORLD_ZEROSHOT_ATTRIBUTES)}, "source world: the object attribute classified"),
    "split": Key({"enum": ["train", "val", "test"]}, "the role of the split scored (default `test`)"),
    "templates": Key({"type": ["string", "null"]}, "CLIP_benchmark's per-dataset templates file, read at `dataset` "
                     "(default: the config's `zeroshot_templates`)", "CLIP_benchmark, seed 000 Table 13"),
    "headline": Key({"enum": [*CLASSIFICATION_HEADLINES, "roc_auc", "map_11point"]},
                    "the reported metric: `top1` (default), `top5`, `mean_per_class`, `map` (multi-label), `roc_auc` "
                    "(two classes) and `map_11point` (multi-label zero-shot default): ELEVATER's, on its softmax of "
                    "100 x cosine", "ELEVATER `vision_benchmark/evaluation/metric.py`"),
    "ties": Key({"enum": list(TIE_RULES)}, "a tie of the true class with another: `pessimistic` (counted against the "
                "model; the default) or `first` (the first tied class wins, as ELEVATER's scorer: the default of "
                "`format: elevater`)", "ELEVATER `vision_benchmark/evaluation/metric.py` `accuracy`"),
}

def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection] | None:
    """Top-k: an image scores when its class ranks within k; mean per class: top-1 with each class weighted equally
    (mAP, ROC AUC: no mean of row scores)."""
    if metric == "mean_per_class":
        return [Selection(None, macro=True)]
    if metric.startswith("top"):
        return [Selection(None, at_k=int(metric[3:]))]
    return None


BENCHMARKS = (
    Benchmark(kind="zeroshot", source="CLIP_benchmark's zeroshot_classification (ELEVATER's toolkit for its sets)",
              run=run, files=lambda spec, folder: classification_files(spec, folder, (spec.get("split", "test"),)),
              images=None, size=release_size, headline="top1", subsets=(), chance=None, selections=selections,
              downloads=labelled_downloads,
              keys=ZEROSHOT_KEYS),
)
