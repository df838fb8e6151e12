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
"""

from __future__ import annotations

import json
import os
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
    """One external model or file. `kind`: open_clip | tokenizer | llm | diffusion | url; `source`: the hub
    repository (org/name) or the URL; `keys`: the config keys that name it; `file`: for open_clip weights
    named by a tag, the file open_clip's registry names (None: open_clip's hub names, safetensors first)."""

    kind: str
    source: str
    keys: tuple[str, ...] = field(compare=False, default=())
    file: str | None = None

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
