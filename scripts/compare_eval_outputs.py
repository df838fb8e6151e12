"""Compare two `compo evaluate` output folders to the digit: every result JSON (metrics, their n, skip counts, protocol,
headline; the model folder and checkpoint hash may differ) and every predictions parquet (exact frame equality,
column order and dtypes included).

    python scripts/compare_eval_outputs.py REFERENCE_DIR OTHER_DIR [--rounding 1e-15]

Exits 1 listing each difference (a file in one folder only is one). With --rounding, a predictions table whose
columns are equal except for float columns within that absolute difference (a float64 dot product summed in
another order) is listed as a note, not a difference. A refactor of a scorer is checked with it against the outputs
of the code before it (same model, same data).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

IGNORED = {"model_dir", "checkpoint_sha256"}  # where the model was read from, not what was scored


def _json_differences(reference: Path, other: Path, rounding: float) -> tuple[list[str], list[str]]:
    a, b = (json.loads(p.read_text(encoding="utf-8")) for p in (reference, other))
    keys = sorted((set(a) | set(b)) - IGNORED)
    return [f"{other.name}: {key}: {a.get(key)!r:.200} != {b.get(key)!r:.200}" for key in keys
            if a.get(key) != b.get(key)], []


def _frame_differences(reference: Path, other: Path, rounding: float) -> tuple[list[str], list[str]]:
    a, b = pd.read_parquet(reference), pd.read_parquet(other)
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        return [], []
    except AssertionError as error:
        message = f"{other.name}: {str(error).strip()[:600]}"
    floats = [c for c in a.columns if pd.api.types.is_float_dtype(a[c])]
    if rounding and list(a.columns) == list(b.columns) and len(a) == len(b) and floats:
        try:
            pd.testing.assert_frame_equal(a.drop(columns=floats), b.drop(columns=floats), check_exact=True)
        except AssertionError:
            return [message], []
        gap = max(float((a[c] - b[c]).abs().max()) for c in floats)
        if gap <= rounding:
            changed = sum(int((a[c] != b[c]).sum()) for c in floats)
            return [], [f"{other.name}: every column equal but {changed} float cell(s) of {', '.join(floats)} "
                        f"within {gap:.3g}"]
    return [message], []


def compare(reference: Path, other: Path, rounding: float = 0.0) -> tuple[int, int, list[str], list[str]]:
    """(JSONs compared, parquet files compared, differences, notes) of two evaluation folders."""
    differences: list[str] = []
    notes: list[str] = []
    counts = []
    for pattern, differ in (("*.json", _json_differences), ("predictions/*.parquet", _frame_differences)):
        names = {p.relative_to(reference) for p in reference.glob(pattern)}
        others = {p.relative_to(other) for p in other.glob(pattern)}
        differences += [f"{name}: only in {reference}" for name in sorted(names - others)]
        differences += [f"{name}: only in {other}" for name in sorted(others - names)]
        both = sorted(names & others)
        counts.append(len(both))
        for name in both:
            found, noted = differ(reference / name, other / name, rounding)
            differences += found
            notes += noted
    return counts[0], counts[1], differences, notes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--rounding", type=float, default=0.0,
                        help="float cells of a predictions table may differ by at most this (default 0: exact)")
    args = parser.parse_args(argv)
    n_json, n_parquet, differences, notes = compare(args.reference, args.other, args.rounding)
    for line in differences:
        print(line)
    for line in notes:
        print(f"note: {line}")
    print(f"{n_json} JSON and {n_parquet} parquet file(s) compared: "
          f"{'all equal' if not differences else f'{len(differences)} difference(s)'}"
          f"{f' ({len(notes)} within rounding)' if notes else ''}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
