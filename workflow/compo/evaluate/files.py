"""The files that define a benchmark of each kind, in the real benchmarks' layouts (no torch: the
Snakemake rules list them as evaluation inputs while the DAG is built, and the loaders read them).
"""

from __future__ import annotations

from typing import Any


class BenchmarkError(ValueError):
    """A benchmark file is malformed; the message names the file and the item."""


SUGARCREPE_SUBSETS = ("replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att")
SUGARCREPE_PP_SUBSETS = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
CLASSNAMES = "classnames.json"         # zero-shot and linear probe: {folder: class name}
DATASET_JSON = "dataset.json"          # Karpathy format: retrieval, long-caption retrieval, ARO-Order
WINOGROUND_EXAMPLES = "examples.jsonl"
ARO_RELATION_FILE = "visual_genome_relation.json"
ARO_ATTRIBUTION_FILE = "visual_genome_attribution.json"
VALSE_PIECES = ("existence", "plurals", "counting-hard", "counting-small-quant", "counting-adversarial",
                "relations", "action-replacement", "actant-swap", "coreference-standard", "coreference-hard",
                "foil-it")


def valse_pieces(spec: dict[str, Any]) -> list[str]:
    """The VALSE piece files a benchmark entry scores (config `pieces`, default all of them)."""
    pieces = spec.get("pieces", VALSE_PIECES)
    if not isinstance(pieces, list | tuple) or not pieces or not all(isinstance(p, str) and p for p in pieces):
        raise BenchmarkError(f"valse: 'pieces' must be a non-empty list of piece names, got {pieces!r}")
    return list(pieces)


def benchmark_files(kind: str, benchmark_dir: str, spec: dict[str, Any] | None = None) -> list[str]:
    """The files that define a benchmark of this kind in `benchmark_dir` (evaluation reruns when they
    change); `spec` (the config entry) is needed only for VALSE's `pieces`."""
    files: dict[str, list[str]] = {
        "sugarcrepe": [f"{subset}.json" for subset in SUGARCREPE_SUBSETS],
        "sugarcrepe_pp": [f"{subset}.json" for subset in SUGARCREPE_PP_SUBSETS],
        "zeroshot": [CLASSNAMES],
        "linear_probe": [CLASSNAMES],
        "retrieval": [DATASET_JSON],
        "long_retrieval": [DATASET_JSON],
        "aro_order": [DATASET_JSON],
        "winoground": [WINOGROUND_EXAMPLES],
        "aro_relation": [ARO_RELATION_FILE],
        "aro_attribution": [ARO_ATTRIBUTION_FILE],
        "valse": [f"{piece}.json" for piece in valse_pieces(spec or {})],
    }
    if kind not in files:
        raise BenchmarkError(f"benchmark kind {kind!r} unknown (known: {', '.join(sorted(files))})")
    return [f"{benchmark_dir}/{name}" for name in files[kind]]
