"""Dead letters: inspect them, copy them to the ``<group>.dlq`` topic, retry them.

The row in ``_eventlane_dead_letters`` is written in the same transaction as the position
that skips the event, so it is never lost and never duplicated. The ``<group>.dlq`` topic is
an outbox copy for other consumers (alerting, tooling): compacted, keyed by the source
coordinates ``topic/partition/offset``, so a copy published twice after a crash collapses
to one. A retry decodes the raw bytes with today's code (upcasters included) and applies
the event in a read-model transaction; on success the row's status becomes ``retried``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson
import structlog

from framework.codec import EventCodec
from framework.log import Log, Record
from framework.projection.projector import EventContext, Projector
from framework.projection.readmodel import ReadModel

log = structlog.get_logger("eventlane.projection")


class DeadLetter(NamedTuple):
    id: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    event_type: str | None
    error: str
    attempts: int
    status: str
    created_ms: int

    def to_json(self) -> dict[str, Any]:
        body = self._asdict()
        body["key"] = None if self.key is None else self.key.decode("utf-8", "replace")
        body["value"] = None if self.value is None else self.value.decode("utf-8", "replace")
        body["headers"] = [
            [n, None if v is None else v.decode("utf-8", "replace")] for n, v in self.headers
        ]
        return body


_COLUMNS = (
    "id, topic, partition, offset, key, value, headers, event_type, error, attempts,"
    " status, created_ms"
)


def _row(row: tuple[Any, ...]) -> DeadLetter:
    headers = tuple(
        (n, None if v is None else v.encode("latin-1")) for n, v in orjson.loads(row[6])
    )
    return DeadLetter(row[0], row[1], row[2], row[3], row[4], row[5], headers, *row[7:])


def dlq_topic(group: str) -> str:
    return f"{group}.dlq"


def list_dead_letters(readmodel: ReadModel, *, status: str | None = None) -> list[DeadLetter]:
    sql = f"SELECT {_COLUMNS} FROM _eventlane_dead_letters"
    args: tuple[Any, ...] = ()
    if status is not None:
        sql += " WHERE status=?"
        args = (status,)
    return [_row(r) for r in readmodel.conn.execute(sql + " ORDER BY id", args)]


def get_dead_letter(readmodel: ReadModel, letter_id: int) -> DeadLetter | None:
    row = readmodel.conn.execute(
        f"SELECT {_COLUMNS} FROM _eventlane_dead_letters WHERE id=?", (letter_id,)
    ).fetchone()
    return None if row is None else _row(row)


def publish_dead_letters(log_: Log, group: str, readmodel: ReadModel) -> int:
    """Copy unpublished dead letters to ``<group>.dlq``; return how many were copied."""
    rows = readmodel.conn.execute(
        f"SELECT {_COLUMNS} FROM _eventlane_dead_letters WHERE published=0 ORDER BY id"
    ).fetchall()
    if not rows:
        return 0
    topic = dlq_topic(group)
    log_.create_topic(topic, 1, {"cleanup_policy": "compact", "retention_ms": -1}, exist_ok=True)
    letters = [_row(r) for r in rows]
    records = []
    for d in letters:
        key = f"{d.topic}/{d.partition}/{d.offset}".encode()
        headers = (*d.headers, ("dlq-error", d.error.encode()), ("dlq-status", d.status.encode()))
        records.append((key, d.value if d.value is not None else b"", headers, None))
    log_.append(topic, 0, records)
    with readmodel.transaction() as conn:
        conn.executemany(
            "UPDATE _eventlane_dead_letters SET published=1 WHERE id=?", [(d.id,) for d in letters]
        )
    return len(letters)


def retry_dead_letters(
    projector: Projector,
    codec: EventCodec,
    readmodel: ReadModel,
    *,
    ids: list[int] | None = None,
    app: Any = None,
) -> tuple[int, int]:
    """Re-apply dead letters (all open ones, or ``ids``) in source order with today's code.

    Returns ``(succeeded, failed)``. A letter that fails again keeps its status and gets the
    new error; later parked letters of the same key stay parked until it succeeds.
    """
    letters = [d for d in list_dead_letters(readmodel) if d.status in ("dead", "parked")]
    if ids is not None:
        wanted = set(ids)
        letters = [d for d in letters if d.id in wanted]
    letters.sort(key=lambda d: (d.topic, d.partition, d.offset))
    ok = failed = 0
    blocked: set[bytes | None] = set()
    for d in letters:
        if d.key in blocked:
            failed += 1
            continue
        record = Record(d.topic, d.partition, d.offset, 0, 0, d.key, d.value, d.headers)
        try:
            with readmodel.transaction() as conn:
                env = codec.decode(
                    record.key,
                    record.value,
                    record.headers,  # type: ignore[arg-type]
                    topic=d.topic,
                    partition=d.partition,
                    offset=d.offset,
                )
                ctx = EventContext(d.topic, d.partition, d.offset, env, readmodel.db, False, app)
                projector.handle(env.event, ctx)
                conn.execute(
                    "UPDATE _eventlane_dead_letters SET status='retried' WHERE id=?", (d.id,)
                )
            ok += 1
        except Exception as exc:
            failed += 1
            blocked.add(d.key)
            with readmodel.transaction() as conn:
                conn.execute(
                    "UPDATE _eventlane_dead_letters SET error=?, attempts=attempts+1 WHERE id=?",
                    (f"retry failed: {exc!r}", d.id),
                )
            log.warning(
                "dead letter retry failed",
                topic=d.topic,
                partition=d.partition,
                offset=d.offset,
                error=str(exc),
            )
    return ok, failed
