"""SVO-Probes (compo.evaluate.svo_probes, issue 47): the loader on the fixture in the release's layout, the
released tie rule beside the strict one, and malformed files' errors."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from benchmark_helpers import FIXTURES, cosine
from test_real_benchmarks import placeholders

from compo.evaluate import BenchmarkError, benchmark_files, run_benchmark, svo_probes

pytestmark = pytest.mark.usefixtures("one_thread")


def test_svo_probes_runs_on_the_fixture(tmp_path: Path, loaded) -> None:
    rows = svo_probes.load_rows(FIXTURES / "svo_probes" / "svo_probes.csv")
    assert len(rows) == 5 and [sum(r[n] for r in rows) for n in svo_probes.NEGATIVES] == [1, 2, 2]
    assert benchmark_files("svo_probes", "b", {}) == ["b/svo_probes.csv"]
    placeholders(tmp_path, {f"{k}.jpg" for k in range(1, 10)})  # 10.jpg (the last row's negative) is missing
    shutil.copy(tmp_path / "1.jpg", tmp_path / "2.jpg")  # line 2's negative is its positive's copy: a tie
    result = run_benchmark(loaded, {"kind": "svo_probes", "source": "files", "image_root": str(tmp_path)},
                           FIXTURES / "svo_probes")
    assert result.skipped == {"missing_image": 1}
    assert {n: result.metrics[n].n for n in svo_probes.NEGATIVES} == {"subj_neg": 1, "verb_neg": 2, "obj_neg": 1}
    assert result.metrics["mean"].value == pytest.approx(np.mean([result.metrics[n].value
                                                                  for n in svo_probes.NEGATIVES]))
    rows = result.predictions.set_index("item")
    assert rows.loc["2", "rank"] == 2 and not rows.loc["2", "correct"] and result.metrics["subj_neg"].value == 0
    assert (rows["correct"] == (rows["score_pos"] > rows["score_neg"] + 1e-9)).all()
    row = rows.loc["3"]  # line 3: "A girl walks a dog.", images 3 and 4
    pos, neg = (cosine(loaded, tmp_path / f"{k}.jpg", "A girl walks a dog.") for k in (3, 4))
    assert (row["score_pos"], row["score_neg"]) == (pytest.approx(pos, abs=1e-6), pytest.approx(neg, abs=1e-6))
    assert bool(row["correct"]) == (pos > neg) and row["subset"] == "verb_neg"


def test_svo_probes_malformed_file(tmp_path: Path) -> None:
    with open(FIXTURES / "svo_probes" / "svo_probes.csv", newline="") as handle:
        table = list(csv.reader(handle))
    table[2][table[0].index("verb_neg")] = "yes"
    with open(tmp_path / "svo_probes.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(table)
    with pytest.raises(BenchmarkError, match="svo_probes.csv: line 3: verb_neg must be True or False, got 'yes'"):
        svo_probes.load_rows(tmp_path / "svo_probes.csv")
    with open(tmp_path / "svo_probes.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([row[:-1] for row in table])
    with pytest.raises(BenchmarkError, match="missing column"):
        svo_probes.load_rows(tmp_path / "svo_probes.csv")
