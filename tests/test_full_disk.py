"""A training run on a full disk fails cleanly: a clear error, and no model folder (complete or absent).

The model folder goes to a 4 MiB tmpfs (the tiny model's checkpoint needs ~31 MiB), mounted in a private
mount namespace (`unshare`: as root, or as a user through a user namespace) so nothing outside the test
sees it. Where no namespace can mount one the test is skipped, saying so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from compo.io import write_table

REPO = Path(__file__).resolve().parents[1]
LISTING = "import json, os, sys; print(json.dumps(sorted(os.path.relpath(os.path.join(d, f), sys.argv[1]) " \
          "for d, ds, fs in os.walk(sys.argv[1]) for f in fs + ds)))"


def _namespace_prefix() -> list[str] | None:
    """An `unshare` command line whose shell may mount a tmpfs, or None where none can."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "--user", "--map-root-user", "--mount"], ["unshare", "--mount"]):
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /tmp"],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return prefix
    return None


def test_training_onto_a_full_disk_leaves_no_model_folder(tmp_path):
    prefix = _namespace_prefix()
    if prefix is None:
        pytest.skip("cannot mount a size-limited tmpfs here (unshare cannot create a mount namespace, as root "
                    "or through a user namespace): the full-disk case is not exercised")
    rows = []
    for i, colour in enumerate(["red", "blue", "green", "white"]):
        Image.new("RGB", (64, 64), colour).save(tmp_path / f"{i}.png")
        rows.append({"image_id": f"i{i}", "image_path": str(tmp_path / f"{i}.png"), "caption_id": f"c{i}",
                     "caption": f"a {colour} square", "dataset": "tiny", "caption_kind": None, "scene": None,
                     "gt_noun_phrases": None, "grounded_words": None, "ungrounded_words": None})
    manifest = tmp_path / "manifest.parquet"
    write_table(pd.DataFrame(rows), manifest, "manifest")
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "models" / "base-clip" / "tiny" / "seed0"
    recipe = {"model": "compo-tiny-clip", "init": "scratch", "dataset": "tiny",
              "train": {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}}
    train = [sys.executable, "-m", "compo", "train", "--recipe", json.dumps(recipe), "--manifest", str(manifest),
             "--settings", json.dumps({"threads": 1, "checkpoint_every": 100, "log_every": 1}), "--seed", "0",
             "--out", str(out)]
    script = (f"mount -t tmpfs -o size=4m tmpfs {disk} && mkdir -p {out} && "  # the empty folder Snakemake makes
              f"{subprocess.list2cmdline(train)}; echo rc=$?; {sys.executable} -c '{LISTING}' {disk}")
    result = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True, timeout=300,
                            check=False)
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-2] == "rc=1", result.stdout[-2000:] + result.stderr[-4000:]
    assert "the model folder could not be written" in result.stderr and "MiB are free" in result.stderr
    # nothing inside the model folder (still the empty folder it was), no temporary folder left behind
    assert json.loads(lines[-1]) == ["models", "models/base-clip", "models/base-clip/tiny",
                                     "models/base-clip/tiny/seed0"], lines[-1]


LOCK_ON_A_FULL_DISK = """
import os, sys
from pathlib import Path
from compo.results_root import StudyLock, StudyLockError
disk = Path(sys.argv[1])
try:
    with open(disk / "filler", "wb") as handle:  # the disk filled up by something else
        while True:
            handle.write(b"x" * 4096)
except OSError:
    pass
try:
    StudyLock(disk / "results").acquire()
except StudyLockError as error:
    print("StudyLockError:", error)
print(sorted(os.listdir(disk / "results")) if (disk / "results").exists() else "no results folder")
"""


def test_a_full_results_disk_is_named_by_the_study_lock(tmp_path):
    """Issue 59: a full disk before any job surfaced as a bare OSError through the lock (from the Snakefile's
    onstart). The lock now says the results folder's disk is full, naming the folder, and leaves no file."""
    prefix = _namespace_prefix()
    if prefix is None:
        pytest.skip("cannot mount a size-limited tmpfs here (unshare cannot create a mount namespace, as root "
                    "or through a user namespace): the full-disk case is not exercised")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {disk} && "
              f"{subprocess.list2cmdline([sys.executable, '-c', LOCK_ON_A_FULL_DISK, str(disk)])}")
    result = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == (f"StudyLockError: {disk}/results: the disk holding the results folder is full (ENOSPC): the "
                        f"study lock {disk}/results/.compo-study.lock could not be written, before any job ran (No "
                        "space left on device); free space there or set the config key results to a folder on a "
                        "disk with room"), result.stdout + result.stderr[-3000:]
    assert lines[1] == "[]"  # no lock, no temporary record left behind
