"""The raw inputs a config names (datasets, image folders, benchmark files, class names, templates, norms, local
base weights), each with the config key that names it, and the check that they exist.

The Snakefile runs `check_raw_inputs` while the DAG is built, so a missing file is reported before
anything is submitted, all at once, each with its key, rather than one MissingInputException at a time
(or, for the paths no rule declares as an input, such as VALSE's image folders, hours later in a job).
`compo inputs` prints the same list (README's step 2 is that list for config/paper.yaml). An entry whose data
is released on the Hugging Face Hub (`hub`, compo.artifacts) has its paths inside the model cache, filled by
`compo prefetch`: its inputs carry the repository (`hub`), say where they resolve, and are not paths to set.
No torch here: it runs on every DAG build.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from compo.artifacts import DATA_SECTIONS, dataset_folder, model_cache
from compo.data import DOWNLOADS, RawDataError, default_image_root, raw_paths
from compo.evaluate.files import VALSE_PIECES, BenchmarkError, valse_pieces
from compo.evaluate.kinds import benchmark_files, declared
from compo.sources import BRYSBAERT
from compo.study import norms_files, released_negatives


@dataclass(frozen=True)
class RawInput:
    """One path the config names: `key` is the config key, `path` the file or folder (a glob for a dataset
    path given as a pattern), `what` a few words on what it is, `hub` the Hugging Face dataset `compo prefetch`
    fetches it from (None: a path the user sets)."""

    key: str
    path: str
    what: str
    hub: str | None = None


def _dataset_inputs(name: str, spec: dict[str, Any]) -> list[RawInput]:
    if spec["source"] == "world":
        return []
    paths = spec["path"] if isinstance(spec["path"], list) else [spec["path"]]
    found = [RawInput(f"datasets.{name}.path", str(p), f"{spec['source']} annotation file") for p in paths]
    if spec.get("image_root"):
        found.append(RawInput(f"datasets.{name}.image_root", str(spec["image_root"]), "image folder"))
    else:
        try:
            root = default_image_root(spec["source"], raw_paths(spec["path"])[0])
        except RawDataError:
            root = None  # the path itself is reported missing
        if root is not None:
            found.append(RawInput(f"datasets.{name}.image_root", str(root),
                                  "image folder (unset: the source's default next to its path)"))
    return found


def _benchmark_keys(name: str, spec: dict[str, Any], file: str) -> list[str]:
    """The config keys naming `file` (ELEVATER's prompts.py is both `classnames` and `templates`)."""
    keys = [f"benchmarks.{name}.{key}" for key in ("classnames", "templates", "dataset_info")
            if spec.get(key) and str(Path(spec[key])) == str(Path(file))]
    return keys or [f"benchmarks.{name}.path"]


def _benchmark_inputs(name: str, spec: dict[str, Any]) -> list[RawInput]:
    if spec["source"] != "files":
        return []
    found = [RawInput(f"benchmarks.{name}.path", str(spec["path"]), f"{spec['kind']} benchmark folder")]
    try:
        files = benchmark_files(spec["kind"], str(spec["path"]), spec)
    except BenchmarkError:
        files = []  # the schema and the loaders name a malformed entry
    found += [RawInput(key, f, f"{spec['kind']} benchmark file")
              for f in files for key in _benchmark_keys(name, spec, f)]
    if spec.get("image_root"):
        found.append(RawInput(f"benchmarks.{name}.image_root", str(spec["image_root"]), "image folder"))
    scored = set(valse_pieces(spec)) if spec["kind"] == "valse" else set()
    for piece, root in (spec.get("image_roots") or {}).items():
        if piece in VALSE_PIECES and piece not in scored:
            continue  # the folder of a piece this entry does not score
        found.append(RawInput(f"benchmarks.{name}.image_roots.{piece}", str(root), "image folder"))
    return found


def raw_inputs(config: dict[str, Any]) -> list[RawInput]:
    """Every raw path `config` names, in config order, each once per key (URLs are fetched by
    `compo prefetch`, not checked here)."""
    found: list[RawInput] = []
    for name, spec in config.get("datasets", {}).items():
        found += _dataset_inputs(name, spec)
    for name, spec in config.get("benchmarks", {}).items():
        found += _benchmark_inputs(name, spec)
    for name, base in config.get("bases", {}).items():  # a released checkpoint kept locally (rule pretrain's input)
        if base.get("weights"):
            found.append(RawInput(f"bases.{name}.weights", str(base["weights"]), "base weights, a checkpoint file"))
    sections = [("concreteness", config.get("concreteness", {}))]
    sections += [(f"negatives.{name}", spec) for name, spec in config.get("negatives", {}).items()]
    for where, section in sections:
        # the files rules concreteness, dataset_attributes and negatives read (compo.study)
        found += [RawInput(f"{where}.norms", str(norms), "Brysbaert concreteness norms (TSV)")
                  for norms in norms_files(section)]
        if where.startswith("negatives."):  # a released file (compo.negatives.released)
            found += [RawInput(f"{where}.path", str(path), "released negatives (JSON)")
                      for path in released_negatives(section)]
    return [_with_hub(config, item) for item in dict.fromkeys(found)]


def _with_hub(config: dict[str, Any], item: RawInput) -> RawInput:
    """`item` with its hub repository when `compo prefetch` fetches it: the `path` of an entry with `hub`, and an
    image folder inside its release when the release extracts archives there (COCO-Counterfactuals' images.zip);
    an image folder of a release without archives is the user's (SVO-Probes' images come from their URLs)."""
    section, name = item.key.split(".")[:2]
    spec = (config.get(section, {}).get(name) or {}) if section in DATA_SECTIONS else {}
    hub = spec.get("hub") if isinstance(spec, dict) else None
    if not hub:
        return item
    if item.key.endswith(".path") or (hub.get("extract") and _inside_release(config, hub["repo"], item.path)):
        return replace(item, hub=hub["repo"])
    return item


def _inside_release(config: dict[str, Any], repo: str, path: str) -> bool:
    return Path(path).is_relative_to(dataset_folder(model_cache(config), repo))


def _exists(item: RawInput) -> bool:
    if item.key.startswith("datasets.") and item.key.endswith(".path"):
        try:
            return all(p.exists() for p in raw_paths(item.path))
        except RawDataError:  # a glob that matches nothing
            return False
    return Path(item.path).exists()


def _inside_missing_folder(item: RawInput, missing: list[RawInput]) -> bool:
    folders = {(other.key, Path(other.path)) for other in missing}
    return any((item.key, parent) in folders for parent in Path(item.path).parents)


def missing_inputs(config: dict[str, Any]) -> list[RawInput]:
    """The raw inputs of `config` that do not exist (a glob that matches nothing counts as missing); a file
    inside a missing folder of the same key is left out (the folder is reported)."""
    missing = [item for item in raw_inputs(config) if not _exists(item)]
    return [item for item in missing if not _inside_missing_folder(item, missing)]


def input_status(config: dict[str, Any]) -> list[tuple[RawInput, str]]:
    """Every raw input of `config` with what `compo inputs` prints for it: `ok` only for a path found,
    `MISSING` for one reported missing, `absent` for a file inside a missing folder (the folder is reported)."""
    items = raw_inputs(config)
    missing = [item for item in items if not _exists(item)]
    return [(item, "ok" if item not in missing else "absent" if _inside_missing_folder(item, missing)
             else "MISSING") for item in items]


def missing_inputs_message(missing: list[RawInput]) -> str:
    """One message listing every missing input with its key; those released on the hub, with the command that
    fetches them."""
    local = [f"  {item.key}: {item.path} ({item.what})" for item in missing if not item.hub]
    fetched = [f"  {item.key}: {item.path} ({item.what}, hub dataset {item.hub})" for item in missing if item.hub]
    parts = [f"{len(local)} raw input(s) named by the config do not exist; set these keys in a config file loaded "
             "after the study's (e.g. my-paths.yaml; `compo inputs --configfile ...` lists every key):\n"
             + "\n".join(local)] if local else []
    if fetched:
        parts.append(f"{len(fetched)} raw input(s) released on the Hugging Face Hub are not in the model cache: run "
                     "`compo prefetch --configfile <the study's config files>` on a node with internet (or set the "
                     "entry's `hub: null` and its paths to a local copy):\n" + "\n".join(fetched))
    return "\n".join(parts)


def check_raw_inputs(config: dict[str, Any]) -> None:
    """Raise ConfigError listing every raw input of `config` that does not exist, with its key."""
    from compo.config import ConfigError

    missing = missing_inputs(config)
    if missing:
        raise ConfigError(missing_inputs_message(missing))


def key_summary(items: list[RawInput]) -> list[str]:
    """The keys of `items` as README's step 2 lists them: one line per key pattern (the entry's name
    replaced by <name>, a VALSE piece by <piece>) with the names that set it, in config order; an entry
    released on the hub is listed once, under `<section>.<name>.hub` (its paths are fetched, not set)."""
    patterns: dict[str, list[str]] = {}
    for item in items:
        parts = item.key.split(".")
        if item.hub:
            parts = [parts[0], parts[1], "hub"]
        if parts[0] in ("datasets", "benchmarks", "negatives") and len(parts) >= 3:
            if len(parts) == 4:  # benchmarks.<name>.image_roots.<piece>
                pattern, name = f"{parts[0]}.{parts[1]}.{parts[2]}.<piece>", parts[3]
            else:
                pattern, name = f"{parts[0]}.<name>.{parts[2]}", parts[1]
        else:
            pattern, name = item.key, ""
        names = patterns.setdefault(pattern, [])
        if name and name not in names:
            names.append(name)
    return [f"{pattern}: {', '.join(names)}" if names else pattern for pattern, names in patterns.items()]


YOURS = "/absolute/folder/of/yours"  # the template's value for a folder the release does not hold (SVO-Probes' images)


def _placeholder(config: dict[str, Any], item: RawInput) -> bool:
    """A path set by hand that resolves inside a hub release's folder: the release does not hold it (its images
    come from URLs), so the value the config resolved to (under this machine's cache) is no answer."""
    section, name = item.key.split(".")[:2]
    spec = config.get(section, {}).get(name) if section in DATA_SECTIONS else None
    return bool(isinstance(spec, dict) and spec.get("hub") and not item.hub
                and _inside_release(config, spec["hub"]["repo"], item.path))


def template(items: list[RawInput], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A config overlay setting every key of `items` to its current value (a dataset path given as a list
    stays one list), to copy into my-paths.yaml and edit; with `config`, its `results` and `model_cache` first,
    and YOURS for a folder a hub release does not hold."""
    overlay: dict[str, Any] = {}
    if config is not None:
        overlay = {"results": config.get("results"), "model_cache": config.get("model_cache")}
    for item in items:
        if item.hub:
            continue  # fetched into the model cache by compo prefetch, not a path to set
        *parents, leaf = item.key.split(".")
        node = overlay
        for part in parents:
            node = node.setdefault(part, {})
        value = YOURS if config is not None and _placeholder(config, item) else item.path
        if leaf in node and item.key.endswith(".path") and item.key.startswith("datasets."):
            node[leaf] = [*(node[leaf] if isinstance(node[leaf], list) else [node[leaf]]), value]
        else:
            node.setdefault(leaf, value)
    return overlay


TOP_NOTES = {"results": "every output of the study (a folder on a filesystem the jobs share)",
             "model_cache": "where `compo prefetch` puts models and hub releases: a shared folder every node reads "
                            "(null: $HF_HOME of the shell that runs snakemake)"}


def download_line(section: str, spec: dict[str, Any], leaf: str) -> str | None:
    """Where the file of key `<section>.<name>.<leaf>` comes from, as the entry's reader declares it: a benchmark
    kind's `downloads` (compo.evaluate.kinds), a dataset source's (compo.data.DOWNLOADS), the norms' source."""
    if section == "benchmarks" and spec.get("kind") in declared():
        return declared()[spec["kind"]].downloads(spec).get(leaf)
    if section == "datasets":
        return DOWNLOADS.get(str(spec.get("source") or ""), {}).get(leaf)
    return {"norms": BRYSBAERT}.get(leaf) if section in ("concreteness", "negatives") else None


def template_text(config: dict[str, Any], items: list[RawInput]) -> str:
    """`template(items, config)` as YAML, each key set by hand followed on its line by where its data comes from
    and the layout its reader expects (`download_line`; "source unknown" when no declaration names one)."""
    import yaml


    def dump(value: Any) -> str:
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()

    overlay = template(items, config)
    lines = [f"{key}: {dump(overlay.pop(key))}  # {note}" for key, note in TOP_NOTES.items()]

    def walk(node: dict[str, Any], keys: list[str], depth: int) -> None:
        for key, value in node.items():
            here = [*keys, key]
            if isinstance(value, dict):
                lines.append("  " * depth + f"{key}:")
                walk(value, here, depth + 1)
                continue
            section, name, *leaf = here
            spec = config.get(section, {}).get(name) if section in DATA_SECTIONS else config.get(section, {})
            where = download_line(section, spec if isinstance(spec, dict) else {}, (leaf or [name])[0])
            lines.append("  " * depth + f"{key}: {dump(value)}  # {where or 'source unknown'}")

    walk(overlay, [], 0)
    return "\n".join(lines) + "\n"


# --- formats: each raw file opened and its first items parsed, at DAG build (cheap: first items only) --------
# `compo plan` dry-runs a study on empty stand-ins of its raw inputs, maybe before `compo prefetch`: it sets this
# variable, and the Snakefile skips the format and model-cache checks (existence is still checked).
STAND_INS_ENV = "COMPO_STAND_INS"
PEEK_ITEMS = 5  # items parsed from each file
PEEK_BYTES = 1 << 20  # of a JSON file larger than WHOLE_JSON_BYTES: its first items are decoded from this head
WHOLE_JSON_BYTES = 8 << 20  # a JSON file up to this size is parsed whole
# Benchmark files are parsed generically here (their kind's loader imports torch, seconds at every DAG build);
# the kind's own field checks run in the evaluation job.
TEXT_SUFFIXES = (".txt", ".tsv", ".csv")
LINE_SUFFIXES = (".jsonl", ".jsonlines")


def _json_head(path: Path, items: int = PEEK_ITEMS) -> tuple[Any, bool]:
    """The first `items` of a large JSON file, decoded from its head, in the file's shape: a list of items for
    a root array; {first key: its first items} for a root object whose first value is an array (Karpathy's
    {"images": [...]}) or {first keys: their values} for any other object. And whether that is the whole
    shape a reader needs (the first two; the official COCO captions' sections after "info" may not be)."""
    import json

    with open(path, "rb") as file:
        head = file.read(PEEK_BYTES).decode("utf-8", errors="ignore")
    cut = len(head) >= PEEK_BYTES - 4  # the file goes on after the head
    decoder = json.JSONDecoder()
    text = head.lstrip()
    if not text or text[0] not in "[{":
        raise ValueError(f"not JSON: it starts with {text[:20]!r}")

    def values(at: int, keyed: bool) -> tuple[list[Any], int]:
        found: list[Any] = []
        while len(found) < items:
            at = len(text) - len(text[at:].lstrip(" \t\r\n,"))
            if at >= len(text) or text[at] in "]}":
                break
            try:
                if keyed:
                    key, at = decoder.raw_decode(text, at)
                    at = text.index(":", at) + 1
                    at = len(text) - len(text[at:].lstrip())
                    if not found and text[at:at + 1] == "[":  # {"images": [...], ...}: the array's first items
                        return [(key, values(at + 1, keyed=False)[0])], at
                value, at = decoder.raw_decode(text, at)
            except ValueError:
                if found and cut:
                    break  # the head ends inside an item: the ones before it are the peek
                raise
            found.append((key, value) if keyed else value)
        return found, at

    if text[0] == "[":
        return values(1, keyed=False)[0], True
    first, _ = values(1, keyed=True) if len(text) > 1 else ([], 0)
    return dict(first), len(first) == 1 and isinstance(first[0][1], list)


def _sample(path: Path, folder: Path) -> Path | None:
    """A file of the first items of `path` in its own format, for the project's reader (a folder, a tar shard,
    and a JSON file small enough to parse whole, are read as they are); None for a large JSON file whose head
    decodes but does not hold the whole shape its reader needs (its first items parsed as JSON only)."""
    import itertools
    import json

    suffix = path.suffix.lower()
    out = folder / path.name
    if path.is_dir() or suffix == ".tar" or (suffix == ".json" and path.stat().st_size <= WHOLE_JSON_BYTES):
        return path  # a webdataset shard: its reader streams the first samples (no line of it is text)
    if suffix == ".json":
        head, whole_shape = _json_head(path)
        if not whole_shape:
            return None
        out.write_text(json.dumps(head), encoding="utf-8")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=PEEK_ITEMS), None)
        pq.write_table(pa.Table.from_batches([batch]) if batch is not None else pq.read_schema(path).empty_table(),
                       out)
    else:  # lines: JSON lines, or a table with its header line
        with open(path, encoding="utf-8", errors="strict", newline="") as file:
            out.write_text("".join(itertools.islice(file, PEEK_ITEMS + 1)), encoding="utf-8")
    return out


def _no_images(folder: Path) -> Path:
    """An image root with no images (an empty img2dataset index for tables of URLs): the peek parses captions
    and image references, not images; the dataset job counts the missing ones."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = folder / "no-images"
    root.mkdir()
    pq.write_table(pa.table({"url": pa.array([], pa.string()), "key": pa.array([], pa.string())}),
                   root / "00000.parquet")
    return root


def _dataset_problem(spec: dict[str, Any]) -> str | None:
    """What is wrong with the first raw file of a dataset, parsed by compo.data's own reader (first items)."""
    import itertools
    import tempfile

    from compo.data import SOURCE_KINDS, read_records

    path = raw_paths(spec["path"])[0]
    if path.is_file() and path.stat().st_size == 0:
        return f"{path}: empty file"
    kind = spec.get("captions", SOURCE_KINDS[spec["source"]][0])
    with tempfile.TemporaryDirectory() as folder:
        try:
            sample = _sample(path, Path(folder))
            if sample is None:
                return None
            records = list(itertools.islice(read_records(spec["source"], [sample], kind, _no_images(Path(folder)),
                                                         spec.get("holdout"), spec), PEEK_ITEMS))
        except Exception as error:  # the reader's message (RawDataError), or pandas', pyarrow's, json's
            text = str(error).replace(str(sample), str(path)) if "sample" in locals() else str(error)
            if not isinstance(error, RawDataError):
                text = f"{type(error).__name__}: {text}"
            return text if text.startswith(str(path)) else f"{path}: {text}"
    return None if records else f"{path}: no {spec['source']} items in its first {PEEK_ITEMS}"


def _file_problem(path: Path) -> str | None:
    """What is wrong with a benchmark or norms file at a glance: empty, or its first items not parsing."""
    import json

    if not path.is_file():
        return None  # a folder (its files are listed themselves) or missing (reported by missing_inputs)
    size = path.stat().st_size
    if size == 0:
        return f"{path}: empty file"
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8")) if size <= WHOLE_JSON_BYTES else _json_head(path)[0]
            if not data:
                return f"{path}: JSON with no items"
        elif suffix in LINE_SUFFIXES + TEXT_SUFFIXES:
            with open(path, encoding="utf-8") as file:
                lines = [line for _, line in zip(range(PEEK_ITEMS), file, strict=False) if line.strip()]
            if not lines:
                return f"{path}: no lines"
            if suffix in LINE_SUFFIXES:
                for line in lines:
                    json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        return f"{path}: not valid {suffix[1:].upper()} in its first items ({error})"
    return None


def malformed_inputs(config: dict[str, Any]) -> list[tuple[RawInput, str]]:
    """The raw inputs of `config` that exist but cannot be read: an empty file, or one whose first items do not
    parse (datasets by compo.data's reader; benchmark files and norms as JSON, JSON lines or text)."""
    found = []
    for item in raw_inputs(config):
        if not _exists(item):
            continue
        if item.key.startswith("datasets.") and item.key.endswith(".path"):
            if any(other.key == item.key for other, _ in found):
                continue  # a dataset is peeked at once (its first file)
            problem = _dataset_problem(config["datasets"][item.key.split(".")[1]])
        elif "folder" in item.what:
            problem = None
        else:
            problem = _file_problem(Path(item.path))
        if problem:
            found.append((item, problem))
    return found


def check_input_formats(config: dict[str, Any]) -> None:
    """Raise ConfigError naming every raw input of `config` that is empty or whose first items do not parse."""
    from compo.config import ConfigError

    malformed = malformed_inputs(config)
    if malformed:
        raise ConfigError(f"{len(malformed)} raw input(s) named by the config cannot be read:\n"
                          + "\n".join(f"  {item.key}: {problem}" for item, problem in malformed))
