"""External models in the model cache: what an artifact is, where the cache is, and how a job finds a model
in it with the hubs offline.

The paper study needs models that live on the Hugging Face hub (the bases' open_clip weights, SigLIP's
tokenizer, the LLMs, the diffusion pipeline; norms given by URL). GPU nodes often have no internet, and where
they do, tens of jobs would race to download the same tens of GB. So `compo prefetch` (compo.prefetch, on a
login node) fetches every one once into the cache (config key `model_cache`, default `$HF_HOME`) and records it
in a manifest (`compo-prefetch.json`: artifact -> folder relative to the cache, files, bytes, revision, and a
single file's sha256, checked when open_clip weights load: `recorded_sha256`, compo.models.verify_sha256); jobs
resolve an artifact through that manifest (`resolve`) and hand the libraries a local path. The Snakefile sets
`COMPO_MODEL_CACHE` and the hubs' offline switches for every job (`job_environment`). An artifact missing
from the cache fails at once with one line naming it and the prefetch command. A model named by a local path
in the config (e.g. `model: /shared/llama-3.1-8b-instruct`) is used as it is.

Data released on the hub (issues 46, 47: SPEC, SVO-Probes, COCO-Counterfactuals, DeGLA's negatives, FSC-CLIP's
100K subsets) is an artifact of kind `dataset`, declared where its path is: an entry of `datasets`, `benchmarks`
or `negatives` with `hub: {repo: org/name, files: [patterns], extract: true}`. `compo prefetch` fetches it into
`<cache>/compo-prefetch/dataset/<org>/<name>/` (a fixed folder, so the path is known when the config loads) and
extracts its archives there; `resolve_hub_paths` then reads the entry's `path`, `image_root` and `image_roots`,
given relative, as paths inside that folder, so `compo inputs`, the DAG-build checks and the rules see local
paths as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compo.io import write_json
from compo.paths import contained

CACHE_ENV = "COMPO_MODEL_CACHE"
MANIFEST = "compo-prefetch.json"
PREFETCH_DIR = "compo-prefetch"  # where imported folders and URL files go inside the cache
# What the hub libraries read to stay offline (huggingface_hub, transformers, diffusers, vLLM, open_clip)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
PREFETCH_COMMAND = "compo prefetch --configfile <the study's config files>"
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")  # open_clip's hub names
SHA256_KEY = "sha256"  # a manifest entry's hash of its file (single-file artifacts: open_clip weights, URLs)


class ArtifactMissing(RuntimeError):
    """An artifact a job needs is not in the model cache (or there is no cache)."""


@dataclass(frozen=True)
class Artifact:
    """One external model or file. `kind`: open_clip | tokenizer | llm | diffusion | url | dataset; `source`:
    the hub repository (org/name) or the URL; `keys`: the config keys that name it; `file`: for open_clip
    weights named by a tag, the file open_clip's registry names (None: open_clip's hub names, safetensors
    first). A dataset's `patterns` are the files fetched (huggingface_hub allow_patterns) and `extract` says
    whether its zip / tar.gz archives are extracted where they lie."""

    kind: str
    source: str
    keys: tuple[str, ...] = field(compare=False, default=())
    file: str | None = None
    patterns: tuple[str, ...] = field(compare=False, default=())
    extract: bool = field(compare=False, default=False)

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.source}" + (f"/{self.file}" if self.file else "")


def is_local(name: str) -> bool:
    """A model named by a local path (used as it is) rather than a hub repository."""
    return name.startswith(("/", "./", "../", "~")) or Path(name).exists()


# --- the cache -----------------------------------------------------------------------------------------


def default_cache() -> Path:
    """`$HF_HOME`, else Hugging Face's own default (~/.cache/huggingface)."""
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


def model_cache(config: dict[str, Any]) -> Path:
    """The config's `model_cache` (null: `default_cache()`), absolute: jobs on other nodes read the same."""
    return Path(os.path.expanduser(str(config.get("model_cache") or default_cache()))).resolve()


DATA_SECTIONS = ("datasets", "benchmarks", "negatives")  # whose entries may name a hub release (`hub`)
DATASET_KIND = "dataset"


def dataset_folder(cache: Path, repo: str) -> Path:
    """Where `compo prefetch` puts the files of the hub dataset `repo` (org/name) inside `cache`."""
    return contained(cache / PREFETCH_DIR / DATASET_KIND, repo, source=f"model cache {cache}",
                     entry=f"{DATASET_KIND}:{repo}")


def hub_entries(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`<section>.<name>`, entry) for every entry of `config` whose data is released on the hub (`hub`)."""
    for section in DATA_SECTIONS:
        for name, spec in (config.get(section) or {}).items():
            if isinstance(spec, dict) and spec.get("hub"):
                yield f"{section}.{name}", spec


def _inside_release(folder: Path, value: str, key: str) -> str:
    if Path(value).is_absolute() and not str(value).startswith(str(folder)):
        return value  # the user's own folder (e.g. SVO-Probes' images, downloaded from their URLs)
    return str(contained(folder, value, source="config", entry=f"key {key} (read inside the folder its hub names)"))


def resolve_hub_paths(config: dict[str, Any]) -> dict[str, Any]:
    """Each hub entry's `path` (a string or a list), `image_root` and `image_roots.<piece>`, given relative,
    made paths inside the folder its release is fetched to (`dataset_folder` of the config's model cache), in
    place; each must stay inside that folder ('..' refused). An absolute path outside it is the user's own
    (images the release does not hold) and is kept. Idempotent: a path already resolved is kept."""
    cache = model_cache(config)
    for where, spec in hub_entries(config):
        folder = dataset_folder(cache, spec["hub"]["repo"])
        if isinstance(spec.get("path"), list):
            spec["path"] = [_inside_release(folder, p, f"{where}.path") for p in spec["path"]]
        elif spec.get("path") is not None:
            spec["path"] = _inside_release(folder, spec["path"], f"{where}.path")
        if spec.get("image_root"):
            spec["image_root"] = _inside_release(folder, spec["image_root"], f"{where}.image_root")
        for piece, root in (spec.get("image_roots") or {}).items():
            spec["image_roots"][piece] = _inside_release(folder, root, f"{where}.image_roots.{piece}")
    return config


def job_environment(cache: Path) -> dict[str, str]:
    """The environment every job runs with: the cache, and the hub libraries offline."""
    return {CACHE_ENV: str(cache), **OFFLINE_ENV}


def read_manifest(cache: Path) -> dict[str, Any]:
    path = cache / MANIFEST
    if not path.exists():
        return {"artifacts": {}}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactMissing(f"{path}: not a valid prefetch manifest ({error}); run {PREFETCH_COMMAND} again") \
            from error
    artifacts = manifest.get("artifacts") if isinstance(manifest, dict) else None
    if not isinstance(artifacts, dict):
        raise ArtifactMissing(f"{path}: expected a prefetch manifest {{\"artifacts\": {{id: entry}}}}, got "
                              f"{'no key artifacts' if isinstance(manifest, dict) else type(manifest).__name__}; "
                              f"run {PREFETCH_COMMAND} again")
    for artifact_id, entry in artifacts.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ArtifactMissing(f"{path}: artifact {artifact_id!r}: expected an entry with a 'path' (a string "
                                  f"relative to the cache); run {PREFETCH_COMMAND} again")
    return manifest


def manifest_entry_path(cache: Path, artifact_id: str, entry: dict[str, Any]) -> Path:
    """The file or folder a manifest entry names, which must stay inside the cache (links followed)."""
    return contained(cache, entry["path"], source=str(cache / MANIFEST), entry=f"artifact {artifact_id!r}")


def write_manifest(cache: Path, manifest: dict[str, Any]) -> None:
    write_json(manifest, cache / MANIFEST)


def resolve(kind: str, source: str, file: str | None = None) -> Path:
    """The local folder (an open_clip artifact: the weights file; a URL: the file) of an artifact, for a job.

    A local path named in the config is used as it is; anything else is looked up in the manifest of the
    cache `COMPO_MODEL_CACHE` names. Missing: ArtifactMissing naming the artifact and the prefetch command."""
    if kind != "url" and is_local(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise ArtifactMissing(f"{kind} {source}: no such local file or folder")
        return path
    artifact = Artifact(kind, source, file=file)
    cache = os.environ.get(CACHE_ENV)
    if not cache:
        raise ArtifactMissing(f"{kind} {source} would be downloaded, but jobs never download: set {CACHE_ENV} to "
                              f"the model cache (the workflow sets it from config key model_cache) after "
                              f"{PREFETCH_COMMAND}")
    entry = read_manifest(Path(cache))["artifacts"].get(artifact.id)
    if entry is None:
        raise ArtifactMissing(f"{artifact.id} is not in the model cache {cache}: run {PREFETCH_COMMAND} on a node "
                              "with internet (jobs never download)")
    path = manifest_entry_path(Path(cache), artifact.id, entry)
    if not path.exists():
        raise ArtifactMissing(f"{artifact.id}: the cache's manifest names {path}, which is gone; run "
                              f"{PREFETCH_COMMAND} again")
    return path


def recorded_sha256(kind: str, source: str, file: str | None = None) -> tuple[str | None, Path]:
    """The sha256 the cache's manifest records for a single-file artifact `resolve` found there (what
    `compo prefetch` hashed when it wrote it; None for a folder or an entry written before hashes were
    recorded), and the manifest's path."""
    manifest = Path(os.environ[CACHE_ENV]) / MANIFEST
    entry = read_manifest(manifest.parent)["artifacts"].get(Artifact(kind, source, file=file).id) or {}
    return entry.get(SHA256_KEY), manifest


def refetch_hint(path: Path) -> str:
    """What to do with a cached file whose bytes changed: delete it (and the hub blob it links to: the hub's
    cache does not check what it holds) and fetch it again."""
    real = Path(os.path.realpath(path))
    return f"delete {path}{f' and {real}' if real != path else ''} and run {PREFETCH_COMMAND} again"
