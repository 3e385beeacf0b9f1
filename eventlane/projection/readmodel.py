"""A projector's read model: one SQLite file holding its tables, positions and dead letters.

File: ``<data>/readmodels/<projector name>.sqlite``, opened with WAL and
``synchronous=FULL``; every write is a ``BEGIN IMMEDIATE`` transaction. The framework's own
tables come from the ``migrations.eventlane.read_model`` set (see that module for their
schema), applied on open under the write lock (so workers starting together never race);
the projector's tables from its own migrations and its ``setup``.

Exactly-once effect: a batch of events and the positions it advances commit in the same
transaction, and inside it each partition's stored position is checked first, so a batch
(or the part of it) that was already applied is skipped, and a writer whose group
generation is older than the stored one is refused (:class:`FencedError`): a paused zombie
can never apply events of a partition another worker owns now.

Fencing token: ``_eventlane_positions.generation`` is the group generation under which the
partition's current owner claimed it. A consumer group's generations only grow, and a
partition's successive owners hold it under strictly increasing generations, so an older
generation is a former owner. The one exception is a group whose state was lost or deleted
(its generations restart from 0): :meth:`ReadModel.claim` recognises it (the claimant
still owns the partition in the group, yet the stored generation is higher) and takes the
partition over.

Writers take turns through ``<file>.lock`` (``flock``) before ``BEGIN IMMEDIATE``: SQLite's
own busy handler sleeps up to 100 ms at a time, which would leave workers of one read model
mostly asleep; the lock hands the file over within a millisecond.

SQLite older than 3.51.3 has a rare WAL-reset corruption bug with several writing
connections; each process keeps one writing connection per file, and writers take turns
through the lock file, so eventlane's own writes cannot trigger it. ``eventlane verify``
says which SQLite this Python has and whether that matters (:func:`sqlite_note`), as do
docs/projections.md and docs/reliability.md; nothing is logged per data directory.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eventlane._locks import FileLock
from eventlane.errors import ProjectionError, error_chain
from eventlane.log import TopicPartition
from eventlane.log.local import LocalDir
from eventlane.observability import get_logger
from eventlane.projection import fencing
from eventlane.projection._sqlite_utils import Database, Migrations
from eventlane.projection.system_tables import read_model as framework_migrations
from eventlane.projection.tables import Dialect

log = get_logger("eventlane.projection")

SAFE_SQLITE = (3, 51, 3)
BUSY_TIMEOUT_S = 60.0
_TRANSIENT_SQLITE = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR",
    "SQLITE_FULL",
    "SQLITE_NOMEM",
    "SQLITE_INTERRUPT",
    "SQLITE_CANTOPEN",
    "SQLITE_PROTOCOL",
)
"""SQLite's error names (prefixes: extended codes included) that are the database's doing."""


SQLITE_VERSION: str = sqlite3.sqlite_version
"""The SQLite library this Python uses (``eventlane verify`` reports it)."""


def sqlite_note() -> str | None:
    """What to know about this Python's SQLite (``None``: nothing, it is >= 3.51.3)."""
    if sqlite3.sqlite_version_info >= SAFE_SQLITE:
        return None
    return (
        f"SQLite {sqlite3.sqlite_version} is older than 3.51.3, which fixes a rare WAL-reset"
        " corruption bug that needs two connections writing one file; eventlane never does"
        " that (one writing connection per read-model file per process, writers take turns"
        " through a lock file), so act only if your own code writes read-model files while"
        " workers run (docs/projections.md, section 11)"
    )


def _wal(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode (kept in the file: usually it is already). SQLite answers
    ``PRAGMA journal_mode=WAL`` with "database is locked" at once, without its busy
    timeout, while another process's connection holds the file in certain states (a
    worker starting while another closes or checkpoints): retried here within
    :data:`BUSY_TIMEOUT_S`, so a worker does not fail to start on it."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > deadline:
                raise  # as without the retries (callers say what it means: a read-only file...)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def readmodel_path(data_dir: Path | LocalDir, name: str) -> Path:
    """The read model file of projector ``name`` (see :class:`~eventlane.log.local.LocalDir`)."""
    local = data_dir if isinstance(data_dir, LocalDir) else LocalDir(Path(data_dir))
    return local.readmodel(name)


class ReadModel:
    """An open read-model file. One per process per file; thread-safe through a lock."""

    dialect: Dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        _wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        self.conn = conn
        self.db = Database(conn)
        self._lock = threading.RLock()
        self._depth = 0
        self._file_lock = FileLock(Path(f"{path}.lock"))
        self.framework_migrations_applied: list[str] = []
        """Names of the framework's own migrations this open applied (usually none)."""
        if framework_migrations.pending(self.db):
            with self.transaction():  # savepoints inside it; re-checked under the lock
                names = [m.name for m in framework_migrations.pending(self.db)]
                framework_migrations.apply(self.db)
            self.framework_migrations_applied = names

    @property
    def location(self) -> str:
        """Where the read model is, for messages."""
        return f"file {self.path}"

    @property
    def user_conn(self) -> sqlite3.Connection:
        """What handlers get as ``ctx.conn`` (here: the framework's connection itself)."""
        return self.conn

    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    @staticmethod
    def transient(exc: BaseException) -> bool:
        """Whether a handler's ``exc`` is SQLite's doing, not the handler's (busy, locked, an
        I/O error, a full disk, out of memory: :class:`~eventlane.errors.ReadModelBusyError`,
        never a dead letter); a cause or context chained to it counts."""
        return any(
            isinstance(e, sqlite3.OperationalError)
            and (getattr(e, "sqlite_errorname", "") or "").startswith(_TRANSIENT_SQLITE)
            for e in error_chain(exc)
        )

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on any exception), under the
        file's writer lock (see :meth:`_writer_lock`)."""
        with self._lock:
            if self._depth:  # nested (a migration inside a transaction): already held
                raise ProjectionError("nested read-model transaction", path=self.path)
            self._writer_lock()
            self._depth += 1
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self.conn
                except BaseException:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise
                self.conn.execute("COMMIT")
            finally:
                self._file_lock.release()
                self._depth -= 1

    def _writer_lock(self) -> None:
        """Take ``<file>.lock`` (``flock``) before ``BEGIN IMMEDIATE``; raise
        :class:`~eventlane.errors.ProjectionError` if it is not free within the busy timeout.

        SQLite makes a writer that finds the file locked sleep in steps of up to 100 ms, so
        workers taking turns would lose most of their time asleep; this lock hands over
        within a millisecond instead (polled, so a holder frozen by SIGSTOP makes the others
        fail after the busy timeout rather than hang). Every framework writer takes it; a
        writer that does not is still serialised by SQLite. ``flock`` locks die with their
        process, so a ``kill -9`` leaves no stale lock.
        """
        if not self._file_lock.acquire(timeout=BUSY_TIMEOUT_S):
            raise ProjectionError(
                f"the read model's writer lock was held for {BUSY_TIMEOUT_S:.0f} s by"
                " another process (a writer frozen inside its transaction?)",
                path=self.path,
            )

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

    def is_fresh(self) -> bool:
        """Whether no event was ever applied to this file (no position stored)."""
        return self.conn.execute("SELECT 1 FROM _eventlane_positions LIMIT 1").fetchone() is None

    def claim(
        self,
        tp: TopicPartition,
        generation: int,
        start: int,
        still_owned: Callable[[], bool] | None = None,
        floor: int | None = None,
    ) -> int:
        """Record that a worker of ``generation`` owns ``tp`` now; return its position
        (``start`` when the partition was never applied).

        ``floor``, when given, is a position known to be applied elsewhere (a policy's
        fenced group commit made on another host): a stored position below it is moved up
        to it, so this file never reports, nor lets anyone commit, a position older than one
        the group already passed.

        Raises :class:`FencedError` when a newer generation already claimed it, unless
        ``still_owned()`` (asked under the write lock) says the claimant owns ``tp`` in its
        group right now: then no newer owner can exist, the stored generation comes from a
        lost or deleted group state, and the claim takes over.
        """
        with self.transaction() as conn:
            return fencing.claim(conn, tp, generation, start, still_owned, floor)

    def check_and_advance(
        self,
        conn: Any,
        tp: TopicPartition,
        generation: int,
        first: int,
        next_offset: int,
    ) -> int:
        """Inside a transaction: the stored position of ``tp`` after fencing checks.

        Returns the offset from which events of this batch still need applying (events below
        it were applied before: a redelivery), and stores ``next_offset`` (positions never
        move backwards). Raises :class:`FencedError` if a newer generation owns ``tp``.
        """
        return fencing.check_and_advance(conn, tp, generation, first, next_offset)

    def close(self) -> None:
        with self._lock:
            self.conn.close()
            self._file_lock.close()


class ReadModelView:
    """A read-only connection to a read model (status, read-your-writes); never writes.

    Sees committed transactions only (WAL readers never block the writer). A file that
    does not exist yet reads as "nothing applied".
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is None and self.path.exists():
            conn = self._open_read_only()
            if not _has_table(conn, "_eventlane_positions"):
                conn.close()
                return None
            self._conn = conn
        return self._conn

    def _open_read_only(self) -> sqlite3.Connection:
        """``mode=ro``; on a read-only directory (where SQLite cannot create the WAL index
        ``-shm``) with no ``-wal`` file, ``immutable=1``: no writer can be active there."""
        uri = self.path.resolve().as_uri()
        options = {"isolation_level": None, "check_same_thread": False, "timeout": BUSY_TIMEOUT_S}
        conn = sqlite3.connect(uri + "?mode=ro", uri=True, **options)  # type: ignore[arg-type]
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
            return conn
        except sqlite3.OperationalError:
            conn.close()
            wal = Path(f"{self.path}-wal")
            if os.access(self.path.parent, os.W_OK) or (wal.exists() and wal.stat().st_size):
                raise
        return sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, **options)  # type: ignore[arg-type]

    @property
    def conn(self) -> sqlite3.Connection | None:
        """The read-only connection (``None`` while the file or its tables do not exist)."""
        return self._connect()

    def positions(self) -> dict[TopicPartition, int]:
        conn = self._connect()
        if conn is None:
            return {}
        rows = conn.execute("SELECT topic, partition, next_offset FROM _eventlane_positions")
        return {TopicPartition(t, p): int(o) for t, p, o in rows}

    def generations(self) -> dict[TopicPartition, int]:
        conn = self._connect()
        if conn is None:
            return {}
        rows = conn.execute("SELECT topic, partition, generation FROM _eventlane_positions")
        return {TopicPartition(t, p): int(g) for t, p, g in rows}

    def dead_letter_counts(self) -> dict[str, int]:
        """Dead letters per status (``dead``, ``parked``, ``retried``)."""
        conn = self._connect()
        if conn is None:
            return {}
        rows = conn.execute("SELECT status, count(*) FROM _eventlane_dead_letters GROUP BY status")
        return {str(s): int(n) for s, n in rows}

    def table_rows(self) -> dict[str, int]:
        """Rows per table of the projector (the framework's tables left out)."""
        conn = self._connect()
        if conn is None:
            return {}
        names = [
            str(r[0])
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY 1")
            if not str(r[0]).startswith(("sqlite_", "_sqlite_", "_eventlane_"))
        ]
        return {n: int(conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0]) for n in names}

    def pending_migrations(self, migrations: Migrations) -> list[str]:
        """Names of ``migrations`` not applied to this file (all of them: no file yet)."""
        conn = self._connect()
        db = Database(memory=True) if conn is None else Database(conn)
        return [m.name for m in migrations.pending(db)]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ReadModelView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,))
    return row.fetchone() is not None


def check_integrity(path: Path) -> str:
    """``PRAGMA integrity_check`` of a read-model file: ``"ok"`` or SQLite's report."""
    if not path.exists():
        raise ProjectionError("no read model file", path=path)
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        return "\n".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()
