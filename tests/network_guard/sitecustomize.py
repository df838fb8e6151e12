"""Network denial for the offline cluster test: a Python process started with this folder on PYTHONPATH
imports this module at start-up (site.py's sitecustomize), and from then on every socket connection and name
lookup that leaves the machine is refused and recorded in the file $COMPO_NETWORK_LOG. Loopback (SLURM's
daemons, the torch distributed store) and Unix sockets stay allowed.
"""

import os
import sys

_LOG = os.environ.get("COMPO_NETWORK_LOG")
_LOCAL_PREFIXES = ("127.", "::1", "0.0.0.0", "localhost")


def _local(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    return host is None or (isinstance(host, str) and (host == "" or host.startswith(_LOCAL_PREFIXES)))


def _refuse(what: str) -> None:
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as handle:
            handle.write(f"pid {os.getpid()} {' '.join(sys.argv[:3])}: {what}\n")
    raise OSError(f"network access refused by the offline test: {what}")


def _audit(event: str, args: tuple) -> None:
    if event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and not _local(address[0]):
            _refuse(f"connect to {address[:2]}")
    elif event == "socket.getaddrinfo" and not _local(args[0]):
        _refuse(f"look up {args[0]!r}")


sys.addaudithook(_audit)
