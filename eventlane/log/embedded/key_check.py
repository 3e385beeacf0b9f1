"""Checking a data directory's key indexes against the log (``eventlane verify``).

Every ``<data>/store/<topic>/<partition>.keyindex.sqlite`` is opened *as it is* (no repair
on open) and compared row by row with its partition (:meth:`KeyIndex.verify`). With
``repair=True`` an index that differs is rebuilt from the log and verified again, and the
files of an index whose topic or partition no longer exists are deleted.

    >>> import tempfile
    >>> from eventlane.log.embedded.store import LogStore
    >>> with tempfile.TemporaryDirectory() as data, LogStore(data) as log:
    ...     check_key_indexes(log, log.local.key_indexes())
    []
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Collection, Iterator
from pathlib import Path

from eventlane.errors import InvalidTopicError
from eventlane.log.embedded.key_index import (
    INDEX_SUFFIX,
    LOCK_SUFFIX,
    MAX_REPORTED,
    KeyIndex,
    as_unreadable,
    is_damage,
)
from eventlane.log.port import Log
from eventlane.log.types import KeyIndexReport as IndexReport
from eventlane.observability import get_logger

log = get_logger("eventlane.log")


def key_index_files(root: Path) -> Iterator[tuple[str, int, Path]]:
    """``(topic, partition, path)`` of every key index file under ``root``, sorted."""
    if not root.is_dir():
        return
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        found = []
        for path in topic_dir.glob("*" + INDEX_SUFFIX):
            number = path.name.removesuffix(INDEX_SUFFIX)
            if number.isdigit():
                found.append((int(number), path))
        for partition, path in sorted(found):
            yield topic_dir.name, partition, path


def _partition_exists(log_: Log, topic: str, partition: int) -> bool:
    try:
        return log_.topic_exists(topic) and partition < log_.partition_count(topic)
    except InvalidTopicError:
        return False


def _delete_orphan(path: Path) -> None:
    lock = path.with_name(path.name.removesuffix(INDEX_SUFFIX) + LOCK_SUFFIX)
    for victim in (Path(str(path) + "-wal"), Path(str(path) + "-shm"), path, lock):
        with contextlib.suppress(FileNotFoundError):
            victim.unlink()


def check_key_indexes(
    log_: Log,
    index_dir: Path,
    *,
    topics: Collection[str] | None = None,
    repair: bool = False,
) -> list[IndexReport]:
    """Verify every key index (of ``topics``, default all) under ``index_dir``
    (``<data>/store``); with ``repair``, rebuild those that differ and delete orphans.

    A repaired index's report keeps the problems that were found, with ``repaired=True``;
    one still wrong after its rebuild reports the problems left.
    """
    reports: list[IndexReport] = []
    for topic, partition, path in key_index_files(index_dir):
        if topics is not None and topic not in topics:
            continue
        if not _partition_exists(log_, topic, partition):
            problem = f"orphan index: the log has no partition {partition} of topic {topic!r}"
            if repair:
                _delete_orphan(path)
                log.warning(
                    "orphan key index deleted", topic=topic, partition=partition, file=str(path)
                )
            reports.append(
                IndexReport(topic, partition, str(path), "?", 0, 0, 0, (problem,), 1, repair)
            )
            continue
        reports.append(_check(log_, topic, partition, path, repair))
    return reports


def _replaced(log_: Log, topic: str, partition: int, path: Path) -> KeyIndex:
    """A fresh, empty index in place of a damaged one (it is rebuilt by the caller)."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return KeyIndex(log_, topic, partition, path, mode=None)


def _check(log_: Log, topic: str, partition: int, path: Path, repair: bool) -> IndexReport:
    try:
        index = KeyIndex(log_, topic, partition, path, mode=None, auto_repair=False)
    except sqlite3.DatabaseError as exc:
        problem = f"unreadable index: {exc}"
        if not repair:
            return IndexReport(topic, partition, str(path), "?", 0, 0, 0, (problem,), 1)
        index = KeyIndex(log_, topic, partition, path, mode=None)  # replaces the file
        found: IndexReport | None = IndexReport(
            topic, partition, str(path), index.mode, 0, 0, 0, (problem,), 1
        )
    else:
        found = None
    if found is None:
        try:
            found = verify_index(index)
        except Exception as exc:  # damage verify's reads ran into: the index is unreadable
            if not is_damage(exc):
                raise
            found = IndexReport(
                topic,
                partition,
                str(path),
                index.mode,
                0,
                0,
                0,
                (f"unreadable index: {as_unreadable(exc)}",),
                1,
            )
            if repair:
                index.close()
                index = _replaced(log_, topic, partition, path)
    try:
        report = found
        if repair and not report.ok:
            index.rebuild()
            after = verify_index(index)
            log.warning(
                "key index rebuilt",
                topic=topic,
                partition=partition,
                file=str(path),
                problems=report.problem_count,
                ok=after.ok,
            )
            if after.ok:
                return after._replace(
                    problems=report.problems, problem_count=report.problem_count, repaired=True
                )
            return after
        return report
    finally:
        index.close()


class _Problems:
    """Collects differences, keeping the first :data:`MAX_REPORTED` messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.count = 0

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.messages) < MAX_REPORTED:
            self.messages.append(message)


def verify_index(index: KeyIndex) -> IndexReport:
    """Compare every row of ``index`` with a fresh scan of the log; report the differences.

    Reads the index in one read transaction and the log from its low-water mark to the
    index's end. Memory: the distinct keys of the partition, never all the rows.
    """
    problems = _Problems()
    index.flush_held()
    with index._lock:
        db = index._db
        db.execute("BEGIN")
        try:
            nxt, stated, actual, _, _ = index._meta_and_count()
            marks = index.log.offsets(index.topic, index.partition)
            if nxt > marks.leo:
                problems.add(f"the index ends at offset {nxt}, past the log end offset {marks.leo}")
            if stated != actual:
                problems.add(
                    f"the index holds {actual[0]} rows (checksum {actual[1]}), its meta "
                    f"data says {stated[0]} (checksum {stated[1]})"
                )
            limit = min(nxt, marks.hwm)
            if index.mode == "stream":
                _verify_stream(index, marks.lwm, limit, nxt, problems)
            else:
                _verify_latest(index, marks.lwm, limit, problems)
        finally:
            db.execute("COMMIT")
    return IndexReport(
        index.topic,
        index.partition,
        str(index.path),
        index.mode,
        actual[0],
        nxt,
        marks.hwm,
        tuple(problems.messages),
        problems.count,
    )


def _verify_stream(index: KeyIndex, lwm: int, limit: int, nxt: int, problems: _Problems) -> None:
    rows = index._db.execute(  # rows below the low-water mark: records retention removed
        "SELECT offset, key, seq FROM entries WHERE offset >= ? ORDER BY offset", (lwm,)
    )
    row = next(rows, None)
    seqs: dict[bytes, int] = {}
    for key, offset in index.scan(lwm, limit):
        while row is not None and row[0] < offset:
            problems.add(
                f"offset {row[0]}: indexed as {row[1]!r} #{row[2]}, the log has "
                "no keyed record there"
            )
            row = next(rows, None)
        if row is None or row[0] != offset:
            problems.add(f"offset {offset}: record of {key!r} missing from the index")
            seqs[key] = seqs.get(key, 0) + 1
            continue
        expected = seqs.get(key)
        if expected is None:  # first record at or after the low-water mark
            expected = row[2] if lwm > 0 and row[1] == key else 1
        else:
            expected += 1
        seqs[key] = expected
        if row[1] != key or row[2] != expected:
            problems.add(
                f"offset {offset}: indexed as {row[1]!r} #{row[2]}, the log has {key!r} #{expected}"
            )
        row = next(rows, None)
    while row is not None:  # rows between the HWM and the index's end are in flight
        if row[0] >= nxt or row[0] < limit:
            where = "past the index's end" if row[0] >= nxt else "with no keyed record"
            problems.add(f"offset {row[0]}: indexed as {row[1]!r} #{row[2]}, {where}")
        row = next(rows, None)


def _verify_latest(index: KeyIndex, lwm: int, limit: int, problems: _Problems) -> None:
    truth: dict[bytes, int] = {}
    for key, offset in index.scan(lwm, limit):
        truth[key] = offset
    for key, offset in index._db.execute(
        "SELECT key, offset FROM entries WHERE offset >= ?", (lwm,)
    ):
        actual = truth.pop(key, None)
        if actual != offset:
            problems.add(
                f"key {key!r}: indexed at offset {offset}, the log's last record is at {actual}"
            )
    for key, offset in truth.items():
        problems.add(f"key {key!r}: last record at offset {offset} missing from the index")
