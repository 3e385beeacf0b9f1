"""A projector's read model: one SQLite file holding its tables, positions and dead letters.

File: ``<data>/readmodels/<projector name>.sqlite``, opened with WAL and
``synchronous=FULL``; every write is a ``BEGIN IMMEDIATE`` transaction. The framework's own
tables come from the ``migrations.eventlane.read_model`` set (see that module for their
schema); the projector's tables from its ``setup`` and its own migrations.

Exactly-once effect: a batch of events and the positions it advances commit in the same
transaction, and inside it each partition's stored position is checked first, so a batch
(or the part of it) that was already applied is skipped, and a writer whose group
generation is older than the stored one is refused (:class:`FencedError`): a paused zombie
can never apply events of a partition another worker owns now.

SQLite older than 3.51.3 has a rare WAL-reset corruption bug with several writing
connections; a warning is logged, and each process keeps one writing connection per file.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog
from sqlite_utils import Database

from framework.errors import ProjectionError
from framework.log import TopicPartition
from migrations.eventlane import read_model as framework_migrations

log = structlog.get_logger("eventlane.projection")

SAFE_SQLITE = (3, 51, 3)


class FencedError(ProjectionError):
    """The worker's generation is older than the one stored for a partition: it lost it."""


@functools.cache
def _warn_old_sqlite() -> None:
    if sqlite3.sqlite_version_info < SAFE_SQLITE:
        log.warning(
            "SQLite older than 3.51.3 has a rare WAL-reset corruption bug with several writing"
            " connections; eventlane keeps one writing connection per read-model file per"
            " process",
            sqlite_version=sqlite3.sqlite_version,
        )


def readmodel_path(data_dir: Path, name: str) -> Path:
    return data_dir / "readmodels" / f"{name}.sqlite"


class ReadModel:
    """An open read-model file. One per process per file; thread-safe through a lock."""

    def __init__(self, path: Path) -> None:
        _warn_old_sqlite()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        self.conn = conn
        self.db = Database(conn)
        self._lock = threading.RLock()
        framework_migrations.apply(self.db)

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on any exception)."""
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    # ------------------------------------------------------------------ positions
    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to apply, per partition ever applied."""
        rows = self.conn.execute("SELECT topic, partition, next_offset FROM _eventlane_positions")
        return {TopicPartition(t, p): o for t, p, o in rows}

    def position(self, tp: TopicPartition) -> int | None:
        row = self.conn.execute(
            "SELECT next_offset FROM _eventlane_positions WHERE topic=? AND partition=?",
            (tp.topic, tp.partition),
        ).fetchone()
        return None if row is None else int(row[0])

    def claim(self, tp: TopicPartition, generation: int, start: int) -> int:
        """Record that a worker of ``generation`` owns ``tp`` now; return its position
        (``start`` when the partition was never applied). Raises :class:`FencedError` when a
        newer generation already claimed it."""
        with self.transaction() as conn:
            row = conn.execute(
                "SELECT next_offset, generation FROM _eventlane_positions"
                " WHERE topic=? AND partition=?",
                (tp.topic, tp.partition),
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO _eventlane_positions VALUES (?, ?, ?, ?)",
                    (tp.topic, tp.partition, start, generation),
                )
                return start
            if row[1] > generation:
                raise FencedError(
                    f"generation {generation} cannot claim a partition owned at generation"
                    f" {row[1]}",
                    topic=tp.topic,
                    partition=tp.partition,
                )
            conn.execute(
                "UPDATE _eventlane_positions SET generation=? WHERE topic=? AND partition=?",
                (generation, tp.topic, tp.partition),
            )
            return int(row[0])

    def check_and_advance(
        self,
        conn: sqlite3.Connection,
        tp: TopicPartition,
        generation: int,
        first: int,
        next_offset: int,
    ) -> int:
        """Inside a transaction: the stored position of ``tp`` after fencing checks.

        Returns the offset from which events of this batch still need applying (events below
        it were applied before: a redelivery), and stores ``next_offset``. Raises
        :class:`FencedError` if a newer generation owns ``tp``.
        """
        row = conn.execute(
            "SELECT next_offset, generation FROM _eventlane_positions WHERE topic=? AND"
            " partition=?",
            (tp.topic, tp.partition),
        ).fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO _eventlane_positions VALUES (?, ?, ?, ?)",
                (tp.topic, tp.partition, next_offset, generation),
            )
            return first
        stored, owner = int(row[0]), int(row[1])
        if owner > generation:
            raise FencedError(
                f"generation {generation} lost this partition to generation {owner}",
                topic=tp.topic,
                partition=tp.partition,
                offset=first,
            )
        if next_offset > stored:
            conn.execute(
                "UPDATE _eventlane_positions SET next_offset=?, generation=? WHERE"
                " topic=? AND partition=?",
                (next_offset, generation, tp.topic, tp.partition),
            )
        return max(stored, first)

    def close(self) -> None:
        with self._lock:
            self.conn.close()
