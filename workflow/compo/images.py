"""Opening the images a table or benchmark lists: paths kept inside their root, files decoded in full.

Shared by the dataset stage (`compo.data`, which drops an image that fails here before training can meet
it) and evaluation (`compo.evaluate`, which skips the item with a count). No torch: the DAG build imports
`compo.data`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from compo.paths import inside

# Reasons an item is skipped (the counts go to the result JSON's "skipped" and to the log).
MISSING_IMAGE = "missing_image"
CORRUPT_IMAGE = "corrupt_image"
OUTSIDE_ROOT = "outside_image_root"  # the item's path leaves its image folder ("../..", an absolute path)


class OutsideRoot(type(Path())):  # type: ignore[misc]  (PosixPath or WindowsPath)
    """An item path that leaves its image root: `open_image` refuses it (skip reason OUTSIDE_ROOT)."""


def item_path(root: Path, *parts: str) -> Path:
    """`root` joined with an item's relative path parts. A result that leaves `root` with symbolic links
    followed (through "..", an absolute part, or a link inside the folder pointing elsewhere; the root itself
    may be a link to shared storage) is returned as an OutsideRoot, which is never read (compo.paths)."""
    joined = inside(root, *parts)
    return OutsideRoot(root.joinpath(*parts)) if joined is None else joined


@dataclass(frozen=True)
class TarMember:
    """An image stored in a tar shard (CLIP_benchmark's webdataset export): read in place by its offset."""

    archive: Path
    name: str
    offset: int
    size: int

    def __str__(self) -> str:
        return f"{self.archive}:{self.name}"

    def read(self) -> bytes:
        with open(self.archive, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read(self.size)
        if len(data) != self.size:
            raise OSError(f"{self}: the shard ends before the member does")
        return data


def open_image(path: Path | TarMember) -> Image.Image | str:
    """The image as RGB, or the skip reason when it is outside its root, missing or cannot be decoded."""
    if isinstance(path, OutsideRoot):
        return OUTSIDE_ROOT
    source: Path | io.BytesIO = path
    if isinstance(path, TarMember):
        try:
            source = io.BytesIO(path.read())
        except OSError:
            return MISSING_IMAGE
    elif not path.is_file():
        return MISSING_IMAGE
    try:
        with Image.open(source) as image:
            return image.convert("RGB")  # convert() decodes fully, so truncated files fail here
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return CORRUPT_IMAGE
