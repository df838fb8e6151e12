"""Compare two `compo evaluate` output folders to the digit: every result JSON (metrics, their n, skip counts, protocol,
headline; the model folder and checkpoint hash may differ) and every predictions parquet (exact frame equality,
column order and dtypes included).

    python scripts/compare_eval_outputs.py REFERENCE_DIR OTHER_DIR

Exits 1 listing each difference (a file in one folder only is one); a refactor of a scorer is checked with it
against the outputs of the code before it (same model, same data).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

IGNORED = {"model_dir", "checkpoint_sha256"}  # where the model was read from, not what was scored


def _json_differences(reference: Path, other: Path) -> list[str]:
    a, b = (json.loads(p.read_text(encoding="utf-8")) for p in (reference, other))
    keys = sorted((set(a) | set(b)) - IGNORED)
    return [f"{other.name}: {key}: {a.get(key)!r:.200} != {b.get(key)!r:.200}" for key in keys
            if a.get(key) != b.get(key)]


def _frame_differences(reference: Path, other: Path) -> list[str]:
    a, b = pd.read_parquet(reference), pd.read_parquet(other)
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    except AssertionError as error:
        gap = ""
        if list(a.columns) == list(b.columns) and len(a) == len(b):
            floats = [c for c in a.columns if pd.api.types.is_float_dtype(a[c])]
            if floats:  # how far apart the scores are, where only rounding moved them
                gap = f" (largest float difference {max(float((a[c] - b[c]).abs().max()) for c in floats):.3g})"
        return [f"{other.name}: {str(error).strip()[:600]}{gap}"]
    return []


def compare(reference: Path, other: Path) -> tuple[int, int, list[str]]:
    """(JSONs compared, parquet files compared, differences) of two evaluation folders."""
    differences: list[str] = []
    counts = []
    for pattern, differ in (("*.json", _json_differences), ("predictions/*.parquet", _frame_differences)):
        names = {p.relative_to(reference) for p in reference.glob(pattern)}
        others = {p.relative_to(other) for p in other.glob(pattern)}
        differences += [f"{name}: only in {reference}" for name in sorted(names - others)]
        differences += [f"{name}: only in {other}" for name in sorted(others - names)]
        both = sorted(names & others)
        counts.append(len(both))
        for name in both:
            differences += differ(reference / name, other / name)
    return counts[0], counts[1], differences


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    reference, other = (Path(a) for a in argv)
    n_json, n_parquet, differences = compare(reference, other)
    for line in differences:
        print(line)
    print(f"{n_json} JSON and {n_parquet} parquet file(s) compared: "
          f"{'all equal' if not differences else f'{len(differences)} difference(s)'}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
