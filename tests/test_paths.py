"""Hostile and broken inputs, fourth round (issue 43, items 1, 3 and 7): one test per case, each reading the
message.

1 nothing is read from outside its root (links followed): prefetch --from, manifest entries, images, DCI splits
3 duplicates and text that is not text are named (an error where the meaning breaks, a count where harmless)
7 the unclear cases end in one line naming the file, the item or key, and what was expected
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from compo.artifacts import CACHE_ENV, MANIFEST, ArtifactMissing, resolve
from compo.data import build_manifest
from compo.images import OutsideRoot, item_path
from compo.io import read_table
from compo.paths import OutsideRootError, contained, has_visible_text, repeated

REPO = Path(__file__).resolve().parents[1]
RAW = REPO / "tests" / "fixtures" / "raw"
COCO = RAW / "coco"
DCI = RAW / "dci" / "densely_captioned_images"


def _build(tmp_path: Path, spec: dict, name: str = "ds") -> tuple[pd.DataFrame, dict]:
    out, report = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
    build_manifest(name, spec, out=out, report=report)
    return read_table(out, "manifest"), pd.read_csv(report).iloc[0].to_dict()


def _coco_spec(root: Path, **spec) -> dict:
    return {"source": "coco", "path": str(root / "dataset_coco.json"), "image_root": str(root),
            "split": "train+restval+val+test", **spec}


# --- 1. one containment rule, links followed ---------------------------------------------------------------


def test_1_the_rule_follows_links_and_keeps_the_joined_form(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "images"
    shared.mkdir(parents=True)
    (shared / "a.jpg").write_bytes(b"x")
    (tmp_path / "outside.jpg").write_bytes(b"x")
    root = tmp_path / "bench" / "images"
    root.parent.mkdir()
    root.symlink_to(shared)  # a root that is a link to shared storage is fine
    (shared / "escape.jpg").symlink_to(tmp_path / "outside.jpg")  # a link inside it pointing out is not
    assert contained(root, "a.jpg", source="f", entry="e") == root / "a.jpg"  # joined, not resolved
    assert item_path(root, "sub/../a.jpg") == root / "sub/../a.jpg"
    for parts in (("escape.jpg",), ("../../outside.jpg",), (str(tmp_path / "outside.jpg"),)):
        assert isinstance(item_path(root, *parts), OutsideRoot), parts
    with pytest.raises(OutsideRootError, match=rf"^list.json: item 7: path 'escape.jpg' resolves to "
                                               rf"{tmp_path / 'outside.jpg'}, outside {root}; refused"):
        contained(root, "escape.jpg", source="list.json", entry="item 7")


def test_1_prefetch_from_refuses_a_model_name_leaving_the_folder(tmp_path: Path) -> None:
    """`org/../../outside/x` once copied files from outside --from into a folder outside the model cache
    and recorded that path in the manifest."""
    from compo.prefetch import prefetch

    source = tmp_path / "shared-models"
    (source / "org").mkdir(parents=True)
    victim = tmp_path / "outside" / "x"
    victim.mkdir(parents=True)
    (victim / "config.json").write_text("{}")  # a file the llm patterns would copy
    name = "org/../../outside/x"
    config = {"negatives": {"llm": {"generator": "degla-llm", "backend": "transformers", "model": name}}}
    cache = tmp_path / "cache"
    with pytest.raises(OutsideRootError, match=rf"^--from {source}: llm:{name}: path '{name}' resolves to "
                                               rf"{victim}, outside {source}"):
        prefetch(config, cache, source_dir=source, log=lambda line: None)
    assert not (cache / MANIFEST).exists() and not (tmp_path / "x").exists()

    (source / "org" / "m").mkdir()  # a file linked in from outside is refused too
    (source / "org" / "m" / "config.json").symlink_to(victim / "config.json")
    config["negatives"]["llm"]["model"] = "org/m"
    with pytest.raises(OutsideRootError, match=rf"llm:org/m: path 'config.json' resolves to {victim}"):
        prefetch(config, cache, source_dir=source, log=lambda line: None)


@pytest.mark.parametrize("how", ["dotdot", "link"])
def test_1_a_manifest_entry_outside_the_cache_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         how: str) -> None:
    """A manifest entry `../outside/weights.pt` was followed: a base's weights read from outside the cache."""
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.pt").write_bytes(b"not the cache's")
    cache.mkdir()
    path = "../outside/weights.pt"
    if how == "link":
        (cache / "weights.pt").symlink_to(outside / "weights.pt")
        path = "weights.pt"
    entry = {"kind": "llm", "source": "org/m", "path": path, "files": {}, "bytes": 0}
    (cache / MANIFEST).write_text(json.dumps({"artifacts": {"llm:org/m": entry}}))
    monkeypatch.setenv(CACHE_ENV, str(cache))
    with pytest.raises(OutsideRootError, match=rf"^{cache / MANIFEST}: artifact 'llm:org/m': path '{path}' "
                                               rf"resolves to {outside / 'weights.pt'}, outside {cache}"):
        resolve("llm", "org/m")


def test_1_an_image_linked_from_outside_the_image_root_is_skipped_with_a_count(tmp_path: Path, caplog) -> None:
    """A symbolic link inside image_root to an image outside it was decoded and kept as training data."""
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    train = [i for i in json.loads((root / "dataset_coco.json").read_text())["images"] if i["split"] == "train"]
    before = int(_build(tmp_path, _coco_spec(root), "before")[1]["images_kept"])
    listed = root / train[0]["filepath"] / train[0]["filename"]
    outside = tmp_path / "elsewhere.jpg"
    shutil.move(listed, outside)
    listed.symlink_to(outside)
    with caplog.at_level("WARNING", logger="compo.data"):
        frame, report = _build(tmp_path, _coco_spec(root), "after")
    assert report["images_outside_root"] == 1 and report["images_kept"] == before - 1
    assert str(listed) not in set(frame["image_path"])
    assert "1 images_outside_root, e.g." in caplog.text


def test_1_a_dci_split_entry_outside_the_dataset_folder_is_refused(tmp_path: Path) -> None:
    """A splits.json entry `../../outside.json` was read from outside the folder; its summary became a caption."""
    dci = tmp_path / "data" / "densely_captioned_images"
    shutil.copytree(DCI, dci)
    shutil.copy(dci / "complete" / "sa_1.json", tmp_path / "data" / "outside.json")
    splits = json.loads((dci / "splits.json").read_text())
    splits["train"].append("../../outside.json")
    (dci / "splits.json").write_text(json.dumps(splits))
    with pytest.raises(OutsideRootError, match=rf"^{dci / 'splits.json'}: split 'train' entry: path "
                                               rf"'../../outside.json' resolves to .*outside {dci / 'complete'}"):
        _build(tmp_path, {"source": "dci", "path": str(dci), "split": "train"})


# --- 3. the shared checks ----------------------------------------------------------------------------------


def test_3_the_shared_checks() -> None:
    assert repeated(["a", "b", "a", "c", "a", "b"]) == {"a": 3, "b": 2}
    assert repeated([1, 2, 3]) == {}
    for text in ("a red cube", "7", "日本", "\u200ba"):
        assert has_visible_text(text), text
    for text in ("", " ", "\u200b\u200c\u200d", "\u202e\u2066", "\ufeff", "\x00\x00", "...", "\u00a0\t"):
        assert not has_visible_text(text), repr(text)


def test_3_letters_that_render_as_nothing_are_no_text() -> None:
    """Issue 59: U+3164 (HANGUL FILLER, a letter: category Lo) passed as text. The letters Unicode marks
    Default_Ignorable_Code_Point are exactly compo.paths.INVISIBLE_LETTERS (checked against the `regex`
    module's property table), and a caption of them, or of the braille blank, holds no text."""
    import sys
    import unicodedata

    from compo.paths import INVISIBLE_LETTERS

    regex = pytest.importorskip("regex")
    ignorable = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    letters = {chr(c) for c in range(sys.maxunicode + 1)
               if ignorable.match(chr(c)) and unicodedata.category(chr(c))[0] in "LN"}
    assert letters == INVISIBLE_LETTERS
    for text in ("\u3164", "\u115f\u1160", "\uffa0 \u3164\u200b", "\u2800\u2800", "\u3164."):
        assert not has_visible_text(text), repr(text)
    for text in ("\u3164a", "a\u2800b", "\u1100"):  # a visible letter beside them; a Hangul jamo that renders
        assert has_visible_text(text), repr(text)


# --- 3. duplicates: an error where the meaning breaks, a count where harmless ------------------------------


def _official_coco(tmp_path: Path, mutate) -> Path:
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    path = root / "annotations" / "captions_train2014.json"
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    return path


def test_3_a_coco_images_id_given_twice_is_an_error(tmp_path: Path) -> None:
    """The caption was paired with the second file given under the id."""
    path = _official_coco(tmp_path, lambda d: d["images"].append({**d["images"][0], "file_name": "other.jpg"}))
    with pytest.raises(ValueError, match=r"captions_train2014\.json: images\[3\]: image id 9 already given at "
                                         r"images\[0\]; expected each image once"):
        _build(tmp_path, {"source": "coco", "path": str(path)})


def test_3_a_repeated_annotation_or_shard_is_read_once_with_a_count(tmp_path: Path, caplog) -> None:
    """A repeated COCO annotation record or a file listed twice doubled the captions."""
    clean = _official_coco(tmp_path / "a", lambda d: None)
    _, before = _build(tmp_path, {"source": "coco", "path": str(clean)}, "before")
    path = _official_coco(tmp_path / "b", lambda d: d["annotations"].append(dict(d["annotations"][0])))
    with caplog.at_level("WARNING", logger="compo.data"):
        frame, report = _build(tmp_path, {"source": "coco", "path": [str(path), str(path)]}, "after")
    assert report["records_repeated"] == 1 and report["files_repeated"] == 1
    assert report["captions_kept"] == before["captions_kept"] == len(frame)
    assert "1 records_repeated, e.g. 9 (annotations[5]" in caplog.text and "1 files_repeated, e.g." in caplog.text
    path = _official_coco(tmp_path / "c", lambda d: d["annotations"].append({**d["annotations"][0], "caption": "x"}))
    with pytest.raises(ValueError, match=r"annotations\[5\]: annotation id 101 already given at annotations\[0\] "
                                         "with other content"):
        _build(tmp_path, {"source": "coco", "path": str(path)}, "other")


def test_3_a_repeated_docci_example_id_is_an_error(tmp_path: Path) -> None:
    """Two images under one example_id were merged."""
    docci = tmp_path / "docci"
    shutil.copytree(RAW / "docci", docci)
    path = docci / "docci_descriptions.jsonlines"
    lines = path.read_text().splitlines()
    second = json.loads(lines[1])
    lines.append(json.dumps({**second, "example_id": json.loads(lines[0])["example_id"]}))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"docci_descriptions\.jsonlines: line {len(lines)} \(example_id train_00001"
                                         r"\): image id 'train_00001' already appeared at line 1 .*expected each "
                                         "image once"):
        _build(tmp_path, {"source": "docci", "path": str(path), "split": "train+test+qual_dev+qual_test"})


def test_3_captions_without_visible_text_are_skipped_with_a_count(tmp_path: Path, caplog) -> None:
    """Captions of zero-width, direction or BOM characters, or NUL bytes, were kept for training."""
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    karpathy = json.loads((root / "dataset_coco.json").read_text())
    first = karpathy["images"][0]["sentences"]
    _, before = _build(tmp_path, _coco_spec(root), "before")
    first += [{"raw": "\u200b\u200d"}, {"raw": "\u202e\ufeff"}, {"raw": "\x00\x00"}]
    (root / "dataset_coco.json").write_text(json.dumps(karpathy))
    with caplog.at_level("WARNING", logger="compo.data"):
        _, report = _build(tmp_path, _coco_spec(root), "after")
    assert report["captions_no_text"] == 3 and report["captions_kept"] == before["captions_kept"]
    assert "3 captions_no_text, e.g." in caplog.text


@pytest.mark.parametrize(("column", "values", "expected"), [
    ("caption", [101, 102], "column 'caption' holds int 101"),
    ("caption", [{"text": "a"}, {"text": "b"}], "column 'caption' holds dict"),
    ("image_path", [7, 8], "column 'image_path' holds int 7"),
])
def test_3_a_table_cell_that_is_not_a_string_names_the_column_and_type(tmp_path: Path, column: str, values: list,
                                                                       expected: str) -> None:
    """A parquet caption column of integers or structs was read as '101' or a Python repr; an integer image
    column was reported only as missing files."""
    table = {"caption": ["a red cube", "a blue ball"], "image_path": ["1.jpg", "2.jpg"]}
    table[column] = values
    path = tmp_path / "table.parquet"
    pd.DataFrame(table).to_parquet(path)
    with pytest.raises(ValueError, match=rf"table\.parquet: row 1: {expected}.*; expected a string"):
        _build(tmp_path, {"source": "cc3m", "path": str(path)})


def _write_image(path: Path, seed: int) -> None:
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)


def test_3_a_sugarcrepe_id_given_twice_is_an_error(tmp_path: Path) -> None:
    """json kept the last of a repeated key: an item was dropped unseen."""
    from compo.evaluate.files import BenchmarkError
    from compo.evaluate.sugarcrepe import load_subset

    path = tmp_path / "add_obj.json"
    item = '{"filename": "1.jpg", "caption": "a red cube", "negative_caption": "a blue cube"}'
    path.write_text(f'{{"0": {item}, "1": {item}, "0": {item}}}')
    with pytest.raises(BenchmarkError, match=r"add_obj\.json: key\(s\) '0' given more than once in one object"):
        load_subset(path)


def test_3_retrieval_refuses_one_file_under_two_ids_and_captions_without_text(tmp_path: Path) -> None:
    """One image file under two ids made exact ties counted against the model; empty raw captions were scored."""
    from compo.evaluate import retrieval
    from compo.evaluate.files import BenchmarkError

    images = [{"imgid": i, "filename": f"{i}.png", "split": "test", "sentences": [{"raw": f"image {i}"}]}
              for i in range(3)]
    images.append({**images[0], "imgid": 3})
    (tmp_path / "dataset.json").write_text(json.dumps({"images": images}))
    spec = {"kind": "retrieval", "source": "world"}
    with pytest.raises(BenchmarkError, match=r"dataset\.json: 1 image file\(s\) \(under different image ids\) given "
                                             r"more than once: .*images/0\.png \(2x\)"):
        retrieval.score(None, retrieval.karpathy_images(spec, tmp_path), tmp_path / "dataset.json")
    for raw in ("", "\u200b\u200b", 101):
        images[3] = {**images[1], "imgid": 3, "filename": "3.png", "sentences": [{"raw": raw}]}
        (tmp_path / "dataset.json").write_text(json.dumps({"images": images}))
        with pytest.raises(BenchmarkError, match=r"dataset\.json: image 3: sentences\[0\]: field 'raw' must be a "
                                                 "caption with a visible letter or digit"):
            retrieval.karpathy_images(spec, tmp_path)


def test_3_a_winoground_caption_of_invisible_characters_is_refused(tmp_path: Path) -> None:
    from compo.evaluate.files import BenchmarkError
    from compo.evaluate.winoground import load_examples

    example = {"id": 0, "image_0": "ex_0_img_0", "image_1": "ex_0_img_1", "caption_0": "a cube on a ball",
               "caption_1": "\ufeff\u2066\u2069", "tag": "Object", "collapsed_tag": "Object", "num_main_preds": 1}
    (tmp_path / "examples.jsonl").write_text(json.dumps(example) + "\n")
    with pytest.raises(BenchmarkError, match=r"examples\.jsonl: line 1 \(example 0\): field 'caption_1' must be a "
                                             "caption with a visible letter or digit"):
        load_examples(tmp_path / "examples.jsonl")


def test_3_identical_zero_shot_class_names_are_an_error(tmp_path: Path, caplog) -> None:
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


# --- the linear probe's classes (items 3 and 7) ------------------------------------------------------------


def _probe_folder(root: Path, train: dict[str, int], test: dict[str, int]) -> None:
    root.mkdir()
    (root / "classnames.json").write_text(json.dumps(list(train)))
    for split, classes in (("train", train), ("test", test)):
        for c, (name, n) in enumerate(classes.items()):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                _write_image(root / split / name / f"{i}.png", 100 * c + i)


def test_3_7_probe_classes_are_named_when_they_differ_or_have_no_training_image(tmp_path: Path, loaded) -> None:
    """'train and test have different classes (2 vs 2)' named no file or class; a class folder without a
    training image was fitted without it."""
    from compo.evaluate import run_benchmark
    from compo.evaluate.files import BenchmarkError

    spec = {"kind": "linear_probe", "source": "files"}
    _probe_folder(tmp_path / "a", {"cat": 2, "dog": 2}, {"cat": 1, "eel": 1})
    with pytest.raises(BenchmarkError, match=rf"^{tmp_path / 'a'} \(format imagefolder\): train and test have "
                                             r"different classes \(2 vs 2; only in train: dog; only in test: eel\)"):
        run_benchmark(loaded, spec, tmp_path / "a")
    _probe_folder(tmp_path / "b", {"cat": 2, "dog": 2, "eel": 0}, {"cat": 1, "dog": 1, "eel": 1})
    with pytest.raises(BenchmarkError, match=r"1 class\(es\) without a readable training image: eel"):
        run_benchmark(loaded, spec, tmp_path / "b")


# --- 7. unclear cases end in one line naming the file, item or key ----------------------------------------


def test_7_an_image_past_pils_pixel_limit_is_counted_and_named_as_such(tmp_path: Path, write_manifest, loaded,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """PIL's DecompressionBombError was counted as a corrupt image (or raised naming no item): the dataset stage
    counts it in its own column and evaluation skips it with its own reason, each naming the file."""
    from PIL import Image

    from compo.evaluate.scoring import encode_image_files
    from compo.images import OVERSIZED_IMAGE

    rows = []
    for i, side in enumerate((16, 2000, 16)):
        Image.new("RGB", (side, side), "red").save(tmp_path / f"{i}.png")
        rows.append({"image_id": f"w{i}", "image_path": str(tmp_path / f"{i}.png"), "caption_id": f"w{i}-s0",
                     "caption": "a red square", "dataset": "finetune", "caption_kind": "short"})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)  # 2,000 x 2,000 pixels is past twice the limit
    world = write_manifest(rows, tmp_path / "world.parquet")
    build_manifest("coco", {"source": "world", "split": "finetune"}, out=tmp_path / "m.parquet",
                   world_manifest=world, report=tmp_path / "r.csv")
    assert read_table(tmp_path / "m.parquet", "manifest")["image_id"].tolist() == ["w0", "w2"]
    report = pd.read_csv(tmp_path / "r.csv").iloc[0]
    assert report["images_oversized"] == 1 and report["images_corrupt"] == 0
    _, rows_of, failed = encode_image_files(loaded, [tmp_path / "0.png", tmp_path / "1.png"])
    assert list(rows_of) == [tmp_path / "0.png"] and failed == {tmp_path / "1.png": OVERSIZED_IMAGE}


def test_7_a_manifest_without_artifacts_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`KeyError: 'artifacts'` from a manifest of another shape."""
    (tmp_path / MANIFEST).write_text(json.dumps({"llm:org/m": {"path": "x"}}))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(ArtifactMissing, match=rf"^{tmp_path / MANIFEST}: expected a prefetch manifest .*no key "
                                              "artifacts; run compo prefetch"):
        resolve("llm", "org/m")
    (tmp_path / MANIFEST).write_text(json.dumps({"artifacts": {"llm:org/m": {"bytes": 3}}}))
    with pytest.raises(ArtifactMissing, match=r"artifact 'llm:org/m': expected an entry with a 'path'"):
        resolve("llm", "org/m")


def test_7_compo_evaluate_names_a_benchmark_entry_without_spec(tmp_path: Path, capsys) -> None:
    """`KeyError: 'spec'` from compo evaluate."""
    from compo.cli import main

    with pytest.raises(SystemExit):
        main(["evaluate", "--model-dir", str(tmp_path), "--model-id", "m/d/seed0", "--out-dir", str(tmp_path),
              "--benchmarks", json.dumps({"sugarcrepe": {"dir": "benchmarks/sugarcrepe"}})])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--benchmarks: entry 'sugarcrepe' should be {\"spec\": {...}, \"dir\"" in err[0], err
    with pytest.raises(SystemExit):
        main(["evaluate", "--model-dir", str(tmp_path), "--model-id", "m/d/seed0", "--out-dir", str(tmp_path),
              "--benchmarks", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--benchmarks: expected a JSON object {name: " in err[0] and err[0].endswith("got 5"), err


def test_7_weights_holding_code_are_named_without_torchs_advice(tmp_path) -> None:
    """A base's weights file and an LLM's weights that are pickles with code: one line naming the file (or the
    model folder), never torch's suggestion to set weights_only=False."""
    import os

    import torch
    from artifact_fixtures import build_tiny_lm

    from compo.llm import LLMSettings
    from compo.llm.backends import import_transformers, load_backend
    from compo.models import CheckpointError, create_base

    class Code:
        def __reduce__(self):  # unpickling would call os.system
            return (os.system, ("echo unpickled",))

    torch.save({"weights": Code()}, tmp_path / "weights.pt")
    with pytest.raises(CheckpointError) as error:
        create_base({"model": "compo-tiny-clip", "init": "released", "weights": str(tmp_path / "weights.pt")})
    assert str(tmp_path / "weights.pt") in str(error.value) and "weights_only" not in str(error.value)

    folder = tmp_path / "lm"
    build_tiny_lm(folder, ["a", "red", "cube"])
    import_transformers().AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, safe_serialization=False)
    for file in folder.glob("*.safetensors"):
        file.unlink()
    torch.save({"weights": Code()}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError) as error:
        load_backend(LLMSettings.from_options(model=str(folder), backend="transformers", device="cpu"))
    assert str(folder) in str(error.value) and "weights_only" not in str(error.value)
