"""Opening the images a table or benchmark lists: paths kept inside their root, files decoded in full.

Shared by the dataset stage (`compo.data`, which drops an image that fails here before training can meet
it) and evaluation (`compo.evaluate`, which skips the item with a count). No torch: the DAG build imports
`compo.data`. An image path may name a member of a webdataset tar shard (`<shard>.tar#<member>`,
compo.shards): opened by random access into the shard.
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from compo.paths import inside
from compo.shards import TarMember, open_member, split_member

# Reasons an item is skipped (the counts go to the result JSON's "skipped" and to the log).
MISSING_IMAGE = "missing_image"
CORRUPT_IMAGE = "corrupt_image"
# more pixels than PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS x 2): not decoded, reported as such
OVERSIZED_IMAGE = "image_over_pil_pixel_limit"
OUTSIDE_ROOT = "outside_image_root"  # the item's path leaves its image folder ("../..", an absolute path)


class OutsideRoot(type(Path())):  # type: ignore[misc]  (PosixPath or WindowsPath)
    """An item path that leaves its image root: `open_image` refuses it (skip reason OUTSIDE_ROOT)."""


def item_path(root: Path, *parts: str) -> Path:
    """`root` joined with an item's relative path parts. A result that leaves `root` with symbolic links
    followed (through "..", an absolute part, or a link inside the folder pointing elsewhere; the root itself
    may be a link to shared storage) is returned as an OutsideRoot, which is never read (compo.paths).
    A shard member (`<shard>.tar#<member>`, compo.shards) passes the same rule with its shard."""
    member = split_member(Path(*parts)) if parts else None
    if member is not None:
        archive, name = member
        joined = inside(root, archive)
        return OutsideRoot(f"{root.joinpath(archive)}#{name}") if joined is None else Path(f"{joined}#{name}")
    joined = inside(root, *parts)
    return OutsideRoot(root.joinpath(*parts)) if joined is None else joined


def image_source(path: str | Path | TarMember) -> Path | io.BytesIO:
    """What PIL opens for an image path: the file itself, or the bytes of a shard's member (a
    `<shard>.tar#<member>` path, compo.shards). OSError (FileNotFoundError) when it is not there."""
    if isinstance(path, TarMember):
        return io.BytesIO(path.read())
    if split_member(path) is not None:
        return io.BytesIO(open_member(path).read())
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such image file")
    return Path(path)


def image_exists(path: str | Path) -> bool:
    """Whether the image file, or the shard member a member path names, is there."""
    return image_size(path) >= 0 if split_member(path) is not None else Path(path).is_file()


def image_size(path: str | Path) -> int:
    """The stored size in bytes of an image file or shard member, -1 when it is not there."""
    try:
        if split_member(path) is not None:
            return open_member(path).size
        return Path(path).stat().st_size
    except OSError:
        return -1


def open_image(path: str | Path | TarMember) -> Image.Image | str:
    """The image as RGB, or the skip reason when it is outside its root, missing or cannot be decoded."""
    if isinstance(path, OutsideRoot):
        return OUTSIDE_ROOT
    try:
        source = image_source(path)
    except OSError:
        return MISSING_IMAGE
    if isinstance(source, Path) and source.suffix == ".npy":
        return _npy_frame(source)
    try:
        with Image.open(source) as image:
            return image.convert("RGB")  # convert() decodes fully, so truncated files fail here
    except Image.DecompressionBombError:
        return OVERSIZED_IMAGE
    except (OSError, ValueError, SyntaxError):
        return CORRUPT_IMAGE


def _npy_frame(path: Path) -> Image.Image | str:
    """A video frame saved as a numpy array in OpenCV's BGR order (EqBen's YouCook2 frames, read by its
    release as `Image.fromarray(np.load(path)[:, :, [2, 1, 0]])`); never unpickled."""
    import numpy as np

    try:
        frame = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return CORRUPT_IMAGE
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        return CORRUPT_IMAGE
    return Image.fromarray(np.ascontiguousarray(frame[:, :, ::-1]), "RGB")
