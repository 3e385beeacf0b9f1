"""Compaction by key: keep at least the last record of every key, never move an offset.

The cleaner works on the *cleanable* range of a partition: the closed segments before the
active one, cut short at the first segment holding a record younger than
``min_compaction_lag_ms``. Two passes:

1. build a map ``key -> last offset`` over the cleanable range (memory bounded by the number
   of distinct keys: keys longer than 16 bytes are stored as a 16-byte BLAKE2b digest);
2. copy each group of consecutive segments (grouped so a cleaned group fits
   ``segment_bytes``) into ``<base>.log.cleaned`` keeping a record iff it is the last one of
   its key, and dropping a tombstone once the cleaner first saw it ``delete_retention_ms``
   ago (see below). Batches
   are re-framed with their original base offset and ``last_offset_delta``, so offsets are
   preserved and gaps appear.

Pass 1 scans keys without building records or copying values (``index_keys``). In pass 2
a batch none of whose offsets is the last of a key is skipped and one all of whose offsets
are (and that holds no tombstone old enough to drop) is copied byte for byte, both told
from the sorted last offsets without reading a record; the others get a key-only keep/drop
scan (``keep_flags``), and only a batch with records both kept and dropped is decoded and
re-framed.

Tombstones expire by the log's own clock, never by the producer's timestamp (a tombstone
stamped two days old by its producer must still reach a consumer one record behind), as
Kafka measures ``delete.retention.ms``. ``cleaner-first-seen`` (JSON, written with fsync +
rename before a pass drops anything) records when each pass first covered a range::

    [[end_offset, ms], ...]    offsets below end_offset were first seen by a pass at ms

(ascending in both). A tombstone at offset ``o`` may be dropped once the entry covering it is
``delete_retention_ms`` old; entries already that old are merged, so the list stays short.
Losing the file only makes tombstones live longer.

Swapping cleaned files in is crash-safe and never blocks readers or writers for more than a
rename: the cleaned files are fsynced, a ``cleaner-journal`` naming every replacement is
written durably, the state's layout is made odd (readers pause opening files), the files are
renamed over the old ones and the replaced segments unlinked, the layout is made even again,
and the journal is removed. The partition owns that swap (:meth:`Partition.replace_segments
<eventlane.log.embedded.partition.Partition.replace_segments>`); recovery replays an existing
journal and deletes ``.cleaned`` files that no journal names (:mod:`.recovery`). This module
is mechanism only: it never writes the partition's state or renames its files.
Readers that already opened an old segment keep reading it (the old inode lives until
closed); its records are a superset of the cleaned ones at the same offsets.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import orjson

from eventlane.errors import CorruptRecordError
from eventlane.log.embedded.batch import (
    HEADER_SIZE,
    NATIVE,
    BatchHeader,
    _py_decode_records,
    batch_crc_ok,
    decode_records,
    encode_batch,
    index_keys,
)
from eventlane.log.embedded.partition import Partition
from eventlane.log.embedded.recovery import CLEANED
from eventlane.log.embedded.segment import OFFSET_ENTRY, TIME_ENTRY, Segment, log_path, scan_batches
from eventlane.log.files import read_json_file, write_atomic
from eventlane.log.record import Header, Record
from eventlane.log.types import CompactionReport as CompactionReport  # noqa: PLC0414 (re-exported)
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

FIRST_SEEN = "cleaner-first-seen"


def key_id(key: bytes) -> bytes:
    """The map key for a record key: itself up to 16 bytes, else a 16-byte digest."""
    return key if len(key) <= 16 else hashlib.blake2b(key, digest_size=16).digest()


def plan_groups(segments: Sequence[tuple[int, int]], max_bytes: int) -> list[list[int]]:
    """Group consecutive ``(base, size)`` segments so each group's total fits ``max_bytes``.

    Sizes are pre-cleaning sizes, so a cleaned group always fits.

    >>> plan_groups([(0, 40), (10, 40), (20, 40), (30, 90)], 100)
    [[0, 10], [20], [30]]
    >>> plan_groups([], 100)
    []
    """
    groups: list[list[int]] = []
    size = 0
    for base, seg_size in segments:
        if groups and size + seg_size <= max_bytes:
            groups[-1].append(base)
            size += seg_size
        else:
            groups.append([base])
            size = seg_size
    return groups


# The cleaner decodes records into plain tuples (fields in ``Record`` order) where the native
# decoder builds them: the cyclic GC untracks a plain tuple of atomic fields the first time it
# sees it, but never a NamedTuple instance, so a segment's worth of ``Record`` objects makes
# every collection slower (about 2x the cost of the decode itself). The pure-Python decoder
# needs a class it can call, so the fallback keeps ``Record``; both are read by index.
_DECODE_AS: type = tuple if NATIVE else Record
_Fields = tuple[str, int, int, int, int, bytes | None, bytes | None, tuple[Header, ...]]
"""A decoded record as the cleaner holds it: ``Record``'s fields, in its order."""
_OFFSET_AT: Final = 2
_TIMESTAMP_AT: Final = 3
_KEY_AT: Final = 5
_VALUE_AT: Final = 6
_HEADERS_AT: Final = 7


KeepFlagsFn = Callable[
    [bytes, int, int, int, dict[bytes, int], Callable[[bytes], bytes], int],
    tuple[bytes, int | None],
]


def _py_keep_flags(
    buf: bytes,
    start: int,
    end: int,
    base_offset: int,
    last: dict[bytes, int],
    key_id: Callable[[bytes], bytes],
    horizon: int,
) -> tuple[bytes, int | None]:
    """Pass 2's decision for every record of ``buf[start:end]``: one byte each, 1 = kept.

    A record is kept iff it has a key, it is the last record of that key (``last``, keys
    over 16 bytes as ``key_id(key)``), and it is not a tombstone at an offset below
    ``horizon``. Also returns the largest timestamp delta of a kept record (``None``: none
    kept). The reference for the native version, which decodes no value or header.
    """
    records = _py_decode_records(buf, start, end, base_offset, 0, 0, "", 0, -(1 << 63))
    flags = bytes(
        r.key is not None
        and last.get(r.key if len(r.key) <= 16 else key_id(r.key)) == r.offset
        and not (r.value is None and r.offset < horizon)
        for r in records
    )
    deltas = list(itertools.compress((r.timestamp for r in records), flags))
    return flags, max(deltas) if deltas else None


keep_flags: KeepFlagsFn
try:
    from eventlane.log import _native  # type: ignore[attr-defined]

    keep_flags = _native.keep_flags
except ImportError:  # pragma: no cover - only without a C compiler
    keep_flags = _py_keep_flags


def _iter_raw(
    partition: Partition, base: int, end_offset: int
) -> Iterator[tuple[BatchHeader, bytes]]:
    """The batches of segment ``base`` below ``end_offset``: header and exact bytes.

    Only one batch is held at once (memory is bounded by the batch size, not the segment
    size); each is read once, its CRC checked on the very bytes that are decoded.
    """
    path = log_path(partition.dir, base)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        refs = scan_batches(
            fd,
            path,
            0,
            size,
            topic=partition.topic,
            partition=partition.partition,
            verify_crc=False,
        )
        for ref in refs:
            h = ref.header
            if h.base_offset >= end_offset:
                break
            raw = os.pread(fd, h.size, ref.position)
            if len(raw) < h.size or not batch_crc_ok(raw, 0, h):
                raise CorruptRecordError(
                    "CRC32C mismatch",
                    topic=partition.topic,
                    partition=partition.partition,
                    offset=h.base_offset,
                    path=path,
                    position=ref.position,
                )
            yield h, raw
    finally:
        os.close(fd)


def compact_partition(partition: Partition) -> CompactionReport:
    """Compact the cleanable range of ``partition`` (no-op unless its policy compacts)."""
    started = time.perf_counter()
    cfg = partition.config
    if not cfg.compact:
        return CompactionReport(partition.topic, partition.partition, 0, 0, 0, 0, 0, 0, 0.0)
    with partition.maintenance_lock():
        return _compact_locked(partition, started)


def _compact_locked(partition: Partition, started: float) -> CompactionReport:
    partition.finish_interrupted_swap()
    cfg = partition.config
    now = partition.clock()
    snap = partition.offsets()
    bases = [s.base for s in partition.segments() if s.base < snap.active_base]
    cleanable: list[tuple[int, int]] = []
    # no closed segment: bases is empty and the second list still holds the active base
    for base, nxt in zip(bases, [*bases[1:], snap.active_base], strict=False):
        if cfg.min_compaction_lag_ms > 0 and (
            partition.segment_max_timestamp(base, nxt) > now - cfg.min_compaction_lag_ms
        ):
            break
        cleanable.append((base, log_path(partition.dir, base).stat().st_size))
    if not cleanable:
        return CompactionReport(
            partition.topic, partition.partition, 0, 0, 0, 0, 0, 0, time.perf_counter() - started
        )
    end_offset = snap.active_base
    # Pass 1: last offset of every key in the cleanable range.
    last: dict[bytes, int] = {}
    scanned = 0
    for base, _ in cleanable:  # a key-only scan: values are neither copied nor decoded
        for h, raw in _iter_raw(partition, base, end_offset):
            scanned += index_keys(raw, HEADER_SIZE, h.size, h.base_offset, last, key_id)
    # Pass 2: write cleaned groups.
    horizon = _tombstone_horizon(partition, _cleanable_end(cleanable, bases, snap.active_base), now)
    groups = plan_groups(cleanable, cfg.segment_bytes)
    kept_offsets = sorted(last.values())  # the last offset of every key, for _write_cleaned
    kept_total = 0
    bytes_after = 0
    for group in groups:
        kept_total_group, size = _write_cleaned(
            partition, group, end_offset, last, kept_offsets, horizon
        )
        kept_total += kept_total_group
        bytes_after += size
    partition.replace_segments(groups)
    report = CompactionReport(
        partition.topic,
        partition.partition,
        len(cleanable),
        len(groups),
        scanned,
        kept_total,
        sum(size for _, size in cleanable),
        bytes_after,
        time.perf_counter() - started,
    )
    log.info(
        "partition compacted",
        topic=partition.topic,
        partition=partition.partition,
        scanned=scanned,
        kept=kept_total,
        segments=len(groups),
    )
    return report


def _cleanable_end(cleanable: list[tuple[int, int]], bases: list[int], active_base: int) -> int:
    """The first offset past the cleanable range: the base of the segment after it."""
    i = bases.index(cleanable[-1][0]) + 1
    return bases[i] if i < len(bases) else active_base


def _tombstone_horizon(partition: Partition, end: int, now: int) -> int:
    """Record that this pass saw offsets below ``end`` at ``now``; return the offset below
    which tombstones were first seen ``delete_retention_ms`` ago (may be dropped)."""
    path = partition.dir / FIRST_SEEN
    entries: list[list[int]] = [list(e) for e in read_json_file(path, [])]
    changed = False
    if not entries or entries[-1][0] < end:
        entries.append([end, now])
        changed = True
    retention = partition.config.delete_retention_ms
    expired = [e for e in entries if e[1] + retention <= now]
    if len(expired) > 1:  # old enough either way: one entry says as much
        entries = [[expired[-1][0], expired[-1][1]], *entries[len(expired) :]]
        changed = True
    if changed:
        write_atomic(path, orjson.dumps(entries))
    return expired[-1][0] if expired else -1


def _write_cleaned(
    partition: Partition,
    group: list[int],
    end_offset: int,
    last: dict[bytes, int],
    kept_offsets: list[int],
    horizon: int,
) -> tuple[int, int]:
    """Write the cleaned copy of ``group``; return (records kept, bytes written).

    ``kept_offsets`` is ``sorted(last.values())``. Offsets of a batch lie in
    ``[base_offset, base_offset + last_offset_delta]`` and no other batch's do, so the number
    of kept offsets in that range says, without reading a record, that no record of the
    batch is the last of its key (skipped) or that all are (copied as it is, unless a
    tombstone in it may have expired: offsets below ``horizon``). Only the other batches
    are scanned (``keep_flags``).
    """
    base = group[0]
    out_log, out_index, out_time = Segment(partition.dir, base).files(CLEANED)
    kept_count = 0
    position = 0
    last_indexed = -(1 << 62)
    running_max = -1
    index_entries: list[bytes] = []
    time_entries: list[bytes] = []
    with open(out_log, "wb") as f:
        for seg in group:
            for h, stored in _iter_raw(partition, seg, end_offset):
                first = h.base_offset
                last_of_keys = bisect.bisect_right(
                    kept_offsets, first + h.last_offset_delta
                ) - bisect.bisect_left(kept_offsets, first)
                if last_of_keys == 0:  # nothing kept
                    continue
                if last_of_keys == h.record_count and first >= horizon:
                    raw, kept, max_ts = stored, last_of_keys, h.max_timestamp
                else:
                    flags, max_delta = keep_flags(
                        stored, HEADER_SIZE, h.size, first, last, key_id, horizon
                    )
                    if max_delta is None:  # nothing kept (expired tombstones)
                        continue
                    kept = flags.count(1)
                    max_ts = h.base_timestamp + max_delta
                    # all kept: copied as it is; else only this batch is decoded and re-framed
                    raw = stored if kept == len(flags) else _reframe(partition, h, stored, flags)
                if (
                    position == 0
                    or position - last_indexed >= partition.config.index_interval_bytes
                ):
                    index_entries.append(OFFSET_ENTRY.pack(h.base_offset - base, position))
                    time_entries.append(TIME_ENTRY.pack(running_max, h.base_offset - base))
                    last_indexed = position
                running_max = max(running_max, max_ts)
                f.write(raw)
                position += len(raw)
                kept_count += kept
        f.flush()
        os.fsync(f.fileno())
    for path, entries in ((out_index, index_entries), (out_time, time_entries)):
        with open(path, "wb") as f:
            f.write(b"".join(entries))
            f.flush()
            os.fsync(f.fileno())
    return kept_count, position


def _reframe(partition: Partition, h: BatchHeader, raw: bytes, flags: bytes) -> bytes:
    """The batch ``raw`` holding only the records whose flag is set, offsets unchanged.

    Re-framed with its original base offset, timestamp type and ``last_offset_delta``
    (so offsets never move and the next batch's base stays past it).
    """
    records: Sequence[_Fields] = decode_records(
        raw,
        HEADER_SIZE,
        h.size,
        h.base_offset,
        h.base_timestamp,
        h.timestamp_type,
        partition.topic,
        partition.partition,
        -(1 << 63),  # every record, so the flags line up
        _DECODE_AS,
    )
    kept = list(itertools.compress(records, flags))
    return encode_batch(
        h.base_offset,
        [(r[_KEY_AT], r[_VALUE_AT], r[_HEADERS_AT], r[_TIMESTAMP_AT]) for r in kept],
        timestamp_type=h.timestamp_type,
        offset_deltas=[r[_OFFSET_AT] - h.base_offset for r in kept],
        last_offset_delta=h.last_offset_delta,
    )


class LogCleaner:
    """The store's background compactor (Kafka's ``LogCleaner`` thread, on request only).

    :meth:`request` queues a partition (repeats coalesce) and returns at once; one daemon
    thread, started on first use, compacts queued partitions one at a time. Errors are
    logged, never raised: compaction is an optimisation, and the next request retries.
    """

    def __init__(self, open_partition: Callable[[str, int], Partition]) -> None:
        self._open = open_partition
        self._pending: dict[tuple[str, int], None] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._running = False

    def request(self, topic: str, partition: int) -> None:
        with self._cond:
            if self._stopping:
                return
            self._pending[(topic, partition)] = None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="eventlane-log-cleaner", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                topic, partition = next(iter(self._pending))
                del self._pending[(topic, partition)]
                self._running = True
            try:
                report = compact_partition(self._open(topic, partition))
                log.debug("requested compaction done", report=report._asdict())
            except Exception:
                log.exception("requested compaction failed", topic=topic, partition=partition)
            finally:
                with self._cond:
                    self._running = False

    def idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or running (tests); ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if not self._pending and not self._running:
                    return True
            time.sleep(0.005)
        return False

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the compaction in progress (if any) finishes."""
        with self._cond:
            self._stopping = True
            self._pending.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
