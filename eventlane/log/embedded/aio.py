"""The embedded log's asyncio face: blocking file work off the loop, in batches.

An async runtime (:mod:`eventlane.app.aio`) drives a command's plan on its event loop and
awaits the plan's log calls here (:class:`~eventlane.store.steps.AsyncSteps`). Nothing
here touches a file on the loop:

* a partition's **conditional appends** (the command path's: ``expect=``, ``atomic=True``)
  queue on the loop in that partition's :class:`_Lane`; while none of its batches is in
  flight the whole queue goes to a thread as one batch: written together under one hold
  of the partition's lock and made durable by one fsync
  (:meth:`~eventlane.log.embedded.store.LogStore.append_group`), and every awaiting task is
  woken by one call back onto the loop. Appends that arrive meanwhile form the next batch:
  concurrent awaits on one partition share one fsync (group commit), and a command costs
  the loop a future, not a thread hand-off of its own;
* **reads** (``read_key``, a snapshot topic's ``topic_exists``, a topic's metadata) queue
  in one read lane the same way, a batch of them in one thread hand-off;
* what is in memory is answered without an await (:meth:`AsyncLogStore.answer`: a topic's
  partition count while the store's metadata cache is fresh; whether a topic exists, from
  this face's answers of the last :data:`EXISTS_TTL_S`), and an open partition's marks
  (``offsets``: its memory-mapped state) are read in place; every other call of the port
  runs on the sync log in a thread (the runtime's pool). One read lane means one slow read
  (a key index catching up with a long tail) delays the reads queued behind it, not the
  appends.

Invariants: each queued call is performed exactly once, by one batch; a batch's outcomes
are given to their awaiters in the order queued; at most one batch of a lane is in flight
(the next starts from the loop when it ends), so a lane's order is the loop's. An awaiter
cancelled while its append is in a batch does not stop it: the append may be stored (as
with any request whose answer is lost). Group commit's durability rules are the
partition's own (:mod:`.partition`: nobody is told an offset before an fsync covers it; a
failed fsync fails every append it would have covered).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from eventlane import _plans
from eventlane.errors import LogError
from eventlane.log.port import KeyedLog
from eventlane.log.types import AppendResult, Expect, PartitionOffsets, RecordTuple

if TYPE_CHECKING:
    from eventlane.log.record import Record


class Store(KeyedLog, Protocol):
    """What the face calls of :class:`~eventlane.log.embedded.store.LogStore`: the keyed
    port and two calls of its own (named here structurally: the store makes the face, so
    this module does not import it)."""

    def is_open(self, topic: str, partition: int) -> bool: ...
    def cached_partition_count(self, name: str) -> int | None: ...
    def append_group(
        self, topic: str, partition: int, appends: Sequence[tuple[Sequence[RecordTuple], Expect]]
    ) -> list[AppendResult | Exception]: ...


EXISTS_TTL_S = 0.5
"""How long an answer of :meth:`AsyncLogStore.topic_exists` is given again from memory (the
store's own metadata cache holds a topic's partition count as long: a snapshot topic
created meanwhile is used by loads this much later, as on JetStream's face)."""

THREADS = 16
"""Threads of the face's pool: one per partition with a batch in flight, and the reads."""

Batch = Callable[[list[Any]], list[Any]]
"""A lane's work: the queued items in, one outcome each out (an :class:`Exception` for one
that failed), in a thread."""


Queued = tuple[Any, "asyncio.Future[Any]"]
"""An item in a lane, and the future its awaiter waits on."""


class _Lane:
    """Items queued on the loop and handed to a thread as batches, one in flight at a time
    (module docstring)."""

    __slots__ = ("_batch", "_busy", "_face", "_queue")

    def __init__(self, face: AsyncLogStore, batch: Batch) -> None:
        self._face = face
        self._batch = batch
        self._queue: list[Queued] = []
        self._busy = False

    def call(self, item: Any) -> asyncio.Future[Any]:
        future = self._face.loop.create_future()
        self._queue.append((item, future))
        if not self._busy:
            self._start()
        return future

    def _start(self) -> None:
        queued, self._queue = self._queue, []
        face = self._face
        try:
            done = face.loop.run_in_executor(face.pool, self._batch, [item for item, _ in queued])
        except RuntimeError as exc:  # the pool was shut down (the face closed): not started
            refused = LogError(f"the embedded log's asyncio face is closed: {exc}")
            for _, future in queued:
                if not future.done():
                    future.set_exception(refused)
            return
        self._busy = True
        face.in_flight.add(done)
        done.add_done_callback(functools.partial(self._settle, queued))

    def _settle(self, queued: list[Queued], done: asyncio.Future[Any]) -> None:
        self._busy = False
        self._face.in_flight.discard(done)
        failed = asyncio.CancelledError() if done.cancelled() else done.exception()
        outcomes: list[Any] = [failed] * len(queued) if failed is not None else done.result()
        for (_, future), outcome in zip(queued, outcomes, strict=True):
            if future.done():  # its awaiter was cancelled
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if self._queue:
            self._start()


def _calls(calls: list[Callable[[], Any]]) -> list[Any]:
    """A read lane's batch: each call made in turn, its result or its exception."""
    outcomes: list[Any] = []
    for call in calls:
        try:
            outcomes.append(call())
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


class AsyncLogStore:
    """The asyncio face of a :class:`~eventlane.log.embedded.store.LogStore` (module
    docstring); made by ``LogStore.async_face()``, opened on the loop that uses it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="eventlane-files")
        self.in_flight: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._appends: dict[tuple[str, int], _Lane] = {}
        self._reads = _Lane(self, _calls)
        self._exists: dict[str, tuple[bool, float]] = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the embedded log's asyncio face is not open: await open()")
        return self._loop

    async def open(self) -> AsyncLogStore:
        self._loop = asyncio.get_running_loop()
        return self

    async def close(self) -> None:
        """Wait for the batches in flight (their appends run to their end), then let the
        pool's threads go."""
        while self.in_flight:
            await asyncio.gather(*self.in_flight, return_exceptions=True)
        self.pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncLogStore:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ from memory
    def answer(self, method: str, args: tuple[Any, ...]) -> Any:
        """What ``await getattr(self, method)(*args)`` answers now from memory (a topic's
        partition count, from the store's cache; a :meth:`topic_exists` answered within
        :data:`EXISTS_TTL_S`), else :data:`eventlane._plans.ASK`."""
        if method == "partition_count" and len(args) == 1:
            count = self.store.cached_partition_count(args[0])
            return _plans.ASK if count is None else count
        if method == "topic_exists" and len(args) == 1:
            known = self._exists.get(args[0])
            if known is not None and time.monotonic() - known[1] < EXISTS_TTL_S:
                return known[0]
        return _plans.ASK

    async def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        """The partition's marks, read from its memory-mapped state (opened in a thread
        the first time)."""
        store = self.store
        if not store.is_open(topic, partition):
            marks: PartitionOffsets = await self._read(
                functools.partial(store.offsets, topic, partition)
            )
            return marks
        return store.offsets(topic, partition)

    # ------------------------------------------------------------------ in threads
    async def partition_count(self, name: str) -> int:
        """The topic's metadata read afresh (a ``stat``, its file when it changed)."""
        count: int = await self._read(functools.partial(self.store.partition_count, name))
        return count

    async def topic_exists(self, name: str) -> bool:
        exists: bool = await self._read(functools.partial(self.store.topic_exists, name))
        self._exists[name] = (exists, time.monotonic())
        return exists

    async def read_key(
        self, topic: str, partition: int, key: bytes, *, after: int | None = None
    ) -> list[Record]:
        records: list[Record] = await self._read(
            functools.partial(self.store.read_key, topic, partition, key, after=after)
        )
        return records

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
    ) -> AppendResult:
        """The port's append: a conditional atomic one in its partition's next batch (module
        docstring), any other in a thread of its own."""
        if expect is None or not atomic:
            result: AppendResult = await self.loop.run_in_executor(
                self.pool,
                functools.partial(
                    self.store.append, topic, partition, records, expect=expect, atomic=atomic
                ),
            )
            return result
        lane = self._appends.get((topic, partition))
        if lane is None:
            lane = self._appends[(topic, partition)] = _Lane(
                self, functools.partial(self.store.append_group, topic, partition)
            )
        appended: AppendResult = await lane.call((records, expect))
        return appended

    async def _read(self, call: Callable[[], Any]) -> Any:
        return await self._reads.call(call)
