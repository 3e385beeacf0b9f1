"""Building a read model from history: the one code path both engines share.

A build file is an ordinary read-model file (:class:`~eventlane.projection.ReadModel`:
framework tables, the projector's migrations, then its ``setup``) written by the
projector's own, unchanged handlers through :class:`~eventlane.projection.BatchApplier`
with ``replaying=True`` (handlers suppress side effects; no application is passed, so a
policy cannot issue commands). Only durability is relaxed while building
(``synchronous=OFF``, an in-memory rollback journal): a build that dies is thrown away
and started again, never used, so nothing is lost by not fsyncing every transaction.
:func:`finalize` makes the file durable and ready for live use.

Finished build file, on top of the read-model format:

* ``_eventlane_positions`` holds exactly the end vector ``E`` the build replayed to
  (generation 0, or the live file's generations after a hand-off);
* ``_eventlane_dead_letters`` holds the events that failed during the build, marked
  ``published = 1``: they are reported (:class:`DeadLetterReport`), never copied to the live
  ``<group>.dlq`` topic. They stay in the file so ``park_after_dead_letter`` keeps holding
  later events of their keys after a hand-off, and ``eventlane`` can retry them;
* the journal mode is ``DELETE`` (no ``-wal``/``-shm`` beside it), so the file can be
  renamed into place alone; workers switch it back to WAL when they open it.
"""

from __future__ import annotations

import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from eventlane.app import App
from eventlane.codec import EventCodec
from eventlane.log import KeyedLog, Log, Record, TopicPartition
from eventlane.log.port import keyed_log
from eventlane.observability import get_logger
from eventlane.projection import BatchApplier, Projector, ReadModel, apply_migrations
from eventlane.replay.ranges import OffsetRange, read_range
from eventlane.replay.scanned_keys import ScannedKeyStore

log = get_logger("eventlane.replay")

__all__ = [
    "BATCH_RECORDS",
    "BuildCounts",
    "DeadLetterReport",
    "KeyGroup",
    "app_codec",
    "dead_letter_report",
    "finalize",
    "open_build",
    "seal",
    "remove_db",
    "replay_ranges",
]

BATCH_RECORDS = 20_000
"""Records per build transaction (one ``BatchApplier.apply`` call)."""


class KeyGroup(NamedTuple):
    """Keys whose ``crc32(key) % groups == group`` (keyless records: the key ``b""``).

    A projector whose state is per key (``state_per_key = True``) can be replayed by key
    group, so one partition feeds several tasks. CRC-32 is stable across processes and
    machines (unlike Python's ``hash``).

    >>> KeyGroup(0, 1).contains(b"anything")
    True
    >>> [KeyGroup(i, 4).contains(b"order-7") for i in range(4)]
    [False, False, True, False]
    """

    group: int
    groups: int

    def contains(self, key: bytes | None) -> bool:
        return self.groups == 1 or zlib.crc32(key or b"") % self.groups == self.group


class BuildCounts(NamedTuple):
    """What a build (or one task of it) did."""

    records: int
    applied: int
    skipped: int
    dead_lettered: int

    def __add__(self, other: object) -> BuildCounts:  # type: ignore[override,unused-ignore]
        if not isinstance(other, BuildCounts):
            return NotImplemented
        return BuildCounts(*(a + b for a, b in zip(self, other, strict=True)))


ZERO = BuildCounts(0, 0, 0, 0)


def app_codec(app: App, log: Log | None = None) -> EventCodec:
    """The codec a runtime of ``app`` on ``log`` uses (executors build it from a pickled
    :class:`App`): :meth:`App.codec <eventlane.app.App.codec>` with the app's key store on
    ``log``, so personal fields decrypt (or read as erased) in replays too. On a log without
    per-key reads (Kafka's core log) the app's key topic is read once into a read-only
    snapshot (:class:`~eventlane.replay.scanned_keys.ScannedKeyStore`)."""
    if log is None:
        return app.codec(keys=None)
    if isinstance(log, KeyedLog) or app.keys is not None:
        return app.codec(keys=app.key_store(keyed_log(log, "decrypting an app's personal fields")))
    if not app.has_personal_data():
        return app.codec(keys=None)
    return app.codec(keys=ScannedKeyStore(log, app.names.topic(app.keys_topic)))


def remove_db(path: Path) -> None:
    """Delete a SQLite file and its ``-wal``, ``-shm``, ``-journal`` and ``.lock`` siblings
    (never call it on a live read model: its workers hold those)."""
    for suffix in ("", "-wal", "-shm", "-journal", ".lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def open_build(path: Path, app: App, name: str) -> tuple[Projector, ReadModel]:
    """A fresh build file at ``path`` (any old one is deleted) with the projector's schema."""
    remove_db(path)
    readmodel = ReadModel(path)
    conn = readmodel.conn
    conn.execute("PRAGMA journal_mode=MEMORY")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-65536")  # 64 MiB: the build owns the file
    cls = app.projector(name)
    apply_migrations(cls.migrations, readmodel)
    return cls(), readmodel


def replay_ranges(
    log_: Log,
    applier: BatchApplier,
    ranges: Iterable[OffsetRange],
    *,
    key_group: KeyGroup | None = None,
    batch_records: int = BATCH_RECORDS,
    progress: Callable[[int], None] | None = None,
) -> BuildCounts:
    """Apply every record of ``ranges`` (of ``key_group`` only, when given) in offset order.

    ``progress`` gets the number of records read (not only applied) after each transaction.
    """
    counts = ZERO
    pending: list[Record] = []
    read = 0

    def flush() -> None:
        nonlocal counts, read
        if pending:
            result = applier.apply(pending)
            counts += BuildCounts(0, result.applied, result.skipped, result.dead_lettered)
            pending.clear()
        counts = counts._replace(records=counts.records + read)
        if progress is not None and read:
            progress(read)
        read = 0

    for rng in ranges:
        for records in read_range(log_, rng):
            read += len(records)
            if key_group is None or key_group.groups == 1:
                pending.extend(records)
            else:
                pending.extend(r for r in records if key_group.contains(r.key))
            if len(pending) >= batch_records or read >= 4 * batch_records:
                flush()
        flush()
    return counts


class DeadLetterReport(NamedTuple):
    """One event that failed during a build (the build skipped it)."""

    topic: str
    partition: int
    offset: int
    event_type: str | None
    status: str
    error: str

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


def dead_letter_report(conn: sqlite3.Connection, schema: str = "main") -> list[DeadLetterReport]:
    """The dead letters of a build file, in source order."""
    rows = conn.execute(
        f"SELECT topic, partition, offset, event_type, status, error FROM"
        f" {schema}._eventlane_dead_letters ORDER BY topic, partition, offset"
    )
    return [DeadLetterReport(*r) for r in rows]


def finalize(
    conn: sqlite3.Connection,
    path: Path,
    end: Mapping[TopicPartition, int],
    *,
    generations: Mapping[TopicPartition, int] | None = None,
) -> None:
    """Store positions ``end``, then :func:`seal` the file (``conn`` is closed)."""
    gens = generations or {}
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DELETE FROM _eventlane_positions")
    conn.executemany(
        "INSERT INTO _eventlane_positions (topic, partition, next_offset, generation)"
        " VALUES (?, ?, ?, ?)",
        [(tp.topic, tp.partition, off, gens.get(tp, 0)) for tp, off in sorted(end.items())],
    )
    conn.execute("COMMIT")
    seal(conn, path)


def seal(conn: sqlite3.Connection, path: Path) -> None:
    """Mark dead letters reported, make the file stand alone and durable, close ``conn``.

    Afterwards ``path`` has journal mode ``DELETE`` and no ``-wal``/``-shm``/``-journal``
    siblings, and every byte of it is fsynced: it can be renamed into place alone.
    """
    t0 = time.perf_counter()
    conn.execute("UPDATE _eventlane_dead_letters SET published=1 WHERE published=0")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    for suffix in ("-wal", "-shm", "-journal", ".lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    log.debug("build sealed", path=str(path), seconds=round(time.perf_counter() - t0, 3))
