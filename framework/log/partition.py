"""One partition: an ordered, append-only sequence of records stored as segment files.

Directory layout (``<data>/topics/<topic>/<partition>/``)::

    00000000000000000000.log / .index / .timeindex    segments (see :mod:`.segment`)
    state              shared offsets of the partition, memory-mapped (see :mod:`.state`)
    lock               flock()ed by whoever appends, rolls, truncates or swaps segments
    cleaner.lock       flock()ed by the one process compacting this partition
    log-start-offset   the low-water mark, written (fsync + rename) before segments are deleted
    recovery-point     every segment below this offset was fsynced when it was rolled
    cleaner-journal    present only while a compaction swap is being applied

Invariants:

* Offsets strictly increase through the segments; segments never overlap once a compaction
  swap is complete (a reader that sees a moment of overlap reads the older copy of the same
  records, so nothing is missed).
* ``lwm <= hwm <= leo``. With ``flush_policy="always"`` the high-water mark moves only after
  the batch is fsynced; readers never return records at or above it.
* Only the holder of ``lock`` writes the active segment, its indexes, or the state. Bytes past
  ``state.active_size`` belong to an append that was never acknowledged (its writer died): the
  next writer truncates them.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import itertools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import structlog

from framework.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from framework.log.batch import (
    HEADER_SIZE,
    batch_crc_ok,
    check_header,
    decode_records,
    encode_batch,
    parse_header,
)
from framework.log.cleaner import finish_interrupted_swap
from framework.log.config import TopicConfig
from framework.log.files import fsync_dir, read_int_file, write_atomic
from framework.log.record import RECORD_OVERHEAD, Header, Record
from framework.log.segment import (
    OFFSET_ENTRY,
    TIME_ENTRY,
    OffsetIndex,
    TimeIndex,
    corrupt,
    index_path,
    indexes_look_sane,
    intact_batch_after,
    list_segment_bases,
    log_path,
    scan_batches,
    timeindex_path,
)
from framework.log.state import BOOT, Notifier, PartitionState, Snapshot
from framework.log.types import (  # re-exported: older imports name them here
    AppendHook as AppendHook,  # noqa: PLC0414
)
from framework.log.types import AppendResult as AppendResult  # noqa: PLC0414 (re-exported)
from framework.log.types import Cursor as Cursor  # noqa: PLC0414 (re-exported)
from framework.log.types import Precondition as Precondition  # noqa: PLC0414 (re-exported)
from framework.log.types import RecordTuple as RecordTuple  # noqa: PLC0414 (re-exported)

log = structlog.get_logger("eventlane.log")

MAX_BATCH_BYTES = 1 << 20
_IOV_MAX = 512  # buffers per pwritev call (Linux allows 1024)

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class _LayoutChangedError(Exception):
    """Internal: the segment list changed while a reader was opening files; retry."""


class SegmentInfo(NamedTuple):
    base: int
    size: int


class Partition:
    """A partition opened by this process; safe for use from several threads and processes."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        config: TopicConfig,
        notifier: Notifier,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self.dir = directory
        self.topic = topic
        self.partition = partition
        self.config = config
        self.notifier = notifier
        self.clock = clock
        directory.mkdir(parents=True, exist_ok=True)
        self.state = PartitionState(directory / "state", on_stuck=self._wait_for_writer)
        self._thread_lock = threading.RLock()
        self._lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._log = log.bind(topic=topic, partition=partition)
        # Writer cache (valid while holding the lock and layout matches).
        self._w_layout = -1
        self._w_fd = -1
        self._w_base = -1
        self._w_index_fd = -1
        self._w_time_fd = -1
        # Reader cache.
        self._r_layout = -1
        self._r_bases: list[int] = []
        self._r_fds: dict[int, int] = {}
        self._r_indexes: dict[int, OffsetIndex] = {}
        self._r_lock = threading.Lock()
        with self.locked():
            pass

    # ------------------------------------------------------------------ locking and sync
    @contextlib.contextmanager
    def locked(self) -> Iterator[Snapshot]:
        """Hold the append lock (threads and processes) with the state made consistent."""
        with self._thread_lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield self._sync_locked()
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _wait_for_writer(self) -> None:
        """Take and release the append lock: waits for a live writer, repairs a dead one's."""
        with self.locked():
            pass

    def _sync_locked(self) -> Snapshot:
        if self.state.torn:  # seq left odd under the lock: a writer died inside write()
            self._log.warning("state update interrupted; recovering")
            return self._recover_locked()
        if not self.state.initialized:
            return self._recover_locked()
        snap = self.state.read()
        if snap.layout & 1:
            # Only the lock holder makes the layout odd (a roll creating files, a compaction
            # swap renaming them) and it makes it even again before unlocking: it died midway.
            self._log.warning("segment layout change interrupted; recovering", layout=snap.layout)
            return self._recover_locked()
        if snap.layout != self._w_layout:
            self._open_writer(snap)
        size = os.fstat(self._w_fd).st_size
        if size != snap.active_size:
            if size < snap.active_size:
                self._log.warning(
                    "active segment shorter than its state; recovering",
                    size=size,
                    expected=snap.active_size,
                )
                return self._recover_locked()
            self._truncate_tail_locked(snap, size)
        return snap

    def _open_writer(self, snap: Snapshot) -> None:
        self._close_writer()
        base = snap.active_base
        flags = os.O_RDWR | os.O_CREAT
        self._w_fd = os.open(log_path(self.dir, base), flags, 0o644)
        self._w_index_fd = os.open(index_path(self.dir, base), flags | os.O_APPEND, 0o644)
        self._w_time_fd = os.open(timeindex_path(self.dir, base), flags | os.O_APPEND, 0o644)
        self._w_base = base
        self._w_layout = snap.layout

    def _close_writer(self) -> None:
        for fd in (self._w_fd, self._w_index_fd, self._w_time_fd):
            if fd >= 0:
                os.close(fd)
        self._w_fd = self._w_index_fd = self._w_time_fd = -1
        self._w_layout = -1

    def _truncate_tail_locked(self, snap: Snapshot, size: int) -> None:
        """Drop bytes an appender wrote but never acknowledged (it died mid-append)."""
        self._log.warning(
            "truncating unacknowledged tail",
            file=str(log_path(self.dir, snap.active_base)),
            position=snap.active_size,
            bytes=size - snap.active_size,
        )
        os.ftruncate(self._w_fd, snap.active_size)
        self._trim_indexes(snap.active_base, snap.active_size)
        os.fsync(self._w_fd)

    def _trim_indexes(self, base: int, valid_size: int) -> None:
        """Keep only index entries of batches that start before ``valid_size``."""
        ipath, tpath = index_path(self.dir, base), timeindex_path(self.dir, base)
        raw = ipath.read_bytes() if ipath.exists() else b""
        keep = 0
        for _rel, pos in OFFSET_ENTRY.iter_unpack(raw[: len(raw) - len(raw) % 8]):
            if pos >= valid_size:
                break
            keep += 1
        for path, width in ((ipath, OFFSET_ENTRY.size), (tpath, TIME_ENTRY.size)):
            with open(path, "a+b") as f:
                f.truncate(keep * width)

    # ------------------------------------------------------------------ recovery
    def _recover_locked(self) -> Snapshot:
        """Rebuild the state from the files after an unclean stop (see the class docstring)."""
        self._close_writer()
        previous = self.state.read_unchecked() if self._state_has_magic() else None
        # A journal and .cleaned files are leftovers only if no live process is compacting
        # (a live cleaner holds cleaner.lock while it writes them; it is never waited for
        # here, so the lock order append lock -> cleaner lock cannot deadlock). An odd layout
        # means a swap died under the append lock we now hold: its journal is replayed even
        # if a new cleaner is running (that one finishes old journals before it cleans).
        cleaner_fd = os.open(self.dir / "cleaner.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(cleaner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if previous is not None and previous.layout & 1:
                    finish_interrupted_swap(self.dir)
            else:
                finish_interrupted_swap(self.dir)
                for leftover in self.dir.iterdir():
                    if leftover.suffix in (".cleaned", ".swap", ".tmp"):
                        leftover.unlink()
        finally:
            os.close(cleaner_fd)
        bases = list_segment_bases(self.dir)
        lwm = read_int_file(self.dir / "log-start-offset", bases[0] if bases else 0)
        for base, nxt in itertools.pairwise(bases):
            if nxt <= lwm:
                self._delete_segment_files(base)
        bases = list(list_segment_bases(self.dir))
        if not bases:
            bases = [lwm]
            log_path(self.dir, lwm).touch()
        lwm = max(lwm, bases[0])
        recovery_point = read_int_file(self.dir / "recovery-point", 0)
        start = max(0, bisect.bisect_right(bases, recovery_point) - 1)
        durable = previous.hwm if previous is not None else -1
        expect_after = -1
        leo = bases[0]
        active_size = 0
        max_ts = -1
        last_index_pos = 0
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            if i < start and indexes_look_sane(self.dir, base):
                continue  # fsynced when rolled; rescanned only to rebuild damaged indexes
            path = log_path(self.dir, base)
            fd = os.open(path, os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                entries: list[tuple[int, int, int]] = []
                seg_max = -1
                last_indexed = -(1 << 62)
                valid = 0
                try:
                    for ref in scan_batches(
                        fd,
                        path,
                        0,
                        size,
                        topic=self.topic,
                        partition=self.partition,
                        expect_after=expect_after,
                    ):
                        h = ref.header
                        if (
                            ref.position == 0
                            or ref.position - last_indexed >= self.config.index_interval_bytes
                        ):
                            entries.append((h.base_offset - base, ref.position, seg_max))
                            last_indexed = ref.position
                        seg_max = max(seg_max, h.max_timestamp)
                        expect_after = h.last_offset
                        valid = ref.position + h.size
                except CorruptRecordError as err:
                    # Only the end of the last segment can be a torn tail, and only if it
                    # holds no acknowledged offset (per the state, when there is one) and
                    # nothing intact follows it; anything else is damage to durable data.
                    next_offset = max(expect_after + 1, base)
                    if (
                        not last
                        or next_offset < durable
                        or intact_batch_after(fd, valid, size, expect_after) is not None
                    ):
                        raise
                    self._log.warning(
                        "truncating torn tail found by recovery",
                        file=str(path),
                        position=valid,
                        bytes=size - valid,
                        reason=err.message,
                    )
                    os.ftruncate(fd, valid)
                    os.fsync(fd)
                self._write_indexes(base, entries)
                if last:
                    leo = expect_after + 1 if expect_after >= base else base
                    active_size = valid
                    max_ts = seg_max
                    last_index_pos = entries[-1][1] if entries else 0
                    os.fsync(fd)
            finally:
                os.close(fd)
        active = bases[-1]
        if len(bases) - 1 < start:  # pragma: no cover - start is always <= last index
            raise AssertionError("recovery point past the last segment")
        created = int(os.stat(log_path(self.dir, active)).st_mtime * 1000)
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
            active_created_ms=created if active_size else self.clock(),
            boot=BOOT,
        )
        self.state.write(snap)
        self._open_writer(snap)
        (self._log.info if leo > lwm else self._log.debug)(
            "partition recovered", lwm=lwm, leo=leo, segments=len(bases)
        )
        return snap

    def _state_has_magic(self) -> bool:
        return self.state.has_magic()

    def _write_indexes(self, base: int, entries: Sequence[tuple[int, int, int]]) -> None:
        index = b"".join(OFFSET_ENTRY.pack(rel, pos) for rel, pos, _ in entries)
        times = b"".join(TIME_ENTRY.pack(ts, rel) for rel, _, ts in entries)
        index_path(self.dir, base).write_bytes(index)
        timeindex_path(self.dir, base).write_bytes(times)

    def _delete_segment_files(self, base: int) -> None:
        for path in (
            log_path(self.dir, base),
            index_path(self.dir, base),
            timeindex_path(self.dir, base),
        ):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    # ------------------------------------------------------------------ append
    def append(
        self,
        records: Sequence[RecordTuple],
        *,
        precondition: Precondition | None = None,
        on_appended: AppendHook | None = None,
        atomic: bool = False,
    ) -> AppendResult:
        """Append ``records`` in order and return their offsets once they are durable.

        The records are framed into batches of at most ~1 MiB, written with one ``write``
        and (``flush_policy="always"``) one fsync, then published by moving the HWM. With
        ``atomic=True`` they must fit one batch, which a crash can never split.
        ``precondition(leo)`` runs under the append lock before anything is written, and
        ``on_appended(result)`` under the same lock once the records are published.
        """
        if not records:
            raise InvalidRecordError(
                "nothing to append", topic=self.topic, partition=self.partition
            )
        cfg = self.config
        batches = self._split(records)
        if atomic and len(batches) > 1:
            raise RecordTooLargeError(
                f"an atomic append of {len(records)} records exceeds one batch "
                f"({MAX_BATCH_BYTES} bytes)",
                topic=self.topic,
                partition=self.partition,
            )
        with self.locked() as snap:
            if precondition is not None:
                precondition(snap.leo)
            now = self.clock()
            timestamps: list[int] = []
            leo = snap.leo
            size = snap.active_size
            max_ts = snap.active_max_ts
            last_index_pos = snap.last_index_pos
            active_base = snap.active_base
            created = snap.active_created_ms
            layout = snap.layout
            pending: list[bytes] = []
            pending_start = size
            index_entries: list[bytes] = []
            time_entries: list[bytes] = []
            ts_type = 1 if cfg.log_append_time else 0
            for chunk in batches:
                resolved = [
                    (r[0], r[1], r[2], now if (ts_type or r[3] is None) else r[3]) for r in chunk
                ]
                try:
                    raw = encode_batch(leo, resolved, timestamp_type=ts_type)
                except (TypeError, ValueError, OverflowError, struct.error) as exc:
                    raise InvalidRecordError(
                        f"cannot encode record: {exc}",
                        topic=self.topic,
                        partition=self.partition,
                        offset=leo,
                    ) from None
                if size > 0 and (
                    size + len(raw) > cfg.segment_bytes or now - created >= cfg.segment_ms
                ):
                    self._write_pending(pending_start, pending, index_entries, time_entries)
                    pending, index_entries, time_entries = [], [], []
                    layout = self._roll_locked(leo, now).layout
                    active_base, size, max_ts, last_index_pos, created = leo, 0, -1, 0, now
                    pending_start = 0
                if size == 0 or size - last_index_pos >= cfg.index_interval_bytes:
                    index_entries.append(OFFSET_ENTRY.pack(leo - active_base, size))
                    time_entries.append(TIME_ENTRY.pack(max_ts, leo - active_base))
                    last_index_pos = size
                pending.append(raw)
                size += len(raw)
                stamps = [r[3] for r in resolved]
                max_ts = max(max_ts, *stamps)
                timestamps.extend(stamps)
                leo += len(chunk)
            self._write_pending(pending_start, pending, index_entries, time_entries)
            if cfg.flush_policy == "always":
                os.fdatasync(self._w_fd)
            self.state.write(
                Snapshot(
                    lwm=snap.lwm,
                    hwm=leo,
                    leo=leo,
                    active_base=active_base,
                    active_size=size,
                    layout=layout,
                    active_max_ts=max_ts,
                    last_index_pos=last_index_pos,
                    active_created_ms=created,
                    boot=snap.boot,
                )
            )
            result = AppendResult(leo - len(records), leo - 1, timestamps)
            if on_appended is not None:
                try:
                    on_appended(result)
                except Exception:
                    self._log.exception(
                        "append hook failed (the append itself succeeded)",
                        offset=result.base_offset,
                    )
        self.notifier.bump()
        return result

    def _split(self, records: Sequence[RecordTuple]) -> list[Sequence[RecordTuple]]:
        """Cut ``records`` into batches of at most ``MAX_BATCH_BYTES`` (estimated sizes).

        The fast path sizes every record in one comprehension and finds the cuts by bisect;
        anything unusual (a malformed record, one over ``max_record_bytes``, a keyless record
        for a compacted topic) goes through :meth:`_split_checked`, which names the record.
        """
        try:
            sizes = [
                RECORD_OVERHEAD
                + (0 if k is None else len(k))
                + (0 if v is None else len(v))
                + (_headers_size(h) if h else 0)
                for k, v, h, _ in records
            ]
        except (TypeError, ValueError):
            return self._split_checked(records)
        if max(sizes) > self.config.max_record_bytes or (
            self.config.compact and any(r[0] is None for r in records)
        ):
            return self._split_checked(records)
        if sum(sizes) <= MAX_BATCH_BYTES:
            return [records]
        cumulative = list(itertools.accumulate(sizes))
        batches: list[Sequence[RecordTuple]] = []
        start, before, count = 0, 0, len(records)
        while start < count:
            end = max(bisect.bisect_right(cumulative, before + MAX_BATCH_BYTES, start), start + 1)
            batches.append(records[start:end])
            before = cumulative[end - 1]
            start = end
        return batches

    def _split_checked(self, records: Sequence[RecordTuple]) -> list[Sequence[RecordTuple]]:
        limit = self.config.max_record_bytes
        compact = self.config.compact
        batches = []
        start = 0
        acc = 0
        for i, r in enumerate(records):
            try:
                key, value, headers = r[0], r[1], r[2]
                size = (
                    RECORD_OVERHEAD
                    + (len(key) if key is not None else 0)
                    + (len(value) if value is not None else 0)
                )
                if headers:
                    size += _headers_size(headers)
            except (TypeError, ValueError, IndexError) as exc:
                raise InvalidRecordError(
                    f"record {i} is not (key: bytes|None, value: bytes|None, headers, "
                    f"timestamp): {exc}",
                    topic=self.topic,
                    partition=self.partition,
                ) from None
            if size > limit:
                raise RecordTooLargeError(
                    f"record {i} is {size} bytes; max_record_bytes is {limit}",
                    topic=self.topic,
                    partition=self.partition,
                )
            if compact and key is None:
                raise InvalidRecordError(
                    f"record {i} has no key; a compacted topic needs a key on every record",
                    topic=self.topic,
                    partition=self.partition,
                )
            if acc + size > MAX_BATCH_BYTES and i > start:
                batches.append(records[start:i])
                start, acc = i, 0
            acc += size
        batches.append(records[start:])
        return batches

    def _write_pending(
        self,
        start: int,
        pending: list[bytes],
        index_entries: list[bytes],
        time_entries: list[bytes],
    ) -> None:
        if not pending:
            return
        # One vectored write of the batches as they are: joining them first would copy
        # every appended byte once more.
        buffers: list[bytes | memoryview] = list(pending)
        pos = start
        while buffers:
            written = os.pwritev(self._w_fd, buffers[:_IOV_MAX], pos)
            pos += written
            done = 0
            while done < len(buffers) and written >= len(buffers[done]):
                written -= len(buffers[done])
                done += 1
            del buffers[:done]
            if written:
                buffers[0] = memoryview(buffers[0])[written:]
        if index_entries:
            os.write(self._w_index_fd, b"".join(index_entries))
            os.write(self._w_time_fd, b"".join(time_entries))

    def _roll_locked(self, new_base: int, now: int) -> Snapshot:
        """Close the active segment durably, start a new one at ``new_base`` (the LEO: every
        record before it is now fsynced), publish it and return the published state."""
        os.fsync(self._w_fd)
        os.fsync(self._w_index_fd)
        os.fsync(self._w_time_fd)
        # An odd layout until the caller publishes the new active segment (layout + 2): if we
        # die in between, the next lock holder finds a segment file the state does not know
        # and recovers (see _sync_locked) instead of appending behind it.
        current = self.state.read()
        self.state.write(current._replace(layout=current.layout | 1))
        for path in (
            log_path(self.dir, new_base),
            index_path(self.dir, new_base),
            timeindex_path(self.dir, new_base),
        ):
            path.touch()
        fsync_dir(self.dir)
        write_atomic(self.dir / "recovery-point", str(new_base).encode())
        published = current._replace(
            leo=new_base,
            hwm=new_base,
            active_base=new_base,
            active_size=0,
            layout=(current.layout | 1) + 1,
            active_max_ts=-1,
            last_index_pos=0,
            active_created_ms=now,
        )
        self.state.write(published)
        self._open_writer(published)
        self._log.debug("segment rolled", base=new_base)
        return published

    def roll(self) -> None:
        """Roll the active segment now if it holds any record (used by retention and tests)."""
        with self.locked() as snap:
            if snap.active_size == 0:
                return
            self._roll_locked(snap.leo, self.clock())

    # ------------------------------------------------------------------ read
    def offsets(self) -> Snapshot:
        return self.state.read()

    def _reader_refresh(self, layout: int) -> None:
        if layout == self._r_layout:
            return
        for fd in self._r_fds.values():
            os.close(fd)
        self._r_fds.clear()
        self._r_indexes.clear()
        self._r_bases = list_segment_bases(self.dir)
        self._r_layout = layout

    def _reader_fd(self, base: int, snap: Snapshot) -> int:
        fd = self._r_fds.get(base)
        if fd is None:
            fd = os.open(log_path(self.dir, base), os.O_RDONLY)
            self._r_fds[base] = fd
            self._check_layout(snap)
        return fd

    def _check_layout(self, snap: Snapshot) -> None:
        """Files opened since ``snap`` belong to its layout only if the layout is unchanged."""
        if self.state.read().layout != snap.layout:
            raise _LayoutChangedError

    def _segment_for(self, offset: int) -> int:
        i = bisect.bisect_right(self._r_bases, offset) - 1
        return self._r_bases[max(i, 0)]

    def _start_position(self, base: int, offset: int, snap: Snapshot) -> int:
        index = self._r_indexes.get(base)
        if index is None:
            index = OffsetIndex(index_path(self.dir, base))
            self._check_layout(snap)
            self._r_indexes[base] = index
        elif base == snap.active_base:
            index.refresh()
        limit = snap.active_size if base == snap.active_base else 1 << 62
        return index.lookup(offset - base, limit)

    def read(
        self,
        offset: int,
        *,
        max_bytes: int = MAX_BATCH_BYTES,
        cursor: Cursor | None = None,
        upto: int | None = None,
    ) -> tuple[list[Record], Cursor | None]:
        """Records from ``offset`` (or the next one present), below the HWM (or ``upto``).

        Returns at least one batch's records if any exist, and stops once ``max_bytes`` of
        batches were read. The returned cursor makes the next sequential read cheap.
        Raises :class:`OffsetOutOfRangeError` below the low-water mark or past the LEO.
        """
        for attempt in range(200):
            with self._r_lock:
                snap = self.state.read()
                if not snap.layout & 1:
                    try:
                        return self._read_locked(offset, max_bytes, cursor, snap, upto)
                    except (FileNotFoundError, _LayoutChangedError):
                        self._r_layout = -1  # segments changed under us: reload and retry
                        cursor = None
                        continue
            # A roll or a compaction swap is changing the segment files: wait a moment; if it
            # lasts, wait for the append lock, whose next holder repairs a change left half
            # done by a process that died.
            if attempt < 10:
                time.sleep(0.001)
            else:
                with self.locked():
                    pass
        raise CorruptRecordError(
            "segment layout kept changing during a read",
            topic=self.topic,
            partition=self.partition,
            offset=offset,
        )

    def _read_locked(
        self, offset: int, max_bytes: int, cursor: Cursor | None, snap: Snapshot, upto: int | None
    ) -> tuple[list[Record], Cursor | None]:
        if offset < snap.lwm or offset > snap.leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range [{snap.lwm}, {snap.leo}]",
                topic=self.topic,
                partition=self.partition,
                offset=offset,
                lwm=snap.lwm,
                leo=snap.leo,
            )
        end_offset = snap.hwm if upto is None else min(upto, snap.hwm)
        if offset >= end_offset:
            return [], cursor
        self._reader_refresh(snap.layout)
        if cursor is not None and cursor.layout == snap.layout and cursor.offset == offset:
            base, position = cursor.segment, cursor.position
        else:
            base = self._segment_for(offset)
            position = self._start_position(base, offset, snap)
        out: list[Record] = []
        used = 0
        topic, partition = self.topic, self.partition
        while True:
            fd = self._reader_fd(base, snap)
            path_limit = snap.active_size if base == snap.active_base else os.fstat(fd).st_size
            want = max(min(max_bytes - used, path_limit - position), HEADER_SIZE)
            buf = os.pread(fd, want, position) if position < path_limit else b""
            rel = 0
            done = False
            while rel + HEADER_SIZE <= len(buf):
                # Every batch passed over is checked (CRC included), even one skipped on the
                # way to ``offset`` or past the end: a damaged batch is never silently
                # stepped over. Records before a damaged batch are returned first; the next
                # read starts at the damaged batch and raises.
                h = parse_header(buf, rel)
                problem = check_header(h)
                if problem is None and position + rel + h.size > path_limit:
                    problem = f"batch of {h.size} bytes runs past the end of the data"
                if problem is not None:
                    if out:
                        done = True
                        break
                    raise corrupt(
                        problem,
                        log_path(self.dir, base),
                        position + rel,
                        h.base_offset,
                        topic,
                        partition,
                    )
                if rel + h.size > len(buf):
                    if out:  # the next batch does not fit what is left: return these
                        done = True
                        break
                    buf = os.pread(fd, h.size, position + rel)
                    position += rel
                    rel = 0
                    if len(buf) < h.size:
                        raise corrupt(
                            "truncated batch",
                            log_path(self.dir, base),
                            position,
                            h.base_offset,
                            topic,
                            partition,
                        )
                if not batch_crc_ok(buf, rel, h):
                    if out:
                        done = True
                        break
                    raise corrupt(
                        "CRC32C mismatch",
                        log_path(self.dir, base),
                        position + rel,
                        h.base_offset,
                        topic,
                        partition,
                    )
                if h.base_offset >= end_offset:
                    done = True
                    break
                if h.next_offset > offset:
                    try:
                        records = decode_records(
                            buf,
                            rel + HEADER_SIZE,
                            rel + h.size,
                            h.base_offset,
                            h.base_timestamp,
                            h.timestamp_type,
                            topic,
                            partition,
                            offset,
                            Record,
                        )
                    except ValueError as exc:
                        if out:
                            done = True
                            break
                        raise corrupt(
                            f"malformed record: {exc}",
                            log_path(self.dir, base),
                            position + rel,
                            h.base_offset,
                            topic,
                            partition,
                        ) from None
                    if h.next_offset > end_offset:  # ``upto`` falls inside this batch
                        records = [r for r in records if r.offset < end_offset]
                    out.extend(records)
                    offset = h.next_offset
                rel += h.size
                if out:  # batches skipped before the first record do not count
                    used += h.size
                if used >= max_bytes:
                    done = True
                    break
            if rel == 0 and not done and buf and not out and len(buf) < HEADER_SIZE:
                raise corrupt(
                    "truncated batch header",
                    log_path(self.dir, base),
                    position,
                    None,
                    topic,
                    partition,
                )
            position += rel
            if out and (done or used >= max_bytes or rel + HEADER_SIZE > len(buf)):
                if position >= path_limit and base != snap.active_base:
                    nxt = self._next_segment(base)
                    if nxt is not None:
                        return out, Cursor(snap.layout, nxt, 0, offset)
                return out, Cursor(snap.layout, base, position, offset)
            if done:
                return out, Cursor(snap.layout, base, position, offset)
            if position >= path_limit or not buf:
                nxt = self._next_segment(base)
                if nxt is None:
                    return out, Cursor(snap.layout, base, position, offset)
                base, position = nxt, 0

    def _next_segment(self, base: int) -> int | None:
        i = bisect.bisect_right(self._r_bases, base)
        return self._r_bases[i] if i < len(self._r_bases) else None

    def offset_for_time(self, timestamp: int) -> int | None:
        """The earliest offset whose record timestamp is ``>= timestamp``, or ``None``."""
        snap = self.state.read()
        with self._r_lock:
            self._reader_refresh(snap.layout)
            bases = list(self._r_bases)
        for base in bases:
            if base < snap.lwm and self._next_after(bases, base) <= snap.lwm:
                continue
            start_rel = TimeIndex(timeindex_path(self.dir, base)).start_for(timestamp)
            offset = max(base + start_rel, snap.lwm)
            nxt = self._next_after(bases, base)
            while offset < min(nxt, snap.hwm):
                records, _ = self.read(offset, upto=nxt)
                if not records:
                    break
                for r in records:
                    if r.timestamp >= timestamp:
                        return r.offset
                offset = records[-1].offset + 1
        return None

    @staticmethod
    def _next_after(bases: list[int], base: int) -> int:
        i = bisect.bisect_right(bases, base)
        return bases[i] if i < len(bases) else 1 << 62

    # ------------------------------------------------------------------ inspection
    def segments(self) -> list[SegmentInfo]:
        """The segments now on disk, oldest first, with their sizes in bytes."""
        infos = []
        for base in list_segment_bases(self.dir):
            with contextlib.suppress(FileNotFoundError):
                infos.append(SegmentInfo(base, log_path(self.dir, base).stat().st_size))
        return infos

    def segment_max_timestamp(self, base: int, end: int) -> int:
        """Largest record timestamp of a closed segment (-1 if empty), from its last batches."""
        path = log_path(self.dir, base)
        index = OffsetIndex(index_path(self.dir, base))
        times = TimeIndex(timeindex_path(self.dir, base))
        start = index.positions[-1] if len(index.positions) else 0
        best = times.timestamps[-1] if times.timestamps else -1
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for ref in scan_batches(
                fd, path, start, size, topic=self.topic, partition=self.partition, verify_crc=False
            ):
                if ref.header.base_offset >= end:
                    break
                best = max(best, ref.header.max_timestamp)
        finally:
            os.close(fd)
        return best

    def verify(self) -> list[CorruptRecordError]:
        """Check every batch of every segment (CRC, framing, offset order); return problems."""
        problems: list[CorruptRecordError] = []
        snap = self.state.read()
        expect_after = -1
        for base in list_segment_bases(self.dir):
            path = log_path(self.dir, base)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                end = snap.active_size if base == snap.active_base else os.fstat(fd).st_size
                for ref in scan_batches(
                    fd,
                    path,
                    0,
                    end,
                    topic=self.topic,
                    partition=self.partition,
                    expect_after=expect_after,
                ):
                    expect_after = ref.header.last_offset
            except CorruptRecordError as err:
                problems.append(err)
            finally:
                os.close(fd)
        return problems

    def close(self) -> None:
        with self._thread_lock:
            self._close_writer()
            with self._r_lock:
                for fd in self._r_fds.values():
                    os.close(fd)
                self._r_fds.clear()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            self.state.close()


def _headers_size(headers: Sequence[Header]) -> int:
    """An upper bound of the bytes ``headers`` take in a record (4 bytes per name char)."""
    return sum(8 + len(n) * 4 + (len(v) if v is not None else 0) for n, v in headers)
