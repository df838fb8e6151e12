"""What the benchmark kinds' tests share: random images and sentences written in the releases' formats, and each
image and text embedded on its own (the plain-loop reference a kind's batched scoring is checked against): zero-shot
top-1 and retrieval R@1 by hand, and the long captions the retrieval tests score."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from compo.models import encode_images, encode_texts

WORDS = ["red", "blue", "green", "cube", "sphere", "cone", "left", "right", "above", "small", "large"]
TIE = 1e-9  # a score must beat another by more than this: a tie counts against the model

LONG = ["A small red cube sits on wet sand next to a large blue sphere under a grey sky, waves behind.",
        "Two green cones stand on a snowy road while a striped cube rests between them in the evening.",
        "A large yellow sphere floats above calm water; a tiny purple cube is left of it near the shore.",
        "An old wooden bench beside a red door, with a striped cat asleep on the bench in the sun."]


def pixels(seed: int, size: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def write_image(path: Path, seed: int, size: int = 48) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels(seed, size)).save(path)


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


def image_vectors(loaded, images: list[Image.Image]) -> torch.Tensor:  # noqa: ANN001
    return encode_images(loaded, images).double()


def text_vectors(loaded, texts: list[str]) -> torch.Tensor:  # noqa: ANN001
    return encode_texts(loaded, texts).double()


def zeroshot_loop(loaded, images: list[Image.Image], labels: list[int], names: list[str],  # noqa: ANN001
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


def r1_loop(loaded, images: list[Path], captions: list[str]) -> tuple[float, float]:  # noqa: ANN001
    """Image->text and text->image R@1 by hand (one caption per image, ties against the model)."""
    v = image_vectors(loaded, [Image.open(p).convert("RGB") for p in images])
    t = text_vectors(loaded, captions)
    s = v @ t.T
    n = len(images)
    i2t = np.mean([all(s[i, i] > s[i, j] + TIE for j in range(n) if j != i) for i in range(n)])
    t2i = np.mean([all(s[j, j] > s[i, j] + TIE for i in range(n) if i != j) for j in range(n)])
    return float(i2t), float(t2i)


# the fixtures in the releases' layouts (tests/fixtures/benchmarks, written from ../shared/benchmarks/README.md)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


def cosine(loaded, image: Path, text: str) -> float:  # noqa: ANN001
    """The cosine of one image file and one text, each embedded on its own."""
    v = encode_images(loaded, [Image.open(image).convert("RGB")]).double()[0]
    return float(v @ encode_texts(loaded, [text]).double()[0])


def whatsup_images(folder: Path) -> set[str]:
    """Every image path What's Up's fixture items name, relative to the image root."""
    from compo.evaluate import whatsup
    from compo.evaluate.files import WHATSUP_FILES

    return {str(item.images[0].relative_to(folder)) for subset, name in WHATSUP_FILES.items()
            for item in whatsup.load_subset(FIXTURES / "whatsup" / name, subset, folder)}


# the fixtures of releases whose annotations could not be copied (tests/fixtures/raw, make_raw_fixtures.py)
RAW = Path(__file__).resolve().parents[1] / "fixtures" / "raw"


def image_text_cosines(loaded, image: Image.Image, texts: list[str]) -> np.ndarray:  # noqa: ANN001
    """The cosines of one image with each of `texts`."""
    return (encode_texts(loaded, texts).double() @ encode_images(loaded, [image]).double()[0]).numpy()


def vl_compo_rows() -> list[tuple[dict[str, str], dict[str, str]]]:
    """vl_compo's released results: (results.csv row, individual_results.csv row) per checkpoint, matched on arch,
    pretrained and family."""
    import csv

    from test_real_benchmarks import REAL

    with open(REAL / "vl_compo" / "individual_results.csv", newline="") as handle:
        individual = {(r["arch"], r["pretrained"], r["family"]): r for r in csv.DictReader(handle)}
    with open(REAL / "vl_compo" / "results.csv", newline="") as handle:
        results = list(csv.DictReader(handle))
    return [(r, individual[key]) for r in results if (key := (r["arch"], r["pretrained"], r["family"])) in individual]
