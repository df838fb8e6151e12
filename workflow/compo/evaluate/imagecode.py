"""ImageCoDe (Krojer et al., 2022): pick, from ten near-identical images (video frames or static images), the one
a description was written for.

File: `{benchmark_dir}/{spec["file"] or "valid_data.json"}` as released (github.com/McGill-NLP/imagecode
`data/valid_data.json`): `{"<image set folder>": {"<target index 0-9>": description}}`. The images are the
`img<N>.jpg` files of `{spec["image_root"] or benchmark_dir/images}/<image set folder>` (Zenodo `image-sets.zip`),
ordered by N (a video set's N is the frame number) as the release's `baselines/clip/zero_shot.py` orders them; the
target index is a position in that order. Sets whose folder starts "open-images" are the static subset, the others
the video subset (vl_compo's `imagecode::static` / `imagecode::videos`).

Text-to-image top-1: a description is correct iff its target scores highest among the set's ten images. The
released script takes `(-similarity).argsort()[0]`, so a tie goes to the image earliest in the order: `overall`,
`videos`, `static` follow it (headline `overall`: the item-level accuracy, vl_compo's `imagecode` column). The
project's strict rule (a tie counts against the model) gives `*_strict`, and the predictions' `rank`. A set whose
folder is missing is skipped (its descriptions counted as missing_image); a folder without exactly ten
`img<N>.jpg` files is an error naming it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compo.evaluate.candidates import RELEASED, Item, accuracies, accuracy, run_items
from compo.evaluate.common import (
    MISSING_IMAGE,
    BenchmarkError,
    BenchmarkResult,
    image_root,
    item_path,
    read_json_file,
    require_text,
)
from compo.evaluate.files import IMAGECODE_FILE
from compo.evaluate.kinds import Benchmark, BenchmarkSize, Key, stored_only

if TYPE_CHECKING:
    from compo.models import LoadedModel

PROTOCOL = "imagecode-t2i-top1"
SET_SIZE = 10
SUBSETS = ("videos", "static")
IMAGE_NAME = re.compile(r"img([0-9]+)\.jpg")  # ASCII digits: \d takes any script's


def subset_of(image_set: str) -> str:
    """The release's split of its sets: 'open-images' in the folder name is static, anything else video."""
    return "static" if "open-images" in image_set else "videos"


def load_descriptions(path: Path) -> list[tuple[str, int, str]]:
    """(image set folder, target index, description) of every description, in file order."""
    data = read_json_file(path, "ImageCoDe descriptions file")
    if not isinstance(data, dict) or not data:
        raise BenchmarkError(f"{path}: expected a non-empty object {{image set folder: {{target index: description}}}}")
    items = []
    for image_set, described in data.items():
        if not isinstance(described, dict) or not described:
            raise BenchmarkError(f"{path}: set {image_set!r}: expected a non-empty object "
                                 "{target index: description}")
        for index, text in described.items():
            # ASCII digits only: "²".isdigit() is true and int() refuses it; int() reads "٣" (Arabic-Indic) as 3
            if not (index.isascii() and index.isdecimal() and int(index) < SET_SIZE):
                raise BenchmarkError(f"{path}: set {image_set!r}: target index {index!r} is not 0-{SET_SIZE - 1} "
                                     "(ASCII digits)")
            items.append((image_set, int(index), require_text(text, f"{path}: set {image_set!r}", index)))
    return items


def set_images(folder: Path) -> list[Path] | None:
    """The set's images in the released order (by the number in img<N>.jpg); None when the folder is missing."""
    if not folder.is_dir():
        return None
    found = sorted(folder.glob("*.jpg"), key=lambda p: int(m.group(1)) if (m := IMAGE_NAME.fullmatch(p.name)) else -1)
    names = [p.name for p in found]
    if len(found) != SET_SIZE or not all(IMAGE_NAME.fullmatch(n) for n in names):
        raise BenchmarkError(f"{folder}: expected {SET_SIZE} images named img<N>.jpg, found {len(found)}: "
                             f"{', '.join(names[:12])}")
    return found


def items_of(benchmark_dir: Path, spec: dict[str, Any]) -> list[Item]:
    """Every description, with its set's ten images as candidates (the target right); a description whose set
    folder is missing is left out, counted as missing_image."""
    root = image_root(spec, benchmark_dir)
    descriptions = load_descriptions(release_files(spec, benchmark_dir)[0])
    images = {s: set_images(item_path(root, s)) for s in dict.fromkeys(s for s, _, _ in descriptions)}
    return [Item(subset_of(image_set), f"{image_set}/{target}", tuple(images[image_set] or ()), (text.strip(),),
                 (target,), skip=MISSING_IMAGE if images[image_set] is None else None)
            for image_set, target, text in descriptions]


def run(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
        templates: list[str] | None = None) -> BenchmarkResult:
    # the released argsort(-scores)[0]: a tie goes to the earlier image
    return run_items(loaded, items_of(benchmark_dir, spec), benchmark="imagecode", protocol=PROTOCOL,
                     headline="overall", files=release_files(spec, benchmark_dir)[0], ties_to_first=True,
                     metrics=lambda predictions, items: {"overall": accuracy(predictions, RELEASED),
                                                         "overall_strict": accuracy(predictions),
                                                         **accuracies(predictions)})


def release_files(spec: dict[str, Any], folder: Path) -> list[Path]:
    return [folder / (spec.get("file") or IMAGECODE_FILE)]


def image_paths(spec: dict[str, Any], folder: Path) -> list[Path]:
    """The images of every set a description names (a set whose folder is missing has none to compare)."""
    return list(dict.fromkeys(image for item in items_of(folder, spec) for image in item.images))


RELEASED_SETS, RELEASED_DESCRIPTIONS = 1_039, 2_302  # valid_data.json: ten images a set

BENCHMARKS = (
    Benchmark(kind="imagecode", source="github.com/McGill-NLP/imagecode data/valid_data.json; "
              "baselines/clip/zero_shot.py's top-1",
              run=run, files=release_files, images=image_paths,
              size=lambda spec: BenchmarkSize(SET_SIZE * RELEASED_SETS, RELEASED_DESCRIPTIONS, 0),
              headline="overall", subsets=("videos", "static"), chance=1 / SET_SIZE,
              selections=stored_only,
              downloads=lambda spec: {"path": 'github.com/McGill-NLP/imagecode data/; valid_data.json',
                                      "image_root": 'zenodo.org/record/6518944 image-sets.zip; <set>/imgN.jpg'},
              keys={"file": Key({"type": ["string", "null"]}, f"the labelled file (default `{IMAGECODE_FILE}`)")}),
)
