"""Per-caption random streams: the only source of randomness a caption's negatives use.

`caption_rng` depends on the seed and the caption only (offline) or on the seed, the training step and
the caption's manifest row (online), so what a caption draws does not depend on row order, sharding, the
other captions of a batch or a rank's slice of it. The concreteness and negatives stages and training's
batch parts (`compo.batches`) share it (none imports the others).
"""

from __future__ import annotations

import hashlib
import random


def caption_rng(seed: int, caption_id: str | None = None, *, step: int | None = None,
                row: int | None = None, stream: int = 1) -> random.Random:
    """The random stream of one caption:

    * `caption_rng(seed, caption_id)`: the offline negatives stage (and ConcretePlant's keyword choice),
      keyed by the caption id;
    * `caption_rng(seed, step=step, row=row)`: what training draws online at `step` for the caption in
      manifest row `row` (FSC-CLIP's negatives, fresh every step), the same on a resumed run; `stream`
      tells apart independent draws of one caption at one step (NegCLIP's hard image: stream 2).
    """
    if caption_id is not None and step is None and row is None:
        digest = hashlib.sha256(f"{seed}\x00{caption_id}".encode()).digest()
        return random.Random(int.from_bytes(digest[:16], "big"))
    if caption_id is None and step is not None and row is not None:
        import numpy as np  # here: the data stages' DAG-time imports stay light

        generator = np.random.default_rng(np.random.SeedSequence([seed, step, stream, row]))
        return random.Random(int(generator.integers(2**63)))
    raise ValueError("caption_rng: give the caption_id (offline) or step and row (online), not both")
