"""ELEVATER's class names and templates (compo.evaluate.elevater), read from a prompts.py written in the
toolkit's layout (vision_benchmark/datasets/prompts.py: `<name>_classes` / `<name>_templates` lists, `class_map` /
`template_map` keyed by ELEVATER's dataset name) with made-up classes; the file is parsed, never run. ELEVATER's
own releases (`format: elevater`, compo.evaluate.labelled: a DATASET_INFO json, iris index files or COCO jsons,
images in zips) on a made-up fixture in that layout, and its two metrics (ROC-AUC, 11-point mAP) by hand."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_helpers import image_vectors, pixels, text_vectors, write_image, zeroshot_loop
from PIL import Image

from compo.evaluate import BenchmarkError, benchmark_files, elevater, run_benchmark
from compo.evaluate.labelled import read_split
from compo.evaluate.zeroshot import class_ranks, map_n_points, roc_auc, tie_rule
from compo.images import ZipMember, open_image

PROMPTS = '''"""
A made-up prompts.py in the layout of Elevater_Toolkit_IC's vision_benchmark/datasets/prompts.py.
"""
raise SystemExit("this file must never run")

toy_classes = [
    'red blob',
    ['blue square', 'azure square'],
    'green dot',
]

toy_templates = [
    'a photo of a {}.',
    'a drawing of the {}.',
]

other_classes = ['cat', 'dog']
other_templates = ['itap of a {}.']
computed_classes = sorted(other_classes)

class_map = {
    'toy-3': toy_classes,
    'other': other_classes,
    'computed': computed_classes,
}

template_map = {
    'toy-3': toy_templates,
    'other': other_templates,
}
'''


def test_elevater_prompts_file_names_classes_and_templates(tmp_path: Path, loaded) -> None:
    prompts = tmp_path / "prompts.py"
    prompts.write_text(PROMPTS)
    assert elevater.class_names(prompts, "toy-3") == ["red blob", "blue square", "green dot"]  # first synonym
    assert elevater.templates(prompts, "toy-3") == ["a photo of a {}.", "a drawing of the {}."]
    root = tmp_path / "toy"
    folders = ["a_red", "b_blue", "c_green"]
    for k, folder in enumerate(folders):
        for i in range(2):
            write_image(root / folder / f"{i}.png", 10 * k + i)
    spec = {"kind": "zeroshot", "source": "files", "classnames": str(prompts), "templates": str(prompts),
            "dataset": "toy-3"}
    result = run_benchmark(loaded, spec, root, ["ignored {}"])
    images = [Image.open(root / folder / f"{i}.png").convert("RGB") for folder in folders for i in range(2)]
    expected = zeroshot_loop(loaded, images, [0, 0, 1, 1, 2, 2], ["red blob", "blue square", "green dot"],
                             ["a photo of a {}.", "a drawing of the {}."])
    assert result.metrics["top1"].value == pytest.approx(expected)
    assert benchmark_files("zeroshot", str(root), spec) == [str(prompts)]  # a rule input, once
    # two classes in the toolkit, three folders: the count is checked
    with pytest.raises(BenchmarkError, match=r"prompts\.py: expected 3 class names .* got 2"):
        run_benchmark(loaded, {**spec, "dataset": "other"}, root, None)


def test_elevater_prompts_file_errors(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.py"
    prompts.write_text(PROMPTS)
    with pytest.raises(BenchmarkError, match=r"class_map has no dataset 'cifar-10' \(has computed, other, toy-3\)"):
        elevater.class_names(prompts, "cifar-10")
    with pytest.raises(BenchmarkError, match="needs the benchmark key 'dataset'"):
        elevater.templates(prompts, None)
    with pytest.raises(BenchmarkError, match=r"class_map\['computed'\]: expected a list literal"):
        elevater.class_names(prompts, "computed")
    with pytest.raises(BenchmarkError, match="template_map has no dataset 'computed'"):
        elevater.templates(prompts, "computed")
    prompts.write_text("class_map = {'toy': missing_classes}\n")
    with pytest.raises(BenchmarkError, match="'missing_classes' is not assigned at the module's top level"):
        elevater.class_names(prompts, "toy")
    prompts.write_text("classes = ['a']\n")
    with pytest.raises(BenchmarkError, match="expected a module-level dict 'template_map'"):
        elevater.templates(prompts, "toy")
    with pytest.raises(BenchmarkError, match="ELEVATER prompts file not found"):
        elevater.templates(tmp_path / "absent.py", "toy")


# --- ELEVATER's metrics, by hand ---------------------------------------------------------------------------------

def test_roc_auc_by_hand_a_tie_counts_half() -> None:
    # positives 0.9, 0.4, 0.6 against negatives 0.5, 0.4, 0.1: 3 + (1 + 1/2) + 3 of 9 pairs
    positive = np.array([True, True, True, False, False, False])
    assert roc_auc(positive, np.array([0.9, 0.4, 0.6, 0.5, 0.4, 0.1])) == pytest.approx(7.5 / 9)
    assert roc_auc(positive, np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])) == 0.0
    with pytest.raises(BenchmarkError, match="roc_auc needs positives and negatives, got 2 and 0"):
        roc_auc(np.array([True, True]), np.array([0.1, 0.2]))


def test_elevater_sets_score_a_tie_as_elevaters_argsort_the_others_against_the_model() -> None:
    # three images, classes 0..2; image 0's true class 1 ties class 0 (first wins: class 0, so rank 2 either way),
    # image 1's true class 0 ties class 2 (first wins: rank 1; pessimistic: rank 2), image 2 has no tie
    scores = torch.tensor([[0.5, 0.5, 0.1], [0.7, 0.2, 0.7], [0.1, 0.3, 0.9]], dtype=torch.float64)
    labels = torch.tensor([1, 0, 2])
    true = scores.gather(1, labels[:, None]).squeeze(1)
    wrong = torch.ones_like(scores, dtype=torch.bool).scatter_(1, labels[:, None], False)
    elevater_spec = {"kind": "zeroshot", "format": "elevater"}
    assert tie_rule(elevater_spec) == "first" and tie_rule({"kind": "zeroshot"}) == "pessimistic"
    assert class_ranks(elevater_spec, scores, labels, true, wrong).tolist() == [2, 1, 1]
    assert class_ranks({**elevater_spec, "ties": "pessimistic"}, scores, labels, true, wrong).tolist() == [2, 2, 1]
    assert class_ranks({"kind": "zeroshot"}, scores, labels, true, wrong).tolist() == [2, 2, 1]
    # numpy's argsort, which ELEVATER's TopKAccuracyEvaluator reads, on these rows: the same top-1 as "first"
    top1 = np.argsort(-scores.numpy(), axis=1)[:, 0]
    assert (top1 == labels.numpy()).tolist() == [False, True, True]
    with pytest.raises(BenchmarkError, match="benchmark key 'ties': 'last'"):
        tie_rule({"kind": "zeroshot", "ties": "last"})


def test_map_11_points_by_hand_with_elevaters_end_point() -> None:
    # class 0: ranked T F T F F: precision 1 at recall 1/2, 2/3 at recall 1, so levels 1.0..0.6 give 2/3 and
    # 0.5..0.0 give 1: (5 x 2/3 + 6) / 11 = 28/33. class 1: its positive ties a negative at the top: precision
    # 1/2 at recall 1 for levels 1.0..0.1, and 1 at level 0 (the curve's end point): 6/11. class 2: no positive,
    # left out. The VOC devkit (no end point) would give 1/2 for class 1.
    targets = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=bool)
    scores = np.array([[0.9, 0.5, 0.1], [0.8, 0.5, 0.2], [0.7, 0.1, 0.3], [0.6, 0.0, 0.4], [0.5, 0.0, 0.5]])
    assert map_n_points(targets[:, :1], scores[:, :1]) == pytest.approx(28 / 33)
    assert map_n_points(targets[:, 1:2], scores[:, 1:2]) == pytest.approx(6 / 11)
    assert map_n_points(targets, scores) == pytest.approx((28 / 33 + 6 / 11) / 2)
    with pytest.raises(BenchmarkError, match="no image has a label"):
        map_n_points(targets[:, 2:], scores[:, 2:])


# --- ELEVATER's releases (vision-datasets' layout) -----------------------------------------------------------------

ELEVATER_PROMPTS = """
memes_classes = ['meme', 'hatespeech meme']
voc_classes = ['aeroplane', 'bicycle', 'bird']
toy_classes = ['zebra', 'apple', 'moon']
class_map = {'toy-memes': memes_classes, 'toy-voc': voc_classes, 'toy-iris': toy_classes}
template_map = {'toy-memes': ['a meme, which is {}.'], 'toy-voc': ['a photo of a {}.'], 'toy-iris': ['a {}.']}
"""


def _png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels(seed, 48)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_elevater(root: Path) -> Path:
    """Three made-up releases in ELEVATER's layout under `root` and their DATASET_INFO list (returned): an iris
    multiclass set (labelmap NOT in sorted order, images in a stored and a deflated zip and one plain file, one
    member the zip lacks), a COCO two-class set (Hateful Memes' layout), an iris multi-label set (VOC's)."""
    iris = root / "classification" / "toy_20211007"
    iris.mkdir(parents=True)
    (iris / "labels.txt").write_text("zebra\napple\nmoon\n")
    with zipfile.ZipFile(iris / "test.zip", "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("test/0 a.png", _png(0))
        archive.writestr("test/1.png", _png(1))
    with zipfile.ZipFile(iris / "more.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("2.png", _png(2))
    write_image(iris / "plain" / "3.png", 3)
    (iris / "test.txt").write_text("test.zip@test/0 a.png 2\ntest.zip@test/1.png 0\nmore.zip@2.png 1\n"
                                   "plain/3.png 2\ntest.zip@absent.png 1\n")
    memes = root / "classification" / "hateful_memes_20211014"
    memes.mkdir(parents=True)
    with zipfile.ZipFile(memes / "img.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for k in range(6):
            archive.writestr(f"img/{k}.png", _png(10 + k))
    coco = {"images": [{"id": k + 1, "file_name": f"img/{k}.png", "zip_file": "img.zip"} for k in range(6)],
            "annotations": [{"id": k + 1, "image_id": k + 1, "category_id": [2, 1, 2, 1, 1, 2][k]} for k in range(6)],
            "categories": [{"id": 2, "name": "hateful"}, {"id": 1, "name": "not hateful"}]}
    (memes / "test_meta.json").write_text(json.dumps(coco))
    voc = root / "classification" / "voc2007_20211007"
    voc.mkdir(parents=True)
    with zipfile.ZipFile(voc / "test.zip", "w") as archive:
        for k in range(5):
            archive.writestr(f"{k}.jpg", _png(20 + k))
    (voc / "labels.txt").write_text("aeroplane\nbicycle\nbird\n")
    (voc / "test_ic.txt").write_text("test.zip@0.jpg 0,2\ntest.zip@1.jpg 1\ntest.zip@2.jpg 2\n"
                                     "test.zip@3.jpg 0\ntest.zip@4.jpg 1,2\n")
    info = [
        {"name": "toy-iris", "version": 1, "type": "classification_multiclass",
         "root_folder": iris.relative_to(root).as_posix(),
         "labelmap": "labels.txt", "test": {"index_path": "test.txt", "files_for_local_usage": ["test.zip"]}},
        {"name": "toy-memes", "version": 1, "type": "classification_multiclass", "format": "coco",
         "root_folder": memes.relative_to(root).as_posix(),
         "test": {"index_path": "test_meta.json", "files_for_local_usage": ["img.zip"]}},
        {"name": "toy-voc", "version": 1, "type": "classification_multilabel",
         "root_folder": voc.relative_to(root).as_posix(),
         "labelmap": "labels.txt", "test": {"index_path": "test_ic.txt", "files_for_local_usage": ["test.zip"]}},
    ]
    path = root / "vision_datasets.json"
    path.write_text(json.dumps(info))
    return path


def test_elevater_release_gives_its_own_label_ids_and_zip_images(tmp_path: Path) -> None:
    info = write_elevater(tmp_path)
    spec = {"kind": "zeroshot", "source": "files", "format": "elevater", "dataset_info": str(info),
            "dataset": "toy-iris"}
    raw = read_split(spec, tmp_path, "test")
    assert raw.class_ids == raw.own_names == ["zebra", "apple", "moon"]  # the labelmap's order, not sorted
    assert raw.labels == [2, 0, 1, 2, 1] and raw.items[0] == "test.zip@test/0 a.png"
    for image, seed in zip(raw.images[:4], range(4), strict=True):  # stored zip, deflated zip, plain file
        assert np.array_equal(np.asarray(open_image(image)), pixels(seed, 48))
    assert isinstance(raw.images[2], ZipMember) and open_image(raw.images[4]) == "missing_image"
    memes = read_split({**spec, "dataset": "toy-memes"}, tmp_path, "test")
    assert memes.class_ids == ["not hateful", "hateful"]  # categories by id (listed the other way): id 1 is label 0
    assert memes.labels == [1, 0, 1, 0, 0, 1] and memes.items == ["1", "2", "3", "4", "5", "6"]
    voc = read_split({**spec, "dataset": "toy-voc"}, tmp_path, "test")
    assert voc.labels == [] and voc.targets.astype(int).tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 1], [1, 0, 0],
                                                                     [0, 1, 1]]
    assert benchmark_files("zeroshot", str(tmp_path), spec) == [str(info)]


def test_elevater_release_errors_name_the_file(tmp_path: Path) -> None:
    info = write_elevater(tmp_path)
    spec = {"kind": "zeroshot", "source": "files", "format": "elevater", "dataset_info": str(info),
            "dataset": "toy-iris"}
    with pytest.raises(BenchmarkError, match=r"vision_datasets\.json: no dataset 'cifar-100' \(has toy-iris"):
        read_split({**spec, "dataset": "cifar-100"}, tmp_path, "test")
    with pytest.raises(BenchmarkError, match="needs the benchmark keys 'dataset_info'"):
        read_split({**spec, "dataset_info": None}, tmp_path, "test")
    index = tmp_path / "classification" / "toy_20211007" / "test.txt"
    index.write_text("test.zip@test/1.png 2,1\ntest.zip@test/0 a.png\n")
    with pytest.raises(BenchmarkError, match=r"test\.txt: line 2: expected '<image> <label>"):  # multiclass: no label
        read_split(spec, tmp_path, "test")
    index.write_text("test.zip@test/1.png 2,1\n")  # two labels: the first, as ELEVATER's multiclass_to_int
    assert read_split(spec, tmp_path, "test").labels == [2]
    index.write_text("test.zip@test/1.png 3\n")
    with pytest.raises(BenchmarkError, match=r"test\.txt: line 1: label outside 0\.\.2"):
        read_split(spec, tmp_path, "test")
    index.write_text("gone.zip@test/1.png 0\n")
    with pytest.raises(BenchmarkError, match=r"gone\.zip: zip archive .*test\.txt names is missing"):
        read_split(spec, tmp_path, "test")
    index.write_text("test.zip@test/1.png zebra\n")
    with pytest.raises(BenchmarkError, match=r"test\.txt: line 1: expected '<image> <label>"):
        read_split(spec, tmp_path, "test")


@pytest.mark.slow  # two zero-shot runs and their hand recomputation: ~7 s on a shared CPU
def test_elevater_zero_shot_scores_roc_auc_and_11_point_map(tmp_path: Path, loaded) -> None:
    info = write_elevater(tmp_path)
    prompts = tmp_path / "prompts.py"
    prompts.write_text(ELEVATER_PROMPTS)
    spec = {"kind": "zeroshot", "source": "files", "format": "elevater", "dataset_info": str(info),
            "dataset": "toy-memes", "classnames": str(prompts), "templates": str(prompts), "headline": "roc_auc"}

    def probabilities(seeds: list[int], names: list[str], template: str) -> np.ndarray:
        images = image_vectors(loaded, [Image.fromarray(pixels(seed, 48)) for seed in seeds])
        classes = text_vectors(loaded, [template.format(name) for name in names])  # one template: its embedding
        return torch.softmax(100 * images @ classes.T, dim=1).numpy()  # ELEVATER's fixed scale

    result = run_benchmark(loaded, spec, tmp_path, None)
    memes = probabilities(list(range(10, 16)), ["meme", "hatespeech meme"], "a meme, which is {}.")
    hateful = [1, 0, 1, 0, 0, 1]
    pairs = [(p, n) for p in range(6) for n in range(6) if hateful[p] and not hateful[n]]
    by_hand = sum(1.0 if memes[p, 1] > memes[n, 1] else 0.5 if memes[p, 1] == memes[n, 1] else 0.0
                  for p, n in pairs) / len(pairs)
    assert result.headline == "roc_auc" and result.metrics["roc_auc"].value == pytest.approx(by_hand)
    assert result.metrics["roc_auc"].n == 6 and "top1" in result.metrics

    voc = run_benchmark(loaded, {**spec, "dataset": "toy-voc", "headline": None}, tmp_path, None)
    targets = np.array([[1, 0, 1], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 1, 1]], dtype=bool)
    expected = map_n_points(targets, probabilities(list(range(20, 25)), ["aeroplane", "bicycle", "bird"],
                                                   "a photo of a {}."))
    assert voc.headline == "map_11point" and voc.metrics["map_11point"].value == pytest.approx(expected)
    assert set(voc.metrics) == {"map", "top1", "map_11point"}


def test_paper_configures_the_21_elevater_tasks_on_its_releases_and_fsc_zs_names_their_metrics(repo: Path) -> None:
    """paper.yaml's 21 elevater_* read ELEVATER's own releases at a dataset its DATASET_INFO lists (the plan knows
    each test split's size), and `fsc-zs` names each one with the metric its headline reports."""
    from compo.config import load_config
    from compo.evaluate.zeroshot import ELEVATER_TEST
    from compo.plan import benchmark_size

    config = load_config(repo / "config" / "paper.yaml")
    tasks = {name: spec for name, spec in config["benchmarks"].items() if name.startswith("elevater_")}
    assert len(tasks) == 21 and {spec["dataset"] for spec in tasks.values()} == set(ELEVATER_TEST)
    assert all(spec["format"] == "elevater" and benchmark_size(spec) == (ELEVATER_TEST[spec["dataset"]], 0, 0)
               for spec in tasks.values())
    members = dict(member.split("/") for member in config["composites"]["fsc-zs"])
    assert members == {name: spec.get("headline") or "top1" for name, spec in tasks.items()}
