"""Local runs import torch once: a server that imported compo's heavy dependencies forks each job from itself.

Every `compo` job starts a Python that imports torch, torchvision (whose ops import torch._dynamo), open_clip,
pandas and compo's modules before any work: ~7 CPU-s, most of a small job's CPU (the stand-in study's ~140 torch
jobs: ~15 CPU-min; docs/ci-time.md, ninth round). Under the local executor the Snakefile's `onstart` makes a folder
and exports it as COMPO_FORKSERVER; a job's `compo` then asks a server to fork it a child that runs the command,
and exits as that child exits. The first job of an environment starts that environment's server and runs itself
the usual way; the server imports, then serves the jobs that follow.

Why the child runs what a fresh process would:
- one server per environment: the job's environment, less the keys set per job that no library reads at import
  (PER_JOB_KEYS: TMPDIR, the shell's PWD), is hashed and names the server, which was started with that
  environment, so what a library reads from the environment at import (OpenMP's and OpenBLAS's thread counts from
  the job's `threads`, HF_HOME, PYTHONPATH) is the job's; the per-job keys are then set in the child;
- the child takes the job's stdin, stdout and stderr (passed over the socket), working directory, umask,
  environment and argv; Python's `random` and NumPy's global generator are seeded afresh from the OS, as in a new
  process (compo seeds its own generators; torch's default generator is untouched in the server);
- it is the leader of a process group of its own: a signal the job's `compo` receives (SIGTERM, SIGINT, ...) is
  passed to that group, and if the job's `compo` dies (SIGKILL from a cancelled run) the server kills the group;
  the job's `compo` exits with the child's status, or dies of the child's signal.
What differs: the job's resource record (compo.resource_use) counts from the fork, without the imports it skipped.

Not used where a job must run in its own allocation: only the local executor starts one (no COMPO_FORKSERVER in a
cluster job's environment), and a job's `compo` inside a SLURM job, a torchrun rank or a container never asks.
Off on a machine with a GPU driver (GPU_DEVICE_FILES) unless COMPO_FORKSERVER=1; COMPO_FORKSERVER=0 before
`snakemake` turns it off.
A server serves one user (the folder is private, the peer's uid is checked), exits when the Snakemake that made
its folder ends or after IDLE_S without a job (its environment's next job starts another), and at most
MAX_SERVERS run per run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from compo.processes import alive, current_umask

ENV = "COMPO_FORKSERVER"
OFF, ON = "0", "1"
# A machine with these has a GPU driver: a child forked after the driver was touched cannot use it, and forking GPU
# jobs has not been run on one (no GPU was lent to this project's sessions), so there it is off unless
# COMPO_FORKSERVER=1. A GPU job's imports are seconds against its minutes.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")
# Set per job by Snakemake's shell (its tmpdir resource) or by the shell itself, and read by no library at import.
# The thread counts Snakemake sets per job (OMP_NUM_THREADS, ...) are not among them: OpenMP and OpenBLAS read them
# when torch and NumPy load, so jobs of different `threads` have servers of their own.
PER_JOB_KEYS = frozenset({"TMPDIR", "TMP", "TEMP", "TEMPDIR", "PWD", "OLDPWD", "SHLVL", "_"})
# A job in a SLURM allocation, a torchrun rank (whose environment is its rank's) or an Apptainer/Singularity
# container (a server started there would outlive its `apptainer exec` and hold that container's mounts): the job's
# own process
OWN_PROCESS_MARKS = ("SLURM_JOB_ID", "LOCAL_RANK", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")
MAX_SERVERS = 4
IDLE_S = 120.0  # COMPO_FORKSERVER_IDLE_S overrides: a server holds ~0.5 GB while it waits
SERVED_LOG = "served.log"
OWNER_FILE = "owner"
SERVE_FLAG = "--serve-jobs"  # a server's command line: `python -m compo --serve-jobs FOLDER KEY` (compo.cli)
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_MAX_SOCKET_PATH = 100  # sockaddr_un holds 108 bytes


def start(owner_pid: int) -> str | None:
    """Make the servers' folder for the run of process `owner_pid` (Snakemake) and return it; None where the
    environment turned the servers off, the machine has a GPU (unless COMPO_FORKSERVER=1), or the temporary
    folder's path is too long for a socket's."""
    setting = os.environ.get(ENV)
    if setting == OFF or (setting != ON and any(os.path.exists(path) for path in GPU_DEVICE_FILES)):
        return None
    folder = tempfile.mkdtemp(prefix="compo-forkserver-")  # mode 0700: no other user connects
    if len(os.path.join(folder, f"{'0' * 16}.sock")) > _MAX_SOCKET_PATH:
        os.rmdir(folder)
        return None
    Path(folder, OWNER_FILE).write_text(str(owner_pid))
    return folder


def stop(folder: str | None) -> int:
    """End the run's servers and remove their folder; returns how many jobs they ran."""
    if not folder or not os.path.isdir(folder):
        return 0
    for pid_file in Path(folder).glob("*.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
    served = Path(folder, SERVED_LOG)
    count = len(served.read_text().splitlines()) if served.exists() else 0
    shutil.rmtree(folder, ignore_errors=True)
    return count


def end_of_run() -> None:
    """Stop this run's servers (the folder COMPO_FORKSERVER names) and say how many jobs they ran."""
    served = stop(os.environ.get(ENV))
    if served:
        print(f"compo-study: {served} jobs forked from a server that imported torch once (compo.forkserver)",
              file=sys.stderr)


def environment_key(env: dict[str, str]) -> str:
    """The name of the server for a job of this environment: the environment less PER_JOB_KEYS, and the
    interpreter, hashed."""
    kept = sorted((key, value) for key, value in env.items() if key not in PER_JOB_KEYS)
    return hashlib.sha256(json.dumps([sys.executable, kept]).encode()).hexdigest()[:16]


# ---- the job's side ---------------------------------------------------------------------------------------------


def run_served(argv: Sequence[str], server_command: Sequence[str]) -> int | None:
    """Run the command line `argv` (sys.argv) in a child of this environment's server and return its wait status;
    None where it is to run here: no servers for this run, none yet for this environment (one is started with
    `server_command` + [folder, key]), or the server cannot take it."""
    folder = os.environ.get(ENV)
    own_process = any(mark in os.environ for mark in OWN_PROCESS_MARKS)
    if not folder or folder in (OFF, ON) or not os.path.isdir(folder) or own_process:
        return None
    key = environment_key(dict(os.environ))
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(os.path.join(folder, f"{key}.sock"))
    except OSError:
        connection.close()
        _start_server(folder, key, server_command)
        return None
    job: list[int] = []  # the job's pid once forked; a signal that comes before waits for it
    pending: list[int] = []

    def forward(number: int, _frame: object) -> None:
        if job:
            _signal_group(job[0], number)
        else:
            pending.append(number)

    with connection:
        request = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ),
                              "umask": current_umask()}).encode()
        defaults = {number: signal.signal(number, forward) for number in _FORWARDED}
        try:
            socket.send_fds(connection, [struct.pack("!I", len(request))], [0, 1, 2])
            connection.sendall(request)
            replies = connection.makefile("r")
            job.append(int(json.loads(replies.readline())["pid"]))
        except (OSError, ValueError, KeyError, TypeError):  # the server went away before it forked: run here
            for number, handler in defaults.items():
                signal.signal(number, handler)
            for number in pending:
                os.kill(os.getpid(), number)
            return None
        for number in pending:
            _signal_group(job[0], number)
        line = replies.readline()
    pid = job[0]
    if not line:  # the server died with the job (killed from outside): say so, as a crash would
        print(f"compo: the fork server running this job (pid {pid}) ended before it did", file=sys.stderr)
        return 1 << 8
    return int(json.loads(line)["status"])


def exit_as(status: int) -> None:
    """End this process as the child of wait status `status` ended: its exit code, or its signal."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        raise SystemExit(128 + number)  # a signal this process does not die of (SIGCHLD...)
    raise SystemExit(os.waitstatus_to_exitcode(status))


def _signal_group(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, number)


def _start_server(folder: str, key: str, command: Sequence[str]) -> None:
    """Start the server of environment `key` unless one is starting or the run has MAX_SERVERS already. It runs
    in a session of its own (a cancelled job does not take it down) with no stream of the job's open."""
    if len(list(Path(folder).glob("*.lock"))) >= MAX_SERVERS:
        return
    try:
        os.close(os.open(os.path.join(folder, f"{key}.lock"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:  # another job is starting it, or the folder is gone
        return
    with open(os.path.join(folder, f"{key}.log"), "ab") as log:
        subprocess.Popen([*command, folder, key], stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=folder,
                         start_new_session=True)


# ---- the server's side ------------------------------------------------------------------------------------------


def serve(folder: str, key: str, run: Callable[[list[str]], None], preimport: Callable[[], None]) -> None:
    """The server of environment `key` in `folder`: import (`preimport`), then fork a child for each job that
    connects, which calls `run(argv[1:])`; until the run's owner ends, the folder goes, SIGTERM, or IDLE_S pass
    without a job."""
    owner = int(Path(folder, OWNER_FILE).read_text())
    idle_s = float(os.environ.get(f"{ENV}_IDLE_S", IDLE_S))
    preimport()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    socket_path = os.path.join(folder, f"{key}.sock")
    listener.bind(socket_path)  # after the imports: the jobs that come meanwhile run themselves
    listener.listen(64)
    Path(folder, f"{key}.pid").write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # a child's end wakes the loop (its status goes to its job's compo at once, not at the next poll)
    child_ended, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    jobs: dict[int, socket.socket] = {}  # child pid: its job's connection
    last_job = time.monotonic()
    try:
        while alive(owner) and os.path.isdir(folder):
            if not jobs and time.monotonic() - last_job > idle_s:
                break
            readable, _, _ = select.select([listener, child_ended, *jobs.values()], [], [], 1.0)
            for ready in readable:
                if ready is child_ended:
                    os.read(child_ended, 4096)
                elif ready is listener:
                    forked = _fork_job(listener, jobs, run, folder, (child_ended, wake))
                    if forked:
                        last_job = time.monotonic()
                elif not ready.recv(1):  # the job's compo is gone: so is its job
                    pid = next(p for p, c in jobs.items() if c is ready)
                    _signal_group(pid, signal.SIGKILL)
            _reap(jobs)
    finally:
        for name in (f"{key}.sock", f"{key}.pid", f"{key}.lock"):  # a later job of this environment starts another
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        for pid in jobs:  # only on SIGTERM or the owner's end: what the run left running goes with it
            _signal_group(pid, signal.SIGKILL)
        if not alive(owner):  # the run ended without stopping its servers (killed): nothing is left of it
            shutil.rmtree(folder, ignore_errors=True)


def _fork_job(listener: socket.socket, jobs: dict[int, socket.socket], run: Callable[[list[str]], None],
              folder: str, wake_pipe: tuple[int, int]) -> bool:
    connection, _ = listener.accept()
    try:
        connection.settimeout(10)
        uid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        header, fds, _, _ = socket.recv_fds(connection, 4, 3)
        if uid != os.getuid() or len(fds) != 3 or len(header) != 4:
            raise ConnectionError(f"refused a connection (uid {uid}, {len(fds)} streams)")
        size, data = struct.unpack("!I", header)[0], b""
        while len(data) < size:
            chunk = connection.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the job's compo closed its request")
            data += chunk
        request = json.loads(data)
        connection.settimeout(None)
    except (OSError, ValueError, ConnectionError) as error:
        print(f"compo fork server: {error}", file=sys.stderr)
        connection.close()
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _be_the_job(request, fds, run, [listener, connection, *jobs.values()], wake_pipe)
    with contextlib.suppress(OSError):  # the child does it too: whichever comes first, the group exists now
        os.setpgid(pid, pid)
    for fd in fds:
        os.close(fd)
    with open(os.path.join(folder, SERVED_LOG), "a") as served:
        served.write(f"{pid} {' '.join(request['argv'][1:3])}\n")
    try:
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:  # gone already: its job goes too
        _signal_group(pid, signal.SIGKILL)
    jobs[pid] = connection
    return True


def _be_the_job(request: dict, fds: list[int], run: Callable[[list[str]], None], sockets: list,
                wake_pipe: tuple[int, int]) -> None:
    """In the forked child: become the job of `request` and exit as its command does; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wake_pipe:
            os.close(fd)
        for open_socket in sockets:
            open_socket.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        tempfile.tempdir = None  # read again from the job's TMPDIR
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        sys.argv = list(request["argv"])
        run(sys.argv[1:])
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
        if end.code is not None and not isinstance(end.code, int):
            print(end.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then exit status 1
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(jobs: dict[int, socket.socket]) -> None:
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = jobs.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(json.dumps({"status": status}).encode() + b"\n")
            connection.close()

