"""Sections of the reference docs written from the code (config/README's key tables, README's plan): one writer."""

from __future__ import annotations

from pathlib import Path


def replace_between(path: str | Path, begin: str, end: str, body: str) -> bool:
    """Put `body` between the marker lines `begin` and `end` of the file at `path`; True when the file changed.
    Markers missing are an error naming the file and both markers."""
    path = Path(path)
    text = path.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{path}: no section to write (expected the markers {begin} and {end})")
    head, rest = text.split(begin, 1)
    new = f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"
    path.write_text(new)
    return new != text
