"""Local server processes by PID: what a local development cluster of any engine needs.

A local cluster (``eventlane.log.jetstream.cluster``, ``eventlane.log.kafka.cluster``)
starts N server processes on loopback ports, records their PIDs in its directory, and stops
them by those PIDs, never by name. Invariants: :func:`stop_pid` returns only once the process
is gone (or its PID was reused by nothing): SIGKILL follows the signal after ``grace``
seconds; :func:`alive` counts a zombie (exited, not reaped yet) as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (reaps it first if it is our exited child)."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, its parent, another process, not reaping yet) is gone
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def stop_pid(pid: int, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Signal ``pid`` and wait (bounded) until it is gone; SIGKILL after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + grace
    while alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10.0
        time.sleep(0.05)
