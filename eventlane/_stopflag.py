"""A stop request that a signal handler may set.

Invariant: :meth:`StopFlag.set` takes no lock. ``threading.Event.set`` takes its condition's
lock, so a handler calling it deadlocks when the signal interrupts the thread that holds that
lock: a second signal arriving during the first handler's ``set()`` (a worker gets SIGTERM
from its supervisor and, as the supervisor's thread ends, from the kernel's parent-death
signal at once), or the main thread inside ``event.wait()``. Waiting here polls (every
:data:`POLL_S`) instead of blocking on a condition; every wait in eventlane that uses it is
short or bounded anyway.
"""

from __future__ import annotations

import time

POLL_S = 0.02
"""How often :meth:`StopFlag.wait` looks at the flag."""


class StopFlag:
    """``threading.Event``'s ``set``/``is_set``/``wait``/``clear``, safe in a signal handler."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True  # one attribute store: no lock, atomic under the GIL

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._set:
            remaining = POLL_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(POLL_S, remaining))
        return True
