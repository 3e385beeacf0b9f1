"""The read path of a partition: records from an offset below the high-water mark, through the
segment files, their indexes and a sequential reader's cursor; time lookups.

Invariants: a read never returns a record at or above the high-water mark (upto caps it
lower) nor below the low-water mark (OffsetOutOfRangeError); it reads a segment layout
only while it is even (a roll or a compaction swap makes it odd) and starts again when it
changed under it; offsets missing in the middle of a never-compacted log are reported, not
skipped (CorruptRecordError). Readers hold only the reader lock, never the append lock:
a read can wait for a writer's layout change but never takes part in it.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from eventlane._pauses import PAUSE
from eventlane.errors import CorruptRecordError, OffsetOutOfRangeError, UnknownTopicError
from eventlane.log.embedded.batch import (
    HEADER_SIZE,
    BatchHeader,
    batch_crc_ok,
    check_header,
    decode_records,
    parse_header,
)
from eventlane.log.embedded.check import checked_time_start
from eventlane.log.embedded.fds import FDS, next_use
from eventlane.log.embedded.segment import (
    OffsetIndex,
    corrupt,
    index_path,
    list_segment_bases,
    log_path,
)
from eventlane.log.embedded.state import PartitionState, Snapshot
from eventlane.log.record import Record
from eventlane.log.types import Cursor, StoredBatch
from eventlane.observability import Logger, get_logger

log = get_logger("eventlane.log")


MAX_BATCH_BYTES = 1 << 20


class _LayoutChangedError(Exception):
    """Internal: the segment list changed while a reader was opening files; retry."""


class SegmentCursor(NamedTuple):
    """This engine's :data:`~eventlane.log.types.Cursor`: the segment layout it was read
    under (a roll or a compaction changes it, and the cursor is then ignored), the segment
    base offset, the byte position of the next batch in it and the next offset."""

    layout: int
    segment: int
    position: int
    offset: int


def _reported_offset(h: BatchHeader, problem: str, expect: int, floor: int) -> int:
    """The offset to name for a bad batch: its own if its header is believable, else the
    one the log expected there (a zero-filled region is not "at offset 0")."""
    if check_header(h) is not None or h.base_offset < floor:
        return expect if expect >= 0 else floor
    return expect if problem.startswith("offsets [") else h.base_offset


class _ReadPath:
    """The methods of :class:`~eventlane.log.embedded.partition.Partition` described above.

    The partition sets the state below in its ``__init__``; the ``_r_*`` reader cache is
    owned by whoever holds ``_r_lock``."""

    dir: Path
    topic: str
    partition: int
    state: PartitionState
    last_used: int
    _log: Logger
    _r_layout: int
    _r_bases: list[int]
    _r_fds: dict[int, int]
    _r_indexes: dict[int, OffsetIndex]
    _r_contiguous: bool
    _r_lock: threading.Lock
    _wait_for_writer: Callable[[], None]
    _deleted_error: Callable[[], UnknownTopicError]
    contiguous: Callable[[], bool]
    release_fds: Callable[[], bool]

    def _reader_refresh(self, layout: int) -> None:
        if layout == self._r_layout:
            return
        for fd in self._r_fds.values():
            os.close(fd)
        self._r_fds.clear()
        self._r_indexes.clear()
        self._r_bases = list_segment_bases(self.dir)
        self._r_contiguous = self.contiguous()
        self._r_layout = layout

    def _reader_fd(self, base: int, snap: Snapshot) -> int:
        fd = self._r_fds.get(base)
        if fd is None:
            if not self._r_fds:
                FDS.opened(self)
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

    def _start_entry(self, base: int, offset: int, snap: Snapshot) -> tuple[int, int]:
        """``(offset of the indexed batch, its position)`` to start a scan for ``offset``
        from, or ``(-1, 0)`` to scan the segment from its start."""
        index = self._r_indexes.get(base)
        if index is None:
            index = OffsetIndex(index_path(self.dir, base))
            self._check_layout(snap)
            self._r_indexes[base] = index
        elif base == snap.active_base and not (
            index.positions and index.positions[-1] == snap.last_index_pos
        ):  # entries are written before the state names them: refresh only when behind
            index.refresh()
        limit = snap.active_size if base == snap.active_base else 1 << 62
        rel, position = index.entry(offset - base, limit)
        return (-1, 0) if rel < 0 else (base + rel, position)

    def read(
        self,
        offset: int,
        *,
        max_bytes: int = MAX_BATCH_BYTES,
        cursor: Cursor | None = None,
        upto: int | None = None,
        in_flight: bool = False,
    ) -> tuple[list[Record], Cursor | None]:
        """Records from ``offset`` (or the next one present), below the HWM (or ``upto``);
        ``in_flight=True``: below the LEO, records not yet durable included (the key
        index's catch-up under the append lock, nobody else).

        Returns at least one batch's records if any exist, and stops once ``max_bytes`` of
        batches were read. The returned cursor makes the next sequential read cheap.
        Raises :class:`OffsetOutOfRangeError` below the low-water mark or past the LEO.
        """
        records, at = self._read(offset, max_bytes, cursor, upto, in_flight, raw=False)
        return records, at

    def end_cursor(self) -> tuple[int, Cursor]:
        """The log end offset and a cursor there: a read from it starts at the next batch
        written (meant for the key index, under the append lock, just after an append)."""
        snap = self.state.read()
        return snap.leo, Cursor(
            SegmentCursor(snap.layout, snap.active_base, snap.active_size, snap.leo)
        )

    def read_batches(
        self, offset: int, *, max_bytes: int = MAX_BATCH_BYTES, upto: int | None = None
    ) -> list[StoredBatch]:
        """:meth:`read` without building records: the stored batches holding the records
        :meth:`read` would return, as stored (each CRC-checked, its framing checked as
        :meth:`read` checks it), in offset order. A batch is left out when none of its
        records falls in ``[offset, upto or HWM)``; the first and last returned may hold
        records outside it (the reader skips those). Only a batch cut by that range has
        its records decoded (to know whether it holds one inside)."""
        batches, _ = self._read(offset, max_bytes, None, upto, False, raw=True)
        return batches

    def _read(
        self,
        offset: int,
        max_bytes: int,
        cursor: Cursor | None,
        upto: int | None,
        in_flight: bool,
        *,
        raw: bool,
    ) -> tuple[list[Any], Cursor | None]:
        if self.state.deleted:
            raise self._deleted_error()
        self.last_used = next_use()
        changed = waited = 0
        while changed < 200:
            with self._r_lock:
                snap = self.state.read()
                if not snap.layout & 1:
                    if PAUSE is not None:  # fault injection: a reader descheduled mid-read
                        PAUSE("partition.read")
                    try:
                        limit = snap.leo if in_flight else snap.hwm
                        records, at = self._read_locked(
                            offset,
                            max_bytes,
                            cursor if isinstance(cursor, SegmentCursor) else None,
                            snap,
                            upto,
                            limit,
                            raw,
                        )
                        return records, None if at is None else Cursor(at)
                    except (FileNotFoundError, _LayoutChangedError):
                        self._r_layout = -1  # segments changed under us: reload and retry
                        cursor = None
                        changed += 1
                        continue
            # A roll or a compaction swap is changing the segment files: wait a moment; if it
            # lasts, repair a change left half done by a process that died (never waiting
            # for the append lock: see _wait_for_writer), else wait on for the live one.
            waited += 1
            if waited < 10:
                time.sleep(0.001)
            else:
                self._wait_for_writer()
        raise CorruptRecordError(
            "segment layout kept changing during a read",
            topic=self.topic,
            partition=self.partition,
            offset=offset,
        )

    def _read_locked(
        self,
        offset: int,
        max_bytes: int,
        cursor: SegmentCursor | None,
        snap: Snapshot,
        upto: int | None,
        limit: int,
        raw: bool = False,
    ) -> tuple[list[Any], SegmentCursor | None]:
        """:meth:`read`'s records (``raw``: :meth:`read_batches`' batches) under ``snap``."""
        if offset < snap.lwm or offset > snap.leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range [{snap.lwm}, {snap.leo}]",
                topic=self.topic,
                partition=self.partition,
                offset=offset,
                lwm=snap.lwm,
                leo=snap.leo,
            )
        end_offset = limit if upto is None else min(upto, limit)
        if offset >= end_offset:
            return [], cursor
        self._reader_refresh(snap.layout)
        strict = self._r_contiguous
        # ``expect``: the exact base offset the next batch must have (-1: only "after
        # ``floor``"). An index entry names the batch it points at; without compaction every
        # batch starts where the previous one ended, and each segment where the last ended.
        if cursor is not None and cursor.layout == snap.layout and cursor.offset == offset:
            base, position = cursor.segment, cursor.position
            expect = offset if strict else -1
            floor = offset
            from_index = False
        else:
            base = self._segment_for(offset)
            if offset < base:  # below the first segment, yet not below the low-water mark
                # ... that ``snap`` had: files listed after retention deleted them belong to
                # a later layout (read again: then below the new mark, out of range)
                self._check_layout(snap)
                raise corrupt(
                    f"offsets [{offset}, {base}) are missing: no segment holds them",
                    log_path(self.dir, base),
                    0,
                    offset,
                    self.topic,
                    self.partition,
                )
            expect, position = self._start_entry(base, offset, snap)
            floor = base
            from_index = expect >= 0
            if expect < 0 and strict:
                expect = base
        nxt_base = self._next_segment(base)
        limit = (1 << 62) if nxt_base is None else nxt_base
        out: list[Any] = []  # Records, or StoredBatches when ``raw``
        used = 0
        topic, partition = self.topic, self.partition
        skipped: CorruptRecordError | None = None  # a damaged batch stepped over, unconfirmed
        while True:
            fd = self._reader_fd(base, snap)
            path_limit = snap.active_size if base == snap.active_base else os.fstat(fd).st_size
            want = max(min(max_bytes - used, path_limit - position), HEADER_SIZE)
            buf = os.pread(fd, want, position) if position < path_limit else b""
            rel = 0
            done = False
            while rel + HEADER_SIZE <= len(buf):
                # Every batch passed over is checked (CRC and offsets included): a damaged
                # batch is never silently stepped over, except one wholly before ``offset``
                # whose successor proves where it ended (only reads of it fail). Records
                # before a damaged batch are returned first; the next read raises.
                h = parse_header(buf, rel)
                after = h.base_offset + h.last_offset_delta + 1  # h.next_offset
                problem = check_header(h)
                if problem is None and position + rel + h.size > path_limit:
                    problem = f"batch of {h.size} bytes runs past the end of the data"
                if problem is None:
                    if expect >= 0 and h.base_offset != expect:
                        problem = (
                            f"offsets [{expect}, {h.base_offset}) are missing before this batch"
                            if expect < h.base_offset
                            else f"batch at offset {h.base_offset} where {expect} was expected"
                        )
                    elif h.base_offset < floor:
                        problem = f"offset {h.base_offset} does not follow {floor - 1}"
                    elif after > limit:
                        problem = f"batch ends at offset {after - 1}, inside the next segment"
                if problem is not None and from_index:
                    # The index entry does not point at the batch it names: derived data is
                    # wrong, the log may be fine. Scan this segment from its start instead.
                    self._log.warning(
                        "offset index entry does not match its batch; scanning the segment",
                        file=str(index_path(self.dir, base)),
                        position=position + rel,
                        offset=expect,
                        problem=problem,
                    )
                    position, rel, from_index = 0, 0, False
                    expect = base if strict else -1
                    floor = base
                    buf = os.pread(fd, want, 0)
                    continue
                from_index = False
                if problem is not None:
                    if skipped is not None:  # its successor does not confirm its framing
                        raise skipped
                    if out:
                        done = True
                        break
                    raise corrupt(
                        problem,
                        log_path(self.dir, base),
                        position + rel,
                        _reported_offset(h, problem, expect, floor),
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
                    if skipped is None and after <= offset and strict:
                        # wholly before what was asked: step over it, provided the next batch
                        # starts where this header says it ends and is intact
                        skipped = corrupt(
                            "CRC32C mismatch",
                            log_path(self.dir, base),
                            position + rel,
                            h.base_offset,
                            topic,
                            partition,
                        )
                        expect = floor = after
                        rel += h.size
                        continue
                    raise corrupt(
                        "CRC32C mismatch",
                        log_path(self.dir, base),
                        position + rel,
                        h.base_offset,
                        topic,
                        partition,
                    )
                if skipped is not None:
                    self._log.warning(
                        "stepped over a damaged batch before the requested offset",
                        file=skipped.path,
                        position=skipped.position,
                        offset=skipped.offset,
                    )
                    skipped = None
                expect = after if strict else -1
                floor = after
                if h.base_offset >= end_offset:
                    done = True
                    break
                if after > offset and raw and offset <= h.base_offset and after <= end_offset:
                    if h.record_count:  # wholly inside the range: no record is decoded
                        out.append(StoredBatch(buf, rel, rel + h.size))
                    offset = after
                elif after > offset:
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
                    if after > end_offset:  # ``upto`` falls inside this batch
                        records = [r for r in records if r.offset < end_offset]
                    if not raw:
                        out.extend(records)
                    elif records:
                        out.append(StoredBatch(buf, rel, rel + h.size))
                    offset = after
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
                    expect if expect >= 0 else floor,
                    topic,
                    partition,
                )
            position += rel
            if skipped is not None and (done or position >= path_limit or not buf):
                raise skipped
            if out and (done or used >= max_bytes or rel + HEADER_SIZE > len(buf)):
                if (
                    position >= path_limit
                    and base != snap.active_base
                    and nxt_base is not None
                    and self._segment_end_ok(base, nxt_base, floor, strict, snap)
                ):
                    return out, SegmentCursor(snap.layout, nxt_base, 0, offset)
                return out, SegmentCursor(snap.layout, base, position, offset)
            if done:
                return out, SegmentCursor(snap.layout, base, position, offset)
            if position >= path_limit or not buf:
                if nxt_base is None:
                    return out, SegmentCursor(snap.layout, base, position, offset)
                if not self._segment_end_ok(base, nxt_base, floor, strict, snap):
                    if out:
                        return out, SegmentCursor(snap.layout, base, position, offset)
                    raise corrupt(
                        f"offsets [{floor}, {nxt_base}) are missing between segments {base} and"
                        f" {nxt_base} (a segment or the end of one was lost)",
                        log_path(self.dir, base),
                        position,
                        floor,
                        topic,
                        partition,
                    )
                base, position = nxt_base, 0
                expect = base if strict else -1
                floor = base
                nxt_base = self._next_segment(base)
                limit = (1 << 62) if nxt_base is None else nxt_base

    @staticmethod
    def _segment_end_ok(base: int, nxt: int, reached: int, strict: bool, snap: Snapshot) -> bool:
        """Without compaction, a closed segment ends where the next one begins."""
        return not strict or reached == nxt or base < snap.lwm

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
            start_rel = checked_time_start(
                self.dir,
                base,
                timestamp,
                topic=self.topic,
                partition=self.partition,
                logger=self._log,
            )
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
