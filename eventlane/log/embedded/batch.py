"""Record batches: the unit the log writes, checksums, indexes and reads.

A segment file is a plain concatenation of batches. All integers are big-endian, as in
Kafka's record batch v2, which this format follows in spirit (a fixed header, then records
with deltas against the header)::

    batch header (43 bytes)
      0  int64   base_offset        offset of the first record of the batch
      8  int32   batch_length       bytes after this field (header rest + records)
     12  int8    magic              format version, 2
     13  uint32  crc                CRC32C (Castagnoli) of bytes [17, 12 + batch_length),
                                    continued over bytes [0, 13): every byte but the CRC
     17  int16   attributes         bit 3: timestamp type (0 CreateTime, 1 LogAppendTime)
     19  int32   last_offset_delta  last offset of the batch - base_offset
     23  int64   base_timestamp     timestamp of the first record, ms
     31  int64   max_timestamp      largest record timestamp in the batch, ms
     39  int32   record_count
     43  records...

    record
      int32   length             bytes after this field
      int32   offset_delta       record offset - base_offset
      int64   timestamp_delta    record timestamp - base_timestamp
      int32   key_length         -1 for a null key
      bytes   key
      int32   value_length       -1 for a null value (a tombstone)
      bytes   value
      int32   header_count
      header_count x (int32 name_length, UTF-8 name, int32 value_length (-1 null), value)

Invariants: offset deltas strictly increase within a batch; ``last_offset_delta`` is at least
the last record's delta (compaction removes records but keeps the batch's offset range, so a
cleaned batch may end in a gap); the CRC covers every byte of the batch but the CRC field
itself (base offset, length and magic included, unlike Kafka's v2 CRC), so a flipped bit
anywhere in a batch is detected, even one that leaves the offsets in order. The prefix is
folded in last, so a writer that framed a batch early only extends the CRC over 13 bytes once
it knows the base offset.

The hot loops (encode and decode) run in the optional C extension ``eventlane.log._native``
when it is built; the pure-Python code below is the reference and the fallback, and the two
are proven byte-identical by tests.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from eventlane.log.record import Header, Record

if TYPE_CHECKING:
    import crc32c as _crc32c
else:

    class _LoadCrc32c:
        """The ``crc32c`` module, imported on first use: its package imports argparse and
        importlib.metadata (a tenth of a second), which a command that checks no CRC (``topics
        list``) need not pay. The first use replaces this object by the module."""

        def __getattr__(self, name: str) -> object:
            import crc32c  # noqa: PLC0415

            globals()["_crc32c"] = crc32c
            return getattr(crc32c, name)

    _crc32c = _LoadCrc32c()

HEADER = struct.Struct(">qibIhiqqi")
HEADER_SIZE = HEADER.size  # 43
LENGTH_PREFIX = 12  # base_offset + batch_length: the bytes not counted in batch_length
CRC_FIELD = 13  # the CRC sits at [13, 17); it covers [17, end) then [0, 13)
CRC_START = 17
_PREFIX = struct.Struct(">qib")
_CRC = struct.Struct(">I")
MAGIC = 2
TIMESTAMP_TYPE_BIT = 0x08

_REC_HEAD = struct.Struct(">iiqi")  # length, offset_delta, timestamp_delta, key_length
_INT32 = struct.Struct(">i")
_NULL = -1

if TYPE_CHECKING:
    from collections.abc import Callable

    EncodeFn = Callable[
        [
            Sequence[tuple[bytes | None, bytes | None, tuple[Header, ...], int | None]],
            int,
            Sequence[int] | None,
            Sequence[int] | None,
        ],
        bytes,
    ]
    IndexKeysFn = Callable[
        [bytes | memoryview, int, int, int, dict[bytes, int], Callable[[bytes], bytes]], int
    ]
    DecodeFn = Callable[
        [bytes | memoryview, int, int, int, int, int, str, int, int, type], list[Record]
    ]


class BatchHeader(NamedTuple):
    """The decoded fixed header of one batch, plus where it sits in its buffer."""

    base_offset: int
    batch_length: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on disk."""
        return LENGTH_PREFIX + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_BIT else 0


def _py_encode_records(
    records: Sequence[tuple[bytes | None, bytes | None, tuple[Header, ...], int | None]],
    base_timestamp: int,
    offset_deltas: Sequence[int] | None = None,
    timestamps: Sequence[int] | None = None,
) -> bytes:
    """Encode records ``(key, value, headers, timestamp)`` into the batch body.

    ``timestamps``, when given, replaces each record's own timestamp field (which may then
    be ``None``): the log resolves timestamps without building a new tuple per record.
    """
    parts: list[bytes] = []
    append = parts.append
    pack_head = _REC_HEAD.pack
    pack_int = _INT32.pack
    if timestamps is not None and len(timestamps) < len(records):
        raise ValueError(f"timestamps has {len(timestamps)} entries for {len(records)} records")
    for index, (key, value, headers, own_timestamp) in enumerate(records):
        timestamp = own_timestamp if timestamps is None else timestamps[index]
        delta = index if offset_deltas is None else offset_deltas[index]
        klen = _NULL if key is None else len(key)
        vlen = _NULL if value is None else len(value)
        tail: list[bytes] = [pack_int(vlen)]
        if value is not None:
            tail.append(value)
        tail.append(pack_int(len(headers)))
        for name, hval in headers:
            raw = name.encode()
            tail.append(pack_int(len(raw)))
            tail.append(raw)
            if hval is None:
                tail.append(pack_int(_NULL))
            else:
                tail.append(pack_int(len(hval)))
                tail.append(hval)
        body = b"".join(tail)
        length = 4 + 8 + 4 + max(klen, 0) + len(body)
        # a None timestamp (unresolved) fails here with TypeError, as in the native encoder
        append(pack_head(length, delta, timestamp - base_timestamp, klen))  # type: ignore[operator]
        if key is not None:
            append(key)
        append(body)
    return b"".join(parts)


def _py_decode_records(
    buf: bytes | memoryview,
    start: int,
    end: int,
    base_offset: int,
    base_timestamp: int,
    timestamp_type: int,
    topic: str,
    partition: int,
    min_offset: int,
    record_cls: type = Record,
) -> list[Record]:
    """Decode the records in ``buf[start:end]``, skipping offsets below ``min_offset``.

    Raises ``ValueError`` on a malformed record (the caller adds file/offset coordinates).
    """
    out: list[Record] = []
    unpack_head = _REC_HEAD.unpack_from
    unpack_int = _INT32.unpack_from
    pos = start
    mv = memoryview(buf)
    while pos < end:
        if pos + 20 > end:
            raise ValueError("record header runs past the batch end")
        length, delta, ts_delta, klen = unpack_head(buf, pos)
        rec_end = pos + 4 + length
        if length < 24 or rec_end > end:
            raise ValueError(f"record length {length} runs past the batch end or is too small")
        p = pos + 20
        if klen == _NULL:
            key = None
        elif 0 <= klen <= rec_end - p - 8:
            key = bytes(mv[p : p + klen])
            p += klen
        else:
            raise ValueError(f"bad key length {klen}")
        (vlen,) = unpack_int(buf, p)
        p += 4
        if vlen == _NULL:
            value = None
        elif 0 <= vlen <= rec_end - p - 4:
            value = bytes(mv[p : p + vlen])
            p += vlen
        else:
            raise ValueError(f"bad value length {vlen}")
        if rec_end - p < 4:
            raise ValueError("record too short for its header count")
        (hcount,) = unpack_int(buf, p)
        p += 4
        if hcount < 0 or hcount > length:
            raise ValueError(f"bad header count {hcount}")
        headers: list[Header] = []
        for _ in range(hcount):
            if rec_end - p < 8:
                raise ValueError("header runs past the record end")
            (nlen,) = unpack_int(buf, p)
            p += 4
            if nlen < 0 or p + nlen + 4 > rec_end:
                raise ValueError(f"bad header name length {nlen}")
            name = bytes(mv[p : p + nlen]).decode()
            p += nlen
            (hlen,) = unpack_int(buf, p)
            p += 4
            if hlen == _NULL:
                headers.append((name, None))
            elif 0 <= hlen <= rec_end - p:
                headers.append((name, bytes(mv[p : p + hlen])))
                p += hlen
            else:
                raise ValueError(f"bad header value length {hlen}")
        if p != rec_end:
            raise ValueError("record length does not match its fields")
        offset = base_offset + delta
        if offset >= min_offset:
            out.append(
                record_cls(
                    topic,
                    partition,
                    offset,
                    base_timestamp + ts_delta,
                    timestamp_type,
                    key,
                    value,
                    tuple(headers),
                )
            )
        pos = rec_end
    return out


def _py_index_keys(
    buf: bytes | memoryview,
    start: int,
    end: int,
    base_offset: int,
    last: dict[bytes, int],
    key_id: Callable[[bytes], bytes],
) -> int:
    """``last[key] = offset`` for every keyed record of ``buf[start:end]``; the record count.

    Keys longer than 16 bytes are stored as ``key_id(key)``; keyless records are skipped.
    This is the cleaner's first pass (key -> last offset): the native version checks the
    framing as :func:`decode_records` does but copies no value and decodes no header.
    """
    records = _py_decode_records(buf, start, end, base_offset, 0, 0, "", 0, -(1 << 63))
    for r in records:
        if r.key is not None:
            last[r.key if len(r.key) <= 16 else key_id(r.key)] = r.offset
    return len(records)


try:  # pragma: no cover - exercised by whichever implementation is present
    from eventlane.log import _native  # type: ignore[attr-defined]

    encode_records: EncodeFn = _native.encode_records
    decode_records: DecodeFn = _native.decode_records
    index_keys: IndexKeysFn = _native.index_keys
    NATIVE = True
except ImportError:  # pragma: no cover
    encode_records = _py_encode_records
    decode_records = _py_decode_records
    index_keys = _py_index_keys
    NATIVE = False


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[bytes | None, bytes | None, tuple[Header, ...], int | None]],
    *,
    timestamp_type: int = 0,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    timestamps: Sequence[int] | None = None,
) -> bytes:
    """Frame ``records`` (``(key, value, headers, timestamp)``) as a batch.

    Timestamps must be resolved: either every record's own, or ``timestamps`` (one per
    record, replacing the records' own fields, which are then ignored).
    ``offset_deltas`` (default ``0..n-1``) and ``last_offset_delta`` let the cleaner re-frame a
    batch it has compacted without moving any offset.

    >>> raw = encode_batch(7, [(b"k", b"v", (), 1000)])
    >>> header = parse_header(raw, 0)
    >>> (header.base_offset, header.record_count, header.size == len(raw))
    (7, 1, True)
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    if timestamps is None:
        timestamps = [r[3] for r in records]  # type: ignore[misc]
    base_ts = timestamps[0]
    body = encode_records(records, base_ts, offset_deltas, timestamps)  # type-checks every field
    if min(timestamps) < 0:
        raise ValueError(f"timestamps are ms since the epoch (>= 0), got {min(timestamps)}")
    if last_offset_delta is None:
        last_offset_delta = len(records) - 1 if offset_deltas is None else offset_deltas[-1]
    attributes = TIMESTAMP_TYPE_BIT if timestamp_type == 1 else 0
    rest = struct.pack(
        ">hiqqi", attributes, last_offset_delta, base_ts, max(timestamps), len(records)
    )
    prefix = _PREFIX.pack(base_offset, HEADER_SIZE - LENGTH_PREFIX + len(body), MAGIC)
    crc = _crc32c.crc32c(prefix, _crc32c.crc32c(body, _crc32c.crc32c(rest)))
    return prefix + _CRC.pack(crc) + rest + body


def encode_skip_batch(base_offset: int, count: int, timestamp: int) -> bytes:
    """A batch of no records that covers ``count`` offsets from ``base_offset``.

    Written only by the explicit repair of a lost tail (:mod:`eventlane.log.embedded.recovery`): the
    lost offsets stay taken, so an acknowledged offset is never given out twice. Readers
    pass over it like a batch whose records were all compacted away.

    >>> header = parse_header(encode_skip_batch(5, 10, 1000), 0)
    >>> (header.base_offset, header.last_offset, header.record_count, header.size)
    (5, 14, 0, 43)
    """
    rest = struct.pack(">hiqqi", 0, count - 1, timestamp, timestamp, 0)
    prefix = _PREFIX.pack(base_offset, HEADER_SIZE - LENGTH_PREFIX, MAGIC)
    crc = _crc32c.crc32c(prefix, _crc32c.crc32c(rest))
    return prefix + _CRC.pack(crc) + rest


def parse_header(buf: bytes | memoryview, pos: int) -> BatchHeader:
    """Decode the fixed header at ``buf[pos:]`` (no checks beyond its size)."""
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def check_header(header: BatchHeader) -> str | None:
    """Return why ``header`` cannot be a valid batch header, or ``None`` if it can."""
    if header.magic != MAGIC:
        return f"bad magic {header.magic}"
    if header.batch_length < HEADER_SIZE - LENGTH_PREFIX:
        return f"bad batch length {header.batch_length}"
    if header.record_count < 0 or header.last_offset_delta < 0:
        return "bad record count or offset delta"
    if header.base_offset < 0:
        return f"bad base offset {header.base_offset}"
    return None


def batch_crc_ok(buf: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether the batch at ``buf[pos:]`` matches its stored CRC32C."""
    view = memoryview(buf)
    crc = _crc32c.crc32c(view[pos + CRC_START : pos + header.size])
    return _crc32c.crc32c(view[pos : pos + CRC_FIELD], crc) == header.crc
