"""Evaluation loaders on small benchmark folders in the real file formats, scored by a tiny random
open_clip model; every metric is checked against a plain-loop recomputation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from compo.cli import main as cli_main
from compo.evaluate import BenchmarkError, evaluate, pessimistic_rank, retrieval, run_benchmark
from compo.evaluate.files import write_benchmark_set
from compo.evaluate.sugarcrepe import GROUPS, SUBSETS
from compo.evaluate.zeroshot import class_embeddings
from compo.hashing import file_sha256
from compo.io import read_json, read_table
from compo.layout import EVAL_INDEX, INDEX_HASHES, predictions_path
from compo.models import encode_images, encode_texts
from compo.world import generate_benchmarks

TEMPLATES = ["a photo of a {}.", "a drawing of a {}."]
WORDS = ["red", "blue", "green", "cube", "sphere", "cone", "left", "right", "above", "small", "large",
         "striped"]


def write_image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def sentence(rng: np.random.Generator, n_words: int = 5) -> str:
    return "a " + " ".join(rng.choice(WORDS, n_words))


def write_sugarcrepe(root: Path, per_subset: int, n_images: int, seed: int = 0) -> None:
    """SugarCrepe layout; positives are shared across subsets as in the real files (COCO captions)."""
    rng = np.random.default_rng(seed)
    for i in range(n_images):
        write_image(root / "images" / f"{i:012d}.jpg", seed * 1000 + i)
    positives = [sentence(rng) for _ in range(n_images)]
    for subset in SUBSETS:
        items = {}
        for j in range(per_subset):
            image = int(rng.integers(n_images))
            items[str(j)] = {"filename": f"{image:012d}.jpg", "caption": positives[image],
                             "negative_caption": sentence(rng, 6)}
        (root / f"{subset}.json").write_text(json.dumps(items))


# --- ranks ------------------------------------------------------------------------------------------

def test_pessimistic_rank_matches_plain_loop() -> None:
    rng = np.random.default_rng(1)
    true = torch.tensor(rng.integers(0, 4, 50), dtype=torch.float32)  # small integers: many ties
    others = torch.tensor(rng.integers(0, 4, (50, 7)), dtype=torch.float32)
    mask = torch.tensor(rng.random((50, 7)) < 0.7)
    ranks = pessimistic_rank(true, others, mask)
    for i in range(50):
        expected = 1 + sum(1 for j in range(7) if mask[i, j] and others[i, j] >= true[i])
        assert ranks[i] == expected
    assert pessimistic_rank(torch.tensor([1.0]), torch.tensor([[1.0]])).item() == 2  # a tie loses
    near = torch.tensor([0.5], dtype=torch.float64)
    assert pessimistic_rank(near, near[:, None] - 1e-12).item() == 2  # rounding noise is a tie
    assert pessimistic_rank(near, near[:, None] - 1e-6).item() == 1


# --- SugarCrepe -------------------------------------------------------------------------------------

def test_sugarcrepe_matches_plain_loop_and_tie_is_wrong(tmp_path: Path, tiny_model_dir: Path, loaded) -> None:
    bench = tmp_path / "sugarcrepe"
    write_sugarcrepe(bench, per_subset=3, n_images=5)
    items = json.loads((bench / "swap_att.json").read_text())
    items["2"]["negative_caption"] = items["2"]["caption"]  # identical texts: exact tie
    (bench / "swap_att.json").write_text(json.dumps(items))
    # sub-tasks of unequal size, as in the real files: the macro group means differ from the micro ones
    for subset, keep in (("add_obj", 1), ("replace_rel", 2)):
        items = json.loads((bench / f"{subset}.json").read_text())
        (bench / f"{subset}.json").write_text(json.dumps(dict(list(items.items())[:keep])))

    out, preds = tmp_path / "eval.json", tmp_path / "pred.parquet"
    evaluate(tiny_model_dir, "sugarcrepe", {"kind": "sugarcrepe", "source": "files"}, bench, out, preds,
             model_id="negclip/coco/seed0")
    record = read_json(out)
    predictions = read_table(preds, "predictions")
    assert record["model"] == "negclip/coco/seed0" and record["protocol"] == "sugarcrepe-itm-strict"
    assert record["skipped"] == {}

    expected: dict[str, list[bool]] = {}
    image_cache: dict[str, torch.Tensor] = {}
    text_cache: dict[str, torch.Tensor] = {}
    for subset in SUBSETS:
        for item_id, item in json.loads((bench / f"{subset}.json").read_text()).items():
            if item["filename"] not in image_cache:
                with Image.open(bench / "images" / item["filename"]) as image:
                    image_cache[item["filename"]] = encode_images(loaded, [image])[0]
            for text in (item["caption"], item["negative_caption"]):
                if text not in text_cache:
                    text_cache[text] = encode_texts(loaded, [text])[0]
            v, pos, neg = image_cache[item["filename"]], text_cache[item["caption"]], text_cache[
                item["negative_caption"]]
            correct = bool(v @ pos > v @ neg)
            expected.setdefault(subset, []).append(correct)
            row = predictions[(predictions["subset"] == subset) & (predictions["item"] == item_id)].iloc[0]
            assert row["score_pos"] == pytest.approx(float(v @ pos), abs=1e-5)
            assert row["correct"] == correct
    tie = predictions[(predictions["subset"] == "swap_att") & (predictions["item"] == "2")].iloc[0]
    assert tie["score_pos"] == tie["score_neg"] and not tie["correct"] and tie["rank"] == 2

    for subset in SUBSETS:
        assert record["metrics"][subset] == {"value": pytest.approx(np.mean(expected[subset])),
                                             "n": len(expected[subset])}
    for group, members in GROUPS.items():  # the seeds' macro mean over sub-tasks, the micro as a second column
        flat = [c for m in members for c in expected[m]]
        macro = np.mean([np.mean(expected[m]) for m in members])
        assert record["metrics"][group] == {"value": pytest.approx(macro), "n": len(flat)}
        assert record["metrics"][f"{group}_micro"] == {"value": pytest.approx(sum(flat) / len(flat)), "n": len(flat)}
    assert record["headline"] == "overall"


def test_item_paths_outside_the_image_root_are_refused_with_a_count(tmp_path: Path, loaded) -> None:
    bench = tmp_path / "sc"
    write_sugarcrepe(bench, per_subset=3, n_images=2)
    write_image(tmp_path / "outside.png", 99)  # a real image, but not the benchmark's to read
    items = json.loads((bench / "swap_att.json").read_text())
    items["0"]["filename"] = "../../outside.png"
    items["1"]["filename"] = str(tmp_path / "outside.png")
    (bench / "swap_att.json").write_text(json.dumps(items))
    result = run_benchmark(loaded, {"kind": "sugarcrepe", "source": "files"}, bench)
    assert result.skipped == {"outside_image_root": 2}
    assert result.metrics["overall"].n == 7 * 3 - 2 and result.metrics["swap_att"].n == 1


def test_sugarcrepe_errors_name_file_and_item(tmp_path: Path, loaded) -> None:
    bench = tmp_path / "sc"
    write_sugarcrepe(bench, per_subset=2, n_images=2)
    spec = {"kind": "sugarcrepe", "source": "files"}
    items = json.loads((bench / "add_obj.json").read_text())
    del items["1"]["negative_caption"]
    (bench / "add_obj.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"add_obj\.json: item '1': missing field\(s\) negative_caption"):
        run_benchmark(loaded, spec, bench)
    (bench / "add_obj.json").unlink()
    with pytest.raises(BenchmarkError, match=r"add_obj\.json: SugarCrepe subset file not found"):
        run_benchmark(loaded, spec, bench)


# --- zero-shot ----------------------------------------------------------------------------------------

def write_imagefolder(root: Path, classnames: dict[str, str], per_class: int) -> None:
    for c, folder in enumerate(classnames):
        for i in range(per_class):
            write_image(root / folder / f"{i}.png", 100 * c + i)
    (root / "classnames.json").write_text(json.dumps(classnames))


def test_zeroshot_matches_plain_loop(tmp_path: Path, loaded) -> None:
    classnames = {f"c{i}": name for i, name in enumerate(["cube", "sphere", "cone", "torus", "star", "ring"])}
    write_imagefolder(tmp_path, classnames, per_class=3)
    result = run_benchmark(loaded, {"kind": "zeroshot", "source": "world"}, tmp_path, TEMPLATES)

    class_vectors = []  # CLIP's ensemble, one prompt at a time
    for name in classnames.values():
        embeddings = [encode_texts(loaded, [t.format(name)])[0] for t in TEMPLATES]
        mean = sum(e / e.norm() for e in embeddings) / len(embeddings)
        class_vectors.append(mean / mean.norm())
    assert torch.allclose(class_embeddings(loaded, list(classnames.values()), TEMPLATES).float(),
                          torch.stack(class_vectors), atol=1e-5)

    top1 = top5 = 0
    for label, folder in enumerate(classnames):
        for i in range(3):
            with Image.open(tmp_path / folder / f"{i}.png") as image:
                v = encode_images(loaded, [image])[0]
            scores = [float(v @ w) for w in class_vectors]
            rank = 1 + sum(1 for j, s in enumerate(scores) if j != label and s >= scores[label])
            top1 += rank == 1
            top5 += rank <= 5
            row = result.predictions[result.predictions["item"] == f"{folder}/{i}.png"].iloc[0]
            assert row["subset"] == folder and row["rank"] == rank
    assert result.metrics["top1"].value == pytest.approx(top1 / 18) and result.metrics["top1"].n == 18
    assert result.metrics["top5"].value == pytest.approx(top5 / 18)


def test_zeroshot_ties_and_errors(tmp_path: Path, loaded) -> None:
    write_imagefolder(tmp_path, {"a": "cube", "b": "cube", "c": "sphere"}, per_class=2)
    with pytest.raises(BenchmarkError, match=r"classnames\.json: 1 class name\(s\) given to more than one class "
                                             r"\('cube' for a, b\)"):
        run_benchmark(loaded, {"kind": "zeroshot", "source": "world"}, tmp_path, TEMPLATES)
    # CLIP_benchmark's released table names two imagenet1k classes twice: kept as released, a and b tie exactly
    (tmp_path / "classnames.json").write_text(json.dumps({"world": ["cube", "cube", "sphere"]}))
    result = run_benchmark(loaded, {"kind": "zeroshot", "source": "world", "dataset": "world"}, tmp_path, TEMPLATES)
    predictions = result.predictions
    assert not predictions.loc[predictions["subset"].isin(["a", "b"]), "correct"].any()
    assert "top5" not in result.metrics  # only 3 classes
    with pytest.raises(BenchmarkError, match="needs prompt templates"):
        run_benchmark(loaded, {"kind": "zeroshot", "source": "world"}, tmp_path, None)
    (tmp_path / "d").mkdir()
    (tmp_path / "classnames.json").write_text(json.dumps({"a": "cube", "b": "cone", "c": "sphere"}))
    with pytest.raises(BenchmarkError, match=r"classnames\.json: folder\(s\) d in .* have no class name"):
        run_benchmark(loaded, {"kind": "zeroshot", "source": "world"}, tmp_path, TEMPLATES)


# --- retrieval ----------------------------------------------------------------------------------------

def write_karpathy(root: Path, rng: np.random.Generator) -> dict:
    images = []
    for i in range(6):
        write_image(root / "images" / "val" / f"{i}.png", 500 + i)
        images.append({"imgid": i, "filename": f"{i}.png", "filepath": "val", "split": "test",
                       "sentences": [{"raw": sentence(rng)} for _ in range(2)]})
    # imgid 6 is another image with imgid 0's captions: each image's best caption ties with the other's (one
    # file under two ids is refused: tests/evaluate/test_retrieval.py)
    write_image(root / "images" / "val" / "6.png", 506)
    images.append({**images[0], "imgid": 6, "filename": "6.png"})
    images.append({"imgid": 7, "filename": "missing.png", "filepath": "val", "split": "train",
                   "sentences": [{"raw": "ignored"}]})
    data = {"images": images}
    (root / "dataset.json").write_text(json.dumps(data))
    return data


def plain_recalls(scores: np.ndarray, caption_image: list[int]) -> dict[str, float]:
    """Image->text and text->image recall with ties against the model, one query at a time."""
    n_images, n_texts = scores.shape
    out = {}
    for k in (1, 5, 10):
        hits = 0
        for i in range(n_images):
            own = [t for t in range(n_texts) if caption_image[t] == i]
            best = max(scores[i, t] for t in own)
            rank = 1 + sum(1 for t in range(n_texts) if caption_image[t] != i and scores[i, t] >= best)
            hits += rank <= k
        out[f"i2t_r{k}"] = hits / n_images
        hits = 0
        for t in range(n_texts):
            true = scores[caption_image[t], t]
            rank = 1 + sum(1 for i in range(n_images) if i != caption_image[t] and scores[i, t] >= true)
            hits += rank <= k
        out[f"t2i_r{k}"] = hits / n_texts
    return out


@pytest.mark.parametrize("chunk", [1024, 2])
def test_retrieval_matches_plain_loop_with_ties(tmp_path: Path, loaded, monkeypatch, chunk: int) -> None:
    monkeypatch.setattr(retrieval, "CHUNK", chunk)  # the chunked scoring must not change any rank
    data = write_karpathy(tmp_path, np.random.default_rng(2))
    result = run_benchmark(loaded, {"kind": "retrieval", "source": "world"}, tmp_path)

    test = [entry for entry in data["images"] if entry["split"] == "test"]
    # one encoding per distinct file / text, so that equal inputs tie exactly here too
    image_cache: dict[str, torch.Tensor] = {}
    for entry in test:
        if entry["filename"] not in image_cache:
            with Image.open(tmp_path / "images" / entry["filepath"] / entry["filename"]) as image:
                image_cache[entry["filename"]] = encode_images(loaded, [image])[0]
    image_vectors = [image_cache[entry["filename"]] for entry in test]
    captions = [(i, s["raw"]) for i, entry in enumerate(test) for s in entry["sentences"]]
    text_cache = {raw: encode_texts(loaded, [raw])[0] for _, raw in captions}
    scores = np.array([[float(v @ text_cache[raw]) for _, raw in captions] for v in image_vectors])
    expected = plain_recalls(scores, [i for i, _ in captions])
    for key, value in expected.items():
        assert result.metrics[key].value == pytest.approx(value), key
    assert result.metrics["mean_recall"].value == pytest.approx(np.mean(list(expected.values())))
    assert result.metrics["i2t_r1"].n == 7 and result.metrics["t2i_r1"].n == 14
    # images 0 and 6 share their captions: their best caption ties with the other's, never a top-1 hit
    preds = result.predictions.set_index(["subset", "item"])
    assert not preds.loc[("i2t", "0"), "correct"] and not preds.loc[("i2t", "6"), "correct"]


def test_retrieval_skips_missing_image_and_rejects_bad_entries(tmp_path: Path, loaded) -> None:
    data = write_karpathy(tmp_path, np.random.default_rng(3))
    (tmp_path / "images" / "val" / "3.png").unlink()
    result = run_benchmark(loaded, {"kind": "retrieval", "source": "world"}, tmp_path)
    assert result.skipped == {"missing_image": 1} and result.metrics["i2t_r1"].n == 6
    del data["images"][2]["sentences"][1]["raw"]
    (tmp_path / "dataset.json").write_text(json.dumps(data))
    with pytest.raises(BenchmarkError, match=r"dataset\.json: image 2: sentences\[1\]: missing field"):
        run_benchmark(loaded, {"kind": "retrieval", "source": "world"}, tmp_path)


# --- entry point and timing ---------------------------------------------------------------------------

def test_a_benchmark_set_records_its_files_and_names_a_missing_one(tmp_path: Path) -> None:
    """The record an evaluation set's jobs read in place of its files (rule benchmark_set): each file's size and time,
    so a changed file makes a newer record and its evaluations rerun."""
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    files[0].write_text("[]")
    files[1].write_text("[1, 2]")
    out = tmp_path / "sets" / "study.json"
    cli_main(["benchmark-set", "--benchmarks", json.dumps({"x": [str(files[0])], "y": [str(files[1])]}),
              "--out", str(out)])
    record = read_json(out)["benchmarks"]
    assert [entry["bytes"] for entry in record["x"] + record["y"]] == [2, 6]
    assert record["y"][0]["path"] == str(files[1]) and record["y"][0]["mtime_ns"] == files[1].stat().st_mtime_ns
    with pytest.raises(BenchmarkError, match=r"benchmark 'z': cannot read .*missing\.json"):
        write_benchmark_set({"z": [str(tmp_path / "missing.json")]}, out)


@pytest.mark.slow
def test_cli_on_the_world_benchmarks(tmp_path: Path, tiny_model_dir: Path, repo: Path) -> None:
    """Every benchmark the default config defines, read from the files the synthetic world writes."""
    config = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    world = {**config["world"], "splits": {**config["world"]["splits"], "eval": 6},
             "benchmarks": {"sugarcrepe_per_subset": 2, "zeroshot_per_class": 1}}
    generate_benchmarks(world, seed=0, out_dir=tmp_path / "bench")
    for name, spec in config["benchmarks"].items():
        out, preds = tmp_path / "r" / f"{name}.json", predictions_path(tmp_path / "r" / f"{name}.json")
        cli_main(["evaluate", "--model-dir", str(tiny_model_dir), "--model-id", "clip-ft/coco/seed1",
                  "--benchmarks", json.dumps({name: {"spec": spec, "dir": str(tmp_path / "bench" / name)}}),
                  "--templates", json.dumps(config["zeroshot_templates"]), "--out-dir", str(out.parent)])
        record = read_json(out)
        assert read_json(out.parent / EVAL_INDEX) == {"model": "clip-ft/coco/seed1", "results": [f"{name}.json"],
                                                      INDEX_HASHES: {f"{name}.json": file_sha256(out)}}
        assert record["benchmark"] == name and record["kind"] == spec["kind"] and record["skipped"] == {}
        assert record["headline"] in record["metrics"]
        predictions = read_table(preds, "predictions")
        if spec["kind"] == "sugarcrepe":
            assert record["metrics"]["overall"]["n"] == len(predictions) == 14
        elif spec["kind"] == "zeroshot":
            assert record["metrics"]["top1"]["n"] == len(predictions) == len(predictions["subset"].unique())
        elif spec["kind"] == "retrieval":
            assert record["metrics"]["i2t_r1"]["n"] == 6 and record["metrics"]["t2i_r1"]["n"] == 18


def test_sugarcrepe_200_per_subset_one_thread(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The measured number in the report: a 200-items-per-subset folder on one thread."""
    write_sugarcrepe(tmp_path / "sc", per_subset=200, n_images=200)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start, start_cpu = time.perf_counter(), time.process_time()
        evaluate(tiny_model_dir, "sugarcrepe", {"kind": "sugarcrepe", "source": "files"}, tmp_path / "sc",
                 tmp_path / "e.json", tmp_path / "p.parquet", model_id="clip-ft/coco/seed0")
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    finally:
        torch.set_num_threads(threads)
    record = read_json(tmp_path / "e.json")
    assert record["metrics"]["overall"]["n"] == 1400
    print(f"\nSugarCrepe 7 x 200 items (200 images, 1600 distinct texts), tiny model, 1 thread: "
          f"{seconds:.2f} s wall, {cpu_seconds:.2f} s CPU")
    assert isinstance(pd.read_parquet(tmp_path / "p.parquet"), pd.DataFrame)


@pytest.mark.slow
def test_a_diverged_model_is_an_error_on_every_world_benchmark_never_a_score(tmp_path: Path, tiny_world) -> None:
    """A checkpoint whose weights are NaN scored 1.0 on every SugarCrepe subset (a NaN comparison counted right):
    every scorer kind the world writes now stops on it, naming the model and the benchmark."""
    from compo.evaluate import evaluate_many
    from compo.models import create_model, save_checkpoint
    from compo.world import generate_benchmarks
    from compo.world.benchmarks import world_benchmarks

    model = create_model("compo-tiny-clip", "scratch", seed=0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    save_checkpoint(model, "compo-tiny-clip", tmp_path / "nan-model")
    world = {**tiny_world, "benchmarks": {**tiny_world["benchmarks"], "aro_items": 2, "winoground_items": 2,
                                          "sugarcrepe_pp_per_subset": 2, "valse_per_piece": 2,
                                          "linear_probe_per_class": 2}}
    generate_benchmarks(world, seed=0, out_dir=tmp_path / "bench")
    kinds = set()
    for folder, spec in world_benchmarks().items():
        name = folder
        sized = {"min_count": 1} if spec["kind"].startswith("aro_") and spec["kind"] != "aro_order" else {}
        job = {"spec": {**spec, "source": "world", **sized}, "dir": str(tmp_path / "bench" / folder),
               "out": str(tmp_path / "out" / f"{name}.json"), "predictions": str(tmp_path / "out" / f"{name}.parquet")}
        with pytest.raises(BenchmarkError, match=rf"nan/x/seed0 on {name}: .* embeddings are NaN or infinite"):
            evaluate_many(tmp_path / "nan-model", {name: job}, ["a photo of a {c}."], model_id="nan/x/seed0")
        assert not Path(job["out"]).exists()
        kinds.add(spec["kind"])
    assert len(kinds) >= 12, kinds
