"""How hard generated negatives are for a model: seed 002 Table 1's I2T / T2I accuracy on D_hc, D_lc, D_wo.

I2T: for an image, its caption must score strictly higher than the negative caption. T2I: for a caption,
its image must score strictly higher than the negative image (pairs whose negative has an image only).
`concreteplant_table` joins these accuracies with the data statistics of each sampling policy.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from compo.evaluate.common import TIE_TOLERANCE, encode_distinct_texts, encode_image_files
from compo.io import atomic_path, read_table
from compo.models import LoadedModel
from compo.negatives.concreteplant import concreteplant_statistics, negative_pairs

log = logging.getLogger(__name__)


def pair_accuracy(loaded: LoadedModel, pairs: pd.DataFrame) -> dict[str, Any]:
    """I2T and T2I accuracy (ties wrong) of `loaded` on (image_path, caption, negative[, negative_image])."""
    if pairs.empty:
        return {"i2t": float("nan"), "n_i2t": 0, "t2i": float("nan"), "n_t2i": 0}
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
    i2t = ((v * t).sum(-1) > (v * n).sum(-1) + TIE_TOLERANCE).double()
    result = {"i2t": float(i2t.mean()), "n_i2t": len(pairs)}
    with_image = pairs["negative_image"].notna().to_numpy() if "negative_image" in pairs else []
    if len(with_image) and with_image.any():
        keep = torch.tensor(with_image)
        w = embedded[[image_row[Path(p)] for p in pairs.loc[with_image, "negative_image"]]]
        t2i = ((t[keep] * v[keep]).sum(-1) > (t[keep] * w).sum(-1) + TIE_TOLERANCE).double()
        result.update(t2i=float(t2i.mean()), n_t2i=int(keep.sum()))
    else:
        result.update(t2i=float("nan"), n_t2i=0)
    return result


def concreteplant_table(concreteness: str | Path, manifest: str | Path, negatives: dict[str, str | Path],
                        model_dir: str | Path, out: str | Path, settings: dict[str, Any] | None = None) -> None:
    """Seed 002 Table 1 for the embedded study: per ConcretePlant dataset (`negatives`: policy -> table),
    the keyword statistics of its policy and the model's I2T / T2I accuracy on its pairs.
    settings: the config's `evaluate:` section (device, precision), as evaluation encodes."""
    from compo.evaluate import load_for_evaluation

    statistics = concreteplant_statistics(read_table(concreteness, "concreteness")).set_index("policy")
    frame = read_table(manifest, "manifest")
    loaded = load_for_evaluation(model_dir, settings)
    rows = []
    for policy, path in sorted(negatives.items()):
        table = read_table(path, "negatives")
        pairs = negative_pairs(table, frame)
        pairs["negative_image"] = table.loc[table["valid"], "negative_image"].to_numpy()
        accuracy = pair_accuracy(loaded, pairs)
        log.info("%s (%s): %s", policy, path, accuracy)
        stats = statistics.loc[policy].to_dict() if policy in statistics.index else {}
        rows.append({"policy": policy, "negatives": str(path), **stats, **accuracy})
    with atomic_path(out) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)
