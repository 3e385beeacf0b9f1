"""A worker process ends when its supervisor dies: no orphan keeps its partitions.

The runner (``eventlane project run``) passes its pid in ``EVENTLANE_SUPERVISOR_PID``. A
worker started with it calls :func:`follow_supervisor` first thing: on Linux it asks the
kernel (``prctl(PR_SET_PDEATHSIG, SIGTERM)``) to send it SIGTERM when the supervisor dies,
even by SIGKILL, and then checks that the supervisor did not die before that request (its
parent pid would no longer be the supervisor's). SIGTERM is the worker's ordinary stop:
finish the batch, commit, leave the group, so its partitions move to live members at once.
Elsewhere :func:`supervisor_gone` lets the worker's loop notice the re-parenting instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

from eventlane.observability import get_logger

log = get_logger("eventlane.projection")

SUPERVISOR_ENV = "EVENTLANE_SUPERVISOR_PID"
WORKER_TAG_ENV = "EVENTLANE_WORKER_TAG"
"""A name the runner gives each worker process it starts, unique to that process: the
worker joins its group with it as its client id, so the runner can find the member of a
worker it saw die (and only that worker's) and make it leave (:mod:`.runner`)."""
_PR_SET_PDEATHSIG = 1


def supervisor_pid() -> int | None:
    """The supervisor's pid from the environment, ``None`` when run on its own."""
    text = os.environ.get(SUPERVISOR_ENV, "")
    return int(text) if text.isdigit() else None


def worker_client_id() -> str:
    """The client id this worker joins its group with: the runner's tag, else the default."""
    return os.environ.get(WORKER_TAG_ENV) or "eventlane"


def supervisor_gone() -> bool:
    """True when this process has a supervisor and it is no longer its parent."""
    pid = supervisor_pid()
    return pid is not None and os.getppid() != pid


def follow_supervisor() -> bool:
    """Arrange SIGTERM for this process when its supervisor dies; True if the kernel took
    the request (Linux). If the supervisor is already gone, SIGTERM is sent at once."""
    pid = supervisor_pid()
    if pid is None:
        return False
    armed = False
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        armed = bool(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0)
        if not armed:
            log.warning("prctl(PR_SET_PDEATHSIG) failed", errno=ctypes.get_errno())
    if os.getppid() != pid:  # died before the request: the kernel will not signal
        os.kill(os.getpid(), signal.SIGTERM)
    return armed
