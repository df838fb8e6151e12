"""Training-dataset manifests: the synthetic world's split, or a real dataset read from its published files.

`build_manifest` writes one `manifest` table (one row per caption, `workflow/schemas/tables/manifest.yaml`)
and a one-row CSV report of what was read, kept and skipped, by reason. Every real format is read from
the files users download, in the layout the publishers ship:

- coco: Karpathy's `dataset_coco.json` or the official `annotations/captions_train2014.json`
  (cocodataset.org); short captions.
- cc3m, laion-coco: a TSV/CSV/parquet table or an img2dataset output folder (`_read_web_table`), in either of
  img2dataset's layouts: `files` (<shard>/<key>.jpg) or `webdataset` (<shard>.tar, recognised by
  `img2dataset_shards`: the images are read inside the shards, as source webdataset reads them); short
  captions (CC3M, Sharma et al. 2018; LAION-COCO's BLIP captions), cc3m also long (DreamLIP's CSV, read
  by column position as DreamLIP's loader reads it). `dreamlip_columns` picks other columns of DreamLIP's
  CSV (each a manifest row), e.g. `[shortLLA_captions]`, the short LLaVA captions C2LIP's script reads.
- sharegpt4v: `share-captioner_coco_lcs_sam_1246k_1107.json` (Lin-Chen/ShareGPT4V); long. Its first
  `holdout` records (default 1,000) are LongCLIP's ShareGPT4V-1k test set: they form split "test", so
  training (split "train", the default) never sees them.
- docci: `docci_descriptions.jsonlines` (google/docci); long.
- dci: the `densely_captioned_images` folder (facebookresearch/DCI); long = the sDCI summary, or short.
- localized-narratives: `*_localized_narratives*.jsonl` files (google/localized-narratives); long. The
  COCO train narratives ship as four shards: `path` may be a glob or a list of files, read in order.
- csv: your own image-caption table, as open_clip's `--dataset-type csv` reads it (`_read_csv_source`): a
  .csv, .tsv or .parquet file with a header naming an image column (`image_key`, default open_clip's
  `filepath`) and a caption column (`caption_key`, default `title`); `separator` overrides the suffix's
  (`,` for .csv, tab for .tsv; open_clip's own default is a tab). Image paths are relative to `image_root`
  (default: the table's folder; open_clip reads them from its working directory). short or long, as you say.
- webdataset: tar shards (img2dataset's `--output_format webdataset`, FSC-CLIP's released 100K subsets);
  `path` a shard, a folder of shards, a glob or a brace list (`{00000..00099}.tar`). Each sample's image
  stays in its shard: the manifest's image_path is `<shard>.tar#<member>`, opened by random access
  (compo.shards, which says why). `caption_key` (default `txt`: the <key>.txt member) names a field of
  <key>.json or, as FSC-CLIP reads CC3M's `coca_captions`, a folder of <json key>.txt files beside the
  shards; `image_extensions` the image members accepted (first present wins). A key given again
  (a later shard, the same shard, or a member twice in one sample) counts as records_repeated: its first
  sample is kept, with that sample's own image (a member name stored twice means its first member). A shard
  without the end-of-archive marker (cut short, even at a member boundary) is an error naming it.

Skips follow what the papers' loaders do and are counted, never silent: an image outside the requested
split, a caption that is empty, an image whose file is missing (web datasets have dead links), a DCI
image without an LLM summary (the DCI loader skips those too), and images past `limit`. Two more keep
later stages safe: a caption longer than `max_caption_chars` (default MAX_CAPTION_CHARS; no parser or
generator sees it, so none needs unbounded memory), and an image that does not decode in full or whose
path leaves `image_root` (as evaluation skips it, `compo.images`): every listed image is opened here (in
`threads` threads), so training never meets a broken one. A raw file that cannot be read, is not valid
JSON, or lacks a field the format requires is an error naming the file, the record and the field.

`path` is a file or folder, a glob (`*` / `?` / `[`: every match, sorted) or a list of them, read in that
order as one dataset. `limit: N` keeps the first N usable images in file order; `sample: N` keeps a
uniformly random N of the usable images instead (FSC-CLIP's "randomly sample 100K examples"), drawn by a
generator seeded with `sample_seed` (default 0, written to the report): the images are visited in a seeded
random order until N are kept, and the manifest lists them in file order. Both are deterministic.
`caption: longest` keeps one caption per image, its longest (most words, then most characters, the first of
equals): Concrete Jungle's anchor caption (seed 002 sec. 2.1); the others are counted, not kept.
Image paths are `image_root` joined with the path the record gives, and must stay inside it (an absolute
path counts when it lies inside; for a table of absolute paths anywhere, set `image_root` to their common
parent); a relative `image_root` stays relative to the working directory, like every path in the workflow.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from compo.images import (
    CORRUPT_IMAGE,
    MISSING_IMAGE,
    OUTSIDE_ROOT,
    OVERSIZED_IMAGE,
    OutsideRoot,
    image_exists,
    item_path,
    open_image,
)
from compo.io import read_table, write_table, write_text
from compo.paths import contained, has_visible_text, repeated
from compo.shards import (
    IMAGE_EXTENSIONS,
    TEXT_CAPTION_KEYS,
    ShardError,
    expand_braces,
    member_path,
    samples,
    shard_paths,
    shard_record,
    split_member,
)
from compo.sources import (
    COCO_2014,
    DCI,
    DOCCI_DESCRIPTIONS,
    DOCCI_IMAGES,
    KARPATHY,
    SHAREGPT4V_JSON,
    YOUR_OWN,
)

log = logging.getLogger(__name__)

# Caption kinds each source provides; the first is the default when the config gives none.
SOURCE_KINDS: dict[str, tuple[str, ...]] = {
    "coco": ("short",),
    "cc3m": ("short", "long"),
    "laion-coco": ("short",),
    "sharegpt4v": ("long",),
    "docci": ("long",),
    "dci": ("long", "short"),
    "localized-narratives": ("long",),
    "webdataset": ("short", "long"),
    "csv": ("short", "long"),
}

REPORT_COLUMNS = [
    "dataset", "source", "raw_path", "caption_kind",
    "records_read",          # raw records: images, annotations, lines or table rows, as the format has them
    "files_repeated",        # raw files listed more than once in `path` (read once)
    "records_repeated",      # records identical to one read before (a repeated COCO annotation; skipped)
    "images_read",           # distinct images after merging records of the same image
    "images_other_split",    # not in the requested split
    "captions_empty",        # captions skipped because they are empty (after whitespace is collapsed)
    "captions_no_text",      # captions without a letter or digit that renders (zero-width, BOM, Hangul filler...)
    "images_no_caption",     # images left without any caption
    "images_no_summary",     # DCI images without an LLM summary (only when long captions are asked for)
    "captions_too_long",     # captions longer than max_caption_chars (no later stage sees them)
    "images_missing_file",   # the image file does not exist (dead web entries, partial downloads)
    "images_outside_root",   # the record's image path leaves image_root ("../", an absolute path elsewhere)
    "images_corrupt",        # the file exists but does not decode (truncated, not an image)
    "images_oversized",      # more pixels than PIL's decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS)
    "images_beyond_limit",   # usable images past `limit`
    "images_not_sampled",    # usable images `sample` did not draw
    "images_in_shards",      # kept images read inside tar shards (<shard>.tar#<member>; the rest are files)
    "captions_not_longest",  # `caption: longest`: the other captions of a kept image
    "images_kept",
    "captions_kept",
    "sample_seed",           # the seed of `sample` ("none" without it)
]
COUNT_COLUMNS = REPORT_COLUMNS[4:-1]

# Source csv: the columns open_clip's CsvDataset reads by default (--csv-img-key, --csv-caption-key)
CSV_IMAGE_KEY = "filepath"
CSV_CAPTION_KEY = "title"
CSV_SEPARATORS = {".csv": ",", ".tsv": "\t"}  # by suffix, when `separator` is not given
# Web tables (cc3m, laion-coco). The first column present wins.
SHORT_CAPTION_COLUMNS = ("caption", "top_caption", "TEXT", "raw_caption")
# DreamLIP's CSV (cc3m_3long_3short_1raw_captions_url.csv), by position as its loader reads it
# (training/data.py read_long_csv): image, raw caption, then short/long captions of InstructBLIP,
# ShareGPT4V and LLaVA. The header row is skipped, never read: its names are not stable across releases.
DREAMLIP_COLUMNS = ("image_path", "raw_caption", "shortIB_captions", "longIB_captions", "shortSV_captions",
                    "longSV_captions", "shortLLA_captions", "longLLA_captions")
LONG_CAPTION_COLUMNS = ("longIB_captions", "longSV_captions", "longLLA_captions")  # DreamLIP: all are used
DREAMLIP_CAPTION_COLUMNS = DREAMLIP_COLUMNS[1:]  # what `dreamlip_columns` may name: every column but the image
SHAREGPT4V_HOLDOUT = 1000  # LongCLIP: the first 1,000 ShareGPT4V records are its test set
IMAGE_COLUMNS = ("image_path", "filepath", "file_name", "Image Path", "key", "url", "URL")
# img2dataset's default number_sample_per_shard (10,000) gives keys whose last 4 digits number the
# sample inside its shard; the files are saved as <shard>/<key>.jpg.
IMG2DATASET_SAMPLE_DIGITS = 4

SHOWN_EXAMPLES = 5  # skipped items named in the log per reason
# Captions longer than this (characters) are skipped here, so that no later stage (spaCy, the generators:
# some need memory quadratic in a caption's length) meets one; config datasets.<name>.max_caption_chars.
# The longest real captions are far below it (ShareGPT4V, DOCCI: a few thousand characters).
MAX_CAPTION_CHARS = 10_000
IMAGE_CHECK_WINDOW = 256  # images decoded at once (in `threads` threads) while filling `limit`


class RawDataError(ValueError):
    """A raw dataset file is missing, unreadable or lacks a field its format requires."""


@dataclass
class RawRecord:
    """One record of a raw file: an image (with its candidate paths) and the captions it gives."""

    image_id: str
    candidates: list[str]            # image paths to try, relative to image_root or absolute
    captions: list[str]
    where: str                       # locates the record in error messages, e.g. "line 7"
    split: str | None = None         # None: the format has no split field
    no_summary: bool = False         # DCI: the image has no LLM summary
    one_per_image: bool = False      # the format gives each image once: a repeated id is an error, not a merge
    repeat: bool = False             # identical to a record read before (counted, skipped)


@dataclass
class Counts:
    values: dict[str, int] = field(default_factory=lambda: {c: 0 for c in COUNT_COLUMNS})
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, n: int = 1, example: str | None = None) -> None:
        self.values[reason] += n
        if example is not None and len(self.examples.setdefault(reason, [])) < SHOWN_EXAMPLES:
            self.examples[reason].append(example)


# --------------------------------------------------------------------------------------------------
# entry point


def build_manifest(name: str, spec: dict[str, Any], out: str | Path, world_manifest: str | Path | None = None,
                   report: str | Path | None = None, threads: int = 1) -> None:
    """Write the manifest of dataset `name` (config entry `datasets.<name>` = `spec`) to `out`; `threads`
    decode the listed images."""
    source = spec.get("source")
    if source == "world":
        frame, counts, kind, raw_path = _from_world(name, spec, world_manifest, threads)
    elif source in SOURCE_KINDS:
        frame, counts, kind, raw_path = _from_raw(name, spec, threads)
    else:
        raise ValueError(f"datasets.{name}.source: unknown source {source!r} "
                         f"(expected world or one of {sorted(SOURCE_KINDS)})")
    _log_counts(name, counts)
    if frame.empty:
        raise RawDataError(f"{raw_path}: dataset {name!r} kept no captions of kind {kind!r} "
                           f"({_describe(counts)})")
    write_table(frame, out, "manifest")
    if report is not None:
        row = {"dataset": name, "source": source, "raw_path": str(raw_path), "caption_kind": kind,
               **counts.values, "sample_seed": spec.get("sample_seed", 0) if spec.get("sample") else "none"}
        buffer = io.StringIO()
        pd.DataFrame([row], columns=REPORT_COLUMNS).to_csv(buffer, index=False)
        write_text(buffer.getvalue(), report)


def _describe(counts: Counts) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.values.items())


def _log_counts(name: str, counts: Counts) -> None:
    log.info("dataset %s: %s", name, _describe(counts))
    for reason, examples in counts.examples.items():
        log.warning("dataset %s: %d %s, e.g. %s", name, counts.values[reason], reason, "; ".join(examples))


def _manifest_frame(rows: list[dict[str, str]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["image_id", "image_path", "caption_id", "caption", "dataset",
                                        "caption_kind"])
    for column in ("scene", "gt_noun_phrases", "grounded_words", "ungrounded_words"):
        frame[column] = None  # ground truth exists only for the synthetic world
    return frame


# --------------------------------------------------------------------------------------------------
# the synthetic world


def _from_world(name: str, spec: dict[str, Any], world_manifest: str | Path | None, threads: int = 1
                ) -> tuple[pd.DataFrame, Counts, str, Path]:
    if world_manifest is None:
        raise ValueError(f"datasets.{name}: source world needs the world split's manifest (--world-manifest)")
    kind = spec.get("captions", "short")
    for key in ("sample", "caption"):
        if spec.get(key) is not None:
            raise ValueError(f"datasets.{name}.{key}: applies to real datasets, not source world")
    frame = read_table(world_manifest, "manifest")
    counts = Counts()
    counts.add("records_read", len(frame))
    image_ids = list(dict.fromkeys(frame["image_id"]))
    counts.add("images_read", len(image_ids))
    frame = frame[frame["caption_kind"] == kind]
    kept_ids = list(dict.fromkeys(frame["image_id"]))
    counts.add("images_no_caption", len(image_ids) - len(kept_ids))
    if spec.get("limit") is not None and len(kept_ids) > spec["limit"]:
        counts.add("images_beyond_limit", len(kept_ids) - spec["limit"])
        frame = frame[frame["image_id"].isin(set(kept_ids[: spec["limit"]]))]
    too_long = frame["caption"].str.len() > int(spec.get("max_caption_chars", MAX_CAPTION_CHARS))
    for row in frame[too_long].itertuples():
        counts.add("captions_too_long", example=f"{row.caption_id} ({len(row.caption):,} characters)")
    frame = frame[~too_long]
    frame = frame[~frame["image_id"].isin(_unusable_world_images(frame, counts, threads))]
    frame = frame.assign(dataset=name).reset_index(drop=True)
    counts.add("images_kept", frame["image_id"].nunique())
    counts.add("captions_kept", len(frame))
    return frame, counts, kind, Path(world_manifest)


def _unusable_world_images(frame: pd.DataFrame, counts: Counts, threads: int) -> set[str]:
    """The image ids of a world split whose file is missing or does not decode (counted), which the world
    never writes; checked as real images are."""
    images = frame.drop_duplicates("image_id")
    with ThreadPoolExecutor(max(1, threads)) as pool:
        problems = list(pool.map(lambda path: _decode_problem(Path(path)), images["image_path"]))
    unusable = set()
    for image_id, path, problem in zip(images["image_id"], images["image_path"], problems, strict=True):
        if problem is not None:
            counts.add(_REPORT_COLUMN_OF[problem],
                       example=f"{image_id} ({path})")
            unusable.add(image_id)
    return unusable


# --------------------------------------------------------------------------------------------------
# real datasets: shared conversion


def _from_raw(name: str, spec: dict[str, Any], threads: int = 1) -> tuple[pd.DataFrame, Counts, str, Path]:
    source = spec["source"]
    kind = spec.get("captions", SOURCE_KINDS[source][0])
    if kind not in SOURCE_KINDS[source]:
        raise ValueError(f"datasets.{name}.captions: {source} provides {'/'.join(SOURCE_KINDS[source])} "
                         f"captions, not {kind!r}")
    if not spec.get("path"):
        raise ValueError(f"datasets.{name}.path: source {source} needs the path of its raw file")
    dreamlip_columns(spec, source, f"datasets.{name}.dreamlip_columns")  # before any file is read
    paths = raw_paths(spec["path"])
    for path in paths:
        if not path.exists():
            raise RawDataError(f"{path}: raw file of dataset {name!r} ({source}) not found")
    counts = Counts()
    twice = repeated(path.resolve() for path in paths)
    for file, n in twice.items():  # a shard listed twice would double its captions: read once, counted
        counts.add("files_repeated", n - 1, example=f"{file} ({n}x)")
    first_listed: dict[Path, Path] = {}
    for path in paths:
        first_listed.setdefault(path.resolve(), path)
    paths = list(first_listed.values())
    image_root = Path(spec["image_root"]) if spec.get("image_root") else default_image_root(source, paths[0])
    path = paths[0] if len(paths) == 1 else Path(",".join(map(str, paths)))  # names the input in messages

    images = _merge_records(read_records(source, paths, kind, image_root, spec.get("holdout"), spec,
                                         f"datasets.{name}.holdout"), path, counts)
    wanted = set(spec.get("split", "train").split("+"))
    held = SHAREGPT4V_HOLDOUT if spec.get("holdout") is None else int(spec["holdout"])
    if source == "sharegpt4v" and "train" in wanted and held >= counts.values["records_read"]:
        raise RawDataError(holdout_error(paths, f"datasets.{name}.holdout", held, counts.values["records_read"],
                                         "every record is held out, none left for split train"))
    _check_split(images, spec, path, name)
    if spec.get("limit") is not None and spec.get("sample") is not None:
        raise ValueError(f"datasets.{name}: give limit (the first N images) or sample (a random N), not both")
    limit = spec.get("limit") if spec.get("sample") is None else spec["sample"]
    beyond = "images_beyond_limit" if spec.get("sample") is None else "images_not_sampled"
    order = range(len(images))
    if spec.get("sample") is not None:  # a seeded random order: its first N usable images are a uniform sample
        order = np.random.default_rng(spec.get("sample_seed", 0)).permutation(len(images)).tolist()
    bound = int(spec.get("max_caption_chars", MAX_CAPTION_CHARS))
    usable: list[tuple[int, RawRecord, list[str]]] = []  # passed every check but the image's, in visit order
    for position in order:
        record = images[position]
        if record.split is not None and record.split not in wanted:
            counts.add("images_other_split")
            continue
        if record.no_summary:
            counts.add("images_no_summary", example=f"{record.image_id} ({record.where})")
            continue
        captions = [_clean(c) for c in record.captions]
        for _ in range(captions.count("")):
            counts.add("captions_empty", example=f"{record.image_id} ({record.where})")
        for caption in captions:
            if caption and not has_visible_text(caption):
                counts.add("captions_no_text", example=f"{record.image_id} ({record.where}: {caption!r:.40})")
        for caption in captions:
            if len(caption) > bound:
                counts.add("captions_too_long", example=f"{record.image_id} ({record.where}: {len(caption):,} "
                                                        "characters)")
        captions = [c for c in captions if has_visible_text(c) and len(c) <= bound]
        if not captions:
            counts.add("images_no_caption", example=f"{record.image_id} ({record.where})")
            continue
        usable.append((position, record, captions))
    rows: list[dict[str, str]] = []
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for start in range(0, len(usable), IMAGE_CHECK_WINDOW):
            window = usable[start : start + IMAGE_CHECK_WINDOW]
            if limit is not None and counts.values["images_kept"] >= limit:
                counts.add(beyond, len(window))  # no file check: a subset of a huge dataset stays cheap
                continue
            found = pool.map(lambda item: _find_image(item[1].candidates, image_root), window)
            for (position, record, captions), (image_path, skipped) in zip(window, found, strict=True):
                if limit is not None and counts.values["images_kept"] >= limit:
                    counts.add(beyond)
                    continue
                if image_path is None:
                    shown = record.candidates[0] if record.candidates else "no downloaded file"
                    counts.add(skipped, example=f"{record.image_id} ({shown})")
                    continue
                counts.add("images_kept")
                if split_member(image_path) is not None:
                    counts.add("images_in_shards")
                numbered = list(enumerate(captions))
                if spec.get("caption", "all") == "longest":
                    numbered = [max(numbered, key=lambda pair: (len(pair[1].split()), len(pair[1]), -pair[0]))]
                    counts.add("captions_not_longest", len(captions) - 1)
                for i, caption in numbered:
                    rows.append({"position": position, "image_id": record.image_id, "image_path": image_path,
                                 "caption_id": f"{record.image_id}#{i}", "caption": caption, "dataset": name,
                                 "caption_kind": kind})
                    counts.add("captions_kept")
    rows.sort(key=lambda row: row.pop("position"))  # file order, whatever order sampling visited
    return _with_shard_records(_manifest_frame(rows)), counts, kind, path


def _with_shard_records(frame: pd.DataFrame) -> pd.DataFrame:
    """The manifest with each row's shard size and sha256 (columns shard_bytes, shard_sha256) when any image lies
    in a tar shard: train.stage_shards trusts a staged copy only when it matches them. Each shard is hashed once,
    a sequential read beside the decode of each of its images this stage does anyway."""
    shards = [parts[0] if (parts := split_member(p)) else None for p in frame["image_path"]]
    if not any(shards):
        return frame  # images stored as files: the manifest as before
    records = {shard: shard_record(shard) for shard in dict.fromkeys(s for s in shards if s)}
    frame["shard_bytes"] = pd.array([records[s][0] if s else None for s in shards], dtype="Int64")
    frame["shard_sha256"] = [records[s][1] if s else None for s in shards]
    return frame


def raw_paths(value: str | list[str]) -> list[Path]:
    """The raw files a dataset's `path` names: a file or folder, a glob (every match, sorted), a brace list
    (webdataset's `{00000..00099}.tar`, `{a,b}`) or a list of them, in order. A glob that matches nothing
    is an error naming it."""
    values = value if isinstance(value, list) else [value]
    try:
        values = [expanded for item in values for expanded in expand_braces(str(item))]  # {00000..00099}.tar
    except ShardError as error:
        raise RawDataError(f"path: {error}") from error
    paths: list[Path] = []
    for item in values:
        if any(char in str(item) for char in "*?["):
            matches = sorted(glob.glob(str(item)))
            if not matches:
                raise RawDataError(f"{item}: no raw file matches this pattern")
            paths += [Path(match) for match in matches]
        else:
            paths.append(Path(item))
    if not paths:
        raise RawDataError("path: an empty list names no raw file")
    return paths


def default_image_root(source: str, path: Path) -> Path:
    """Where a source's images are when `image_root` is not given (relative to its raw file)."""
    return READERS[source][1](path)


def read_records(source: str, paths: list[Path], kind: str, image_root: Path,
                 holdout: int | None = None, spec: dict[str, Any] | None = None,
                 holdout_key: str = "holdout") -> Iterator[RawRecord]:
    """The raw records of one or more files of a source, in order (also read by the long-caption
    retrieval benchmarks). ShareGPT4V records get split "test" for the first `holdout` (default
    SHAREGPT4V_HOLDOUT, LongCLIP's test set) and "train" after; a file of fewer records than that is an error
    naming the file and `holdout_key` (read to its end: its test set would be smaller than asked). `spec`: the
    dataset's config entry, for the options of a source (webdataset's caption_key, image_extensions)."""
    reader = READERS[source][0]
    columns = dreamlip_columns(spec or {}, source)
    if columns:
        def reader(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
            return _read_web_table(path, kind, image_root, columns)
    elif source == "webdataset":
        options = spec or {}
        caption_key = str(options.get("caption_key", "txt"))
        extensions = tuple(e.lower().lstrip(".") for e in options.get("image_extensions", IMAGE_EXTENSIONS))
        seen_keys: set[str] = set()

        def reader(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
            return _read_webdataset(path, image_root, caption_key, extensions, seen_keys)
    elif source == "csv":
        options = spec or {}
        keys = (str(options.get("image_key", CSV_IMAGE_KEY)), str(options.get("caption_key", CSV_CAPTION_KEY)))
        separator = options.get("separator")
        seen_rows: set[tuple[str, tuple[str, ...]]] = set()

        def reader(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
            return _read_csv_source(path, *keys, separator, seen_rows)
    held = SHAREGPT4V_HOLDOUT if holdout is None else int(holdout)
    index = 0
    for path in paths:
        for record in reader(path, kind, image_root):
            if len(paths) > 1:
                record.where = f"{path.name}: {record.where}"
            if source == "sharegpt4v":
                record.split = "test" if index < held else "train"
            index += 1
            yield record
    if source == "sharegpt4v" and index < held:
        raise RawDataError(holdout_error(paths, holdout_key, held, index, "its test split would be smaller than "
                                         "asked"))


def holdout_error(paths: list[Path], key: str, held: int, records: int, outcome: str) -> str:
    """A ShareGPT4V `holdout` too large for its file, blamed on the holdout (not on the split it empties)."""
    files = ", ".join(str(path) for path in paths)
    return (f"{files}: {key} {held}: the file holds {records} record(s), and its first {held} form the test split "
            f"(LongCLIP's ShareGPT4V-1k: 1,000 of the full file); {outcome}. Expected a holdout below {records} "
            "(0: none held out), or the full file")


def _merge_records(records: Iterator[RawRecord], path: Path, counts: Counts) -> list[RawRecord]:
    """Group records of the same image (COCO annotations, several narrators), keeping first-seen order."""
    merged: dict[str, RawRecord] = {}
    for record in records:
        counts.add("records_read")
        if record.repeat:
            counts.add("records_repeated", example=f"{record.image_id} ({record.where})")
            continue
        seen = merged.get(record.image_id)
        if seen is not None and record.one_per_image:
            raise RawDataError(f"{path}: {record.where}: image id {record.image_id!r} already appeared at "
                               f"{seen.where}; expected each image once in this format")
        if seen is None:
            merged[record.image_id] = RawRecord(record.image_id, list(record.candidates),
                                                list(record.captions), record.where, record.split,
                                                record.no_summary)
            continue
        if seen.candidates != record.candidates or seen.split != record.split:
            raise RawDataError(f"{path}: {record.where}: image id {record.image_id!r} already appeared at "
                               f"{seen.where} with another image file or split "
                               f"({seen.candidates[:1]}, {seen.split!r} vs {record.candidates[:1]}, "
                               f"{record.split!r})")
        seen.captions.extend(record.captions)
    counts.add("images_read", len(merged))
    return list(merged.values())


def _check_split(images: list[RawRecord], spec: dict[str, Any], path: Path, name: str) -> None:
    available = {r.split for r in images if r.split is not None}
    if not available:
        if spec.get("split"):
            log.info("dataset %s: %s has no split field (the file is one split); split %r not applied",
                     name, path, spec["split"])
        return
    wanted = spec.get("split", "train").split("+")
    unknown = [s for s in wanted if s not in available]
    if unknown:
        raise ValueError(f"datasets.{name}.split: {'+'.join(unknown)} not in {path} "
                         f"(splits there: {', '.join(sorted(available))}; join several with '+')")
    if "train" in wanted and "restval" in available and "restval" not in wanted:
        log.info("dataset %s: split 'train' excludes Karpathy's restval images; use 'train+restval' for the "
                 "113K-image training set", name)


def _clean(caption: Any) -> str:
    # Raw captions carry newlines and tabs from annotation tools; they mean nothing to a tokenizer but
    # would break line-based reports downstream.
    if caption is None or (isinstance(caption, float) and caption != caption):  # None or NaN cell
        return ""
    return " ".join(str(caption).split())


def _find_image(candidates: list[str], image_root: Path) -> tuple[str | None, str]:
    """The first candidate file that exists, kept only when it lies inside image_root and decodes in full
    (what training will do with it): (its path, "") or (None, the report column of why not)."""
    skipped = "images_missing_file"
    for candidate in candidates:
        full = item_path(image_root, candidate)
        if isinstance(full, OutsideRoot):
            skipped = "images_outside_root"
            continue
        if image_exists(full):
            problem = _decode_problem(full)
            return (str(full), "") if problem is None else (None, _REPORT_COLUMN_OF[problem])
    return None, skipped


# compo.images' skip reason -> the data report's column that counts it
_REPORT_COLUMN_OF = {MISSING_IMAGE: "images_missing_file", CORRUPT_IMAGE: "images_corrupt",
                     OVERSIZED_IMAGE: "images_oversized", OUTSIDE_ROOT: "images_outside_root"}


def _decode_problem(path: Path) -> str | None:
    """None when the image file decodes in full, else why not (compo.images' skip reason)."""
    opened = open_image(path)
    return opened if isinstance(opened, str) else None


# --------------------------------------------------------------------------------------------------
# raw-file helpers


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise RawDataError(f"{path}: not valid JSON ({error})") from error
    except (OSError, UnicodeDecodeError) as error:
        raise RawDataError(f"{path}: cannot read ({error})") from error


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise RawDataError(f"{path}: cannot read ({error})") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise RawDataError(f"{path}: line {number}: not valid JSON ({error})") from error


def _field(record: Any, key: str, path: Path, where: str, expected: type | tuple[type, ...] = str) -> Any:
    """record[key], or an error naming the file, the record and the field."""
    if not isinstance(record, dict):
        raise RawDataError(f"{path}: {where}: expected a JSON object, got {type(record).__name__}")
    if key not in record:
        raise RawDataError(f"{path}: {where}: missing field {key!r}")
    value = record[key]
    if not isinstance(value, expected):
        names = "/".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
        raise RawDataError(f"{path}: {where}: field {key!r} should be {names}, got {type(value).__name__}")
    return value


def _id(value: Any) -> str:
    return str(value)


def _folder_of(path: Path) -> Path:
    return path if path.is_dir() else path.parent


# --------------------------------------------------------------------------------------------------
# COCO


def _read_coco(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
    """COCO captions, in either published JSON.

    Karpathy split (`dataset_coco.json`, from cs.stanford.edu/people/karpathy/deepimagesent): {"images":
    [{"filepath": "train2014"|"val2014", "filename", "cocoid", "split": train|restval|val|test,
    "sentences": [{"raw", "tokens", ...}]}]}. `split: train+restval` selects NegCLIP's 100K-image set.
    The same reader takes Karpathy's Flickr files (no cocoid/filepath: the file name names the image).
    Official (`annotations/captions_train2014.json`, cocodataset.org): {"images": [{"id", "file_name"}],
    "annotations": [{"image_id", "id", "caption"}]}; the file is one split, its images are in the
    sibling folder named after it (train2014/).
    """
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise RawDataError(f"{path}: expected a COCO captions JSON object with an 'images' list "
                           "(Karpathy dataset_coco.json or official captions_*.json)")
    if "annotations" in data:
        yield from _read_coco_official(data, path)
        return
    for index, image in enumerate(data["images"]):
        where = f"images[{index}]"
        filename = _field(image, "filename", path, where)
        image_id = _id(image["cocoid"]) if "cocoid" in image else Path(filename).stem
        where = f"images[{index}] (cocoid {image_id})"
        sentences = _field(image, "sentences", path, where, list)
        captions = [_field(s, "raw", path, f"{where} sentences[{j}]", (str, type(None)))
                    for j, s in enumerate(sentences)]
        folder = image.get("filepath", "")
        yield RawRecord(image_id, [str(Path(folder) / filename)], captions, where,
                        split=_field(image, "split", path, where), one_per_image=True)


def _read_coco_official(data: dict[str, Any], path: Path) -> Iterator[RawRecord]:
    if not isinstance(data["annotations"], list):
        raise RawDataError(f"{path}: field 'annotations' should be a list")
    # Images live in the folder the annotation file is named after (captions_train2014 -> train2014/).
    folder = path.stem.removeprefix("captions_")
    files: dict[str, str] = {}
    first: dict[str, int] = {}
    for index, image in enumerate(data["images"]):
        where = f"images[{index}]"
        image_id = _id(_field(image, "id", path, where, (int, str)))
        if image_id in first:  # which file would its captions describe?
            raise RawDataError(f"{path}: {where}: image id {image_id} already given at images[{first[image_id]}]; "
                               "expected each image once")
        first[image_id] = index
        files[image_id] = _field(image, "file_name", path, where)
    annotations: dict[Any, tuple[int, Any]] = {}
    for index, annotation in enumerate(data["annotations"]):
        where = f"annotations[{index}]"
        image_id = _id(_field(annotation, "image_id", path, where, (int, str)))
        if image_id not in files:
            raise RawDataError(f"{path}: {where}: image_id {image_id} is not in 'images'")
        caption = _field(annotation, "caption", path, where, (str, type(None)))
        name = files[image_id]
        key = annotation.get("id", json.dumps(annotation, sort_keys=True))
        earlier = annotations.setdefault(key, (index, annotation))
        if earlier[0] != index and earlier[1] != annotation:
            raise RawDataError(f"{path}: {where}: annotation id {key} already given at annotations[{earlier[0]}] "
                               "with other content; expected each annotation once")
        yield RawRecord(image_id, [f"{folder}/{name}", name], [caption], f"{where} (image_id {image_id})",
                        repeat=earlier[0] != index)


def _coco_root(path: Path) -> Path:
    # Official layout: <root>/annotations/captions_*.json next to <root>/train2014/.
    return path.parent.parent if path.parent.name == "annotations" else path.parent


# --------------------------------------------------------------------------------------------------
# CC3M and LAION-COCO


def dreamlip_columns(spec: dict[str, Any], source: str, key: str = "dreamlip_columns") -> tuple[str, ...]:
    """The DreamLIP CSV columns a dataset entry's `dreamlip_columns` names (() when it names none); an error
    names the key (`key`: its config path), the column and what is expected."""
    columns = tuple(spec.get("dreamlip_columns") or ())
    if columns and source != "cc3m":
        raise ValueError(f"{key}: DreamLIP's CSV is CC3M's (source cc3m), not source {source!r}")
    unknown = [c for c in columns if c not in DREAMLIP_CAPTION_COLUMNS]
    if unknown:
        raise ValueError(f"{key}: {', '.join(map(repr, unknown))} not a caption column of DreamLIP's CSV "
                         f"(expected some of {', '.join(DREAMLIP_CAPTION_COLUMNS)})")
    return columns


def _read_web_table(path: Path, kind: str, image_root: Path, dreamlip: tuple[str, ...] = ()) -> Iterator[RawRecord]:
    """Web image-caption tables (CC3M, LAION-COCO, DreamLIP's CC3M long captions).

    `path` is a .tsv, .csv or .parquet file, or a folder of parquet files (img2dataset's output: one
    <shard>.parquet per <shard>/ folder of images, with columns key, url, caption, status).
    - Captions, short: the first of caption, top_caption (LAION-COCO's BLIP caption), TEXT (LAION alt
      text), raw_caption. Long (DreamLIP, `cc3m_3long_3short_1raw_captions_url.csv`): the file is read by
      column position as DreamLIP reads it (DREAMLIP_COLUMNS, header row skipped), and the three long
      captions (InstructBLIP, ShareGPT4V, LLaVA) give one manifest row each; `dreamlip` (a dataset's
      `dreamlip_columns`) reads DreamLIP's CSV the same way, those columns instead, whatever the kind.
    - Image: the first of image_path, filepath, file_name, Image Path (a path, or a URL), key
      (img2dataset: <image_root>/<shard>/<key>.jpg), url, URL. A URL is looked up in the img2dataset
      shard parquets under image_root (url -> key, status success); not downloaded = missing image.
    - A TSV/CSV whose first line names none of these columns has no header: caption, then image path or
      URL (CC3M's `Train_GCC-training.tsv`: caption \\t url).
    The image id is the img2dataset key when there is one, else the path (or URL) the table gives.
    img2dataset's `webdataset` layout (`img2dataset_shards`): a key's image is the member <key>.jpg of
    <image_root>/<shard>.tar; a folder of shards without parquet files (as FSC-CLIP releases them) is read
    sample by sample, the caption from each <key>.txt (where img2dataset writes its caption column).
    """
    shards = img2dataset_shards(image_root)
    if kind == "short" and path.is_dir() and shards and not any(path.glob("*.parquet")):
        log.info("%s: img2dataset's webdataset layout without parquet files: captions from the shards", path)
        yield from _read_webdataset(path, image_root, "txt", IMAGE_EXTENSIONS, set())
        return
    table = _read_dreamlip(path) if kind == "long" or dreamlip else _load_web_table(path)
    caption_columns = list(dreamlip) or _caption_columns(table, kind, path)
    image_column = next((c for c in IMAGE_COLUMNS if c in table.columns), None)
    if image_column is None:
        raise RawDataError(f"{path}: no image column (expected one of {', '.join(IMAGE_COLUMNS)}); "
                           f"columns: {', '.join(map(str, table.columns))}")
    if shards and image_column in ("key", "url", "URL", "image_path"):
        log.info("%s: img2dataset's webdataset layout (%d shards): images read inside them", image_root, len(shards))
    url_to_key: dict[str, str] | None = None
    for index, row in enumerate(table.itertuples(index=False)):
        values = dict(zip(table.columns, row, strict=True))
        where = f"row {index + 1}"
        _cell_type(values[image_column], image_column, path, where)
        image = _clean(values[image_column])
        if not image:
            raise RawDataError(f"{path}: {where}: empty image field {image_column!r}")
        key = _clean(values.get("key"))
        if image_column == "key":
            candidates = _img2dataset_files(key, bool(shards))
        elif image.startswith(("http://", "https://")):
            if url_to_key is None:
                url_to_key = _img2dataset_index(image_root, path)
            key = url_to_key.get(image, "")
            candidates = _img2dataset_files(key, bool(shards)) if key else []  # not downloaded: a dead link
        else:
            candidates = [image]
        yield RawRecord(key or image, candidates, _row_captions(values, caption_columns, path, where), where)


def _load_web_table(path: Path) -> pd.DataFrame:
    try:
        if path.is_dir():
            shards = sorted(path.glob("*.parquet"))
            if not shards:
                raise RawDataError(f"{path}: folder holds no parquet files (expected img2dataset output)")
            return pd.concat([pd.read_parquet(s) for s in shards], ignore_index=True)
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix in (".tsv", ".csv"):
            return _read_delimited(path)
    except (OSError, ValueError) as error:
        if isinstance(error, RawDataError):
            raise
        raise RawDataError(f"{path}: cannot read the table ({error})") from error
    raise RawDataError(f"{path}: expected a .tsv, .csv or .parquet file or an img2dataset folder")


def _read_dreamlip(path: Path) -> pd.DataFrame:
    """DreamLIP's long-caption CSV by position (its loader's read_long_csv): the first row is a header and
    is skipped; every other row needs the 8 columns of DREAMLIP_COLUMNS (more are ignored)."""
    if path.suffix != ".csv":
        raise RawDataError(f"{path}: long CC3M captions and dreamlip_columns are read from DreamLIP's CSV "
                           "(cc3m_3long_3short_1raw_captions_url.csv)")
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise RawDataError(f"{path}: cannot read the table ({error})") from error
    body = [row for row in rows[1:] if row]  # DreamLIP skips row 0 and empty lines
    if not body:
        raise RawDataError(f"{path}: no rows after the header")
    for number, row in enumerate(rows[1:], start=2):
        if row and len(row) < len(DREAMLIP_COLUMNS):
            raise RawDataError(f"{path}: row {number}: {len(row)} fields, DreamLIP's layout has "
                               f"{len(DREAMLIP_COLUMNS)} ({', '.join(DREAMLIP_COLUMNS)})")
    return pd.DataFrame([row[: len(DREAMLIP_COLUMNS)] for row in body], columns=list(DREAMLIP_COLUMNS))


def _read_delimited(path: Path) -> pd.DataFrame:
    tsv = path.suffix == ".tsv"
    with path.open(encoding="utf-8", newline="") as handle:
        # CC3M's TSV is unquoted (captions contain quote characters); CSV files use standard quoting.
        reader = csv.reader(handle, delimiter="\t" if tsv else ",",
                            quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
        rows = list(reader)
    if not rows:
        raise RawDataError(f"{path}: empty table")
    known = set(SHORT_CAPTION_COLUMNS + LONG_CAPTION_COLUMNS + IMAGE_COLUMNS)
    if known & set(rows[0]):
        header, body = rows[0], rows[1:]
    else:
        if len(rows[0]) < 2:
            raise RawDataError(f"{path}: line 1: a table without header needs caption and image columns")
        image = "url" if rows[0][1].startswith(("http://", "https://")) else "image_path"
        header, body = ["caption", image] + [f"column{i}" for i in range(3, len(rows[0]) + 1)], rows
    for number, row in enumerate(body, start=len(rows) - len(body) + 1):
        if len(row) != len(header):
            raise RawDataError(f"{path}: line {number}: {len(row)} fields, the header has {len(header)}")
    return pd.DataFrame(body, columns=header)


def _caption_columns(table: pd.DataFrame, kind: str, path: Path) -> list[str]:
    if kind == "long":
        columns = [c for c in LONG_CAPTION_COLUMNS if c in table.columns]
        expected = ", ".join(LONG_CAPTION_COLUMNS)
    else:
        columns = [c for c in SHORT_CAPTION_COLUMNS if c in table.columns][:1]
        expected = ", ".join(SHORT_CAPTION_COLUMNS)
    if not columns:
        raise RawDataError(f"{path}: no {kind} caption column (expected one of {expected}); "
                           f"columns: {', '.join(map(str, table.columns))}")
    return columns


def _row_captions(values: dict[str, Any], columns: list[str], path: Path, where: str) -> list[str]:
    captions: list[str] = []
    for column in columns:
        value = values[column]
        if hasattr(value, "tolist"):  # a parquet list cell
            value = value.tolist()
        for caption in value if isinstance(value, list) else [value]:
            captions.append(_cell_type(caption, column, path, where))
    return captions


def _cell_type(value: Any, column: str, path: Path, where: str) -> Any:
    """A caption or image cell must be a string (or empty): a parquet column of integers or structs would
    otherwise be read as '101' or a Python repr. An error names the column and the type."""
    empty = value is None or (isinstance(value, float) and value != value)
    if not (empty or isinstance(value, str)):
        raise RawDataError(f"{path}: {where}: column {column!r} holds {type(value).__name__} {value!r:.40}; "
                           "expected a string (a caption, an image path, URL or img2dataset key)")
    return value


def img2dataset_shards(folder: Path) -> list[Path]:
    """The <shard>.tar files of img2dataset's `--output_format webdataset` in `folder` (sorted; its
    <shard>.parquet and <shard>_stats.json lie beside them), or [] for another layout (`files`: <shard>/
    folders of images). The one test of which layout an img2dataset output folder holds."""
    return sorted(folder.glob("*.tar")) if folder.is_dir() else []


def _img2dataset_files(key: str, in_shards: bool) -> list[str]:
    """Where img2dataset saved the image of `key`, relative to its output folder: <shard>/<key>.jpg
    (`files`), or the member <key>.jpg of <shard>.tar (`webdataset`)."""
    shard = key[:-IMG2DATASET_SAMPLE_DIGITS]
    return [member_path(f"{shard}.tar", f"{key}.jpg")] if in_shards else [f"{shard}/{key}.jpg", f"{key}.jpg"]


def _img2dataset_index(image_root: Path, path: Path) -> dict[str, str]:
    """url -> key of the images img2dataset downloaded into image_root."""
    shards = sorted(image_root.glob("*.parquet"))
    if not shards:
        raise RawDataError(f"{path}: the image column holds URLs, so image_root ({image_root}) must be an "
                           "img2dataset output folder (its <shard>.parquet files map url to key)")
    index: dict[str, str] = {}
    for shard in shards:
        table = pd.read_parquet(shard)
        for column in ("url", "key"):
            if column not in table.columns:
                raise RawDataError(f"{shard}: missing column {column!r} (expected img2dataset output)")
        if "status" in table.columns:
            table = table[table["status"] == "success"]
        index.update(zip(table["url"].astype(str), table["key"].astype(str), strict=True))
    return index


def _web_root(path: Path) -> Path:
    return _folder_of(path)


# --------------------------------------------------------------------------------------------------
# ShareGPT4V


def _read_sharegpt4v(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
    """ShareGPT4V captions (`share-captioner_coco_lcs_sam_1246k_1107.json`, 1.2M ShareCaptioner captions;
    also `sharegpt4v_instruct_gpt4-vision_cap100k.json`): a list of {"id", "image": path relative to the
    data folder (coco/train2017/..., sam/images/..., llava/llava_pretrain/images/...), "conversations":
    [{"from": "human", "value": "<image>\\n<prompt>"}, {"from": "gpt", "value": <caption>}]}. The caption
    is the first gpt turn."""
    data = _load_json(path)
    if not isinstance(data, list):
        raise RawDataError(f"{path}: expected a JSON list of ShareGPT4V records")
    for index, item in enumerate(data):
        where = f"record {index}"
        image_id = _id(_field(item, "id", path, where, (str, int)))
        where = f"record {index} (id {image_id})"
        image = _field(item, "image", path, where)
        turns = _field(item, "conversations", path, where, list)
        answers = [_field(t, "value", path, f"{where} conversations[{j}]", (str, type(None)))
                   for j, t in enumerate(turns) if isinstance(t, dict) and t.get("from") == "gpt"]
        if not answers:
            raise RawDataError(f"{path}: {where}: no conversation turn from 'gpt' (the caption)")
        yield RawRecord(image_id, [image], answers[:1], where)


# --------------------------------------------------------------------------------------------------
# DOCCI


def _read_docci(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
    """DOCCI (`docci_descriptions.jsonlines`, google.github.io/docci): one JSON object per line with
    example_id, split (train | test | qual_dev | qual_test), image_file and description (the
    human-written long caption). Images are in `images/` next to the file (docci_images.tar.gz)."""
    for number, item in _json_lines(path):
        where = f"line {number}"
        image_id = _id(_field(item, "example_id", path, where))
        where = f"line {number} (example_id {image_id})"
        yield RawRecord(image_id, [_field(item, "image_file", path, where)],
                        [_field(item, "description", path, where, (str, type(None)))], where,
                        split=_field(item, "split", path, where), one_per_image=True)


def _docci_root(path: Path) -> Path:
    return path.parent / "images"


# --------------------------------------------------------------------------------------------------
# DCI (densely captioned images) and its summarized version sDCI


def _read_dci(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
    """DCI (github.com/facebookresearch/DCI, dci.tar.gz): `path` is the `densely_captioned_images` folder
    with complete/<entry>.json (one per image: image (path under photos/), short_caption,
    extra_caption, mask_data, summaries, negatives), photos/, and splits.json ({"train"|"valid"|"test":
    [entry file names]}). Long captions are sDCI's: the LLM summary of the whole image, summaries["base"]
    (a string or a list whose first item the DCI loader uses); images without summaries are skipped, as
    the DCI loader skips them. Short captions are short_caption."""
    complete = path / "complete"
    if not complete.is_dir():
        raise RawDataError(f"{path}: expected the densely_captioned_images folder (no complete/ inside)")
    splits_file = path / "splits.json"
    if splits_file.exists():
        splits = _load_json(splits_file)
        if not isinstance(splits, dict):
            raise RawDataError(f"{splits_file}: expected an object of split name -> entry file names")
        entries = [(str(entry), split) for split, names in splits.items() for entry in names]
    else:
        entries = [(p.name, None) for p in sorted(complete.glob("*.json"))]
    for entry, split in entries:
        listed = splits_file if split is not None else complete  # a link in complete/ is followed too
        entry_path = contained(complete, entry, source=str(listed), entry=f"split {split!r} entry")
        image_id = Path(entry).stem
        if not entry_path.exists():
            raise RawDataError(f"{entry_path}: annotation listed in {splits_file.name} not found")
        data = _load_json(entry_path)
        where = f"entry {entry}"
        image = _field(data, "image", entry_path, where)
        if kind == "short":
            short = _field(data, "short_caption", entry_path, where, (str, type(None)))
            captions, no_summary = [short], False
        else:
            summary = _dci_summary(data, entry_path, where)
            captions, no_summary = ([summary] if summary is not None else []), summary is None
        yield RawRecord(image_id, [image], captions, where, split=split, no_summary=no_summary)


def _dci_summary(data: dict[str, Any], path: Path, where: str) -> str | None:
    summaries = data.get("summaries")
    if summaries is None:
        return None
    base = _field(summaries, "base", path, f"{where} summaries", (str, list))
    if isinstance(base, list):
        if not base or not isinstance(base[0], str):
            raise RawDataError(f"{path}: {where}: summaries['base'] should hold at least one string")
        return base[0]
    return base


def _dci_root(path: Path) -> Path:
    return path / "photos"


# --------------------------------------------------------------------------------------------------
# Localized Narratives


def _read_localized_narratives(path: Path, kind: str, image_root: Path) -> Iterator[RawRecord]:
    """Localized Narratives (google.github.io/localized-narratives), e.g.
    `coco_train_localized_narratives-00000-of-00004.jsonl`: one narrative per line with dataset_id,
    image_id, annotator_id, caption, timed_caption, traces, voice_recording. Narratives of the same image
    by several annotators become several captions of one image. Image files under image_root:
    - COCO (dataset_id mscoco_train2017 / mscoco_val2017): train2017/000000137576.jpg (zero-padded to 12
      digits, in the folder the dataset_id names) or 000000137576.jpg directly;
    - Open Images, Flickr30k, ADE20k: <image_id>.jpg (e.g. 0a1b2c3d4e5f6789.jpg, 1000092795.jpg,
      ADE_train_00000001.jpg).
    Each file is one split, so `split` does not apply."""
    for number, item in _json_lines(path):
        where = f"line {number}"
        dataset_id = _field(item, "dataset_id", path, where)
        image_id = _id(_field(item, "image_id", path, where, (str, int)))
        where = f"line {number} (image_id {image_id})"
        _field(item, "annotator_id", path, where, (int, str))
        caption = _field(item, "caption", path, where, (str, type(None)))
        if dataset_id.startswith("mscoco_"):
            if not image_id.isdigit():
                raise RawDataError(f"{path}: {where}: COCO image_id should be a number")
            name = f"{int(image_id):012d}.jpg"
            candidates = [f"{dataset_id.removeprefix('mscoco_')}/{name}", name]
        else:
            candidates = [f"{image_id}.jpg"]
        yield RawRecord(image_id, candidates, [caption], where)


# --------------------------------------------------------------------------------------------------
# csv: your own image-caption table (open_clip's CsvDataset)


def _read_csv_source(path: Path, image_key: str, caption_key: str, separator: str | None,
                     seen: set[tuple[str, tuple[str, ...]]]) -> Iterator[RawRecord]:
    """One record per row of a .csv / .tsv / .parquet table: the image path in column `image_key`, the caption
    in `caption_key` (a parquet list cell: several captions). Rows naming one image are one image with their
    captions; a row identical to one before (in any file of the dataset) is counted as repeated and skipped.
    A column missing is an error naming the file, the key and the columns the header has; an empty image cell
    or a URL (download the images first: img2dataset, then source cc3m) is an error naming the row."""
    header, rows = _csv_source_rows(path, separator)
    for option, column, default in (("image_key", image_key, CSV_IMAGE_KEY),
                                    ("caption_key", caption_key, CSV_CAPTION_KEY)):
        if column not in header:
            hint = ""
            if separator is None and len(header) == 1 and any(c in header[0] for c in "\t,;|"):
                hint = "; one column only: is the file separated by another character? (set `separator`)"
            default_note = " (the default, as open_clip's)" if column == default else ""
            raise RawDataError(f"{path}: {option} {column!r}{default_note} names no column of the table; columns "
                               f"found: {', '.join(map(repr, header))}{hint}")
    for where, values in rows:
        image = _cell_type(values[image_key], image_key, path, where)
        if not isinstance(image, str) or not image.strip():  # None or NaN: an empty cell
            raise RawDataError(f"{path}: {where}: empty image cell (column {image_key!r})")
        if image.startswith(("http://", "https://")):
            raise RawDataError(f"{path}: {where}: column {image_key!r} holds a URL ({image[:60]}); source csv reads "
                               "image files: download them first (img2dataset) and read its output with source cc3m")
        captions = _row_captions(values, [caption_key], path, where)
        identity = (image, tuple("" if c is None or isinstance(c, float) else c for c in captions))
        yield RawRecord(image, [image], captions, where, repeat=identity in seen)
        seen.add(identity)


def _csv_source_rows(path: Path, separator: str | None) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    """The header and the (where, row) pairs of a source csv table: a parquet file's columns, or a delimited
    file read with standard quoting (double quotes, as pandas and so open_clip read it), each line checked to
    have the header's number of fields as it is read."""
    if path.is_dir():
        raise RawDataError(f"{path}: source csv reads a .csv, .tsv or .parquet file, not a folder")
    if path.suffix == ".parquet":
        try:
            table = pd.read_parquet(path)
        except (OSError, ValueError) as error:
            raise RawDataError(f"{path}: cannot read the table ({error})") from error
        header = [str(c) for c in table.columns]
        return header, ((f"row {i + 1}", dict(zip(header, row, strict=True)))
                        for i, row in enumerate(table.itertuples(index=False)))
    delimiter = separator or CSV_SEPARATORS.get(path.suffix)
    if delimiter is None:
        raise RawDataError(f"{path}: source csv reads .csv, .tsv or .parquet files; for another suffix give the "
                           "dataset's `separator`")
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:  # -sig: a byte-order mark is not the header's
            reader = csv.reader(handle, delimiter=delimiter)
            lines = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise RawDataError(f"{path}: cannot read the table ({error})") from error
    if not lines:
        raise RawDataError(f"{path}: empty table (expected a header line naming the image and caption columns)")
    header = lines[0][1]
    twice = repeated(header)
    if twice:
        raise RawDataError(f"{path}: line 1: column {next(iter(twice))!r} named twice in the header; expected each "
                           "column once")

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:  # lazily: the caller checks the header's columns first
        for number, row in lines[1:]:
            if not row:
                continue  # a blank line (pandas skips them too)
            if len(row) != len(header):
                raise RawDataError(f"{path}: line {number}: {len(row)} fields, the header has {len(header)} "
                                   f"(separator {delimiter!r})")
            yield f"line {number}", dict(zip(header, row, strict=True))

    return header, rows()


# --------------------------------------------------------------------------------------------------
# webdataset tar shards


def _read_webdataset(path: Path, image_root: Path, caption_key: str, extensions: tuple[str, ...],
                     seen_keys: set[str]) -> Iterator[RawRecord]:
    """The samples of the shards `path` names (a .tar or a folder of them), one record per key. The image is
    the sample's first member with an extension in `extensions`; none: a missing image (counted). The
    caption: the <key>.txt member, or with another `caption_key` (FSC-CLIP's --caption-key) the field of
    <key>.json, else the first line of <shards folder>/<caption_key>/<json key>.txt. A key seen before
    (in any shard of the dataset) is marked repeated: counted, skipped, as webdataset would train on it twice."""
    try:
        shards = shard_paths(path)
    except ShardError as error:
        raise RawDataError(str(error)) from error
    for shard in shards:
        try:
            relative = str(shard.relative_to(image_root))
        except ValueError:
            relative = str(shard.absolute())  # item_path then checks it lies inside image_root
        try:
            for sample in samples(shard):
                where = f"{shard.name}: key {sample.key}"
                image = next((sample.members[e] for e in extensions if e in sample.members), None)
                caption = _webdataset_caption(sample.texts, sample.key, caption_key, shard, where)
                yield RawRecord(sample.key, [member_path(relative, image)] if image else [],
                                [] if caption is None else [caption], where, repeat=sample.key in seen_keys)
                seen_keys.add(sample.key)
        except ShardError as error:
            raise RawDataError(str(error)) from error


def _webdataset_caption(texts: dict[str, bytes], key: str, caption_key: str, shard: Path, where: str
                        ) -> str | None:
    def decoded(extension: str) -> str:
        try:
            return texts[extension].decode("utf-8")
        except UnicodeDecodeError as error:
            raise RawDataError(f"{shard}: {where}: member {key}.{extension} is not UTF-8 text ({error})") from error

    if caption_key in TEXT_CAPTION_KEYS:
        return decoded("txt") if "txt" in texts else None
    if "json" not in texts:
        raise RawDataError(f"{shard}: {where}: caption_key {caption_key!r} is read from the sample's .json "
                           "member, which it lacks")
    try:
        metadata = json.loads(decoded("json"))
    except json.JSONDecodeError as error:
        raise RawDataError(f"{shard}: {where}: {key}.json is not valid JSON ({error})") from error
    if not isinstance(metadata, dict):
        raise RawDataError(f"{shard}: {where}: {key}.json should be an object")
    if caption_key in metadata:
        return _cell_type(metadata[caption_key], caption_key, shard, where)
    folder = shard.parent / caption_key  # FSC-CLIP's coca_captions/<key>.txt beside the shards
    if not folder.is_dir():
        raise RawDataError(f"{shard}: {where}: caption_key {caption_key!r} is neither a field of {key}.json nor a "
                           f"folder {folder} of <key>.txt captions")
    file_key = str(_field(metadata, "key", shard, f"{where} ({key}.json)", (str, int)))
    caption_file = contained(folder, f"{file_key}.txt", source=f"{shard}: {key}.json", entry="field 'key'")
    if not caption_file.is_file():
        return None  # no caption for this sample: counted as an image without caption
    try:
        with caption_file.open(encoding="utf-8") as handle:
            return handle.readline()  # FSC-CLIP reads the first line
    except (OSError, UnicodeDecodeError) as error:
        raise RawDataError(f"{caption_file}: cannot read the caption ({error})") from error


# source -> (reader, default image_root from the raw path)
READERS: dict[str, tuple[Callable[[Path, str, Path], Iterator[RawRecord]], Callable[[Path], Path]]] = {
    "coco": (_read_coco, _coco_root),
    "cc3m": (_read_web_table, _web_root),
    "laion-coco": (_read_web_table, _web_root),
    "sharegpt4v": (_read_sharegpt4v, _folder_of),
    "docci": (_read_docci, _docci_root),
    "dci": (_read_dci, _dci_root),
    "localized-narratives": (_read_localized_narratives, _folder_of),
    "webdataset": (_read_webdataset, _folder_of),  # read_records binds its options
    "csv": (_read_csv_source, _folder_of),  # read_records binds its options
}
# source -> {key leaf: "address; layout"}: where a source's release comes from (`compo inputs --template` writes it
# beside the key); every source of READERS has its `path` (tests/test_data.py)
DOWNLOADS: dict[str, dict[str, str]] = {
    "coco": {"path": f"{KARPATHY}; dataset_coco.json", "image_root": COCO_2014},
    "cc3m": {"path": "DreamLIP's README (github.com/zyf0619sjtu/DreamLIP): its CC3M caption CSV",
             "image_root": "img2dataset of the CSV's URLs; its output folder"},
    "laion-coco": {"path": "huggingface.co/datasets/laion/laion-coco (its parquet of URLs and captions)",
                   "image_root": "img2dataset of its URLs; its output folder"},
    "sharegpt4v": {"path": SHAREGPT4V_JSON,
                   "image_root": "github.com/ShareGPT4Omni/ShareGPT4V docs/Data.md; coco/, sam/, ..."},
    "docci": {"path": f"{DOCCI_DESCRIPTIONS}; the file", "image_root": DOCCI_IMAGES},
    "dci": {"path": f"{DCI} (its download script); densely_captioned_images/",
            "image_root": f"{DCI} (SA-1B photos); photos/"},
    "localized-narratives": {"path": "google.github.io/localized-narratives; the 4 COCO train jsonl",
                             "image_root": "cocodataset.org train2017.zip; train2017/"},
    "webdataset": {"path": f"{YOUR_OWN}: webdataset tar shards (img2dataset --output_format webdataset)"},
    "csv": {"path": f"{YOUR_OWN}: a CSV / TSV / parquet of image paths and captions", "image_root": YOUR_OWN},
}
