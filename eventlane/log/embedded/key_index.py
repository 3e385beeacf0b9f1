"""The per-key index of a partition: key → the offsets of its records, in order.

Derived data, rebuildable from the log at any time. One SQLite file per partition (WAL
mode), next to a lock file::

    <data>/store/<topic>/<partition>.keyindex.sqlite
    <data>/store/<topic>/<partition>.keyindex.lock     flock()ed by whoever writes the index

    entries(key BLOB, seq INTEGER, offset INTEGER, PRIMARY KEY (key, seq)) WITHOUT ROWID
    meta(name TEXT PRIMARY KEY, value)
        schema       2
        mode         "stream" or "latest"
        next_offset  the first log offset not yet indexed (0 for an empty index)
        rows         the number of rows in ``entries``          } checked against the
        checksum     the sum of ``offset + seq`` over the rows  } table on open
        last_key     key of the last indexed record (its *anchor*: checked on open)
        last_offset  offset of that record
        cleared      how many times the file was emptied (see the cache, below)

Modes:

* ``stream`` (event topics): ``seq`` numbers a key's records 1, 2, 3… in offset order,
  from where the file was built (a rebuild after retention numbers from the low-water
  mark). It is the index's own ordinal (a view asks for the rows after a ``seq``), never an
  aggregate version: the event store reads versions from each record's
  ``aggregate_version`` header and appends on the stream's last *offset* (``Expect``).
* ``latest`` (compacted topics such as snapshots): only each key's last record is kept;
  ``seq`` counts the records seen for the key.

Invariants:

* Every write is a compare-and-set on ``next_offset`` inside one SQLite transaction, so
  entries are added in log order exactly once. Every write, and every checkpoint SQLite
  runs on commit or close, happens with the lock file held: one writing connection at a
  time across all processes. SQLite's WAL-reset bug (versions < 3.51.3; this machine has
  3.40) needs two connections writing or checkpointing at once, so it cannot trigger.
  Readers never write, except :meth:`KeyIndex.catch_up` through the same lock. (One
  exception: a ``close`` that finds the lock busy closes without it; SQLite checkpoints on
  close only as the last connection to the file, after taking the database file's
  EXCLUSIVE lock, so no other connection can write or checkpoint at that moment.)
* *Busy lock*: nobody waits long for the lock file, since its holder may be a reader
  stopped or descheduled inside a catch-up step. An appender (holding the partition's
  append lock), a reader's catch-up, the flusher and ``close`` wait at most
  :data:`LOCK_PATIENCE_S`, and not at all when the file did not change since this object
  last gave up (``PRAGMA data_version``: the holder is stalled); then they go without it:
  the version check (:meth:`KeyIndex.head_at`) reads the file's last row for the key and
  scans the log from where the file ends (the whole partition if the file ends past the
  LEO or was written in another epoch); the append's rows, and rows held back, are not
  written (the index lags); a reader scans the tail instead of indexing it; opening reads
  an existing file of the right schema and mode without the lock. Only the repair paths
  wait for the lock: creating, replacing or switching the mode of a file, ``reset``,
  ``rebuild``, ``verify`` (tests/consumer/test_stopped_consumer.py stops a reader inside a
  catch-up; a conditional append, a plain one and reads go on in another process).
* The index may hold records that are *in flight* (written, not yet fsynced: between the
  HWM and the LEO, see :mod:`.partition`): an appender indexes the log up to the LEO under
  the append lock, so its version check counts every record written before its own.
  Readers (:meth:`KeyIndex.view`) leave those rows out until the HWM passes them. When a
  failed fsync throws in-flight records away, the partition's ``epoch`` moves and the index
  empties itself on its next update (meta ``epoch``): their offsets will be used again.
* The index may lag the log (a writer died between its append and its index update, or
  the file was deleted): readers overlay the unindexed tail (:meth:`KeyIndex.view`) and
  index it themselves once it is longer than :data:`READER_CATCH_UP` offsets; appenders
  index it under the append lock before their version check.
* A file SQLite cannot read, or of another schema, is replaced by an empty index. On open,
  cheap consistency checks run: ``next_offset <= LEO`` (else the index belongs to an older
  incarnation of the partition), ``rows`` and ``checksum`` match the table, and the anchor
  record in the log has the anchor key. A failed check empties the index (it is rebuilt
  on use). :meth:`KeyIndex.verify` compares every row with the log.
* *Held back*: an appender whose version check found that the log ends where its view of
  the index ends (its cache answered) keeps the rows of its next appends in memory instead
  of writing each append's rows in its own transaction, and writes them in one transaction
  once they span :data:`DEFER_OFFSETS` offsets, on ``catch_up``, ``verify`` and ``close``,
  and from a background thread :data:`FLUSH_AFTER_S` after the first of them was held (the
  appender went quiet). ``stream`` mode only. The file then lags the log by fewer than
  :data:`DEFER_OFFSETS` offsets for at most about that long, which every reader already
  handles (the tail overlay below; this object's own reads overlay the held rows instead);
  a process that dies holding rows leaves such a lag. Held rows are written only while the
  partition's epoch is the one they were numbered in, and only where the file ends, as
  checked holding the lock file (rows the file already has are left out).
* *Shared tail*: when other processes appended since this object's view ended (at most
  :data:`DEFER_OFFSETS` offsets), an appender's version check reads their records from the
  log under the append lock, numbers them from its cache (a key new to it: from the file,
  holding the lock file) and holds their rows too, instead of dropping its cache and writing
  (issue 36: two writer processes each wrote a transaction an append). So every appender
  holds the rows of the whole unwritten tail, its own and the others', and whichever writes
  first writes them all; the others then find the file ending inside their view and stop
  holding what it has (:meth:`KeyIndex._revalidate`), or past it (a quiet appender) and read
  the records in between into their cache. Every row held anywhere is the log's own
  numbering, so any of them may write it. (The relay, ``shared``, writes every append.)
* Each object caches what it learnt under the write lock (``next_offset`` and the last
  ``(seq, offset)`` of keys it looked up or indexed), so an appender's version check and
  index update cost no query for a key seen before (recently: the cache of a process is
  bounded, :data:`CACHED_KEYS`, least recently used keys first out, keys of held rows
  never). The cache reflects the log below where this object's view ends (``_end``): it is
  used only while the log ends there and the partition's epoch is the one it was filled in
  (a failed fsync throws in-flight records away: their offsets are used again). When
  another connection committed (SQLite's ``PRAGMA data_version`` changes), the file is read
  again (``next_offset``): ending inside the view, the cache stays; ending before where this
  object knew it to end (emptied, replaced), the cache is dropped. So is it when the file
  was emptied since (meta ``cleared`` moved), wherever it ends now: a rebuild after
  retention numbers each key's records again from the low-water mark, and its file can end
  inside the view, or where it ended before, and still be another numbering (seen as
  misnumbered rows under tests/log/test_lock_pauses.py); held rows are read over the file
  only while its ``(next_offset, cleared)`` is the one they go on from. Checked at every
  outermost write-lock acquisition and before a cached answer is used.
* Locks, in the order they are taken (the engine's whole order is in :mod:`.partition`):
  the partition's append lock (held by an appender calling :meth:`KeyIndex.head_at`,
  :meth:`KeyIndex.sync_to` or :meth:`KeyIndex.add_appended`), then this object's ``RLock``,
  then the lock file, then the :class:`_Flusher`'s condition (scheduling held rows). Holding
  this object's locks, nothing waits for the append lock: reading the partition's state
  never waits for it (:meth:`~eventlane.log.embedded.partition.Partition._wait_for_writer`), and
  :meth:`KeyIndex.catch_up` opens the partition (which takes the append lock) before it
  takes its own. Under the append lock nothing waits long for the lock file (*Busy lock*),
  so a reader holding it never stops an appender. The flusher thread reads the partition's
  epoch before taking any lock.
* The event store never trusts a row blindly (:mod:`eventlane.store.event_store`): reads
  check each record's key and version, and the version check of an append reads the
  stream's last record. Not caught cheaply: an index edited by hand so that it drops a
  stream's newest rows *and* keeps ``rows``/``checksum`` consistent; ``eventlane verify``
  reports it.

One concept at ~1,100 lines: one partition's key index file (SQLite), its modes, its catch-up
with the log and the writes of the append hook, under one lock; the check against the log is
:mod:`.key_check`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar, cast

from eventlane._locks import FileLock
from eventlane._pauses import PAUSE
from eventlane.errors import FrameworkError, OffsetOutOfRangeError, UnknownTopicError
from eventlane.log.port import Log
from eventlane.log.record import Record
from eventlane.log.types import Cursor
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

T = TypeVar("T")

_KEY_ROWS = (
    " UNION ALL SELECT seq, offset, NULL FROM entries WHERE key=?1 AND"
    " (seq > ?2 OR seq = (SELECT max(seq) FROM entries WHERE key=?1)) ORDER BY 1"
)
_ROWS = "SELECT NULL, value, name FROM meta WHERE name='next_offset'" + _KEY_ROWS
_ROWS_HELD = (
    "SELECT NULL, value, name FROM meta WHERE name IN ('next_offset', 'cleared')" + _KEY_ROWS
)
"""A view's statement: the file's end (and with held rows, its ``cleared``) and a key's rows."""
Mode = Literal["stream", "latest"]
MODES: tuple[str, ...] = ("stream", "latest")
_UNKNOWN: Any = object()
"""A key the cache knows nothing about (``None`` there means: no entry)."""

SCHEMA = 2
INDEX_SUFFIX = ".keyindex.sqlite"
LOCK_SUFFIX = ".keyindex.lock"
LOCK_PATIENCE_S = 0.25
"""How long an appender, a reader's catch-up, the flusher or ``close`` waits for the lock
file before going without it (*Busy lock* in the module docstring)."""
READER_CATCH_UP = 1000
"""A reader overlays at most this many unindexed offsets; past that it indexes them."""
CATCH_UP_BYTES = 4 << 20
"""Log bytes read (and rows written, one transaction) per step of a catch-up."""
POINT_READ_BYTES = 8 << 10
"""Bytes a point read asks for: one ``pread`` covers the batches between the segment index
entry it starts from and the record (entries are at most ``index_interval_bytes`` apart)."""
DEFER_OFFSETS = 64
"""Offsets an appender may index in memory before writing them to the file (see
*Held back* in the module docstring); readers elsewhere scan at most this much log tail."""
FLUSH_AFTER_S = 0.05
"""Held rows reach the file at most about this long after the first of them was held, even
when no append follows (the :class:`_Flusher` thread)."""
CACHED_KEYS = 1 << 14
"""Keys whose last entry the :class:`KeyIndex` objects of a process remember, together
(~300 bytes each): each open index keeps its share, at least :data:`MIN_CACHED_KEYS`, and
forgets its least recently used key first. A process that writes ever new keys (aggregate
ids) keeps a bounded cache, not one entry per key ever written."""
MIN_CACHED_KEYS = 512
"""Keys each open :class:`KeyIndex` may remember whatever the number of open indexes."""
PAGE_CACHE_KIB = 512
"""SQLite's page cache per index connection (its default: 2 MiB, filled as the file grows;
a process has one connection per partition it uses). A lookup reads a few pages, the upper
levels of the B-tree stay cached, and the OS page cache holds the file."""
MAX_REPORTED = 20
"""Problems listed one by one in an :class:`IndexReport`; the rest are only counted."""

_DDL = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB NOT NULL, seq INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY (key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value);
"""


def index_path(root: Path, topic: str, partition: int) -> Path:
    """Where the key index of ``topic``/``partition`` lives under ``root`` (``<data>/store``)."""
    return root / topic / f"{partition}{INDEX_SUFFIX}"


class View(NamedTuple):
    """One key as of a high-water mark, read consistently (index snapshot + log tail)."""

    head: int
    """The key's last ``seq`` below ``hwm`` (0: no records)."""
    offsets: list[int]
    """Offsets of the key's records in the requested ``seq`` range, ascending."""
    hwm: int
    """The partition's high-water mark the view is complete up to."""
    last: int | None = -1
    """Offset of the key's last record below ``hwm`` (``None``: it has none), or ``-1`` when
    this view cannot tell (every row it fetched is in flight)."""


_DAMAGE: tuple[type[Exception], ...] = (
    sqlite3.DatabaseError,
    UnicodeError,
    ValueError,
    TypeError,
    OverflowError,
)
"""What reading a damaged index can raise: SQLite's errors, and Python's on values of a type
or encoding this module never writes (damaged bytes can make SQLite return them)."""


def is_damage(exc: BaseException) -> bool:
    """A damaged file (as opposed to a busy or misused database, or an error of the log):
    SQLite cannot read it, a text value does not decode, or a value has the wrong type."""
    if isinstance(exc, FrameworkError) or not isinstance(exc, _DAMAGE):
        return False
    if not isinstance(exc, sqlite3.DatabaseError):
        return True
    if isinstance(exc, sqlite3.OperationalError) and "decode" in str(exc):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return type(exc) is sqlite3.DatabaseError or code in (
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
    )


def as_unreadable(exc: BaseException) -> sqlite3.DatabaseError:
    """Damage reported uniformly, as SQLite reports a file it cannot read."""
    if isinstance(exc, sqlite3.DatabaseError):
        return exc
    return sqlite3.DatabaseError(f"damaged key index: {type(exc).__name__}: {exc}")


class KeyIndex:
    """The key index of one ``(topic, partition)`` (see the module docstring).

    ``mode`` is the mode for a new file (an existing file of another mode is emptied and
    switched); ``None`` opens an existing file in its own mode (``stream`` if new).
    ``auto_repair=False`` skips the consistency checks on open, so that :meth:`verify`
    sees the index as it is, and raises :class:`sqlite3.DatabaseError` for a file SQLite
    cannot read instead of replacing it. Safe for use from several threads.
    """

    def __init__(
        self,
        log_: Log,
        topic: str,
        partition: int,
        path: Path,
        *,
        mode: Mode | None = "stream",
        auto_repair: bool = True,
    ) -> None:
        self.log = log_
        # the embedded engine's extras (records in flight, the partition's epoch; see
        # _read and _check_epoch), looked up once; another Log has neither
        self._read_log: Callable[..., tuple[list[Record], Cursor | None]] = getattr(
            log_, "read_written", log_.read
        )
        self._epoch_of: Callable[[str, int], int] | None = getattr(log_, "epoch", None)
        self._end_cursor: Callable[[str, int], tuple[int, Cursor]] | None = getattr(
            log_, "end_cursor", None
        )
        self.topic = topic
        self.partition = partition
        self.path = path
        self.trusted_upto = -1
        """Offsets below this were indexed from the log by this object after a reset."""
        self._lock = threading.RLock()
        self._log = log.bind(topic=topic, partition=partition)
        # The cache of the module docstring, valid while ``data_version`` is ``_version``:
        self._version: int | None = None
        self._cleared: int | None = None  # the file's meta ``cleared`` at _version
        self._next: int | None = None  # next_offset, when known
        # key -> its last (seq, offset), least recently used first (bounded: _remember)
        self._heads: OrderedDict[bytes, tuple[int, int] | None] = OrderedDict()
        # Rows held back (module docstring): they cover [_next, _held_end), every key of them
        # is in _heads, and they were numbered while the partition's epoch was _epoch.
        self._held: list[tuple[bytes, int, int]] = []
        self._held_end = 0
        self._quiet = False  # the last version check found no other appender since ours
        self._tail: tuple[int, Cursor | None] | None = None  # where _absorb's last read ended
        self.shared = False
        """Rows are never held back: this process writes other processes' appends (the
        relay, :mod:`.relay`), whose next reads must find them in the file."""
        self._depth = 0  # nesting of _writing()
        self._epoch = 0  # the partition epoch this index was last checked against
        # data_version when this object last gave up waiting for the lock file (*Busy lock*)
        self._stalled: int | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.with_name(path.name.removesuffix(INDEX_SUFFIX) + LOCK_SUFFIX)
        self._file_lock = FileLock(lock_path)
        self.mode: Mode = mode or "stream"
        try:
            # nobody else uses this object yet: the lock file first, then _lock, is safe here
            patience = LOCK_PATIENCE_S if auto_repair else None
            with self._file_lock.hold(timeout=patience) as free:
                opened = None if free else self._open_busy(mode)
                if opened is None:
                    self._open_locked(mode, auto_repair)
                else:
                    self._db, self._ino = opened
            if auto_repair:
                problem = self._quick_check()
                if problem is not None:
                    self.reset(problem)
        except BaseException:
            self._file_lock.close()
            raise
        _OPEN.change(1)

    # ------------------------------------------------------------------ opening
    def _open_busy(self, mode: Mode | None) -> tuple[sqlite3.Connection, int] | None:
        """Open without the lock file (someone else holds it, see *Busy lock*) when the file
        is an index of this schema and of the mode wanted: opening it then writes nothing.
        ``None``: the file must be created, replaced or switched (under the lock)."""
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error:
            return None
        try:
            ok = db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            meta = dict(db.execute("SELECT name, value FROM meta WHERE name IN ('schema', 'mode')"))
            stored = meta.get("mode")
            ok = ok and meta.get("schema") == SCHEMA and stored in MODES
            ok = ok and (mode or stored) == stored
            if ok:
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
                self.mode = cast("Mode", stored)
                return db, os.stat(self.path).st_ino
        except (sqlite3.Error, OSError):  # damaged, or replaced meanwhile: under the lock
            pass
        except _DAMAGE:
            pass
        db.close()
        return None

    def _open_locked(self, mode: Mode | None, auto_repair: bool) -> None:
        """Open (create, replace, switch the mode) under the lock file."""
        with self._writing():
            self._db, self._ino = self._open(replace=auto_repair)
            if auto_repair:
                self.mode = self._guard(self._init_mode, mode)
            else:
                try:
                    self.mode = self._init_mode(mode)
                except _DAMAGE as exc:
                    self._db.close()
                    if not is_damage(exc):
                        raise
                    raise as_unreadable(exc) from exc

    def _open(self, *, replace: bool = True) -> tuple[sqlite3.Connection, int]:
        """Connect (under the write lock), replacing a file SQLite cannot read (or raising
        :class:`sqlite3.DatabaseError` with ``replace=False``)."""
        for attempt in range(2):
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
                db.executescript(_DDL)
                row = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
                if row is None:
                    db.execute("BEGIN IMMEDIATE")
                    db.executemany(
                        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                        [("schema", SCHEMA), ("next_offset", 0), ("rows", 0), ("checksum", 0)],
                    )
                    db.execute("COMMIT")
                elif row[0] != SCHEMA:
                    raise sqlite3.DatabaseError(f"key index schema {row[0]!r}, expected {SCHEMA}")
                return db, os.stat(self.path).st_ino
            except _DAMAGE as exc:
                db.close()
                if not is_damage(exc):
                    raise
                if attempt or not replace:
                    raise as_unreadable(exc) from exc
                self._log.warning(
                    "key index unreadable; replacing it (it is rebuilt from the log)",
                    file=str(self.path),
                    error=str(exc),
                )
                self._delete_files()
        raise AssertionError("unreachable")  # pragma: no cover

    def _init_mode(self, mode: Mode | None) -> Mode:
        row = self._db.execute("SELECT value FROM meta WHERE name='mode'").fetchone()
        stored = row[0] if row is not None and row[0] in MODES else None
        wanted = mode or stored or "stream"
        if stored != wanted:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if stored is not None:
                    self._log.warning("key index mode changed; emptying it", old=stored, new=wanted)
                self._clear()
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('mode', ?)", (wanted,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return cast("Mode", wanted)

    def use_mode(self, mode: Mode) -> None:
        """Switch to ``mode`` if the index has the other one (emptying it: it is rebuilt in
        the new mode on use). The store's own paths know which mode a topic needs."""
        if mode != self.mode:
            with self._writing():
                self.mode = self._guard(self._init_mode, mode)

    def _delete_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(self.path) + suffix).unlink()

    def _quick_check(self) -> str | None:
        """The cheap consistency checks of the module docstring: a problem, or ``None``."""
        with self._lock:
            nxt, stated, actual, last_key, last_offset = self._guard(self._meta_and_count)
        marks = self.log.offsets(self.topic, self.partition)
        if nxt > marks.leo:
            return (
                f"the index ends at offset {nxt}, past the log end offset {marks.leo} "
                "(the partition was recreated or restored?)"
            )
        if stated != actual:
            return (
                f"the index holds {actual[0]} rows (checksum {actual[1]}), its meta data "
                f"says {stated[0]} (checksum {stated[1]})"
            )
        if last_offset is not None and marks.lwm <= last_offset < marks.hwm:
            record = self.record_at(last_offset)
            if record is None or record.key != last_key:
                found = "no record" if record is None else f"key {record.key!r}"
                return (
                    f"the log has {found} at offset {last_offset}, where the index's last "
                    f"entry has key {last_key!r}"
                )
        return None

    def _meta_and_count(
        self,
    ) -> tuple[int, tuple[int, int], tuple[int, int], bytes | None, int | None]:
        """``next_offset``, (rows, checksum) as stated in meta and as counted, the anchor:
        read in one transaction (one snapshot), or another process's commit between the two
        reads made a consistent index look damaged (a caller's transaction is that one)."""
        own = not self._db.in_transaction
        if own:
            self._db.execute("BEGIN")
        try:
            meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
            count, total = self._db.execute(
                "SELECT count(*), coalesce(sum(offset + seq), 0) FROM entries"
            ).fetchone()
        finally:
            if own:
                self._db.execute("COMMIT")
        return (
            int(meta.get("next_offset", 0)),
            (int(meta.get("rows", 0)), int(meta.get("checksum", 0))),
            (int(count), int(total)),
            meta.get("last_key"),
            meta.get("last_offset"),
        )

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def _writing(self) -> Iterator[bool]:
        """Hold the write lock: this object's threads, then every process (flock). Nests:
        only the outermost holder takes and releases the flock. (Yields ``True``, as
        :meth:`_trying` does when it got the lock.)"""
        with self._lock, self._file_lock:
            self._depth += 1
            try:
                if self._depth == 1:
                    self._revalidate()
                yield True
            finally:
                self._depth -= 1

    @contextlib.contextmanager
    def _trying(self) -> Iterator[bool]:
        """Hold the write lock if it can be had soon (*Busy lock*): yields whether it is
        held. Not held, the body still runs under this object's ``RLock``."""
        with self._lock:
            if not self._file_lock.acquire(timeout=self._patience()):
                self._stalled = self._data_version()
                yield False
                return
            try:
                self._depth += 1
                try:
                    if self._depth == 1:
                        self._stalled = None
                        self._revalidate()
                    yield True
                finally:
                    self._depth -= 1
            finally:
                self._file_lock.release()

    def _patience(self) -> float:
        """How long :meth:`_trying` waits for the lock file: none when the holder committed
        nothing since this object last gave up on it (stopped, or descheduled)."""
        if self._stalled is not None and self._stalled == self._data_version():
            return 0.0
        return LOCK_PATIENCE_S

    def _data_version(self) -> int | None:
        try:
            return int(self._db.execute("PRAGMA data_version").fetchone()[0])
        except (sqlite3.Error, AttributeError):  # closed, or not open yet
            return None

    def _revalidate(self, leo: int | None = None) -> None:
        """Bring the cache up to date with the file if another connection committed since
        it was filled (hold ``_lock``; ``leo``: the caller holds the append lock and the log
        ends there). When the file now ends between where this object knew it to end and
        where its view ends (another appender wrote rows this object holds too: *Shared
        tail*), the rows the file has are no longer held and the cache stays; when it ends
        past the view, below ``leo``, the records in between are read from the log into the
        cache (:meth:`_advance`); anything else (the file emptied or replaced, or no
        ``leo``) drops the cache."""
        version = self._data_version()
        if version is not None and version == self._version:
            return
        nxt, end = self._next, self._end()
        now, cleared = -1, None
        if version is not None:
            try:
                meta = dict(
                    self._db.execute(
                        "SELECT name, value FROM meta WHERE name IN ('next_offset', 'cleared')"
                    )
                )
                now, cleared = int(meta.get("next_offset", 0)), int(meta.get("cleared", 0))
            except _DAMAGE:
                pass
        # the file this object's view was of, not one emptied (and built again) since
        same = self._version is not None and cleared is not None and cleared == self._cleared
        self._version, self._cleared = version, cleared
        if same and nxt is not None and end is not None:
            if nxt <= now <= end:
                if now > nxt:
                    self._held = [row for row in self._held if row[2] >= now]
                    self._next = now
                return
            if (
                leo is not None
                and end < now <= min(leo, end + DEFER_OFFSETS)
                and self._advance(end, now)
            ):
                self._held = []
                self._next = now
                return
        self._forget()

    def _advance(self, start: int, upto: int) -> bool:
        """Apply the log's records in ``[start, upto)`` to the cached heads (their rows are
        in the file: nothing is held). ``False``: the log no longer has them."""
        try:
            pairs = self._scan_tail(start, upto)  # _absorb's read goes on from its end
        except OffsetOutOfRangeError:
            return False
        heads = self._heads
        for key, offset in pairs:
            cached = heads.get(key, _UNKNOWN)
            if cached is not _UNKNOWN:
                heads[key] = (cached[0] + 1 if cached is not None else 1, offset)
        return True

    def _absorb(self, leo: int) -> None:
        """Hold the rows of the records others appended since this object's view ended,
        read from the log, so that the view ends at ``leo`` again without a write to the
        file (*Shared tail*). Call under the partition's append lock (the log ends at
        ``leo``) and ``_lock``. A key this object knows nothing of is numbered from the
        file's rows before its first record here, read holding the lock file; when the lock
        file is busy, or anything else is unexpected, nothing is absorbed (the caller's
        version check then takes the usual path)."""
        self._revalidate(leo)
        start = self._end()
        if start is None or not start < leo <= start + DEFER_OFFSETS:
            return
        try:
            pairs = self._scan_tail(start, leo)
        except OffsetOutOfRangeError:
            return
        heads: dict[bytes, tuple[int, int] | None] = {}
        unknown = {key for key, _ in pairs if key not in self._heads}
        if unknown:
            with self._trying() as held:
                if not held or self._end() != start:
                    return
                for key in unknown:  # it has no held rows: the file has them all
                    heads[key] = self._guard(self._head_entry, key)
        rows: list[tuple[bytes, int, int]] = []
        for key, offset in pairs:
            entry = heads[key] if key in heads else self._heads[key]
            seq = (entry[0] if entry is not None else 0) + 1
            heads[key] = (seq, offset)
            rows.append((key, seq, offset))
        self._hold(rows, leo)

    def _scan_tail(self, start: int, upto: int) -> list[tuple[bytes, int]]:
        """:meth:`scan` of ``[start, upto)`` for :meth:`_absorb`, going on from where its
        last read ended when that is at most :data:`DEFER_OFFSETS` before ``start`` (this
        process's own append in between is read again and skipped; after an append held
        here, from its end): a read from a cursor needs no lookup in the segment's offset
        index, which grows as the log does."""
        at, cursor = start, None
        if self._tail is not None and start - DEFER_OFFSETS <= self._tail[0] <= start:
            at, cursor = self._tail
        self._tail = None  # (kept only when the read below ends well)
        pairs, ended = self._scan(at, cursor, start, upto)
        self._tail = ended if ended[1] is not None else None
        return pairs

    def _forget(self) -> None:
        self._next = None
        self._heads.clear()
        self._held = []
        self._quiet = False

    def _end(self) -> int | None:
        """Where the index ends as this object knows it: rows held back included."""
        return self._held_end if self._held else self._next

    def _current_epoch(self) -> int | None:
        """The partition's epoch (``None``: the partition is gone, its topic deleted)."""
        if self._epoch_of is None:
            return 0
        try:
            return self._epoch_of(self.topic, self.partition)
        except UnknownTopicError:
            return None

    def _guard(self, operation: Callable[..., T], *args: Any) -> T:
        """Run ``operation(*args)``; if SQLite finds the file corrupt, replace the file with
        an empty index and run it again."""
        try:
            return operation(*args)
        except _DAMAGE as exc:
            if not is_damage(exc):
                raise
            self._replace_corrupt_file(f"{type(exc).__name__}: {exc}")
            return operation(*args)

    def _replace_corrupt_file(self, error: str) -> None:
        with self._writing():
            try:
                replaced = os.stat(self.path).st_ino != self._ino
            except FileNotFoundError:
                replaced = True
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            if not replaced:  # nobody has replaced it yet: do it
                self._log.warning(
                    "key index corrupt; replacing it (it is rebuilt from the log)",
                    file=str(self.path),
                    error=error,
                )
                self._delete_files()
            self._db, self._ino = self._open()
            self._forget()
            self._version = None  # a new connection counts its own data_version
            self.mode = self._init_mode(self.mode)
            self.trusted_upto = -1

    # ------------------------------------------------------------------ reading
    def _next_offset(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name='next_offset'").fetchone()
        return int(row[0]) if row else 0

    def _head(self, key: bytes) -> int:
        row = self._db.execute("SELECT max(seq) FROM entries WHERE key=?", (key,)).fetchone()
        return int(row[0] or 0)

    def next_offset(self) -> int:
        """The first offset not yet indexed."""
        with self._lock:
            return self._guard(self._next_offset)

    def head(self, key: bytes) -> int:
        """The last ``seq`` indexed for ``key`` (0 if none); the unindexed tail is ignored."""
        with self._lock:
            return self._guard(self._head, key)

    def head_entry(self, key: bytes) -> tuple[int, int] | None:
        """``(seq, offset)`` of the last indexed record of ``key``, or ``None``."""
        with self._lock:
            return self._guard(self._head_entry, key)

    def _head_entry(self, key: bytes) -> tuple[int, int] | None:
        row = self._db.execute(
            "SELECT seq, offset FROM entries WHERE key=? ORDER BY seq DESC LIMIT 1", (key,)
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def _rows(
        self, key: bytes, after_seq: int, held: bool
    ) -> tuple[int, int, list[tuple[int, int]]]:
        """``next_offset``, ``cleared`` (only if ``held``: what the held rows' overlay
        checks; else 0) and ``(seq, offset)`` of ``key``'s rows with ``seq > after_seq`` and
        of its last row, in order, read by one statement (one read transaction). A reader
        holding no rows reads one meta row: the second cost a load ~6 % (bench_peer)."""
        rows = self._db.execute(_ROWS_HELD if held else _ROWS, (key, after_seq)).fetchall()
        nxt = cleared = 0
        found: list[tuple[int, int]] = []
        for seq, value, name in rows:
            if seq is not None:
                found.append((int(seq), int(value)))
            elif name == "next_offset":
                nxt = int(value)
            else:
                cleared = int(value)
        return nxt, cleared, found

    def view(self, key: bytes, after_seq: int = 0, upto_seq: int | None = None) -> View:
        """The offsets of ``key``'s records with ``after_seq < seq <= upto_seq``, complete up
        to the current high-water mark (indexed rows plus the unindexed tail)."""
        caught_up = False
        while True:
            epoch = self._current_epoch() if self._held else None  # read before the lock
            with self._lock:
                nxt, cleared, found = self._guard(self._rows, key, after_seq, bool(self._held))
                if (  # the held rows go on from the file as it is (not one emptied since)
                    self._held
                    and (nxt, cleared) == (self._next, self._cleared)
                    and self._epoch == epoch
                ):
                    found.extend((seq, offset) for k, seq, offset in self._held if k == key)
                    nxt = self._held_end
            marks = self.log.offsets(self.topic, self.partition)
            if nxt > marks.leo:
                self.reset(f"the index ends at offset {nxt}, past the log end offset {marks.leo}")
                continue
            head = found[-1][0] if found else 0
            while found and found[-1][1] >= marks.hwm:  # in flight (offsets grow with seq)
                found.pop()
            if found:
                head = found[-1][0]
                last: int | None = found[-1][1]
            elif head:  # every row after after_seq is in flight
                head = min(after_seq, head)
                last = -1  # the last readable one is among the rows not fetched
            else:
                last = None
            top = head if upto_seq is None else min(head, upto_seq)
            offsets = [offset for seq, offset in found if after_seq < seq <= top]
            start = max(nxt, marks.lwm)
            if not caught_up and marks.hwm - start > READER_CATCH_UP:
                caught_up = True
                self.catch_up(marks.hwm, wait=False)
                continue
            try:
                tail = self.scan(start, marks.hwm, key)
            except OffsetOutOfRangeError:  # retention moved the low-water mark meanwhile
                continue
            seq = head
            for record_key, offset in tail:
                del record_key
                seq += 1
                last = offset
                if seq > after_seq and (upto_seq is None or seq <= upto_seq):
                    offsets.append(offset)
            return View(seq, offsets, marks.hwm, last)

    def last(self, key: bytes) -> int | None:
        """The offset of ``key``'s last record below the high-water mark, or ``None``
        (meant for ``latest`` mode, where the index holds one row per key)."""
        offsets = self.view(key).offsets
        return offsets[-1] if offsets else None

    def head_at(self, key: bytes, leo: int) -> tuple[int, int] | None:
        """``(seq, offset)`` of ``key``'s last record, from an index covering exactly the
        offsets below ``leo``. Call under the partition's append lock."""
        with self._lock:  # a key seen before, the log read up to leo: no query
            end = self._end()
            if end is not None and end <= leo and self._epoch == self._current_epoch():
                if end < leo and not self.shared and self.mode == "stream":
                    self._absorb(leo)  # others appended since: read from the log, held
                else:
                    self._revalidate()
                cached = self._heads.get(key, _UNKNOWN)
                if self._end() == leo and cached is not _UNKNOWN:
                    self._heads.move_to_end(key)
                    self._quiet = True
                    return cast("tuple[int, int] | None", cached)
        with self._trying() as held:  # no other writer until the answer is read
            # quiet as in the cached answer above (only the key is new to the cache): an
            # appender of ever new keys (a web service creating orders) holds rows back too
            self._quiet = held and self._end() == leo
            if held:
                self.sync_to(leo)
                # a key not in the cache has no held rows: the file has its last entry
                entry = self._guard(self._head_entry, key)
                if self._end() == leo:
                    self._remember(key, entry)
                return entry
            snapshot = self._guard(self._durable_head, key)
        return self._head_by_scan(key, leo, *snapshot)

    def _durable_head(self, key: bytes) -> tuple[int, int, tuple[int, int] | None]:
        """The file's ``next_offset``, ``epoch`` and ``key``'s last row, read in one read
        transaction (no lock file needed: the file is only read)."""
        rows = self._db.execute(
            "SELECT NULL, name, value FROM meta WHERE name IN ('next_offset', 'epoch') "
            "UNION ALL SELECT * FROM (SELECT seq, NULL, offset FROM entries WHERE key=? "
            "ORDER BY seq DESC LIMIT 1)",
            (key,),
        ).fetchall()
        meta = {name: int(value) for seq, name, value in rows if seq is None}
        last = [(int(seq), int(offset)) for seq, _, offset in rows if seq is not None]
        return meta.get("next_offset", 0), meta.get("epoch", 0), last[0] if last else None

    def _head_by_scan(
        self, key: bytes, leo: int, nxt: int, epoch: int, entry: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """``head_at``'s answer without the lock file (*Busy lock*): the file as it is plus
        the log from where it ends to ``leo``, or the log alone when the file cannot be
        trusted (it ends past the log, or in-flight records it may name were thrown away
        since it was written). Under the append lock, so the log does not move meanwhile."""
        if nxt > leo or epoch != self._current_epoch():
            nxt, entry = 0, None
        seq, last = entry if entry is not None else (0, -1)
        start = max(nxt, self.log.offsets(self.topic, self.partition).lwm)
        for _, offset in self.scan(start, leo, key):
            seq, last = seq + 1, offset
        return (seq, last) if last >= 0 else None

    def _remember(self, key: bytes, entry: tuple[int, int] | None) -> None:
        """Cache ``key``'s last entry (hold the write lock, with the index at ``_end()``)."""
        heads = self._heads
        heads[key] = entry
        heads.move_to_end(key)
        excess = len(heads) - max(MIN_CACHED_KEYS, CACHED_KEYS // max(1, _OPEN.count))
        if excess > 0:
            held = {held_key for held_key, _, _ in self._held}
            for _ in range(excess):
                old, value = heads.popitem(last=False)
                if old in held:  # held keys stay (the file lacks their rows): newest now
                    heads[old] = value

    def scan(self, start: int, upto: int, key: bytes | None = None) -> list[tuple[bytes, int]]:
        """``(key, offset)`` of the keyed records in ``[start, upto)`` read from the log
        (optionally only those of ``key``), without touching the index."""
        return self._scan(start, None, start, upto, key)[0]

    def _scan(
        self, at: int, cursor: Cursor | None, start: int, upto: int, key: bytes | None = None
    ) -> tuple[list[tuple[bytes, int]], tuple[int, Cursor | None]]:
        """:meth:`scan`, reading from ``at`` (at most ``start``) with ``cursor`` (the one a
        read that ended at ``at`` returned, or ``None``); and where its last read ended."""
        out: list[tuple[bytes, int]] = []
        while at < upto:
            records, cursor = self._read(at, CATCH_UP_BYTES, cursor, upto)
            if not records:
                break
            out.extend(
                (r.key, r.offset)
                for r in records
                if r.key is not None and r.offset >= start and (key is None or r.key == key)
            )
            at = records[-1].offset + 1
        return out, (at, cursor)

    def _read(
        self, start: int, max_bytes: int, cursor: Cursor | None, upto: int
    ) -> tuple[list[Record], Cursor | None]:
        """The log's records in ``[start, upto)``, those still in flight included (see
        :mod:`.partition`): an appender indexes them under the append lock, so that its
        version check counts every record written before its own."""
        return self._read_log(
            self.topic, self.partition, start, max_bytes=max_bytes, cursor=cursor, upto=upto
        )

    def record_at(self, offset: int) -> Record | None:
        """The log record at exactly ``offset`` (``None``: none there, or out of range)."""
        try:
            records, _ = self._read(offset, POINT_READ_BYTES, None, offset + 1)
        except OffsetOutOfRangeError:
            return None
        for record in records:
            if record.offset == offset:
                return record
        return None

    # ------------------------------------------------------------------ writing
    def catch_up(self, upto: int, *, wait: bool = True) -> int:
        """Index every keyed record below ``upto``, a step of :data:`CATCH_UP_BYTES` per
        transaction. On return ``next_offset >= upto``, unless ``wait=False`` and the lock
        file was busy (*Busy lock*: a reader then scans the tail). Returns the records
        indexed."""
        done = 0
        cursor: Cursor | None = None
        # Touch the partition before taking the index lock: opening a partition object takes
        # its append lock, and an appender holds that lock while it waits for this one.
        self.log.offsets(self.topic, self.partition)
        while True:
            with self._writing() if wait else self._trying() as held:
                if not held:
                    break
                self._flush()
                nxt = self._guard(self._next_offset)
                marks = self.log.offsets(self.topic, self.partition)
                start = max(nxt, marks.lwm)
                if start >= upto:
                    if nxt < upto:  # nothing below upto is left to index (empty, or retention)
                        self._guard(self._write, [], nxt, upto)
                    break
                try:
                    records, cursor = self._read(start, CATCH_UP_BYTES, cursor, upto)
                except OffsetOutOfRangeError:  # retention moved the low-water mark: again
                    cursor = None
                    continue
                end = records[-1].offset + 1 if records else upto
                if PAUSE is not None:  # fault injection (tests): read, not yet written
                    PAUSE("key_index.catch_up")
                pairs = [(r.key, r.offset) for r in records if r.key is not None]
                rows = self._guard(self._number, pairs)
                self._guard(self._write, rows, nxt, end)
                done += len(rows)
        if done:
            self._log.info("key index caught up", records=done, offset=upto)
        return done

    def _number(self, pairs: Sequence[tuple[bytes, int]]) -> list[tuple[bytes, int, int]]:
        """Rows ``(key, seq, offset)`` for new records (hold the write lock)."""
        heads: dict[bytes, int] = {}
        rows = []
        cache = self._heads
        for key, offset in pairs:
            seq = heads.get(key)
            if seq is None:
                cached = cache.get(key, _UNKNOWN)
                if cached is _UNKNOWN:
                    seq = self._head(key)
                else:
                    seq = cached[0] if cached is not None else 0
            seq += 1
            heads[key] = seq
            rows.append((key, seq, offset))
        return rows

    def sync_to(self, leo: int) -> None:
        """Make the index cover exactly the offsets below ``leo``, the log end offset.

        Call under the partition's append lock (nothing can be appended meanwhile): an index
        ending past the log (an older incarnation of the partition) is emptied first. Rows
        held back count: an index they bring to ``leo`` is left as it is.
        """
        with self._writing():
            self._check_epoch()
            if self._held and self._held_end == leo:
                return
            self._flush()
            nxt = self._next if self._next is not None else self._guard(self._next_offset)
            if nxt == leo:
                self._next = nxt
                return
            if nxt > leo:
                self._guard(self._clear_now, f"the index ends past the log end offset {leo}")
            self.catch_up(leo)

    def _check_epoch(self) -> None:
        """Empty the index if records it may hold were thrown away since it was written
        (a failed fsync bumps the partition's epoch; their offsets are used again)."""
        if self._epoch_of is None:
            return
        epoch = self._epoch_of(self.topic, self.partition)
        if epoch == self._epoch:
            return
        self._forget()  # held rows and cached heads may name records thrown away
        row = self._db.execute("SELECT value FROM meta WHERE name='epoch'").fetchone()
        if int(row[0] if row else 0) != epoch:
            why = f"the partition threw in-flight records away (epoch {epoch})"
            self._guard(self._clear_now, why)
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (epoch,))
            self._next = None
        self._epoch = epoch

    def add_appended(
        self, pairs: Sequence[tuple[bytes, int]], first_offset: int, next_offset: int
    ) -> bool:
        """Index the keyed records ``(key, offset)`` of an append that covered the offsets
        ``[first_offset, next_offset)``; applies only if the index ends at ``first_offset``
        (else it lags, and catches up on use). Call under the partition's append lock.

        When this object's last version check found that nobody else appended since its own
        last append, the rows are held back in memory (module docstring) and written with
        later ones, up to :data:`DEFER_OFFSETS` offsets at a time."""
        with self._lock:
            if (
                pairs
                and self._quiet
                and not self.shared
                and self.mode == "stream"
                and self._end() == first_offset
                and self._epoch == self._current_epoch()
            ):  # (the file is looked at again before the rows are written: _flush_at)
                return self._hold(self._guard(self._number, pairs), next_offset)
        with self._trying() as held:
            if not held:  # busy: the index lags (*Busy lock*); the cache stays as it was
                return False
            return self._guard(
                self._write, self._guard(self._number, pairs), first_offset, next_offset
            )

    def _hold(self, rows: list[tuple[bytes, int, int]], next_offset: int) -> bool:
        """Hold ``rows`` back (hold ``_lock``, the index ending where they begin; under the
        append lock, the log ending at ``next_offset``: the next :meth:`_absorb` reads from
        there)."""
        if self._tail is not None and self._end_cursor is not None:  # (others appended lately)
            end, cursor = self._end_cursor(self.topic, self.partition)
            self._tail = (end, cursor) if end == next_offset else None
        if not self._held:
            _FLUSHER.schedule(self)
        self._held.extend(rows)
        self._held_end = next_offset
        for key, seq, offset in rows:
            self._remember(key, (seq, offset))
        assert self._next is not None
        if next_offset - self._next >= DEFER_OFFSETS:
            self._flush()
        return True

    def _flush(self) -> None:
        """Write the rows held back (hold ``_lock``; the partition is open)."""
        if self._held:
            self._flush_at(self._current_epoch())

    def _flush_at(self, epoch: int | None) -> None:
        """Write the rows held back, unless records of theirs were thrown away since they
        were numbered (``epoch``, the partition's now, differs; ``None``: it is gone) or
        another writer indexed their offsets (the write's own check). Hold ``_lock``."""
        if not self._held:
            return
        if self._next is None or self._epoch != epoch:
            self._held = []
            return
        with self._trying() as held:  # (the file checked first: it may have some of them)
            if not held:  # busy (*Busy lock*): the rows are dropped, the cache numbered with
                self._forget()  # them
                return
            rows, base, end = self._held, self._next, self._held_end
            self._held = []
            if rows and base is not None and not self._guard(self._write, rows, base, end):
                self._forget()  # the file moved under the lock file: nothing here holds

    def flush_held(self) -> None:
        """Write the rows held back now (the :class:`_Flusher`'s call; it holds no lock)."""
        if not self._held:
            return
        epoch = self._current_epoch()  # first: it may open the partition, taking its lock
        with self._lock:
            self._flush_at(epoch)

    def _write(
        self, rows: list[tuple[bytes, int, int]], expected_next: int, next_offset: int
    ) -> bool:
        """Apply ``rows`` iff the index still ends at ``expected_next``. Hold the write lock."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            # The cached next_offset holds: nobody else writes while we hold the lock.
            nxt = self._next if self._next is not None else self._next_offset()
            if nxt != expected_next:
                db.execute("ROLLBACK")
                self._next = nxt
                return False
            if rows:
                db.executemany("INSERT INTO entries VALUES (?, ?, ?)", rows)
                count, total = len(rows), sum(offset + seq for _, seq, offset in rows)
                if self.mode == "latest":  # keep only each key's last row
                    tops: dict[bytes, int] = {}
                    for key, seq, _ in rows:
                        tops[key] = seq
                    for key, seq in tops.items():
                        gone, gone_total = db.execute(
                            "SELECT count(*), coalesce(sum(offset + seq), 0) FROM entries "
                            "WHERE key=? AND seq<?",
                            (key, seq),
                        ).fetchone()
                        if gone:
                            db.execute("DELETE FROM entries WHERE key=? AND seq<?", (key, seq))
                            count, total = count - gone, total - gone_total
                db.execute(  # rows and checksum grow; the others are replaced
                    "INSERT INTO meta VALUES ('rows', ?), ('checksum', ?), ('last_key', ?),"
                    " ('last_offset', ?), ('next_offset', ?) ON CONFLICT (name) DO UPDATE SET"
                    " value = CASE name WHEN 'rows' THEN value + excluded.value"
                    " WHEN 'checksum' THEN value + excluded.value ELSE excluded.value END",
                    (count, total, rows[-1][0], rows[-1][2], next_offset),
                )
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('next_offset', ?)", (next_offset,))
            db.execute("COMMIT")
        except sqlite3.IntegrityError as exc:  # rows that contradict the index: it is wrong
            db.execute("ROLLBACK")
            self._clear_now(f"an update contradicts the index ({exc})")
            return False
        except BaseException:
            self._forget()
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self._next = next_offset
        if self._heads:
            for key, seq, offset in rows:
                if key in self._heads:
                    self._heads[key] = (seq, offset)
        return True

    def _clear(self) -> None:
        """Empty the index (inside the caller's transaction)."""
        self._forget()
        row = self._db.execute("SELECT value FROM meta WHERE name='cleared'").fetchone()
        # another numbering may follow (from the LWM): other objects' caches must go (a
        # rollback leaves this object's count ahead of the file's: its cache is dropped)
        self._cleared = (int(row[0]) if row else 0) + 1
        self._db.execute("DELETE FROM entries")
        self._db.execute("DELETE FROM meta WHERE name NOT IN ('schema', 'mode', 'epoch')")
        self._db.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [("next_offset", 0), ("rows", 0), ("checksum", 0), ("cleared", self._cleared)],
        )

    def _clear_now(self, reason: str) -> None:
        self._log.warning(
            "key index inconsistent; emptying it (rebuilt from the log)",
            file=str(self.path),
            reason=reason,
        )
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._clear()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self.trusted_upto = -1

    def reset(self, reason: str) -> None:
        """Empty the index in one transaction (readers see the old or the empty index)."""
        with self._writing():
            self._guard(self._clear_now, reason)

    def rebuild(self) -> int:
        """Empty the index and index the partition again from its low-water mark."""
        self.reset("rebuild requested")
        hwm = self.log.offsets(self.topic, self.partition).hwm
        count = self.catch_up(hwm)
        self.trusted_upto = hwm
        return count

    # ------------------------------------------------------------------ verification
    def close(self) -> None:
        with self._trying() as held:  # closing may checkpoint: that is a write
            if held:
                self._flush()
            else:  # busy: see *Busy lock* (held rows are dropped: the file lags)
                self._forget()
            self._db.close()
            self._heads.clear()
        _FLUSHER.cancel(self)
        self._file_lock.close()
        _OPEN.change(-1)


class _OpenCount:
    """How many :class:`KeyIndex` objects this process has open (their cache's share)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def change(self, by: int) -> None:
        with self._lock:
            self.count = max(0, self.count + by)


_OPEN = _OpenCount()


class _Flusher:
    """The process's one daemon thread writing the held rows of indexes whose appender went
    quiet, :data:`FLUSH_AFTER_S` after their first held row (started on first use, again in
    a forked child)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[KeyIndex, float] = {}
        self._pid = -1

    def schedule(self, index: KeyIndex) -> None:
        with self._cond:
            if index in self._due:
                return
            self._due[index] = time.monotonic() + FLUSH_AFTER_S
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="eventlane-key-index", daemon=True).start()
            self._cond.notify()

    def reset(self) -> None:
        """In a forked child: no thread yet, nothing due (the parent's lock may be held)."""
        self._cond = threading.Condition()
        self._due = {}
        self._pid = -1

    def cancel(self, index: KeyIndex) -> None:
        with self._cond:
            self._due.pop(index, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due:
                    self._cond.wait()
                index, due = min(self._due.items(), key=lambda item: item[1])
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                del self._due[index]
            try:
                if PAUSE is not None:  # fault injection (tests)
                    PAUSE("key_index.flusher")
                index.flush_held()
            except Exception:  # the rows are lost, not the records: the index lags
                log.exception("writing held key-index rows failed", topic=index.topic)


_FLUSHER = _Flusher()
os.register_at_fork(after_in_child=_FLUSHER.reset)
