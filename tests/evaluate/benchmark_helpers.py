"""What the benchmark kinds' tests share: random images and sentences written in the releases' formats, and each
image and text embedded on its own (the plain-loop reference a kind's batched scoring is checked against)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from compo.models import encode_images, encode_texts

WORDS = ["red", "blue", "green", "cube", "sphere", "cone", "left", "right", "above", "small", "large"]


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
