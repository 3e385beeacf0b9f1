"""Dead letters: inspect them, copy them to the ``<group>.dlq`` topic, retry them.

The row in ``_eventlane_dead_letters`` is written in the same transaction as the position
that skips the event, so it is never lost and never duplicated. The ``<group>.dlq`` topic is
an outbox copy for other consumers (alerting, tooling): compacted, keyed by the source
coordinates ``topic/partition/offset``, so a copy published twice after a crash collapses
to one. A retry decodes the raw bytes with today's code (upcasters included) and applies
the event in a read-model transaction; on success the row's status becomes ``retried``.
"""

from __future__ import annotations

import base64
import traceback
from typing import Any, NamedTuple

import orjson

from eventlane.codec import EventCodec
from eventlane.codec.privacy import redact
from eventlane.log import Log
from eventlane.observability import get_logger
from eventlane.projection.projector import EventContext, Projector
from eventlane.projection.store import AnyReadModel as ReadModel
from eventlane.projection.store import AnyReadModelView as ReadModelView

log = get_logger("eventlane.projection")


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

    @property
    def error_line(self) -> str:
        """The exception's own line (``ValueError: ...``): the last line of :attr:`error`,
        which holds the handler's traceback (see :func:`describe_failure`)."""
        lines = [line for line in self.error.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: bytes as UTF-8 text (lossy for binary) plus the exact value in
        base64 (``value_base64``); ``error`` is the exception's line, ``traceback`` the
        stored traceback (file, line and source of each of the innermost frames)."""
        body = self._asdict()
        body["error"] = self.error_line
        body["traceback"] = self.error
        body["key"] = None if self.key is None else self.key.decode("utf-8", "replace")
        body["value"] = None if self.value is None else self.value.decode("utf-8", "replace")
        body["value_base64"] = (
            None if self.value is None else base64.b64encode(self.value).decode("ascii")
        )
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


def list_dead_letters(
    readmodel: ReadModel | ReadModelView, *, status: str | None = None
) -> list[DeadLetter]:
    """Dead letters in id order (all, or those with ``status``). A read-only view works."""
    conn = readmodel.conn
    if conn is None:
        return []
    sql = f"SELECT {_COLUMNS} FROM _eventlane_dead_letters"
    args: tuple[Any, ...] = ()
    if status is not None:
        sql += " WHERE status=?"
        args = (status,)
    return [_row(r) for r in conn.execute(sql + " ORDER BY id", args)]


def get_dead_letter(readmodel: ReadModel | ReadModelView, letter_id: int) -> DeadLetter | None:
    conn = readmodel.conn
    if conn is None:
        return None
    row = conn.execute(
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


class RetryReport(NamedTuple):
    """What a retry did: ids applied, and ids that failed with why."""

    succeeded: list[int]
    failed: dict[int, str]


def _open_letters(readmodel: ReadModel) -> list[DeadLetter]:
    rows = readmodel.conn.execute(
        f"SELECT {_COLUMNS} FROM _eventlane_dead_letters WHERE status IN ('dead', 'parked')"
    )
    return sorted((_row(r) for r in rows), key=lambda d: (d.topic, d.partition, d.offset))


def retry_dead_letters(
    projector: Projector,
    codec: EventCodec,
    readmodel: ReadModel,
    *,
    ids: list[int] | None = None,
    app: Any = None,
) -> RetryReport:
    """Re-apply open dead letters (all of them, or ``ids``) in source order with today's
    code: the raw bytes are decoded (and upcast) again and the projector's handler runs, in
    one read-model transaction per letter that also marks it ``retried``.

    A letter that fails again stays open, with the new error and one more attempt. For a
    projector that parks keys (``park_after_dead_letter``) a key's order is kept: a letter
    is only retried if every earlier open letter of its key is retried before it (in this
    call), and once one fails the later ones of its key are not tried. When a key has no
    open letter left, live workers stop parking it (they re-read the parked keys in every
    batch's transaction).
    """
    letters = _open_letters(readmodel)
    failed: dict[int, str] = {}
    if ids is not None:
        wanted = set(ids)
        found = {d.id for d in letters}
        for letter_id in sorted(wanted - found):
            known = get_dead_letter(readmodel, letter_id)
            failed[letter_id] = (
                f"no dead letter {letter_id}"
                if known is None
                else f"dead letter {letter_id} is {known.status}, not open"
            )
        selected = [d for d in letters if d.id in wanted]
    else:
        selected = letters
    park = bool(projector.park_after_dead_letter)
    blocked: dict[tuple[str, bytes | None], int] = {}
    if park and ids is not None:
        chosen = {d.id for d in selected}
        for d in letters:  # earliest open letter of each key that is not being retried
            if d.id not in chosen:
                blocked.setdefault((d.topic, d.key), d.id)
    succeeded: list[int] = []
    for d in selected:
        before = blocked.get((d.topic, d.key)) if park else None
        if before is not None:
            failed[d.id] = (
                f"an earlier dead letter of the same key is still open (id {before}): retry"
                " it first, or together"
            )
            continue
        error = _retry_one(projector, codec, readmodel, d, app)
        if error is None:
            succeeded.append(d.id)
            continue
        failed[d.id] = error
        if park:
            blocked[(d.topic, d.key)] = d.id
    return RetryReport(succeeded, failed)


def _retry_one(
    projector: Projector, codec: EventCodec, readmodel: ReadModel, d: DeadLetter, app: Any
) -> str | None:
    try:
        with readmodel.transaction() as conn:
            status = conn.execute(
                "SELECT status FROM _eventlane_dead_letters WHERE id=?", (d.id,)
            ).fetchone()
            if status is None or status[0] not in ("dead", "parked"):
                return None  # retried meanwhile by another process
            env = codec.decode(
                d.key,
                d.value,
                d.headers,  # type: ignore[arg-type]
                topic=d.topic,
                partition=d.partition,
                offset=d.offset,
            )
            ctx = EventContext(
                d.topic, d.partition, d.offset, env, readmodel.db, False, app, readmodel.user_conn
            )
            projector.handle(env.event, ctx)
            conn.execute("UPDATE _eventlane_dead_letters SET status='retried' WHERE id=?", (d.id,))
    except Exception as exc:
        values = codec.plain_values(d.value)
        message = redact(f"retry failed: {describe_failure(exc)}", values)
        with readmodel.transaction() as conn:
            conn.execute(
                "UPDATE _eventlane_dead_letters SET error=?, attempts=attempts+1 WHERE id=?",
                (message, d.id),
            )
        log.warning(
            "dead letter retry failed",
            projector=projector.name,
            topic=d.topic,
            partition=d.partition,
            offset=d.offset,
            error=redact(str(exc), values),
        )
        return message
    log.info(
        "dead letter retried",
        projector=projector.name,
        topic=d.topic,
        partition=d.partition,
        offset=d.offset,
    )
    return None


TRACEBACK_FRAMES = 8
"""How many of the innermost frames a dead letter keeps (the handler's are the innermost)."""


def describe_failure(exc: BaseException) -> str:
    """The ``error`` stored with a dead letter: Python's traceback of ``exc`` (its
    :data:`TRACEBACK_FRAMES` innermost frames, each ``File "...", line N, in name``), ending
    with the exception's own line (``ValueError: ...``), which ``dlq list`` shows."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-TRACEBACK_FRAMES)
    return "".join(lines).strip()
