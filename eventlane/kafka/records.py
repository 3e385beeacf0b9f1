"""Kafka record batches (magic 2) to and from the log's records, fast.

The listener speaks Kafka's on-the-wire batch format; the embedded log stores its own (see
docs/file-format.md: fixed-width fields, a CRC that also covers the base offset). Fetch
therefore re-frames what it reads (:func:`encode_stored`: the stored batches, in C, without
a Python object per record; :func:`encode_batch`: records, when the engine is another or the
extension is not built), and Produce parses what clients send (:func:`parse_batches`;
with ``framed=True`` a plain batch's records stay bytes, :class:`KafkaRecords`, which the
embedded log transcodes into its own batches in C without a Python object per record).
kafka-python's generic builder and reader spend tens of microseconds per record in pure
Python; the two functions here do the common case (magic 2, no transactions; compressed batches are
decompressed with kafka-python's codecs, then parsed the same way) and leave everything
else to kafka-python. The records of a Fetch are framed by the optional C extension
``eventlane.kafka._wire`` (``_payload_py`` is the same loop in Python, used without it).

Kafka's batch v2, all integers big-endian (KIP-98)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (2)
    | crc uint32 (CRC-32C of every byte from attributes to the end)
    | attributes int16 (bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control)
    | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64
    | producerId int64 | producerEpoch int16 | baseSequence int32 | recordCount int32
    | records...

    record: length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
            | keyLength varint (-1: null) | key | valueLength varint (-1: null) | value
            | headerCount varint | (keyLength varint | key utf-8 | valueLength varint | value)*

(varints are zig-zag encoded, as in protobuf.)

Decompression is bounded: a compressed batch is decompressed in chunks of at most
:data:`DECOMPRESS_CHUNK` bytes, each passed to the caller's ``charge`` before the next is
made (the listener counts them against its in-flight memory cap and refuses a request whose
records, decompressed, exceed what one request may hold), so a small request that
decompresses to gigabytes (a "zip bomb") costs at most the bound, never the whole.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import crc32c

from eventlane.log import Record
from eventlane.log.types import FramedBatch, FramedRecords, StoredBatch

__all__ = [
    "BatchFormatError",
    "DecompressedTooLargeError",
    "KafkaBatch",
    "LogTuple",
    "UnsupportedCompressionError",
    "encode_batch",
    "encode_stored",
    "has_compressed",
    "parse_batches",
]

DECOMPRESS_CHUNK = 1 << 20
"""The most bytes a codec produces before the caller is charged for them."""
RECORD_OVERHEAD = 160
"""Bytes charged per parsed record for its Python objects (a tuple, its bytes objects)."""

LogTuple = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int | None]
"""A record as :meth:`eventlane.log.Log.append` takes it: key, value, headers, timestamp."""

Charge = Callable[[int], None]
"""Called with each amount of memory a compressed batch's records are about to take; raises
(:class:`DecompressedTooLargeError`, or the caller's own error) to refuse the request."""


_HEADER = struct.Struct(">qiibIhiqqqhii")
_HEADER_SIZE = _HEADER.size  # 61
_ATTRIBUTES_AT = 21  # the CRC covers [21, end)
_MAGIC_AT = 16
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_COMPRESSION = 0x07


def _zigzag(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_varint = functools.lru_cache(maxsize=1 << 14)(_zigzag)
"""A zig-zag varint, remembered: lengths and deltas repeat from record to record."""


def encode_batch(records: Sequence[Record]) -> bytes:
    """Uncompressed Kafka batches holding ``records`` (offsets increasing, one partition).

    CreateTime records go into one batch. With LogAppendTime a batch has one timestamp
    for all its records (its ``maxTimestamp``, which is what readers report), so records
    are batched per run of equal timestamps: each keeps the time the log gave it."""
    if records[0].timestamp_type != 1:
        return _encode(records)
    out, start = [], 0
    for i in range(1, len(records) + 1):
        if i == len(records) or records[i].timestamp != records[start].timestamp:
            out.append(_encode(records[start:i]))
            start = i
    return b"".join(out)


def _payload_py(records: Sequence[Record], base: int, base_ts: int) -> tuple[bytes, int]:
    """The records section of a batch and its largest timestamp (what ``_wire`` does in C)."""
    max_ts = base_ts
    parts: list[bytes] = []
    append = parts.append
    for r in records:
        ts = r.timestamp
        max_ts = max(max_ts, ts)
        key, value = r.key, r.value
        body = [
            b"\x00",
            _varint(ts - base_ts),
            _varint(r.offset - base),
            b"\x01" if key is None else _varint(len(key)),
            key or b"",
            b"\x01" if value is None else _varint(len(value)),
            value or b"",
        ]
        headers = r.headers
        if headers:
            body.append(_varint(len(headers)))
            for name, hvalue in headers:
                raw = name.encode()
                body += (
                    _varint(len(raw)),
                    raw,
                    b"\x01" if hvalue is None else _varint(len(hvalue)),
                    hvalue or b"",
                )
        else:
            body.append(b"\x00")
        rec = b"".join(body)
        append(_varint(len(rec)))
        append(rec)
    return b"".join(parts), max_ts


def _load_wire() -> Callable[[Sequence[Record], int, int], tuple[bytes, int]]:
    try:
        from eventlane.kafka import _wire  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:  # built without a C compiler: the same loop in Python
        return _payload_py
    payload: Callable[[Sequence[Record], int, int], tuple[bytes, int]] = _wire.records_payload
    return payload


_payload = _load_wire()


def _load_stored() -> (
    Callable[[Sequence[StoredBatch], int, int], tuple[bytearray, list[int], int]] | None
):
    try:
        from eventlane.kafka import _wire  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:  # without the C extension, fetch reads records (encode_batch)
        return None
    convert: Callable[[Sequence[StoredBatch], int, int], tuple[bytearray, list[int], int]]
    convert = _wire.kafka_batches
    return convert


_kafka_batches = _load_stored()
FROM_STORED = _kafka_batches is not None
"""Whether :func:`encode_stored` is available (the C extension ``_wire`` is built)."""
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")


def encode_stored(batches: Sequence[StoredBatch], start: int, stop: int) -> tuple[bytearray, int]:
    """Kafka batches holding the records of the log's stored ``batches`` whose offsets are
    in ``[start, stop)``, and how many there are, without a Python object per record: the
    bytes :func:`encode_batch` gives for the same records (one batch, or one per run of
    equal timestamps with LogAppendTime; a new batch where the timestamp type changes).
    Only with the C extension (:data:`FROM_STORED`). ``ValueError``: a malformed record."""
    assert _kafka_batches is not None, "encode_stored needs eventlane.kafka._wire"
    blob, heads, count = _kafka_batches(batches, start, stop)
    with memoryview(blob) as view:
        for at in heads:
            (length,) = _LENGTH.unpack_from(blob, at + 8)
            crc = crc32c.crc32c(view[at + _ATTRIBUTES_AT : at + 12 + length])
            _CRC.pack_into(blob, at + 17, crc)
    return blob, count


def _encode(records: Sequence[Record]) -> bytes:
    first = records[0]
    base, base_ts = first.offset, first.timestamp
    payload, max_ts = _payload(records, base, base_ts)
    attributes = _LOG_APPEND_TIME if first.timestamp_type == 1 else 0
    header = bytearray(
        _HEADER.pack(
            base,
            _HEADER_SIZE - 12 + len(payload),
            0,  # partition leader epoch: one broker, never re-elected
            2,
            0,  # the CRC, filled in below
            attributes,
            records[-1].offset - base,
            base_ts,
            max_ts,
            -1,
            -1,
            -1,
            len(records),
        )
    )
    crc = crc32c.crc32c(payload, crc32c.crc32c(memoryview(header)[_ATTRIBUTES_AT:]))
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + payload


class KafkaBatch(NamedTuple):
    """One produced batch: its producer identity and its records as the log appends them
    (``(key, value, headers, timestamp)``; a negative timestamp becomes ``None``), or,
    parsed with ``framed=True`` (:func:`parse_batches`), as :class:`KafkaRecords` in
    ``framed`` (``records`` then empty)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[LogTuple]
    framed: KafkaRecords | None = None

    @property
    def record_count(self) -> int:
        """How many records the batch holds."""
        return len(self.records) if self.framed is None else len(self.framed)

    def log_records(self) -> list[LogTuple]:
        """The records as tuples (parsed from :attr:`framed` if need be)."""
        return self.records if self.framed is None else self.framed.records()


class _Span:
    """``count`` consecutive records of a produced batch's bytes, ``raw[start:stop]``, their
    timestamps relative to ``base_timestamp``."""

    __slots__ = ("base_timestamp", "count", "raw", "start", "stop")

    def __init__(self, raw: bytes, start: int, stop: int, count: int, base_timestamp: int):
        self.raw, self.start, self.stop, self.count = raw, start, stop, count
        self.base_timestamp = base_timestamp

    def __len__(self) -> int:
        return self.count


class KafkaRecords(_Span, FramedRecords):
    """The records of an uncompressed produced batch, kept as the request's bytes, which the
    embedded engine appends without a tuple per record (:meth:`LogStore.append_framed`:
    ``_wire.records_cut`` cuts them as the log cuts record tuples, ``_wire.records_stored``
    transcodes each piece into a stored batch in one C pass). Only records that
    ``_wire.records_scan`` accepted (:func:`parse_batches`), so that :meth:`records` gives
    the tuples :func:`parse_batches` would have given."""

    __slots__ = ()

    def cut(
        self, overhead: int, max_batch_bytes: int, max_record_bytes: int, keyed: bool
    ) -> list[FramedBatch] | None:
        assert _WIRE is not None
        raw, base_ts = self.raw, self.base_timestamp
        args = (raw, self.start, self.stop, self.count, base_ts)
        pieces = _WIRE.records_cut(*args, overhead, max_batch_bytes, max_record_bytes, keyed)
        if pieces is None:
            return None
        return [_KafkaPiece(raw, start, stop, n, base_ts) for start, stop, n in pieces]

    def records(self) -> list[LogTuple]:
        return _parse(self.raw, self.start, self.stop, self.count, self.base_timestamp)


class _KafkaPiece(_Span, FramedBatch):
    """Consecutive records of a :class:`KafkaRecords`, framed as one stored batch."""

    __slots__ = ()

    def frame(self, base_offset: int, timestamp_type: int, now: int) -> tuple[bytes, list[int]]:
        assert _WIRE is not None
        blob, stamps = _WIRE.records_stored(
            self.raw,
            self.start,
            self.stop,
            self.count,
            self.base_timestamp,
            base_offset,
            timestamp_type == 1,
            now,
        )
        # the stored format's CRC: bytes [17, end), then [0, 13) (docs/file-format.md)
        with memoryview(blob) as view:
            crc = crc32c.crc32c(view[:13], crc32c.crc32c(view[17:]))
        _CRC.pack_into(blob, 13, crc)
        return blob, stamps


class BatchFormatError(ValueError):
    """A batch this module does not parse (transactional, control, not magic 2)
    or that is malformed; :attr:`fallback` says whether kafka-python should try it."""

    def __init__(self, message: str, *, fallback: bool) -> None:
        super().__init__(message)
        self.fallback = fallback


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _parse_py(raw: bytes, start: int, stop: int, count: int, base_ts: int) -> list[LogTuple]:
    """The records of one batch (what ``_wire.records_parse`` does in C)."""
    records: list[LogTuple] = []
    p = start
    try:
        for _ in range(count):
            n, p = _read_varint(raw, p)
            rec_end = p + n
            p += 1  # record attributes (unused in v2)
            ts_delta, p = _read_varint(raw, p)
            _offset_delta, p = _read_varint(raw, p)
            n, p = _read_varint(raw, p)
            key = None if n < 0 else raw[p : p + n]
            p += max(n, 0)
            n, p = _read_varint(raw, p)
            value = None if n < 0 else raw[p : p + n]
            p += max(n, 0)
            nh, p = _read_varint(raw, p)
            headers: list[tuple[str, bytes | None]] = []
            for _h in range(nh):
                n, p = _read_varint(raw, p)
                name = raw[p : p + n].decode()
                p += n
                n, p = _read_varint(raw, p)
                headers.append((name, None if n < 0 else raw[p : p + n]))
                p += max(n, 0)
            if p != rec_end or p > stop:
                raise ValueError("record length disagrees with its fields")
            ts = base_ts + ts_delta
            records.append((key, value, tuple(headers), ts if ts >= 0 else None))
    except (IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed record: {exc}") from None
    if p != stop:
        raise ValueError("records disagree with the batch length")
    return records


def _load_parse() -> Callable[[bytes, int, int, int, int], list[LogTuple]]:
    try:
        from eventlane.kafka import _wire  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:
        return _parse_py
    parse: Callable[[bytes, int, int, int, int], list[LogTuple]] = _wire.records_parse
    return parse


_parse = _load_parse()


def _load_module() -> Any:
    try:
        from eventlane.kafka import _wire  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:  # without the C extension, produced records are parsed into tuples
        return None
    return _wire


_WIRE = _load_module()
FRAMED = _WIRE is not None
"""Whether :func:`parse_batches` can keep records as :class:`KafkaRecords` (``framed``)."""


class UnsupportedCompressionError(BatchFormatError):
    """A batch compressed with a codec that is not Kafka's (or whose library is missing)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, fallback=False)


class DecompressedTooLargeError(BatchFormatError):
    """A compressed batch whose records, decompressed, exceed what the caller allows (what a
    ``charge`` raises to refuse; it passes through :func:`parse_batches` unchanged)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, fallback=False)


def _gzip_chunks(data: bytes) -> Iterator[bytes]:
    rest = data
    while rest:
        d = zlib.decompressobj(wbits=31)  # one gzip member (Kafka's clients write one)
        pending = rest
        while not d.eof:
            out = d.decompress(pending, DECOMPRESS_CHUNK)
            pending = d.unconsumed_tail
            if out:
                yield out
            elif not pending:
                raise ValueError("truncated gzip stream")
        rest = d.unused_data


def _lz4_chunks(data: bytes) -> Iterator[bytes]:
    import lz4.frame  # type: ignore[import-untyped]  # noqa: PLC0415  (the kafka extra)

    rest = data
    while rest:
        d = lz4.frame.LZ4FrameDecompressor()
        out = d.decompress(rest, max_length=DECOMPRESS_CHUNK)
        while True:
            if out:
                yield out
            if d.eof:
                break
            if d.needs_input:
                raise ValueError("truncated lz4 frame")
            out = d.decompress(b"", max_length=DECOMPRESS_CHUNK)
        rest = d.unused_data


def _zstd_chunks(data: bytes) -> Iterator[bytes]:
    import zstandard  # noqa: PLC0415  (the kafka extra)

    with zstandard.ZstdDecompressor().stream_reader(
        io.BytesIO(data), read_across_frames=True
    ) as reader:
        while chunk := reader.read(DECOMPRESS_CHUNK):
            yield chunk


def _uvarint(buf: bytes | memoryview, pos: int) -> int:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result
        shift += 7
        if shift > 35:
            raise ValueError("snappy length varint too long")


def _snappy_chunks(data: bytes, charge: Charge) -> Iterator[bytes]:
    """Snappy blocks (raw, or in xerial's framing as Kafka's clients write them); each
    block's declared length is charged before it is decompressed (a block is one piece)."""
    import snappy  # type: ignore[import-untyped]  # noqa: PLC0415  (the kafka extra)

    view = memoryview(data)
    if data[:8] == b"\x82SNAPPY\x00":
        blocks, pos = [], 16
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            blocks.append(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
    else:
        blocks = [view]
    for block in blocks:
        declared = _uvarint(block, 0)
        charge(declared)
        out: bytes = snappy.decompress(bytes(block))
        if len(out) != declared:
            raise ValueError("snappy block length disagrees with its header")
        yield out


def _decompress(codec: int, data: bytes, charge: Charge) -> bytearray:
    """The records section of a compressed batch, uncompressed (gzip 1, snappy 2, lz4 3,
    zstd 4: zlib, python-snappy, lz4 and zstandard, the libraries kafka-python uses), made in
    chunks, each charged before the next is made."""
    if codec not in (1, 2, 3, 4):
        raise UnsupportedCompressionError(f"compression type {codec} is not one of Kafka's")
    out = bytearray()
    try:
        if codec == 2:
            chunks = _snappy_chunks(data, charge)
        else:
            chunks = {1: _gzip_chunks, 3: _lz4_chunks, 4: _zstd_chunks}[codec](data)
            chunks = _charged(chunks, charge)
        for chunk in chunks:
            out += chunk
    except ImportError as exc:
        raise UnsupportedCompressionError(f"compression type {codec}: {exc}") from None
    return out  # not copied to bytes: the C parser reads any buffer


def _charged(chunks: Iterator[bytes], charge: Charge) -> Iterator[bytes]:
    for chunk in chunks:
        charge(len(chunk))
        yield chunk


def _no_charge(size: int) -> None:
    """The default ``charge``: nothing counted, nothing refused."""


def has_compressed(raw: bytes) -> bool:
    """Whether a Produce request's record set holds a compressed magic-2 batch (a walk over
    the batch headers only)."""
    pos, end = 0, len(raw)
    while end - pos >= _HEADER_SIZE and raw[pos + _MAGIC_AT] == 2:
        (length,) = struct.unpack_from(">i", raw, pos + 8)
        if struct.unpack_from(">h", raw, pos + _ATTRIBUTES_AT)[0] & _COMPRESSION:
            return True
        if length <= 0:
            return False
        pos += 12 + length
    return False


def parse_batches(
    raw: bytes, charge: Charge = _no_charge, *, framed: bool = False
) -> list[KafkaBatch]:
    """The batches of a Produce request's record set.

    Compressed batches are decompressed and parsed like plain ones, so a record count or a
    length that disagrees with the bytes is caught either way. Raises
    :class:`BatchFormatError` for anything but magic-2 batches without transaction markers
    (``fallback``: hand it to the generic reader, which refuses it with the right error) or
    for a malformed one (a bad CRC, lengths past the end, records that disagree with the
    batch: ``fallback`` false, the request is corrupt), :class:`UnsupportedCompressionError`
    for a codec that is not Kafka's; ``charge`` is called with the memory a compressed
    batch's records take (its decompressed bytes, chunk by chunk, then
    :data:`RECORD_OVERHEAD` per record) before it is taken, and may refuse by raising.
    ``framed`` (with the C extension: :data:`FRAMED`): a batch's records (decompressed)
    are checked in C and kept as :class:`KafkaRecords` (``KafkaBatch.framed``) rather than
    parsed into tuples, where they are ones it can transcode (else parsed as without it);
    a compressed batch is charged for its records' tuples either way."""
    batches = []
    pos, end = 0, len(raw)
    while pos < end:
        if end - pos > _MAGIC_AT and raw[pos + _MAGIC_AT] != 2:  # an older format's batch
            raise BatchFormatError(f"magic {raw[pos + _MAGIC_AT]}", fallback=True)
        if end - pos < _HEADER_SIZE:
            raise BatchFormatError("truncated batch header", fallback=False)
        (
            _base,
            length,
            _epoch,
            magic,
            crc,
            attributes,
            _last_delta,
            base_ts,
            _max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _HEADER.unpack_from(raw, pos)
        stop = pos + 12 + length
        if magic != 2 or attributes & (_TRANSACTIONAL | _CONTROL):
            raise BatchFormatError(f"magic {magic}, attributes {attributes:#x}", fallback=True)
        if stop > end or length < _HEADER_SIZE - 12:
            raise BatchFormatError(f"batch length {length} past the request's end", fallback=False)
        if crc32c.crc32c(memoryview(raw)[pos + _ATTRIBUTES_AT : stop]) != crc:
            raise BatchFormatError("record batch CRC mismatch", fallback=False)
        try:
            if attributes & _COMPRESSION:
                body = _decompress(
                    attributes & _COMPRESSION, raw[pos + _HEADER_SIZE : stop], charge
                )
                if count < 0 or count > len(body):
                    raise BatchFormatError(f"record count {count}", fallback=False)
                charge(count * RECORD_OVERHEAD)
                buf: bytes = body if _parse is not _parse_py else bytes(body)  # type: ignore[assignment]
                at, end_at = 0, len(body)
            else:
                buf, at, end_at = raw, pos + _HEADER_SIZE, stop
            kept = None
            if framed and FRAMED and _WIRE.records_scan(buf, at, end_at, count, base_ts):
                kept = KafkaRecords(buf, at, end_at, count, base_ts)
                records = []
            else:
                records = _parse(buf, at, end_at, count, base_ts)
        except (UnsupportedCompressionError, DecompressedTooLargeError):
            raise
        except Exception as exc:  # BatchFormatError included; a codec's own errors
            raise BatchFormatError(f"malformed records: {exc}", fallback=False) from None
        batches.append(KafkaBatch(producer_id, producer_epoch, base_sequence, records, kept))
        pos = stop
    return batches
