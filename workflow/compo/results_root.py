"""The results root: writable before any job runs, and one study at a time.

A study locks its results root with `.compo-study.lock` (JSON: host, pid, start time, working directory):
taken when Snakemake starts running jobs (the Snakefile's `onstart`), removed when it ends (`onsuccess`,
`onerror`, or at the process's exit). Snakemake's own lock covers one working directory; this one covers
the results folder, which two checkouts may share (an absolute `results`). A second study there is
refused, naming the first. Snakemake's modes that delete or write outputs without running jobs
(`compo.profiles.DESTRUCTIVE_OPTIONS`: --delete-all-output, --delete-temp-output, --touch,
--cleanup-metadata) take the lock too, where the Snakefile is parsed, so they are refused while a study runs
there. A lock whose process is gone (same host, pid not running) is stale: it is taken over with a warning. A lock from
another host cannot be checked: the message says to delete it if that run is over.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import socket
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from compo.config_names import ConfigError
from compo.io import is_disk_full
from compo.processes import alive, current_umask

log = logging.getLogger(__name__)

LOCK_FILE = ".compo-study.lock"
# Snakemake's options (argparse dests) that change outputs or their metadata outside jobs


class StudyLockError(RuntimeError):
    """Another study holds the results root; the message names it."""


def check_writable(results: str | Path) -> None:
    """A ConfigError unless a file can be created in `results`, or in the nearest folder above it that
    exists (where the results root will be made). The probe file is anonymous: nothing is left behind."""
    existing = Path(results)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"config key results: {results} cannot be written ({existing} is not a folder)")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ConfigError(f"config key results: {results} cannot be written (creating a file in {existing}: "
                          f"{error.strerror}); set results to a folder you can write") from None


class StudyLock:
    """The lock of one results root (module docstring)."""

    def __init__(self, results: str | Path) -> None:
        self.results = Path(results)
        self.path = self.results / LOCK_FILE
        self.held = False

    def _record(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid(),
                "started": datetime.now().isoformat(timespec="seconds"), "workdir": os.getcwd()}

    def _holder(self) -> dict[str, Any] | None:
        try:
            record = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def _describe(self, holder: dict[str, Any]) -> str:
        parts = [f"{key} {holder[key]}" for key in ("host", "pid", "started") if key in holder]
        parts += [f"in {holder['workdir']}"] if holder.get("workdir") else []
        return f"({', '.join(parts)})" if parts else "(its lock file is unreadable)"

    def acquire(self) -> StudyLock:
        """Take the lock (or keep it, when this process holds it); StudyLockError when another study has it, or
        when the results folder's disk is full (the lock is the first thing a study writes there)."""
        try:
            return self._acquire()
        except OSError as error:
            if not is_disk_full(error) and error.errno != errno.EDQUOT:
                raise
            reason = "over its quota (EDQUOT)" if error.errno == errno.EDQUOT else "full (ENOSPC)"
            raise StudyLockError(f"{self.results}: the disk holding the results folder is {reason}: the study lock "
                                 f"{self.path} could not be written, before any job ran ({error.strerror}); free "
                                 "space there or set the config key results to a folder on a disk with room"
                                 ) from error

    def _candidate(self) -> str:
        """This process's lock record written whole under a temporary name (nothing left behind on failure)."""
        handle = tempfile.NamedTemporaryFile("w", dir=self.results, prefix=".compo-study.", delete=False)
        try:
            with handle:
                json.dump(self._record(), handle)
            os.chmod(handle.name, 0o666 & ~current_umask())  # others sharing the folder can read who holds it
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise
        return handle.name

    def _acquire(self) -> StudyLock:
        self.results.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            # written whole under another name, then linked into place: the lock file is never half-written,
            # and link (like O_EXCL) fails when the lock exists, also on NFS
            candidate = self._candidate()
            try:
                os.link(candidate, self.path)
            except FileExistsError:
                holder = self._holder()
            else:
                holder = None
            finally:
                os.unlink(candidate)
            if holder is None:
                self.held = True
                atexit.register(self.release)
                return self
            if holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid():
                self.held = True
                return self
            if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) \
                    and not alive(holder["pid"]):
                log.warning("%s: stale lock of pid %d (no longer running) %s taken over", self.path, holder["pid"],
                            self._describe(holder))
                self.path.unlink(missing_ok=True)
                continue
            raise StudyLockError(f"{self.results}: another study is running on these results "
                                 f"{self._describe(holder)}; wait for it to end or set results elsewhere (if that "
                                 f"run is over, e.g. its machine died, delete {self.path})")
        raise StudyLockError(f"{self.path}: could not take the lock (it kept changing); try again")

    def release(self) -> None:
        """Remove the lock if this process holds it."""
        if not self.held:
            return
        holder = self._holder()
        if holder and holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False
