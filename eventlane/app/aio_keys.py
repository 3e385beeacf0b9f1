"""Keeping an async runtime's key store caught up from its event loop.

A :class:`~eventlane.codec.keystore.LogKeyStore` catches up with its topic (reads its
high-water marks, and the records past its position) when a key is asked for more than half
``refresh_ms`` after its last catch-up, in the caller's thread: on an event loop that is a
round trip through the sync log that stalls every task. An async runtime on a log with an
asyncio face (JetStream) encodes an event with personal fields on the loop when the
subject's key is in memory (a subject's first key, a read and a write, is encoded in a
thread) and runs a :class:`KeyTail` beside it: while commands flow, it reads the key
topic's marks on the face every quarter of ``refresh_ms`` and, when they show nothing new,
counts that as the store's catch-up (:meth:`~eventlane.codec.keystore.LogKeyStore.caught_up`);
when they do, the store catches up in a thread. A command about to encode a personal field
while the store is due awaits that catch-up (:meth:`KeyTail.freshen`: one for all the
commands that found it due) instead of making it in place, which blocked the loop for a round
trip through the sync log's bridge (measured: 220 such stalls in 1,000 commands with 64
tasks, 1.9 s of the loop's time). The store's freshness rule is unchanged (it is as fresh as
a catch-up begun when the marks were asked); the loop makes a catch-up itself only when the
face's round trip failed or took longer than half ``refresh_ms`` (a saturated machine).

Measured on a 2-core machine at load 15-18 (HTTP, 64 clients, JetStream): handing every
encoding to a thread whenever a catch-up was due made the async endpoints 2-3x slower than
encoding in place, the round trips of the pool's threads slowing the loop more than one
catch-up on it; so a due catch-up alone does not send the encoding to a thread.

Invariants: the tail reads only marks on the loop (no record, no write); at most one
catch-up of the tail is in flight (``_fresh``); it is idle while no command has run for
:data:`IDLE_S`; an error of the log is left to the encoding, which finds the store due and
catches up itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from eventlane.errors import FrameworkError
from eventlane.observability import get_logger

log = get_logger("eventlane.app")

IDLE_S = 1.0
"""After this long without a command the tail stops reading marks until the next one."""


class KeyTail:
    """Catches ``keys`` up from the loop through ``face`` (module docstring); ``offload``
    runs a blocking call in the runtime's pool. :meth:`touch` on every command."""

    def __init__(
        self, keys: Any, face: Any, offload: Callable[[Callable[[], Any]], Awaitable[Any]]
    ) -> None:
        self.keys = keys
        self.face = face
        self.offload = offload
        self.used = 0.0  # monotonic time of the last command
        self._task: asyncio.Task[None] | None = None
        self._fresh: asyncio.Task[None] | None = None  # the catch-up in flight (freshen)

    @staticmethod
    def wanted(keys: Any, face: Any) -> bool:
        """Whether ``keys`` is a store that catches up with a log (and there is a face)."""
        return face is not None and callable(getattr(keys, "caught_up", None))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="eventlane-keys")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._fresh) if t is not None]
        self._task = self._fresh = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def touch(self) -> None:
        self.used = time.monotonic()

    async def freshen(self) -> None:
        """Catch the store up now, without blocking the loop (a command about to encode a
        personal field found it due): concurrent callers share one catch-up, the marks read
        on the face and the records, if any are new, in a thread. An error of the log is
        left to the encoding, which finds the store still due and catches up itself."""
        task = self._fresh
        if task is None or task.done():  # (done: its callback has not run yet)
            task = self._fresh = asyncio.get_running_loop().create_task(self._catch_up())
            task.add_done_callback(self._freshened)
        await asyncio.shield(task)  # a caller cancelled does not cancel the others' catch-up

    def _freshened(self, task: asyncio.Task[None]) -> None:
        if self._fresh is task:
            self._fresh = None

    async def _catch_up(self) -> None:
        keys = self.keys
        if not keys.partitions:
            return  # no key topic yet (the first key's write reads it)
        asked = time.monotonic()
        try:
            marks = [await self.face.offsets(keys.topic, p) for p in range(keys.partitions)]
        except FrameworkError as exc:
            log.debug("key topic marks not read", topic=keys.topic, error=str(exc))
            return
        if not keys.caught_up([m.hwm for m in marks], asked):
            try:
                await self.offload(keys.catch_up)
            except FrameworkError as exc:
                log.debug("key store catch-up failed", topic=keys.topic, error=str(exc))

    async def _run(self) -> None:
        period = self.keys.refresh_seconds / 4
        while True:
            await asyncio.sleep(period)
            if time.monotonic() - self.used <= IDLE_S:  # (idle: nothing to keep fresh for)
                await self.freshen()
