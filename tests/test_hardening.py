"""Hostile and broken inputs, third round (issue 31): one test per numbered case, each reading the message.

1 no data file runs code (CIFAR pickles)       2 names read from files stay inside their root
3 repeated config entries, at DAG build        4 unknown model, text positions, LoRA targets, results root
5 the dataset stage decodes and root-checks    6 unreadable checkpoints and resume states
7 concreteness norms are validated             8 captions longer than a bound stop at the dataset stage
9 one study per results folder (a lock)
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml

from compo.evaluate.files import BenchmarkError

REPO = Path(__file__).resolve().parents[1]
COCO = REPO / "tests" / "fixtures" / "raw" / "coco"


@pytest.fixture()
def config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


# --- 1. CIFAR pickles are read through a restricted unpickler -------------------------------------------


class _Payload:
    """Unpickling this runs a shell command (what a crafted data_batch_* holds)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def _cifar10_with_payload(root: Path, marker: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batch = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1], "payload": _Payload(marker)}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": ["cat", "dog"]}, protocol=2))
    return folder


@pytest.mark.parametrize("verify", [False, True])
def test_1_a_cifar_pickle_payload_never_runs(tmp_path: Path, verify: bool) -> None:
    from compo.evaluate.zeroshot import load_split

    marker = tmp_path / "MARKER"
    folder = _cifar10_with_payload(tmp_path / "bench", marker)
    spec = {"kind": "zeroshot", "source": "files", "format": "cifar10", "verify": verify}
    with pytest.raises(BenchmarkError) as caught:
        load_split(spec, tmp_path / "bench")
    assert not marker.exists()
    message = str(caught.value)
    assert str(folder / "test_batch") in message, message
    if verify:  # the released md5 fails first; the message does not send the user to verify: false
        assert "md5" in message and "verify: false" not in message and "verify" not in message.split("(")[0], message
    else:
        assert "posix.system" in message and "refused" in message, message


def test_1_the_restricted_unpickler_reads_what_cifar_files_hold(tmp_path: Path) -> None:
    """Python 2 era names (numpy.core.multiarray) and protocol 2 bytes are admitted; anything else is not."""
    from compo.evaluate.zeroshot import restricted_unpickle

    data = {"data": np.arange(6, dtype=np.uint8).reshape(2, 3), "labels": [1, 2], "batch_label": b"x",
            "filenames": ["a.png"], "scale": 1.5}
    path = tmp_path / "batch"
    raw = pickle.dumps(data, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path.write_bytes(raw)
    loaded = restricted_unpickle(path)
    assert np.array_equal(loaded["data"], data["data"]) and loaded["labels"] == [1, 2]
    assert loaded["batch_label"] == b"x" and loaded["filenames"] == ["a.png"]
    path.write_bytes(pickle.dumps({"a": Path("x")}))
    with pytest.raises(BenchmarkError, match=r"batch: refused: the pickle asks for pathlib\.PosixPath"):
        restricted_unpickle(path)


