"""config/paper.yaml's benchmarks released on the Hugging Face Hub (issue 58 item 4): the zero-shot test sets as
CLIP_benchmark's webdataset exports (clip-benchmark/wds_<name>), Winoground and Urban1k, imported by `compo
prefetch --from` from folders in the layout their repositories have (tiny files written here) and read by the
project's readers in the cache; and `compo inputs --template`, which names each key left by hand with its download
address and layout (and sets results / model_cache, with no path under this machine's cache). No network here."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from paper_fixtures import REPO
from test_real_benchmarks import placeholders

from compo.artifacts import default_cache
from compo.config import load_config, load_yaml
from compo.evaluate.kinds import benchmark_files, benchmark_images
from compo.evaluate.labelled import read_split
from compo.inputs import YOURS, missing_inputs, raw_inputs, template
from compo.prefetch import config_artifacts, prefetch

PAPER = load_yaml(REPO / "config" / "paper.yaml")
WDS = {"imagenet": "wds_imagenet1k", "cifar10": "wds_vtab-cifar10", "cifar100": "wds_vtab-cifar100",
       "food101": "wds_food101", "pets": "wds_vtab-pets", "flowers": "wds_vtab-flowers", "cars": "wds_cars",
       "dtd": "wds_vtab-dtd", "fgvc_aircraft": "wds_fgvc_aircraft"}
OTHERS = {"winoground": "facebook/winoground", "urban1k": "BeichenZhang/Urban1k"}
CLASSES = 3


def _tar(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _png(k: int, folder: Path) -> bytes:
    placeholders(folder, {f"{k}.png"})
    return (folder / f"{k}.png").read_bytes()


def write_releases(root: Path) -> Path:
    """`root/<org>/<name>/` as each repository holds it: a CLIP_benchmark export's test/ shards and classnames.txt
    (with a train/ split the entries do not ask for), Winoground's data/ and Urban1k's zip."""
    scratch = root / "scratch"
    for repo in WDS.values():
        folder = root / "clip-benchmark" / repo
        for split, shards in (("test", 2), ("train", 1)):
            (folder / split).mkdir(parents=True)
            (folder / split / "nshards.txt").write_text(f"{shards}\n")
            for shard in range(shards):
                # a sample's members one after the other, as webdataset writes them
                _tar(folder / split / f"{shard}.tar", {
                    name: data for k in range(CLASSES)
                    for name, data in ((f"s{shard}{k}.webp", _png(k, scratch)), (f"s{shard}{k}.cls", str(k).encode()))})
        (folder / "classnames.txt").write_text("".join(f"class {k}\n" for k in range(CLASSES)))
        (folder / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\n")
    wino = root / "facebook" / "winoground" / "data"
    wino.mkdir(parents=True)
    (wino / "examples.jsonl").write_text("".join(json.dumps(
        {"id": i, "image_0": f"ex_{i}_img_0", "image_1": f"ex_{i}_img_1", "caption_0": "a dog on a cat",
         "caption_1": "a cat on a dog", "tag": "Noun", "secondary_tag": "", "num_main_preds": 1,
         "collapsed_tag": "Object"}) + "\n" for i in range(2)))
    with zipfile.ZipFile(wino / "images.zip", "w") as package:
        for i in range(2):
            for k in range(2):
                package.writestr(f"images/ex_{i}_img_{k}.png", _png(2 * i + k, scratch))
    urban = root / "BeichenZhang" / "Urban1k"
    urban.mkdir(parents=True)
    with zipfile.ZipFile(urban / "Urban1k.zip", "w") as package:
        for n in (1, 2):
            package.writestr(f"Urban1k/caption/{n}.txt", f"a long caption of street scene {n}.")
            package.writestr(f"Urban1k/image/{n}.jpg", _png(n, scratch))
    return root


def hub_config(cache: Path) -> dict:
    names = [*WDS, *OTHERS]
    return load_config(REPO / "config" / "config.yaml", overrides={
        "model_cache": str(cache), "benchmarks": {name: PAPER["benchmarks"][name] for name in names}})


@pytest.fixture(scope="module")
def fetched_benchmarks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hub")
    source, cache = write_releases(root / "from"), root / "cache"
    config = hub_config(cache)
    lines: list[str] = []
    manifest = prefetch(config, cache, source_dir=source, log=lines.append)
    return {"config": config, "cache": cache, "manifest": manifest, "lines": lines}


def test_paper_yaml_fetches_the_zero_shot_test_sets_and_the_hub_releases(fetched_benchmarks) -> None:
    sources = {a.source for a in config_artifacts(fetched_benchmarks["config"], models=False)}
    assert sources == {f"clip-benchmark/{r}" for r in WDS.values()} | set(OTHERS.values())
    entries = {e["source"]: e for e in fetched_benchmarks["manifest"]["artifacts"].values()}
    # the test split and the class names only: the train/ shards and the templates file stay on the hub
    assert sorted(entries["clip-benchmark/wds_imagenet1k"]["files"]) == [
        "classnames.txt", "test/0.tar", "test/1.tar", "test/nshards.txt"]
    assert entries["facebook/winoground"]["extracted"] == {"data/images.zip": {"members": 4, "bytes": sum(
        len(b) for b in [_png(k, fetched_benchmarks["cache"].parent / "png") for k in range(4)])}}
    # every path of these entries is in the cache; what stays by hand is CLIP_benchmark's classnames / templates
    hand = {item.key.split(".")[-1] for item in missing_inputs(fetched_benchmarks["config"])}
    assert hand == {"classnames", "templates"}
    assert not [item for item in missing_inputs(fetched_benchmarks["config"]) if item.hub]


def test_the_readers_read_the_cached_releases(fetched_benchmarks) -> None:
    benchmarks = fetched_benchmarks["config"]["benchmarks"]
    for name in WDS:
        spec = benchmarks[name]
        split = read_split(spec, Path(spec["path"]), "test")
        assert split is not None and split.labels == [0, 1, 2, 0, 1, 2], name
        assert split.own_names == [f"class {k}" for k in range(CLASSES)]
    wino = benchmarks["winoground"]
    assert all(Path(f).is_file() for f in benchmark_files("winoground", wino["path"], wino))
    images = benchmark_images("winoground", wino, wino["path"])
    assert len(images) == 4 and all(p.is_file() for p in images)
    urban = benchmarks["urban1k"]
    images = benchmark_images("long_retrieval", urban, urban["path"])
    assert len(images) == 2 and all(p.is_file() for p in images)


def test_paper_yaml_fetches_43_raw_inputs_from_17_releases() -> None:
    items = raw_inputs(load_config(REPO / "config" / "paper.yaml"))
    fetched = [item for item in items if item.hub]
    assert (len(fetched), len({item.hub for item in fetched})) == (43, 17)  # before issue 58: 20 from 6


def test_the_template_names_every_hand_key_with_its_address_and_layout(tmp_path: Path) -> None:
    made = subprocess.run([sys.executable, "-m", "compo", "inputs", "--configfile", str(REPO / "config" / "paper.yaml"),
                           "--template"], capture_output=True, text=True, check=True)
    lines = made.stdout.splitlines()
    assert lines[:2] == ["results: results  # every output of the study (a folder on a filesystem the jobs share)",
                         lines[1]] and lines[1].startswith("model_cache: null  # ")
    leaves = [line for line in lines if not line.rstrip().endswith(":")]
    assert leaves and all("  # " in line and not line.endswith("# source unknown") for line in leaves), \
        [line for line in leaves if line.endswith("source unknown") or "  # " not in line]
    assert str(default_cache()) not in made.stdout  # nothing under this machine's cache
    overlay = yaml.safe_load(made.stdout)
    assert overlay["benchmarks"]["svo_probes"]["image_root"] == YOURS
    assert "winoground" not in overlay["benchmarks"] and "imagenet" in overlay["benchmarks"]  # its templates
    assert overlay == template(raw_inputs(load_config(REPO / "config" / "paper.yaml")),
                               load_config(REPO / "config" / "paper.yaml"))
