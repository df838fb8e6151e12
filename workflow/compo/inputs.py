"""The raw inputs a config names (datasets, image folders, benchmark files, class names, templates, norms),
each with the config key that names it, and the check that they exist.

The Snakefile runs `check_raw_inputs` while the DAG is built, so a missing file is reported before
anything is submitted, all at once, each with its key, rather than one MissingInputException at a time
(or, for the paths no rule declares as an input, such as VALSE's image folders, hours later in a job).
`compo inputs` prints the same list (README's step 2 is that list for config/paper.yaml).
No torch here: it runs on every DAG build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compo.data import RawDataError, default_image_root, raw_paths
from compo.evaluate.files import VALSE_PIECES, BenchmarkError, benchmark_files, valse_pieces


@dataclass(frozen=True)
class RawInput:
    """One path the config names: `key` is the config key, `path` the file or folder (a glob for a dataset
    path given as a pattern), `what` a few words on what it is."""

    key: str
    path: str
    what: str


def _is_url(value: Any) -> bool:
    return str(value).startswith(("http://", "https://"))


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


def _benchmark_key(name: str, spec: dict[str, Any], file: str) -> str:
    for key in ("classnames", "templates"):
        if spec.get(key) and str(Path(spec[key])) == str(Path(file)):
            return f"benchmarks.{name}.{key}"
    return f"benchmarks.{name}.path"


def _benchmark_inputs(name: str, spec: dict[str, Any]) -> list[RawInput]:
    if spec["source"] != "files":
        return []
    found = [RawInput(f"benchmarks.{name}.path", str(spec["path"]), f"{spec['kind']} benchmark folder")]
    try:
        files = benchmark_files(spec["kind"], str(spec["path"]), spec)
    except BenchmarkError:
        files = []  # the schema and the loaders name a malformed entry
    found += [RawInput(_benchmark_key(name, spec, f), f, f"{spec['kind']} benchmark file") for f in files]
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
    sections = [("concreteness", config.get("concreteness", {}))]
    sections += [(f"negatives.{name}", spec) for name, spec in config.get("negatives", {}).items()]
    for where, section in sections:
        norms = section.get("norms")
        if norms and not _is_url(norms):
            found.append(RawInput(f"{where}.norms", str(norms), "Brysbaert concreteness norms (TSV)"))
    return list(dict.fromkeys(found))


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
    """One message listing every missing input with its key."""
    lines = [f"  {item.key}: {item.path} ({item.what})" for item in missing]
    return (f"{len(missing)} raw input(s) named by the config do not exist; set these keys in a config file "
            "loaded after the study's (e.g. my-paths.yaml; `compo inputs --configfile ...` lists every key):\n"
            + "\n".join(lines))


def check_raw_inputs(config: dict[str, Any]) -> None:
    """Raise ConfigError listing every raw input of `config` that does not exist, with its key."""
    from compo.config import ConfigError

    missing = missing_inputs(config)
    if missing:
        raise ConfigError(missing_inputs_message(missing))


def key_summary(items: list[RawInput]) -> list[str]:
    """The keys of `items` as README's step 2 lists them: one line per key pattern (the entry's name
    replaced by <name>, a VALSE piece by <piece>) with the names that set it, in config order."""
    patterns: dict[str, list[str]] = {}
    for item in items:
        parts = item.key.split(".")
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


def template(items: list[RawInput]) -> dict[str, Any]:
    """A config overlay setting every key of `items` to its current value (a dataset path given as a list
    stays one list), to copy into my-paths.yaml and edit."""
    overlay: dict[str, Any] = {}
    for item in items:
        *parents, leaf = item.key.split(".")
        node = overlay
        for part in parents:
            node = node.setdefault(part, {})
        if leaf in node and item.key.endswith(".path") and item.key.startswith("datasets."):
            node[leaf] = [*(node[leaf] if isinstance(node[leaf], list) else [node[leaf]]), item.path]
        else:
            node.setdefault(leaf, item.path)
    return overlay
