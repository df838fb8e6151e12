"""sha256 of a file, streaming: a leaf module (compo.layout checks result hashes with it, compo.provenance checkpoint
hashes; provenance imports layout, so the helper cannot live in either)."""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCK = 8 << 20  # read in 8 MiB blocks: a 600 MB ViT-B checkpoint hashes in about a second


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's contents, read streaming."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()
