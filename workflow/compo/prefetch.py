"""`compo prefetch`: every external model a config needs, listed with the config keys that name it, and
fetched once into the model cache (compo.artifacts) on a node with internet.

`config_artifacts(config)` lists them: the bases' open_clip weights (by tag from open_clip's registry, or the
repository `bases.<name>.hub` names), the Hugging Face tokenizers their model configs name (SigLIP's), the
LLMs of LLM negatives, the diffusion pipeline of image negatives, norms given by URL, and the data released
on the hub that an entry names with `hub` (compo.artifacts: kind `dataset`). `prefetch` downloads
each with `huggingface_hub.snapshot_download` into `<cache>/hub` (files an existing `$HF_HOME` already holds
are not downloaded again), or imports it from a local folder (`--from DIR`: `DIR/<org>/<name>/`, e.g. a
cluster's shared model folder), and records it in the cache's manifest after each artifact. A dataset goes to
its fixed folder (`compo.artifacts.dataset_folder`) and its zip / tar.gz archives are extracted there when its
entry says `extract: true`: every member must stay inside the folder and be a plain file or folder, and an
archive that would unpack to more than MAX_EXTRACT_RATIO times its size is refused (a zip bomb), each before
anything is written.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import tarfile
import urllib.request
import zipfile
import zlib
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from compo.artifacts import (
    DATASET_KIND,
    MANIFEST,
    OPEN_CLIP_WEIGHTS,
    PREFETCH_DIR,
    SHA256_KEY,
    Artifact,
    ArtifactMissing,
    dataset_folder,
    hub_entries,
    is_local,
    manifest_entry_path,
    read_manifest,
    refetch_hint,
    write_manifest,
)
from compo.paths import contained
from compo.provenance import file_sha256
from compo.shards import check_end

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
ARCHIVES = (".zip", ".tar.gz", ".tgz")  # what a dataset's `extract: true` unpacks (FSC-CLIP's .tar shards stay)
# An archive unpacking to more than this many times its own size is refused: the releases' largest ratio is
# JSON in a zip (about 10); images barely compress
MAX_EXTRACT_RATIO = 100


def open_clip_weights_artifact(model_name: str, tag: str, hub: str | None, key: str,
                               file: str | None = None) -> Artifact:
    """The weights of open_clip model `model_name` pretrained as `tag`, or the `file` of the hub repository `hub`."""
    from compo.models import pretrained_weights_source  # torch: only the commands that need weights import it

    try:
        repo, file = pretrained_weights_source(model_name, tag, hub, file)
    except ValueError as error:
        raise ArtifactMissing(f"config key {key}: {error}") from error
    return Artifact("open_clip", repo, (key,), file)


def tokenizer_artifact(model_name: str, key: str, registry: bool = True) -> Artifact | None:
    """The Hugging Face tokenizer an open_clip model config names (SigLIP's), or None (open_clip's own).
    registry=False: from the config files alone, without importing torch (the DAG build)."""
    if registry:
        from compo.models import hf_tokenizer_name

        name = hf_tokenizer_name(model_name)
    else:
        from compo.architectures import hf_tokenizer_of, model_config

        name = hf_tokenizer_of(model_config(model_name))
    return Artifact("tokenizer", name, (key,)) if name and not is_local(name) else None


def config_artifacts(config: dict[str, Any], models: bool = True) -> list[Artifact]:
    """Every external artifact `config` needs, once each, with every key that names it (models=False: not the
    open_clip weights and tokenizers, whose names come from open_clip's registry, an import of torch)."""
    from compo.study import has_diffusion_images, is_url, runs_llm  # what the rules read of each entry

    found: dict[str, Artifact] = {}

    def add(artifact: Artifact | None) -> None:
        if artifact is None:
            return
        seen = found.get(artifact.id)
        if seen is None:
            found[artifact.id] = artifact
            return
        # one repository named by several entries: the union of their keys, files and extraction
        found[artifact.id] = replace(seen, keys=tuple(dict.fromkeys((*seen.keys, *artifact.keys))),
                                     patterns=tuple(dict.fromkeys((*seen.patterns, *artifact.patterns))),
                                     extract=seen.extract or artifact.extract)

    for name, base in config.get("bases", {}).items():
        if base.get("init", "scratch") != "scratch" and models:
            if not base.get("weights"):  # a local file is used as it is
                add(open_clip_weights_artifact(base["model"], base["init"], base.get("hub"), f"bases.{name}.init",
                                               base.get("file")))
            add(tokenizer_artifact(base["model"], f"bases.{name}.model"))
    for name, spec in config.get("negatives", {}).items():
        if runs_llm(spec) and not is_local(spec["model"]):
            add(Artifact("llm", spec["model"], (f"negatives.{name}.model",)))
        if has_diffusion_images(spec) and not is_local(spec["images"]["model"]):
            add(Artifact("diffusion", spec["images"]["model"], (f"negatives.{name}.images.model",)))
    sections = [("concreteness", config.get("concreteness", {}))]
    sections += [(f"negatives.{name}", spec) for name, spec in config.get("negatives", {}).items()]
    for where, section in sections:
        if is_url(section.get("norms") or ""):
            add(Artifact("url", section["norms"], (f"{where}.norms",)))
    for where, spec in hub_entries(config):
        hub = spec["hub"]
        add(Artifact(DATASET_KIND, hub["repo"], (f"{where}.hub",), patterns=tuple(hub.get("files") or ("*",)),
                     extract=bool(hub.get("extract"))))
    return list(found.values())



# --- prefetch ------------------------------------------------------------------------------------------


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _import_local(artifact: Artifact, source_dir: Path, cache: Path) -> tuple[Path, str]:
    """Copy `source_dir/<org>/<name>/` (the files of `artifact`) into the cache; returns (folder, revision)."""
    origin = contained(source_dir, artifact.source, source=f"--from {source_dir}", entry=artifact.id)
    if not origin.is_dir():
        raise ArtifactMissing(f"{artifact.id}: --from {source_dir} has no folder {artifact.source}/")
    patterns = _patterns(artifact)
    files = [contained(origin, p.relative_to(origin), source=f"--from {source_dir}", entry=artifact.id)
             for p in sorted(origin.rglob("*")) if p.is_file()
             and any(fnmatch(str(p.relative_to(origin)), pattern) for pattern in patterns)]
    if not files:
        raise ArtifactMissing(f"{artifact.id}: {origin} holds none of the files it needs ({', '.join(patterns)})")
    target = contained(cache / PREFETCH_DIR / artifact.kind, artifact.source, source=f"model cache {cache}",
                       entry=artifact.id)
    digest = hashlib.sha256()
    for path in files:
        relative = path.relative_to(origin)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / relative)
        digest.update(f"{relative}\0{path.stat().st_size}\0".encode())
    return target, f"local:{digest.hexdigest()[:16]}"


def _patterns(artifact: Artifact) -> tuple[str, ...]:
    """The files an artifact needs from its repository (huggingface_hub allow_patterns)."""
    if artifact.file:
        return (artifact.file,)
    if artifact.kind == DATASET_KIND:
        return artifact.patterns or ("*",)
    return OPEN_CLIP_WEIGHTS if artifact.kind == "open_clip" else PATTERNS[artifact.kind]


def _download_hub(artifact: Artifact, cache: Path, token: str | None) -> tuple[Path, str]:
    """snapshot_download of the files the artifact needs into the cache's hub folder (files already there,
    e.g. in an existing $HF_HOME, are not downloaded again); a dataset into its fixed folder, at the commit
    asked first. Not run in this repository's tests: no hub."""
    from huggingface_hub import HfApi, snapshot_download

    if artifact.kind == DATASET_KIND:
        revision = HfApi(token=token).dataset_info(artifact.source).sha
        folder = dataset_folder(cache, artifact.source)
        snapshot_download(artifact.source, repo_type="dataset", revision=revision, local_dir=folder,
                          allow_patterns=list(_patterns(artifact)), token=token)
        return folder, str(revision)

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
        from huggingface_hub import HfApi

        info = HfApi().repo_info(artifact.source, repo_type="dataset" if artifact.kind == DATASET_KIND else None,
                                 files_metadata=True)
        patterns = _patterns(artifact)[:1] if artifact.kind == "open_clip" else _patterns(artifact)
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


def _member_target(folder: Path, name: str, archive: Path) -> Path:
    return contained(folder, name, source=f"archive {archive}", entry=f"member {name!r}")


def _check_ratio(archive: Path, declared: int) -> None:
    if declared > MAX_EXTRACT_RATIO * max(archive.stat().st_size, 1):
        raise ArtifactMissing(f"archive {archive}: its members declare {declared} bytes, more than "
                              f"{MAX_EXTRACT_RATIO} times its {archive.stat().st_size} bytes; refused (a zip bomb?)")


def _check_unique_targets(archive: Path, folder: Path, members: list[tuple[str, bool]]) -> None:
    """Each file member must have a path of its own: a name given twice (extraction kept the last, silently),
    or a file whose path is also a folder's (another member's, or the parent of one: FileExistsError midway),
    is refused before anything is written, naming both members."""
    files: dict[str, str] = {}
    folders: dict[str, str] = {}
    for name, is_dir in members:
        _member_target(folder, name, archive)  # inside the folder, so the normalised name has no leading ".."
        path = os.path.normpath(name)  # "a//b", "./a/b", "a/../a/b" are one path
        if is_dir:
            folders.setdefault(path, name)
        elif path in files:
            raise ArtifactMissing(f"archive {archive}: member {name!r} is given twice (also as {files[path]!r}); "
                                  "expected each file once (which copy is meant?); refused")
        else:
            files[path] = name
        for parent in Path(path).parents[:-1]:  # its folders, without the archive's own ('.')
            folders.setdefault(str(parent), name)
    for path, name in files.items():
        if path in folders:
            raise ArtifactMissing(f"archive {archive}: member {name!r} is a file and {folders[path]!r} makes the "
                                  "same path a folder; expected one or the other; refused")


def _open_archive(opener: Any, archive: Path, *args: str) -> Any:
    """`opener(archive, *args)`, an archive too damaged to open (a zip cut before its central directory, a tar
    whose first header is cut) an ArtifactMissing naming it."""
    try:
        return opener(archive, *args)
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError) as error:
        raise ArtifactMissing(f"archive {archive}: cannot be opened ({type(error).__name__}: {error}): it is cut "
                              "short or damaged; nothing extracted; fetch the archive again") from error


def _tar_members(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    """Every member of a tar or tar.gz archive, read to its end-of-archive marker: tarfile stops without a word at a
    header cut short (or a cut at a member boundary), extracting the members before it as the whole archive, and a
    gzip stream cut short is a bare EOFError; either is an ArtifactMissing naming the archive, the members read and
    the last of them, before anything is written."""
    members: list[tarfile.TarInfo] = []
    try:
        for member in tar:
            members.append(member)
        check_end(tar.fileobj, tar.offset, archive, what="archive")
    except (tarfile.TarError, zlib.error, EOFError, OSError) as error:
        last = f"the last read {members[-1].name!r}" if members else "none read"
        raise ArtifactMissing(f"archive {archive}: cut short or damaged after {len(members)} members ({last}): "
                              f"{type(error).__name__}: {error}; nothing extracted; fetch the archive again") from error
    return members


def extract_archive(archive: Path) -> dict[str, int]:
    """Unpack a zip or tar.gz release archive into its own folder, as the releases' readers do (`unzip
    data.zip`, FSC-CLIP's `tar -zxf coca_captions.tar.gz`). Every member is checked before any is written:
    it must stay inside the folder (no '..', no absolute name), be a plain file or folder (no link or
    device) with a path of its own (no name twice), and the declared sizes must stay within
    MAX_EXTRACT_RATIO; a zip member is read to its declared size only. The members are written to a hidden
    folder beside the archive and moved into place only when every one has read back whole, so a member
    that does not (a zip member inflating past its declared size fails its CRC there; a damaged stream) is an
    ArtifactMissing naming the archive and the member, with nothing extracted. Returns {members, bytes}."""
    folder = archive.parent
    with contextlib.ExitStack() as stack:
        # each member as (name, is_dir, is_plain, declared size, opener): zip and tar read alike below
        if archive.name.endswith(".zip"):
            package = stack.enter_context(_open_archive(zipfile.ZipFile, archive))
            members = [(i.filename, i.is_dir(), (i.external_attr >> 16) & 0o170000 != 0o120000, i.file_size,
                        functools.partial(package.open, i)) for i in package.infolist()]
        else:
            tar = stack.enter_context(_open_archive(tarfile.open, archive, "r:*"))
            members = [(m.name, m.isdir(), m.isfile() or m.isdir(), m.size, functools.partial(tar.extractfile, m))
                       for m in _tar_members(tar, archive)]
        for name, _, plain, _, _ in members:
            _member_target(folder, name, archive)
            if not plain:
                raise ArtifactMissing(f"archive {archive}: member {name!r} is not a plain file or folder (a link?); "
                                      "refused")
        _check_unique_targets(archive, folder, [(name, is_dir) for name, is_dir, *_ in members])
        declared = sum(size for *_, size, _ in members)
        _check_ratio(archive, declared)
        staging = folder / f".{archive.name}.extracting-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for name, is_dir, _, size, opener in members:
                target = _member_target(staging, name, archive)
                if is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with opener() as source, open(target, "wb") as sink:
                        shutil.copyfileobj(source, sink)
                except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError) as error:
                    raise ArtifactMissing(f"archive {archive}: member {name!r} (declared {size} bytes) does not read "
                                          f"back whole ({type(error).__name__}: {error}): its data inflates past its "
                                          "declared size or is damaged; nothing extracted; fetch the archive "
                                          "again") from error
            _move_into(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return {"members": len(members), "bytes": declared}


def _move_into(staging: Path, folder: Path) -> None:
    """Every file extracted to `staging` moved to the same path under `folder` (renames, one filesystem), folders
    made as needed; an earlier extraction's copy of a file is replaced."""
    for root, dirs, files in os.walk(staging):
        relative = Path(root).relative_to(staging)
        for name in dirs:
            (folder / relative / name).mkdir(exist_ok=True)
        for name in files:
            os.replace(Path(root) / name, folder / relative / name)


def _entry_path(artifact: Artifact, folder: Path) -> Path:
    """What `resolve` returns: the folder, or for open_clip weights the weights file in it."""
    if artifact.kind != "open_clip":
        return folder
    names = (artifact.file,) if artifact.file else OPEN_CLIP_WEIGHTS
    found = next((folder / n for n in names if (folder / n).is_file()), None)
    if found is None:
        raise ArtifactMissing(f"{artifact.id}: {folder} has no weights file ({', '.join(names)})")
    return found


def _checked(artifact: Artifact, entry: dict[str, Any], cache: Path) -> bool:
    """A cached single file against the sha256 its entry records: refused when its bytes changed (refetching
    would keep them: the hub's cache does not check what it holds); an entry without a hash (an older
    manifest) gets one. Returns True when the entry was updated."""
    path = manifest_entry_path(cache, artifact.id, entry)
    if not path.is_file():
        return False
    if entry.get(SHA256_KEY) is None:
        entry[SHA256_KEY] = file_sha256(path)
        return True
    if file_sha256(path) != entry[SHA256_KEY]:
        raise ArtifactMissing(f"{artifact.id}: {path} no longer has the sha256 {entry[SHA256_KEY]} recorded in "
                              f"{cache / MANIFEST}; {refetch_hint(path)}")
    return False


def prefetch(config: dict[str, Any], cache: Path, source_dir: Path | None = None, token: str | None = None,
             log: Any = print) -> dict[str, Any]:
    """Fetch every artifact of `config` into `cache` (from the hub, or from `source_dir`) and record each in the
    manifest; returns the manifest. Artifacts already recorded and present are kept as they are."""
    cache.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(cache)
    for artifact in config_artifacts(config):
        entry = manifest["artifacts"].get(artifact.id)
        if entry and manifest_entry_path(cache, artifact.id, entry).exists():
            if _checked(artifact, entry, cache):
                write_manifest(cache, manifest)
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
        if artifact.kind == DATASET_KIND:  # the fetched files, not what an earlier run extracted beside them
            files = {name: size for name, size in files.items() if any(fnmatch(name, p) for p in _patterns(artifact))}
        entry = {"kind": artifact.kind, "source": artifact.source, "file": artifact.file, "keys": list(artifact.keys),
                 "path": os.path.relpath(path, cache), "revision": revision, "files": files,
                 "bytes": sum(files.values()), SHA256_KEY: file_sha256(path) if path.is_file() else None}
        if artifact.extract:  # the fetched files are recorded, not the (maybe 100,000s of) members
            entry["extracted"] = {name: extract_archive(folder / name) for name in files
                                  if name.endswith(ARCHIVES)}
        manifest["artifacts"][artifact.id] = entry
        write_manifest(cache, manifest)  # after each artifact: an interrupted prefetch keeps what it fetched
        log(f"fetched  {artifact.id} ({entry['bytes'] / 1e9:.2f} GB)")
    return manifest


# --- the preflight check (the Snakefile, while it builds the DAG) -------------------------------------------


def uncached_artifacts(config: dict[str, Any], cache: Path) -> list[Artifact]:
    """The artifacts of `config` a job would not find in `cache`: not in its manifest, or the recorded file gone
    (what `compo.artifacts.resolve` would raise in the job, after its wait in the queue). Torch-free, for the
    DAG build: a pretrained base counts as cached when an open_clip entry names its key `bases.<name>.init`
    (the exact weights file, and SigLIP's tokenizer fetched with it, are matched by the job)."""
    needed = config_artifacts(config, models=False)
    pretrained = {name: base for name, base in config.get("bases", {}).items()
                  if base.get("init", "scratch") != "scratch"}
    bases = {f"bases.{name}.init": base for name, base in pretrained.items() if not base.get("weights")}
    # a base read from a local `weights` file needs no cached weights, only its Hugging Face tokenizer if it has one
    needed += [t for name, base in pretrained.items() if base.get("weights")
               if (t := tokenizer_artifact(base["model"], f"bases.{name}.model", registry=False)) is not None]
    if not needed and not bases:
        return []
    present = {id_: entry for id_, entry in read_manifest(cache)["artifacts"].items()
               if (cache / entry["path"]).exists()}
    missing = [Artifact("open_clip", f"{base['model']} {base['init']}", (key,)) for key, base in bases.items()
               if not any(entry["kind"] == "open_clip" and key in entry.get("keys", []) for entry in present.values())]
    return missing + [artifact for artifact in needed if artifact.id not in present]


def check_model_cache(config: dict[str, Any], configfiles: list[str | Path], cache: Path) -> None:
    """Raise ConfigError naming every model `config` needs that `cache` lacks, with its keys and the prefetch
    command for these config files; before any job is queued."""
    from compo.config import ConfigError

    try:
        missing = uncached_artifacts(config, cache)
    except ArtifactMissing as error:  # an unreadable manifest
        raise ConfigError(str(error)) from error
    if missing:
        lines = [f"  {artifact.id} (named by {', '.join(artifact.keys)})" for artifact in missing]
        command = "compo prefetch --configfile " + " ".join(map(str, configfiles or ["<the study's config files>"]))
        raise ConfigError(f"{len(missing)} model(s) or released dataset(s) the config needs are not in the model "
                          f"cache {cache} (config key model_cache): run `{command}` on a node with internet (jobs "
                          "never download):\n" + "\n".join(lines))
