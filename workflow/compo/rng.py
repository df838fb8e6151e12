"""Per-caption random streams for the data stages (keyword choice, negatives).

`caption_rng(seed, caption_id)` depends on the seed and the caption only, so what a caption draws does
not depend on row order or sharding; the concreteness and negatives stages share it (neither imports
the other). Training batches have their own per-(step, row) streams (`compo.batches`).
"""

from __future__ import annotations

import hashlib
import random


def caption_rng(seed: int, caption_id: str) -> random.Random:
    """An RNG for one caption from (seed, caption_id): results do not depend on row order or sharding."""
    digest = hashlib.sha256(f"{seed}\x00{caption_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))
