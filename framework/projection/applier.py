"""Applying a poll's records to a read model: decode, dispatch, dead-letter, advance.

One call of :meth:`BatchApplier.apply` is one ``BEGIN IMMEDIATE`` transaction holding the
handlers' writes, any dead letters, and the positions of every partition in the batch. The
fast path runs the whole batch at once; if a handler or the decoder fails, the transaction
is rolled back and the batch is replayed one event at a time inside savepoints, so the
failing event alone is retried (``handler_attempts`` times) and then dead-lettered, and the
partition keeps flowing.

Decoding failures (unknown event type, malformed JSON, wrong field types) are deterministic:
dead-lettered at once. Events of types the projector has no handler for are skipped without
being decoded when their type header names a known, unhandled class.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
import structlog

from framework.codec import EventCodec, event_type_from_headers
from framework.domain import event_type_of
from framework.log import Record, TopicPartition
from framework.projection.projector import EventContext, Projector
from framework.projection.readmodel import ReadModel

log = structlog.get_logger("eventlane.projection")


class BatchResult(NamedTuple):
    applied: int
    skipped: int
    dead_lettered: int


class _EventFailedError(Exception):
    def __init__(self, record: Record, error: BaseException) -> None:
        self.record = record
        self.error = error
        super().__init__(str(error))


class BatchApplier:
    """Applies records to one projector's read model (see the module docstring)."""

    def __init__(
        self,
        projector: Projector,
        codec: EventCodec,
        readmodel: ReadModel,
        *,
        replaying: bool = False,
        app: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.projector = projector
        self.codec = codec
        self.readmodel = readmodel
        self.replaying = replaying
        self.app = app
        self.clock = clock
        handled = {event_type_of(c).name for c in projector.handled_types()}
        known = {event_type_of(c).name for c in codec.registry.classes()}
        self._skip_names = {n.encode() for n in known - handled}
        self._parked: set[bytes] = set()
        if projector.park_after_dead_letter:
            rows = readmodel.conn.execute(
                "SELECT DISTINCT key FROM _eventlane_dead_letters WHERE status IN"
                " ('dead', 'parked') AND key IS NOT NULL"
            )
            self._parked = {r[0] for r in rows}

    # ------------------------------------------------------------------ public
    def apply(self, records: list[Record], generation: int = 0) -> BatchResult:
        """Apply ``records`` (any partitions, each in offset order) exactly once."""
        if not records:
            return BatchResult(0, 0, 0)
        groups: dict[TopicPartition, list[Record]] = {}
        for r in records:
            groups.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        try:
            with self.readmodel.transaction() as conn:
                counts = [0, 0, 0]
                for tp, recs in groups.items():
                    start = self.readmodel.check_and_advance(
                        conn, tp, generation, recs[0].offset, recs[-1].offset + 1
                    )
                    for rec in recs:
                        if rec.offset < start:
                            continue
                        self._one(rec, counts, retry=False)
                return BatchResult(*counts)
        except _EventFailedError:
            pass  # replay the batch event by event, isolating the failure(s)
        with self.readmodel.transaction() as conn:
            counts = [0, 0, 0]
            for tp, recs in groups.items():
                start = self.readmodel.check_and_advance(
                    conn, tp, generation, recs[0].offset, recs[-1].offset + 1
                )
                for rec in recs:
                    if rec.offset >= start:
                        self._one(rec, counts, retry=True)
            return BatchResult(*counts)

    # ------------------------------------------------------------------ one event
    def _one(self, rec: Record, counts: list[int], *, retry: bool) -> None:
        if self._parked and rec.key in self._parked:
            self._dead_letter(
                rec,
                "parked behind an earlier dead letter of the same key",
                None,
                0,
                status="parked",
            )
            counts[2] += 1
            return
        if not retry:
            try:
                counts[0 if self._dispatch(rec) else 1] += 1
            except Exception as exc:
                raise _EventFailedError(rec, exc) from exc
            return
        attempts = max(1, self.projector.handler_attempts)
        conn = self.readmodel.conn
        for attempt in range(1, attempts + 1):
            conn.execute("SAVEPOINT event")
            try:
                handled = self._dispatch(rec)
            except _DecodeFailedError as exc:
                conn.execute("ROLLBACK TO event")
                conn.execute("RELEASE event")
                self._dead_letter(rec, exc.describe(), exc.type_name, 1)
                counts[2] += 1
                return
            except Exception as exc:
                conn.execute("ROLLBACK TO event")
                conn.execute("RELEASE event")
                if attempt == attempts:
                    self._dead_letter(rec, _describe(exc), _type_name(rec), attempts)
                    counts[2] += 1
                    return
                continue
            conn.execute("RELEASE event")
            counts[0 if handled else 1] += 1
            return

    def _dispatch(self, rec: Record) -> bool:
        headers = rec.headers
        for name, value in headers:
            if name == "event-type":
                if value in self._skip_names:
                    return False
                break
        try:
            env = self.codec.decode(
                rec.key,
                rec.value,
                headers,  # type: ignore[arg-type]
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
            )
        except Exception as exc:
            raise _DecodeFailedError(exc, _type_name(rec)) from exc
        ctx = EventContext(
            rec.topic, rec.partition, rec.offset, env, self.readmodel.db, self.replaying, self.app
        )
        return self.projector.handle(env.event, ctx)

    def _dead_letter(
        self, rec: Record, error: str, type_name: str | None, attempts: int, *, status: str = "dead"
    ) -> None:
        headers = orjson.dumps(
            [[n, None if v is None else v.decode("latin-1")] for n, v in rec.headers]
        )
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
                type_name,
                error,
                attempts,
                status,
                int(self.clock() * 1000),
            ),
        )
        if self.projector.park_after_dead_letter and rec.key is not None:
            self._parked.add(rec.key)
        log.warning(
            "event dead-lettered",
            projector=self.projector.name,
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            status=status,
            error=error,
        )


class _DecodeFailedError(Exception):
    def __init__(self, error: BaseException, type_name: str | None) -> None:
        self.error = error
        self.type_name = type_name
        super().__init__(str(error))

    def describe(self) -> str:
        return _describe(self.error)


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _type_name(rec: Record) -> str | None:
    found = event_type_from_headers([(n, v) for n, v in rec.headers if v is not None])
    return None if found is None else found.name
