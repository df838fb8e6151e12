"""Zero-shot classification's file readers (compo.evaluate.zeroshot): CIFAR pickles are read through a
restricted unpickler, so no data file runs code (issue 31)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from compo.evaluate.files import BenchmarkError

# --- CIFAR pickles are read through a restricted unpickler -------------------------------------------


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
def test_a_cifar_pickle_payload_never_runs(tmp_path: Path, verify: bool) -> None:
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


def test_the_restricted_unpickler_reads_what_cifar_files_hold(tmp_path: Path) -> None:
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


def test_identical_zero_shot_class_names_are_an_error(tmp_path: Path, caplog) -> None:
    """Every image of the two classes tied (top-1 0.0); CLIP_benchmark's imagenet1k table keeps its repeats."""
    from compo.evaluate.files import BenchmarkError
    from compo.evaluate.zeroshot import class_names

    (tmp_path / "classnames.json").write_text(json.dumps(["cube", "ball", "cube"]))
    with pytest.raises(BenchmarkError, match=r"classnames\.json: 1 class name\(s\) given to more than one class "
                                             r"\('cube' for c0, c2\); expected one name per class"):
        class_names({}, tmp_path, ["c0", "c1", "c2"])
    (tmp_path / "classnames.json").write_text(json.dumps({"imagenet1k": ["cube", "ball", "cube"]}))
    with caplog.at_level("WARNING"):
        assert class_names({"dataset": "imagenet1k"}, tmp_path, ["c0", "c1", "c2"]) == ["cube", "ball", "cube"]
    assert "shared by several classes as released ('cube' for c0, c2)" in caplog.text
