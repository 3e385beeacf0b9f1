"""One flock() helper for every lock file eventlane keeps (replaces five hand-written ones).

A :class:`FileLock` is an exclusive ``flock`` on one file, shared by the threads of this
object and the processes that lock the same file:

* **reentrant**: the threads of one object queue on an ``RLock``; a thread that holds the
  lock may take it again, and only the outermost release drops the ``flock``;
* **blocking, non-blocking or polled**: ``acquire()`` waits, ``acquire(blocking=False)``
  answers at once, ``acquire(timeout=s)`` polls (0.1 ms growing to 1 ms) until ``s`` seconds
  pass, so a holder frozen by SIGSTOP makes the others give up instead of hang;
* **died with its holder**: a ``flock`` is released when its process dies (``kill -9``), so
  no lock is ever stale;
* **descheduled holders, on purpose**: with ``EVENTLANE_PAUSES`` set (tests only, see
  :mod:`eventlane._pauses`) a holder sleeps a random time after taking the lock and before
  letting go of it, as a loaded host may stop it there;
* **re-created files**: with ``follow_replacement=True`` a lock whose file was deleted (or
  replaced) while we waited is taken again on the new file, so two processes never both
  believe they hold it (used where a directory can be deleted and re-created).

The descriptor is opened on first use and kept until :meth:`close` (or :meth:`release_fd`
when the lock is not held, to give descriptors back).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from eventlane._pauses import PAUSE
from eventlane.observability import lock_released, lock_taken

__all__ = ["FileLock", "open_rw_or_read_only"]

_POLL_START_S = 0.0001
_POLL_MAX_S = 0.001


READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
"""What opening a file for writing fails with on a read-only mount or directory."""


def open_rw_or_read_only(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> tuple[int, bool]:
    """``(fd, read_only)``: ``path`` opened with ``flags``, or, where the data directory
    cannot be written (a read-only mount), an existing ``path`` opened read-only."""
    try:
        return os.open(path, flags, 0o644), False
    except OSError as exc:
        if exc.errno not in READ_ONLY_ERRNOS or not path.exists():
            raise
        return os.open(path, os.O_RDONLY), True


class FileLock:
    """An exclusive, reentrant ``flock`` on ``path`` (see the module docstring)."""

    __slots__ = ("_depth", "_fd", "_follow", "_mutex", "path")

    def __init__(self, path: Path, *, follow_replacement: bool = False) -> None:
        self.path = path
        self._follow = follow_replacement
        self._mutex: threading.RLock = threading.RLock()
        self._fd = -1
        self._depth = 0

    @property
    def mutex(self) -> threading.RLock:
        """The lock this object's threads queue on before the ``flock`` (hold it alone to
        keep this object's threads out without touching other processes)."""
        return self._mutex

    @property
    def held(self) -> bool:
        """Whether some thread of this object holds the lock now."""
        return self._depth > 0

    def _open(self) -> int:
        if self._fd < 0:
            if self._follow:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd, _ = open_rw_or_read_only(self.path)  # flock needs no write access
        return self._fd

    def _try_flock(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _flock(self, blocking: bool, timeout: float | None) -> bool:
        while True:
            fd = self._open()
            if timeout is not None:
                delay, deadline = _POLL_START_S, time.monotonic() + timeout
                while not self._try_flock(fd):
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(delay)
                    delay = min(delay * 2, _POLL_MAX_S)
            elif blocking:
                fcntl.flock(fd, fcntl.LOCK_EX)
            elif not self._try_flock(fd):
                return False
            if not self._follow or self._same_file(fd):
                return True
            os.close(fd)  # the file was replaced while we waited: lock the new one
            self._fd = -1

    def _same_file(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def acquire(self, *, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; ``False`` if it was not free (non-blocking) or not in ``timeout``."""
        if timeout is not None:
            if not self._mutex.acquire(timeout=max(timeout, 0.0)):
                return False
        elif not self._mutex.acquire(blocking=blocking):
            return False
        if self._depth:
            self._depth += 1
            return True
        try:
            got = self._flock(blocking, timeout)
        except BaseException:
            self._mutex.release()
            raise
        if not got:
            self._mutex.release()
            return False
        self._depth = 1
        lock_taken()
        if PAUSE is not None:  # fault injection (tests): descheduled holding the lock
            PAUSE(f"locked {self.path}")
        return True

    def release(self) -> None:
        """Drop one level of the lock; the outermost release drops the ``flock``."""
        if PAUSE is not None and self._depth == 1:  # fault injection: about to let go
            PAUSE(f"unlocking {self.path}")
        self._depth -= 1
        try:
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            last = self._depth == 0
            self._mutex.release()
            if last:
                lock_released()  # logs what was deferred under the lock

    @contextlib.contextmanager
    def hold(self, *, blocking: bool = True, timeout: float | None = None) -> Iterator[bool]:
        """``with lock.hold(...) as held:``: held is ``False`` when the lock was not taken."""
        got = self.acquire(blocking=blocking, timeout=timeout)
        try:
            yield got
        finally:
            if got:
                self.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release_fd(self) -> bool:
        """Close the descriptor if no thread holds the lock (it is reopened on next use)."""
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            if self._depth or self._fd < 0:
                return False
            os.close(self._fd)
            self._fd = -1
            return True
        finally:
            self._mutex.release()

    def close(self) -> None:
        """Close the descriptor (releasing the ``flock`` if a thread still held it)."""
        with self._mutex:  # held by this thread if it holds the lock (_depth > 0)
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._depth:
                self._depth = 0
                lock_released()
