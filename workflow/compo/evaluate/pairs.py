"""How hard generated negatives are for a model: seed 002 Table 1's I2T / T2I accuracy on D_hc, D_lc, D_wo.

I2T: for an image, its caption must score strictly higher than the negative caption. T2I: for a caption,
its image must score strictly higher than the negative image (pairs whose negative has an image only).
`concreteplant_table` joins these accuracies with the data statistics of each sampling policy, and
writes the per-pair scores behind them (seed 002 Figure 5 plots their gap against concreteness).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from compo.evaluate.common import TIE_TOLERANCE
from compo.evaluate.scoring import encode_distinct_texts, encode_image_files
from compo.io import atomic_path, read_table
from compo.models import LoadedModel
from compo.negatives.concreteplant import concreteplant_statistics, negative_pairs

log = logging.getLogger(__name__)


PAIR_COLUMNS = ["score_pos", "score_neg", "i2t_correct", "t2i_correct"]
# Pairs scored per chunk: the job holds one chunk's embeddings (float32 as the encoder gives them, at most
# 3 x 16,384 rows of 512: 100 MB), not every distinct text's and image's of the table (seed 002's ~2.3 M texts
# were 9.4 GB in float64; issue 42). A pair's scores depend on its own embeddings only, so chunking changes
# nothing but memory; the products are taken in float64 on the chunk, as before.
PAIR_CHUNK = 16_384


def pair_scores(loaded: LoadedModel, pairs: pd.DataFrame, chunk: int = PAIR_CHUNK) -> pd.DataFrame:
    """Per pair (image_path, caption, negative[, negative_image]) of `pairs`: the model's cosine similarity
    of the image with its caption (score_pos) and with the negative (score_neg), I2T correctness
    (score_pos > score_neg, ties wrong) and T2I correctness (the caption scores its image above the
    negative image; <NA> where the pair has no negative image). Same index as `pairs`. Scored `chunk` pairs at
    a time in image order (an image's pairs together, so it is decoded about once): bounded memory."""
    result = pd.DataFrame(index=pairs.index, columns=PAIR_COLUMNS)
    result = result.astype({"score_pos": "float64", "score_neg": "float64", "i2t_correct": "bool",
                            "t2i_correct": "boolean"})
    if pairs.empty:
        return result
    ordered = pairs.iloc[pairs["image_path"].astype(str).argsort(kind="stable")]
    for start in range(0, len(ordered), chunk):
        part = ordered.iloc[start:start + chunk]
        result.loc[part.index] = _chunk_scores(loaded, part)
    return result


def _chunk_scores(loaded: LoadedModel, pairs: pd.DataFrame) -> pd.DataFrame:
    texts, text_row = encode_distinct_texts(loaded, pairs["caption"].tolist() + pairs["negative"].tolist())
    images = [Path(p) for p in pairs["image_path"]]
    negative_images = [Path(p) for p in pairs.get("negative_image", pd.Series(dtype=object)).dropna()]
    embedded, image_row, failed = encode_image_files(loaded, images + negative_images)
    if failed:
        raise FileNotFoundError(f"unreadable images, e.g. {next(iter(failed))}: {next(iter(failed.values()))}")
    embedded = embedded.double()
    v = embedded[[image_row[p] for p in images]]
    t = texts[[text_row[c] for c in pairs["caption"]]]
    n = texts[[text_row[c] for c in pairs["negative"]]]
    positive, negative = (v * t).sum(-1), (v * n).sum(-1)
    result = pd.DataFrame({"score_pos": positive.numpy(), "score_neg": negative.numpy(),
                           "i2t_correct": (positive > negative + TIE_TOLERANCE).numpy(),
                           "t2i_correct": pd.array([None] * len(pairs), dtype="boolean")}, index=pairs.index)
    with_image = pairs["negative_image"].notna().to_numpy() if "negative_image" in pairs else []
    if len(with_image) and with_image.any():
        keep = torch.tensor(with_image)
        w = embedded[[image_row[Path(p)] for p in pairs.loc[with_image, "negative_image"]]]
        t2i = (t[keep] * v[keep]).sum(-1) > (t[keep] * w).sum(-1) + TIE_TOLERANCE
        result.loc[with_image, "t2i_correct"] = t2i.numpy()
    return result


def pair_accuracy(scores: pd.DataFrame) -> dict[str, Any]:
    """I2T and T2I accuracy (NaN where no pair counts) of `pair_scores`' rows."""
    i2t, t2i = scores["i2t_correct"], scores["t2i_correct"].dropna()
    return {"i2t": float(i2t.mean()) if len(i2t) else float("nan"), "n_i2t": len(i2t),
            "t2i": float(t2i.astype(bool).mean()) if len(t2i) else float("nan"), "n_t2i": len(t2i)}


PAIRS_TABLE_COLUMNS = ["policy", "caption_id", "slot", "keyword", "concreteness", *PAIR_COLUMNS]


def concreteplant_table(concreteness: str | Path, manifest: str | Path, negatives: dict[str, str | Path],
                        model_dir: str | Path, out: str | Path, pairs_out: str | Path | None = None,
                        settings: dict[str, Any] | None = None) -> None:
    """Seed 002 Table 1 for the embedded study: per ConcretePlant dataset (`negatives`: policy -> table),
    the keyword statistics of its policy and the model's I2T / T2I accuracy on its pairs. `pairs_out`
    also gets one row per pair (PAIRS_TABLE_COLUMNS: the changed words "old|new", the negative's
    concreteness from the negatives table, the model's two cosine scores and I2T / T2I correctness):
    seed 002 Figure 5's concreteness vs logit gap. settings: the config's `evaluate:` section (device,
    precision), as evaluation encodes."""
    from compo.evaluate import load_for_evaluation

    statistics = concreteplant_statistics(read_table(concreteness, "concreteness")).set_index("policy")
    frame = read_table(manifest, "manifest")
    loaded = load_for_evaluation(model_dir, settings)
    rows, per_pair = [], []
    for policy, path in sorted(negatives.items()):
        table = read_table(path, "negatives")
        pairs = negative_pairs(table, frame)
        valid = table.loc[table["valid"]]
        pairs["negative_image"] = valid["negative_image"].to_numpy()
        pairs["concreteness"] = valid["concreteness"].to_numpy()
        scores = pair_scores(loaded, pairs)
        accuracy = pair_accuracy(scores)
        log.info("%s (%s): %s", policy, path, accuracy)
        stats = statistics.loc[policy].to_dict() if policy in statistics.index else {}
        rows.append({"policy": policy, "negatives": str(path), **stats, **accuracy})
        per_pair.append(pd.concat([pairs.assign(policy=policy), scores], axis=1)[PAIRS_TABLE_COLUMNS])
    with atomic_path(out) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)
    if pairs_out is not None:
        with atomic_path(pairs_out) as tmp:
            pd.concat(per_pair, ignore_index=True).to_csv(tmp, index=False)
