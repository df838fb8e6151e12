"""The linear probe (compo.evaluate.linear_probe): the softmax regression's optimum, its L-BFGS objective chunked
over rows (the same fit, its peak memory bounded: issue 43 item 5) and an ImageFolder benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_helpers import write_image
from PIL import Image

from compo.evaluate import BenchmarkError, run_benchmark
from compo.evaluate.linear_probe import fit_softmax_regression

pytestmark = pytest.mark.usefixtures("one_thread")  # the machine's 2 cores are shared


def test_softmax_regression_reaches_its_optimum() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(60, 5)))
    y = torch.tensor(rng.integers(0, 3, 60))
    l2 = 0.1
    weight, bias = fit_softmax_regression(x, y, 3, l2)
    # stationarity of mean CE + l2/2 |W|^2, written out: X^T (P - Y) / n + l2 W = 0 and mean(P - Y) = 0
    logits = x @ weight + bias
    p = torch.softmax(logits, dim=1)
    onehot = torch.nn.functional.one_hot(y, 3).double()
    assert torch.allclose(x.T @ (p - onehot) / 60 + l2 * weight, torch.zeros_like(weight), atol=1e-6)
    assert torch.allclose((p - onehot).mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("multilabel", [False, True])
def test_chunked_probe_equals_the_unchunked_one(multilabel: bool) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(300, 8)))
    y = torch.tensor(rng.random((300, 4)) < 0.3) if multilabel else torch.tensor(rng.integers(0, 4, 300))
    whole = fit_softmax_regression(x, y, 4, 0.01, rows=len(x))
    chunked = fit_softmax_regression(x, y, 4, 0.01, rows=37)  # uneven chunks, the last one short
    for a, b in zip(whole, chunked, strict=True):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-6)
    assert whole[0].abs().max() > 0.1  # a fitted probe, not two zero starts


PEAK_SCRIPT = """
import os, resource, torch
from compo.evaluate.linear_probe import probe_objective
torch.set_num_threads(1)
n, d, c = 100_000, 16, 200
g = torch.Generator().manual_seed(0)
x, y = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randint(0, c, (n,), generator=g)
w = torch.zeros(d, c, dtype=torch.float64, requires_grad=True)
b = torch.zeros(c, dtype=torch.float64, requires_grad=True)
probe_objective(x, y, w, b, 0.1, 64)  # warm-up


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


for rows in (4096, n):  # each in a forked child: its peak RSS starts at its RSS at the fork, not at the
    read, write = os.pipe()  # parent's high-water mark (the imports' peak would hide the objective's)
    if os.fork() == 0:
        start = rss()
        probe_objective(x, y, w, b, 0.1, rows)
        os.write(write, str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start).encode())
        os._exit(0)
    os.wait()
    print(rows, int(os.read(read, 64)))
"""


def test_chunked_probe_objective_bounds_the_peak_memory() -> None:
    """Peak RSS growth of one objective evaluation (loss and gradient) over 100,000 x 200 float64 logits
    (160 MB a buffer), measured in a fresh process: chunks of 4,096 rows vs the whole matrix at once."""
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True, check=True).stdout
    growth = dict(tuple(map(int, line.split())) for line in out.splitlines())
    logits_bytes = 100_000 * 200 * 8
    assert growth[100_000] > 2 * logits_bytes  # unchunked: logits, softmax and their gradients at once
    # chunked: a fixed floor (the features, the allocator) plus 4,096-row buffers; RSS is noisy on a loaded
    # machine (72-85 MB measured against 413-447 MB unchunked), so the bound is a ratio with room
    assert growth[4096] < growth[100_000] / 3, growth


def test_linear_probe_on_an_imagefolder(tmp_path: Path, loaded) -> None:
    torch.set_num_threads(1)
    for split, n in (("train", 6), ("test", 3)):
        for c, colour in enumerate(((250, 20, 20), (20, 20, 250))):
            for i in range(n):
                path = tmp_path / split / f"c{c}" / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                noise = np.random.default_rng(100 * c + i).integers(-20, 20, (32, 32, 3))
                Image.fromarray(np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)).save(path)
    (tmp_path / "classnames.json").write_text(json.dumps({"c0": "red", "c1": "blue"}))
    (tmp_path / "test" / "c1" / "2.png").write_bytes(b"broken")
    result = run_benchmark(loaded, {"kind": "linear_probe", "source": "files"}, tmp_path)
    assert result.skipped == {"corrupt_image": 1} and result.metrics["top1"].n == 5
    assert result.metrics["top1"].value == 1.0  # two flat colours are linearly separable even at random init
    # a class in one split only: an error naming it (a probe prompts no class, so its names are not read)
    (tmp_path / "train" / "c2").mkdir()
    with pytest.raises(BenchmarkError, match=r"train and test have different classes .*only in train: c2"):
        run_benchmark(loaded, {"kind": "linear_probe", "source": "files"}, tmp_path)


# --- the linear probe's classes (items 3 and 7) ------------------------------------------------------------


def _probe_folder(root: Path, train: dict[str, int], test: dict[str, int]) -> None:
    root.mkdir()
    (root / "classnames.json").write_text(json.dumps(list(train)))
    for split, classes in (("train", train), ("test", test)):
        for c, (name, n) in enumerate(classes.items()):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                write_image(root / split / name / f"{i}.png", 100 * c + i, size=32)


def test_probe_classes_are_named_when_they_differ_or_have_no_training_image(tmp_path: Path, loaded) -> None:
    """'train and test have different classes (2 vs 2)' named no file or class; a class folder without a
    training image was fitted without it."""
    from compo.evaluate import run_benchmark
    from compo.evaluate.files import BenchmarkError

    spec = {"kind": "linear_probe", "source": "files"}
    _probe_folder(tmp_path / "a", {"cat": 2, "dog": 2}, {"cat": 1, "eel": 1})
    with pytest.raises(BenchmarkError, match=rf"^{tmp_path / 'a'} \(format imagefolder\): train and test have "
                                             r"different classes \(2 vs 2; only in train: dog; only in test: eel\)"):
        run_benchmark(loaded, spec, tmp_path / "a")
    _probe_folder(tmp_path / "b", {"cat": 2, "dog": 2, "eel": 0}, {"cat": 1, "dog": 1, "eel": 1})
    with pytest.raises(BenchmarkError, match=r"1 class\(es\) without a readable training image: eel"):
        run_benchmark(loaded, spec, tmp_path / "b")
