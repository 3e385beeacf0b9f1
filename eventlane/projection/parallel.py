"""Per-key parallelism inside a partition, for projectors with ``concurrency = N > 1``.

A partition is a total order, but a policy only needs the order *per key* (per aggregate):
waiting for one order's invoice to be saved before looking at the next order is head-of-line
blocking. :class:`ParallelApplier` splits each poll's events of a partition by key and hands
the keys to up to ``N`` threads: events of one key run strictly in offset order on one
thread, events of different keys at once (a policy's handlers mostly wait on the event
store's fsyncs, so threads suffice).

**The rule.** Concurrent handlers run outside the read model's transaction, so a projector
with ``concurrency > 1`` may not write a read model: no ``migrations``/``setup``
(:class:`~eventlane.errors.ConfigError` when the class is created) and ``ctx.db``/``ctx.conn``
raise :class:`~eventlane.errors.ProjectionError`. Its effects go through ``ctx.issue``
(exactly once per triggering event by its causation check). The framework alone writes the
read model, from the applying thread: positions, dead letters and the offset map.

**Positions: the lowest unfinished offset.** As handlers finish, the applying thread commits
(every ``commit_interval_s`` and at the end of the batch), in one transaction per commit:

* the partition's position = its *lowest unfinished offset* (LUO): every event below it has
  finished (handled, skipped, or dead-lettered), so the position never passes an event that
  has not finished;
* the offset map: the finished offsets at or above the LUO, in ``_eventlane_parallel_done``
  (``topic, partition, offset``), and only those (rows below the position are deleted);
* the dead letters of finished events.

After a crash the partition restarts at its position and skips the offsets in the map: only
unfinished work is redelivered (Confluent's parallel-consumer keeps the same map in Kafka's
commit metadata). Fencing is checked at every commit: a zombie's commit raises
:class:`~eventlane.errors.FencedError`, its threads stop at their next event, and what they
did meanwhile was idempotent (``ctx.issue``).

**Threads only where they help.** Threads of one interpreter overlap *waiting* (an fsync,
a remote call), not computing: a handler that mostly computes runs slower on ``N`` threads
than alone, every blocking call handing the GIL over. So (``Projector.adaptive``, on by
default) the first batch, and every :data:`PROBE_EVERY`-th after it, starts with a probe:
whole keys run one after another on the polling thread until :data:`PROBE_EVENTS` events or
:data:`PROBE_S` seconds, timed by the wall clock and by the thread's CPU clock. If the
handlers waited at least :data:`WAIT_SHARE` of that time, the rest of the batch (and the
batches until the next probe) go to the threads; otherwise they run on the polling thread
too, key after key. Either way each key's events run in order and the commits are the
same.

An event newer than the code (:mod:`.waiting`) is not finished, on threads and tasks alike:
its key runs no further event, the position stays at or below it (the lowest unfinished
offset), the final commit records the wait, and :attr:`~.applier.BatchApplier.waiting`
names the partition, so the worker stops fetching it until a worker with newer code owns it
(which skips the offsets finished meanwhile, through the offset map).

**Async handlers.** A projector whose handlers are ``async def`` (awaiting a remote call)
runs its keys as asyncio tasks instead of threads: one event loop per worker, on a thread
of its own, at most ``concurrency`` keys at once (a semaphore), each key's events in order
in its task. The applying thread commits as with threads. ``await ctx.issue_async(...)``
issues a command without blocking the loop: the command path's log calls are awaited on
the log's asyncio face, opened on the worker's loop (JetStream: no thread, no bridge; the
embedded log: file work in threads, a partition's concurrent issues written as one group
under one fsync, :mod:`eventlane.log.embedded.aio`); on an engine without a face the whole
command runs in one thread, one hop per command. There is no probe: awaiting is waiting.

Parking (``park_after_dead_letter``) holds per key: a key parked before the batch, or whose
event is dead-lettered in it, parks its later events; ``handler_attempts`` retries a failed
handler on its key's thread before dead-lettering it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from eventlane import _plans
from eventlane.codec import EventCodec
from eventlane.errors import NewerEventVersionError, ProjectionError
from eventlane.log import Record, TopicPartition
from eventlane.observability import get_logger
from eventlane.projection.applier import (
    BatchApplier,
    BatchResult,
    Decoded,
    _DecodeFailedError,
    _type_name,
)
from eventlane.projection.command_batch import flush
from eventlane.projection.dead_letters import describe_failure as _describe
from eventlane.projection.projector import EventContext, Projector
from eventlane.projection.store import AnyReadModel as ReadModel
from eventlane.projection.waiting import newer_version_in
from eventlane.store.steps import AsyncSteps
from eventlane.tracing import command_span, handler_span

__all__ = ["DONE_TABLE", "ParallelApplier", "applier_for"]

log = get_logger("eventlane.projection")

DONE_TABLE = "_eventlane_parallel_done"
"""The offset map: finished offsets at or above each partition's position."""

_CREATE_DONE = (
    f"CREATE TABLE IF NOT EXISTS {DONE_TABLE} (topic TEXT NOT NULL, partition INTEGER NOT NULL,"
    " offset INTEGER NOT NULL, PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID"
)

PROBE_EVERY = 16
"""Batches between probes of how much the handlers wait (module docstring)."""
PROBE_EVENTS = 32
PROBE_S = 0.02
"""A probe runs whole keys on the polling thread until this many events or seconds."""
WAIT_SHARE = 0.5
"""The share of a probe's wall time spent off the CPU above which threads are used. Time
spent runnable, waiting for a CPU another process holds, counts on neither side: a computing
handler on a loaded machine stays on the polling thread, and a waiting one still goes to the
threads when each wake-up queues for a CPU longer than it slept."""


def _queued_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU, from Linux's
    per-thread schedstat (0.0 where the kernel does not say: then all time off the CPU
    counts as waiting)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


_DeadLetter = tuple[Record, str, "str | None", int, str]
"""``(record, error, type name, attempts, status)`` of an event to dead-letter."""


class _WaitError(Exception):
    """One event is newer than the code: its key stops (see the module docstring)."""

    def __init__(self, error: NewerEventVersionError) -> None:
        self.error = error
        super().__init__(str(error))


def has_async_handlers(cls: type[Projector]) -> bool:
    """Whether any handler of ``cls`` is ``async def``."""
    return any(inspect.iscoroutinefunction(h) for h in cls._handlers.values())


class _NoReadModel:
    """``ctx.db``/``ctx.conn`` of a concurrent handler: any use raises."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise ProjectionError(
            f"projector {self._name!r} has concurrency > 1: its handlers run concurrently,"
            " outside the read model's transaction, and may not use ctx.db/ctx.conn"
            f" (tried .{attr}); issue commands with ctx.issue, or set concurrency = 1"
        )


class _Partition:
    """Progress of one partition's events in a batch: the offset map's in-memory side."""

    def __init__(self, tp: TopicPartition, offsets: list[int], first: int) -> None:
        self.tp = tp
        self.offsets = offsets  # the batch's offsets still to finish, ascending
        self.first = first
        self.finished: set[int] = set()
        self.saved: set[int] = set()  # finished offsets already in the done table
        self.waits: list[tuple[Record, NewerEventVersionError]] = []  # newer than the code
        self.dead: list[_DeadLetter] = []
        self.cursor = 0
        self.end = offsets[-1] + 1 if offsets else first

    def lowest_unfinished(self) -> int:
        """The position that is safe to commit: no unfinished event below it."""
        offsets, finished = self.offsets, self.finished
        while self.cursor < len(offsets) and offsets[self.cursor] in finished:
            self.cursor += 1
        return offsets[self.cursor] if self.cursor < len(offsets) else self.end


class ParallelApplier(BatchApplier):
    """A :class:`BatchApplier` running different keys of a partition concurrently (see the
    module docstring); one per worker, used from one thread."""

    def __init__(
        self,
        projector: Projector,
        codec: EventCodec,
        readmodel: ReadModel,
        *,
        app: Any = None,
        clock: Callable[[], float] = time.time,
        commit_interval_s: float = 0.2,
    ) -> None:
        super().__init__(projector, codec, readmodel, app=app, clock=clock)
        self.concurrency = projector.concurrency
        self.commit_interval_s = commit_interval_s
        self._pool = ThreadPoolExecutor(
            self.concurrency, thread_name_prefix=f"eventlane-{projector.name}"
        )
        self._guard: Any = _NoReadModel(projector.name)
        self._mutex = threading.Lock()  # finished sets, dead letters, counts, _parked
        self._stop = threading.Event()
        self.threaded = True
        """Whether the last probe sent the handlers to the threads (module docstring)."""
        self._since_probe = PROBE_EVERY  # probe the first batch
        self._probed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._face: Any = None
        """The log's asyncio face on the loop (JetStream), for ``ctx.issue_async``."""
        if has_async_handlers(type(projector)):
            self._loop = asyncio.new_event_loop()
            # ctx.issue_async's appends: up to `concurrency` at once (sharing fsyncs), not
            # the default executor's few threads
            self._loop.set_default_executor(
                ThreadPoolExecutor(
                    self.concurrency, thread_name_prefix=f"eventlane-{projector.name}"
                )
            )
            threading.Thread(
                target=self._loop.run_forever,
                name=f"eventlane-{projector.name}-loop",
                daemon=True,
            ).start()
            self._face = self._open_face()
        with readmodel.transaction() as conn:
            conn.execute(_CREATE_DONE)

    def apply(self, records: list[Record], generation: int = 0) -> BatchResult:
        """Apply ``records`` exactly once, keys concurrently; raises :class:`FencedError`
        (nothing more committed, threads stopped) when a partition moved on."""
        if not records:
            return BatchResult(0, 0, 0)
        groups: dict[TopicPartition, list[tuple[Record, Decoded]]] = {}
        for r in records:
            groups.setdefault(TopicPartition(r.topic, r.partition), []).append((r, self._decode(r)))
        readmodel = self.readmodel
        progress: dict[TopicPartition, _Partition] = {}
        keys: dict[tuple[TopicPartition, bytes | None], list[tuple[Record, Decoded]]] = {}
        with readmodel.transaction() as conn:
            if self._park:
                self._parked = self._read_parked()
            for tp, items in groups.items():
                first = items[0][0].offset
                start = readmodel.check_and_advance(conn, tp, generation, first, first)
                done = {
                    int(o)
                    for (o,) in conn.execute(
                        f"SELECT offset FROM {DONE_TABLE} WHERE topic=? AND partition=?"
                        " AND offset>=?",
                        (tp.topic, tp.partition, start),
                    )
                }
                todo = [(r, d) for r, d in items if r.offset >= start and r.offset not in done]
                part = progress[tp] = _Partition(tp, [r.offset for r, _ in todo], start)
                part.end = items[-1][0].offset + 1
                part.saved = done
                for r, d in todo:
                    keys.setdefault((tp, r.key), []).append((r, d))
        counts = [0, 0, 0]
        self._stop.clear()
        work = [(progress[tp], events) for (tp, _), events in keys.items()]
        if self._loop is not None:
            pending: set[Future[None]] = {
                asyncio.run_coroutine_threadsafe(self._run_tasks(work, counts), self._loop)
            }
            work = []
        elif self.projector.adaptive:
            work = self._probe_maybe(work, counts)
            if not self.threaded:
                self._run_here(work, counts, progress, generation)
                work = []
        if self._loop is None:
            pending = {
                self._pool.submit(self._run_key, part, events, counts) for part, events in work
            }
        try:
            while pending:
                # Not FIRST_COMPLETED: one wake per finished key would cost O(keys) each.
                _, pending = wait(pending, timeout=self.commit_interval_s)
                if pending:
                    self._commit(progress, generation)
        except BaseException:
            self._stop.set()
            wait(pending)
            raise
        self._commit(progress, generation, final=True)
        self.dead_lettered_total += counts[2]
        return BatchResult(*counts)

    # ------------------------------------------------------------------ threads or not
    def _probe_maybe(
        self, work: list[tuple[_Partition, list[tuple[Record, Decoded]]]], counts: list[int]
    ) -> list[tuple[_Partition, list[tuple[Record, Decoded]]]]:
        """Every :data:`PROBE_EVERY` batches: run the first keys here, timed, and choose
        where the rest go (:attr:`threaded`); returns the keys not run."""
        self._since_probe += 1
        if self._since_probe < PROBE_EVERY or not work:
            return work
        self._since_probe = 0
        wall0, cpu0, queued0 = time.perf_counter(), time.thread_time(), _queued_s()
        ran = events_run = 0
        while ran < len(work) and events_run < PROBE_EVENTS:
            part, events = work[ran]
            self._run_key(part, events, counts)
            ran += 1
            events_run += len(events)
            if time.perf_counter() - wall0 >= PROBE_S:
                break
        # time runnable but off the CPU (another process held it) is neither waiting nor
        # computing: it is left out of both sides of the share
        wall = time.perf_counter() - wall0 - (_queued_s() - queued0)
        waited = wall - (time.thread_time() - cpu0)
        threaded = wall > 0 and waited / wall >= WAIT_SHARE
        if threaded != self.threaded or not self._probed:
            self._probed = True
            log.info(
                "per-key parallelism: handlers placed",
                on="threads (they mostly wait)" if threaded else "the polling thread",
                projector=self.projector.name,
                waited_share=round(waited / wall, 2) if wall > 0 else None,
                events=events_run,
            )
        self.threaded = threaded
        return work[ran:]

    def _run_here(
        self,
        work: list[tuple[_Partition, list[tuple[Record, Decoded]]]],
        counts: list[int],
        progress: dict[TopicPartition, _Partition],
        generation: int,
    ) -> None:
        """Run ``work`` key after key on this thread, committing as the threads' waits do."""
        last = time.monotonic()
        for part, events in work:
            self._run_key(part, events, counts)
            if time.monotonic() - last >= self.commit_interval_s:
                self._commit(progress, generation)
                last = time.monotonic()

    # ------------------------------------------------------------------ one key's events
    def _run_key(
        self, part: _Partition, events: list[tuple[Record, Decoded]], counts: list[int]
    ) -> None:
        for rec, decoded in events:
            if self._stop.is_set():
                return
            try:
                outcome, dead = self._one(rec, decoded)
            except _WaitError as wait:  # the key stops here, unfinished
                with self._mutex:
                    part.waits.append((rec, wait.error))
                return
            with self._mutex:
                counts[outcome] += 1
                if dead is not None:
                    part.dead.append(dead)
                    if self._park and rec.key is not None:
                        self._parked.add((rec.topic, rec.key))
                part.finished.add(rec.offset)

    # ------------------------------------------------------------------ async handlers
    async def _run_tasks(
        self, work: list[tuple[_Partition, list[tuple[Record, Decoded]]]], counts: list[int]
    ) -> None:
        """Every key as a task, at most ``concurrency`` at once, each key's events in order."""
        gate = asyncio.Semaphore(self.concurrency)

        async def run_key(part: _Partition, events: list[tuple[Record, Decoded]]) -> None:
            async with gate:
                for rec, decoded in events:
                    if self._stop.is_set():
                        return
                    try:
                        outcome, dead = await self._one_async(rec, decoded)
                    except _WaitError as wait:  # the key stops here, unfinished
                        with self._mutex:
                            part.waits.append((rec, wait.error))
                        return
                    with self._mutex:
                        counts[outcome] += 1
                        if dead is not None:
                            part.dead.append(dead)
                            if self._park and rec.key is not None:
                                self._parked.add((rec.topic, rec.key))
                        part.finished.add(rec.offset)

        await asyncio.gather(*(run_key(part, events) for part, events in work))

    async def _one_async(self, rec: Record, decoded: Decoded) -> tuple[int, _DeadLetter | None]:
        """:meth:`_one` for async handlers (awaited on the worker's loop)."""
        early = self._before_handling(rec, decoded)
        if early is not None:
            return early
        attempts = max(1, self.projector.handler_attempts)
        for attempt in range(1, attempts + 1):
            try:
                return (0 if await self._handle_async(rec, decoded) else 1), None
            except Exception as exc:
                failed = self._failed(rec, exc, attempt, attempts)
                if failed is not None:
                    return failed
        raise AssertionError("unreachable")  # pragma: no cover

    async def _handle_async(self, rec: Record, decoded: Decoded) -> bool:
        if decoded is None:
            return False
        if isinstance(decoded, _DecodeFailedError):
            raise decoded
        handler = type(self.projector)._handlers.get(type(decoded.event))
        if handler is None:
            return False
        with handler_span(
            self.projector.name,
            decoded.type_name,
            rec.topic,
            rec.partition,
            rec.offset,
            rec.headers,
        ):
            result: Any = handler(self.projector, decoded.event, self._context(rec, decoded))
            if inspect.isawaitable(result):
                await result
        return True

    def _one(self, rec: Record, decoded: Decoded) -> tuple[int, _DeadLetter | None]:
        """Handle one event: ``(0 applied | 1 skipped | 2 dead-lettered, dead letter)``;
        raises :class:`_WaitError` at an event newer than the code (its key stops)."""
        early = self._before_handling(rec, decoded)
        if early is not None:
            return early
        attempts = max(1, self.projector.handler_attempts)
        for attempt in range(1, attempts + 1):
            try:
                return (0 if self._handle(rec, decoded) else 1), None
            except Exception as exc:
                failed = self._failed(rec, exc, attempt, attempts)
                if failed is not None:
                    return failed
        raise AssertionError("unreachable")  # pragma: no cover

    def _before_handling(
        self, rec: Record, decoded: Decoded
    ) -> tuple[int, _DeadLetter | None] | None:
        """The outcome of an event that is not run (parked, or not decoded: deterministic,
        no retries); ``None`` when it is to be run. Shared by the threads and the tasks."""
        if self._park and (rec.topic, rec.key) in self._parked:
            reason = "parked behind an earlier dead letter of the same key"
            return 2, (rec, reason, None, 0, "parked")
        if isinstance(decoded, _DecodeFailedError):
            newer = newer_version_in(decoded) if self.wait_for_newer else None
            if newer is not None:
                raise _WaitError(newer)
            return 2, (rec, decoded.describe(), decoded.type_name, 1, "dead")
        return None

    def _failed(
        self, rec: Record, exc: Exception, attempt: int, attempts: int
    ) -> tuple[int, _DeadLetter | None] | None:
        """After a handler raised ``exc``: wait (an event newer than the code, met through
        a load), dead-letter (the last attempt), or ``None``: try again."""
        newer = newer_version_in(exc) if self.wait_for_newer else None
        if newer is not None:
            raise _WaitError(newer) from exc
        if attempt == attempts or self._stop.is_set():
            return 2, (rec, _describe(exc), _type_name(rec), attempt, "dead")
        return None

    def _context(self, rec: Record, envelope: Any) -> EventContext:
        guard = self._guard
        ctx = EventContext(
            rec.topic, rec.partition, rec.offset, envelope, guard, False, self.app, guard
        )
        if self._face is not None:
            ctx.issue_on_loop = self._issue_on_face
        return ctx

    # ------------------------------------------------------------------ the asyncio face
    def _open_face(self) -> Any:
        """The log's asyncio face opened on the worker's loop, or ``None`` where the engine
        has none (``ctx.issue_async`` then runs the whole command in one thread, one hop per
        command rather than one per log call)."""
        make_face = getattr(getattr(self.app, "log", None), "async_face", None)
        if make_face is None or self._loop is None:
            return None
        face = make_face()
        asyncio.run_coroutine_threadsafe(face.open(), self._loop).result()
        self._steps = AsyncSteps(self.app.log, face, self._offload)
        return face

    async def _offload(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def _issue_on_face(
        self,
        cls: type[Any],
        aggregate_id: str,
        command: Callable[[Any], Any],
        caused_by: Any,
        create: bool,
    ) -> Any:
        """``ctx.issue_async`` on the face: the command path's one plan
        (:meth:`~eventlane.store.Repository.issue_plan`: the causation check),
        its log calls awaited on the worker's loop (:class:`AsyncSteps`)."""
        app = self.app
        plan = app.repository.issue_plan(
            app.declared(cls), aggregate_id, command, caused_by=caused_by, create=create
        )
        with command_span("issue", cls.__name__, app.names.aggregate_topic(cls)):
            _, written = await _plans.drive_async(plan, self._steps, self._steps.answer)
        return written

    # ------------------------------------------------------------------ commits
    def _commit(
        self, progress: dict[TopicPartition, _Partition], generation: int, *, final: bool = False
    ) -> None:
        """One transaction: positions at the lowest unfinished offsets, the offset map
        above them, and the dead letters of finished events; the ``final`` one also
        records the waits (every key has stopped)."""
        waits = []
        with self._mutex:
            if final:
                for part in progress.values():
                    if part.waits:
                        waits.append(min(part.waits, key=lambda w: w[0].offset))
            plan = []
            for tp, part in progress.items():
                luo = part.lowest_unfinished()
                above = sorted(o for o in part.finished if o >= luo and o not in part.saved)
                plan.append((tp, part, luo, above, part.dead))
                part.dead = []
        # After the snapshot of finished events: each has its schedules in the batch.
        flush(self.app)
        try:
            with self.readmodel.transaction() as conn:
                for tp, part, luo, above, dead in plan:
                    self.readmodel.check_and_advance(conn, tp, generation, part.first, luo)
                    for rec, error, type_name, attempts, status in dead:
                        self._dead_letter(rec, error, type_name, attempts, status=status)
                    conn.executemany(
                        f"INSERT OR IGNORE INTO {DONE_TABLE} VALUES (?, ?, ?)",
                        [(tp.topic, tp.partition, o) for o in above],
                    )
                    conn.execute(
                        f"DELETE FROM {DONE_TABLE} WHERE topic=? AND partition=? AND offset<?",
                        (tp.topic, tp.partition, luo),
                    )
                for waiting_rec, newer in waits:
                    self._wait(conn, waiting_rec, newer)
        except BaseException:
            with self._mutex:  # not committed: write them with the next commit
                for _, part, _, _, dead in plan:
                    part.dead[:0] = dead
            raise
        for _, part, _, above, _ in plan:
            part.saved.update(above)

    def close(self) -> None:
        """Stop the handler threads (after their current event) and the loop, if any."""
        self._stop.set()
        self._pool.shutdown(wait=True)
        if self._loop is not None:
            face, self._face = self._face, None
            if face is not None:
                try:
                    asyncio.run_coroutine_threadsafe(face.close(), self._loop).result(10)
                except Exception as exc:  # closing: the worker's own log closes anyway
                    log.warning("closing the asyncio face failed", error=repr(exc))
            self._loop.call_soon_threadsafe(self._loop.stop)


def applier_for(
    projector: Projector, codec: EventCodec, readmodel: ReadModel, *, app: Any = None
) -> BatchApplier:
    """The applier a worker runs ``projector`` with: parallel per key when its
    ``concurrency`` is above 1 or its handlers are ``async def`` (tasks), the in-order
    :class:`BatchApplier` otherwise."""
    if projector.concurrency > 1 or has_async_handlers(type(projector)):
        return ParallelApplier(projector, codec, readmodel, app=app)
    return BatchApplier(projector, codec, readmodel, app=app)
