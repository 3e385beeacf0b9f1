"""Checking a data directory's key indexes against the log (``eventlane verify``).

Every ``<data>/store/<topic>/<partition>.keyindex.sqlite`` is opened *as it is* (no repair
on open) and compared row by row with its partition (:meth:`KeyIndex.verify`). With
``repair=True`` an index that differs is rebuilt from the log and verified again, and the
files of an index whose topic or partition no longer exists are deleted.

    >>> import tempfile
    >>> from framework.log.embedded.store import LogStore
    >>> with tempfile.TemporaryDirectory() as data, LogStore(data) as log:
    ...     check_key_indexes(log, log.local.key_indexes())
    []
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Collection, Iterator
from pathlib import Path

from framework.errors import InvalidTopicError
from framework.log.embedded.key_index import (
    INDEX_SUFFIX,
    LOCK_SUFFIX,
    KeyIndex,
    as_unreadable,
    is_damage,
)
from framework.log.port import Log
from framework.log.types import KeyIndexReport as IndexReport
from framework.observability import get_logger

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
            found = index.verify()
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
            after = index.verify()
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
