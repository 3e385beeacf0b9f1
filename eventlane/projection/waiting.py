"""Waiting for newer code: a partition stopped at an event its worker's code is too old for.

An event whose type the code knows, stored at a schema version newer than the code's class
(:class:`~eventlane.errors.NewerEventVersionError`: written by code deployed after this
worker started), is not a poison event: a worker with the newer code will apply it. So a
worker meeting one (decoding it, or in a handler that loads an aggregate whose stream holds
one) does not dead-letter it: the partition's position stays at that record (the events
before it are applied and committed), the worker stops fetching the partition, and a row in
``_eventlane_waiting`` says what it waits for. Other partitions keep flowing. The partition
continues when a worker with the newer code owns it (a rolling restart, ``eventlane run``'s
SIGHUP), which applies the record and moves the position past it.

A row is *current* while the partition's position is at or below its offset; rows left
behind once the position passed are ignored (and replaced by the next wait). An unknown
type (no class anywhere) is still dead-lettered; ``--dead-letter-unknown`` dead-letters
newer versions too (the behaviour before waits existed).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, NamedTuple

from eventlane.errors import NewerEventVersionError, error_chain
from eventlane.log import Record

__all__ = ["Waiting", "current_waits", "describe", "newer_version_in", "record_wait"]

CREATE = """CREATE TABLE IF NOT EXISTS _eventlane_waiting (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    version INTEGER NOT NULL,
    known_version INTEGER NOT NULL,
    since_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
) WITHOUT ROWID"""


class Waiting(NamedTuple):
    """A partition stopped at ``offset`` for an event the code is too old for."""

    topic: str
    partition: int
    offset: int
    event_type: str
    version: int
    known_version: int


def newer_version_in(error: BaseException | None) -> NewerEventVersionError | None:
    """The :class:`NewerEventVersionError` behind ``error`` (itself, its ``error``
    attribute as the applier wraps decoding failures, or its cause/context chain)."""
    return next((e for e in error_chain(error) if isinstance(e, NewerEventVersionError)), None)


def waiting_for(rec: Record, error: NewerEventVersionError) -> Waiting:
    return Waiting(
        rec.topic,
        rec.partition,
        rec.offset,
        error.type_name or "?",
        error.version if error.version is not None else -1,
        error.known_version,
    )


def record_wait(conn: Any, wait: Waiting, now_ms: int | None = None) -> None:
    """Inside the batch's transaction: the partition waits at ``wait.offset``."""
    conn.execute(CREATE)
    row = conn.execute(
        "SELECT offset, since_ms FROM _eventlane_waiting WHERE topic=? AND partition=?",
        (wait.topic, wait.partition),
    ).fetchone()
    since = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    if row is not None and int(row[0]) == wait.offset:
        since = int(row[1])  # the same wait, seen again (a restart): keep when it began
    conn.execute(
        "INSERT INTO _eventlane_waiting VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (topic,"
        " partition) DO UPDATE SET offset = excluded.offset, event_type = excluded.event_type,"
        " version = excluded.version, known_version = excluded.known_version,"
        " since_ms = excluded.since_ms",
        (*wait, since),
    )


def describe(wait: Waiting | dict[str, Any]) -> str:
    """``waiting for code that knows GuestRegistered v2`` (and where)."""
    w = wait if isinstance(wait, dict) else wait._asdict()
    return (
        f"waiting for code that knows {w['event_type']} v{w['version']}"
        f" (this code knows v{w['known_version']}) at {w['topic']}-{w['partition']}"
        f" offset {w['offset']}"
    )


def current_waits(conn: Any) -> list[dict[str, Any]]:
    """The current waits of a read model (for status), oldest first."""
    if conn is None:
        return []
    try:
        rows = conn.execute(
            "SELECT w.topic, w.partition, w.offset, w.event_type, w.version, w.known_version,"
            " w.since_ms FROM _eventlane_waiting w JOIN _eventlane_positions p"
            " ON p.topic = w.topic AND p.partition = w.partition"
            " WHERE p.next_offset <= w.offset ORDER BY w.since_ms, w.topic, w.partition"
        ).fetchall()
    except sqlite3.OperationalError:  # no such table: never waited
        return []
    keys = ("topic", "partition", "offset", "event_type", "version", "known_version", "since_ms")
    out = []
    for row in rows:
        doc = dict(zip(keys, row, strict=True))
        doc["message"] = describe(doc)
        out.append(doc)
    return out
