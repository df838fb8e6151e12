"""compo.forkserver: a local run's jobs forked from a server that imported torch once, each running as the fresh
process it replaces would (its output, exit status, signals, environment), and none served where a job must be its
own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from compo import forkserver

REPO = Path(__file__).resolve().parents[1]
WORLD = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["world"]
WORLD["splits"] = {**WORLD["splits"], "eval": 12}


@pytest.fixture
def servers(tmp_path: Path):
    """A run's servers' folder, owned by this test's process, and the environment of its jobs; stopped after."""
    folder = forkserver.start(os.getpid())
    assert folder
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), forkserver.ENV: folder}
    yield Path(folder), env
    forkserver.stop(folder)


def compo(*args: str, env: dict, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compo", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, **kwargs)


def served(folder: Path) -> list[str]:
    log = folder / forkserver.SERVED_LOG
    return log.read_text().splitlines() if log.exists() else []


def wait_for(condition, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def start_server(folder: Path, env: dict, cwd: Path) -> None:
    """The first job of an environment runs itself and starts its server; returns once the server listens."""
    before = served(folder)
    first = compo("--help", env=env, cwd=cwd)
    assert first.returncode == 0 and served(folder) == before
    socket_path = folder / f"{forkserver.environment_key(env)}.sock"
    wait_for(socket_path.exists, "the server listens", timeout=300)


@pytest.mark.slow
def test_a_served_job_writes_what_a_fresh_process_writes(servers, tmp_path: Path) -> None:
    """`compo world` (torch, NumPy, PIL) through the server and as a process of its own: the same files, byte for
    byte; the served job read its working directory, umask and TMPDIR from its own `compo`."""
    folder, env = servers
    start_server(folder, env, tmp_path)
    args = ["world", "--split", "eval", "--world", json.dumps(WORLD), "--seed", "3", "--out", "split"]
    for name in ("fresh", "job", "job-tmp"):
        (tmp_path / name).mkdir()
    fresh = compo(*args, env={**env, forkserver.ENV: forkserver.OFF}, cwd=tmp_path / "fresh")
    assert fresh.returncode == 0, fresh.stderr
    via_server = compo(*args, "--timing", "use.tsv", env={**env, "TMPDIR": str(tmp_path / "job-tmp")},
                       cwd=tmp_path / "job", preexec_fn=lambda: os.umask(0o077))
    assert via_server.returncode == 0, via_server.stderr
    assert served(folder)[-1].split()[1:] == ["world", "--split"]
    made = sorted(p.relative_to(tmp_path / "fresh") for p in (tmp_path / "fresh").rglob("*") if p.is_file())
    assert made and made == sorted(p.relative_to(tmp_path / "job") for p in (tmp_path / "job").rglob("*")
                                   if p.is_file() and p.name != "use.tsv")
    for path in made:
        assert (tmp_path / "fresh" / path).read_bytes() == (tmp_path / "job" / path).read_bytes(), path
    assert (tmp_path / "job" / "use.tsv").stat().st_mode & 0o077 == 0  # the job's umask, in the job's folder


def test_exit_status_output_and_signals_are_the_job_s(servers, tmp_path: Path) -> None:
    """A served command's stdout and stderr reach its `compo`'s, with its exit status; a SIGTERM to the `compo`
    reaches the job, which dies of it, and so does the `compo`; a SIGKILLed `compo` takes its job down too."""
    folder, env = servers
    start_server(folder, env, tmp_path)
    shown = compo("world", "--help", env=env, cwd=tmp_path)
    assert shown.returncode == 0 and "--split" in shown.stdout and len(served(folder)) == 1
    refused = compo("world", "--split", "eval", env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "the following arguments are required" in refused.stderr
    failed = compo("inputs", "--configfile", "absent.yaml", env=env, cwd=tmp_path)
    assert failed.returncode == 1 and "absent.yaml" in failed.stderr and len(served(folder)) == 3

    for number, exit_code in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        fifo = tmp_path / f"readme-{number}.md"  # reading it waits for a writer, who never comes: a job that waits
        os.mkfifo(fifo)
        before = len(served(folder))
        waiting = subprocess.Popen([sys.executable, "-m", "compo", "benchmark-keys", "--write", str(fifo)],
                                   env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(lambda: len(served(folder)) > before, "the job was forked")  # noqa: B023
        job = int(served(folder)[-1].split()[0])
        os.kill(waiting.pid, number)
        assert waiting.wait(timeout=60) == exit_code, waiting.communicate()[1]
        wait_for(lambda: not _alive(job), f"the job ended after its compo got signal {number}", timeout=30)  # noqa: B023


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_environments_have_servers_of_their_own_and_jobs_their_own_tmpdir(servers, tmp_path: Path) -> None:
    folder, env = servers
    key = forkserver.environment_key(env)
    assert forkserver.environment_key({**env, "TMPDIR": "/elsewhere", "PWD": "/x", "SHLVL": "3"}) == key
    assert forkserver.environment_key({**env, "OMP_NUM_THREADS": "2"}) != key  # read when torch loads
    assert forkserver.environment_key({**env, "HF_HOME": "/cache"}) != key
    start_server(folder, env, tmp_path)
    start_server(folder, {**env, "OMP_NUM_THREADS": "7"}, tmp_path)
    assert len(list(folder.glob("*.sock"))) == 2


def test_jobs_that_must_be_their_own_process_are_not_served(servers, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """In a SLURM allocation, a torchrun rank or a container the job runs in its own process, and starts no server;
    so does every job where the run has no servers (COMPO_FORKSERVER=0, or a folder gone)."""
    folder, env = servers
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for mark in forkserver.OWN_PROCESS_MARKS:
        monkeypatch.setenv(mark, "1")
        assert forkserver.run_served(["compo", "--help"], ["false"]) is None
        monkeypatch.delenv(mark)
    assert not list(folder.glob("*.lock"))
    for off in (forkserver.OFF, str(tmp_path / "gone")):
        monkeypatch.setenv(forkserver.ENV, off)
        assert forkserver.run_served(["compo", "--help"], ["false"]) is None
    monkeypatch.setenv(forkserver.ENV, forkserver.OFF)
    assert forkserver.start(os.getpid()) is None


NO_TORCH = """import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):  # an env that installs none of these (envs/stats.yaml)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "torchvision", "open_clip", "timm"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTorch())
"""


def test_a_server_in_an_env_without_torch_imports_what_it_has_and_serves(servers, tmp_path: Path) -> None:
    """A stage's conda env lacks the other stages' packages (envs/stats.yaml: no torch): its server pre-imports
    the rest, skips what is not there, and serves the env's jobs."""
    folder, env = servers
    (tmp_path / "no_torch").mkdir()
    (tmp_path / "no_torch" / "sitecustomize.py").write_text(NO_TORCH)
    env = {**env, "PYTHONPATH": f"{tmp_path / 'no_torch'}{os.pathsep}{env['PYTHONPATH']}"}
    imported = subprocess.run([sys.executable, "-c", "import json, sys; from compo import cli; cli._preimport(); "
                               "print(json.dumps(sorted(sys.modules)))"], env={**env, forkserver.ENV: "0"},
                              capture_output=True, text=True, timeout=300, check=True)
    modules = set(json.loads(imported.stdout))
    assert {"pandas", "compo.stats", "compo.claims"} <= modules and not {"torch", "compo.train"} & modules
    start_server(folder, env, tmp_path)
    before = served(folder)
    job = compo("--help", env=env, cwd=tmp_path)
    assert job.returncode == 0 and "usage" in job.stdout and len(served(folder)) == len(before) + 1


def test_off_on_a_gpu_machine_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forking GPU jobs was never run on a GPU here: where a GPU driver's device file exists the run has no servers,
    unless COMPO_FORKSERVER=1."""
    driver = tmp_path / "nvidiactl"
    driver.touch()
    monkeypatch.setattr(forkserver, "GPU_DEVICE_FILES", (str(driver),))
    monkeypatch.delenv(forkserver.ENV, raising=False)
    assert forkserver.start(os.getpid()) is None
    monkeypatch.setenv(forkserver.ENV, forkserver.ON)
    folder = forkserver.start(os.getpid())
    assert folder and Path(folder).is_dir()
    forkserver.stop(folder)


def test_a_server_ends_with_the_run_that_made_its_folder(tmp_path: Path) -> None:
    owner = subprocess.Popen(["sleep", "600"])
    folder = Path(forkserver.start(owner.pid))
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), forkserver.ENV: str(folder)}
    try:
        start_server(folder, env, tmp_path)
        server = int(next(folder.glob("*.pid")).read_text())
        owner.kill()
        owner.wait()
        wait_for(lambda: not _alive(server), "the server ended with its owner", timeout=30)
        assert not folder.exists()  # the run was killed: its server took its folder with it
    finally:
        owner.kill()
        forkserver.stop(str(folder))


def test_an_idle_server_ends_and_the_next_job_starts_another(servers, tmp_path: Path) -> None:
    """After its idle time without a job (COMPO_FORKSERVER_IDLE_S, here 3 s) a server ends, and its environment's
    next job starts a new one."""
    folder, env = servers
    idle = {**env, f"{forkserver.ENV}_IDLE_S": "3"}
    start_server(folder, idle, tmp_path)
    server = folder / f"{forkserver.environment_key(idle)}.pid"
    first = int(server.read_text())
    wait_for(lambda: not _alive(first), "the idle server ended", timeout=60)
    assert not server.exists()
    start_server(folder, idle, tmp_path)
    assert int(server.read_text()) != first
