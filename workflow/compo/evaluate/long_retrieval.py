"""Long-caption image-text retrieval (Urban1k, DOCCI, DCI / sDCI, ShareGPT4V-1k, ImageInWords; LongCLIP, LSS).

The test sets as their publishers ship them, `spec["format"]`:

* `urban1k` (HF BeichenZhang/Urban1k, LongCLIP's `Urban1k/`): `{benchmark_dir}/image/N.jpg` and
  `{benchmark_dir}/caption/N.txt`, one long caption per image, paired by N (1..1000).
* `docci`: `{benchmark_dir}/docci_descriptions.jsonlines` (`spec["file"]`), the `test` split; images
  under `spec["image_root"]` or `{benchmark_dir}/images`.
* `dci`: `{benchmark_dir}` is the `densely_captioned_images` folder; the `test` entries of its
  splits.json with their sDCI summary (images without one cannot be scored: counted "no_summary").
* `sharegpt4v`: the first 1,000 records (`spec["holdout"]`) of
  `{benchmark_dir}/share-captioner_coco_lcs_sam_1246k_1107.json` (`spec["file"]`), LongCLIP's
  ShareGPT4V-1k; the `sharegpt4v` training dataset holds the same records out (`compo.data`).
* `iiw`: ImageInWords' human-authored eval sets, `{benchmark_dir}/<subset>/data.jsonl` for each of
  `spec["subsets"]` (default `["IIW-400"]`), images under `{benchmark_dir}/<folder>/<key>.jpg` (folders in
  `compo.evaluate.files.IIW_SUBSETS`; `spec["image_roots"][subset]`, or `spec["image_root"]` for a single
  subset, overrides). Each JSON line is one image and its one `IIW` description; the key is `image/key`
  (IIW-400, DOCCI_Test) or `image` (DCI_Test). A malformed line stops the run naming file and line; a key
  seen again is skipped and counted ("duplicate").
* `karpathy` (default; the world's): Karpathy-format `dataset.json`, split "test" (`compo.evaluate.retrieval`).

DOCCI, DCI and ShareGPT4V records are read by the training-data readers of `compo.data`, so both
see the same files the same way. `spec["max_words"]`, where a protocol documents one, keeps the first
that many words of each caption. Scoring is `compo.evaluate.retrieval`'s (R@1/5/10 both ways, ties
against the model); the headline "r1" is the mean of image->text and text->image R@1, the figure
LongCLIP and Long Story Short report (their tables give both directions' R@1; `i2t_r1` and `t2i_r1`
are in the metrics, R@5/10 as extra metrics). Texts go through the model's own tokenizer, so a 77-token
model sees them truncated and a stretched-context model (longclip) sees more: that difference is what
this benchmark measures.

ImageInWords, what was found and from where (issue 46): Google releases the sets as JSON lines in
github.com/google/imageinwords `datasets/` (the HF dataset `google/imageinwords` is a loading script that
downloads those same files; configs IIW-400, DCI_Test, DOCCI_Test, CM_3600, LocNar_Eval). IIW-400
(`datasets/IIW-400/README.md`) is 400 images sampled from DOCCI's AAR images, fields `image/key` (DOCCI's
image id, e.g. `aar_test_04600`), `IIW` (the human-authored description), `IIW-P5B` (a model's), `objects`
and the human side-by-side ratings; DCI_Test is 112 DCI test images (`image`, `ex_id`, `IIW`), DOCCI_Test 100
DOCCI test images. The long-caption retrieval code that reads them (FLAIR's and LoTLIP's data-preparation
READMEs, an `iiw_retrieval_dataset` loader in the code index whose repository the index does not name) keeps
them under one `imageinwords/` folder (`docci_aar/`, `docci/`, `dci/` images; `IIW-400/`, `DOCCI_Test/`,
`DCI_Test/` as released), appends `.jpg` to the key, pairs each image with its `IIW` text, and scores the three
subsets together (612 images). Assumptions: which subsets LSS scores (seed 004 says only "IiW"; its code is
"TBD") -- the default here is IIW-400 alone, the set the IIW paper names its eval set, and `subsets` gives the
612-image union; that loader's re-joining of sentences with ". " is not applied (whitespace is normalised, as
for the other sets); DOCCI's AAR images keep their keys as file names (`aar_test_04600.jpg`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compo import data
from compo.evaluate import retrieval
from compo.evaluate.common import BenchmarkError, BenchmarkResult, Metric, item_path
from compo.evaluate.files import (
    IIW_SUBSETS,
    LONG_RETRIEVAL_FILES,
    LONG_RETRIEVAL_FORMATS,
    iiw_subsets,
    long_retrieval_downloads,
    long_retrieval_file,
    long_retrieval_files,
    long_retrieval_format,
)
from compo.evaluate.kinds import FOLDERS, NAMES, POSITIVE_INT, Benchmark, BenchmarkSize, Key, Selection
from compo.evaluate.retrieval import RetrievalImage

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "recall-at-k-pessimistic-ties-r1-long-captions"
FORMATS, DEFAULT_FILES = LONG_RETRIEVAL_FORMATS, LONG_RETRIEVAL_FILES
NO_SUMMARY = "no_summary"
DUPLICATE = "duplicate"
IIW_KEYS = ("image/key", "image")  # IIW-400 and DOCCI_Test name the image by `image/key`, DCI_Test by `image`


format_of, source_file = long_retrieval_format, long_retrieval_file


def _urban1k(benchmark_dir: Path, spec: dict[str, Any]) -> list[RetrievalImage]:
    captions = benchmark_dir / "caption"
    if not captions.is_dir():
        raise BenchmarkError(f"{captions}: Urban1k caption folder not found (expected caption/N.txt, image/N.jpg)")
    files = [p for p in captions.iterdir() if p.suffix == ".txt"]
    bad = [p.name for p in files if not p.stem.isdigit()]
    if bad:
        raise BenchmarkError(f"{captions}: caption file {bad[0]!r} is not named N.txt")
    root = Path(spec["image_root"]) if spec.get("image_root") else benchmark_dir / "image"
    test = []
    for path in sorted(files, key=lambda p: int(p.stem)):
        text = " ".join(path.read_text(encoding="utf-8").split())
        if not text:
            raise BenchmarkError(f"{path}: empty caption")
        test.append(RetrievalImage(path.stem, root / f"{path.stem}.jpg", [path.stem], [text]))
    return test


def _iiw_root(spec: dict[str, Any], benchmark_dir: Path, subset: str, subsets: list[str]) -> Path:
    roots = spec.get("image_roots") or {}
    if subset in roots:
        return Path(roots[subset])
    if spec.get("image_root") and len(subsets) == 1:
        return Path(spec["image_root"])
    return benchmark_dir / IIW_SUBSETS[subset]


def _iiw(benchmark_dir: Path, spec: dict[str, Any], skipped: Counter) -> list[RetrievalImage]:
    """ImageInWords' released data.jsonl files: one image and its human-authored `IIW` description a line."""
    subsets = iiw_subsets(spec)
    test: list[RetrievalImage] = []
    seen: set[str] = set()
    for subset, path in zip(subsets, long_retrieval_files(spec, benchmark_dir), strict=True):
        if not path.is_file():
            raise BenchmarkError(f"{path}: ImageInWords {subset} file not found (the release's "
                                 f"datasets/{subset}/data.jsonl)")
        root = _iiw_root(spec, benchmark_dir, subset, subsets)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise BenchmarkError(f"{path}:{number}: not a JSON object ({error.msg})") from error
            key = next((record[k] for k in IIW_KEYS if isinstance(record, dict) and k in record), None)
            text = record.get("IIW") if isinstance(record, dict) else None
            if not isinstance(key, str) or not key.strip() or not isinstance(text, str) or not text.strip():
                raise BenchmarkError(f"{path}:{number}: expected a non-empty 'image/key' (or 'image') and 'IIW' "
                                     f"description")
            if key in seen:
                skipped[DUPLICATE] += 1
                continue
            seen.add(key)
            name = key if key.endswith(".jpg") else f"{key}.jpg"  # as the loaders that read IIW join them
            test.append(RetrievalImage(key, item_path(root, name), [key], [" ".join(text.split())]))
    if not test:
        raise BenchmarkError(f"{benchmark_dir}: no ImageInWords image in {', '.join(subsets)}")
    return test


def _from_records(fmt: str, benchmark_dir: Path, spec: dict[str, Any], skipped: Counter) -> list[RetrievalImage]:
    """DOCCI / DCI / ShareGPT4V test images through compo.data's readers of the raw files."""
    path = benchmark_dir if fmt == "dci" else source_file(spec, benchmark_dir)
    if not path.exists():
        raise BenchmarkError(f"{path}: {fmt} file not found")
    root = Path(spec["image_root"]) if spec.get("image_root") else data.default_image_root(fmt, path)
    test = []
    try:
        records = list(data.read_records(fmt, [path], "long", root, spec.get("holdout"),
                                         holdout_key="benchmark key holdout"))
    except data.RawDataError as error:
        raise BenchmarkError(str(error)) from error
    for record in records:
        if record.split != "test":
            continue
        if record.no_summary:
            skipped[NO_SUMMARY] += 1
            continue
        captions = [" ".join(str(c).split()) for c in record.captions if c and str(c).strip()]
        if not captions:
            raise BenchmarkError(f"{path}: {record.where}: test image {record.image_id!r} has an empty caption")
        test.append(RetrievalImage(record.image_id, item_path(root, record.candidates[0]),
                                   [f"{record.image_id}#{k}" for k in range(len(captions))], captions))
    if not test:
        raise BenchmarkError(f"{path}: no test-split image")
    return test


def truncate_words(text: str, max_words: int | None) -> str:
    return text if max_words is None else " ".join(text.split()[:max_words])


def load_test_set(spec: dict[str, Any], benchmark_dir: Path, skipped: Counter) -> list[RetrievalImage]:
    """The test set's images and captions, in the spec's format (records it skips are counted in `skipped`)."""
    fmt = format_of(spec)
    if fmt == "karpathy":
        return retrieval.karpathy_images(spec, benchmark_dir)
    if fmt == "urban1k":
        return _urban1k(benchmark_dir, spec)
    if fmt == "iiw":
        return _iiw(benchmark_dir, spec, skipped)
    return _from_records(fmt, benchmark_dir, spec, skipped)


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    skipped: Counter = Counter()
    test = load_test_set(spec, benchmark_dir, skipped)
    max_words = spec.get("max_words")
    for image in test:
        image.captions = [truncate_words(caption, max_words) for caption in image.captions]
    result = retrieval.score(loaded, test, source_file(spec, benchmark_dir))
    result.metrics["r1"] = Metric((result.metrics["i2t_r1"].value + result.metrics["t2i_r1"].value) / 2,
                                  result.metrics["i2t_r1"].n)
    result.protocol, result.headline = PROTOCOL, "r1"
    result.skipped = dict(Counter(result.skipped) + skipped)
    return result


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [image.path for image in load_test_set(spec, folder, Counter())]


# test images (one long caption each) of the releases, by format
RELEASED_IMAGES = {"urban1k": 1_000, "docci": 5_000, "dci": 7_805, "sharegpt4v": 1_000}
IIW_IMAGES = {"IIW-400": 400, "DOCCI_Test": 100, "DCI_Test": 112}  # google/imageinwords datasets/ READMEs


def release_size(spec: dict[str, Any]) -> BenchmarkSize | None:
    name = spec.get("format") or spec.get("dataset")
    if name == "karpathy":
        images = retrieval.karpathy_test_images(spec)
        return BenchmarkSize(images, 5 * images, 0)
    if name == "iiw":
        images = sum(IIW_IMAGES[subset] for subset in iiw_subsets(spec))
        return BenchmarkSize(images, images, 0)
    return BenchmarkSize(RELEASED_IMAGES[name], RELEASED_IMAGES[name], 0) if name in RELEASED_IMAGES else None


def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection] | None:
    """As retrieval's; `r1`: the mean of the two directions' R@1."""
    if metric == "r1":
        return [selection for name in ("i2t_r1", "t2i_r1") for selection in retrieval.selections(name, metrics)]
    return retrieval.selections(metric, metrics)


BENCHMARKS = (
    Benchmark(kind="long_retrieval", source="Urban1k, DOCCI, DCI, ShareGPT4V-1k, ImageInWords test sets "
              "(Long-CLIP's and LoTLIP's protocols)",
              run=run, files=lambda spec, folder: long_retrieval_files(spec, folder), images=image_paths,
              size=release_size, headline="r1", subsets=(), chance=None,
              selections=selections,
              downloads=long_retrieval_downloads,
              keys={"format": Key({"enum": list(LONG_RETRIEVAL_FORMATS)}, "the release's layout: `karpathy` (default), "
                                  "`urban1k`, `docci`, `dci`, `sharegpt4v` (the first `holdout` records), `iiw` "
                                  "(ImageInWords' `<subset>/data.jsonl`, images in FLAIR's / LoTLIP's "
                                  "`imageinwords/` folders)", "LongCLIP, google/imageinwords"),
                    "file": Key({"type": ["string", "null"]}, "the annotation file's released name (default per "
                                "format: `docci_descriptions.jsonlines`, ...)"),
                    "holdout": Key(POSITIVE_INT, "format sharegpt4v: the leading records that form the test set "
                                   "(LongCLIP: 1000)", "LongCLIP"),
                    "subsets": Key({**NAMES, "items": {"enum": list(IIW_SUBSETS)}},
                                   "format iiw: the human-authored subsets scored as one test set (default "
                                   "`[IIW-400]`; FLAIR and LoTLIP score all three, 612 images)",
                                   "google/imageinwords `datasets/`, seed 004"),
                    "image_roots": Key(FOLDERS, "format iiw: an image folder per subset"),
                    "max_words": Key(POSITIVE_INT, "captions cut to this many words (headline `r1`: the mean of "
                                     "image->text and text->image R@1)", "seed 004")}),
)
