"""Kafka batch framing in eventlane.kafka.records, against kafka-python's own reader and
builder as the oracle (the encoder's output must read back through kafka-python exactly,
and what kafka-python's producer builds must parse to the same records)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from kafka.errors import CorruptRecordError
from kafka.record.memory_records import MemoryRecords

from eventlane.kafka import records as kafka_records
from eventlane.kafka._produce import _produced_batches, _RefusedError
from eventlane.kafka.records import BatchFormatError, encode_batch, parse_batches
from eventlane.log import Record
from tests.kafka.wire import build

T0 = 1_764_000_000_000


def records(n: int, base: int = 1_000, ts_type: int = 0) -> list[Record]:
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else f"key-{i}".encode()
        value = None if i % 11 == 5 else bytes([i % 256]) * (i * 37 % 20_000)
        headers = (("h", b"v"), ("null", None), ("ü", b"\x00" * 200)) if i % 3 == 0 else ()
        offset = base + i * 2 + (i // 50) * 1_000  # gaps, as compaction leaves them
        out.append(Record("t", 0, offset, T0 + i * 977, ts_type, key, value, headers))
    return out


def read_back(raw: bytes) -> list[tuple[object, ...]]:
    """kafka-python's reader over encoded batches, CRCs checked: (offset, timestamp, type,
    key, value, headers) per record (also test_kafka_fetch_stored's independent decoder)."""
    batches = MemoryRecords(raw)
    out = []
    while (batch := batches.next_batch()) is not None:
        assert batch.validate_crc()
        for r in batch:
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)))
    return out


@pytest.fixture(params=["C", "Python"])
def framing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both implementations of the records section: the C extension and the Python loops."""
    if request.param == "C":
        assert kafka_records._payload is not kafka_records._payload_py, "_wire is not built"
        assert kafka_records._parse is not kafka_records._parse_py
    else:
        monkeypatch.setattr(kafka_records, "_payload", kafka_records._payload_py)
        monkeypatch.setattr(kafka_records, "_parse", kafka_records._parse_py)
    return str(request.param)


@pytest.mark.parametrize("ts_type", [0, 1])
def test_encoded_batches_read_back_through_kafka_python(ts_type: int, framing: str) -> None:
    recs = records(300, ts_type=ts_type)
    got = read_back(encode_batch(recs))
    want = [
        (r.offset, r.timestamp, ts_type, r.key, r.value, [(k, v) for k, v in r.headers])
        for r in recs
    ]
    assert got == want


PRODUCED = [
    (b"k1", b"v" * 300, [("a", b"1"), ("b", None)], T0),
    (None, b"no key", [], T0 + 5),
    (b"tomb", None, [], T0 - 5),
    (b"big" * 100, bytes(range(256)) * 80, [("x", b"")], T0 + 10**9),
]


def test_produced_batches_parse_to_the_records_the_log_appends(framing: str) -> None:
    raw = build(PRODUCED, pid=7, seq=41) + build(PRODUCED[:2])
    first, second = parse_batches(raw)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (7, 0, 41)
    assert first.records == [(k, v, tuple(h), ts) for k, v, h, ts in PRODUCED]
    assert second.producer_id == -1 and len(second.records) == 2


def test_a_flipped_bit_is_refused_and_every_kafka_codec_parses(framing: str) -> None:
    raw = bytearray(build(PRODUCED))
    raw[-3] ^= 0x10
    with pytest.raises(BatchFormatError, match="CRC") as info:
        parse_batches(bytes(raw))
    assert not info.value.fallback
    with pytest.raises(_RefusedError) as refused:
        _produced_batches(bytes(raw))
    assert refused.value.code == CorruptRecordError.errno

    expected = [(k, v, tuple(h), ts) for k, v, h, ts in PRODUCED]
    for codec in (1, 2, 3, 4):  # gzip, snappy, lz4, zstd: decompressed, parsed here
        (batch,) = parse_batches(build(PRODUCED, compression=codec))
        assert batch.records == expected, codec
        (batch,) = _produced_batches(build(PRODUCED, compression=codec))
        assert batch.records == expected, codec


def test_records_that_are_not_log_records_are_a_type_error(framing: str) -> None:
    bad = Record("t", 0, 5, T0, 0, "a str key", b"v", ())
    with pytest.raises(TypeError, match="key" if framing == "C" else None):
        encode_batch([bad])


def test_truncated_requests_are_corrupt_not_a_crash(framing: str) -> None:
    raw = build(PRODUCED)
    for cut in (10, 61, len(raw) - 1):
        with pytest.raises(BatchFormatError) as info:
            parse_batches(raw[:cut])
        assert not info.value.fallback


def test_lengths_that_lie_are_corrupt_even_with_a_good_crc(framing: str) -> None:
    """A client bug, not line noise: the CRC is right but a record's length is not."""
    raw = bytearray(build(PRODUCED[:1]))
    raw[61] = 0x02  # the first record's length varint: 1 byte instead of hundreds
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    with pytest.raises(BatchFormatError, match="malformed records") as info:
        parse_batches(bytes(raw))
    assert not info.value.fallback
