"""Zero-shot classification's file readers (compo.evaluate.zeroshot), scored by a tiny random model and checked
against plain loops: CIFAR's python pickles (read through a restricted unpickler, so no data file runs code: issue
31; zero-shot and the linear probe), ImageNet synset folders with CLIP_benchmark's class names and per-dataset
templates, class-name text files; a labelled split shared by several benchmarks is decoded once per job (issue 42)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_helpers import pixels, write_image, zeroshot_loop
from PIL import Image

import compo.evaluate.scoring as scoring
from compo.evaluate import benchmark_files, run_benchmark
from compo.evaluate.files import BenchmarkError
from compo.evaluate.zeroshot import shared_split_features

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared

# --- CIFAR pickles are read through a restricted unpickler -------------------------------------------


class _Payload:
    """Unpickling this runs a shell command (what a crafted data_batch_* holds)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def _cifar10_with_payload(root: Path, marker: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batch = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1], "payload": _Payload(marker)}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": ["cat", "dog"]}, protocol=2))
    return folder


@pytest.mark.parametrize("verify", [False, True])
def test_a_cifar_pickle_payload_never_runs(tmp_path: Path, verify: bool) -> None:
    from compo.evaluate.zeroshot import load_split

    marker = tmp_path / "MARKER"
    folder = _cifar10_with_payload(tmp_path / "bench", marker)
    spec = {"kind": "zeroshot", "source": "files", "format": "cifar10", "verify": verify}
    with pytest.raises(BenchmarkError) as caught:
        load_split(spec, tmp_path / "bench")
    assert not marker.exists()
    message = str(caught.value)
    assert str(folder / "test_batch") in message, message
    if verify:  # the released md5 fails first; the message does not send the user to verify: false
        assert "md5" in message and "verify: false" not in message and "verify" not in message.split("(")[0], message
    else:
        assert "posix.system" in message and "refused" in message, message


def test_the_restricted_unpickler_reads_what_cifar_files_hold(tmp_path: Path) -> None:
    """Python 2 era names (numpy.core.multiarray) and protocol 2 bytes are admitted; anything else is not."""
    from compo.evaluate.zeroshot import restricted_unpickle

    data = {"data": np.arange(6, dtype=np.uint8).reshape(2, 3), "labels": [1, 2], "batch_label": b"x",
            "filenames": ["a.png"], "scale": 1.5}
    path = tmp_path / "batch"
    raw = pickle.dumps(data, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path.write_bytes(raw)
    loaded = restricted_unpickle(path)
    assert np.array_equal(loaded["data"], data["data"]) and loaded["labels"] == [1, 2]
    assert loaded["batch_label"] == b"x" and loaded["filenames"] == ["a.png"]
    path.write_bytes(pickle.dumps({"a": Path("x")}))
    with pytest.raises(BenchmarkError, match=r"batch: refused: the pickle asks for pathlib\.PosixPath"):
        restricted_unpickle(path)


def test_identical_zero_shot_class_names_are_an_error(tmp_path: Path, caplog) -> None:
    """Every image of the two classes tied (top-1 0.0); CLIP_benchmark's imagenet1k table keeps its repeats."""
    from compo.evaluate.files import BenchmarkError
    from compo.evaluate.zeroshot import class_names

    (tmp_path / "classnames.json").write_text(json.dumps(["cube", "ball", "cube"]))
    with pytest.raises(BenchmarkError, match=r"classnames\.json: 1 class name\(s\) given to more than one class "
                                             r"\('cube' for c0, c2\); expected one name per class"):
        class_names({}, tmp_path, ["c0", "c1", "c2"])
    (tmp_path / "classnames.json").write_text(json.dumps({"imagenet1k": ["cube", "ball", "cube"]}))
    with caplog.at_level("WARNING"):
        assert class_names({"dataset": "imagenet1k"}, tmp_path, ["c0", "c1", "c2"]) == ["cube", "ball", "cube"]
    assert "shared by several classes as released ('cube' for c0, c2)" in caplog.text


# --- CIFAR python pickles in the released layout (zero-shot and the linear probe) ---------------------

def write_cifar(root: Path, name: str, per_split: dict[str, int]) -> dict[str, tuple[np.ndarray, list[int]]]:
    """The released python layout: pickled dicts with data [n, 3072] (channel planes) and labels."""
    folder, label_key, names_key, files, meta, classes = {
        "cifar10": ("cifar-10-batches-py", "labels", "label_names",
                    {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}, "batches.meta",
                    ["airplane", "automobile", "bird"]),
        "cifar100": ("cifar-100-python", "fine_labels", "fine_label_names", {"train": ["train"], "test": ["test"]},
                     "meta", ["apple", "aquarium_fish", "baby"]),
    }[name]
    (root / folder).mkdir(parents=True)
    out = {}
    seed = 0
    for split, n in per_split.items():
        images, labels = [], []
        for file in files[split]:
            batch = np.stack([pixels(seed + k) for k in range(n)])
            batch_labels = [(seed + k) % len(classes) for k in range(n)]
            seed += n
            data = batch.transpose(0, 3, 1, 2).reshape(n, -1)
            with open(root / folder / file, "wb") as handle:
                pickle.dump({"data": data, label_key: batch_labels}, handle)
            images.append(batch)
            labels += batch_labels
        out[split] = (np.concatenate(images), labels)
    with open(root / folder / meta, "wb") as handle:
        pickle.dump({names_key: classes}, handle)
    return out


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_zeroshot_on_cifar_pickles_read_by_torchvision(tmp_path: Path, loaded, name: str) -> None:
    written = write_cifar(tmp_path, name, {"test": 6})
    spec = {"kind": "zeroshot", "source": "files", "format": name}
    test_file = "test_batch" if name == "cifar10" else "test"
    with pytest.raises(BenchmarkError, match=rf"/{test_file}: md5 [0-9a-f]+ is not the released file's"):
        run_benchmark(loaded, spec, tmp_path, ["a photo of a {}."])
    result = run_benchmark(loaded, {**spec, "verify": False}, tmp_path, ["a photo of a {}.", "art of a {c}."])
    images, labels = written["test"]
    own = ["airplane", "automobile", "bird"] if name == "cifar10" else ["apple", "aquarium_fish", "baby"]
    expected = zeroshot_loop(loaded, [Image.fromarray(a) for a in images], labels, own,
                             ["a photo of a {}.", "art of a {c}."])
    assert result.metrics["top1"].value == pytest.approx(expected) and result.metrics["top1"].n == 6
    assert result.predictions["item"].tolist() == [f"test/{i}" for i in range(6)]
    assert result.predictions["subset"].tolist() == [own[label] for label in labels]
    files = benchmark_files("zeroshot", str(tmp_path), spec)
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    assert files == [f"{tmp_path}/{folder}/{f}" for f in (("test_batch", "batches.meta") if name == "cifar10"
                                                        else ("test", "meta"))]


def test_linear_probe_on_cifar_pickles(tmp_path: Path, loaded) -> None:
    write_cifar(tmp_path, "cifar10", {"train": 3, "test": 4})
    result = run_benchmark(loaded, {"kind": "linear_probe", "source": "files", "format": "cifar10",
                                    "verify": False}, tmp_path)
    assert result.metrics["top1"].n == 4 and set(result.predictions["subset"]) <= {"airplane", "automobile", "bird"}
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(BenchmarkError, match=r"data_batch_3: cifar10 file not found"):
        run_benchmark(loaded, {"kind": "linear_probe", "source": "files", "format": "cifar10", "verify": False},
                      tmp_path)


# --- ImageNet synset folders, CLIP_benchmark names and templates, class-name text files --------------

def test_imagenet_synset_folders_with_clip_benchmark_names_and_templates(tmp_path: Path, loaded) -> None:
    val = tmp_path / "val"
    synsets = ["n01443537", "n01440764", "n01484850"]  # sorted: n01440764 (tench) comes first
    for k, synset in enumerate(synsets):
        for i in range(2):
            write_image(val / synset / f"ILSVRC2012_val_{k}{i}.JPEG", 10 * k + i)
    classnames = tmp_path / "en_classnames.json"
    classnames.write_text(json.dumps({"imagenet1k": ["tench", "goldfish", "great white shark"],
                                      "cars": ["a car"]}))
    templates = tmp_path / "en_zeroshot_classification_templates.json"
    templates.write_text(json.dumps({"imagenet1k": ["a photo of a {c}.", "a sketch of the {c}."],
                                     "cifar10": ["a blurry photo of a {c}."]}))
    spec = {"kind": "zeroshot", "source": "files", "classnames": str(classnames), "templates": str(templates),
            "dataset": "imagenet1k"}
    result = run_benchmark(loaded, spec, val, ["ignored {}"])
    images = [Image.open(path).convert("RGB") for synset in sorted(synsets)
              for path in sorted((val / synset).iterdir())]
    expected = zeroshot_loop(loaded, images, [0, 0, 1, 1, 2, 2], ["tench", "goldfish", "great white shark"],
                             ["a photo of a {c}.", "a sketch of the {c}."])
    assert result.metrics["top1"].value == pytest.approx(expected)
    assert result.predictions["subset"].tolist() == ["n01440764"] * 2 + ["n01443537"] * 2 + ["n01484850"] * 2
    assert benchmark_files("zeroshot", str(val), spec) == [str(classnames), str(templates)]
    # a dataset CLIP_benchmark has no templates for uses its imagenet1k templates, as CLIP_benchmark does
    names_txt = tmp_path / "names.txt"
    names_txt.write_text("tench\ngoldfish\ngreat white shark\n")
    fallback = run_benchmark(loaded, {**spec, "classnames": str(names_txt), "dataset": "my-imagenet"}, val, None)
    assert fallback.metrics["top1"].value == pytest.approx(expected)
    with pytest.raises(BenchmarkError, match=r"en_classnames\.json: no class names for dataset 'my-imagenet'"):
        run_benchmark(loaded, {**spec, "dataset": "my-imagenet"}, val, None)
    names_txt.write_text("tench\ngoldfish\n")
    with pytest.raises(BenchmarkError, match=r"names\.txt: expected 3 class names .* got 2"):
        run_benchmark(loaded, {**spec, "classnames": str(names_txt)}, val, None)
    templates.write_text(json.dumps({"imagenet1k": ["a photo of a {c} and a {}."]}))
    with pytest.raises(BenchmarkError, match="must contain exactly one"):
        run_benchmark(loaded, spec, val, None)


# --- a split shared by several benchmarks is decoded once per job (issue 42 item 3) -------------------

TEMPLATES = ["a photo of a {}."]


def _write_split(root: Path, per_class: int, seed: int) -> None:
    for c in range(3):
        for i in range(per_class):
            path = root / f"c{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            pixels = np.random.default_rng(seed + 100 * c + i).integers(0, 256, (24, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(path)


def _scores(loaded, root: Path) -> list:  # noqa: ANN001 - compo.models.LoadedModel
    names = {"c0": "cube", "c1": "sphere", "c2": "cone"}
    (root / "classnames.json").write_text(json.dumps(names))
    (root / "val" / "classnames.json").write_text(json.dumps(names))
    specs = [({"kind": "zeroshot", "source": "files"}, root / "val"),
             ({"kind": "linear_probe", "source": "files", "splits": {"test": "val"}}, root),
             ({"kind": "linear_probe", "source": "files", "splits": {"test": "val"}, "solver": "adamw",
               "epochs": 2}, root)]
    return [run_benchmark(loaded, spec, path, TEMPLATES) for spec, path in specs]


def test_a_split_read_by_three_benchmarks_is_decoded_once_per_job(tmp_path: Path, loaded, monkeypatch) -> None:
    """ImageNet's shape: zero-shot on val/, two probes on train/ + val/. Inside one job each image is decoded
    once, and the scores equal those of the unshared path."""
    torch.set_num_threads(1)
    _write_split(tmp_path / "train", 4, 0)
    _write_split(tmp_path / "val", 2, 50)
    decodes: list[Path] = []
    decode = scoring.open_image

    def counted(path: Path):  # noqa: ANN202 - the real decoder, counted
        decodes.append(path)
        return decode(path)

    monkeypatch.setattr(scoring, "open_image", counted)
    unshared = _scores(loaded, tmp_path)
    assert len(decodes) == 6 + 2 * (12 + 6)  # every benchmark decodes its own splits
    decodes.clear()
    with shared_split_features():
        shared = _scores(loaded, tmp_path)
    assert sorted(decodes) == sorted(tmp_path.glob("*/c*/*.png")) and len(decodes) == 18
    for a, b in zip(unshared, shared, strict=True):
        assert a.metrics == b.metrics
        assert a.predictions.equals(b.predictions)
