"""The per-key index of a partition: key → the offsets of its records, in order.

Derived data, rebuildable from the log at any time. One SQLite file per partition, at
``<data>/store/<topic>/<partition>.keyindex.sqlite``::

    entries(key BLOB, seq INTEGER, offset INTEGER, PRIMARY KEY (key, seq)) WITHOUT ROWID
    meta(name TEXT PRIMARY KEY, value INTEGER)      -- "next_offset", "schema"

``seq`` numbers a key's records 1, 2, 3… in offset order; on an event topic it *is* the
aggregate version, because the event store appends an aggregate's events only when the
key's last ``seq`` equals the expected version (under the partition's append lock).
``next_offset`` is the first log offset not yet indexed.

Invariants:

* Every write is a compare-and-set on ``next_offset`` inside one SQLite transaction: it
  applies only if nobody indexed past the point its rows were computed from, so entries are
  added in log order exactly once even when processes race (saves index under the
  partition's append lock; catch-ups may run anywhere).
* The index may lag the log (a writer died between its append and its index update, or
  the file was deleted); :meth:`KeyIndex.catch_up` indexes the missing records, and
  readers overlay the unindexed tail without writing.
* A file SQLite cannot open, or of another schema, is deleted and rebuilt.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

import structlog

from framework.log import Log

log = structlog.get_logger("eventlane.store")

SCHEMA = 1
_DDL = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB NOT NULL, seq INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY (key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
_CATCH_UP_BYTES = 4 << 20


class KeyIndex:
    """The key index of one ``(topic, partition)`` (see the module docstring)."""

    def __init__(self, log_: Log, topic: str, partition: int, path: Path) -> None:
        self.log = log_
        self.topic = topic
        self.partition = partition
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        for attempt in range(2):
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_DDL)
                row = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
                if row is None:
                    db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA,))
                elif row[0] != SCHEMA:
                    raise sqlite3.DatabaseError(f"key index schema {row[0]}, expected {SCHEMA}")
                return db
            except sqlite3.DatabaseError as exc:
                db.close()
                if attempt:
                    raise
                log.warning(
                    "key index unreadable; rebuilding it from the log",
                    topic=self.topic,
                    partition=self.partition,
                    file=str(self.path),
                    error=str(exc),
                )
                self._delete_files()
        raise AssertionError("unreachable")  # pragma: no cover

    def _delete_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(self.path) + suffix).unlink()

    def next_offset(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name='next_offset'").fetchone()
        return int(row[0]) if row else -1

    def head(self, key: bytes) -> int:
        """The last ``seq`` indexed for ``key`` (0 if none)."""
        row = self._db.execute("SELECT max(seq) FROM entries WHERE key=?", (key,)).fetchone()
        return int(row[0] or 0)

    def offsets(self, key: bytes, after_seq: int = 0, upto_seq: int | None = None) -> list[int]:
        """Offsets of ``key``'s records with ``after_seq < seq <= upto_seq``, in order."""
        if upto_seq is None:
            rows = self._db.execute(
                "SELECT offset FROM entries WHERE key=? AND seq>? ORDER BY seq", (key, after_seq)
            )
        else:
            rows = self._db.execute(
                "SELECT offset FROM entries WHERE key=? AND seq>? AND seq<=? ORDER BY seq",
                (key, after_seq, upto_seq),
            )
        return [r[0] for r in rows]

    def last_offset(self, key: bytes) -> int | None:
        row = self._db.execute(
            "SELECT offset FROM entries WHERE key=? ORDER BY seq DESC LIMIT 1", (key,)
        ).fetchone()
        return None if row is None else int(row[0])

    def scan_tail(self, upto: int, key: bytes | None = None) -> list[tuple[bytes, int]]:
        """``(key, offset)`` of the keyed records from ``next_offset`` to ``upto`` (exclusive),
        read from the log without writing the index (optionally only those of ``key``)."""
        start = max(self.next_offset(), self.log.offsets(self.topic, self.partition).lwm)
        out: list[tuple[bytes, int]] = []
        cursor = None
        while start < upto:
            records, cursor = self.log.read(
                self.topic,
                self.partition,
                start,
                max_bytes=_CATCH_UP_BYTES,
                cursor=cursor,
                upto=upto,
            )
            if not records:
                break
            out.extend(
                (r.key, r.offset)
                for r in records
                if r.key is not None and (key is None or r.key == key)
            )
            start = records[-1].offset + 1
        return out

    def catch_up(self, upto: int) -> int:
        """Index every keyed record below ``upto``. Call under the append lock. Returns how
        many records were indexed."""
        with self._lock:
            start = self.next_offset()
            if start >= upto:
                return 0
            tail = self.scan_tail(upto)
            heads: dict[bytes, int] = {}
            rows = []
            for key, offset in tail:
                seq = heads.get(key)
                if seq is None:
                    seq = self.head(key)
                seq += 1
                heads[key] = seq
                rows.append((key, seq, offset))
            if not self._write(rows, start, upto):
                return 0
        if tail:
            log.info(
                "key index caught up",
                topic=self.topic,
                partition=self.partition,
                records=len(tail),
                offset=upto,
            )
        return len(tail)

    def add(self, key: bytes, first_seq: int, offsets: list[int], next_offset: int) -> bool:
        """Record that ``key``'s records ``first_seq, first_seq+1…`` are at ``offsets``, the
        last records appended (the index must be caught up to ``offsets[0]``)."""
        with self._lock:
            return self._write(
                [(key, first_seq + i, off) for i, off in enumerate(offsets)],
                offsets[0],
                next_offset,
            )

    def _write(
        self, rows: list[tuple[bytes, int, int]], expected_next: int, next_offset: int
    ) -> bool:
        """Apply ``rows`` iff the index still ends at ``expected_next`` (-1: empty index,
        or any offset at or below the partition's first indexed record)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            current = self.next_offset()
            if current != expected_next and not (current == -1 and expected_next <= 0):
                db.execute("ROLLBACK")
                return False
            db.executemany("INSERT INTO entries VALUES (?, ?, ?)", rows)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('next_offset', ?)", (next_offset,))
            db.execute("COMMIT")
            return True
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def rebuild(self) -> int:
        """Drop every entry and index the partition again from its low-water mark."""
        with self._lock:
            self._db.execute("DELETE FROM entries")
            self._db.execute("DELETE FROM meta WHERE name='next_offset'")
        return self.catch_up(self.log.offsets(self.topic, self.partition).hwm)

    def close(self) -> None:
        self._db.close()
