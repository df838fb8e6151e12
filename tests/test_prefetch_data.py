"""Data released on the Hugging Face Hub, fetched by `compo prefetch` like the models (issues 46 item 5, 47 item 4):
config/paper.yaml's SPEC, SVO-Probes, COCO-Counterfactuals, DeGLA's negatives and FSC-CLIP's 100K subsets, each
imported with `--from` from a folder in its repository's layout (tiny files written here), recorded in the
manifest, a second run a no-op, archives extracted with every member kept inside, and the project's loaders
reading the cached copy. The hub itself is never called (no network here)."""

from __future__ import annotations

import copy
import io
import json
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from paper_fixtures import REPO, write_degla_released
from test_real_benchmarks import placeholders
from test_webdataset import _samples, _write_webdataset

from compo.artifacts import MANIFEST, dataset_folder, read_manifest
from compo.config import ConfigError, load_config, load_yaml
from compo.data import build_manifest
from compo.evaluate import benchmark_files, run_benchmark, svo_probes
from compo.evaluate import coco_counterfactuals as coco_cf
from compo.evaluate.files import SPEC_SUBSETS
from compo.inputs import check_raw_inputs, missing_inputs, raw_inputs
from compo.io import read_table
from compo.negatives import build_generator
from compo.paths import OutsideRootError
from compo.prefetch import MAX_EXTRACT_RATIO, config_artifacts, extract_archive, prefetch, uncached_artifacts

FIXTURES = REPO / "tests" / "fixtures"
PAPER = load_yaml(REPO / "config" / "paper.yaml")
# the entries of config/paper.yaml released on the hub, as paper.yaml declares them
HUB_ENTRIES = {"benchmarks": ("spec", "svo_probes", "coco_counterfactuals"), "negatives": ("degla-released",),
               "datasets": ("cc3m-100k", "laion-coco-100k")}
REPOS = {"wjpoom/SPEC", "MichiganNLP/svo_probes", "Intel/COCO-Counterfactuals", "wsdwJohn1231/DeGLA",
         "ytaek-oh/cc3m-subset-100k", "ytaek-oh/laioncoco-subset-100k"}


def hub_config(cache: Path, **changes: dict) -> dict:
    """The embedded default config with paper.yaml's hub entries (as declared there) and `cache` as model cache;
    `changes`: entries replaced, by section."""
    overlay: dict = {"model_cache": str(cache)}
    for section, names in HUB_ENTRIES.items():
        overlay[section] = {name: copy.deepcopy(PAPER[section][name]) for name in names}
        overlay[section].update(changes.get(section, {}))
    return load_config(REPO / "config" / "config.yaml", overrides=overlay)


def _zip(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as package:
        for name, data in members.items():
            package.writestr(name, data)


def _folder_members(folder: Path, prefix: str = "") -> dict[str, bytes]:
    return {prefix + str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_hub_layouts(root: Path) -> Path:
    """`root/<org>/<name>/` for each release, in the layout its repository has (the files paper.yaml asks for)."""
    spec = root / "spec-unzipped"  # SPEC's data.zip: <subset>/{image2text,text2image}.json and their images
    for subset in SPEC_SUBSETS:
        (spec / subset).mkdir(parents=True)
        for name in ("image2text.json", "text2image.json"):
            (spec / subset / name).write_bytes((FIXTURES / "benchmarks" / "spec" / subset / name).read_bytes())
    placeholders(spec, {f"{s}/images/{k}_{j}.jpg" for s in SPEC_SUBSETS for k in (0, 1) for j in (0, 1, 2)})
    _zip(root / "wjpoom" / "SPEC" / "data.zip", _folder_members(spec))
    svo = root / "MichiganNLP" / "svo_probes"
    svo.mkdir(parents=True)
    (svo / "svo_probes.csv").write_bytes((FIXTURES / "benchmarks" / "svo_probes" / "svo_probes.csv").read_bytes())
    (svo / "README.md").write_text("not asked for: stays on the hub")
    cf = root / "Intel" / "COCO-Counterfactuals" / "data"
    cf.mkdir(parents=True)
    (cf / "examples.jsonl").write_bytes((FIXTURES / "raw" / "coco_counterfactuals" / "data" /
                                         "examples.jsonl").read_bytes())
    _zip(cf / "images.zip", _folder_members(FIXTURES / "raw" / "coco_counterfactuals" / "images", "images/"))
    (root / "wsdwJohn1231" / "DeGLA").mkdir(parents=True)
    write_degla_released(root / "wsdwJohn1231" / "DeGLA" / "DeGLA.json")
    samples = _samples()  # FSC-CLIP's subsets: webdataset shards; CC3M's CoCa captions in coca_captions.tar.gz
    cc3m = _write_webdataset(root / "ytaek-oh" / "cc3m-subset-100k", samples)
    with tarfile.open(cc3m / "coca_captions.tar.gz", "w:gz") as package:
        for s in samples:
            data = f"coca: a box {s['key']}\n".encode()
            info = tarfile.TarInfo(f"coca_captions/{s['key']}.txt")
            info.size = len(data)
            package.addfile(info, io.BytesIO(data))
    _write_webdataset(root / "ytaek-oh" / "laioncoco-subset-100k", samples)
    return root


@pytest.fixture(scope="module")
def fetched(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hub")
    source, cache = write_hub_layouts(root / "from"), root / "cache"
    config = hub_config(cache)
    with pytest.raises(ConfigError) as missing:  # before the prefetch: named with the command that fetches it
        check_raw_inputs(config)
    lines: list[str] = []
    manifest = prefetch(config, cache, source_dir=source, log=lines.append)
    return {"config": config, "cache": cache, "source": source, "manifest": manifest, "lines": lines,
            "missing": str(missing.value)}


def test_paper_yaml_declares_the_six_releases_and_reads_them_in_the_cache(tmp_path: Path) -> None:
    config = hub_config(tmp_path / "cache")
    datasets = {a.source: a for a in config_artifacts(config, models=False) if a.kind == "dataset"}
    assert set(datasets) == REPOS
    assert datasets["wjpoom/SPEC"].patterns == ("data.zip",) and datasets["wjpoom/SPEC"].extract
    assert datasets["ytaek-oh/cc3m-subset-100k"].keys == ("datasets.cc3m-100k.hub",)
    spec = config["benchmarks"]["spec"]
    assert spec["path"] == str(dataset_folder((tmp_path / "cache").resolve(), "wjpoom/SPEC"))  # path: .
    cf = config["benchmarks"]["coco_counterfactuals"]
    assert cf["image_root"].endswith("compo-prefetch/dataset/Intel/COCO-Counterfactuals/data/images")
    hub = {item.key: item.hub for item in raw_inputs(config) if item.hub}
    assert hub["negatives.degla-released.path"] == "wsdwJohn1231/DeGLA" and len(set(hub.values())) == 6
    # a path of the release may not leave its folder; an absolute folder of the user's (images) is kept
    with pytest.raises(ConfigError, match=r"key benchmarks.spec.path .*'\.\./x' .*refused"):
        hub_config(tmp_path / "cache", benchmarks={"spec": {**PAPER["benchmarks"]["spec"], "path": "../x"}})
    own = hub_config(tmp_path / "cache", benchmarks={"svo_probes": {**PAPER["benchmarks"]["svo_probes"],
                                                                    "image_root": str(tmp_path / "svo-images")}})
    assert own["benchmarks"]["svo_probes"]["image_root"] == str(tmp_path / "svo-images")


def test_prefetch_from_a_folder_fills_the_cache_and_a_second_run_is_a_no_op(fetched) -> None:
    assert "7 raw input(s) released on the Hugging Face Hub are not in the model cache: run `compo prefetch" \
        in fetched["missing"] and "hub dataset wjpoom/SPEC" in fetched["missing"]
    cache, manifest = fetched["cache"], fetched["manifest"]
    entries = {entry["source"]: entry for entry in manifest["artifacts"].values()}
    assert set(entries) == REPOS and all(e["kind"] == "dataset" for e in entries.values())
    assert list(entries["MichiganNLP/svo_probes"]["files"]) == ["svo_probes.csv"]  # README.md not asked for
    assert entries["Intel/COCO-Counterfactuals"]["extracted"] == {"data/images.zip": {"members": 20, "bytes": sum(
        p.stat().st_size for p in (FIXTURES / "raw" / "coco_counterfactuals" / "images").iterdir())}}
    assert entries["ytaek-oh/cc3m-subset-100k"]["extracted"]["coca_captions.tar.gz"]["members"] == 10
    assert sorted(entries["ytaek-oh/laioncoco-subset-100k"]["files"]) == [
        "00000.tar", "00000_stats.json", "00001.tar", "00001_stats.json"]
    assert (cache / "compo-prefetch/dataset/wjpoom/SPEC/count/image2text.json").is_file()
    # all there but SVO-Probes' images, which the release does not hold (downloaded from its URLs by the user)
    assert [item.key for item in missing_inputs(fetched["config"])] == ["benchmarks.svo_probes.image_root"]
    assert not uncached_artifacts(fetched["config"], cache)
    stamp = {p: p.stat().st_mtime_ns for p in (cache / "compo-prefetch").rglob("*") if p.is_file()}
    lines: list[str] = []
    again = prefetch(fetched["config"], cache, source_dir=fetched["source"], log=lines.append)
    assert again == manifest == read_manifest(cache) and len(lines) == 6
    assert all(line.startswith("cached   dataset:") for line in lines)
    assert stamp == {p: p.stat().st_mtime_ns for p in (cache / "compo-prefetch").rglob("*") if p.is_file()}


@pytest.mark.slow  # scores SPEC with the tiny model and builds two manifests: about 5 s
def test_the_loaders_read_the_cached_copies(fetched, loaded) -> None:
    config = fetched["config"]
    spec = config["benchmarks"]["spec"]
    assert all(Path(f).is_file() for f in benchmark_files("spec", spec["path"], spec))
    result = run_benchmark(loaded, spec, Path(spec["path"]))
    assert not result.skipped and {m: result.metrics[f"{m}/i2t"].n for m in SPEC_SUBSETS} == dict.fromkeys(
        SPEC_SUBSETS, 2)
    svo = config["benchmarks"]["svo_probes"]
    assert len(svo_probes.load_rows(Path(benchmark_files("svo_probes", svo["path"], svo)[0]))) == 5
    cf = config["benchmarks"]["coco_counterfactuals"]
    examples = coco_cf.load_examples(Path(benchmark_files("coco_counterfactuals", cf["path"], cf)[0]))
    assert len(examples) == 10 and all((Path(cf["image_root"]) / f"{e[f'image_{k}']}.jpg").is_file()
                                       for e in examples for k in (0, 1))
    degla = build_generator(config["negatives"]["degla-released"])
    assert len(next(iter(degla.negatives.values()))) == 4
    for name, repo, caption in (("cc3m-100k", "ytaek-oh/cc3m-subset-100k", "coca: a box 000000000"),
                                ("laion-coco-100k", "ytaek-oh/laioncoco-subset-100k", "a red box number 0")):
        out = fetched["cache"].parent / f"{name}.parquet"
        build_manifest(name, config["datasets"][name], out=out, report=out.with_suffix(".csv"))
        frame = read_table(out, "manifest")
        assert len(frame) == 10 and frame["caption"][0] == caption  # CC3M's CoCa caption, LAION-COCO's json field
        assert frame["image_path"][0] == f"{dataset_folder(fetched['cache'], repo)}/00000.tar#000000000.jpg"


@pytest.mark.parametrize("bad", ["../evil.txt", "/tmp/evil-absolute.txt", "link"])
def test_an_archive_member_leaving_the_folder_is_refused_before_anything_is_written(tmp_path: Path, bad) -> None:
    source = tmp_path / "from"
    archive = source / "wjpoom" / "SPEC" / "data.zip"
    _zip(archive, {"count/image2text.json": b"[]", **({} if bad == "link" else {bad: b"x"})})
    if bad == "link":  # a symbolic link member (unzip would make it a link out of the folder)
        with zipfile.ZipFile(archive, "a") as package:
            info = zipfile.ZipInfo("escape")
            info.external_attr = 0o120777 << 16
            package.writestr(info, "/etc/passwd")
    config = hub_config(tmp_path / "cache")
    only = {"benchmarks": {"spec": config["benchmarks"]["spec"]}, "datasets": {}, "negatives": {}}
    with pytest.raises((OutsideRootError, RuntimeError), match=r"data\.zip.*member '(\.\./evil\.txt|/tmp/evil-"
                                                               r"absolute\.txt|escape)'"):
        prefetch({**config, **only}, tmp_path / "cache", source_dir=source, log=lambda line: None)
    folder = dataset_folder(tmp_path / "cache", "wjpoom/SPEC")
    assert not (folder / "count").exists() and not (tmp_path / "cache" / "evil.txt").exists()
    assert not read_manifest(tmp_path / "cache")["artifacts"]  # nothing recorded: a rerun starts again


def test_a_zip_bomb_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "from"
    _zip(source / "wjpoom" / "SPEC" / "data.zip", {"zeros.bin": bytes(4 << 20)})  # 4 MB of zeros: ~4 KB zipped
    config = hub_config(tmp_path / "cache")
    only = {"benchmarks": {"spec": config["benchmarks"]["spec"]}, "datasets": {}, "negatives": {}}
    with pytest.raises(RuntimeError, match=rf"data\.zip: its members declare 4194304 bytes, more than "
                                           rf"{MAX_EXTRACT_RATIO} times"):
        prefetch({**config, **only}, tmp_path / "cache", source_dir=source, log=lambda line: None)
    assert not (dataset_folder(tmp_path / "cache", "wjpoom/SPEC") / "zeros.bin").exists()


def _twice_zip(path: Path) -> None:
    """A zip naming one member twice (zipfile warns and writes both; `zip` cannot, a concatenation can)."""
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "w") as package:
        package.writestr("data/a.json", b"[1]")
        package.writestr("data/a.json", b"[2]")


def _tar_gz(path: Path, members: list[tuple[str, bytes | None]]) -> None:
    """A tar.gz of files (bytes) and folders (None), in this order."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("case", ["zip-twice", "tar-twice", "tar-twice-spelt-otherwise", "tar-file-then-folder",
                                  "tar-folder-then-file"])
def test_an_archive_naming_a_path_twice_is_refused_before_anything_is_written(tmp_path: Path, case) -> None:
    """Issue 59: a zip with one member name twice kept the second, silently; a tar with a file and a folder of one
    name stopped midway (FileExistsError, members left). Both refused up front, naming the archive and member."""
    archive = tmp_path / ("data.zip" if case.startswith("zip") else "data.tar.gz")
    if case == "zip-twice":
        _twice_zip(archive)
    else:
        _tar_gz(archive, {
            "tar-twice": [("data/a.json", b"[1]"), ("data/a.json", b"[2]")],
            "tar-twice-spelt-otherwise": [("data/a.json", b"[1]"), ("./data//a.json", b"[2]")],
            "tar-file-then-folder": [("data/a.json", b"[1]"), ("data", b"x"), ("data/b.json", b"[3]")],
            "tar-folder-then-file": [("data", None), ("data/a.json", b"[1]"), ("data", b"x")],
        }[case])
    expected = r"given twice \(also as 'data/a\.json'\)" if "twice" in case else \
        r"'data' is a file and '(data/a\.json|data)' makes the same path a folder"
    with pytest.raises(RuntimeError, match=rf"archive {archive}: member .*{expected}"):
        extract_archive(archive)
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name]  # nothing written


def _zip_declaring_less(path: Path, name: str, data: bytes, declared: int) -> None:
    """A zip whose member `name` declares `declared` bytes (local header and central directory) but inflates to
    `data`: an ordinary member before it."""
    import struct

    _zip(path, {"data/first.json": b"[1]", name: data})
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as package:
        struct.pack_into("<I", raw, package.getinfo(name).header_offset + 22, declared)  # local header
    central = raw.find(b"PK\x01\x02")
    while central >= 0:
        if raw[central + 46: central + 46 + len(name)] == name.encode():
            struct.pack_into("<I", raw, central + 24, declared)
        central = raw.find(b"PK\x01\x02", central + 1)
    path.write_bytes(bytes(raw))


def test_a_zip_member_inflating_past_its_declared_size_names_archive_and_member_and_leaves_nothing(
        tmp_path: Path) -> None:
    """Issue 59: zipfile's BadZipFile ('Bad CRC-32 for file ...') named no archive, and the members before it were
    left extracted. Now an error naming both, the folder as it was (an earlier extraction's file kept as it was)."""
    archive = tmp_path / "data.zip"
    _zip_declaring_less(archive, "data/big.bin", b"y" * 5000, declared=100)
    (tmp_path / "earlier.txt").write_text("an earlier extraction's file")
    with pytest.raises(RuntimeError, match=rf"archive {archive}: member 'data/big\.bin' \(declared 100 bytes\) does "
                                           r"not read back whole \(BadZipFile: Bad CRC-32 .*inflates past its "
                                           r"declared size .* nothing extracted"):
        extract_archive(archive)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zip", "earlier.txt"]
    assert (tmp_path / "earlier.txt").read_text() == "an earlier extraction's file"
    # the same archive whole: extracted, and a second extraction (a rerun) replaces the files in place
    _zip(archive, {"data/first.json": b"[1]", "data/big.bin": b"y" * 5000})
    assert extract_archive(archive) == {"members": 2, "bytes": 5003}
    assert extract_archive(archive) == {"members": 2, "bytes": 5003}
    assert (tmp_path / "data" / "big.bin").read_bytes() == b"y" * 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "data.zip", "earlier.txt"]


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# Three members of 700 bytes: headers at bytes 0, 1536 and 3072 of the tar stream
TAR_MEMBERS = {"data/a.json": b"a" * 700, "data/b.json": b"b" * 700, "data/c.json": b"c" * 700}


@pytest.mark.parametrize(("case", "last", "why"), [
    ("in-a-header", "data/a.json", "found bytes that are no tar header"),
    ("at-a-member-boundary", "data/a.json", "found the end of the file"),
    ("in-a-members-data", "data/b.json", "ReadError: unexpected end of data"),
    ("in-the-gzip-stream", "data/a.json", "EOFError: Compressed file ended"),
    ("uncompressed-in-a-header", "data/a.json", "found bytes that are no tar header"),
])
def test_a_tar_gz_cut_short_names_the_archive_and_the_last_member_read(tmp_path: Path, case, last, why) -> None:
    """Issue 59: tarfile stops without a word at a header cut short (or at a cut on a member boundary), and the
    members before it were extracted as the whole release; a gzip stream cut short was a bare EOFError naming no
    archive. Now an error naming the archive, the members read and the last of them, nothing written."""
    import gzip

    whole = _tar_bytes(TAR_MEMBERS)
    cut = {"in-a-header": 1536 + 100, "at-a-member-boundary": 1536, "in-a-members-data": 1536 + 512 + 200,
           "uncompressed-in-a-header": 1536 + 100}.get(case)
    if case == "in-the-gzip-stream":  # members of random bytes (a long stream), cut in the first one's data
        noise = random.Random(0).randbytes
        data = gzip.compress(_tar_bytes({name: noise(700) for name in TAR_MEMBERS}))
        data = data[: len(data) // 4]
        whole = None
    archive = tmp_path / ("release.tar" if case.startswith("uncompressed") else "release.tar.gz")
    archive.write_bytes(data if whole is None else whole[:cut] if case.startswith("uncompressed")
                        else gzip.compress(whole[:cut]))
    with pytest.raises(RuntimeError, match=rf"archive {archive}: .*\(the last read {last!r}\).*{why}.*nothing "
                                           "extracted"):
        extract_archive(archive)
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]
    archive.write_bytes(gzip.compress(_tar_bytes(TAR_MEMBERS)) if archive.suffix == ".gz" else _tar_bytes(TAR_MEMBERS))
    assert extract_archive(archive) == {"members": 3, "bytes": 2100}  # whole: every member


def test_a_zip_image_archive_naming_a_member_twice_is_refused(tmp_path: Path) -> None:
    """ELEVATER's image zips are read in place (compo.images.zip_members): a name stored twice read the second."""
    from compo.images import zip_members

    _twice_zip(tmp_path / "images.zip")
    with pytest.raises(zipfile.BadZipFile, match=r"images\.zip: member 'data/a\.json' is stored twice"):
        zip_members(tmp_path / "images.zip")


def test_compo_inputs_and_prefetch_list_say_where_a_release_resolves(fetched) -> None:
    overlay = fetched["cache"].parent / "hub.yaml"
    overlay.write_text(json.dumps({"model_cache": str(fetched["cache"]),
                                   **{s: {n: PAPER[s][n] for n in names} for s, names in HUB_ENTRIES.items()}}))
    args = ["--configfile", str(REPO / "config" / "config.yaml"), str(overlay)]
    run = subprocess.run([sys.executable, "-m", "compo", "inputs", *args], capture_output=True, text=True,
                         check=False, cwd=fetched["cache"].parent)
    assert run.returncode == 1 and "24 raw inputs, 1 missing" in run.stdout, run.stdout + run.stderr  # SVO's images
    folder = dataset_folder(fetched["cache"], "wjpoom/SPEC")
    assert f"ok       benchmarks.spec.path: {folder} (hub dataset wjpoom/SPEC: compo prefetch)" in run.stdout
    listed = subprocess.run([sys.executable, "-m", "compo", "prefetch", *args, "--list"], capture_output=True,
                            text=True, check=False)
    assert listed.returncode == 0 and "dataset:wjpoom/SPEC  (0.00 GB, cached)  named by benchmarks.spec.hub" \
        in listed.stdout
    assert (fetched["cache"] / MANIFEST).is_file()
