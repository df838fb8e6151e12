"""Pointing config/paper.yaml at files that exist here: the raw-format fixtures and world benchmarks.

Used by tests/test_paper_config.py and tools/bench_dryrun.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml
from classification_fixtures import WRITERS

from compo.evaluate.files import LABELLED_SPLITS, VALSE_PIECES
from compo.world import generate_benchmarks

REPO = Path(__file__).resolve().parents[1]
RAW = REPO / "tests" / "fixtures" / "raw"

# Dataset paths of config/paper.yaml replaced by the fixtures in the same raw formats.
FIXTURE_DATASETS = {
    "coco": {"path": RAW / "coco" / "dataset_coco.json", "image_root": RAW / "coco"},
    "coco-train-longest": {"path": RAW / "coco" / "dataset_coco.json", "image_root": RAW / "coco"},
    "coco-100k": {"path": RAW / "coco" / "dataset_coco.json", "image_root": RAW / "coco"},
    # FSC-CLIP's released webdataset subsets stand in as CC3M / LAION-COCO tables here (their layout is tested
    # fetched and read in tests/test_prefetch_data.py)
    "cc3m-100k": {"source": "cc3m", "path": RAW / "cc3m" / "cc3m_coca_captions.tsv", "image_root": RAW / "cc3m"},
    "laion-coco-100k": {"source": "laion-coco", "path": RAW / "laion-coco" / "part-00000-laion-coco.parquet",
                        "image_root": RAW / "laion-coco" / "img2dataset"},
    "cc3m-dreamlip": {"path": RAW / "cc3m" / "cc3m_3long_3short_1raw_captions_url.csv",
                      "image_root": RAW / "cc3m" / "images"},
    "sharegpt4v": {"path": RAW / "sharegpt4v" / "share-captioner_coco_lcs_sam_1246k_1107.json",
                   "image_root": RAW / "sharegpt4v", "holdout": 1},
    "docci": {"path": RAW / "docci" / "docci_descriptions.jsonlines", "image_root": RAW / "docci" / "images"},
    "dci": {"path": RAW / "dci" / "densely_captioned_images",
            "image_root": RAW / "dci" / "densely_captioned_images" / "photos"},
    "localized-narratives": {
        "path": RAW / "localized_narratives" / "coco_train_localized_narratives-00000-of-00004.jsonl",
        "image_root": RAW / "localized_narratives" / "coco"},
}
# Benchmark kinds -> the world folder holding that kind's files in the real format.
WORLD_FOLDER = {"sugarcrepe": "sugarcrepe", "sugarcrepe_pp": "sugarcrepe_pp", "winoground": "winoground",
                "aro_relation": "aro_relation", "aro_attribution": "aro_attribution", "aro_order": "aro_order",
                "valse": "valse", "zeroshot": "zeroshot-shape", "retrieval": "retrieval",
                "long_retrieval": "long_retrieval", "linear_probe": "linear_probe"}




def _released_benchmarks() -> Path | None:
    """The released annotation files (../shared/benchmarks beside the checkout, or COMPO_REAL_BENCHMARKS)."""
    candidates = [os.environ.get("COMPO_REAL_BENCHMARKS")]
    candidates += [str(parent / "shared" / "benchmarks") for parent in REPO.parents[:3]]
    return next((Path(c) for c in candidates if c and (Path(c) / "README.md").is_file()), None)


REAL = _released_benchmarks()
# Kinds the world does not make (issue 47): their released annotation files where this checkout has them, else a
# minimal copy of the release's layout written by `_write_released_layout` (a clone without ../shared, as CI's)
RELEASED_ONLY = {"imagecode": None if REAL is None else REAL / "imagecode",
                 "vl_checklist": None if REAL is None else REAL / "vl_checklist",
                 # no real files anywhere: fixtures in the releases' layouts
                 **{kind: REPO / "tests" / "fixtures" / "benchmarks" / kind
                    for kind in ("whatsup", "spec", "svo_probes")},
                 "crepe": RAW / "crepe", "eqben": RAW / "eqben", "coco_counterfactuals": RAW / "coco_counterfactuals"}


def _write_released_layout(kind: str, folder: Path) -> Path:
    """The release's file layout with one item per file (ImageCoDe's valid_data.json; VL-CheckList's corpus yamls
    and their data JSONs), for the dry run's preflight, which opens each file and parses its first items."""
    from compo.evaluate.files import VL_CHECKLIST_CORPUS, VL_CHECKLIST_SUBTASKS

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "imagecode":
        (folder / "valid_data.json").write_text(json.dumps({"open-images-1_a": {"3": "the cat on the left"}}))
    elif kind == "vl_checklist":
        for corpus, sources in VL_CHECKLIST_SUBTASKS.values():
            for source in sources:
                anno = f"data/{corpus}/{source}.json"
                (folder / VL_CHECKLIST_CORPUS / corpus).mkdir(parents=True, exist_ok=True)
                (folder / VL_CHECKLIST_CORPUS / corpus / f"{source}.yaml").write_text(
                    f'ANNO_PATH: "{anno}"\nIMG_ROOT: "{source.split("_")[0]}/"\nTYPE: "TUPLE_JSON"\n')
                (folder / anno).parent.mkdir(parents=True, exist_ok=True)
                (folder / anno).write_text(json.dumps([["VG_100K/1.jpg", {"POS": ["a cup"], "NEG": ["a mug"]}]]))
    else:
        raise ValueError(f"no release layout written for kind {kind!r}")
    return folder


def _every_valse_piece(folder: Path) -> None:
    """The world writes two VALSE pieces (relations, foil-it); the release has eleven, and FSC-CLIP's VALSE average
    reads each instrument: the other nine as copies of the relations piece, in the release's file layout."""
    relations = (folder / "relations.json").read_text()
    for piece in VALSE_PIECES:
        if not (folder / f"{piece}.json").exists():
            (folder / f"{piece}.json").write_text(relations)


def _every_eqben_subset(annotation: Path) -> None:
    """A pair for each EqBen subset the fixture lacks (it holds Kubric-location's and SD's): FSC-CLIP's EqBen is
    the mean over the release's five sources, so the stand-in names all seven subsets (images written later)."""
    from compo.evaluate.eqben import RELEASED_SUBSETS

    data = json.loads(annotation.read_text())
    present = {item["image0"].split("/", 1)[0] for item in data["list"]}
    data["list"] += [{"image0": f"{subset}/stand_in_0.png", "caption0": f"a {subset} scene, first",
                      "image1": f"{subset}/stand_in_1.png", "caption1": f"a {subset} scene, second"}
                     for subset in RELEASED_SUBSETS if subset not in present]
    annotation.write_text(json.dumps(data, indent=1))


def write_stand_in_images(kind: str, spec: dict, folder: Path) -> int:
    """A small picture at every image path a benchmark of `kind` reads (its declaration's `images`; ImageCoDe: the
    ten frames of each set its file names), so that a model can be scored on the stand-in; returns how many were
    written. Paths that exist are kept, formats other than JPEG and PNG left out."""
    from PIL import Image

    from compo.evaluate.kinds import benchmark_images

    if kind == "imagecode":
        sets = json.loads((folder / (spec.get("file") or "valid_data.json")).read_text())
        root = Path(spec.get("image_root") or folder / "images")
        paths = [root / name / f"img{k}.jpg" for name in sets for k in range(10)]
    else:
        paths = benchmark_images(kind, spec, folder) or []
    written = 0
    for number, path in enumerate(dict.fromkeys(paths)):
        if path.exists() or path.suffix.lower() not in (".jpg", ".jpeg", ".png"):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (256, 256), ((37 * number) % 256, (91 * number) % 256, (151 * number) % 256)).save(path)
        written += 1
    return written


def write_paper_overlay(root: Path, released: bool = True, images: bool = False) -> Path:
    """Write `root/paths.yaml`, a config file pointing config/paper.yaml's data and benchmarks at
    files that exist here (benchmarks generated under `root/bench`); results go to `root/results`.
    `released`: ImageCoDe and VL-CheckList read their released annotation files where this checkout has them
    (False: a minimal copy of each release's layout); `images`: a stand-in picture at every image path the
    benchmarks without a world version read (`write_stand_in_images`), so models can be scored on them."""
    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    world = {**default["world"], "splits": {**default["world"]["splits"], "eval": 8},
             "benchmarks": {"sugarcrepe_per_subset": 2, "zeroshot_per_class": 1, "aro_items": 2,
                            "winoground_items": 2, "sugarcrepe_pp_per_subset": 2, "valse_per_piece": 2,
                            "linear_probe_per_class": 1}}
    generate_benchmarks(world, seed=0, out_dir=root / "bench")
    _every_valse_piece(root / "bench" / WORLD_FOLDER["valse"])
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    norms = REPO / "workflow" / "compo" / "resources" / "brysbaert2014_subset.tsv"
    overlay = {
        "results": "results",  # relative to the working directory (the overlay's folder)
        "datasets": {name: {key: str(value) if isinstance(value, Path) else value for key, value in paths.items()}
                     for name, paths in FIXTURE_DATASETS.items()},
        "concreteness": {"norms": str(norms), "sha256": None},
        "negatives": {name: {"norms": str(norms), "sha256": None}
                      for name, spec in paper["negatives"].items() if "norms" in spec},
        "benchmarks": {},
    }
    for name, spec in paper["negatives"].items():  # a released negatives file in DeGLA's layout, for the captions
        if "path" in spec:
            overlay["negatives"].setdefault(name, {})["path"] = str(write_degla_released(root / f"{name}.json"))
    # the released layouts (DeGLA's sets, VTAB's webdataset exports, COCO instances) as fixtures of their own,
    # with CLIP_benchmark-style class-name and template files of three names per dataset
    names, templates = root / "en_classnames.json", root / "en_zeroshot_classification_templates.json"
    datasets = {spec["dataset"] for spec in paper["benchmarks"].values() if spec.get("dataset")}
    names.write_text(json.dumps({d: ["one", "two", "three"] for d in datasets}))
    templates.write_text(json.dumps({d: ["a photo of a {c}."] for d in datasets}))
    # ELEVATER's entries read the toolkit's prompts.py (by its .py suffix): one in its layout, same three names
    prompts = write_elevater_prompts(root / "elevater" / "prompts.py", datasets)
    elevater = sorted(spec["dataset"] for spec in paper["benchmarks"].values() if spec.get("format") == "elevater")
    dataset_info = write_elevater_release(root / "elevater-release", elevater)
    for name, spec in paper["benchmarks"].items():
        if spec.get("format") == "elevater":   # ELEVATER's own releases: one release folder lists every dataset
            overlay["benchmarks"][name] = {"path": str(dataset_info.parent), "dataset_info": str(dataset_info),
                                           "classnames": str(prompts), "templates": str(prompts)}
            continue
        if spec.get("format") in LABELLED_SPLITS:
            folder = root / "labelled" / name
            if spec["format"] == "wds":
                # a zero-shot-only export (ELEVATER's) names no splits: the format's own (compo.evaluate.files)
                splits = {**LABELLED_SPLITS["wds"], **(spec.get("splits") or {})}
                WRITERS["wds"](folder, splits=tuple(v for v in splits.values() if v))
            else:
                WRITERS[spec["format"]](folder)
            overlay["benchmarks"][name] = {
                "path": str(folder), **({"image_root": str(folder)} if "image_root" in spec else {}),
                # Caltech101's test images are those past 30 a class: the stand-in has 4 a class
                **({"train_per_class": 2} if spec["format"] == "caltech101" else {}),
                **{key: str(prompts if str(spec[key]).endswith(".py") else value)
                   for key, value in (("classnames", names), ("templates", templates)) if key in spec}}
            continue
        if spec["kind"] in RELEASED_ONLY:  # no world version: the released annotations, empty image folders
            image_root = root / "released-images" / name
            image_root.mkdir(parents=True, exist_ok=True)
            folder = RELEASED_ONLY[spec["kind"]]
            if folder is None or (not released and spec["kind"] in ("imagecode", "vl_checklist")):
                folder = _write_released_layout(spec["kind"], root / "released" / name)
            overlay["benchmarks"][name] = {
                "path": str(folder),
                **({"image_root": str(image_root)} if "image_root" in spec else {}),
                **({"image_roots": {key: str(image_root) for key in spec["image_roots"]}}
                   if "image_roots" in spec else {})}
            if spec["kind"] == "vl_checklist" and released and REAL is not None:  # the shared copy lacks 18 files
                overlay["benchmarks"][name]["allow_missing_sources"] = True
            if images:  # on a copy: images a release keeps beside its annotations (SPEC's) stay out of the checkout
                copy = root / "released-copies" / name
                shutil.copytree(folder, copy)
                overlay["benchmarks"][name]["path"] = str(copy)
                if spec["kind"] == "eqben":
                    _every_eqben_subset(copy / spec["file"])
                write_stand_in_images(spec["kind"], {**spec, **overlay["benchmarks"][name]}, copy)
            continue
        folder = root / "bench" / WORLD_FOLDER[spec["kind"]]
        entry = {"path": str(folder)}
        if "image_root" in spec:
            entry["image_root"] = str(folder / "images")
        if spec["kind"] == "valse":  # every released piece (`_every_valse_piece`): vl_compo's averages read them all
            entry["pieces"] = list(VALSE_PIECES)
            entry["image_roots"] = {piece: str(folder / "images") for piece in entry["pieces"]}
        # the world writes each kind in its default layout: ImageFolder, Karpathy's dataset.json
        for key, value in (("format", "imagefolder" if spec["kind"] in ("zeroshot", "linear_probe") else "karpathy"),
                           ("file", None), ("classnames", None), ("templates", None), ("dataset", None),
                           ("splits", {"train": "train", "test": "test"})):
            if key in spec:
                entry[key] = value
        if "min_count" in spec:  # ARO's groups of at least 25 items: the stand-in's two items make one group
            entry["min_count"] = 1
        if spec["kind"] in ("zeroshot", "linear_probe"):   # the real set's name: the plan sizes the stand-in as it
            entry["dataset"] = spec.get("dataset") or spec.get("format")
        overlay["benchmarks"][name] = entry
    # entries pointed at local fixtures read them, not a hub release (`hub: null`): nothing for `compo prefetch`
    for section in ("datasets", "benchmarks", "negatives"):
        for name, entry in overlay[section].items():
            if paper[section].get(name, {}).get("hub") is not None:
                entry["hub"] = None
    overlay["model_cache"] = str(write_stand_in_cache(root / "model-cache", paper))
    path = root / "paths.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return path


def write_elevater_prompts(path: Path, datasets: set[str]) -> Path:
    """A prompts.py in the layout of Elevater_Toolkit_IC's vision_benchmark/datasets/prompts.py (module-level lists,
    `class_map` / `template_map` at the dataset names; tests/evaluate/test_elevater.py), three classes a dataset."""
    path.parent.mkdir(parents=True, exist_ok=True)
    def classes(dataset: str) -> str:
        return "toy_pair" if ELEVATER_SHAPES.get(dataset, (3,))[0] == 2 else "toy_classes"

    path.write_text("\n".join([
        "toy_classes = ['one', ['two', 'second'], 'three']", "toy_pair = ['one', ['two', 'second']]",
        "toy_templates = ['a photo of a {}.', 'itap of a {}.']",
        "class_map = {" + ", ".join(f"{d!r}: {classes(d)}" for d in sorted(datasets)) + "}",
        "template_map = {" + ", ".join(f"{d!r}: toy_templates" for d in sorted(datasets)) + "}", ""]))
    return path


# ELEVATER sets whose shape decides their metric: Hateful Memes' two classes (roc_auc), VOC 2007's labels (map_11point)
ELEVATER_SHAPES = {"hateful-memes": (2, "classification_multiclass"),
                   "voc-2007-classification": (3, "classification_multilabel")}


def write_elevater_release(root: Path, datasets: list[str]) -> Path:
    """ELEVATER's release layout (tests/evaluate/test_elevater.py's write_elevater): the toolkit's DATASET_INFO json
    listing each of `datasets` as an iris set (labelmap, test index, a plain image per class), three classes, or the
    shape of `ELEVATER_SHAPES` (a multi-label image lists two labels); its path."""
    from PIL import Image

    info = []
    for k, dataset in enumerate(datasets):
        classes, kind = ELEVATER_SHAPES.get(dataset, (3, "classification_multiclass"))
        folder = root / "classification" / f"set{k}"
        (folder / "test").mkdir(parents=True, exist_ok=True)
        (folder / "labels.txt").write_text("".join(f"{name}\n" for name in ("one", "two", "three")[:classes]))
        for label in range(classes):
            Image.new("RGB", (16, 16), (80 * label, 40, 120)).save(folder / "test" / f"{label}.png")
        labels = [f"{label},{(label + 1) % classes}" if kind.endswith("multilabel") else str(label)
                  for label in range(classes)]
        (folder / "test.txt").write_text("".join(f"test/{label}.png {labels[label]}\n" for label in range(classes)))
        info.append({"name": dataset, "version": 1, "type": kind,
                     "root_folder": folder.relative_to(root).as_posix(), "labelmap": "labels.txt",
                     "test": {"index_path": "test.txt", "files_for_local_usage": []}})
    path = root / "vision_datasets.json"
    path.write_text(json.dumps(info))
    return path


def write_degla_released(path: Path) -> Path:
    """DeGLA's released negatives file (a list of {image_id, original, enhanced}) for the fixture COCO captions,
    four made-up rewrites each."""
    coco = json.loads(FIXTURE_DATASETS["coco"]["path"].read_text())
    records = [{"image_id": image["cocoid"], "original": sentence["raw"],
                "enhanced": [f"{sentence['raw']} (rewrite {i})" for i in range(4)]}
               for image in coco["images"] for sentence in image["sentences"]]
    path.write_text(json.dumps(records))
    return path


def write_stand_in_cache(cache: Path, config: dict) -> Path:
    """A model cache whose manifest records every external model `config` needs, each an empty stand-in file
    (the dry run's preflight reads the manifest; no job loads them)."""
    from compo.artifacts import write_manifest
    from compo.prefetch import uncached_artifacts

    artifacts = {}
    for number, artifact in enumerate(uncached_artifacts(config, cache)):  # what the preflight looks for
        (cache / str(number)).mkdir(parents=True, exist_ok=True)
        (cache / str(number) / "stand-in").touch()
        artifacts[artifact.id] = {"kind": artifact.kind, "source": artifact.source, "file": artifact.file,
                                  "keys": list(artifact.keys), "path": f"{number}/stand-in", "files": {},
                                  "bytes": 0}
    cache.mkdir(parents=True, exist_ok=True)
    write_manifest(cache, {"artifacts": artifacts})
    return cache


STAND_IN_STEPS = {"steps": 2, "batch_size": 2, "warmup": 1}  # every recipe: a few steps of the fixtures' 2 captions


def write_stand_in_study(root: Path, study: dict | None = None, methods: list[str] | None = None) -> list[str]:
    """config/paper.yaml on stand-ins of every input, as a cluster user would run it offline: the raw-format
    fixtures and benchmark stand-ins (`write_paper_overlay`), tiny models of the paper's two architecture kinds
    (CLIP-style and SigLIP-style, made here in their libraries' layouts: open_clip weights, a transformers LM, an
    SDXL pipeline) laid out in a model cache by `compo prefetch --from`, and an overlay that changes sizes only:
    every recipe a few steps on the CPU, LLM and image negatives through their CPU paths. `study` overrides keys
    of `study:` (default: one seed); `methods`: the recipes sized (default: all of paper.yaml's). Returns the
    config files, in order."""
    import subprocess
    import sys

    from artifact_fixtures import SDXL_SIZE, build_tiny_lm, build_tiny_open_clip, build_tiny_sdxl

    from compo.config import load_config, resolve_method

    paths = write_paper_overlay(root, released=False, images=True)
    shared = root / "shared-models"
    build_tiny_open_clip(shared / "compo-test" / "tiny-clip", "compo-tiny-clip")
    build_tiny_open_clip(shared / "compo-test" / "tiny-sigmoid", "compo-tiny-sigmoid")
    build_tiny_lm(shared / "compo-test" / "tiny-lm", "a the red blue green cube ball photo of .".split())
    build_tiny_sdxl(shared / "compo-test" / "tiny-sdxl")
    paper = load_config(REPO / "config" / "paper.yaml")
    gpus = {name: int(resolve_method(paper, name)["train"].get("gpus", 1)) for name in paper["methods"]}
    hard = {name: resolve_method(paper, name).get("hard_images") for name in paper["methods"]}
    llm = {"backend": "transformers", "model": "compo-test/tiny-lm", "shards": 2, "vllm": None, "max_new_tokens": 8}
    images = {"model": "compo-test/tiny-sdxl", "resolution": SDXL_SIZE, "steps": 2, "shards": 2, "batch_size": 2}
    models = root / "models.yaml"
    models.write_text(yaml.safe_dump({
        "model_cache": str(root / "cache"),
        "bases": {"clip": {"model": "compo-tiny-clip", "init": "tiny", "hub": "compo-test/tiny-clip"},
                  "siglip": {"model": "compo-tiny-sigmoid", "init": "tiny", "hub": "compo-test/tiny-sigmoid"}},
        # a multi-GPU recipe (C2LIP's 4) on 2 ranks: torchrun's path, the fixtures' batch of 2 split in two
        "methods": {name: {"train": {**STAND_IN_STEPS, **({"gpus": 2} if gpus.get(name, 1) > 1 else {})},
                           # NegCLIP's 3 nearest images need 4 distinct ones: the fixtures have 2
                           **({"hard_images": 1} if isinstance(hard.get(name), int) else {})}
                    for name in methods or paper["methods"]},
        "negatives": {"degla-llm": llm, **{f"concrete-{p}": {**llm, "images": images} for p in ("hc", "lc", "wo")}},
        # no GPU here (and the test cluster's GPU is a stand-in): paper.yaml's device cuda would stop every job
        "train": {"threads": 1, "precision": "fp32", "checkpoint_every": 1, "device": "cpu"},
        # one core an evaluation, as a training: paper.yaml's 4 threads would take both of a 2-core runner's cores
        # (Snakemake caps threads at --cores, so evaluations ran one at a time, 77 % of the run) and start an
        # image-decoding worker process for every benchmark of every job (half of an evaluation's CPU on stand-ins)
        "evaluate": {"device": "cpu", "threads": 1},
        "study": {"seeds": [0], **(study or {})},
        # the L-BFGS probes' iterations (the stand-ins' few features are separable: every fit ran all 500, 80 % of
        # an evaluation job) and penalties (two of the seven: each is a fit of every probe, 5 of an evaluation job's
        # 20 CPU-s with all seven), and WiSE-FT's alpha grid at its ends and middle
        "benchmarks": {name: {"max_iter": 20, "l2_grid": [1e-4, 1.0]} for name, spec in paper["benchmarks"].items()
                       if spec["kind"] == "linear_probe" and spec.get("solver", "lbfgs") == "lbfgs"},
        "wiseft": {"alphas": [0.0, 0.5, 1.0]},
    }))
    configs = [str(REPO / "config" / "paper.yaml"), str(paths), str(models)]
    fetched = subprocess.run([sys.executable, "-m", "compo", "prefetch", "--configfile", *configs, "--from",
                              str(shared)], capture_output=True, text=True, check=False)
    if fetched.returncode != 0 or "4 artifacts" not in fetched.stdout:  # two bases' weights, the LM, the pipeline
        raise RuntimeError(f"compo prefetch --from failed: {fetched.stdout}{fetched.stderr}")
    return configs


def offline_env(root: Path) -> dict[str, str]:
    """Environment overrides that refuse the network to every Python process a run starts (tests/network_guard,
    first on PYTHONPATH, the rest kept: the checkout's workflow/ with the executor compo-slurm) and log each attempt
    to `root/network-attempts.log`; HF_HOME an empty folder, so a hub library has nothing to fall back on."""
    guard = os.pathsep.join(filter(None, [str(REPO / "tests" / "network_guard"), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": guard, "COMPO_NETWORK_LOG": str(root / "network-attempts.log"),
            "HF_HOME": str(root / "empty-hf-home")}
