"""Paths read from data or config stay inside their root; names and captions read from files are checked.

One containment rule (issue 43): a path a file or the config gives (a model cache's manifest entry, a
`prefetch --from` model name, a DCI split entry, an image path) is joined to its root and resolved with
symbolic links followed; it must lie inside the root, itself resolved (a root may be a link to shared
storage). `inside` returns the joined path or None, for callers that skip with a count (images);
`contained` raises `OutsideRootError` naming the file, the entry and the root. Both return the path as joined,
not resolved, so paths written to manifests keep the form the user gave.

Two small checks every loader shares: `repeated` (the values given more than once, with their counts) and
`has_visible_text` (a caption holds at least one letter or digit that renders: not only zero-width, direction,
BOM, NUL, Hangul filler or other invisible characters). No torch, no compo imports: the DAG build imports this.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from collections import Counter
from collections.abc import Hashable, Iterable
from pathlib import Path


class OutsideRootError(ValueError):
    """A path read from a file or the config resolves (links followed) outside the root it must stay in."""


def inside(root: str | Path, *parts: str | os.PathLike[str]) -> Path | None:
    """`root` joined with `parts`, or None when that path, symbolic links followed, leaves `root` (through
    "..", an absolute part, or a link pointing elsewhere). The path need not exist."""
    joined = Path(root).joinpath(*parts)
    resolved_root = Path(root).resolve()
    return joined if joined.resolve().is_relative_to(resolved_root) else None


def contained(root: str | Path, *parts: str | os.PathLike[str], source: str, entry: str) -> Path:
    """`root` joined with `parts`, which must stay inside `root` (see `inside`); else OutsideRootError naming
    `source` (the file or option that gave the path), `entry` (the item in it) and the root."""
    joined = inside(root, *parts)
    if joined is None:
        target = Path(root).joinpath(*parts).resolve()
        raise OutsideRootError(f"{source}: {entry}: path {os.path.join(*map(str, parts))!r} resolves to {target}, "
                          f"outside {root}; refused (paths read from files must stay inside their root)")
    return joined


def repeated(values: Iterable[Hashable]) -> dict[Hashable, int]:
    """The values given more than once, each with how often, in first-seen order."""
    counts = Counter(values)
    return {value: n for value, n in counts.items() if n > 1}


# The letters (category Lo) that Unicode marks Default_Ignorable_Code_Point: the Hangul fillers, which render
# as nothing (a caption of U+3164 alone looks empty; issue 59). Every other ignorable character is of a
# category below that is not a letter or digit (Cf, Mn, Cn).
INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")


def has_visible_text(text: str) -> bool:
    """Whether `text` holds a letter or a digit (Unicode categories L* and N*) that renders. Captions made only
    of zero-width spaces, direction marks, byte-order marks, NUL or other control/format characters, of
    the Hangul fillers (INVISIBLE_LETTERS), of blank symbols such as the braille blank U+2800, or of punctuation
    and whitespace, are not text: a reader sees no word in them."""
    return any(unicodedata.category(char)[0] in "LN" and char not in INVISIBLE_LETTERS for char in text)


def private_dir(path: str | Path) -> Path:
    """`path` as a folder only this user can read or write (created with mode 0700): refused when it is a link,
    another user's, or open to others, since what is read back from it would be trusted (staged training shards).
    """
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise OutsideRootError(f"{path}: expected a folder of this user's, found a link or a file; refused")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise OutsideRootError(f"{path}: owned by uid {info.st_uid} with mode {oct(info.st_mode & 0o777)}; a folder "
                               f"whose files are trusted must be this user's (uid {os.getuid()}) with mode 0700")
    return path
