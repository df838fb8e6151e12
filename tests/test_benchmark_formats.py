"""The benchmark formats users have, scored by a tiny random model and checked against plain loops:
zero-shot and linear probe on CIFAR's python pickles (torchvision's readers), ImageNet synset folders with
CLIP_benchmark's class names and per-dataset templates, class-name text files; long-caption retrieval
on Urban1k, DOCCI, DCI (sDCI), ShareGPT4V-1k and ImageInWords; Karpathy files under their released names."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark
from compo.models import encode_images, encode_texts

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared

TIE = 1e-9


def pixels(seed: int, size: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def write_image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels(seed, 48)).save(path)


def image_vectors(loaded, images: list[Image.Image]) -> torch.Tensor:
    return encode_images(loaded, images).double()


def text_vectors(loaded, texts: list[str]) -> torch.Tensor:
    return encode_texts(loaded, texts).double()


def zeroshot_loop(loaded, images: list[Image.Image], labels: list[int], names: list[str],
                  templates: list[str]) -> float:
    """Top-1 by hand: per class the renormalised mean of its filled templates' embeddings."""
    classes = []
    for name in names:
        prompts = [t.replace("{c}", name).replace("{}", name) for t in templates]
        mean = text_vectors(loaded, prompts).mean(0)
        classes.append(mean / mean.norm())
    hits = 0
    for image, label in zip(images, labels, strict=True):
        v = image_vectors(loaded, [image])[0]
        scores = [float(v @ c) for c in classes]
        hits += all(scores[label] > s + TIE for k, s in enumerate(scores) if k != label)
    return hits / len(images)


# --- CIFAR python pickles --------------------------------------------------------------------------

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


# --- long-caption retrieval --------------------------------------------------------------------------

def r1_loop(loaded, images: list[Path], captions: list[str]) -> tuple[float, float]:
    """Image->text and text->image R@1 by hand (one caption per image, ties against the model)."""
    v = image_vectors(loaded, [Image.open(p).convert("RGB") for p in images])
    t = text_vectors(loaded, captions)
    s = v @ t.T
    n = len(images)
    i2t = np.mean([all(s[i, i] > s[i, j] + TIE for j in range(n) if j != i) for i in range(n)])
    t2i = np.mean([all(s[j, j] > s[i, j] + TIE for i in range(n) if i != j) for j in range(n)])
    return float(i2t), float(t2i)


def check_r1(result, loaded, images: list[Path], captions: list[str]) -> None:
    i2t, t2i = r1_loop(loaded, images, captions)
    assert result.headline == "r1"
    assert result.metrics["i2t_r1"].value == pytest.approx(i2t) and result.metrics["t2i_r1"].value == pytest.approx(t2i)
    assert result.metrics["r1"].value == pytest.approx((i2t + t2i) / 2)
    assert {"i2t_r5", "t2i_r10"} <= set(result.metrics)


LONG = ["A small red cube sits on wet sand next to a large blue sphere under a grey sky, waves behind.",
        "Two green cones stand on a snowy road while a striped cube rests between them in the evening.",
        "A large yellow sphere floats above calm water; a tiny purple cube is left of it near the shore.",
        "An old wooden bench beside a red door, with a striped cat asleep on the bench in the sun."]


def test_urban1k_layout_and_max_words(tmp_path: Path, loaded) -> None:
    for n, caption in enumerate(LONG, start=1):
        write_image(tmp_path / "image" / f"{n}.jpg", 40 + n)
        (tmp_path / "caption").mkdir(exist_ok=True)
        (tmp_path / "caption" / f"{n}.txt").write_text(caption + "\n")
    (tmp_path / "caption" / "10.txt").write_text("A caption whose image was never downloaded.")
    spec = {"kind": "long_retrieval", "source": "files", "format": "urban1k"}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.skipped == {"missing_image": 1}  # 10.jpg
    check_r1(result, loaded, [tmp_path / "image" / f"{n}.jpg" for n in range(1, 5)], LONG)
    assert result.predictions.loc[result.predictions["subset"] == "i2t", "item"].tolist() == ["1", "2", "3", "4"]
    short = run_benchmark(loaded, {**spec, "max_words": 5}, tmp_path)
    check_r1(short, loaded, [tmp_path / "image" / f"{n}.jpg" for n in range(1, 5)],
             [" ".join(c.split()[:5]) for c in LONG])
    assert benchmark_files("long_retrieval", str(tmp_path), spec) == [f"{tmp_path}/caption"]


def test_docci_test_split(tmp_path: Path, loaded) -> None:
    lines = [{"example_id": f"{split}_{i}", "split": split, "image_file": f"{split}_{i}.jpg", "description": text}
             for i, (split, text) in enumerate([("train", "a training image"), ("test", LONG[0]), ("test", LONG[1]),
                                                ("qual_dev", "a dev image"), ("test", LONG[2])])]
    for line in lines:
        write_image(tmp_path / "images" / line["image_file"], len(line["example_id"]) + lines.index(line))
    (tmp_path / "docci_descriptions.jsonlines").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = run_benchmark(loaded, {"kind": "long_retrieval", "source": "files", "format": "docci"}, tmp_path)
    test = [line for line in lines if line["split"] == "test"]
    check_r1(result, loaded, [tmp_path / "images" / x["image_file"] for x in test], [x["description"] for x in test])
    assert result.metrics["i2t_r1"].n == 3


def test_dci_test_split_with_sdci_summaries(tmp_path: Path, loaded) -> None:
    root = tmp_path / "densely_captioned_images"
    entries = {"sa_1": LONG[0], "sa_2": LONG[1], "sa_3": None, "sa_4": LONG[2], "sa_5": "a training summary"}
    for k, (entry, summary) in enumerate(entries.items()):
        write_image(root / "photos" / f"{entry}.jpg", 70 + k)
        data = {"image": f"{entry}.jpg", "short_caption": "short", "extra_caption": "", "mask_data": {}}
        if summary is not None:
            data["summaries"] = {"base": [summary, "another summary"]}
        (root / "complete").mkdir(parents=True, exist_ok=True)
        (root / "complete" / f"{entry}.json").write_text(json.dumps(data))
    (root / "splits.json").write_text(json.dumps({"train": ["sa_5.json"], "valid": [],
                                                  "test": ["sa_1.json", "sa_2.json", "sa_3.json", "sa_4.json"]}))
    result = run_benchmark(loaded, {"kind": "long_retrieval", "source": "files", "format": "dci"}, root)
    assert result.skipped == {"no_summary": 1}
    check_r1(result, loaded, [root / "photos" / f"sa_{n}.jpg" for n in (1, 2, 4)], [LONG[0], LONG[1], LONG[2]])


def test_sharegpt4v_1k_is_the_first_records(tmp_path: Path, loaded) -> None:
    records = [{"id": f"r{i}", "image": f"coco/{i}.jpg",
                "conversations": [{"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": text}]}
               for i, text in enumerate(LONG + ["a record after the test set"])]
    for i in range(len(records)):
        write_image(tmp_path / "coco" / f"{i}.jpg", 90 + i)
    (tmp_path / "share-captioner_coco_lcs_sam_1246k_1107.json").write_text(json.dumps(records))
    spec = {"kind": "long_retrieval", "source": "files", "format": "sharegpt4v", "holdout": 4}
    result = run_benchmark(loaded, spec, tmp_path)
    check_r1(result, loaded, [tmp_path / "coco" / f"{i}.jpg" for i in range(4)], LONG)
    assert benchmark_files("long_retrieval", str(tmp_path), spec) == [
        f"{tmp_path}/share-captioner_coco_lcs_sam_1246k_1107.json"]
    # a holdout past the file's records: the test set would be smaller than asked (it was, silently)
    with pytest.raises(BenchmarkError, match=r"1107\.json: benchmark key holdout 9: the file holds 5 record\(s\)"):
        run_benchmark(loaded, {**spec, "holdout": 9}, tmp_path)


def iiw_line(key: str, text: str, field: str = "image/key") -> str:
    """A data.jsonl line as google/imageinwords datasets/ releases it (the fields a reader must pass over too)."""
    return json.dumps({"IIW": text, "IIW-P5B": "a model's description", field: key,
                       "iiw-human-sxs-gpt4v": {"metrics/Comprehensiveness": "Neutral"},
                       "objects": [{"label": "cube", "normalized_coords": ["0", "0", "9", "9"]}]})


def test_iiw_400_and_the_union_of_human_authored_subsets(tmp_path: Path, loaded) -> None:
    keys = ["aar_test_04600", "aar_test_04601", "aar_test_04602"]
    for k, key in enumerate(keys):
        write_image(tmp_path / "docci_aar" / f"{key}.jpg", 110 + k)
    (tmp_path / "IIW-400").mkdir()
    lines = [iiw_line(key, LONG[k]) for k, key in enumerate(keys)] + ["", iiw_line(keys[1], "seen again")]
    (tmp_path / "IIW-400" / "data.jsonl").write_text("\n".join(lines) + "\n")
    spec = {"kind": "long_retrieval", "source": "files", "format": "iiw"}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.skipped == {"duplicate": 1}
    check_r1(result, loaded, [tmp_path / "docci_aar" / f"{key}.jpg" for key in keys], LONG[:3])
    assert result.predictions.loc[result.predictions["subset"] == "i2t", "item"].tolist() == keys
    assert benchmark_files("long_retrieval", str(tmp_path), spec) == [f"{tmp_path}/IIW-400/data.jsonl"]

    # DCI_Test names its image by `image` with the extension; a union is one test set over both folders
    write_image(tmp_path / "dci" / "sa_1.jpg", 120)
    (tmp_path / "DCI_Test").mkdir()
    (tmp_path / "DCI_Test" / "data.jsonl").write_text(iiw_line("sa_1.jpg", LONG[3], field="image") + "\n")
    union = {**spec, "subsets": ["IIW-400", "DCI_Test"]}
    result = run_benchmark(loaded, union, tmp_path)
    check_r1(result, loaded, [*(tmp_path / "docci_aar" / f"{key}.jpg" for key in keys), tmp_path / "dci" / "sa_1.jpg"],
             LONG)
    assert benchmark_files("long_retrieval", str(tmp_path), union) == [
        f"{tmp_path}/IIW-400/data.jsonl", f"{tmp_path}/DCI_Test/data.jsonl"]


@pytest.mark.parametrize(("line", "expected"), [
    ('{"IIW": "a text", "image/key": "aar_1"', "data.jsonl:2: not a JSON object"),
    ('{"IIW": "  ", "image/key": "aar_1"}', "data.jsonl:2: expected a non-empty 'image/key'"),
    ('{"IIW-P5B": "a text", "image/key": "aar_1"}', "data.jsonl:2: expected a non-empty 'image/key'"),
    ('["aar_1", "a text"]', "data.jsonl:2: expected a non-empty 'image/key'"),
])
def test_iiw_malformed_lines_name_file_and_line(tmp_path: Path, loaded, line: str, expected: str) -> None:
    (tmp_path / "IIW-400").mkdir()
    (tmp_path / "IIW-400" / "data.jsonl").write_text(iiw_line("aar_0", LONG[0]) + "\n" + line + "\n")
    with pytest.raises(BenchmarkError, match=f"IIW-400/{expected}"):
        run_benchmark(loaded, {"kind": "long_retrieval", "source": "files", "format": "iiw"}, tmp_path)


def test_iiw_subsets_and_missing_file_are_named(tmp_path: Path, loaded) -> None:
    spec = {"kind": "long_retrieval", "source": "files", "format": "iiw"}
    with pytest.raises(BenchmarkError, match=r"IIW-400/data.jsonl: ImageInWords IIW-400 file not found"):
        run_benchmark(loaded, spec, tmp_path)
    with pytest.raises(BenchmarkError, match="'subsets' must be a non-empty list of distinct names among IIW-400"):
        benchmark_files("long_retrieval", str(tmp_path), {**spec, "subsets": ["CM_3600"]})


def test_karpathy_files_keep_their_released_names(tmp_path: Path, loaded) -> None:
    images = []
    for i in range(3):
        write_image(tmp_path / "images" / f"{i}.jpg", 200 + i)
        images.append({"imgid": i, "filename": f"{i}.jpg", "split": "test", "sentences": [{"raw": LONG[i]}]})
    (tmp_path / "dataset_flickr30k.json").write_text(json.dumps({"images": images}))
    spec = {"kind": "retrieval", "source": "files", "file": "dataset_flickr30k.json"}
    result = run_benchmark(loaded, spec, tmp_path)
    i2t, t2i = r1_loop(loaded, [tmp_path / "images" / f"{i}.jpg" for i in range(3)], LONG[:3])
    assert result.metrics["i2t_r1"].value == pytest.approx(i2t) and result.metrics["t2i_r1"].value == pytest.approx(t2i)
    assert benchmark_files("retrieval", str(tmp_path), spec) == [f"{tmp_path}/dataset_flickr30k.json"]
    with pytest.raises(BenchmarkError, match=r"dataset\.json: Karpathy-format dataset file not found"):
        run_benchmark(loaded, {"kind": "retrieval", "source": "files"}, tmp_path)
