"""compo_tools.measure and tools/measure_captions.py (issue 45, item 1): caption features and draw kinds on
hand-written captions with known answers, and the script on a small world beside a fixture SugarCrepe folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from helpers import load_script

from compo.negatives.base import Negative
from compo.negatives.swap import NegClipSwap
from compo_tools.measure import (
    ATT_BETWEEN,
    ATT_WITHIN,
    FRAMING,
    OBJECT_SWAP,
    RELATION_SWAP,
    SHUFFLE,
    caption_features,
    caption_set_features,
    draw_kind,
    measure_generator,
)

REPO = Path(__file__).resolve().parents[1]


def _swap(parser, caption: str, negative: str):  # noqa: ANN001, ANN202 - a Parser; (ParsedCaption, Negative)
    """The caption parsed and its NegCLIP swap negative with the text `negative` (made by the real generator)."""
    parsed = parser.parse_text(caption)
    found = [n for ns in NegClipSwap().propose(parsed).by_type.values() for n in ns if n.text == negative]
    assert found, f"NegCLIP's swap makes no {negative!r} from {caption!r}"
    return parsed, found[0]


@pytest.mark.parametrize(("caption", "negative", "kind"), [
    ("a red circle and a blue square", "a blue circle and a red square", ATT_BETWEEN),
    ("a large red star", "a red large star", ATT_WITHIN),
    ("a red circle and a blue square", "a blue square and a red circle", OBJECT_SWAP),
    ("a cat and a dog", "a dog and a cat", OBJECT_SWAP),
    ("a red circle above a blue square", "a blue square above a red circle", RELATION_SWAP),
    ("A man is riding a horse.", "A horse is riding a man.", RELATION_SWAP),
    ("a photo of a red star", "a star of a red photo", FRAMING),
    ("a small striped star in a calm mood", "a small striped mood in a calm star", FRAMING),
])
def test_swap_draws_are_classified_by_what_moved(parser, caption: str, negative: str, kind: str) -> None:  # noqa: ANN001
    assert draw_kind(*_swap(parser, caption, negative)) == kind


def test_replacements_and_shuffles_are_classified_by_the_changed_span(parser) -> None:  # noqa: ANN001
    parsed = parser.parse_text("a photo of a red circle above a blue square")  # tokens: a photo of a red circle ...
    assert parsed.tokens[4] == "red" and parsed.tokens[5] == "circle" and parsed.tokens[6] == "above"
    kinds = {span: draw_kind(parsed, Negative("x", "replace", "y|z", (span,)))
             for span in ((4, 5), (5, 6), (6, 7), (1, 2), (0, len(parsed.tokens)))}
    assert kinds == {(4, 5): "attribute replace", (5, 6): "object replace", (6, 7): "relation replace",
                     (1, 2): FRAMING, (0, len(parsed.tokens)): SHUFFLE}


def test_features_of_three_captions(parser) -> None:  # noqa: ANN001
    parsed = parser.parse_texts([
        "a photo of a red circle to the left of a blue square on the grass",  # 3 objects, 2 attributed, 2 relations
        "A man riding a horse on a beach.",                                   # 3 objects, riding and on
        "a lovely picture of a plate of food",                                # picture: framing; "of": no relation
    ])
    got = [caption_features(p) for p in parsed]
    assert [(f.objects, f.attributed_objects, f.relations) for f in got] == [(3, 2, 2), (3, 0, 2), (2, 0, 0)]
    summary = caption_set_features(parsed)
    assert summary.captions == 3 and summary.two_attributed == pytest.approx(1 / 3)
    assert summary.with_relation == pytest.approx(2 / 3) and summary.objects == pytest.approx(8 / 3)
    with pytest.raises(ValueError, match="empty"):
        caption_set_features([])


def test_a_caption_weighs_one_split_among_its_draws(parser) -> None:  # noqa: ANN001
    """Two captions: one with three swaps (a third each), one with none (not counted); truth from the callable."""
    parsed = parser.parse_texts(["a red circle and a blue square", "a circle"])
    measure = measure_generator(NegClipSwap(), parsed, [random.Random(0), random.Random(1)], 3,
                                truth=lambda row, text: "false" if text.startswith("a blue circle") else "true")
    assert measure.captions_with_draw == 1
    assert dict(measure.kinds) == pytest.approx({ATT_BETWEEN: 1 / 3, OBJECT_SWAP: 2 / 3})
    assert measure.share(measure.truth, "false") == pytest.approx(1 / 3)


def _script():  # noqa: ANN202 - the script as a module
    return load_script("tools/measure_captions.py")


def test_script_prints_the_world_beside_coco(tmp_path: Path, parser, capsys) -> None:  # noqa: ANN001
    """A small world (--limit) generated in a temporary folder beside a fixture SugarCrepe folder: both columns,
    the world's truth, COCO's untestable truth, and the same table in --out."""
    from compo.evaluate.sugarcrepe import SUBSETS

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["results"] = str(tmp_path / "results")  # empty: the script builds the world itself
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    folder = tmp_path / "sugarcrepe"
    folder.mkdir()
    positives = ["A man riding a horse on a beach.", "a red bus parked next to a white car"]
    for subset in SUBSETS:
        items = {str(i): {"filename": f"{i}.jpg", "caption": text, "negative_caption": "a cat"}
                 for i, text in enumerate(positives)}
        (folder / f"{subset}.json").write_text(json.dumps(items))
    out = tmp_path / "table.md"
    _script().main(["--configfile", str(config_path), "--sugarcrepe", str(folder), "--limit", "6",
                    "--out", str(out), "--negatives", "swap", "shuffle"])  # WordNet's load (9 s) left out
    printed = capsys.readouterr().out
    table = out.read_text()
    assert table in printed
    assert "| feature | world (6 captions) | COCO (2 captions) |" in table
    assert "| captions with a relation mention |" in table and "| 100.0 % |" in table.split("relation mention")[1]
    truth = [line for line in table.splitlines() if line.startswith("| swap: false of the image")]
    assert len(truth) == 1 and truth[0].endswith("| untestable (no scene) |") and "%" in truth[0]
    assert "**shuffle** (bigram-shuffle, k=1)" in table and "degla" not in table
    # without --sugarcrepe the COCO column says so
    _script().main(["--configfile", str(config_path), "--limit", "3", "--negatives", "swap"])
    assert "not given (--sugarcrepe)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--negatives random: not a rule generator"):
        _script().main(["--configfile", str(config_path), "--negatives", "random"])
