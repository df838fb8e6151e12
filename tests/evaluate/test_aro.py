"""SugarCrepe++, Winoground, ARO, VALSE, linear probe and long-caption retrieval: loaders on small
fixtures in the real file formats (scored by a tiny random open_clip model and checked against plain
loops), and the synthetic world's versions of them (deterministic, positives hold, negatives do not)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark
from compo.evaluate.aro import (
    order_perturbations,
    pre_caption,
    shuffle_allbut_nouns_and_adj,
    shuffle_nouns_and_adj,
    shuffle_trigrams,
    shuffle_within_trigrams,
)
from compo.evaluate.linear_probe import fit_softmax_regression
from compo.evaluate.sugarcrepe_pp import SUBSETS as SCPP_SUBSETS
from compo.models import encode_images, encode_texts
from compo.world import caption_holds, generate_benchmarks
from compo.world.benchmarks import (
    SUGARCREPE_PP_SUBSETS,
    aro_attribution_item,
    aro_relation_item,
    sugarcrepe_pp_item,
    winoground_item,
)
from compo.world.scene import rng_stream

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared

WORDS = ["red", "blue", "green", "cube", "sphere", "cone", "left", "right", "above", "small", "large"]
WORLD_SPECS = {
    "sugarcrepe_pp": {"kind": "sugarcrepe_pp", "source": "world"},
    "winoground": {"kind": "winoground", "source": "world"},
    "aro_relation": {"kind": "aro_relation", "source": "world", "min_count": 1},
    "aro_attribution": {"kind": "aro_attribution", "source": "world", "min_count": 1},
    "aro_order": {"kind": "aro_order", "source": "world"},
    "valse": {"kind": "valse", "source": "world", "pieces": ["relations", "foil-it"]},
    "linear_probe": {"kind": "linear_probe", "source": "world"},
    "long_retrieval": {"kind": "long_retrieval", "source": "world"},
}


def write_image(path: Path, seed: int, size: int = 48) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)


def sentence(rng: np.random.Generator, n: int = 5) -> str:
    return "a " + " ".join(rng.choice(WORDS, n))


_IMAGES: dict[tuple, torch.Tensor] = {}
_TEXTS: dict[str, torch.Tensor] = {}


def embed_image(loaded, path: Path, box=None) -> torch.Tensor:  # noqa: ANN001
    """One image (or crop) embedded on its own, cached: the plain-loop reference."""
    key = (path, path.stat().st_mtime_ns, box)
    if key not in _IMAGES:
        with Image.open(path) as image:
            image = image.convert("RGB")
            _IMAGES[key] = encode_images(loaded, [image.crop(box) if box else image])[0].double()
    return _IMAGES[key]


def embed_text(loaded, text: str) -> torch.Tensor:  # noqa: ANN001
    if text not in _TEXTS:
        _TEXTS[text] = encode_texts(loaded, [text])[0].double()
    return _TEXTS[text]


# --- SugarCrepe++ ------------------------------------------------------------------------------------

def write_scpp(root: Path, per_subset: int = 3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(4):
        write_image(root / "images" / f"{i:012d}.jpg", seed * 100 + i)
    for subset in SCPP_SUBSETS:
        items = [{"id": j, "filename": f"{int(rng.integers(4)):012d}.jpg", "caption": sentence(rng),
                  "caption2": sentence(rng, 6), "negative_caption": sentence(rng, 4)} for j in range(per_subset)]
        (root / f"{subset}.json").write_text(json.dumps(items))


def test_sugarcrepe_pp_matches_plain_loop_with_ties(tmp_path: Path, loaded) -> None:
    bench = tmp_path / "scpp"
    write_scpp(bench)
    items = json.loads((bench / "swap_obj.json").read_text())
    items[1]["caption2"] = items[1]["negative_caption"]  # ITT and TOT tie: both wrong
    (bench / "swap_obj.json").write_text(json.dumps(items))
    result = run_benchmark(loaded, {"kind": "sugarcrepe_pp", "source": "files"}, bench)
    predictions = result.predictions
    all_itt, all_tot = [], []
    for subset in SCPP_SUBSETS:
        itt, tot = [], []
        for item in json.loads((bench / f"{subset}.json").read_text()):
            v = embed_image(loaded, bench / "images" / item["filename"])
            p1, p2, n = (embed_text(loaded, item[k]) for k in ("caption", "caption2", "negative_caption"))
            itt.append(bool(v @ p1 > v @ n + 1e-9 and v @ p2 > v @ n + 1e-9))
            tot.append(bool(p1 @ p2 > p1 @ n + 1e-9 and p1 @ p2 > p2 @ n + 1e-9))
            for task, expected in (("itt", itt[-1]), ("tot", tot[-1])):
                row = predictions[(predictions["subset"] == f"{subset}/{task}")
                                  & (predictions["item"] == str(item["id"]))].iloc[0]
                assert bool(row["correct"]) == expected
        assert result.metrics[f"itt_{subset}"].value == pytest.approx(np.mean(itt))
        assert result.metrics[f"tot_{subset}"].value == pytest.approx(np.mean(tot))
        all_itt += itt
        all_tot += tot
    assert result.metrics["itt_overall"].value == pytest.approx(np.mean(all_itt))
    assert result.metrics["tot_overall"].n == len(all_tot) == 15
    tie = predictions[(predictions["subset"].str.startswith("swap_obj/")) & (predictions["item"] == "1")]
    assert not tie["correct"].any()


def test_sugarcrepe_pp_skips_missing_images_for_itt_only_and_names_bad_items(tmp_path: Path, loaded) -> None:
    bench = tmp_path / "scpp"
    write_scpp(bench)
    (bench / "images" / f"{0:012d}.jpg").unlink()
    uses = sum(item["filename"] == f"{0:012d}.jpg" for s in SCPP_SUBSETS
               for item in json.loads((bench / f"{s}.json").read_text()))
    result = run_benchmark(loaded, {"kind": "sugarcrepe_pp", "source": "files"}, bench)
    assert uses > 0 and result.skipped == {"missing_image": uses}
    assert result.metrics["itt_overall"].n == 15 - uses and result.metrics["tot_overall"].n == 15
    items = json.loads((bench / "replace_rel.json").read_text())
    del items[2]["caption2"]
    (bench / "replace_rel.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"replace_rel\.json: item 2: missing field\(s\) caption2"):
        run_benchmark(loaded, {"kind": "sugarcrepe_pp", "source": "files"}, bench)


# --- Winoground --------------------------------------------------------------------------------------

def write_winoground(root: Path, n: int = 6) -> list[dict]:
    rng = np.random.default_rng(3)
    examples = []
    for i in range(n):
        for k in range(2):
            write_image(root / "images" / f"ex_{i}_img_{k}.png", 10 * i + k)
        # fine-grained tags that look like collapsed ones: grouping must use collapsed_tag only
        examples.append({"id": i, "image_0": f"ex_{i}_img_0", "image_1": f"ex_{i}_img_1",
                         "caption_0": sentence(rng), "caption_1": sentence(rng), "tag": ("Object", "Relation")[i % 2],
                         "secondary_tag": "", "num_main_preds": 1 + (i % 3 == 0),
                         "collapsed_tag": ("Relation", "Relation", "Object", "Both", "Object", "Relation")[i]})
    examples[2]["caption_1"] = examples[2]["caption_0"]  # a tie: text and group wrong
    (root / "examples.jsonl").write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    return examples


def test_winoground_matches_plain_loop(tmp_path: Path, loaded) -> None:
    examples = write_winoground(tmp_path / "wg")
    result = run_benchmark(loaded, {"kind": "winoground", "source": "files"}, tmp_path / "wg")
    expected = {"text": [], "image": [], "group": []}
    for ex in examples:
        i = [embed_image(loaded, tmp_path / "wg" / "images" / f"{ex[f'image_{k}']}.png") for k in range(2)]
        c = [embed_text(loaded, ex[f"caption_{k}"]) for k in range(2)]
        s = [[float(c[a] @ i[b]) for b in range(2)] for a in range(2)]
        text = s[0][0] > s[1][0] + 1e-9 and s[1][1] > s[0][1] + 1e-9
        image = s[0][0] > s[0][1] + 1e-9 and s[1][1] > s[1][0] + 1e-9
        for name, value in (("text", text), ("image", image), ("group", text and image)):
            expected[name].append(value)
    groups = {"relation": [0, 1, 5], "object": [2, 4], "both": [3], "1_main_preds": [1, 2, 4, 5],
              "2_main_preds": [0, 3]}
    for name, values in expected.items():
        assert result.metrics[name].value == pytest.approx(np.mean(values)) and result.metrics[name].n == 6
        for suffix, members in groups.items():
            metric = result.metrics[f"{name}_{suffix}"]
            assert metric.n == len(members) and metric.value == pytest.approx(np.mean([values[i] for i in members]))
    assert expected["text"][2] is False
    rows = result.predictions
    assert not rows[(rows["item"] == "2") & (rows["subset"] == "text")]["correct"].item()


def test_winoground_bad_lines_are_named(tmp_path: Path, loaded) -> None:
    examples = write_winoground(tmp_path / "wg")
    del examples[3]["caption_1"]
    (tmp_path / "wg" / "examples.jsonl").write_text("\n".join(json.dumps(e) for e in examples))
    with pytest.raises(BenchmarkError, match=r"examples\.jsonl: line 4 \(example 3\): missing field\(s\) caption_1"):
        run_benchmark(loaded, {"kind": "winoground", "source": "files"}, tmp_path / "wg")
    examples[3]["caption_1"], examples[1]["num_main_preds"] = "x", "1"
    (tmp_path / "wg" / "examples.jsonl").write_text("\n".join(json.dumps(e) for e in examples))
    with pytest.raises(BenchmarkError, match=r"line 2 \(example 1\): field 'num_main_preds' must be a positive"):
        run_benchmark(loaded, {"kind": "winoground", "source": "files"}, tmp_path / "wg")


# --- ARO ---------------------------------------------------------------------------------------------

def write_vg(root: Path, filename: str, group_field: str, n: int = 8) -> list[dict]:
    rng = np.random.default_rng(5)
    for i in range(3):
        write_image(root / "images" / f"{i}.jpg", 50 + i, size=60)
    items = []
    for j in range(n):
        big = j % 3 != 0  # groups of 5 and 3 items
        group = ["on", "left of"][big] if group_field == "relation_name" else [["red", "blue"], ["big", "old"]][big]
        items.append({"image_id": j, "image_path": f"{j % 3}.jpg", "bbox_x": int(rng.integers(0, 20)),
                      "bbox_y": int(rng.integers(0, 20)), "bbox_w": int(rng.integers(10, 40)),
                      "bbox_h": int(rng.integers(10, 40)), "true_caption": sentence(rng),
                      "false_caption": sentence(rng), group_field: group})
    items[3]["false_caption"] = items[3]["true_caption"]  # tie: wrong
    (root / filename).write_text(json.dumps(items))
    return items


@pytest.mark.parametrize("kind,filename,field", [
    ("aro_relation", "visual_genome_relation.json", "relation_name"),
    ("aro_attribution", "visual_genome_attribution.json", "attributes"),
])
def test_aro_vg_macro_accuracy_matches_plain_loop(tmp_path: Path, loaded, kind: str, filename: str,
                                                  field: str) -> None:
    items = write_vg(tmp_path, filename, field)
    result = run_benchmark(loaded, {"kind": kind, "source": "files", "min_count": 1}, tmp_path)
    groups: dict[str, list[bool]] = {}
    for item in items:
        box = (item["bbox_x"], item["bbox_y"], item["bbox_x"] + item["bbox_w"], item["bbox_y"] + item["bbox_h"])
        v = embed_image(loaded, tmp_path / "images" / item["image_path"], box)
        correct = float(v @ embed_text(loaded, item["true_caption"])) > float(
            v @ embed_text(loaded, item["false_caption"])) + 1e-9
        name = item[field] if isinstance(item[field], str) else "_".join(item[field])
        groups.setdefault(name, []).append(correct)
    assert result.metrics["macro"].value == pytest.approx(np.mean([np.mean(g) for g in groups.values()]))
    assert result.metrics["micro"].value == pytest.approx(np.mean([c for g in groups.values() for c in g]))
    assert not result.predictions.loc[result.predictions["item"] == "3", "correct"].item()
    # groups below min_count leave the macro mean, never the micro one
    big = [name for name, g in groups.items() if len(g) == 5]
    filtered = run_benchmark(loaded, {"kind": kind, "source": "files", "min_count": 4}, tmp_path)
    assert filtered.metrics["macro"] == type(filtered.metrics["macro"])(pytest.approx(np.mean(groups[big[0]])), 5)
    assert filtered.metrics["micro"].n == 8
    with pytest.raises(BenchmarkError, match="no .* group has at least min_count=6"):
        run_benchmark(loaded, {"kind": kind, "source": "files", "min_count": 6}, tmp_path)


def test_aro_vg_errors_and_skips(tmp_path: Path, loaded) -> None:
    items = write_vg(tmp_path, "visual_genome_relation.json", "relation_name")
    (tmp_path / "images" / "1.jpg").unlink()
    result = run_benchmark(loaded, {"kind": "aro_relation", "source": "files"}, tmp_path)
    assert result.skipped == {"missing_image": sum(i["image_path"] == "1.jpg" for i in items)}
    items[5]["bbox_w"], items[7]["bbox_h"] = 0, -3  # not croppable: skipped with a count, not an abort
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(items))
    result = run_benchmark(loaded, {"kind": "aro_relation", "source": "files"}, tmp_path)
    missing = sum(i["image_path"] == "1.jpg" for k, i in enumerate(items) if k not in (5, 7))
    assert result.skipped == {"missing_image": missing, "empty_box": 2}
    assert "5" not in set(result.predictions["item"]) and result.metrics["micro"].n == 8 - 2 - missing
    del items[6]["relation_name"]
    items[5]["bbox_w"] = 3
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"item 6: missing field\(s\) relation_name"):
        run_benchmark(loaded, {"kind": "aro_relation", "source": "files"}, tmp_path)


def test_aro_relation_macro_leaves_out_the_symmetric_relations(tmp_path: Path, loaded) -> None:
    items = write_vg(tmp_path, "visual_genome_relation.json", "relation_name")
    for k in (0, 3, 6):  # the group of 3 becomes a symmetric relation of ARO's list
        items[k]["relation_name"] = "next to"
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(items))
    result = run_benchmark(loaded, {"kind": "aro_relation", "source": "files"}, tmp_path)
    rows = result.predictions.set_index("item")["correct"]
    left_of = [bool(rows[str(k)]) for k in range(8) if k % 3 != 0]
    assert result.metrics["macro"].value == pytest.approx(np.mean(left_of)) and result.metrics["macro"].n == 5
    assert result.metrics["micro"].n == 8 and result.metrics["relation/next to"].n == 3  # still reported
    assert (result.metrics["symmetric_excluded"].value, result.metrics["symmetric_excluded"].n) == (1.0, 3)
    kept = run_benchmark(loaded, {"kind": "aro_relation", "source": "files", "exclude_symmetric": False}, tmp_path)
    both = np.mean([np.mean(left_of), np.mean([bool(rows[str(k)]) for k in (0, 3, 6)])])
    assert kept.metrics["macro"].value == pytest.approx(both)


def test_aro_symmetric_relations_are_the_released_list() -> None:
    from compo.evaluate.aro import symmetric_relations

    names = symmetric_relations()
    assert len(names) == 157 and {"next to", "near", "with", "by", "of", "around"} <= names
    assert not {"on", "left of", "right of", "above", "below", "behind"} & names  # asymmetric ones stay


def test_order_perturbations_keep_the_words_and_move_the_right_ones() -> None:
    rng = np.random.default_rng(0)
    tokens = ["a", "red", "car", "parked", "near", "a", "tall", "old", "building", "."]
    tags = ["DT", "JJ", "NN", "VBN", "IN", "DT", "JJ", "JJ", "NN", "."]
    for _ in range(20):
        shuffled = shuffle_nouns_and_adj(tokens, tags, rng).split(" ")
        assert sorted(shuffled) == sorted(tokens)
        assert all(shuffled[i] == tokens[i] for i, t in enumerate(tags) if t not in {"NN", "JJ"})
        assert {shuffled[i] for i, t in enumerate(tags) if t == "NN"} == {"car", "building"}
        other = shuffle_allbut_nouns_and_adj(tokens, tags, rng).split(" ")
        assert all(other[i] == tokens[i] for i, t in enumerate(tags) if t in {"NN", "JJ"})
        within = shuffle_within_trigrams(tokens, rng).split(" ")
        chunks = range(0, 10, 3)
        assert [sorted(within[i : i + 3]) for i in chunks] == [sorted(tokens[i : i + 3]) for i in chunks]
        moved = shuffle_trigrams(tokens, rng)
        assert sorted(moved.split(" ")) == sorted(tokens)
        assert all(" ".join(tokens[i : i + 3]) in moved for i in range(0, 10, 3))  # trigrams move whole
    assert pre_caption("A Red, car (parked)!  here.", 3) == "a red, car"
    first = order_perturbations(["a red car near a tall building", "two dogs on a green lawn"], seed=1)
    assert first == order_perturbations(["a red car near a tall building", "two dogs on a green lawn"], seed=1)
    assert len(first) == 2 and all(len(p) == 4 for p in first)


def test_aro_order_matches_plain_loop(tmp_path: Path, loaded) -> None:
    rng = np.random.default_rng(9)
    images = []
    for i in range(3):
        write_image(tmp_path / "images" / f"{i}.jpg", 70 + i)
        images.append({"imgid": i, "filename": f"{i}.jpg", "split": "test",
                       "sentences": [{"raw": sentence(rng, 6), "sentid": 10 * i + k} for k in range(2)]})
    # two words: a shuffle that changes nothing gives a perturbation identical to the caption (a tie)
    images[0]["sentences"][1]["raw"] = "dogs"
    images.append({"imgid": 9, "filename": "gone.jpg", "split": "test", "sentences": [{"raw": "a cube"}]})
    (tmp_path / "dataset.json").write_text(json.dumps({"images": images}))
    result = run_benchmark(loaded, {"kind": "aro_order", "source": "files", "seed": 4}, tmp_path)
    assert result.skipped == {"missing_image": 1}
    raw = [s["raw"] for e in images[:3] for s in e["sentences"]]
    perturbed = order_perturbations(raw, seed=4)
    released, strict = [], []
    for index, (caption, options) in enumerate(zip(raw, perturbed, strict=True)):
        v = embed_image(loaded, tmp_path / "images" / f"{index // 2}.jpg")
        scores = [float(v @ embed_text(loaded, pre_caption(text))) for text in [caption, *options]]
        released.append(np.argmax(scores) == 0)  # ARO's evaluate_scores: the first maximum, caption first
        strict.append(all(scores[0] > s + 1e-9 for s in scores[1:]))
    identical = sum(any(pre_caption(p) == pre_caption(c) for p in ps) for c, ps in zip(raw, perturbed, strict=True))
    assert result.metrics["n_identical"].value == identical and pre_caption(perturbed[1][0]) == "dogs"
    assert released[1] and not strict[1]  # the tie: right under the released code, wrong under strict
    assert result.metrics["precision_at_1"].value == pytest.approx(np.mean(released))
    assert result.metrics["precision_at_1_strict"].value == pytest.approx(np.mean(strict))
    assert result.metrics["precision_at_1"].n == result.metrics["precision_at_1_strict"].n == 6
    assert result.headline == "precision_at_1"
    assert (result.predictions["rank"] <= result.predictions["rank_strict"]).all()


# --- VALSE -------------------------------------------------------------------------------------------

def test_valse_matches_plain_loop_filters_unvalidated_and_uses_dataset_roots(tmp_path: Path, loaded) -> None:
    rng = np.random.default_rng(2)
    write_image(tmp_path / "coco" / "a.jpg", 1)
    write_image(tmp_path / "images" / "b.jpg", 2)
    items = {f"rel_{i}": {"dataset": "coco" if i % 2 else "other", "image_file": "a.jpg" if i % 2 else "b.jpg",
                          "caption": sentence(rng), "foil": sentence(rng), "classes": "x", "classes_foil": "y",
                          "mturk": {"caption": 3 if i != 4 else 1, "foil": 0, "other": 0}} for i in range(6)}
    (tmp_path / "relations.json").write_text(json.dumps(items))
    foil_it = {"f0": {"dataset": "other", "image_file": "b.jpg", "caption": "a red cube", "foil": "a red cube"}}
    (tmp_path / "foil-it.json").write_text(json.dumps(foil_it))
    spec = {"kind": "valse", "source": "files", "pieces": ["relations", "foil-it"],
            "image_roots": {"coco": str(tmp_path / "coco")}}
    result = run_benchmark(loaded, spec, tmp_path)
    assert result.skipped == {"not_validated": 1}
    correct = []
    for key, item in items.items():
        if key == "rel_4":
            continue
        root = tmp_path / ("coco" if item["dataset"] == "coco" else "images")
        v = embed_image(loaded, root / item["image_file"])
        caption, foil = embed_text(loaded, item["caption"]), embed_text(loaded, item["foil"])
        correct.append(float(v @ caption) > float(v @ foil) + 1e-9)
    assert result.metrics["relations"].value == pytest.approx(np.mean(correct))
    assert result.metrics["foil-it"].value == 0.0  # caption == foil: a tie
    assert result.metrics["mean"].value == pytest.approx(np.mean(correct) / 2)
    assert len(run_benchmark(loaded, {**spec, "valid_only": False}, tmp_path).predictions) == 7
    # a piece's own root wins over its items' dataset root (the release's config.py: one folder per piece)
    write_image(tmp_path / "foil_images" / "b.jpg", 3)
    by_piece = run_benchmark(loaded, {**spec, "image_roots": {**spec["image_roots"],
                                                              "foil-it": str(tmp_path / "foil_images")}}, tmp_path)
    assert by_piece.skipped == {"not_validated": 1} and by_piece.metrics["foil-it"].n == 1
    (tmp_path / "foil_images" / "b.jpg").unlink()
    with pytest.raises(BenchmarkError, match=r"foil-it\.json: no valse item of 'foil-it' left to score.*"
                                             r"\(missing_image: 1\)"):
        run_benchmark(loaded, {**spec, "image_roots": {"foil-it": str(tmp_path / "foil_images")}}, tmp_path)
    del items["rel_2"]["foil"]
    (tmp_path / "relations.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"relations\.json: item 'rel_2': missing field\(s\) foil"):
        run_benchmark(loaded, spec, tmp_path)


# --- linear probe ------------------------------------------------------------------------------------

def test_softmax_regression_reaches_its_optimum() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(60, 5)))
    y = torch.tensor(rng.integers(0, 3, 60))
    l2 = 0.1
    weight, bias = fit_softmax_regression(x, y, 3, l2)
    # stationarity of mean CE + l2/2 |W|^2, written out: X^T (P - Y) / n + l2 W = 0 and mean(P - Y) = 0
    logits = x @ weight + bias
    p = torch.softmax(logits, dim=1)
    onehot = torch.nn.functional.one_hot(y, 3).double()
    assert torch.allclose(x.T @ (p - onehot) / 60 + l2 * weight, torch.zeros_like(weight), atol=1e-6)
    assert torch.allclose((p - onehot).mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-6)


def test_linear_probe_on_an_imagefolder(tmp_path: Path, loaded) -> None:
    torch.set_num_threads(1)
    for split, n in (("train", 6), ("test", 3)):
        for c, colour in enumerate(((250, 20, 20), (20, 20, 250))):
            for i in range(n):
                path = tmp_path / split / f"c{c}" / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                noise = np.random.default_rng(100 * c + i).integers(-20, 20, (32, 32, 3))
                Image.fromarray(np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)).save(path)
    (tmp_path / "classnames.json").write_text(json.dumps({"c0": "red", "c1": "blue"}))
    (tmp_path / "test" / "c1" / "2.png").write_bytes(b"broken")
    result = run_benchmark(loaded, {"kind": "linear_probe", "source": "files"}, tmp_path)
    assert result.skipped == {"corrupt_image": 1} and result.metrics["top1"].n == 5
    assert result.metrics["top1"].value == 1.0  # two flat colours are linearly separable even at random init
    # a class in one split only: an error naming it (a probe prompts no class, so its names are not read)
    (tmp_path / "train" / "c2").mkdir()
    with pytest.raises(BenchmarkError, match=r"train and test have different classes .*only in train: c2"):
        run_benchmark(loaded, {"kind": "linear_probe", "source": "files"}, tmp_path)


# --- the world's versions ----------------------------------------------------------------------------

def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world_bench(tmp_path_factory: pytest.TempPathFactory, tiny_world: dict) -> Path:
    out = tmp_path_factory.mktemp("world") / "bench"
    generate_benchmarks(tiny_world, seed=0, out_dir=out)
    return out


def test_world_benchmarks_are_deterministic_and_listed(tmp_path: Path, world_bench: Path, tiny_world: dict) -> None:
    generate_benchmarks(tiny_world, seed=0, out_dir=tmp_path / "again")
    assert _digest(tmp_path / "again") == _digest(world_bench)
    for name, spec in WORLD_SPECS.items():
        for path in benchmark_files(spec["kind"], str(world_bench / name), spec):
            assert Path(path).is_file(), path


def test_world_items_hold_and_negatives_do_not(tiny_world: dict) -> None:
    world = {**tiny_world, "image_size": 32}
    for subset in SUGARCREPE_PP_SUBSETS:
        rng = rng_stream(0, "test", subset)
        for i in range(8):
            scene, c1, c2, negative = sugarcrepe_pp_item(subset, rng, f"x{i}", world)
            assert c1 != c2 and caption_holds(scene, c1) and caption_holds(scene, c2)
            assert caption_holds(scene, negative) is False
    rng = rng_stream(0, "test", "winoground")
    for i in range(12):
        scene0, scene1, c0, c1 = winoground_item(("Relation", "Object")[i % 2], rng, f"ex_{i}", world)
        assert sorted(c0.split()) == sorted(c1.split()) and c0 != c1
        assert (caption_holds(scene0, c0), caption_holds(scene0, c1)) == (True, False)
        assert (caption_holds(scene1, c1), caption_holds(scene1, c0)) == (True, False)
        assert scene0["background"] == scene1["background"] and scene0["texture_seed"] == scene1["texture_seed"]
    for make in (aro_relation_item, aro_attribution_item):
        rng = rng_stream(0, "test", make.__name__)
        for i in range(10):
            scene, pair, _, true, false = make(rng, f"a{i}", world)
            assert caption_holds(scene, true) is True and caption_holds(scene, false) is False
            assert sorted(true.split()) == sorted(false.split()) and pair[0] != pair[1]


def test_world_files_are_valid(world_bench: Path, tiny_world: dict) -> None:
    n = tiny_world["benchmarks"]["sugarcrepe_per_subset"]
    for line in (world_bench / "winoground" / "examples.jsonl").read_text().splitlines():
        example = json.loads(line)
        for k in range(2):
            assert (world_bench / "winoground" / "images" / f"{example[f'image_{k}']}.png").is_file()
    for name, field in (("aro_relation", "relation_name"), ("aro_attribution", "attributes")):
        filename = "visual_genome_relation.json" if field == "relation_name" else "visual_genome_attribution.json"
        items = json.loads((world_bench / name / filename).read_text())
        assert len(items) == n
        for item in items:
            assert item["bbox_w"] > 0 and item["bbox_h"] > 0
            assert item["bbox_x"] + item["bbox_w"] <= tiny_world["image_size"]
            assert item["bbox_y"] + item["bbox_h"] <= tiny_world["image_size"]
    for piece in ("relations", "foil-it"):
        for item in json.loads((world_bench / "valse" / f"{piece}.json").read_text()).values():
            assert item["caption"] != item["foil"] and item["classes"] and item["classes_foil"]
    long = json.loads((world_bench / "long_retrieval" / "dataset.json").read_text())
    assert all(len(image["sentences"]) == 1 and len(image["sentences"][0]["tokens"]) > 30 for image in long["images"])
    for split in ("train", "test"):
        assert len(list((world_bench / "linear_probe" / split).glob("*/*.png"))) == 7 * 2


def test_every_new_kind_evaluates_on_the_world_files(world_bench: Path, loaded) -> None:
    torch.set_num_threads(1)
    for name, spec in WORLD_SPECS.items():
        result = run_benchmark(loaded, spec, world_bench / name)
        assert result.headline in result.metrics and result.skipped == {}
        assert 0.0 <= result.metrics[result.headline].value <= 1.0
    assert run_benchmark(loaded, WORLD_SPECS["long_retrieval"], world_bench / "long_retrieval").protocol.endswith(
        "long-captions")
