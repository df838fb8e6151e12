"""SugarCrepe++ (compo.evaluate.sugarcrepe_pp) on a fixture in the released format, checked against a plain loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from benchmark_helpers import embed_image, embed_text, sentence, write_image

from compo.evaluate import BenchmarkError, run_benchmark
from compo.evaluate.sugarcrepe_pp import SUBSETS as SCPP_SUBSETS

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared


def write_scpp(root: Path, per_subset: int = 3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(4):
        write_image(root / "images" / f"{i:012d}.jpg", seed * 100 + i)
    for subset in SCPP_SUBSETS:
        items = [{"id": j, "filename": f"{int(rng.integers(4)):012d}.jpg", "caption": sentence(rng),
                  "caption2": sentence(rng, 6), "negative_caption": sentence(rng, 4)} for j in range(per_subset)]
        (root / f"{subset}.json").write_text(json.dumps(items))


def test_sugarcrepe_pp_matches_plain_loop_with_ties(tmp_path: Path, loaded) -> None:
    bench = tmp_path / "scpp"
    write_scpp(bench)
    items = json.loads((bench / "swap_obj.json").read_text())
    items[1]["caption2"] = items[1]["negative_caption"]  # ITT and TOT tie: both wrong
    (bench / "swap_obj.json").write_text(json.dumps(items))
    result = run_benchmark(loaded, {"kind": "sugarcrepe_pp", "source": "files"}, bench)
    predictions = result.predictions
    all_itt, all_tot = [], []
    for subset in SCPP_SUBSETS:
        itt, tot = [], []
        for item in json.loads((bench / f"{subset}.json").read_text()):
            v = embed_image(loaded, bench / "images" / item["filename"])
            p1, p2, n = (embed_text(loaded, item[k]) for k in ("caption", "caption2", "negative_caption"))
            itt.append(bool(v @ p1 > v @ n + 1e-9 and v @ p2 > v @ n + 1e-9))
            tot.append(bool(p1 @ p2 > p1 @ n + 1e-9 and p1 @ p2 > p2 @ n + 1e-9))
            for task, expected in (("itt", itt[-1]), ("tot", tot[-1])):
                row = predictions[(predictions["subset"] == f"{subset}/{task}")
                                  & (predictions["item"] == str(item["id"]))].iloc[0]
                assert bool(row["correct"]) == expected
        assert result.metrics[f"itt_{subset}"].value == pytest.approx(np.mean(itt))
        assert result.metrics[f"tot_{subset}"].value == pytest.approx(np.mean(tot))
        all_itt += itt
        all_tot += tot
    assert result.metrics["itt_overall"].value == pytest.approx(np.mean(all_itt))
    assert result.metrics["tot_overall"].n == len(all_tot) == 15
    tie = predictions[(predictions["subset"].str.startswith("swap_obj/")) & (predictions["item"] == "1")]
    assert not tie["correct"].any()


def test_sugarcrepe_pp_skips_missing_images_for_itt_only_and_names_bad_items(tmp_path: Path, loaded) -> None:
    bench = tmp_path / "scpp"
    write_scpp(bench)
    (bench / "images" / f"{0:012d}.jpg").unlink()
    uses = sum(item["filename"] == f"{0:012d}.jpg" for s in SCPP_SUBSETS
               for item in json.loads((bench / f"{s}.json").read_text()))
    result = run_benchmark(loaded, {"kind": "sugarcrepe_pp", "source": "files"}, bench)
    assert uses > 0 and result.skipped == {"missing_image": uses}
    assert result.metrics["itt_overall"].n == 15 - uses and result.metrics["tot_overall"].n == 15
    items = json.loads((bench / "replace_rel.json").read_text())
    del items[2]["caption2"]
    (bench / "replace_rel.json").write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"replace_rel\.json: item 2: missing field\(s\) caption2"):
        run_benchmark(loaded, {"kind": "sugarcrepe_pp", "source": "files"}, bench)
