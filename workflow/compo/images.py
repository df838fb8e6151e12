"""Opening the images a table or benchmark lists: paths kept inside their root, files decoded in full.

Shared by the dataset stage (`compo.data`, which drops an image that fails here before training can meet
it) and evaluation (`compo.evaluate`, which skips the item with a count). No torch: the DAG build imports
`compo.data`. An image path may name a member of a webdataset tar shard (`<shard>.tar#<member>`,
compo.shards): opened by random access into the shard; an image stored in a zip archive (ELEVATER's releases,
`ZipMember`) likewise.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ZipMember:
    """An image stored in a zip archive, read in place: one seek past its local header and one read (inflated
    when deflated), so no per-process zip handle is kept. offset -1: the archive does not hold it."""

    archive: Path
    name: str
    offset: int           # the member's local header
    size: int             # its stored (compressed) size
    method: int           # zipfile.ZIP_STORED or ZIP_DEFLATED (others are read through zipfile)

    def __str__(self) -> str:
        return f"{self.archive}@{self.name}"

    def read(self) -> bytes:
        if self.offset < 0:
            raise FileNotFoundError(f"{self}: the archive has no such member")
        if self.method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            with zipfile.ZipFile(self.archive) as archive:
                return archive.read(self.name)
        with open(self.archive, "rb") as handle:
            handle.seek(self.offset)
            header = handle.read(30)
            if len(header) != 30 or header[:4] != b"PK\x03\x04":
                raise OSError(f"{self}: no local file header at offset {self.offset}")
            name_length, extra_length = struct.unpack("<HH", header[26:30])
            handle.seek(name_length + extra_length, io.SEEK_CUR)
            data = handle.read(self.size)
        if len(data) != self.size:
            raise OSError(f"{self}: the archive ends before the member does")
        try:
            return data if self.method == zipfile.ZIP_STORED else zlib.decompress(data, -15)
        except zlib.error:
            return b""  # a damaged deflate stream: no image bytes, so it is counted corrupt, not missing


def zip_members(archive: Path) -> dict[str, ZipMember]:
    """Every file member of a zip archive by name (its central directory, read once). OSError or
    zipfile.BadZipFile when it is missing or not a zip, or names a member twice (zipfile would read the last:
    which image an item means is unknown)."""
    members: dict[str, ZipMember] = {}
    with zipfile.ZipFile(archive) as handle:
        for info in handle.infolist():
            if info.is_dir():
                continue
            if info.filename in members:
                raise zipfile.BadZipFile(f"{archive}: member {info.filename!r} is stored twice; expected each "
                                         "name once")
            members[info.filename] = ZipMember(archive, info.filename, info.header_offset, info.compress_size,
                                               info.compress_type)
    return members


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


def image_source(path: str | Path | TarMember | ZipMember) -> Path | io.BytesIO:
    """What PIL opens for an image path: the file itself, or the bytes of a shard's or zip's member (a
    `<shard>.tar#<member>` path, compo.shards). OSError (FileNotFoundError) when it is not there."""
    if isinstance(path, TarMember | ZipMember):
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


def open_image(path: str | Path | TarMember | ZipMember) -> Image.Image | str:
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
