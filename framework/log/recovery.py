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
   end of the last segment may be a torn tail (a writer died mid-append), and only if it
   holds no acknowledged offset and nothing intact follows it: it is truncated. Anything
   else is damage to durable data and raises :class:`~framework.errors.CorruptRecordError`.

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
import structlog

from framework._locks import FileLock
from framework.errors import CorruptRecordError
from framework.log.config import TopicConfig
from framework.log.files import fsync_dir, read_int_file, write_atomic
from framework.log.segment import Segment, intact_batch_after, list_segment_bases
from framework.log.state import BOOT, Snapshot

JOURNAL = "cleaner-journal"
CLEANED = ".cleaned"
LOG_START = "log-start-offset"
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
    logger: structlog.typing.FilteringBoundLogger,
) -> Snapshot:
    """Rebuild a partition's state from its files (see the module docstring).

    ``previous`` is the state as last written (``None`` if there is none): its high-water
    mark tells which offsets were acknowledged, and its layout is carried on (made even and
    bumped), so readers reload their file lists.
    """
    _clear_leftovers(directory, previous, maintenance)
    bases = list_segment_bases(directory)
    lwm = read_int_file(directory / LOG_START, bases[0] if bases else 0)
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
    expect_after = -1
    leo = bases[0]
    active_size = 0
    max_ts = -1
    last_index_pos = 0
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        segment = Segment(directory, base)
        if i < start and segment.indexes_look_sane():
            continue  # fsynced when rolled; rescanned only to rebuild damaged indexes
        fd = os.open(segment.log, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            entries: list[tuple[int, int, int]] = []
            seg_max = -1
            last_indexed = -(1 << 62)
            valid = 0
            try:
                for ref in segment.scan(
                    fd, 0, size, topic=topic, partition=partition, expect_after=expect_after
                ):
                    h = ref.header
                    if (
                        ref.position == 0
                        or ref.position - last_indexed >= config.index_interval_bytes
                    ):
                        entries.append((h.base_offset - base, ref.position, seg_max))
                        last_indexed = ref.position
                    seg_max = max(seg_max, h.max_timestamp)
                    expect_after = h.last_offset
                    valid = ref.position + h.size
            except CorruptRecordError as err:
                # Only the end of the last segment can be a torn tail, and only if it holds
                # no acknowledged offset (per the state, when there is one) and nothing
                # intact follows it; anything else is damage to durable data.
                next_offset = max(expect_after + 1, base)
                if (
                    not last
                    or next_offset < durable
                    or intact_batch_after(fd, valid, size, expect_after) is not None
                ):
                    raise
                logger.warning(
                    "truncating torn tail found by recovery",
                    file=str(segment.log),
                    position=valid,
                    bytes=size - valid,
                    reason=err.message,
                )
                os.ftruncate(fd, valid)
                os.fsync(fd)
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
    )
    (logger.info if leo > lwm else logger.debug)(
        "partition recovered", lwm=lwm, leo=leo, segments=len(bases)
    )
    return snap
