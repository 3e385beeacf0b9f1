"""Segment files: a partition's log split into pieces named by their base offset.

A partition directory holds, for each segment with base offset ``B`` (zero-padded to 20
digits, as Kafka does)::

    B.log        concatenated record batches (format: :mod:`eventlane.log.embedded.batch`)
    B.index      sparse offset index: big-endian (uint32 offset - B, uint32 file position)
                 entries, one for the first batch of the segment and then one for the first
                 batch starting at least ``index_interval_bytes`` after the previous entry
    B.timeindex  time index: big-endian (int64 largest timestamp of the segment's records
                 *before* the batch, uint32 offset - B) entries, written with each offset
                 index entry; the timestamps never decrease, so a bisect finds where records
                 at or after a time can start

The indexes are derived data: they are never fsynced on their own account, recovery rebuilds
them from the ``.log`` file, and a reader that finds an entry past the valid end ignores it.
Only the last segment (the *active* one) is ever appended to.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import mmap
import os
import struct
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from eventlane.errors import CorruptRecordError
from eventlane.log.embedded.batch import (
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    batch_crc_ok,
    check_header,
    parse_header,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
SCAN_CHUNK = 1 << 20
_BIG_ENDIAN_HOST = array("I", [1]).tobytes()[0] == 0


def segment_stem(base: int) -> str:
    return f"{base:020d}"


def log_path(directory: Path, base: int) -> Path:
    return directory / (segment_stem(base) + LOG_SUFFIX)


def index_path(directory: Path, base: int) -> Path:
    return directory / (segment_stem(base) + INDEX_SUFFIX)


def timeindex_path(directory: Path, base: int) -> Path:
    return directory / (segment_stem(base) + TIMEINDEX_SUFFIX)


def list_segment_bases(directory: Path) -> list[int]:
    """Base offsets of the ``*.log`` segments in ``directory``, ascending."""
    bases = []
    for name in os.listdir(directory):
        if name.endswith(LOG_SUFFIX) and len(name) == 20 + len(LOG_SUFFIX):
            stem = name[:20]
            if stem.isdigit():
                bases.append(int(stem))
    bases.sort()
    return bases


def _u32_array(raw: bytes) -> array[int]:
    values = array("I")
    values.frombytes(raw[: len(raw) - len(raw) % 4])
    if not _BIG_ENDIAN_HOST:
        values.byteswap()
    return values


class OffsetIndex:
    """An in-memory copy of a segment's ``.index``, extendable as the file grows.

    ``lookup(relative)`` returns the file position of the last indexed batch whose relative
    base offset is ``<= relative`` (0 when none is), where a scan for that offset can start.
    """

    __slots__ = ("_loaded_bytes", "offsets", "path", "positions")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: array[int] = array("I")
        self.positions: array[int] = array("I")
        self._loaded_bytes = 0
        self.refresh()

    def refresh(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._loaded_bytes)
                raw = f.read()
        except FileNotFoundError:
            return
        raw = raw[: len(raw) - len(raw) % OFFSET_ENTRY.size]
        if not raw:
            return
        pairs = _u32_array(raw)
        self.offsets.extend(pairs[0::2])
        self.positions.extend(pairs[1::2])
        self._loaded_bytes += len(raw)

    def lookup(self, relative: int, limit: int) -> int:
        """Start position for ``relative``, ignoring entries at or past ``limit`` bytes."""
        return self.entry(relative, limit)[1]

    def entry(self, relative: int, limit: int) -> tuple[int, int]:
        """``(relative offset, position)`` of the entry to start a scan for ``relative``
        from, ignoring entries at or past ``limit`` bytes; ``(-1, 0)`` when none applies.
        The caller checks that the batch found there has that offset (derived data can be
        wrong)."""
        i = bisect.bisect_right(self.offsets, relative) - 1
        while i >= 0 and self.positions[i] >= limit:
            i -= 1
        return (-1, 0) if i < 0 else (self.offsets[i], self.positions[i])


class TimeIndex:
    """An in-memory copy of a segment's ``.timeindex`` (see the module docstring)."""

    __slots__ = ("offsets", "timestamps")

    def __init__(self, path: Path) -> None:
        self.timestamps: list[int] = []
        self.offsets: list[int] = []
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        for ts, rel in TIME_ENTRY.iter_unpack(raw[: len(raw) - len(raw) % TIME_ENTRY.size]):
            self.timestamps.append(ts)
            self.offsets.append(rel)

    def start_for(self, timestamp: int) -> int:
        """Relative offset from which records with ``ts >= timestamp`` may start (0 if none)."""
        i = bisect.bisect_left(self.timestamps, timestamp) - 1
        return 0 if i < 0 else self.offsets[i]


class BatchRef(NamedTuple):
    """A batch found by a scan: its header and where it starts in the segment file."""

    position: int
    header: BatchHeader


def corrupt(
    message: str, path: Path, position: int, offset: int | None, topic: str, partition: int
) -> CorruptRecordError:
    return CorruptRecordError(
        message, topic=topic, partition=partition, offset=offset, path=path, position=position
    )


def scan_batches(
    fd: int,
    path: Path,
    start: int,
    end: int,
    *,
    topic: str,
    partition: int,
    verify_crc: bool = True,
    expect_after: int = -1,
    contiguous: bool = False,
    limit: int = 1 << 62,
) -> Iterator[BatchRef]:
    """Yield the batches in ``[start, end)`` of an open segment, checking each one.

    Raises :class:`CorruptRecordError` naming the file, byte position and offset of the
    first batch that is malformed, fails its CRC, or does not come after ``expect_after``
    (offsets must strictly increase; with ``contiguous``, each batch must start right after
    the previous one, as in a partition never compacted), or ends at or past ``limit`` (the
    next segment's base). A batch that runs past ``end`` is reported as malformed too:
    callers pass the end of the data they know to be complete. A bad header is reported at
    the offset the log expected there, not at whatever its bytes say (a zero-filled region
    is not "at offset 0").
    """
    pos = start
    buf = b""
    buf_start = start
    while pos < end:
        rel = pos - buf_start
        if rel + HEADER_SIZE > len(buf):
            buf = os.pread(fd, max(SCAN_CHUNK, HEADER_SIZE), pos)
            buf_start, rel = pos, 0
            if len(buf) < HEADER_SIZE:
                raise corrupt("truncated batch header", path, pos, None, topic, partition)
        header = parse_header(buf, rel)
        problem = check_header(header)
        offset = header.base_offset if problem is None else expect_after + 1
        if problem is None and pos + header.size > end:
            problem = f"batch of {header.size} bytes runs past the end of the data ({end})"
        if problem is None and header.base_offset <= expect_after:
            problem = f"offset {header.base_offset} does not follow {expect_after}"
        if problem is None and contiguous and header.base_offset != expect_after + 1:
            problem = f"offsets [{expect_after + 1}, {header.base_offset}) are missing"
            offset = expect_after + 1
        if problem is None and header.last_offset >= limit:
            problem = f"batch ends at offset {header.last_offset}, inside the next segment"
        if problem is not None:
            raise corrupt(problem, path, pos, max(offset, 0), topic, partition)
        if rel + header.size > len(buf):
            buf = os.pread(fd, max(SCAN_CHUNK, header.size), pos)
            buf_start, rel = pos, 0
            if len(buf) < header.size:
                raise corrupt("truncated batch", path, pos, header.base_offset, topic, partition)
        if verify_crc and not batch_crc_ok(buf, rel, header):
            raise corrupt("CRC32C mismatch", path, pos, header.base_offset, topic, partition)
        yield BatchRef(pos, header)
        expect_after = header.last_offset
        pos += header.size


def intact_batch_after(fd: int, start: int, end: int, expect_after: int) -> int | None:
    """Position of the first intact batch starting in ``(start, end)``, or ``None``.

    Intact: its header passes the checks, it ends by ``end``, its offsets come after
    ``expect_after`` and its CRC matches. Recovery uses this to tell a torn tail from damage
    in the middle of the data: a writer killed mid-append leaves only a prefix of its write,
    so nothing intact can follow a torn batch. Slow (it tries every position holding the
    magic byte); only called once a batch has already failed.
    """
    if end - start <= HEADER_SIZE:
        return None
    magic = bytes([MAGIC])
    magic_at = 12  # the magic byte follows base_offset (int64) and batch_length (int32)
    with mmap.mmap(fd, end, access=mmap.ACCESS_READ) as data, memoryview(data) as view:
        found = data.find(magic, start + 1 + magic_at)
        while found != -1 and found - magic_at + HEADER_SIZE <= end:
            pos = found - magic_at
            header = parse_header(view, pos)
            if (
                check_header(header) is None
                and pos + header.size <= end
                and header.base_offset > expect_after
                and batch_crc_ok(view, pos, header)
            ):
                return pos
            found = data.find(magic, found + 1)
    return None


def never_written(fd: int, position: int, end: int) -> bool:
    """Whether the batch header at ``position`` reads as zeros: a sector that never reached
    the disk (a power loss kept later sectors of an unsynced write and lost this one), not
    a flipped bit. A header cut short by ``end`` is not: that is a torn tail already."""
    if end - position < HEADER_SIZE:
        return False
    return not any(os.pread(fd, HEADER_SIZE, position))


def indexes_look_sane(directory: Path, base: int) -> bool:
    """Whether a segment's ``.index`` and ``.timeindex`` pass cheap structural checks.

    Both exist and hold whole entries, as many in one as in the other and for the same
    offsets; offsets and positions strictly increase and stay inside the ``.log`` file, whose
    first batch is indexed at position 0 with the time ``-1``; timestamps never decrease; and
    the last entry points at a batch header with the entry's offset. Recovery rebuilds the
    indexes of a segment that fails (they are derived data).
    """
    try:
        raw = index_path(directory, base).read_bytes()
        raw_times = timeindex_path(directory, base).read_bytes()
        size = log_path(directory, base).stat().st_size
    except FileNotFoundError:
        return False
    if len(raw) % OFFSET_ENTRY.size or len(raw_times) % TIME_ENTRY.size:
        return False
    entries = list(OFFSET_ENTRY.iter_unpack(raw))
    times = list(TIME_ENTRY.iter_unpack(raw_times))
    if len(entries) != len(times) or bool(entries) != (size > 0):
        return False
    if not entries:
        return True
    if entries[0][1] != 0 or times[0][0] != -1 or entries[-1][1] >= size:
        return False
    for (rel0, pos0), (rel1, pos1) in itertools.pairwise(entries):
        if rel1 <= rel0 or pos1 <= pos0:
            return False
    for (ts0, _), (ts1, _) in itertools.pairwise(times):
        if ts1 < ts0:
            return False
    if any(rel != time_rel for (rel, _), (_, time_rel) in zip(entries, times, strict=True)):
        return False
    rel, pos = entries[-1]
    with log_path(directory, base).open("rb") as f:
        f.seek(pos)
        head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        return False
    header = parse_header(head, 0)
    return check_header(header) is None and header.base_offset == base + rel


class LenientBatch(NamedTuple):
    """A batch found by a lenient scan (:meth:`Segment.scan_lenient`).

    ``header`` is ``None`` when not even a header could be read at ``position``; ``raw`` holds
    the batch's bytes when its framing is sound; ``error`` says what is wrong (``None``: the
    batch is intact, CRC included). A framing error ends the scan: nothing after it can be
    located.
    """

    position: int
    header: BatchHeader | None
    raw: bytes
    error: str | None


class Segment:
    """One segment of a partition, Kafka's ``LogSegment``: ``B.log`` + ``B.index`` +
    ``B.timeindex`` under one base offset ``B`` (formats: the module docstring).

    The three files are created, truncated, renamed and deleted together, always through
    this class. The object holds no descriptors: callers that read hot paths cache their own
    (see :class:`~eventlane.log.embedded.partition.Partition`).
    """

    __slots__ = ("base", "directory")

    def __init__(self, directory: Path, base: int) -> None:
        self.directory = directory
        self.base = base

    def __repr__(self) -> str:
        return f"Segment({str(self.log)!r})"

    @property
    def log(self) -> Path:
        return log_path(self.directory, self.base)

    @property
    def index(self) -> Path:
        return index_path(self.directory, self.base)

    @property
    def timeindex(self) -> Path:
        return timeindex_path(self.directory, self.base)

    def files(self, suffix: str = "") -> tuple[Path, Path, Path]:
        """The log, offset-index and time-index paths (with ``suffix`` appended, e.g.
        ``.cleaned`` for the compactor's staging copies)."""
        return tuple(  # type: ignore[return-value]
            p.with_name(p.name + suffix) for p in (self.log, self.index, self.timeindex)
        )

    def size(self) -> int:
        return self.log.stat().st_size

    def create(self) -> None:
        """Create the three files empty (an active segment being started)."""
        for path in self.files():
            path.touch()

    def delete(self) -> None:
        """Unlink the three files (missing ones are fine: deletion is replayed by recovery)."""
        for path in self.files():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def install(self, suffix: str) -> None:
        """Rename the ``suffix`` copies of the files over this segment's (those present)."""
        for path, staged in zip(self.files(), self.files(suffix), strict=True):
            if staged.exists():
                staged.replace(path)

    def write_indexes(self, entries: Sequence[tuple[int, int, int]], suffix: str = "") -> None:
        """Write both indexes from ``(relative offset, position, time before)`` entries."""
        _, ipath, tpath = self.files(suffix)
        ipath.write_bytes(b"".join(OFFSET_ENTRY.pack(rel, pos) for rel, pos, _ in entries))
        tpath.write_bytes(b"".join(TIME_ENTRY.pack(ts, rel) for rel, _, ts in entries))

    def trim_indexes(self, valid_size: int) -> None:
        """Keep only index entries of batches that start before ``valid_size`` bytes."""
        raw = self.index.read_bytes() if self.index.exists() else b""
        keep = 0
        for _rel, pos in OFFSET_ENTRY.iter_unpack(raw[: len(raw) - len(raw) % 8]):
            if pos >= valid_size:
                break
            keep += 1
        for path, width in ((self.index, OFFSET_ENTRY.size), (self.timeindex, TIME_ENTRY.size)):
            with open(path, "a+b") as f:
                f.truncate(keep * width)

    def truncate_to(self, fd: int, valid_size: int) -> None:
        """Cut the log (open as ``fd``) to ``valid_size`` bytes, trim its indexes, fsync."""
        os.ftruncate(fd, valid_size)
        self.trim_indexes(valid_size)
        os.fsync(fd)

    def indexes_look_sane(self) -> bool:
        return indexes_look_sane(self.directory, self.base)

    def scan(
        self,
        fd: int,
        start: int = 0,
        end: int | None = None,
        *,
        topic: str,
        partition: int,
        verify_crc: bool = True,
        expect_after: int = -1,
        contiguous: bool = False,
        limit: int = 1 << 62,
    ) -> Iterator[BatchRef]:
        """Strict scan of the open log ``fd`` (see :func:`scan_batches`)."""
        stop = os.fstat(fd).st_size if end is None else end
        return scan_batches(
            fd,
            self.log,
            start,
            stop,
            topic=topic,
            partition=partition,
            verify_crc=verify_crc,
            expect_after=expect_after,
            contiguous=contiguous,
            limit=limit,
        )

    def scan_lenient(self) -> Iterator[LenientBatch]:
        """Every batch of the log file, reporting damage instead of raising (for ``dump``).

        A batch whose CRC fails is yielded with its error and the scan goes on (its length
        still frames the next batch); a malformed header or a batch running past the end of
        the file is yielded with its error and ends the scan.
        """
        fd = os.open(self.log, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            pos = 0
            while pos < size:
                head = os.pread(fd, HEADER_SIZE, pos)
                if len(head) < HEADER_SIZE:
                    error = f"truncated batch header ({len(head)} bytes)"
                    yield LenientBatch(pos, None, b"", error)
                    return
                h = parse_header(head, 0)
                problem = check_header(h)
                if problem is None and pos + h.size > size:
                    problem = f"batch of {h.size} bytes runs past the end of the file ({size})"
                if problem is not None:
                    yield LenientBatch(pos, h, b"", problem)
                    return
                raw = os.pread(fd, h.size, pos)
                crc_error = None if batch_crc_ok(raw, 0, h) else "CRC32C mismatch"
                yield LenientBatch(pos, h, raw, crc_error)
                pos += h.size
        finally:
            os.close(fd)


def list_segments(directory: Path) -> list[Segment]:
    """The segments in ``directory``, oldest first."""
    return [Segment(directory, base) for base in list_segment_bases(directory)]
