"""One study per results folder (compo.results_root): the lock a second study on the same results meets, a
stale lock taken over, Snakemake refusing a folder another checkout runs on; and a read-only results root refused at
the dry run (issue 31)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def _read_only(path: Path) -> list[str]:
    """A command prefix under which `path` is read-only: a read-only bind mount in a private mount namespace
    (root writes through file modes) or, for other users, mode 0555."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        return []
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: cannot make a read-only folder")
    script = f"mount --bind {path} {path} && mount -o remount,bind,ro {path} && exec \"$@\""
    return ["unshare", "--mount", "sh", "-c", script, "sh"]


def test_a_read_only_results_root_fails_the_dry_run(tmp_path: Path, repo: Path) -> None:
    results = tmp_path / "ro" / "results"
    prefix = _read_only(tmp_path / "ro")
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"results": str(results)}))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    command = [*prefix, str(Path(sys.executable).parent / "snakemake"), "-s", str(repo / "Snakefile"), "-n",
               "--directory", str(tmp_path), "--configfile", str(repo / "config" / "config.yaml"),
               str(tmp_path / "overlay.yaml"), "--cores", "1", f"{results}/world/eval/manifest.parquet"]
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert run.returncode != 0
    first = run.stderr.strip().splitlines()[0]
    assert first.startswith(f"compo-study: config key results: {results} cannot be written"), run.stderr[-2000:]


# --- one study per results folder ----------------------------------------------------------------------


def test_a_second_study_on_the_same_results_is_refused_naming_the_first(tmp_path: Path) -> None:
    from compo.processes import current_umask
    from compo.results_root import StudyLock, StudyLockError

    results = tmp_path / "results"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from compo.results_root import StudyLock; "
                               "StudyLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()",
                               str(results)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(StudyLockError) as caught:
        StudyLock(results).acquire()
    message = str(caught.value)
    assert message.startswith(f"{results}: another study is running on these results (host "
                              f"{socket.gethostname()}, pid {holder.pid}, started "), message
    assert f"delete {results / '.compo-study.lock'}" in message
    assert (results / ".compo-study.lock").stat().st_mode & 0o044 == 0o044 & ~current_umask()  # others can read
    holder.communicate("")  # the first study ends: its lock goes with it
    assert not (results / ".compo-study.lock").exists()
    lock = StudyLock(results).acquire()
    assert json.loads((results / ".compo-study.lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (results / ".compo-study.lock").exists()


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path, caplog) -> None:
    from compo.results_root import StudyLock

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / ".compo-study.lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": int(dead.stdout), "started": "2025-01-01T00:00:00"}))
    with caplog.at_level("WARNING", logger="compo.results_root"):
        lock = StudyLock(tmp_path).acquire()
    assert f"stale lock of pid {int(dead.stdout)}" in caplog.text
    assert json.loads((tmp_path / ".compo-study.lock").read_text())["pid"] == os.getpid()
    lock.release()


@pytest.mark.slow
def test_snakemake_refuses_a_results_folder_another_checkout_is_running_on(tmp_path: Path, run_snakemake) -> None:
    """Two working directories (two checkouts) with the same absolute results folder: while the first
    study's lock is held (by this live process), the second is refused before any job runs."""
    results = tmp_path / "shared-results"
    results.mkdir()
    lock = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2025-01-01T00:00:00"}
    (results / ".compo-study.lock").write_text(json.dumps(lock))
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"results": str(results), "world": {
        "splits": {"pretrain": 4, "finetune": 4, "long": 2, "eval": 4}}}))
    second = tmp_path / "checkout2"
    second.mkdir()
    run = run_snakemake(second, f"{results}/world/eval/manifest.parquet", configs=[tmp_path / "overlay.yaml"])
    assert run.returncode != 0
    assert f"{results}: another study is running on these results (host {socket.gethostname()}, pid " \
           f"{os.getpid()}, started 2025-01-01T00:00:00)" in run.stderr, run.stderr[-2000:]
    assert not (results / "world").exists()
    (results / ".compo-study.lock").unlink()
    run = run_snakemake(second, f"{results}/world/eval/manifest.parquet", configs=[tmp_path / "overlay.yaml"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert not (results / ".compo-study.lock").exists()  # released on exit
