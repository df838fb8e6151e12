"""External models: listed from the config, fetched once by `compo prefetch`, read offline by every job.

The paper study needs models that live on the Hugging Face hub: the bases' open_clip weights (by tag, or a
repo named by `bases.<name>.hub`), the tokenizers of models that use one (SigLIP's), the LLMs that rewrite
negatives, the diffusion pipeline that edits negative images, and norms given by URL. GPU nodes often have no
internet, and where they do, tens of jobs would race to download the same tens of GB. So:

* `config_artifacts(config)` lists every artifact the config needs, with the config keys that name it;
* `compo prefetch` (on a login node) downloads each into one cache (config key `model_cache`, default
  `$HF_HOME`) with `huggingface_hub.snapshot_download`, or imports it from a local folder (`--from DIR`:
  `DIR/<org>/<name>/`, e.g. a cluster's shared model folder), and writes a manifest `compo-prefetch.json`
  (artifact -> folder relative to the cache, files, bytes, revision);
* jobs resolve an artifact through that manifest (`resolve`) and hand the libraries a local path; the
  Snakefile sets `COMPO_MODEL_CACHE` and the hubs' offline switches for every job, so nothing downloads. An
  artifact missing from the cache fails at once with one line naming it and the prefetch command.

A model named by a local path in the config (e.g. `model: /shared/llama-3.1-8b-instruct`) is used as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CACHE_ENV = "COMPO_MODEL_CACHE"
MANIFEST = "compo-prefetch.json"
PREFETCH_DIR = "compo-prefetch"  # where imported folders and URL files go inside the cache
# What the hub libraries read to stay offline (huggingface_hub, transformers, diffusers, vLLM, open_clip)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
PREFETCH_COMMAND = "compo prefetch --configfile <the study's config files>"

# The files each kind needs from its repository (huggingface_hub allow_patterns); anything else in the repo
# (Llama's original/ consolidated .pth, SDXL-Turbo's single-file checkpoints at the root, ONNX and
# flax weights) is left on the hub.
PATTERNS: dict[str, tuple[str, ...]] = {
    "tokenizer": ("tokenizer*", "special_tokens_map.json", "*.model", "vocab*", "merges.txt", "added_tokens.json",
                  "config.json"),
    "llm": ("*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt"),
    "diffusion": ("model_index.json", "*/config.json", "*/scheduler_config.json", "tokenizer*/*",
                  "*/diffusion_pytorch_model.safetensors", "*/model.safetensors"),
}
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")  # open_clip's hub names


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


# --- what the config needs -------------------------------------------------------------------------------


def _is_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or Path(name).exists()


def open_clip_weights_artifact(model_name: str, tag: str, hub: str | None, key: str) -> Artifact:
    """The weights of open_clip model `model_name` pretrained as `tag` (open_clip's registry), or in the hub
    repository `hub` when the config names one."""
    if hub:
        return Artifact("open_clip", hub, (key,))
    from compo.models import open_clip  # torch: only the commands that need weights import this

    cfg = open_clip().get_pretrained_cfg(model_name, tag)
    if not cfg.get("hf_hub"):
        known = ", ".join(open_clip().list_pretrained_tags_by_model(model_name)) or "none"
        raise ArtifactMissing(f"config key {key}: open_clip has no hub weights tagged {tag!r} for {model_name!r} "
                              f"(its tags: {known}); name the repository of the weights in bases.<name>.hub")
    repo, file = os.path.split(cfg["hf_hub"])  # "org/name/file", or "org/name/": open_clip's default names
    return Artifact("open_clip", repo, (key,), file or None)


def tokenizer_artifact(model_name: str, key: str) -> Artifact | None:
    """The Hugging Face tokenizer an open_clip model config names (SigLIP's), or None (open_clip's own)."""
    from compo.models import model_config

    name = model_config(model_name).get("text_cfg", {}).get("hf_tokenizer_name")
    return Artifact("tokenizer", name, (key,)) if name and not _is_local(name) else None


def config_artifacts(config: dict[str, Any]) -> list[Artifact]:
    """Every external artifact `config` needs, once each, with every key that names it."""
    found: dict[str, Artifact] = {}

    def add(artifact: Artifact | None) -> None:
        if artifact is None:
            return
        seen = found.get(artifact.id)
        keys = (*seen.keys, *artifact.keys) if seen else artifact.keys
        found[artifact.id] = Artifact(artifact.kind, artifact.source, tuple(dict.fromkeys(keys)), artifact.file)

    for name, base in config.get("bases", {}).items():
        if base.get("init", "scratch") != "scratch":
            add(open_clip_weights_artifact(base["model"], base["init"], base.get("hub"), f"bases.{name}.init"))
            add(tokenizer_artifact(base["model"], f"bases.{name}.model"))
    for name, spec in config.get("negatives", {}).items():
        if spec.get("backend") in ("vllm", "transformers") and not _is_local(spec["model"]):
            add(Artifact("llm", spec["model"], (f"negatives.{name}.model",)))
        images = spec.get("images")
        if isinstance(images, dict) and not _is_local(images["model"]):
            add(Artifact("diffusion", images["model"], (f"negatives.{name}.images.model",)))
    sections = [("concreteness", config.get("concreteness", {}))]
    sections += [(f"negatives.{name}", spec) for name, spec in config.get("negatives", {}).items()]
    for where, section in sections:
        if str(section.get("norms") or "").startswith(("http://", "https://")):
            add(Artifact("url", section["norms"], (f"{where}.norms",)))
    return list(found.values())


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
    return manifest


def _write_manifest(cache: Path, manifest: dict[str, Any]) -> None:
    from compo.io import write_json

    write_json(manifest, cache / MANIFEST)


def resolve(kind: str, source: str, file: str | None = None) -> Path:
    """The local folder (an open_clip artifact: the weights file; a URL: the file) of an artifact, for a job.

    A local path named in the config is used as it is; anything else is looked up in the manifest of the
    cache `COMPO_MODEL_CACHE` names. Missing: ArtifactMissing naming the artifact and the prefetch command."""
    if kind != "url" and _is_local(source):
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
    path = Path(cache) / entry["path"]
    if not path.exists():
        raise ArtifactMissing(f"{artifact.id}: the cache's manifest names {path}, which is gone; run "
                              f"{PREFETCH_COMMAND} again")
    return path


def open_clip_weights(model_name: str, tag: str, hub: str | None = None) -> Path:
    """The weights file of `model_name` pretrained as `tag` (or from repo `hub`), from the model cache."""
    artifact = open_clip_weights_artifact(model_name, tag, hub, "init")
    return resolve("open_clip", artifact.source, artifact.file)


# --- prefetch ------------------------------------------------------------------------------------------


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _import_local(artifact: Artifact, source_dir: Path, cache: Path) -> tuple[Path, str]:
    """Copy `source_dir/<org>/<name>/` (the files of `artifact`) into the cache; returns (folder, revision)."""
    from fnmatch import fnmatch

    origin = source_dir / artifact.source
    if not origin.is_dir():
        raise ArtifactMissing(f"{artifact.id}: --from {source_dir} has no folder {artifact.source}/")
    patterns = (artifact.file,) if artifact.file else OPEN_CLIP_WEIGHTS if artifact.kind == "open_clip" else \
        PATTERNS[artifact.kind]
    files = [p for p in sorted(origin.rglob("*")) if p.is_file()
             and any(fnmatch(str(p.relative_to(origin)), pattern) for pattern in patterns)]
    if not files:
        raise ArtifactMissing(f"{artifact.id}: {origin} holds none of the files it needs ({', '.join(patterns)})")
    target = cache / PREFETCH_DIR / artifact.kind / artifact.source
    digest = hashlib.sha256()
    for path in files:
        relative = path.relative_to(origin)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / relative)
        digest.update(f"{relative}\0{path.stat().st_size}\0".encode())
    return target, f"local:{digest.hexdigest()[:16]}"


def _download_hub(artifact: Artifact, cache: Path, token: str | None) -> tuple[Path, str]:
    """snapshot_download of the files the artifact needs into the cache's hub folder (files already there,
    e.g. in an existing $HF_HOME, are not downloaded again). Not run in this repository's tests: no hub."""
    from huggingface_hub import HfApi, snapshot_download

    patterns = PATTERNS.get(artifact.kind)
    if artifact.kind == "open_clip":
        listed = set(HfApi(token=token).list_repo_files(artifact.source))
        wanted = (artifact.file,) if artifact.file else OPEN_CLIP_WEIGHTS
        patterns = tuple([next((f for f in wanted if f in listed), wanted[-1]), "open_clip_config.json"])
    folder = Path(snapshot_download(artifact.source, cache_dir=cache / "hub", allow_patterns=list(patterns),
                                    token=token))
    return folder, folder.name  # the snapshot folder is named by the commit


def hub_size(artifact: Artifact) -> str:
    """The download size of an artifact's files, asked of the hub (for `compo prefetch --list`)."""
    if artifact.kind == "url":
        return "size: a file"
    try:
        from fnmatch import fnmatch

        from huggingface_hub import HfApi

        info = HfApi().model_info(artifact.source, files_metadata=True)
        patterns = (artifact.file,) if artifact.file else OPEN_CLIP_WEIGHTS[:1] if artifact.kind == "open_clip" \
            else PATTERNS[artifact.kind]
        size = sum(s.size or 0 for s in info.siblings if any(fnmatch(s.rfilename, p) for p in patterns))
        return f"{size / 1e9:.2f} GB to fetch"
    except Exception as error:  # offline, gated without a token, or unknown: say so, do not fail the list
        return f"size unknown: the hub did not answer ({type(error).__name__})"


def _download_url(artifact: Artifact, cache: Path) -> tuple[Path, str]:
    name = hashlib.sha256(artifact.source.encode()).hexdigest()[:16] + "-" + Path(artifact.source).name
    target = cache / PREFETCH_DIR / "url" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(artifact.source, timeout=120) as response, open(target, "wb") as handle:
        shutil.copyfileobj(response, handle)
    return target, "url"


def _entry_path(artifact: Artifact, folder: Path) -> Path:
    """What `resolve` returns: the folder, or for open_clip weights the weights file in it."""
    if artifact.kind != "open_clip":
        return folder
    names = (artifact.file,) if artifact.file else OPEN_CLIP_WEIGHTS
    found = next((folder / n for n in names if (folder / n).is_file()), None)
    if found is None:
        raise ArtifactMissing(f"{artifact.id}: {folder} has no weights file ({', '.join(names)})")
    return found


def prefetch(config: dict[str, Any], cache: Path, source_dir: Path | None = None, token: str | None = None,
             log: Any = print) -> dict[str, Any]:
    """Fetch every artifact of `config` into `cache` (from the hub, or from `source_dir`) and record each in the
    manifest; returns the manifest. Artifacts already recorded and present are kept as they are."""
    cache.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(cache)
    for artifact in config_artifacts(config):
        entry = manifest["artifacts"].get(artifact.id)
        if entry and (cache / entry["path"]).exists():
            log(f"cached   {artifact.id} ({entry['bytes'] / 1e9:.2f} GB)")
            continue
        if artifact.kind == "url":
            folder, revision = _download_url(artifact, cache)
        elif source_dir is not None:
            folder, revision = _import_local(artifact, source_dir, cache)
        else:
            folder, revision = _download_hub(artifact, cache, token)
        path = _entry_path(artifact, folder)
        files = _files(folder) if folder.is_dir() else {folder.name: folder.stat().st_size}
        entry = {"kind": artifact.kind, "source": artifact.source, "file": artifact.file, "keys": list(artifact.keys),
                 "path": os.path.relpath(path, cache), "revision": revision, "files": files,
                 "bytes": sum(files.values())}
        manifest["artifacts"][artifact.id] = entry
        _write_manifest(cache, manifest)  # after each artifact: an interrupted prefetch keeps what it fetched
        log(f"fetched  {artifact.id} ({entry['bytes'] / 1e9:.2f} GB)")
    return manifest
