"""Waiting for appends without holding a thread: what makes an idle live tail free.

The log's wake-up word (:meth:`~eventlane.log.Log.wait_seq` / :meth:`~eventlane.log.Log.wait`)
is a blocking wait: a futex on the embedded log, a condition on JetStream. One thread per
console, :class:`Waker`'s, sleeps on it and, whenever the word changes, wakes every asyncio
waiter on the console's event loop. A live tail with nothing new is then one pending future:
600 idle tails hold no worker thread, so other pages keep the whole thread pool.

Invariants:

* no lost wake-up: :meth:`Waker.wait` returns once :meth:`~eventlane.log.Log.wait_seq`
  differs from the ``seen`` it was given. It registers its future, then checks the word
  again (on the event loop); the thread, whose starting value was read before that check,
  releases the registered futures on the event loop after every change it sees. So a
  change is either seen by the check or followed by a release (spurious returns are
  allowed: callers re-check what they wait for);
* :meth:`Waker.stop` releases every waiter and joins the thread; an error of the log's wait
  is logged and retried after a pause, never ends the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from eventlane.observability import get_logger

log = get_logger("eventlane.console")

__all__ = ["Waker"]

POLL_S = 1.0
"""Longest the thread sleeps on the word before it looks at its stop flag."""


class Waker:
    """Wakes asyncio waiters when the log's wake-up word changes (one thread in all)."""

    def __init__(self, seq: Callable[[], int], wait: Callable[[int, float], None]) -> None:
        self._seq = seq
        self._wait = wait
        self._waiters: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching, on behalf of the running event loop's waiters (once; the first
        :meth:`wait` starts it where nothing did)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(self._seq(),), name="console-waker", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=POLL_S * 5)
        self._release()

    async def wait(self, seen: int) -> None:
        """Return once the wake-up word differs from ``seen`` (or the waker stops)."""
        if self._seq() != seen or self._stopped.is_set():
            return
        self.start()
        future = asyncio.get_running_loop().create_future()
        self._waiters.add(future)
        try:
            if self._seq() != seen:  # changed before the thread could see it (its start)
                return
            await future
        finally:
            self._waiters.discard(future)

    def waiting(self) -> int:
        """How many waiters are parked now."""
        return len(self._waiters)

    def _release(self) -> None:
        """Resolve every parked future (on the event loop)."""
        waiters, self._waiters = self._waiters, set()
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def _notify(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._release)

    def _run(self, last: int) -> None:
        while not self._stopped.is_set():
            try:
                self._wait(last, POLL_S)
                now = self._seq()
            except Exception as exc:  # a log that is closing or cut off: keep watching
                log.warning("console waker: waiting on the log failed", error=str(exc))
                self._stopped.wait(POLL_S)
                continue
            if now != last:
                last = now
                self._notify()
        self._notify()
