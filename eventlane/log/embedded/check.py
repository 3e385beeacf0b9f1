"""Checks of a partition's files against what they must say: ``verify``, index entries.

Everything here reads only: a problem is returned (or, for lookups, worked around and
logged), never repaired. Derived data (the indexes) is checked against the log it indexes;
the log is checked against the rules of :mod:`eventlane.log.embedded.batch` and
:mod:`eventlane.log.embedded.segment` and, on a partition never compacted, against continuity (each
batch and each segment starts where the previous one ended).
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

from eventlane.errors import CorruptRecordError
from eventlane.log.embedded.segment import (
    OffsetIndex,
    Segment,
    TimeIndex,
    corrupt,
    index_path,
    list_segment_bases,
    log_path,
    scan_batches,
    timeindex_path,
)
from eventlane.log.embedded.state import Snapshot
from eventlane.observability import Logger


def verify_files(
    directory: Path, snap: Snapshot, *, strict: bool, topic: str, partition: int
) -> list[CorruptRecordError]:
    """Check every batch of every segment and every index entry; return the problems.

    Batches: CRC, framing, offset order, each inside its segment's range; without
    compaction also continuity (each batch, and each segment, starts where the previous
    ended), the first segment at the low-water mark and the data up to the high-water
    mark. Index entries: each offset-index entry points at a batch with its offset, and
    each time-index entry names that batch and the largest timestamp before it.
    """
    problems: list[CorruptRecordError] = []
    bases = list_segment_bases(directory)
    if bases and bases[0] > snap.lwm:
        problems.append(
            corrupt(
                f"offsets [{snap.lwm}, {bases[0]}) are missing: no segment holds them",
                log_path(directory, bases[0]),
                0,
                snap.lwm,
                topic,
                partition,
            )
        )
    expect_after = -1
    for i, base in enumerate(bases):
        segment = Segment(directory, base)
        nxt = bases[i + 1] if i + 1 < len(bases) else None
        try:
            fd = os.open(segment.log, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            end = snap.active_size if base == snap.active_base else os.fstat(fd).st_size
            if strict and expect_after >= 0 and expect_after + 1 != base:
                problems.append(
                    corrupt(
                        f"offsets [{expect_after + 1}, {base}) are missing between segments",
                        segment.log,
                        0,
                        expect_after + 1,
                        topic,
                        partition,
                    )
                )
            expect_after = max(expect_after, base - 1)
            batches: list[tuple[int, int, int]] = []  # position, base offset, max ts before
            running = -1
            try:
                for ref in segment.scan(
                    fd,
                    0,
                    end,
                    topic=topic,
                    partition=partition,
                    expect_after=expect_after,
                    contiguous=strict,
                    limit=(1 << 62) if nxt is None else nxt,
                ):
                    batches.append((ref.position, ref.header.base_offset, running))
                    running = max(running, ref.header.max_timestamp)
                    expect_after = ref.header.last_offset
            except CorruptRecordError as err:
                problems.append(err)
                expect_after = (nxt - 1) if nxt is not None else expect_after
                continue
            problems.extend(verify_indexes(segment, batches, end, topic, partition))
        finally:
            os.close(fd)
    if strict and bases and expect_after + 1 < snap.hwm and not problems:
        problems.append(
            corrupt(
                f"acknowledged offsets [{expect_after + 1}, {snap.hwm}) are missing at the"
                " end of the log",
                log_path(directory, bases[-1]),
                snap.active_size,
                expect_after + 1,
                topic,
                partition,
            )
        )
    return problems


def verify_indexes(
    segment: Segment, batches: list[tuple[int, int, int]], end: int, topic: str, partition: int
) -> list[CorruptRecordError]:
    """Each offset-index entry (before ``end``) must point at one of ``batches``
    (``(position, base offset, largest timestamp before it)``) with its offset, and the
    time-index entry beside it must name the same batch and that timestamp."""
    at = {position: (offset, before) for position, offset, before in batches}
    problems = []
    times = TimeIndex(segment.timeindex)
    index = OffsetIndex(segment.index)
    for i, (rel, position) in enumerate(zip(index.offsets, index.positions, strict=True)):
        if position >= end:
            continue  # past the valid end: ignored by readers, trimmed by the writer
        found = at.get(position)
        problem = None
        if found is None or found[0] != segment.base + rel:
            problem = (
                f"offset index entry {i} says offset {segment.base + rel} is at position"
                f" {position}, but "
                + ("no batch starts there" if found is None else f"offset {found[0]} is")
            )
        elif i >= len(times.offsets) or times.offsets[i] != rel:
            problem = f"time index entry {i} does not name offset {segment.base + rel}"
        elif times.timestamps[i] != found[1]:
            problem = (
                f"time index entry {i} says {times.timestamps[i]} for the records before"
                f" offset {segment.base + rel}; they reach {found[1]}"
            )
        if problem is not None:
            path = segment.index if "offset index" in problem else segment.timeindex
            problems.append(corrupt(problem, path, i, segment.base + rel, topic, partition))
    return problems


def checked_time_start(
    directory: Path,
    base: int,
    timestamp: int,
    *,
    topic: str,
    partition: int,
    logger: Logger,
) -> int:
    """Relative offset to scan from for records at or after ``timestamp`` in segment
    ``base``, from its time index, once the entry used is checked against the batches
    it summarises (the largest timestamp before it); 0 (the whole segment) if it is
    wrong, so a damaged entry can make the lookup slower, never wrong."""
    times = TimeIndex(timeindex_path(directory, base))
    i = bisect.bisect_left(times.timestamps, timestamp) - 1
    if i < 0:
        return 0
    index = OffsetIndex(index_path(directory, base))
    if i < len(index.offsets) and index.offsets[i] == times.offsets[i]:
        start = index.positions[i - 1] if i else 0
        before = times.timestamps[i - 1] if i else -1
        path = log_path(directory, base)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            for ref in scan_batches(
                fd,
                path,
                start,
                index.positions[i],
                topic=topic,
                partition=partition,
                verify_crc=False,
            ):
                before = max(before, ref.header.max_timestamp)
        except CorruptRecordError:
            before = -2  # the scan below will meet the damage and report it
        finally:
            os.close(fd)
        if before == times.timestamps[i]:
            return times.offsets[i]
    logger.warning(
        "time index entry does not match its batches; scanning the segment",
        file=str(timeindex_path(directory, base)),
        entry=i,
    )
    return 0
