"""Applying a poll's records to a read model: decode, dispatch, dead-letter, advance.

One call of :meth:`BatchApplier.apply` is one ``BEGIN IMMEDIATE`` transaction holding the
handlers' writes, any dead letters, and the positions of every partition in the batch. The
fast path runs a partition's events in one savepoint; if a handler or the decoder fails,
that savepoint is rolled back, the events before the failing one are run again (they
passed), and the failing event alone is retried (``handler_attempts`` more times, each in
its own savepoint) and then dead-lettered; the run goes on after it. So one bad event costs
a re-run of part of its batch, never a stall: the partition keeps flowing.

Records are decoded before the transaction begins, so several workers of one read model
decode in parallel and hold SQLite's write lock only while their handlers write. Decoding
failures (unknown event type, malformed JSON, wrong field types) are deterministic:
dead-lettered at once. Events of types the projector has no handler for are skipped without
being decoded when their type header names a known, unhandled class.

Parking (``park_after_dead_letter``): once an event of ``(topic, key)`` is dead-lettered,
every later event of that key is dead-lettered too with status ``parked``, so the key's
order is kept; a ``dlq retry`` that applies all of a key's open letters (in offset order)
releases it. The set of parked keys is re-read inside every batch's transaction while it is
non-empty, so a release by another process is seen by the next batch, never half-way.

The poison-rate breaker (:mod:`.breaker`) counts dead letters over the last events; when
it trips, :class:`~eventlane.projection.breaker.PoisonRateError` rolls the batch back.

An event of a known type stored at a newer schema version than the code's (written by newer
code) is not dead-lettered: the partition stops at it (its position stays there, the events
before it are applied), and :attr:`BatchApplier.waiting` names it; see :mod:`.waiting`.
Only with :attr:`BatchApplier.wait_for_newer` (set by the worker, which stops fetching the
partition); otherwise (rebuilds, fixtures, ``--dead-letter-unknown``) it is dead-lettered
like any decoding failure.

An error that aborts the whole SQLite transaction (disk full, I/O error) is not a poison
event: it propagates, nothing of the batch is kept, and the worker fails. The same code
runs on a PostgreSQL read model (:mod:`.postgres`): a failed statement there only marks the
transaction failed, and the savepoint's rollback restores it; a lost connection is not
poison either.
"""

from __future__ import annotations

import gc
import inspect
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Union

import orjson

from eventlane.codec import Envelope, EventCodec, event_type_from_headers
from eventlane.codec.privacy import redact
from eventlane.domain import event_type_of
from eventlane.errors import NewerEventVersionError, ProjectionError, ReadModelBusyError
from eventlane.log import Record, TopicPartition
from eventlane.observability import get_logger
from eventlane.projection.breaker import PoisonBreaker
from eventlane.projection.command_batch import batched, flush
from eventlane.projection.dead_letters import describe_failure
from eventlane.projection.projector import EventContext, Projector
from eventlane.projection.store import AnyReadModel
from eventlane.projection.waiting import Waiting, newer_version_in, record_wait, waiting_for
from eventlane.tracing import handler_span, tracer

log = get_logger("eventlane.projection")

ParkedKey = tuple[str, bytes]
"""``(topic, key)`` of a parked aggregate."""

Decoded = Union["Envelope[Any]", "_DecodeFailedError", None]
"""A record decoded ahead of the transaction: its envelope, ``None`` (a type the projector
does not handle), or the decoding error."""


class BatchResult(NamedTuple):
    applied: int
    skipped: int
    dead_lettered: int


class _EventFailedError(Exception):
    def __init__(self, record: Record, error: BaseException, index: int) -> None:
        self.record = record
        self.error = error
        self.index = index
        super().__init__(str(error))


class _DecodeFailedError(Exception):
    def __init__(self, error: BaseException, type_name: str | None) -> None:
        self.error = error
        self.type_name = type_name
        super().__init__(str(error))

    def describe(self) -> str:
        return describe_failure(self.error)


_OPEN_PARKED_SQL = (
    "SELECT DISTINCT topic, key FROM _eventlane_dead_letters WHERE status IN ('dead', 'parked')"
    " AND key IS NOT NULL"
)


class BatchApplier:
    """Applies records to one projector's read model (see the module docstring)."""

    def __init__(
        self,
        projector: Projector,
        codec: EventCodec,
        readmodel: AnyReadModel,
        *,
        replaying: bool = False,
        app: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.projector = projector
        self.codec = codec
        self.readmodel = readmodel
        self.replaying = replaying
        self.app = batched(app)
        """The command side the handlers get (``ctx.app``): schedules go in batches,
        flushed before positions commit (:mod:`.command_batch`)."""
        self.clock = clock
        handled = {event_type_of(c).name for c in projector.handled_types()}
        known = {event_type_of(c).name for c in codec.registry.classes()}
        self._skip_names = frozenset(n.encode() for n in known - handled)
        # Projector.handle is a dict lookup and a call: done inline unless overridden.
        self._handlers = (
            type(projector)._handlers if type(projector).handle is Projector.handle else None
        )
        self._park = bool(projector.park_after_dead_letter)
        self._parked: set[ParkedKey] = set()
        if self._park:
            self._parked = self._read_parked()
        self.dead_lettered_total = 0
        """Dead letters written by this applier (workers publish them when it moves)."""
        self.wait_for_newer = False
        """Stop a partition at an event newer than the code instead of dead-lettering it.
        Only a worker turns it on: it re-seeks and pauses the partition (a rebuild or a
        test fixture reading on past the stop would skip the event)."""
        self._newer_pending: NewerEventVersionError | None = None
        self.waiting: dict[TopicPartition, Waiting] = {}
        """The partitions the last :meth:`apply` stopped at a newer event."""
        limits = projector.poison_breaker
        self.breaker = (
            None
            if replaying or limits is None
            else PoisonBreaker(projector.name, limits[0], limits[1])
        )
        """Counts this applier's dead letters; raises :class:`PoisonRateError` on a trip."""

    # ------------------------------------------------------------------ public
    def apply(self, records: list[Record], generation: int = 0) -> BatchResult:
        """Apply ``records`` (any partitions, each in offset order) exactly once.

        Raises :class:`~eventlane.projection.readmodel.FencedError` (nothing applied) when
        a partition of the batch is owned by a newer generation.
        """
        self.waiting = {}
        if not records:
            return BatchResult(0, 0, 0)
        # Decode before taking the write lock: workers of one read model decode in
        # parallel and hold the lock only for their handlers' writes.
        decode = self._decode
        groups: dict[TopicPartition, tuple[list[Record], list[Decoded]]] = {}
        collecting = gc.isenabled()
        if collecting:  # thousands of live envelopes would each trigger a futile collection
            gc.disable()
        try:
            topic, partition = "", -1
            recs: list[Record] = []
            decoded: list[Decoded] = []
            for r in records:  # a poll's records come in runs of one partition
                if r.partition != partition or r.topic != topic:
                    topic, partition = r.topic, r.partition
                    tp = TopicPartition(topic, partition)
                    group = groups.get(tp)
                    if group is None:
                        group = groups[tp] = ([], [])
                    recs, decoded = group
                recs.append(r)
                decoded.append(decode(r))
        finally:
            if collecting:
                gc.enable()
        readmodel = self.readmodel
        counts = [0, 0, 0]
        with readmodel.transaction() as conn:
            if self._parked:
                self._parked = self._read_parked()
            for tp, (recs, decoded) in groups.items():
                start = readmodel.check_and_advance(
                    conn, tp, generation, recs[0].offset, recs[-1].offset + 1
                )
                first = 0
                while first < len(recs) and recs[first].offset < start:
                    first += 1
                stop = self._apply_partition(conn, recs, decoded, first, counts)
                if stop is not None:  # wait at recs[stop]: the position stays there
                    rec = recs[stop]
                    conn.execute(
                        "UPDATE _eventlane_positions SET next_offset=? WHERE topic=? AND"
                        " partition=?",
                        (rec.offset, tp.topic, tp.partition),
                    )
                    self._wait(conn, rec)
            flush(self.app)  # before the positions commit
        self.dead_lettered_total += counts[2]
        return BatchResult(*counts)

    def _wait(
        self,
        conn: Any,
        rec: Record,
        error: NewerEventVersionError | None = None,
    ) -> None:
        """Inside the transaction: record that ``rec``'s partition waits at it."""
        error = error or self._newer_pending
        assert error is not None
        wait = waiting_for(rec, error)
        record_wait(conn, wait, int(self.clock() * 1000))
        self.waiting[TopicPartition(rec.topic, rec.partition)] = wait
        log.warning(
            "waiting for newer code",
            projector=self.projector.name,
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            event_type=wait.event_type,
            version=wait.version,
            known_version=wait.known_version,
        )

    def _newer(self, error: BaseException) -> bool:
        """Whether ``error`` means "this code is too old" and the partition should wait."""
        if not self.wait_for_newer:
            return False
        found = newer_version_in(error)
        if found is not None:
            self._newer_pending = found
        return found is not None

    # ------------------------------------------------------------------ one partition
    def _apply_partition(
        self,
        conn: Any,
        recs: list[Record],
        decoded: list[Decoded],
        first: int,
        counts: list[int],
    ) -> int | None:
        """Apply ``recs[first:]`` in runs: a run goes fast inside one savepoint; when an event
        fails, the run is rolled back to its savepoint, its events before the failing one
        are run again (they passed), and the failing one is isolated (retried, then
        dead-lettered). Every event's effect ends up in the transaction exactly once.

        Returns the index of an event newer than the code (the events before it applied,
        none after it), or ``None`` when every event was run."""
        n = len(recs)
        i, limit, isolate = first, n, -1
        stop: int | None = None
        while i < n:
            if i == isolate:
                self._one_isolated(recs[i], decoded[i], counts)
                i, limit, isolate = i + 1, n, -1
                continue
            conn.execute("SAVEPOINT run")
            local = [0, 0, 0]
            try:
                self._fast(recs, decoded, i, limit, local)
            except _EventFailedError as failed:
                if not conn.in_transaction:  # SQLite aborted the transaction: not poison
                    raise failed.error from None
                self._refuse_transient(failed.record, failed.error)
                conn.execute("ROLLBACK TO run")
                conn.execute("RELEASE run")
                if self._newer(failed.error):  # again up to it, then wait there
                    n = limit = stop = failed.index
                    isolate = -1
                    continue
                # Again up to the failing event (they passed), then isolate it.
                limit, isolate = failed.index, failed.index
                continue
            conn.execute("RELEASE run")
            for k in range(3):
                counts[k] += local[k]
            if self.breaker is not None:
                self.breaker.passed(limit - i)
            i, limit = limit, n
        return stop

    def _fast(
        self, recs: list[Record], decoded: list[Decoded], i: int, limit: int, counts: list[int]
    ) -> None:
        """Run ``recs[i:limit]`` (one partition); raise :class:`_EventFailedError` at the
        first event that fails (its handler raised, or it did not decode)."""
        handlers = self._handlers
        if handlers is None or self._parked or tracer() is not None:
            # (a span per handler, eventlane.tracing: through _handle, one event at a time)
            self._fast_general(recs, decoded, i, limit, counts)
            return
        # The common case, inlined: the base class's dispatch, one context for the run
        # (EventContext is valid during its handler call only: each call sees its event).
        projector = self.projector
        ctx: EventContext | None = None
        applied = skipped = 0
        index = i
        try:
            for index in range(i, limit):
                envelope = decoded[index]
                if envelope is None:
                    skipped += 1
                    continue
                if type(envelope) is _DecodeFailedError:
                    raise envelope
                event = envelope.event  # type: ignore[union-attr]
                handler = handlers.get(type(event))
                if handler is None:
                    skipped += 1
                    continue
                if ctx is None:
                    ctx = self._context(recs[index], envelope)  # type: ignore[arg-type]
                else:
                    ctx.offset = recs[index][2]
                    ctx.envelope = envelope  # type: ignore[assignment]
                handler(projector, event, ctx)
                applied += 1
        except Exception as exc:
            raise _EventFailedError(recs[index], exc, index) from exc
        counts[0] += applied
        counts[1] += skipped

    def _fast_general(
        self, recs: list[Record], decoded: list[Decoded], i: int, limit: int, counts: list[int]
    ) -> None:
        """:meth:`_fast` with parked keys or an overridden :meth:`Projector.handle`."""
        parked = self._parked
        handle = self._handle
        for index in range(i, limit):
            rec = recs[index]
            if parked and (rec.topic, rec.key) in parked:
                self._park_one(rec)
                counts[2] += 1
                continue
            try:
                handled = handle(rec, decoded[index])
            except Exception as exc:
                raise _EventFailedError(rec, exc, index) from exc
            counts[0 if handled else 1] += 1

    def _one_isolated(self, rec: Record, decoded: Decoded, counts: list[int]) -> None:
        if self._parked and (rec.topic, rec.key) in self._parked:
            self._park_one(rec)
            counts[2] += 1
            return
        if isinstance(decoded, _DecodeFailedError):  # deterministic: no retries
            self._dead_letter(rec, decoded.describe(), decoded.type_name, 1)
            counts[2] += 1
            self._count_dead(rec, decoded.describe())
            return
        attempts = max(1, self.projector.handler_attempts)
        conn = self.readmodel.conn
        for attempt in range(1, attempts + 1):
            conn.execute("SAVEPOINT event")
            try:
                handled = self._handle(rec, decoded)
            except Exception as exc:
                if not conn.in_transaction:  # SQLite aborted the transaction: not poison
                    raise
                self._refuse_transient(rec, exc)
                conn.execute("ROLLBACK TO event")
                conn.execute("RELEASE event")
                if attempt < attempts:
                    continue
                error = describe_failure(exc)
                self._dead_letter(rec, error, _type_name(rec), attempts)
                counts[2] += 1
                self._count_dead(rec, error)
                return
            conn.execute("RELEASE event")
            counts[0 if handled else 1] += 1
            if self.breaker is not None:
                self.breaker.passed(1)
            return

    def _refuse_transient(self, rec: Record, exc: BaseException) -> None:
        """A handler's error that is the database's doing (a lock timeout, a deadlock, a
        cancel, a full disk) is not poison: the whole batch is rolled back, to be applied
        again (:class:`ReadModelBusyError`), instead of the event being dead-lettered."""
        if self.readmodel.transient(exc):
            raise ReadModelBusyError(
                f"the database of {self.readmodel.location} refused projector"
                f" {self.projector.name}'s statement ({type(exc).__name__}:"
                f" {str(exc).strip()}); the batch was rolled back and nothing dead-lettered",
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
            ) from exc

    def _count_dead(self, rec: Record, error: str) -> None:
        """Tell the breaker; when it trips, the batch's transaction is rolled back."""
        if self.breaker is not None:
            error = redact(error, self.codec.plain_values(rec.value))
            self.breaker.dead_lettered(rec.topic, rec.partition, rec.offset, error)

    def _decode(self, rec: Record) -> Decoded:
        """The record's envelope; ``None`` for a type the projector does not handle; or the
        decoding error (dead-lettered when its turn comes)."""
        headers = rec.headers
        if self._skip_names:
            for name, value in headers:
                if name == "event-type":
                    if value in self._skip_names:
                        return None
                    break
        try:
            return self.codec.decode(
                rec.key,
                rec.value,
                headers,  # type: ignore[arg-type]
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
                lazy=True,  # event_id parsed only if a handler reads it
            )
        except Exception as exc:
            return _DecodeFailedError(exc, _type_name(rec))

    def _handle(self, rec: Record, decoded: Decoded) -> bool:
        if decoded is None:
            return False
        if tracer() is not None and not isinstance(decoded, _DecodeFailedError):
            with handler_span(
                self.projector.name,
                decoded.type_name,
                rec.topic,
                rec.partition,
                rec.offset,
                rec.headers,
            ):
                return self._handle_now(rec, decoded)
        return self._handle_now(rec, decoded)

    def _handle_now(self, rec: Record, decoded: Decoded) -> bool:
        if decoded is None:
            return False
        if isinstance(decoded, _DecodeFailedError):
            raise decoded
        event = decoded.event
        handlers = self._handlers
        handler = None
        if handlers is not None:  # the base class's dispatch, without its call
            handler = handlers.get(type(event))
            if handler is None:
                return False
        ctx = self._context(rec, decoded)
        if handler is None:
            return self.projector.handle(event, ctx)
        result: Any = handler(self.projector, event, ctx)
        if inspect.iscoroutine(result):  # an async handler: awaited by the parallel applier
            result.close()
            if not self.replaying:
                raise ProjectionError(
                    f"{type(self.projector).__qualname__}: an async handler met the in-order"
                    " applier (only a worker's parallel applier awaits them)",
                    topic=rec.topic,
                    partition=rec.partition,
                    offset=rec.offset,
                )
        return True

    def _context(self, rec: Record, envelope: Envelope[Any]) -> EventContext:
        readmodel = self.readmodel
        return EventContext(
            rec.topic,
            rec.partition,
            rec.offset,
            envelope,
            readmodel.db,
            self.replaying,
            self.app,
            readmodel.user_conn,
        )

    def close(self) -> None:
        """Release what the applier holds (nothing here; see the parallel applier)."""

    # ------------------------------------------------------------------ dead letters
    def _read_parked(self) -> set[ParkedKey]:
        return {(t, k) for t, k in self.readmodel.conn.execute(_OPEN_PARKED_SQL)}

    def _park_one(self, rec: Record) -> None:
        self._dead_letter(
            rec, "parked behind an earlier dead letter of the same key", None, 0, status="parked"
        )

    def _dead_letter(
        self, rec: Record, error: str, type_name: str | None, attempts: int, *, status: str = "dead"
    ) -> None:
        # never a personal value in a dead letter, its dlq copy or the log line (privacy.md)
        error = redact(error, self.codec.plain_values(rec.value))
        headers = orjson.dumps(
            [[n, None if v is None else v.decode("latin-1")] for n, v in rec.headers]
        ).decode()  # a TEXT column on every engine
        self.readmodel.conn.execute(
            "INSERT OR IGNORE INTO _eventlane_dead_letters (topic, partition, offset, key,"
            " value, headers, event_type, error, attempts, status, created_ms, published)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (
                rec.topic,
                rec.partition,
                rec.offset,
                rec.key,
                rec.value,
                headers,
                type_name if type_name is not None else _type_name(rec),
                error,
                attempts,
                status,
                int(self.clock() * 1000),
            ),
        )
        if self._park and rec.key is not None:
            self._parked.add((rec.topic, rec.key))
        log.warning(
            "event dead-lettered",
            projector=self.projector.name,
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            status=status,
            error=error,
        )


def _type_name(rec: Record) -> str | None:
    found = event_type_from_headers([(n, v) for n, v in rec.headers if v is not None])
    return None if found is None else found.name
