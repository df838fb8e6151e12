"""Questions about processes that several modules ask, answered with the standard library only (compo.forkserver
runs in every job's `compo` before anything heavy is imported)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def current_umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask
