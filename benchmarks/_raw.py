"""Raw baselines: the least plain Python must do for each thing the log does.

These are the "same-run raw baselines" of brief section 4, written the way a careful person
would write them without a framework, so a ratio against them says what the framework costs:

* :func:`write_prejoined`: pre-joined bytes, one buffered ``write`` per MiB + ``fsync`` per
  MiB (the device/syscall floor for durable appends).
* :func:`write_framed`: per-record framing (offset, CRC32C, lengths) + CRC32C in a plain
  loop, buffered writes, ``fsync`` per MiB (what a hand-rolled log costs in Python).
* :func:`write_fsync_per_record`: ``os.write`` + ``os.fsync`` (or ``os.fdatasync``, the
  call the log makes) per record (durable single appends).
* :func:`read_parse`: read a segment file of :mod:`eventlane.log.embedded.batch` batches in 1 MiB
  chunks, check each batch's CRC32C (optional) and parse every record into an
  ``(offset, key, value)`` tuple in pure Python (what a hand-written reader of this exact
  file format costs).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import crc32c

MIB = 1 << 20

_FRAME = struct.Struct(">qIii")  # offset, crc32c(key+value), key length, value length
_BATCH_HEAD = struct.Struct(">qibIhiqqi")  # eventlane.log.embedded.batch.HEADER
_BATCH_SIZE = _BATCH_HEAD.size
_REC_HEAD = struct.Struct(">iiqi")  # length, offset_delta, timestamp_delta, key_length
_I32 = struct.Struct(">i")


def prejoined_blocks(count: int, value_size: int = 100) -> list[bytes]:
    """``count`` records of ``value_size`` bytes, pre-joined into 1 MiB blocks."""
    total = count * value_size
    block = os.urandom(min(total, MIB))
    blocks = [block] * (total // MIB)
    if total % MIB:
        blocks.append(block[: total % MIB])
    return blocks


def write_prejoined(path: Path, blocks: Sequence[bytes]) -> None:
    """Buffered write of each pre-joined block, flush + fsync after each (≈ per MiB)."""
    with open(path, "wb") as f:
        for block in blocks:
            f.write(block)
            f.flush()
            os.fsync(f.fileno())


def write_framed(path: Path, records: Iterable[tuple[bytes, bytes]]) -> None:
    """Per-record frame + CRC32C, buffered writes, flush + fsync every MiB, in a plain loop."""
    pack = _FRAME.pack
    crc = crc32c.crc32c
    with open(path, "wb") as f:
        write = f.write
        pending = 0
        for offset, (key, value) in enumerate(records):
            write(pack(offset, crc(value, crc(key)), len(key), len(value)))
            write(key)
            write(value)
            pending += 20 + len(key) + len(value)
            if pending >= MIB:
                f.flush()
                os.fsync(f.fileno())
                pending = 0
        f.flush()
        os.fsync(f.fileno())


def write_fsync_per_record(
    path: Path, key: bytes, value: bytes, count: int, *, datasync: bool = False
) -> None:
    """``os.write`` of one framed record then ``os.fsync`` (or ``os.fdatasync``), ``count``
    times."""
    pack = _FRAME.pack
    crc = crc32c.crc32c
    sync = os.fdatasync if datasync else os.fsync
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for offset in range(count):
            os.write(fd, pack(offset, crc(value, crc(key)), len(key), len(value)) + key + value)
            sync(fd)
    finally:
        os.close(fd)


def read_parse(paths: Sequence[Path], *, verify_crc: bool = True) -> int:
    """Read + (CRC) + parse every record of the segment files; return the record count.

    Pure Python, one ``(offset, key, value)`` tuple per record, 1 MiB reads: a plain
    sequential reader of the log's file format (:mod:`eventlane.log.embedded.batch`).
    """
    head = _BATCH_HEAD.unpack_from
    rec = _REC_HEAD.unpack_from
    i32 = _I32.unpack_from
    crc = crc32c.crc32c
    count = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            buf = b""
            while True:
                chunk = f.read(MIB)
                if not chunk:
                    break
                buf = buf + chunk if buf else chunk
                pos = 0
                end = len(buf)
                mv = memoryview(buf)
                while pos + _BATCH_SIZE <= end:
                    base, blen, _magic, stored, _a, _lod, _bts, _mts, _n = head(buf, pos)
                    size = 12 + blen
                    if pos + size > end:
                        break
                    if (
                        verify_crc
                        and crc(mv[pos : pos + 13], crc(mv[pos + 17 : pos + size])) != stored
                    ):
                        raise ValueError(f"CRC mismatch at {path}:{pos}")
                    out = []
                    p = pos + _BATCH_SIZE
                    stop = pos + size
                    while p < stop:
                        length, delta, _tsd, klen = rec(buf, p)
                        q = p + 20
                        key = None if klen < 0 else buf[q : q + klen]
                        q += max(klen, 0)
                        (vlen,) = i32(buf, q)
                        q += 4
                        value = None if vlen < 0 else buf[q : q + vlen]
                        out.append((base + delta, key, value))
                        p += 4 + length
                    count += len(out)
                    pos += size
                mv.release()
                buf = buf[pos:]
    return count
