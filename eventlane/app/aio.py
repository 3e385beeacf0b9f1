"""The asyncio face of a runtime: ``async with app.open_async(data) as runtime``.

The same core as the sync :class:`~eventlane.app.application.Runtime`, not a second copy:
commands run the command path's one plan (:mod:`eventlane.store.command`: load, decide,
encode, check versions, retry, settle unknown outcomes) and causal waits the one causal plan
(:mod:`eventlane.app.causal`), both driven here on the event loop by the one plan driver
(:mod:`eventlane._plans`). What differs is only who performs the I/O (:meth:`_perform`):

* the log's calls (:class:`~eventlane.store.steps.LogCall`: appends, per-key reads, key
  heads) are awaited on the log's asyncio face (its ``async_face()``), opened on this loop
  beside the sync log; the calls a face lacks run in the pool on the sync log. JetStream's
  (:class:`~eventlane.log.jetstream.aio.AsyncJetStreamLog`) talks to the servers on this
  loop: no thread, no bridge. The embedded log's
  (:class:`~eventlane.log.embedded.aio.AsyncLogStore`) keeps every file off the loop: a
  partition's conditional appends queue on the loop and go to a thread together, written as
  one group under one fsync, every awaiter woken by one call back (group commit at a
  future's cost a command: a whole plan in a pool thread cost a hand-off and its wake-ups
  per command, more CPU than the sync face); reads go to a thread in batches the same way;
* an engine without a face runs a command's whole plan in ONE hop to the pool
  (:meth:`_drive`), driven there by the sync face's driver
  (:func:`eventlane.store.steps.drive`);
* encoding an event with personal fields runs on the loop when its subject's key is in
  memory, in the pool when the key store must read or write a record for it; a
  :class:`~.aio_keys.KeyTail` keeps the store caught up from the loop (:mod:`.aio_keys`);
  decoding such events (a load) and encrypted snapshots runs in the pool;
* other blocking work (a snapshot write, a read model's look) runs in the pool; waits poll
  the read model without holding a thread. The command itself (sync: it decides on the
  aggregate, it does no I/O) runs on the loop with a face, in the pool without one.

Closing: ``close()`` (the end of ``async with``) refuses new calls at once
(:class:`~eventlane.errors.RuntimeClosedError`: not started, nothing written), waits for
the calls in flight to end (each ends as it would have: a command settles, a wait reaches its
position or its timeout), and only then closes the log's face and the runtime under them.

Thread-safety and cancellation: an :class:`AsyncRuntime` belongs to one event loop. A
command whose awaiting task is cancelled while its append is in flight may still be stored
(an append in a thread runs to its end; one on JetStream's face may reach the server);
the caller just does not learn which, as with any request whose answer is lost: read the
aggregate (or wait for its position) before deciding again.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from eventlane import _plans
from eventlane.app.aio_keys import KeyTail
from eventlane.app.causal import Reach, as_position, causal_plan, check_position
from eventlane.codec import Envelope
from eventlane.consumer import Consumer, GroupConsumer
from eventlane.domain import Aggregate
from eventlane.errors import RuntimeClosedError
from eventlane.log import Log, Record, RecordMetadata, TopicPartition
from eventlane.log.position import Position, Written
from eventlane.projection.store import Location, open_view
from eventlane.store import steps as _steps
from eventlane.store.steps import AsyncSteps, Freshen
from eventlane.tracing import command_span

A = TypeVar("A", bound=Aggregate)
T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_THREADS = 64
"""Threads of an async runtime's pool: at most this many blocking calls (appends, reads)
run at once; concurrent appends to one partition share an fsync."""

_POLL_FIRST_S, _POLL_MAX_S = 0.002, 0.05


def _call(
    method: Callable[Concatenate[AsyncRuntime, P], Awaitable[T]],
) -> Callable[Concatenate[AsyncRuntime, P], Awaitable[T]]:
    """A public call of :class:`AsyncRuntime`: refused once ``close()`` began, counted while
    in flight so that ``close()`` waits for it (module docstring)."""

    @functools.wraps(method)
    async def call(self: AsyncRuntime, /, *args: P.args, **kwargs: P.kwargs) -> T:
        self._enter(method.__name__)
        try:
            return await method(self, *args, **kwargs)
        finally:
            self._leave()

    return call


class AsyncRuntime:
    """An :class:`~eventlane.app.application.App` connected to a log, for asyncio code
    (module docstring). Use as ``async with app.open_async(log) as runtime``; ``sync`` is
    the sync runtime underneath (typed loosely: this module sits below it)."""

    def __init__(self, open_sync: Callable[[], Any], *, threads: int = DEFAULT_THREADS) -> None:
        self._open_sync = open_sync
        """Opens the sync :class:`~eventlane.app.application.Runtime` (``App.open_async``
        passes ``App.open`` with its arguments)."""
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="eventlane-aio")
        self._runtime: Any = None
        self._face: Any = None
        """The log's asyncio face (``None``: the engine has none; a plan in one pool hop)."""
        self._steps: Any = None
        """How a plan's steps run (:class:`AsyncSteps`), set once open."""
        self._keys: KeyTail | None = None
        """Keeps the key store caught up from the loop (:mod:`.aio_keys`), where wanted."""
        self._closing = False
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        """Set while no call is in flight (made on the loop by :meth:`open`)."""

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> AsyncRuntime:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the log and the runtime (file work, off the loop), and the log's asyncio
        face on this loop where the engine has one (its ``async_face()``)."""
        if self._runtime is None:
            self._closing = False
            self._idle = asyncio.Event()
            self._idle.set()
            runtime = await self._offload(self._open_sync)
            make_face = getattr(runtime.log, "async_face", None)
            try:
                face = None if make_face is None else await make_face().open()
            except BaseException:
                await self._offload(runtime.close)
                raise
            self._runtime, self._face = runtime, face
            self._steps = AsyncSteps(runtime.log, face, self._offload)
            if KeyTail.wanted(runtime.keys, face):
                self._keys = KeyTail(runtime.keys, face, self._offload)
                self._keys.start()

    async def close(self) -> None:
        """Refuse new calls, wait for the calls in flight to end, then close the log's face
        and the runtime (module docstring)."""
        self._closing = True
        if self._idle is not None:
            await self._idle.wait()
        runtime, self._runtime = self._runtime, None
        face, self._face = self._face, None
        keys, self._keys = self._keys, None
        try:
            if keys is not None:
                await keys.stop()
            if face is not None:
                await face.close()
        finally:
            if runtime is not None:
                await self._offload(runtime.close)
            self._pool.shutdown(wait=False)

    def _enter(self, what: str) -> None:
        if self._closing or self._runtime is None:
            raise RuntimeClosedError(
                f"the async runtime is {'closing' if self._runtime else 'not open'}:"
                f" {what}() was not started, nothing of it was written"
            )
        self._in_flight += 1
        if self._idle is not None:
            self._idle.clear()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    @property
    def sync(self) -> Any:
        """The sync runtime underneath (status, read-model paths; for threads)."""
        if self._runtime is None:
            raise RuntimeClosedError("the async runtime is not open: use `async with`")
        return self._runtime

    @property
    def log(self) -> Log:
        log: Log = self.sync.log
        return log

    @property
    def app(self) -> Any:
        """The :class:`~eventlane.app.application.App`."""
        return self.sync.app

    async def _offload(self, fn: Callable[[], T]) -> T:
        # in a copy of the caller's context: the current span (tracing) follows the call
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, context.run, fn)

    async def _perform(self, step: Any) -> Any:
        """Perform one step of a plan (module docstring): a causal wait's reach on the
        loop, every other step by :class:`~eventlane.store.steps.AsyncSteps` (log calls on
        the asyncio face where it has the method, cheap ones in place, the rest in the
        pool)."""
        if isinstance(step, Reach):
            return await self._reach(step.path, step.offsets, step.deadline)
        if self._keys is not None:
            self._keys.touch()
            if isinstance(step, Freshen):
                return await self._keys.freshen()
        return await self._steps(step)

    async def _drive(self, plan: Any) -> Any:
        """Drive a command's plan: step by step on the loop where the log has an asyncio face
        (or a key tail to freshen), else the whole plan in one pool hop (module docstring)."""
        if self._face is None and self._keys is None:
            return await self._offload(functools.partial(_steps.drive, plan))
        return await _plans.drive_async(plan, self._perform, self._steps.answer)

    @_call
    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call of your own in the runtime's pool (e.g. a read-model query)."""
        return await self._offload(functools.partial(fn, *args, **kwargs))

    # ------------------------------------------------------------------ commands
    @_call
    async def save(self, /, aggregate: Aggregate, **envelope: Any) -> Written:
        """See :meth:`Runtime.save`."""
        rt = self.sync
        cls = rt.declared(type(aggregate))
        with command_span("save", cls.__name__, rt.names.aggregate_topic(cls)):
            result: Written = await self._drive(rt.repository.save_plan(aggregate, **envelope))
        return result

    @_call
    async def execute(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        create: bool = False,
        attempts: int = 20,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> A:
        """See :meth:`Runtime.execute`; ``command`` runs on the loop (it is sync: it
        decides on the aggregate, it does no I/O)."""
        rt = self.sync
        plan = rt.repository.run_plan(
            rt.declared(cls),
            aggregate_id,
            command,
            create,
            attempts,
            correlation_id,
            causation_id,
            once=False,
        )
        aggregate: A | None
        with command_span("execute", cls.__name__, rt.names.aggregate_topic(cls)):
            aggregate, _ = await self._drive(plan)
        assert aggregate is not None
        return aggregate

    @_call
    async def issue(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        caused_by: Envelope[Any] | str,
        create: bool = True,
        attempts: int = 20,
    ) -> Written:
        """See :meth:`Runtime.issue`."""
        rt = self.sync
        plan = rt.repository.issue_plan(
            rt.declared(cls),
            aggregate_id,
            command,
            caused_by=caused_by,
            create=create,
            attempts=attempts,
        )
        written: Written
        with command_span("issue", cls.__name__, rt.names.aggregate_topic(cls)):
            _, written = await self._drive(plan)
        return written

    @_call
    async def load(
        self,
        cls: type[A],
        aggregate_id: str,
        version: int | None = None,
        *,
        as_of: datetime | int | None = None,
    ) -> A:
        """See :meth:`Runtime.load` (``as_of`` included)."""
        plan = self.sync.load_plan(cls, aggregate_id, version, as_of=as_of)
        aggregate: A = await self._drive(plan)
        return aggregate

    @_call
    async def forget(self, /, subjects: str | Iterable[str], **options: Any) -> Any:
        """See :func:`eventlane.forget` (run in the pool; returns its report)."""
        # eventlane.forget sits above this layer (replay): reached through the public
        # facade at call time, as an application would.
        forget: Callable[..., Any] = importlib.import_module("eventlane").forget
        return await self._offload(lambda: forget(self.sync, subjects, **options))

    # ------------------------------------------------------------------ waits
    @_call
    async def wait_for(
        self,
        projector: str,
        written: Position | str | Iterable[RecordMetadata] | Mapping[TopicPartition, int],
        timeout: float = 10.0,
    ) -> bool:
        """See :meth:`Runtime.wait_for`; waits without holding a thread."""
        rt = self.sync
        topics = set(rt.topics_of(projector))
        position = as_position(written)
        await self._offload(functools.partial(check_position, rt.log, position))
        wanted = {tp: o for tp, o in position.items() if tp.topic in topics}
        return await self._reach(
            rt.readmodel_location(projector), wanted, time.monotonic() + timeout
        )

    @_call
    async def wait_causal(
        self,
        projector: str,
        written: Position | str | Iterable[RecordMetadata],
        timeout: float = 10.0,
    ) -> Position:
        """See :meth:`Runtime.wait_causal` (the same plan, driven on the loop)."""
        rt = self.sync
        rt.app.projector(projector)
        plan = causal_plan(rt, projector, as_position(written), timeout)
        return await _plans.drive_async(plan, self._perform)

    async def _reach(
        self, path: Location, offsets: Mapping[TopicPartition, int], deadline: float
    ) -> bool:
        """Poll the read model's positions (each look in the pool) until they reach
        ``offsets`` or ``deadline`` passes; sleeps on the loop in between."""
        if not offsets:
            return True

        def positions() -> dict[TopicPartition, int]:
            with open_view(path) as view:
                return view.positions()

        delay = _POLL_FIRST_S
        while True:
            seen = await self._offload(positions)
            if all(seen.get(tp, -1) >= off for tp, off in offsets.items()):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(delay, remaining))
            delay = min(_POLL_MAX_S, delay * 2)

    # ------------------------------------------------------------------ consumers
    def consumer(self, **options: Any) -> AsyncConsumer:
        """A free consumer (:class:`~eventlane.consumer.Consumer`) for ``async for``."""
        return AsyncConsumer(lambda: Consumer(self.log, **options))

    def group_consumer(self, group_id: str, topics: Iterable[str], **options: Any) -> AsyncConsumer:
        """A group member (:class:`~eventlane.consumer.GroupConsumer`) for ``async for``;
        ``topics`` are full topic names."""
        names = list(topics)
        return AsyncConsumer(
            lambda: GroupConsumer(self.log, group_id=group_id, topics=names, **options)
        )


class AsyncConsumer:
    """A consumer for ``async for record in consumer``: the sync consumer (not
    thread-safe) lives on one thread of its own, which makes every call to it; the loop
    only awaits. ``poll_timeout`` bounds each wait in that thread (and so how long a
    ``close`` waits for the poll in flight).

    Use as an async context manager; ``call(method, ...)`` reaches the consumer's other
    methods (``assign``, ``seek``, ``commit`` ...) on its thread."""

    def __init__(self, make: Callable[[], Consumer | GroupConsumer], poll_timeout: float = 0.2):
        self._make = make
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="eventlane-consumer")
        self._consumer: Consumer | GroupConsumer | None = None
        self.poll_timeout = poll_timeout
        self._closed = False

    async def _on_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._consumer is None:
            self._consumer = await self._on_thread(self._make)

    @property
    def consumer(self) -> Consumer | GroupConsumer:
        if self._consumer is None:
            raise RuntimeError("the consumer is not started: use `async with`")
        return self._consumer

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``consumer.method(*args, **kwargs)`` on the consumer's thread."""
        bound = getattr(self.consumer, method)
        return await self._on_thread(functools.partial(bound, *args, **kwargs))

    async def poll(self, timeout: float = 0.0, max_records: int | None = None) -> list[Record]:
        consumer = self.consumer
        return await self._on_thread(lambda: consumer.poll(timeout, max_records))

    async def __aiter__(self) -> AsyncIterator[Record]:
        await self.start()
        while not self._closed:
            for record in await self.poll(self.poll_timeout):
                yield record

    async def close(self) -> None:
        self._closed = True
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await self._on_thread(consumer.close)
        self._thread.shutdown(wait=False)
