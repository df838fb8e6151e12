"""The real benchmarks' file layouts that readers and the world's writer share (no torch: the kinds' declarations,
`compo.evaluate.kinds`, list a benchmark's files from them while Snakemake builds the DAG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compo.sources import (
    CLIP_BENCHMARK,
    CLIP_BENCHMARK_CLASSNAMES,
    COCO_2014,
    DCI,
    DOCCI_DESCRIPTIONS,
    DOCCI_IMAGES,
    ELEVATER,
    KARPATHY_FILES,
    KARPATHY_IMAGES,
    SHAREGPT4V_JSON,
    TORCHVISION,
)


class BenchmarkError(ValueError):
    """A benchmark file is malformed; the message names the file and the item."""


SUGARCREPE_SUBSETS = ("replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att")
# the paper's replace / swap / add columns (their metrics: the macro mean of these sub-tasks; compo.evaluate.sugarcrepe)
SUGARCREPE_GROUPS = {"replace": ("replace_obj", "replace_att", "replace_rel"), "swap": ("swap_obj", "swap_att"),
                     "add": ("add_obj", "add_att")}
SUGARCREPE_PP_SUBSETS = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
CLASSNAMES = "classnames.json"         # zero-shot and linear probe: {folder: class name}
DATASET_JSON = "dataset.json"          # Karpathy format, the world's name; real files keep theirs (spec "file")
WINOGROUND_EXAMPLES = "examples.jsonl"
ARO_RELATION_FILE = "visual_genome_relation.json"
ARO_ATTRIBUTION_FILE = "visual_genome_attribution.json"
VALSE_PIECES = ("existence", "plurals", "counting-hard", "counting-small-quant", "counting-adversarial",
                "relations", "action-replacement", "actant-swap", "coreference-standard", "coreference-hard",
                "foil-it")
# The released python versions of CIFAR (cs.toronto.edu/~kriz/cifar.html), as torchvision's readers open
# them: folder, training batches, test batch, class-name file.
CIFAR_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), "batches.meta"),
    "cifar100": ("cifar-100-python", ("train",), ("test",), "meta"),
}
# Labelled image sets in the layouts users have (compo.evaluate.labelled reads them). `path` is the
# folder given to torchvision's dataset class as `root` (CLIP_benchmark's --dataset_root), so the
# release sits in the sub-folder torchvision extracts it to. Per format: the release's split names of
# each role the probes ask for (train: the probe's training set, val: its hyper-parameter split when the
# release has one, test), overridable with the benchmark key `splits`.
LABELLED_SPLITS: dict[str, dict[str, str]] = {
    "food101": {"train": "train", "test": "test"},
    "oxford_pets": {"train": "trainval", "test": "test"},
    "flowers102": {"train": "train", "val": "val", "test": "test"},
    "sun397": {"train": "Training", "test": "Testing"},
    "stanford_cars": {"train": "train", "test": "test"},
    "dtd": {"train": "train", "val": "val", "test": "test"},
    "fgvc_aircraft": {"train": "train", "val": "val", "test": "test"},
    "caltech101": {"train": "train", "test": "test"},
    "wds": {"train": "train", "test": "test"},
    "coco_multilabel": {"train": "train2014", "test": "val2014"},
    "elevater": {"train": "train", "test": "test"},  # ELEVATER draws its validation images from train
}
CALTECH_FOLDER = "caltech101/101_ObjectCategories"
# Where each labelled format's release comes from (`compo inputs --template` writes it beside the key): key leaf ->
# "address; layout"; every format of CLASSIFICATION_FORMATS has its `path` (tests/test_benchmark_kinds.py)
LABELLED_DOWNLOADS: dict[str, dict[str, str]] = {
    "imagefolder": {"path": "image-net.org ILSVRC2012 train / val; one synset folder per class"},
    "cifar10": {"path": "cs.toronto.edu/~kriz/cifar-10-python.tar.gz; cifar-10-batches-py/"},
    "cifar100": {"path": "cs.toronto.edu/~kriz/cifar-100-python.tar.gz; cifar-100-python/"},
    "food101": {"path": TORCHVISION.format("Food101") + ": food-101/"},
    "oxford_pets": {"path": TORCHVISION.format("OxfordIIITPet") + ": oxford-iiit-pet/"},
    "flowers102": {"path": TORCHVISION.format("Flowers102") + ": flowers-102/"},
    "sun397": {"path": "vision.princeton.edu/projects/2010/SUN (SUN397.tar.gz, Partitions.zip); SUN397/ with "
                       "Partitions/"},
    "stanford_cars": {"path": TORCHVISION.format("StanfordCars") + " (the Kaggle mirror): stanford_cars/"},
    "dtd": {"path": TORCHVISION.format("DTD") + ": dtd/dtd/"},
    "caltech101": {"path": TORCHVISION.format("Caltech101") + ": caltech101/101_ObjectCategories/"},
    "fgvc_aircraft": {"path": TORCHVISION.format("FGVCAircraft") + ": fgvc-aircraft-2013b/"},
    "wds": {"path": "`clip_benchmark_export_wds --dataset vtab/<task> --split <split>` for each split the entry names "
                    "(pip install clip_benchmark); <split>/nshards.txt, <split>/0.tar, classnames.txt"},
    "coco_multilabel": {"path": "cocodataset.org annotations_trainval2014.zip; annotations/", "image_root": COCO_2014},
    "elevater": {"path": f"the ELEVATER toolkit's datasets ({ELEVATER}, vision-datasets download); DATASET.ROOT",
                 "dataset_info": f"{ELEVATER} vision_benchmark/resources/datasets/vision_datasets.json",
                 "classnames": f"{ELEVATER} vision_benchmark/datasets/prompts.py",
                 "templates": f"{ELEVATER} vision_benchmark/datasets/prompts.py"},
}
CLASSIFICATION_FORMATS = ("imagefolder", "cifar10", "cifar100", *LABELLED_SPLITS)
LONG_RETRIEVAL_FORMATS = ("karpathy", "urban1k", "docci", "dci", "sharegpt4v", "iiw")
# ImageInWords (github.com/google/imageinwords datasets/): each human-authored subset's folder (its `data.jsonl`)
# -> the folder its images sit in under the benchmark's path, as FLAIR's and LoTLIP's `imageinwords/` layout has them
IIW_SUBSETS = {"IIW-400": "docci_aar", "DOCCI_Test": "docci", "DCI_Test": "dci"}
IIW_FILE = "data.jsonl"
LONG_RETRIEVAL_FILES = {"docci": "docci_descriptions.jsonlines",
                        "sharegpt4v": "share-captioner_coco_lcs_sam_1246k_1107.json"}
# Where each long-caption format's release comes from (as LABELLED_DOWNLOADS); `urban1k` is a hub release
# `compo prefetch` fetches
LONG_RETRIEVAL_DOWNLOADS: dict[str, dict[str, str]] = {
    "karpathy": {"path": KARPATHY_FILES, "image_root": KARPATHY_IMAGES},
    "urban1k": {"path": "huggingface.co/datasets/BeichenZhang/Urban1k (compo prefetch); Urban1k/"},
    "docci": {"path": f"{DOCCI_DESCRIPTIONS}; its folder", "image_root": DOCCI_IMAGES},
    "dci": {"path": f"{DCI}; densely_captioned_images/ with splits.json"},
    "sharegpt4v": {"path": SHAREGPT4V_JSON, "image_root": "github.com/ShareGPT4Omni/ShareGPT4V docs/Data.md; images"},
    "iiw": {"path": "github.com/google/imageinwords datasets/; IIW-400/data.jsonl, ...",
            "image_root": "DOCCI's AAR images (storage.googleapis.com/docci); docci_aar/"},
}


def labelled_downloads(spec: dict[str, Any]) -> dict[str, str]:
    """Where a zero-shot or probe set's files come from, by its format (default `imagefolder`)."""
    return {"classnames": CLIP_BENCHMARK_CLASSNAMES,
            "templates": f"{CLIP_BENCHMARK}en_zeroshot_classification_templates.json; the file",
            **LABELLED_DOWNLOADS.get(str(spec.get("format") or "imagefolder"), {})}


def long_retrieval_downloads(spec: dict[str, Any]) -> dict[str, str]:
    """Where a long-caption retrieval set's files come from, by its format (default `karpathy`)."""
    return LONG_RETRIEVAL_DOWNLOADS[long_retrieval_format(spec)]
IMAGECODE_FILE = "valid_data.json"  # ImageCoDe's labelled release (the test labels are hidden)
# VL-CheckList: the 13 subtasks vl_compo / FSC-CLIP report -> the release's corpus folder under corpus/v1/ and
# the corpus yaml files in it (one per source; each names its annotation JSON and image folder)
_LOCATED = ("hake", "swig_agent", "swig_destination", "swig_item", "swig_tool", "vg_obj", "vg_subj")
VL_CHECKLIST_SUBTASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{f"Object_{kind}_{where}": (f"Object/{kind}/{where}", _LOCATED)
       for kind, places in (("Location", ("center", "margin", "mid")), ("Size", ("large", "medium", "small")))
       for where in places},
    **{f"Attribute_{a}": (f"Attribute/{a}", ("vaw", "vg")) for a in ("action", "color", "material", "size", "state")},
    "Relation_action": ("Relation/action", ("hake", "swig", "vg")),
    "Relation_spatial": ("Relation/spatial", ("vg",)),
}
VL_CHECKLIST_CORPUS = "corpus/v1"
# What's Up (github.com/amitakamath/whatsup_vlms): vl_compo's subtask name -> the release's annotation file
WHATSUP_FILES = {"WhatsUp_A": "controlled_images_dataset.json", "WhatsUp_B": "controlled_clevr_dataset.json",
                 "COCO_QA_ONE": "coco_qa_one_obj.json", "COCO_QA_TWO": "coco_qa_two_obj.json",
                 "VG_QA_ONE": "vg_qa_one_obj.json", "VG_QA_TWO": "vg_qa_two_obj.json"}
# SPEC (HF wjpoom/SPEC data.zip): its subset folders, each with one file per direction
SPEC_SUBSETS = ("absolute_size", "relative_size", "absolute_spatial", "relative_spatial", "existence", "count")
SPEC_DIRECTIONS = {"i2t": "image2text.json", "t2i": "text2image.json"}
SVO_PROBES_FILE = "svo_probes.csv"  # github.com/google-deepmind/svo_probes
# CREPE-Productivity (github.com/RAIVNLab/CREPE data/prod_hard_negatives.zip): per negative type one CSV per complexity
CREPE_TYPES = ("atom", "swap", "negate")
CREPE_COMPLEXITIES = tuple(range(4, 13))
COCO_CF_FILE = "data/examples.jsonl"  # Intel/COCO-Counterfactuals on the Hugging Face Hub


def crepe_file(benchmark_dir: Path, kind: str, complexity: int) -> Path:
    return benchmark_dir / "prod_hard_negatives" / kind / f"prod_vg_hard_negs_{kind}_complexity_{complexity}.csv"


def eqben_file(spec: dict[str, Any], benchmark_dir: Path) -> Path:
    """EqBen's annotation JSON: `spec["file"]` (the release names no default for its Winoground-style file)."""
    if not isinstance(spec.get("file"), str) or not spec["file"]:
        raise BenchmarkError("eqben: set 'file' to the annotation JSON's name under the benchmark's path")
    return benchmark_dir / spec["file"]


def whatsup_subsets(spec: dict[str, Any]) -> list[str]:
    """The What's Up subsets a benchmark entry scores (config `subsets`, default all six; the world's: WhatsUp_A)."""
    names = spec.get("subsets", list(WHATSUP_FILES))
    if (not isinstance(names, list) or not names or len(set(names)) < len(names)
            or any(n not in WHATSUP_FILES for n in names)):
        raise BenchmarkError(f"whatsup: 'subsets' must be a non-empty list of distinct names among "
                             f"{', '.join(WHATSUP_FILES)}; got {names!r}")
    return names


def valse_pieces(spec: dict[str, Any]) -> list[str]:
    """The VALSE piece files a benchmark entry scores (config `pieces`, default all of them)."""
    pieces = spec.get("pieces", VALSE_PIECES)
    if not isinstance(pieces, list | tuple) or not pieces or not all(isinstance(p, str) and p for p in pieces):
        raise BenchmarkError(f"valse: 'pieces' must be a non-empty list of piece names, got {pieces!r}")
    return list(pieces)


def karpathy_file(spec: dict[str, Any], benchmark_dir: Path) -> Path:
    """The Karpathy-format file of a benchmark: `spec["file"]` (e.g. dataset_coco.json) or dataset.json."""
    return benchmark_dir / (spec.get("file") or DATASET_JSON)


def cifar_files(name: str, benchmark_dir: Path, train: bool) -> list[Path]:
    """The pickles torchvision's reader opens for a CIFAR split, and the class-name file."""
    folder, train_files, test_files, meta = CIFAR_LAYOUT[name]
    return [benchmark_dir / folder / file for file in (*(train_files if train else test_files), meta)]


def split_name(spec: dict[str, Any], role: str) -> str | None:
    """The release's name of a role's split (`spec["splits"]` over the format's default; None: the format
    has no such split, e.g. no validation split)."""
    fmt = spec.get("format") or "imagefolder"
    names = {**LABELLED_SPLITS.get(fmt, {}), **(spec.get("splits") or {})}
    return names.get(role)


def partition(spec: dict[str, Any]) -> int:
    """SUN397's / DTD's numbered partition (default 1: Kornblith et al.'s and CLIP's)."""
    number = spec.get("partition", 1)
    if not isinstance(number, int) or not 1 <= number <= 10:
        raise BenchmarkError(f"benchmark key 'partition' must be 1..10 (SUN397 / DTD), got {number!r}")
    return number


def labelled_files(spec: dict[str, Any], root: Path, role: str) -> list[Path]:
    """The annotation files (or folders) a labelled-set format reads for one role's split."""
    fmt = spec.get("format") or "imagefolder"
    split = split_name(spec, role)
    if split is None:
        return []
    if fmt == "food101":
        return [root / "food-101" / "meta" / f"{split}.json"]
    if fmt == "oxford_pets":
        return [root / "oxford-iiit-pet" / "annotations" / f"{split}.txt"]
    if fmt == "flowers102":
        return [root / "flowers-102" / "imagelabels.mat", root / "flowers-102" / "setid.mat"]
    if fmt == "sun397":
        return [root / "SUN397" / "ClassName.txt", root / "Partitions" / f"{split}_{partition(spec):02d}.txt"]
    if fmt == "stanford_cars":
        annotations = "devkit/cars_train_annos.mat" if split == "train" else f"cars_{split}_annos_withlabels.mat"
        return [root / "stanford_cars" / "devkit" / "cars_meta.mat", root / "stanford_cars" / annotations]
    if fmt == "dtd":
        return [root / "dtd" / "dtd" / "labels" / f"{split}{partition(spec)}.txt"]
    if fmt == "fgvc_aircraft":
        data = root / "fgvc-aircraft-2013b" / "data"
        return [data / "variants.txt", data / f"images_variant_{split}.txt"]
    if fmt == "caltech101":
        return [root / CALTECH_FOLDER]
    if fmt == "wds":
        return [root / split / "nshards.txt"]
    if fmt == "coco_multilabel":
        return [root / "annotations" / f"instances_{split}.json"]
    if fmt == "elevater":  # its index and label files are named inside the DATASET_INFO json
        return [Path(spec["dataset_info"])] if spec.get("dataset_info") else []
    return []


def classnames_file(spec: dict[str, Any], benchmark_dir: Path) -> Path | None:
    """The class-name file a benchmark reads (None: CIFAR's own names)."""
    if spec.get("classnames"):
        return Path(spec["classnames"])
    return None if (spec.get("format") or "imagefolder") != "imagefolder" else benchmark_dir / CLASSNAMES


def classification_files(spec: dict[str, Any], benchmark_dir: Path, splits: tuple[str | None, ...]) -> list[Path]:
    """The files a classification benchmark reads besides ImageFolder images (rules declare them)."""
    fmt = spec.get("format") or "imagefolder"
    if fmt in ("cifar10", "cifar100"):
        files = [path for split in splits for path in cifar_files(fmt, benchmark_dir, split == "train")]
    else:
        roles = ["test" if split is None else split for split in splits]
        files = [path for role in roles for path in labelled_files(spec, benchmark_dir, role)]
    names = classnames_file(spec, benchmark_dir)
    files += [names] if names is not None else []
    files += [Path(spec["templates"])] if spec.get("templates") else []
    return list(dict.fromkeys(files))


def long_retrieval_format(spec: dict[str, Any]) -> str:
    fmt = spec.get("format") or "karpathy"
    if fmt not in LONG_RETRIEVAL_FORMATS:
        raise BenchmarkError(f"long_retrieval: unknown format {fmt!r} (expected one of "
                             f"{', '.join(LONG_RETRIEVAL_FORMATS)})")
    return fmt


def iiw_subsets(spec: dict[str, Any]) -> list[str]:
    """The ImageInWords subsets a benchmark entry scores as one test set (config `subsets`, default IIW-400)."""
    names = spec.get("subsets", ["IIW-400"])
    if (not isinstance(names, list) or not names or len(set(names)) < len(names)
            or any(n not in IIW_SUBSETS for n in names)):
        raise BenchmarkError(f"long_retrieval iiw: 'subsets' must be a non-empty list of distinct names among "
                             f"{', '.join(IIW_SUBSETS)}; got {names!r}")
    return names


def long_retrieval_files(spec: dict[str, Any], benchmark_dir: Path) -> list[Path]:
    """The files (or folders) that define a long-caption test set (rules declare them as the inputs)."""
    if long_retrieval_format(spec) == "iiw":
        return [benchmark_dir / subset / IIW_FILE for subset in iiw_subsets(spec)]
    return [long_retrieval_file(spec, benchmark_dir)]


def long_retrieval_file(spec: dict[str, Any], benchmark_dir: Path) -> Path:
    """The file (or folder) that names a long-caption test set in messages (iiw: its first subset's file)."""
    fmt = long_retrieval_format(spec)
    if fmt == "iiw":
        return long_retrieval_files(spec, benchmark_dir)[0]
    if fmt == "karpathy":
        return karpathy_file(spec, benchmark_dir)
    if fmt == "urban1k":
        return benchmark_dir / "caption"
    if fmt == "dci":
        return benchmark_dir / "splits.json"
    return benchmark_dir / (spec.get("file") or LONG_RETRIEVAL_FILES[fmt])


def vl_checklist_subtasks(spec: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The VL-CheckList subtasks a benchmark entry scores (config `subtasks`, default all 13) with their corpus."""
    names = spec.get("subtasks", list(VL_CHECKLIST_SUBTASKS))
    unknown = [n for n in names if n not in VL_CHECKLIST_SUBTASKS] if isinstance(names, list) else names
    if not isinstance(names, list) or not names or unknown:
        raise BenchmarkError(f"vl_checklist: 'subtasks' must be a non-empty list of "
                             f"{', '.join(VL_CHECKLIST_SUBTASKS)}; got {unknown!r}")
    return {name: VL_CHECKLIST_SUBTASKS[name] for name in names}


def write_benchmark_set(benchmarks: dict[str, list[str]], out: str | Path) -> None:
    """Record the files of an evaluation set ({benchmark: files}) with their sizes and modification times in
    `out`. The evaluation jobs of the set read this one file in the DAG instead of every benchmark file each (in
    the paper study ~200 files x 242 jobs), and rerun when it does: when any of the files changes."""
    from compo.io import write_json

    record: dict[str, list[dict[str, Any]]] = {}
    for name, files in benchmarks.items():
        record[name] = []
        for file in files:
            try:
                stat = Path(file).stat()
            except OSError as error:
                raise BenchmarkError(f"benchmark {name!r}: cannot read {file} ({error.strerror})") from error
            record[name].append({"path": file, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    write_json({"benchmarks": record}, out)
