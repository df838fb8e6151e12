"""VL-CheckList (Zhao et al., 2022): does the model prefer a caption to one with an object, attribute or relation
changed? Scored on the 13 subtasks vl_compo and FSC-CLIP report.

Files, in the release's layout under `benchmark_dir` (github.com/om-ai-lab/VL-CheckList): per subtask the corpus
files `corpus/v1/<Type>/<subtype>/<source>.yaml` (`files.VL_CHECKLIST_SUBTASKS`), each
`{ANNO_PATH: "data/...json", IMG_ROOT: "vg/" | "hake/" | "swig/", TYPE: "TUPLE_JSON"}`; ANNO_PATH is relative to
`benchmark_dir`, a JSON list of `[image path, {"POS": [captions], "NEG": [captions]}]`. An image is
`{image_roots[IMG_ROOT without "/"] or (spec["image_root"] or benchmark_dir/images)/IMG_ROOT}/<image path>`.

As the release's `vl_checklist/evaluate.py` (task itc) scores: only the first POS and the first NEG caption, correct
iff cos(image, POS[0]) > cos(image, NEG[0]) strictly (a tie is wrong: the project's rule too); items whose image
file does not exist are dropped first (counted as missing_image), then with `spec["max_num"]` only the first
max_num/2 items of each source are kept (the release's MAX_NUM; default: all). The release reports one accuracy
per source file (`<subtask>/<source>`). A subtask is the unweighted mean of its sources (vl_compo's code, which
combines them, is not released: an assumption), a category (Object, Attribute, Relation) the mean of its subtasks,
and the headline `mean` the mean of the three categories: vl_compo's `vl_checklist` column, which its
`individual_results.csv` reproduces to the 6th digit (tests/test_vl_compo_reference.py). A source with no items is
left out (the release's code divides by zero on it); an absent annotation file is an error unless
`spec["allow_missing_sources"]` (the shared copy lacks 18 of them), then left out and logged.

Repeated items: the release's annotation files give 9,746 items twice or more (the same image, POS and NEG: 4,448
of Relation/vg/spatial's 30,650; 614 within the first 1,000 items of a source, what `max_num: 2000` scores). The
release and vl_compo's published numbers score each copy, so by default they are scored each time (the count
logged), keeping the numbers comparable; `spec["skip_repeats"]: true` scores each item once, the repeats left out
before `max_num` cuts the list and counted as `repeated_item` in the result's "skipped".
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import yaml

from compo.evaluate.candidates import REPEATED_ITEM, Item, accuracies, accuracy, macro, repeats, run_items
from compo.evaluate.common import (
    MISSING_IMAGE,
    BenchmarkError,
    BenchmarkResult,
    Metric,
    image_root,
    item_path,
    read_json_file,
    read_text_file,
    require_text,
)
from compo.evaluate.files import VL_CHECKLIST_CORPUS, VL_CHECKLIST_SUBTASKS, vl_checklist_subtasks
from compo.evaluate.kinds import FOLDERS, NAMES, Benchmark, BenchmarkSize, Key, stored_only
from compo.paths import contained

if TYPE_CHECKING:
    from compo.models import LoadedModel

log = logging.getLogger(__name__)

PROTOCOL = "vl-checklist-itc-first-pos-neg-strict"
CATEGORIES = ("Object", "Attribute", "Relation")
CORPUS_KEYS = ("ANNO_PATH", "IMG_ROOT", "TYPE")
Entry = tuple[str, str, str]  # image path (relative to its root), POS[0], NEG[0]


def read_corpus(path: Path) -> dict[str, str]:
    """One corpus yaml: its annotation file (ANNO_PATH), image folder (IMG_ROOT) and TYPE (TUPLE_JSON)."""
    try:
        corpus = yaml.safe_load(read_text_file(path, "VL-CheckList corpus file"))
    except yaml.YAMLError as error:
        raise BenchmarkError(f"{path}: not valid YAML ({error})") from error
    if not isinstance(corpus, dict) or any(not isinstance(corpus.get(k), str) for k in CORPUS_KEYS):
        raise BenchmarkError(f"{path}: expected string fields {', '.join(CORPUS_KEYS)}, got {corpus!r:.200}")
    if corpus["TYPE"] != "TUPLE_JSON":
        raise BenchmarkError(f"{path}: TYPE {corpus['TYPE']!r} unknown (the release's corpus files are TUPLE_JSON)")
    return corpus


def source_files(corpus_file: Path, benchmark_dir: Path, spec: dict[str, Any]) -> tuple[Path, Path]:
    """A source's annotation JSON (ANNO_PATH, under `benchmark_dir`) and image folder (IMG_ROOT, under the image
    root, or as `spec["image_roots"]` maps it), each refused when it leaves its root ("..", an absolute path, a
    link elsewhere): a corpus file cannot make the benchmark read or score files from outside it."""
    corpus = read_corpus(corpus_file)
    anno = contained(benchmark_dir, corpus["ANNO_PATH"], source=str(corpus_file), entry="ANNO_PATH")
    key, roots = corpus["IMG_ROOT"].strip("/"), spec.get("image_roots") or {}
    if key in roots:
        return anno, Path(roots[key])
    return anno, contained(image_root(spec, benchmark_dir), key, source=str(corpus_file), entry="IMG_ROOT")


def load_items(path: Path) -> list[Entry]:
    """A source's annotation JSON: per item its image path and first POS and NEG captions."""
    data = read_json_file(path, "VL-CheckList annotation file")
    if not isinstance(data, list):
        raise BenchmarkError(f"{path}: expected a list of [image path, {{POS: [...], NEG: [...]}}]")
    items = []
    for index, entry in enumerate(data):
        where = f"{path}: item {index}"
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and entry[0]
                and isinstance(entry[1], dict)):
            raise BenchmarkError(f"{where}: expected [image path, {{POS: [...], NEG: [...]}}], got {entry!r:.120}")
        texts = entry[1]
        for key in ("POS", "NEG"):
            if not isinstance(texts.get(key), list) or not texts[key]:
                raise BenchmarkError(f"{where}: {key!r} must be a non-empty list of captions")
        items.append((entry[0], require_text(texts["POS"][0], where, "POS[0]"),
                      require_text(texts["NEG"][0], where, "NEG[0]")))
    return items


def summary(subtasks: dict[str, float]) -> dict[str, float]:
    """Category means (Object / Attribute / Relation: the mean of the subtasks named `<Category>_...`) and `mean`,
    the mean of the categories present: vl_compo's VL-CheckList column."""
    means = {}
    for category in CATEGORIES:
        values = [v for name, v in subtasks.items() if name.split("_")[0] == category]
        if values:
            means[category] = sum(values) / len(values)
    if means:
        means["mean"] = sum(means.values()) / len(means)
    return means


def items_of(benchmark_dir: Path, spec: dict[str, Any], skipped: Counter) -> list[Item]:
    """Every source's items, `<subtask>/<source>`: the image with its first POS (right) and NEG captions. As the
    release: an item whose image file does not exist is left out (counted) before `max_num` cuts the list; a
    source whose annotation file is absent is counted in `skipped` (with `allow_missing_sources`)."""
    max_num = spec.get("max_num")
    items: list[Item] = []
    seen: set[tuple[Any, ...]] = set()
    repeated: Counter = Counter()  # per source: items repeating an earlier one
    for subtask, (folder, names) in vl_checklist_subtasks(spec).items():
        for source in names:
            anno, root = source_files(benchmark_dir / VL_CHECKLIST_CORPUS / folder / f"{source}.yaml",
                                      benchmark_dir, spec)
            if not anno.is_file() and spec.get("allow_missing_sources"):
                log.warning("vl_checklist: %s/%s left out: %s is absent", subtask, source, anno)
                skipped["missing_annotation_file"] += 1
                continue
            kept = 0
            for index, (image, pos, neg) in enumerate(load_items(anno)):
                if max_num and kept == max_num // 2:
                    break  # the release's cut (the missing images after it are not looked for)
                path = item_path(root, image)
                exists = path.exists()  # the release drops the others before MAX_NUM cuts the list
                item = Item(f"{subtask}/{source}", str(index), (path,), (pos, neg),
                            skip=None if exists else MISSING_IMAGE)
                if repeats(item, seen):
                    repeated[item.subset] += 1
                    if spec.get("skip_repeats"):  # left out before MAX_NUM's cut, as a missing image is
                        items.append(replace(item, skip=REPEATED_ITEM))
                        continue
                items.append(item)
                kept += exists
            if not kept:
                log.warning("vl_checklist: %s/%s has no item with an image: left out", subtask, source)
    if repeated:
        log.warning("vl_checklist: %d item(s) repeat an earlier one of their source (the same image and first POS "
                    "and NEG), %s (e.g. %s: %d)", sum(repeated.values()),
                    "left out (skip_repeats)" if spec.get("skip_repeats") else
                    "scored each time, as the release scores them (skip_repeats: true scores each once)",
                    *repeated.most_common(1)[0])
    return items


def checklist_metrics(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
    """Each source's accuracy, each subtask's (the mean of its sources), the categories', `mean` and `micro`."""
    metrics = accuracies(predictions)
    per_subtask: dict[str, list[str]] = defaultdict(list)
    for name in list(metrics):
        per_subtask[name.split("/")[0]].append(name)
    for subtask, names in per_subtask.items():
        metrics[subtask] = macro([metrics[n] for n in names])
    means = summary({subtask: metrics[subtask].value for subtask in per_subtask})
    counts = {c: sum(metrics[s].n for s in per_subtask if s.split("_")[0] == c) for c in CATEGORIES}
    for name, value in means.items():
        metrics[name] = Metric(value, counts.get(name, len(predictions)))
    metrics["micro"] = accuracy(predictions)
    return metrics


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    # a source whose every image is unreadable is left out, as the release leaves out a source without items
    skipped: Counter = Counter()
    return run_items(loaded, items_of(benchmark_dir, spec, skipped), benchmark="vl_checklist", protocol=PROTOCOL,
                     headline="mean", files=benchmark_dir, metrics=checklist_metrics, skipped=skipped)


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / VL_CHECKLIST_CORPUS / corpus / f"{source}.yaml"
            for corpus, sources in vl_checklist_subtasks(spec).values() for source in sources]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    """Every item's image, before the `max_num` cut (the guard looks at the whole release); a source whose
    annotation file is absent has none (`allow_missing_sources`; otherwise scoring stops on it)."""
    paths = []
    for corpus_file in release_files(spec, folder):
        anno, root = source_files(corpus_file, folder, spec)
        if not anno.is_file() and spec.get("allow_missing_sources"):
            continue
        paths += [item_path(root, image) for image, _, _ in load_items(anno)]
    return paths


# One image and two captions (the first POS and NEG) an item. The release's 56 corpus sources: 41 counted (262,483
# items); ASSUMPTION: the 15 not copied ~30,000 each (1.7-3.9 MB files at ~100 B an item, the others larger). With
# `max_num` each source keeps at most max_num/2 (an upper bound: some sources are smaller)
RELEASED_ITEMS, RELEASED_SOURCES = 262_483 + 15 * 30_000, 56


def release_size(spec: dict[str, Any]) -> BenchmarkSize:
    items = RELEASED_ITEMS
    if spec.get("max_num"):
        items = min(items, RELEASED_SOURCES * int(spec["max_num"]) // 2)
    return BenchmarkSize(items, 2 * items, 0)


BENCHMARKS = (
    Benchmark(kind="vl_checklist", source="github.com/om-ai-lab/VL-CheckList corpus/v1; evaluate.py's itc task",
              run=run, files=release_files, images=image_paths, size=release_size, headline="mean",
              subsets=CATEGORIES, chance=1 / 2,
              selections=stored_only,
              downloads=lambda spec: {"path": 'github.com/om-ai-lab/VL-CheckList; corpus/v1/ and data/',
                                      "image_roots": 'Visual Genome VG_100K[_2], HAKE, SWiG images_512 '
                                                     "(VL-CheckList's DATA.md); each corpus yaml's IMG_ROOT"},
              keys={"subtasks": Key({**NAMES, "items": {"enum": list(VL_CHECKLIST_SUBTASKS)}},
                                    "the subtasks scored (default vl_compo's 13)", "vl_compo"),
                    "image_roots": Key(FOLDERS, "a folder per corpus yaml's IMG_ROOT (`vg`, "
                                       "`hake`, `swig`)", "VL-CheckList corpus/v1"),
                    "max_num": Key({"type": "integer", "minimum": 2}, "the release's MAX_NUM: the first max_num/2 "
                                   "items with an image per source (default all; paper.yaml 2000, as vl_compo ran it)",
                                   "VL-CheckList `vl_checklist/evaluate.py`, vl_compo"),
                    "allow_missing_sources": Key({"type": "boolean"}, "leave absent annotation files out (counted) "
                                                 "instead of failing"),
                    "skip_repeats": Key({"type": "boolean"}, "score an item the release gives twice only once "
                                        "(default false: each copy, as the release and vl_compo's published numbers "
                                        "count them; the release holds 9,746 repeats)", "VL-CheckList corpus/v1")}),
)
