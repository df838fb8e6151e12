"""The candidate scorer every "pick the right caption (or image)" benchmark reads into (compo.evaluate.candidates):
similarities against a plain loop in both directions, ties against the model (and the released first-maximum rule
beside it), skip counts, an emptied subset's error naming its file, a diverged model's error, and the metrics.
The kinds' own tests check their readers; the image-skip path and a repeated item are tested here once for all of
them."""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from benchmark_helpers import FIXTURES, whatsup_images
from PIL import Image
from test_real_benchmarks import placeholders

from compo.evaluate import run_benchmark
from compo.evaluate.candidates import (
    RELEASED,
    Item,
    Scored,
    accuracies,
    accuracies_and_mean,
    macro,
    pick,
    run_items,
    score_items,
)
from compo.evaluate.common import CroppedImage, Metric
from compo.evaluate.files import SPEC_SUBSETS, WHATSUP_FILES, BenchmarkError
from compo.models import NonFiniteEmbeddings, create_model, encode_images, encode_texts, load_model, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def write_images(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(n):
        pixels = np.random.default_rng(k).integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{k}.png")
        paths.append(folder / f"{k}.png")
    return paths


def hand_scored(rows: list[list[float]], items: list[Item]) -> Scored:
    """Items scored by hand: row n holds item n's candidate similarities (its texts', or with one text its
    images')."""
    width = max(len(row) for row in rows)
    scores = torch.full((len(rows), width, width), -torch.inf, dtype=torch.float64)
    for n, (row, item) in enumerate(zip(rows, items, strict=True)):
        values = torch.tensor(row, dtype=torch.float64)
        if item.image_to_text:
            scores[n, : len(row), 0] = values
        else:
            scores[n, 0, : len(row)] = values
    return Scored(items, scores, Counter(), torch.empty(0, 0), {})


def test_similarities_equal_a_plain_loop_in_both_directions_and_any_chunk(tmp_path: Path, loaded) -> None:
    images = write_images(tmp_path / "images", 4)
    texts = ["a red cube", "a blue ball", "a cube left of a ball", "two green cones", "a small cube"]
    items = [Item("a", "0", (images[0],), (texts[0], texts[1])),                       # image to text
             Item("a", "1", (images[1],), (texts[2], texts[3], texts[4]), right=(2,)),  # three candidates
             Item("b", "2", (images[2], images[3], images[0]), (texts[1],), right=(1,)),  # text to image
             Item("b", "3", (CroppedImage(images[3], (16, 8, 40, 30)),), (texts[0], texts[4])),  # a padded crop
             Item("c", "4", (images[1],), (texts[0], texts[1], texts[2]), right=(0, 1))]  # both must win
    scored = score_items(loaded, items, benchmark="toy", files=tmp_path / "toy.json")
    one_at_a_time = score_items(loaded, items, benchmark="toy", files=tmp_path / "toy.json", chunk=1)
    assert torch.equal(scored.scores, one_at_a_time.scores)  # a row's sum does not depend on its neighbours

    def embed(image: Path | CroppedImage) -> torch.Tensor:
        if isinstance(image, CroppedImage):
            opened = Image.open(image.path).convert("RGB").crop(image.box)
        else:
            opened = Image.open(image).convert("RGB")
        return encode_images(loaded, [opened]).double()[0]

    predictions = pick(scored)
    for n, item in enumerate(items):
        cosines = [float(embed(image) @ encode_texts(loaded, [text]).double()[0])
                   for image in item.images for text in item.texts]
        true = min(cosines[k] for k in item.right)
        wrong = [c for k, c in enumerate(cosines) if k not in item.right]
        row = predictions.iloc[n]
        assert row["score_pos"] == pytest.approx(true, abs=1e-6)
        assert row["score_neg"] == pytest.approx(max(wrong), abs=1e-6)
        assert row["rank"] == 1 + sum(c >= true for c in wrong) and row["correct"] == (row["rank"] == 1)
    assert list(predictions.columns) == ["subset", "item", "correct", "score_pos", "score_neg", "rank"]
    assert predictions["rank"].dtype == np.int64 and predictions["correct"].dtype == bool


def test_ties_count_against_the_model_and_the_first_maximum_rule_beside_them() -> None:
    items = [Item("s", "tie, right first", ("i",), ("a", "b", "c")),
             Item("s", "tie, right second", ("i",), ("a", "b", "c"), right=(1,)),
             Item("s", "clear", ("i",), ("a", "b", "c"), right=(2,)),
             Item("s", "rounding noise", ("i",), ("a", "b")),
             Item("s", "text to image", ("i", "j", "k"), ("a",), right=(2,))]
    rows = [[0.3, 0.3, 0.1], [0.3, 0.3, 0.1], [0.1, 0.2, 0.9], [0.5, 0.5 - 1e-12], [0.5, 0.4, 0.5]]
    predictions = pick(hand_scored(rows, items), ties_to_first=True)
    assert predictions["rank"].tolist() == [2, 2, 1, 2, 2]  # a tie (within TIE_TOLERANCE) loses
    # a released argmax takes the first maximum: the tie is right for the candidate listed first only
    assert predictions[RELEASED].tolist() == [True, False, True, True, False]
    assert predictions["score_neg"].tolist() == [0.3, 0.3, 0.2, 0.5 - 1e-12, 0.5]

    both = [Item("s", str(k), ("i",), ("p", "q", "n"), right=(0, 1)) for k in range(2)]
    weakest = pick(hand_scored([[0.9, 0.4, 0.5], [0.9, 0.6, 0.5]], both))
    assert weakest["score_pos"].tolist() == [0.4, 0.6] and weakest["rank"].tolist() == [2, 1]
    with pytest.raises(ValueError, match="first-maximum rule ranks one right candidate"):
        pick(hand_scored([[0.9, 0.4, 0.5]], both[:1]), ties_to_first=True)
    square = Item("s", "2x2", ("i", "j"), ("a", "b"))
    with pytest.raises(ValueError, match="several images and several texts is judged by its kind"):
        pick(Scored([square], torch.zeros(1, 2, 2, dtype=torch.float64), Counter(), torch.empty(0, 0), {}))


def test_unreadable_and_left_out_items_are_counted_and_named(tmp_path: Path, loaded, caplog) -> None:
    images = write_images(tmp_path / "images", 2)
    (tmp_path / "images" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    items = [Item("a", "0", (images[0],), ("a red cube", "a blue cube")),
             Item("a", "1", (tmp_path / "images" / "gone.png",), ("a red cube", "a blue cube")),
             Item("a", "2", (images[1],), ("a red cube", "a blue cube"), skip="not_validated"),
             Item("b", "3", (images[0], tmp_path / "images" / "corrupt.png"), ("a cone",)),
             Item("b", "4", (images[1], images[0]), ("a cone",), right=(1,))]
    with caplog.at_level(logging.WARNING):
        result = run_items(loaded, items, benchmark="toy", protocol="p", headline="mean", files=tmp_path / "t.json",
                           skipped={"missing_annotation_file": 2})
    assert result.skipped == {"missing_image": 1, "not_validated": 1, "corrupt_image": 1,
                              "missing_annotation_file": 2}
    assert result.predictions["item"].tolist() == ["0", "4"]
    assert result.metrics["a"].n == 1 and result.metrics["b"].n == 1 and result.metrics["mean"].n == 2
    assert "toy: skipped 1 item(s): corrupt_image (e.g. b/3 (" in caplog.text and "corrupt.png" in caplog.text
    assert f"toy: skipped 1 item(s): not_validated (e.g. a/2 ({images[1]}))" in caplog.text


def test_a_subset_left_without_items_is_an_error_naming_its_file(tmp_path: Path, loaded) -> None:
    images = write_images(tmp_path / "images", 1)
    gone = tmp_path / "images" / "gone.png"
    items = [Item("a", "0", (images[0],), ("a red cube", "a blue cube")),
             Item("b", "1", (gone,), ("a red cube", "a blue cube")),
             Item("b", "2", (images[0],), ("a red cube", "a blue cube"), skip="not_validated")]
    files = {"a": tmp_path / "a.json", "b": tmp_path / "b.json"}
    with pytest.raises(BenchmarkError, match=r"b\.json: no toy item of 'b' left to score: every item's image is "
                                             r"missing or unreadable, or the item left out \(missing_image: 1, "
                                             r"not_validated: 1\)"):
        score_items(loaded, items, benchmark="toy", files=files)
    # one file for every subset: an emptied subset is left out, an emptied benchmark is the error
    kept = score_items(loaded, items, benchmark="toy", files=tmp_path / "t.json").items
    assert [item.subset for item in kept] == ["a"]
    with pytest.raises(BenchmarkError, match=r"t\.json: no toy item left to score: .*\(missing_image: 1\)"):
        score_items(loaded, items[1:2], benchmark="toy", files=tmp_path / "t.json")


def test_a_diverged_model_is_an_error_never_a_score(tmp_path: Path) -> None:
    """NaN embeddings compare as neither a win nor a loss: the scorer stops (compo.models.finite), naming them."""
    model = create_model("compo-tiny-clip", "scratch", seed=0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    save_checkpoint(model, "compo-tiny-clip", tmp_path / "nan-model")
    images = write_images(tmp_path / "images", 1)
    with pytest.raises(NonFiniteEmbeddings, match="image embeddings are NaN or infinite"):
        score_items(load_model(tmp_path / "nan-model"), [Item("a", "0", (images[0],), ("a", "b"))], benchmark="toy",
                    files=tmp_path / "t.json")


def test_subset_accuracies_and_their_macro_mean() -> None:
    predictions = pd.DataFrame({"subset": ["x", "x", "x", "y"], "correct": [True, False, False, True],
                                RELEASED: [True, True, False, True]})
    strict = accuracies(predictions.drop(columns=RELEASED))
    assert strict == {"x": Metric(1 / 3, 3), "y": Metric(1.0, 1)}
    assert accuracies_and_mean(predictions.drop(columns=RELEASED), [])["mean"] == Metric((1 / 3 + 1) / 2, 4)
    # with a released rule, `<subset>` is its accuracy and `<subset>_strict` the project's
    assert accuracies(predictions) == {"x": Metric(2 / 3, 3), "x_strict": Metric(1 / 3, 3), "y": Metric(1.0, 1),
                                       "y_strict": Metric(1.0, 1)}
    assert macro([Metric(0.5, 2), Metric(1.0, 6)]) == Metric(0.75, 8)
    assert macro([Metric(0.5, 2), Metric(1.0, 6)], n=7) == Metric(0.75, 7)


# --- an item a release file repeats, in each loader that reads such files (issue 59) ----------------------------

def _repeat_first_item(path: Path) -> None:
    """The release file `path` with its first item given again at its end."""
    if path.suffix == ".csv":
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join([*lines, lines[1] if lines[-1].endswith("\n") else "\n" + lines[1]]))
    else:
        items = json.loads(path.read_text())
        path.write_text(json.dumps([*items, items[0]]))


@pytest.mark.parametrize("kind, repeated", [("whatsup", WHATSUP_FILES["WhatsUp_A"]), ("whatsup", WHATSUP_FILES[
    "COCO_QA_ONE"]), ("spec", "count/image2text.json"), ("spec", "existence/text2image.json"),
    ("svo_probes", "svo_probes.csv")])
def test_an_item_given_twice_is_scored_once_and_counted(tmp_path: Path, loaded, kind: str, repeated: str) -> None:
    """Issue 59: an item a release file gives twice was scored twice (an extra item in its accuracy). Now the repeat
    is left out, counted as `repeated_item`: every metric equals the file's without the repeat, to the digit."""
    folder = tmp_path / kind
    shutil.copytree(FIXTURES / kind, folder)
    spec = {"kind": kind, "source": "files"}
    if kind == "whatsup":
        placeholders(folder / "images", whatsup_images(folder / "images"))
    elif kind == "spec":
        placeholders(folder, {f"{s}/images/{k}_{j}.jpg" for s in SPEC_SUBSETS for k in (0, 1) for j in (0, 1, 2)})
    else:
        placeholders(tmp_path / "images", {f"{k}.jpg" for k in range(1, 11)})
        spec["image_root"] = str(tmp_path / "images")
    before = run_benchmark(loaded, spec, folder)
    _repeat_first_item(folder / repeated)
    after = run_benchmark(loaded, spec, folder)
    assert before.skipped == {} and after.skipped == {"repeated_item": 1}
    assert after.metrics == before.metrics
    pd.testing.assert_frame_equal(after.predictions, before.predictions)
