"""The process-wide budget of file descriptors the open partitions may keep between calls.

A partition keeps its lock file, its active segment and both indexes, its state mapping
(``mmap`` holds a descriptor) and the segments it read open between calls: ~5 descriptors.
A process that touches thousands of partitions would run out (``ulimit -n`` is often 1024,
and a topic may have 10,000 partitions). Each holder that opens descriptors registers here;
past ``limit`` warm holders, the least recently used half gives its descriptors back (one
busy in another thread is skipped) and reopens them on next use. The limit is a sixteenth
of the soft ``RLIMIT_NOFILE`` (read once, at import), at least 8.
"""

from __future__ import annotations

import itertools
import resource
import threading
from typing import Protocol

__all__ = ["FDS", "FdBudget", "FdHolder", "next_use"]


class FdHolder(Protocol):
    """What the budget needs of a partition."""

    @property
    def last_used(self) -> int:
        """When it was last used (:func:`next_use` values; larger is more recent)."""

    def release_fds(self) -> bool:
        """Close the descriptors it keeps; ``False`` if busy (nothing closed)."""


_USES = itertools.count()


def next_use() -> int:
    """An ever-increasing use stamp (cheaper than a clock)."""
    return next(_USES)


class FdBudget:
    """See the module docstring."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is None:
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            limit = (soft if soft > 0 else 1024) // 16
        self.limit = max(8, limit)
        self._warm: dict[FdHolder, None] = {}
        self._lock = threading.Lock()

    def opened(self, holder: FdHolder) -> None:
        """``holder`` opened descriptors: register it, and release the coldest if over."""
        with self._lock:
            self._warm[holder] = None
            excess = len(self._warm) - self.limit
            if excess <= 0:
                return
            by_age = sorted(self._warm, key=lambda h: h.last_used)
            victims = [h for h in by_age[: excess + self.limit // 2] if h is not holder]
        released = [h for h in victims if h.release_fds()]
        with self._lock:
            for h in released:
                self._warm.pop(h, None)

    def forget(self, holder: FdHolder) -> None:
        """``holder`` closed for good."""
        with self._lock:
            self._warm.pop(holder, None)


FDS = FdBudget()
"""The budget every partition of this process shares."""
