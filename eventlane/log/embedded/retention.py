"""Retention: delete whole old segments from the front, advancing the low-water mark.

Planning is a pure function over segment metadata; applying it is the partition's
:meth:`~eventlane.log.embedded.partition.Partition.delete_segments_below`, a short critical section:
the new low-water mark is written durably (``log-start-offset``) and published in the state
before any file is unlinked, so a crash in between leaves segments that recovery deletes, and
a reader can never see a record below the low-water mark disappear mid-read: it gets
:class:`~eventlane.errors.OffsetOutOfRangeError` and resets per its ``auto_offset_reset``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from eventlane.log.embedded.partition import Partition
from eventlane.log.embedded.segment import log_path
from eventlane.log.types import RetentionReport as RetentionReport  # noqa: PLC0414 (re-exported)
from eventlane.observability import get_logger

log = get_logger("eventlane.log")


class ClosedSegment(NamedTuple):
    """What retention needs to know of a closed (non-active) segment."""

    base: int
    size: int
    max_timestamp: int
    modified_ms: int


def plan_retention(
    closed: Sequence[ClosedSegment],
    active: ClosedSegment,
    *,
    now: int,
    retention_ms: int,
    retention_bytes: int,
) -> int:
    """How many of the oldest ``closed`` segments to delete.

    A segment expires when its newest record is older than ``retention_ms``. A timestamp in
    the future (producer clock skew) cannot keep a segment forever: such a segment's age is
    taken from its file's modification time instead. Size retention deletes the oldest
    segments while the rest still hold ``retention_bytes`` or more. Deletion is a prefix:
    it stops at the first segment that must stay. ``-1`` disables either rule.

    >>> day = 86_400_000
    >>> segs = [ClosedSegment(0, 100, 1 * day, 1 * day), ClosedSegment(10, 100, 5 * day, 5 * day)]
    >>> active = ClosedSegment(20, 50, 9 * day, 9 * day)
    >>> plan_retention(segs, active, now=10 * day, retention_ms=7 * day, retention_bytes=-1)
    1
    >>> plan_retention(segs, active, now=10 * day, retention_ms=-1, retention_bytes=150)
    1
    >>> plan_retention(segs, active, now=10 * day, retention_ms=-1, retention_bytes=50)
    2
    >>> skewed = [ClosedSegment(0, 100, 99 * day, 1 * day)]   # record dated far in the future
    >>> plan_retention(skewed, active, now=10 * day, retention_ms=7 * day, retention_bytes=-1)
    1
    """
    total = sum(s.size for s in closed) + active.size
    count = 0
    for seg in closed:
        expired = False
        if retention_ms >= 0:
            age_ts = seg.max_timestamp if seg.max_timestamp <= now else seg.modified_ms
            expired = age_ts < now - retention_ms
        if not expired and retention_bytes >= 0:
            expired = total - seg.size >= retention_bytes
        if not expired:
            break
        total -= seg.size
        count += 1
    return count


def _closed_segments(
    partition: Partition, bases: list[int], active_base: int
) -> list[ClosedSegment]:
    out = []
    for base, nxt in zip(bases, [*bases[1:], active_base], strict=True):
        if base >= active_base:
            break
        st = log_path(partition.dir, base).stat()
        out.append(
            ClosedSegment(
                base,
                st.st_size,
                partition.segment_max_timestamp(base, nxt),
                int(st.st_mtime * 1000),
            )
        )
    return out


def apply_retention(partition: Partition) -> RetentionReport:
    """Delete expired segments of ``partition`` per its config (no-op without ``delete``)."""
    started = time.perf_counter()
    cfg = partition.config
    snap = partition.offsets()
    if not cfg.delete or (cfg.retention_ms < 0 and cfg.retention_bytes < 0):
        return RetentionReport(
            partition.topic, partition.partition, snap.lwm, snap.lwm, 0, 0, 0, 0.0
        )
    now = partition.clock()
    with partition.maintenance_lock():
        snap = partition.offsets()
        if cfg.retention_ms >= 0 and snap.active_size > 0:
            age_ts = snap.active_max_ts
            if age_ts > now:  # dated in the future: its age comes from the file, as below
                age_ts = int(log_path(partition.dir, snap.active_base).stat().st_mtime * 1000)
            if 0 <= age_ts < now - cfg.retention_ms:
                partition.roll()  # the whole active segment expired: close it so it can go
                snap = partition.offsets()
        bases = [s.base for s in partition.segments()]
        closed = _closed_segments(partition, bases, snap.active_base)
        active = ClosedSegment(snap.active_base, snap.active_size, snap.active_max_ts, now)
        count = plan_retention(
            closed,
            active,
            now=now,
            retention_ms=cfg.retention_ms,
            retention_bytes=cfg.retention_bytes,
        )
        if count == 0:
            return RetentionReport(
                partition.topic,
                partition.partition,
                snap.lwm,
                snap.lwm,
                0,
                0,
                0,
                time.perf_counter() - started,
            )
        doomed = closed[:count]
        new_lwm = closed[count].base if count < len(closed) else snap.active_base
        partition.delete_segments_below(new_lwm)
    report = RetentionReport(
        partition.topic,
        partition.partition,
        snap.lwm,
        new_lwm,
        count,
        sum(s.size for s in doomed),
        new_lwm - max(snap.lwm, doomed[0].base),
        time.perf_counter() - started,
    )
    log.info(
        "retention applied",
        topic=partition.topic,
        partition=partition.partition,
        lwm=new_lwm,
        segments=count,
    )
    return report
