"""Provenance: the bytes a result came from and the code that made them.

Every checkpoint's sha256 is recorded when it is written (a model folder's model.json; the model cache's
manifest, compo.prefetch) and checked when it is loaded (compo.models.verify_sha256); every evaluation result
records the sha256 of the checkpoint it scored, and aggregation refuses a result whose hash is not its model
folder's (`check_result_checkpoint`). A model folder also records the code that made it (`code_record`: the
package's version from pyproject.toml and `code_sha256`, a hash of the package's sources), so a study built by
other code is reported (`models_built_by_other_code`, printed by every Snakemake invocation).

Nothing here imports torch: the Snakefile and the aggregation read it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import tomllib
from pathlib import Path
from typing import Any

from compo.hashing import file_sha256  # noqa: F401  (re-exported: its callers import it from here)
from compo.layout import MODEL_JSON, result_model_dir

PACKAGE_DIR = Path(__file__).resolve().parent
PYPROJECT = PACKAGE_DIR.parents[1] / "pyproject.toml"  # the checkout's; absent where only the package is copied
CHECKPOINT_KEY = "checkpoint_sha256"
CODE_KEY = "code_sha256"
VERSION_KEY = "compo_version"


class ProvenanceError(ValueError):
    """A result or model folder whose recorded bytes or code do not match; the message names both sides."""


@functools.cache
def package_version() -> str:
    """The project's version: pyproject.toml of this checkout (jobs in a conda env or container run the
    checkout's package without installing it), else the installed distribution's, else 'unknown'."""
    if PYPROJECT.is_file():
        return str(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"])
    try:
        return importlib.metadata.version("compo-study")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def code_files() -> dict[str, str]:
    """sha256 of each file of the package (workflow/compo/**: its sources and the data it reads, the resources and
    model configs, which change results as code does), by path relative to it, sorted; bytecode left out."""
    return {str(path.relative_to(PACKAGE_DIR)): file_sha256(path) for path in sorted(PACKAGE_DIR.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


@functools.cache
def code_sha256() -> str:
    """One hash of the package's sources: their relative paths and contents (not their times), sorted."""
    return hashlib.sha256(json.dumps(code_files(), sort_keys=True).encode()).hexdigest()


def code_record() -> dict[str, str]:
    """What model.json records of the code that wrote it."""
    return {VERSION_KEY: package_version(), CODE_KEY: code_sha256()}


def changed_code_files(saved: dict[str, str] | None) -> list[str]:
    """The package's files that differ from `saved` (a `code_files()` of another time): changed, added or
    removed, sorted; [] when `saved` is unknown (None)."""
    if not saved:
        return []
    now = code_files()
    return sorted(name for name in set(saved) | set(now) if saved.get(name) != now.get(name))


def read_model_record(model_dir: str | Path) -> dict[str, Any]:
    """A model folder's model.json as a dict (ProvenanceError naming the file when it is missing or not JSON)."""
    path = Path(model_dir) / MODEL_JSON
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProvenanceError(f"{path}: missing (the model folder is gone or incomplete)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProvenanceError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(record, dict):
        raise ProvenanceError(f"{path}: expected a JSON object")
    return record


def check_result_checkpoint(record: dict[str, Any], path: str | Path) -> bool:
    """An evaluation result's checkpoint hash against its model folder's model.json: ProvenanceError naming
    both when they differ (the model was rebuilt or replaced after it was scored). The model folder is the one
    the layout puts beside `path` (compo.layout.result_model_dir), so the check does not depend on the folder it
    runs from; the recorded `model_dir` (relative to the working directory of the evaluation) only for a result
    outside the layout. A result that records no checkpoint hash (written by hand, edited, or by a compo before
    hashes were recorded) is refused: its value cannot be tied to any model's bytes. Returns False for a result
    outside the layout that names no model folder: nothing to check it against."""
    scored = record.get(CHECKPOINT_KEY)
    if not isinstance(scored, str) or not scored:
        raise ProvenanceError(f"{path}: records no {CHECKPOINT_KEY} (the sha256 of the model bytes it scored, "
                              f"got {scored!r}): written by hand, edited, or by an older compo, it cannot be tied to "
                              f"a model; the tables take no such result: rerun its evaluation "
                              f"(snakemake --forcerun {path})")
    model_dir = result_model_dir(path) or record.get("model_dir")
    if model_dir is None:
        return False
    model_json = Path(model_dir) / MODEL_JSON
    current = read_model_record(model_dir).get(CHECKPOINT_KEY)
    if current != scored:
        raise ProvenanceError(f"{path}: scored checkpoint sha256 {scored}, but {model_json} records {current}: the "
                              "model was rebuilt or replaced after it was evaluated; rerun its evaluation "
                              f"(snakemake --forcerun {path})")
    return True


def models_built_by_other_code(models_root: str | Path) -> list[tuple[Path, str]]:
    """Model folders under `models_root` whose model.json records another code hash than this checkout's
    (or none), with the version they record: (folder, version), sorted. Unreadable model.json files are
    left to the jobs that read them."""
    current = code_sha256()
    stale = []
    for model_json in sorted(Path(models_root).glob(f"**/{MODEL_JSON}")):
        try:
            record = json.loads(model_json.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and record.get(CODE_KEY) != current:
            stale.append((model_json.parent, str(record.get(VERSION_KEY, "unknown"))))
    return stale


def stale_code_warning(models_root: str | Path, limit: int = 20) -> str | None:
    """The dry run's note on model folders built by other code (None: none), a line per model (up to
    `limit`) and how to rerun them."""
    stale = models_built_by_other_code(models_root)
    if not stale:
        return None
    lines = [f"compo-study: {len(stale)} model folder(s) under {models_root} were built by other code than this "
             f"checkout's (compo {package_version()}, code sha256 {code_sha256()[:12]}); Snakemake does not "
             "rerun them by itself:"]
    lines += [f"  {folder} (compo {version})" for folder, version in stale[:limit]]
    if len(stale) > limit:
        lines.append(f"  ... and {len(stale) - limit} more")
    lines.append("  rerun them with `snakemake --forcerun pretrain train` (everything trained) or "
                 "`snakemake --forcerun <model folder>/checkpoint.pt` (one model); to keep them, ignore this note")
    return "\n".join(lines)
