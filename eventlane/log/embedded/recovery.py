"""Recovery of a partition's files after an unclean stop: Kafka's ``LogLoader``.

Run by the holder of the partition's append lock when the shared state cannot be trusted (a
writer died inside a state update or a layout change, the state was written on another boot,
or the active segment is shorter than the state says). Steps, in order:

1. **Interrupted swaps.** A ``cleaner-journal`` names a compaction swap that was decided but
   maybe not finished: its renames are replayed (:func:`finish_interrupted_swap`), then
   ``.cleaned``/``.swap``/``.tmp`` leftovers no journal names are deleted, but only if no live
   process holds the maintenance lock (``cleaner.lock``): a live cleaner owns its files.
2. **Retention leftovers.** Segments wholly below ``log-start-offset`` (the low-water mark,
   written durably before retention unlinks anything) are deleted.
3. **Scan.** Segments from the recovery point on (and any whose indexes fail cheap checks)
   are scanned batch by batch: CRC, framing, offset order; their indexes are rebuilt. Only the
   end of the last segment may be a torn tail, and only if it holds no acknowledged offset
   (per the state, when there is one): it is truncated from its first damaged batch on if
   nothing intact follows it (a writer died mid-append: it leaves a prefix of its write), or
   if that batch's header reads as zeros (a power loss kept a later sector of a write that
   was never fsynced and lost this one: what follows was written by the same unsynced
   writes, so it was never acknowledged either; a flushed sector never reads back as zeros
   on a disk that honours flushes). Anything else is damage to durable data and raises
   :class:`~eventlane.errors.CorruptRecordError`.

Swap journal format (``cleaner-journal``, JSON, written with fsync + rename before the first
rename of a swap, removed after the last)::

    [{"base": B, "replaces": [B, B2, ...]}, ...]

meaning: rename ``B.log.cleaned`` (and its ``.index``/``.timeindex``) over ``B.*`` and delete
the segments ``B2 ...``. Replaying it is idempotent.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from eventlane._locks import FileLock
from eventlane.errors import CorruptRecordError, DataLossError
from eventlane.log.config import TopicConfig
from eventlane.log.embedded.batch import encode_skip_batch, parse_header
from eventlane.log.embedded.segment import (
    OffsetIndex,
    Segment,
    intact_batch_after,
    list_segment_bases,
    never_written,
)
from eventlane.log.embedded.state import BOOT, Snapshot
from eventlane.log.files import fsync_dir, read_int_file, write_atomic
from eventlane.observability import Logger

JOURNAL = "cleaner-journal"
CLEANED = ".cleaned"
LOG_START = "log-start-offset"
COMPACTED = "compacted"
"""Present once the partition was ever compacted: gaps between batches are legal from then."""
RECOVERY_POINT = "recovery-point"
LEFTOVER_SUFFIXES = (CLEANED, ".swap", ".tmp")


# ---------------------------------------------------------------------------- swap journal
def write_swap_journal(directory: Path, groups: Sequence[Sequence[int]]) -> None:
    """Durably record that each group's first segment replaces the whole group."""
    body = [{"base": g[0], "replaces": list(g)} for g in groups]
    write_atomic(directory / JOURNAL, orjson.dumps(body))


def apply_swap_group(directory: Path, base: int, replaces: Sequence[int]) -> None:
    """Rename ``base``'s cleaned files into place and delete the other segments of the group."""
    Segment(directory, base).install(CLEANED)
    for old in replaces:
        if old != base:
            Segment(directory, old).delete()


def finish_interrupted_swap(directory: Path) -> None:
    """Complete a swap whose journal was written before a crash (idempotent)."""
    journal = directory / JOURNAL
    if not journal.exists():
        return
    for group in orjson.loads(journal.read_bytes()):
        apply_swap_group(directory, group["base"], group["replaces"])
    fsync_dir(directory)
    journal.unlink()
    fsync_dir(directory)


def remove_swap_journal(directory: Path) -> None:
    (directory / JOURNAL).unlink(missing_ok=True)  # a recovery may have applied it
    fsync_dir(directory)


def _clear_leftovers(directory: Path, previous: Snapshot | None, maintenance: FileLock) -> None:
    # A journal and .cleaned files are leftovers only if no live process is compacting (a
    # live cleaner holds the maintenance lock while it writes them; it is never waited for
    # here, so the lock order append lock -> maintenance lock cannot deadlock). An odd layout
    # means a swap died under the append lock we now hold: its journal is replayed even if a
    # new cleaner is running (that one finishes old journals before it cleans).
    busy = maintenance.held or not maintenance.acquire(blocking=False)
    if busy:
        if previous is not None and previous.layout & 1:
            finish_interrupted_swap(directory)
        return
    try:
        finish_interrupted_swap(directory)
        for leftover in directory.iterdir():
            if leftover.suffix in LEFTOVER_SUFFIXES:
                leftover.unlink()
    finally:
        maintenance.release()
        maintenance.release_fd()


# ---------------------------------------------------------------------------- recovery
def recover(
    directory: Path,
    *,
    topic: str,
    partition: int,
    config: TopicConfig,
    previous: Snapshot | None,
    maintenance: FileLock,
    clock: Callable[[], int],
    logger: Logger,
    skip_lost: bool = False,
) -> Snapshot:
    """Rebuild a partition's state from its files (see the module docstring).

    ``previous`` is the state as last written (``None`` if there is none): its high-water
    mark tells which offsets were acknowledged, and its layout is carried on (made even and
    bumped), so readers reload their file lists.

    Acknowledged offsets are never given out again. If the files end below the previous
    high-water mark, or the first segment starts above ``log-start-offset``, records that
    were acknowledged are gone (a lying disk, a restored backup, a deleted file): recovery
    raises :class:`~eventlane.errors.DataLossError` naming the missing range. With
    ``skip_lost`` (the explicit, logged repair) it keeps the offsets taken instead: a lost
    tail is covered by an empty batch up to the old high-water mark, a lost head by moving
    ``log-start-offset`` up; nothing else changes.
    """
    _clear_leftovers(directory, previous, maintenance)
    bases = list_segment_bases(directory)
    lwm = read_int_file(directory / LOG_START, -1)
    if lwm < 0:  # recorded from the first open on, so a deleted first segment is seen
        lwm = bases[0] if bases else 0
        write_atomic(directory / LOG_START, str(lwm).encode())
    if bases and bases[0] > lwm:
        lost = (lwm, bases[0])
        if not skip_lost:
            raise _data_loss(directory, topic, partition, lost, "the first segment is missing")
        logger.warning("skipping lost offsets at the start of the log", start=lwm, end=bases[0])
        lwm = bases[0]
        write_atomic(directory / LOG_START, str(lwm).encode())
    for base, nxt in itertools.pairwise(bases):
        if nxt <= lwm:
            Segment(directory, base).delete()
    bases = list_segment_bases(directory)
    if not bases:  # a new partition (or every segment expired): start one, durably
        bases = [lwm]
        Segment(directory, lwm).create()
        fsync_dir(directory)
        fsync_dir(directory.parent)
    lwm = max(lwm, bases[0])
    recovery_point = read_int_file(directory / RECOVERY_POINT, 0)
    start = max(0, bisect.bisect_right(bases, recovery_point) - 1)
    durable = previous.hwm if previous is not None else -1
    strict = not config.compact and not (directory / COMPACTED).exists()
    expect_after = -1
    leo = bases[0]
    active_size = 0
    max_ts = -1
    last_index_pos = 0
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        segment = Segment(directory, base)
        nxt = bases[i + 1] if not last else 1 << 62
        if strict and expect_after >= 0 and expect_after + 1 != base:
            _log_gap(logger, segment, expect_after + 1, base)
        expect_after = max(expect_after, base - 1)
        if i < start and segment.indexes_look_sane():
            # fsynced when rolled; rescanned only to rebuild damaged indexes
            try:
                expect_after = _last_offset(segment, topic, partition, expect_after)
            except CorruptRecordError:  # reads and verify report it; recovery need not
                expect_after = nxt - 1
            continue
        fd = os.open(segment.log, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            entries: list[tuple[int, int, int]] = []
            seg_max = -1
            last_indexed = -(1 << 62)
            valid = 0
            position = 0
            while True:
                try:
                    for ref in segment.scan(
                        fd,
                        position,
                        size,
                        topic=topic,
                        partition=partition,
                        expect_after=expect_after,
                        limit=nxt,
                    ):
                        h = ref.header
                        if strict and h.base_offset != expect_after + 1:
                            _log_gap(logger, segment, expect_after + 1, h.base_offset)
                        if (
                            ref.position == 0
                            or ref.position - last_indexed >= config.index_interval_bytes
                        ):
                            entries.append((h.base_offset - base, ref.position, seg_max))
                            last_indexed = ref.position
                        seg_max = max(seg_max, h.max_timestamp)
                        expect_after = h.last_offset
                        valid = ref.position + h.size
                    break
                except CorruptRecordError as err:
                    # Only the end of the last segment can be a torn tail, and only if it
                    # holds no acknowledged offset (per the state, when there is one) and
                    # nothing intact follows it: it is cut off. Anything else is damage to
                    # durable data: it stays, reads of it fail, and the scan resumes at the
                    # next intact batch (indexed, so reads past the damage start there).
                    damaged = valid if err.position is None else err.position
                    resume = intact_batch_after(fd, damaged, size, expect_after)
                    unacknowledged = max(expect_after + 1, base) >= durable
                    if (
                        last
                        and unacknowledged
                        and (resume is None or never_written(fd, damaged, size))
                    ):
                        logger.warning(
                            "truncating torn tail found by recovery",
                            file=str(segment.log),
                            position=valid,
                            bytes=size - valid,
                            reason=err.message,
                            intact_after=resume,
                        )
                        os.ftruncate(fd, valid)
                        os.fsync(fd)
                        break
                    if resume is None and last:
                        raise  # the end of the acknowledged data is damaged: no safe LEO
                    logger.error(
                        "damaged batch in durable data; reads of it fail, the rest is read",
                        file=str(segment.log),
                        position=err.position,
                        offset=err.offset,
                        reason=err.message,
                        resumes_at=resume,
                    )
                    if resume is None:
                        break  # the rest of this closed segment is unreadable
                    position, last_indexed = resume, -(1 << 62)
            segment.write_indexes(entries)
            if last:
                leo = expect_after + 1 if expect_after >= base else base
                active_size = valid
                max_ts = seg_max
                last_index_pos = entries[-1][1] if entries else 0
                os.fsync(fd)
        finally:
            os.close(fd)
    active = bases[-1]
    if leo < durable:
        lost = (leo, durable)
        if not skip_lost:
            raise _data_loss(directory, topic, partition, lost, "the log ends below its HWM")
        marker = encode_skip_batch(leo, durable - leo, max(max_ts, clock()))
        with open(Segment(directory, active).log, "r+b") as f:
            f.seek(active_size)
            f.write(marker)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
        logger.warning(
            "skipped lost acknowledged offsets: they stay taken, never reused",
            start=leo,
            end=durable,
            file=str(Segment(directory, active).log),
        )
        leo, active_size = durable, active_size + len(marker)
        max_ts = max(max_ts, parse_header(marker, 0).max_timestamp)
    created = int(os.stat(Segment(directory, active).log).st_mtime * 1000)
    layout = ((previous.layout | 1) + 1) if previous is not None else 2
    snap = Snapshot(
        lwm=lwm,
        hwm=leo,
        leo=leo,
        active_base=active,
        active_size=active_size,
        layout=layout,
        active_max_ts=max_ts,
        last_index_pos=last_index_pos,
        active_created_ms=created if active_size else clock(),
        boot=BOOT,
        epoch=previous.epoch if previous is not None else 0,  # complete batches survive
        synced_size=active_size,
    )
    (logger.info if leo > lwm else logger.debug)(
        "partition recovered", lwm=lwm, leo=leo, segments=len(bases)
    )
    return snap


def _data_loss(
    directory: Path, topic: str, partition: int, lost: tuple[int, int], what: str
) -> DataLossError:
    start, end = lost
    return DataLossError(
        f"acknowledged offsets [{start}, {end}) are missing ({what}); the partition will not"
        " open, so that no acknowledged offset is given out twice. Restore the files, or"
        f" skip the lost offsets for good: eventlane verify {topic} --skip-lost-offsets",
        topic=topic,
        partition=partition,
        offset=start,
        path=directory,
    )


def _log_gap(logger: Logger, segment: Segment, start: int, end: int) -> None:
    """A hole in the middle of a never-compacted log: reads of it fail and ``verify``
    reports it; the rest of the partition stays readable (only the lost part is lost)."""
    logger.error(
        "offsets missing in the middle of the log (lost data); reads of them fail",
        start=start,
        end=end,
        file=str(segment.log),
    )


def _last_offset(segment: Segment, topic: str, partition: int, expect_after: int) -> int:
    """The last offset of a closed segment, from its last indexed batch onwards (headers
    only; the segment was fsynced when rolled)."""
    index = OffsetIndex(segment.index)
    start = index.positions[-1] if len(index.positions) else 0
    fd = os.open(segment.log, os.O_RDONLY)
    try:
        for ref in segment.scan(fd, start, topic=topic, partition=partition, verify_crc=False):
            expect_after = max(expect_after, ref.header.last_offset)
    finally:
        os.close(fd)
    return expect_after
