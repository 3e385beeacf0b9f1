"""The C record codec (``eventlane.log._native``) against the pure-Python reference.

``encode_records`` must produce the same bytes as ``batch._py_encode_records`` and
``decode_records`` the same records as ``batch._py_decode_records``, for any input; on
malformed input (random bytes, bit flips, truncation) the C decoder raises ``ValueError`` or
decodes exactly what the reference decodes, and never reads out of bounds.

The extension is part of the product: if it did not build, every test using the ``native``
fixture fails (none is skipped); the pure-Python tests at the end still run.
"""

from __future__ import annotations

import gc
import importlib
import mmap
import pickle
import struct
import sys
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eventlane.log.embedded import batch
from eventlane.log.embedded.batch import (
    HEADER_SIZE,
    _py_decode_records,
    _py_encode_records,
    encode_batch,
    parse_header,
)
from eventlane.log.record import Header, ProducerRecord, Record

RecordTuple = tuple[bytes | None, bytes | None, tuple[Header, ...], int]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The C extension; a missing build is a test failure, not a skip."""
    return importlib.import_module("eventlane.log._native")


def _native() -> ModuleType:
    # For Hypothesis tests (function-scoped fixtures do not mix with @given).
    return importlib.import_module("eventlane.log._native")


# ---------------------------------------------------------------------------- strategies

nullable_bytes = st.none() | st.binary(max_size=24)
headers = st.lists(st.tuples(st.text(max_size=6), nullable_bytes), max_size=3).map(tuple)
base_timestamps = st.integers(min_value=-(2**40), max_value=2**41)


@st.composite
def record_lists(draw: st.DrawFn) -> tuple[list[RecordTuple], int, list[int] | None]:
    base_ts = draw(base_timestamps)
    n = draw(st.integers(min_value=0, max_value=8))
    records: list[RecordTuple] = []
    for _ in range(n):
        ts = base_ts + draw(st.integers(min_value=-(2**35), max_value=2**35))
        records.append((draw(nullable_bytes), draw(nullable_bytes), draw(headers), ts))
    deltas: list[int] | None = None
    if draw(st.booleans()):
        gaps = draw(st.lists(st.integers(min_value=1, max_value=1000), min_size=n, max_size=n))
        first = draw(st.integers(min_value=0, max_value=100))
        deltas = []
        acc = first
        for gap in gaps:
            deltas.append(acc)
            acc += gap
    return records, base_ts, deltas


def _expected_records(
    records: list[RecordTuple],
    deltas: list[int] | None,
    base_offset: int,
    topic: str,
    partition: int,
    timestamp_type: int,
    min_offset: int = 0,
) -> list[Record]:
    out = []
    for i, (key, value, hdrs, ts) in enumerate(records):
        offset = base_offset + (i if deltas is None else deltas[i])
        if offset >= min_offset:
            out.append(Record(topic, partition, offset, ts, timestamp_type, key, value, hdrs))
    return out


def _decode_both(native: ModuleType, buf: Any, start: int, end: int, *rest: Any) -> tuple[Any, Any]:
    """(python result or exception, native result or exception)."""
    results: list[Any] = []
    for fn in (_py_decode_records, native.decode_records):
        try:
            results.append(fn(buf, start, end, *rest))
        except Exception as exc:
            results.append(exc)
    return results[0], results[1]


def _assert_same_outcome(py: Any, nat: Any) -> None:
    if isinstance(py, Exception):
        # The reference may leak struct.error when a malformed record ends the buffer (it
        # reads a length field past the record); the C decoder always says ValueError.
        assert isinstance(py, (ValueError, struct.error)), repr(py)
        assert isinstance(nat, ValueError), f"python raised {py!r}, native gave {nat!r}"
    else:
        assert not isinstance(nat, Exception), f"python decoded, native raised {nat!r}"
        assert nat == py
        assert all(type(r) is Record for r in nat)


# ---------------------------------------------------------------------------- round trips


@given(record_lists())
def test_native_encode_equals_python_encode(case: Any) -> None:
    records, base_ts, deltas = case
    native = _native()
    expected = _py_encode_records(records, base_ts, deltas)
    assert native.encode_records(records, base_ts, deltas) == expected
    assert native.encode_records(tuple(records), base_ts, deltas) == expected
    if deltas is None:
        assert native.encode_records(records, base_ts) == expected
    # timestamps given as a column replace the records' own (None here, as the log passes)
    stamps = [r[3] for r in records]
    unresolved = [(k, v, h, None) for k, v, h, _ in records]
    assert native.encode_records(unresolved, base_ts, deltas, stamps) == expected
    assert _py_encode_records(unresolved, base_ts, deltas, stamps) == expected


def test_encode_rejects_a_short_timestamp_column(native: ModuleType) -> None:
    records = [(b"k", b"v", (), None), (b"k", b"v", (), None)]
    for encode in (native.encode_records, _py_encode_records):
        with pytest.raises(ValueError, match="timestamps has 1 entries for 2 records"):
            encode(records, 0, None, [5])
        with pytest.raises(TypeError):
            encode(records, 0, None, [5, "6"])
    with pytest.raises(TypeError):
        native.encode_records(records, 0)  # unresolved and no column


@given(record_lists(), st.integers(min_value=0, max_value=2**50), st.sampled_from([0, 1]))
def test_native_decode_equals_python_decode_equals_input(
    case: Any, base_offset: int, timestamp_type: int
) -> None:
    records, base_ts, deltas = case
    native = _native()
    body = native.encode_records(records, base_ts, deltas)
    prefix, suffix = b"\xaa" * 7, b"\xbb" * 5  # the records sit inside a larger buffer
    buf = prefix + body + suffix
    start, end = len(prefix), len(prefix) + len(body)
    args = (base_offset, base_ts, timestamp_type, "orders", 3, 0, Record)
    expected = _expected_records(records, deltas, base_offset, "orders", 3, timestamp_type)
    py = _py_decode_records(buf, start, end, *args)
    nat = native.decode_records(buf, start, end, *args)
    assert py == expected
    assert nat == expected
    assert all(type(r) is Record for r in nat)


@given(record_lists(), st.integers(min_value=0, max_value=1200))
def test_min_offset_skips_earlier_records(case: Any, min_offset: int) -> None:
    records, base_ts, deltas = case
    native = _native()
    body = native.encode_records(records, base_ts, deltas)
    args = (100, base_ts, 0, "t", 0, 100 + min_offset, Record)
    expected = _expected_records(records, deltas, 100, "t", 0, 0, 100 + min_offset)
    assert native.decode_records(body, 0, len(body), *args) == expected
    assert _py_decode_records(body, 0, len(body), *args) == expected


def test_extreme_integers_round_trip(native: ModuleType) -> None:
    records = [
        (b"k", b"v", (), INT64_MAX),
        (None, None, (("", None),), INT64_MIN + 5),
        (b"", b"", (("\u00e9\U0001f600", b""),), 0),
    ]
    base_ts = 0
    # timestamp deltas do not fit in int64 from base 0 for INT64_MIN+5? they do (>= INT64_MIN)
    deltas = [-(2**31), 0, 2**31 - 1]
    expected = _py_encode_records(records, base_ts, deltas)
    assert native.encode_records(records, base_ts, deltas) == expected
    decoded = native.decode_records(
        expected, 0, len(expected), 2**40, base_ts, 1, "t", 0, 0, Record
    )
    assert decoded == _py_decode_records(expected, 0, len(expected), 2**40, base_ts, 1, "t", 0, 0)
    assert [r.offset for r in decoded] == [2**40 - 2**31, 2**40, 2**40 + 2**31 - 1]
    assert [r.timestamp for r in decoded] == [INT64_MAX, INT64_MIN + 5, 0]


def test_timestamps_beyond_int64_with_an_in_range_delta(native: ModuleType) -> None:
    # The reference subtracts with Python ints; so does the C encoder's slow path.
    base = 2**63 + 10
    records = [(b"k", b"v", (), base + 3)]
    assert native.encode_records(records, base) == _py_encode_records(records, base)


def test_producer_records_and_lists_are_accepted(native: ModuleType) -> None:
    records = [
        ProducerRecord(b"k", b"v", (("h", b"1"),), 5),
        [b"k2", None, [["h2", None]], 6],
    ]
    assert native.encode_records(records, 5) == _py_encode_records(records, 5)  # type: ignore[arg-type]


def test_bytes_like_keys_and_values(native: ModuleType) -> None:
    plain = [(b"key", b"value", (("h", b"hv"),), 10)]
    like = [(bytearray(b"key"), memoryview(b"value"), (("h", bytearray(b"hv")),), 10)]
    assert native.encode_records(like, 10) == native.encode_records(plain, 10)
    assert native.encode_records(like, 10) == _py_encode_records(like, 10)  # type: ignore[arg-type]


def test_empty_records(native: ModuleType) -> None:
    assert native.encode_records([], 0) == b"" == _py_encode_records([], 0)
    assert native.decode_records(b"", 0, 0, 0, 0, 0, "t", 0, 0, Record) == []
    assert native.decode_records(b"abc", 2, 1, 0, 0, 0, "t", 0, 0, Record) == []


# ---------------------------------------------------------------------------- the objects


def _one_batch(native: ModuleType, n: int = 3) -> bytes:
    records = [(b"k%d" % i, b"v%d" % i, (("h", b"x"),), 1000 + i) for i in range(n)]
    body: bytes = native.encode_records(records, 1000)
    return body


def test_decoded_records_are_real_records(native: ModuleType) -> None:
    body = _one_batch(native)
    recs = native.decode_records(body, 0, len(body), 10, 1000, 0, "orders", 2, 0, Record)
    r = recs[1]
    assert type(r) is Record
    assert isinstance(r, tuple)
    assert (r.topic, r.partition, r.offset, r.timestamp) == ("orders", 2, 11, 1001)
    assert (r.timestamp_type, r.key, r.value, r.headers) == (0, b"k1", b"v1", (("h", b"x"),))
    assert r == Record("orders", 2, 11, 1001, 0, b"k1", b"v1", (("h", b"x"),))
    assert hash(r) == hash(Record("orders", 2, 11, 1001, 0, b"k1", b"v1", (("h", b"x"),)))
    assert r._replace(offset=5).offset == 5
    assert r._asdict()["key"] == b"k1"
    assert pickle.loads(pickle.dumps(r)) == r
    assert repr(r).startswith("Record(topic='orders'")
    assert len(r) == 8


def test_topic_and_partition_objects_are_shared(native: ModuleType) -> None:
    body = _one_batch(native, 5)
    topic = "".join(["ord", "ers"])  # a fresh str object
    partition = 123456  # not a cached small int
    recs = native.decode_records(body, 0, len(body), 0, 1000, 0, topic, partition, 0, Record)
    assert all(r.topic is topic and r.partition is partition for r in recs)


def test_default_record_cls_and_other_record_classes(native: ModuleType) -> None:
    body = _one_batch(native)
    default = native.decode_records(body, 0, len(body), 0, 1000, 0, "t", 0, 0)
    assert default == native.decode_records(body, 0, len(body), 0, 1000, 0, "t", 0, 0, Record)
    assert all(type(r) is Record for r in default)

    class WithDict(Record):  # no __slots__: must go through the constructor
        pass

    sub = native.decode_records(body, 0, len(body), 0, 1000, 0, "t", 0, 0, WithDict)
    assert all(type(r) is WithDict for r in sub) and sub == default

    plain = native.decode_records(body, 0, len(body), 0, 1000, 0, "t", 0, 0, tuple)
    assert all(type(r) is tuple for r in plain) and plain == [tuple(r) for r in default]

    def as_dict(*fields: Any) -> dict[str, Any]:
        return dict(zip(Record._fields, fields, strict=True))

    assert native.decode_records(body, 0, len(body), 0, 1000, 0, "t", 0, 0, as_dict) == [
        r._asdict() for r in default
    ]


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "mmap"])
def test_any_buffer(native: ModuleType, kind: str, tmp_path: Any) -> None:
    body = b"\x00" * 9 + _one_batch(native, 4)
    expected = native.decode_records(body, 9, len(body), 0, 1000, 0, "t", 0, 0, Record)
    if kind == "bytes":
        buf: Any = body
    elif kind == "bytearray":
        buf = bytearray(body)
    elif kind == "memoryview":
        buf = memoryview(b"\xff" + body)[1:]
    else:
        path = tmp_path / "seg"
        path.write_bytes(body)
        with path.open("rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    got = native.decode_records(buf, 9, len(body), 0, 1000, 0, "t", 0, 0, Record)
    assert got == expected == _py_decode_records(buf, 9, len(body), 0, 1000, 0, "t", 0, 0)
    if kind == "mmap":
        del got
        buf.close()  # no buffer export left behind


def test_no_reference_leaks(native: ModuleType) -> None:
    body = _one_batch(native, 4)
    bad = body[:-1]
    topic, partition = "leak-check", 98765
    gc.collect()
    before = (sys.getrefcount(topic), sys.getrefcount(partition), sys.getrefcount(Record))
    for _ in range(200):
        native.decode_records(body, 0, len(body), 0, 1000, 0, topic, partition, 0, Record)
        native.decode_records(body, 0, len(body), 0, 1000, 0, topic, partition, 2, Record)
        with pytest.raises(ValueError):
            native.decode_records(bad, 0, len(bad), 0, 1000, 0, topic, partition, 0, Record)
        with pytest.raises(TypeError):
            native.encode_records([(b"k", "str", (), 1)], 0)
    gc.collect()
    after = (sys.getrefcount(topic), sys.getrefcount(partition), sys.getrefcount(Record))
    assert after == before


# ---------------------------------------------------------------------------- bad input: encode


@pytest.mark.parametrize(
    ("records", "error", "match"),
    [
        ([(b"k", b"v", (), 1), (b"k", "text", (), 1)], TypeError, "record 1: value"),
        ([("k", b"v", (), 1)], TypeError, "record 0: key"),
        ([(b"k", b"v", (), 1.5)], TypeError, "record 0: timestamp"),
        ([(b"k", b"v", (), None)], TypeError, "record 0: timestamp"),
        ([(b"k", b"v")], TypeError, "record 0 must be a"),
        ([b"kv"], TypeError, "record 0 must be a"),
        ([(b"k", b"v", ((b"name", b"v"),), 1)], TypeError, "record 0: header name"),
        ([(b"k", b"v", (("name",),), 1)], TypeError, "record 0: a header"),
        ([(b"k", b"v", (("n", "text"),), 1)], TypeError, "record 0: header value"),
        ([(b"k", b"v", "headers", 1)], TypeError, "record 0: headers"),
        ([(b"k", b"v", (), 2**64)], ValueError, "record 0: timestamp delta"),
        ([(b"k", b"v", (("\ud800", b""),), 1)], UnicodeEncodeError, "surrogate"),
    ],
)
def test_encode_rejects_bad_records(
    native: ModuleType, records: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        native.encode_records(records, 0)


def test_encode_rejects_bad_offset_deltas(native: ModuleType) -> None:
    records = [(b"k", b"v", (), 1), (b"k", b"v", (), 2)]
    with pytest.raises(ValueError, match="offset_deltas has 1 entries for 2 records"):
        native.encode_records(records, 0, [0])
    with pytest.raises(ValueError, match="record 1: offset delta does not fit"):
        native.encode_records(records, 0, [0, 2**31])
    with pytest.raises(TypeError, match="record 0: offset delta must be an int"):
        native.encode_records(records, 0, ["0", 1])
    with pytest.raises(TypeError):
        native.encode_records(records, "0")
    with pytest.raises(TypeError):
        native.encode_records(42, 0)


def test_encode_survives_records_mutated_by_index(native: ModuleType) -> None:
    # __index__ runs Python code in the middle of encoding; the encoder works on a snapshot
    # and bounds-checks its writes, so mutation can only raise, never corrupt memory.
    shared: list[Any] = [b"k", b"v" * 10, [("h", b"x")], 1]

    class Evil:
        def __index__(self) -> int:
            shared[1] = b"v" * 10_000
            shared[2].append(("more", b"y" * 100))
            return 2

    records = [shared, (b"k", b"v", (), Evil())]
    body = native.encode_records(records, 0)
    assert body == _py_encode_records([shared, (b"k", b"v", (), 2)], 0)  # type: ignore[list-item]


# ---------------------------------------------------------------------------- bad input: decode

DECODE_ARGS = (0, 1000, 0, "t", 0, 0, Record)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x00" * 19, "record header runs past the batch end"),
        (struct.pack(">iiqi", 19, 0, 0, -1), "record length 19 runs past"),
        (struct.pack(">iiqi", 1000, 0, 0, -1), "record length 1000 runs past"),
        (struct.pack(">iiqi", 20, 0, 0, -1) + b"\xff" * 4, "record length does not match"),
        (struct.pack(">iiqiii", 24, 0, 0, 9, 0, 0), "bad key length 9"),
        (struct.pack(">iiqiii", 24, 0, 0, -2, 0, 0), "bad key length -2"),
        (struct.pack(">iiqiii", 24, 0, 0, -1, 9, 0), "bad value length 9"),
        (struct.pack(">iiqiii", 24, 0, 0, -1, -1, 1), "bad header count 1"),
        (struct.pack(">iiqiii", 24, 0, 0, -1, -1, -1), "bad header count -1"),
        (struct.pack(">iiqiiiii", 32, 0, 0, -1, -1, 1, 9, -1), "bad header name length 9"),
        (struct.pack(">iiqiiiii", 32, 0, 0, -1, -1, 1, 0, 1), "bad header value length 1"),
        (struct.pack(">iiqiiiii", 32, 0, 0, -1, -1, 1, 0, -2), "bad header value length -2"),
        (struct.pack(">iiqiiiiii", 36, 0, 0, -1, -1, 1, 0, -1, 0), "does not match its fields"),
    ],
)
def test_decode_rejects_malformed_records(native: ModuleType, raw: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        native.decode_records(raw, 0, len(raw), *DECODE_ARGS)
    padded = raw + b"\x00" * 64  # the reference needs slack to fail with a ValueError
    with pytest.raises(ValueError):
        native.decode_records(padded, 0, len(raw), *DECODE_ARGS)
    with pytest.raises(ValueError):
        _py_decode_records(padded, 0, len(raw), *DECODE_ARGS)


def test_decode_rejects_bad_utf8_header_name(native: ModuleType) -> None:
    raw = struct.pack(">iiqiiiib", 33, 0, 0, -1, -1, 1, 1, -1) + struct.pack(">i", -1)
    with pytest.raises(UnicodeDecodeError):
        native.decode_records(raw, 0, len(raw), *DECODE_ARGS)
    with pytest.raises(UnicodeDecodeError):
        _py_decode_records(raw, 0, len(raw), *DECODE_ARGS)


def test_decode_span_outside_the_buffer(native: ModuleType) -> None:
    body = _one_batch(native)
    with pytest.raises(ValueError, match="outside the buffer"):
        native.decode_records(body, 0, len(body) + 1, *DECODE_ARGS)
    with pytest.raises(ValueError, match="outside the buffer"):
        native.decode_records(body, -1, len(body), *DECODE_ARGS)


def test_short_record_at_the_buffer_end_is_a_value_error_in_both() -> None:
    # A 20-byte record body with null key and value has no room for its header count: both
    # decoders must say so with ValueError, never read past the buffer.
    raw = struct.pack(">iiqii", 20, 0, 0, -1, -1)
    with pytest.raises(ValueError):
        _py_decode_records(raw, 0, len(raw), *DECODE_ARGS)
    with pytest.raises(ValueError, match="record length does not match"):
        _native().decode_records(raw, 0, len(raw), *DECODE_ARGS)


# ---------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(raw: bytes) -> None:
    native = _native()
    py, nat = _decode_both(native, raw, 0, len(raw), *DECODE_ARGS)
    _assert_same_outcome(py, nat)


@FUZZ
@given(record_lists(), st.data())
def test_fuzz_bit_flips_and_truncation(case: Any, data: st.DataObject) -> None:
    records, base_ts, deltas = case
    assume(records)
    native = _native()
    body = bytearray(native.encode_records(records, base_ts, deltas))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        bit = data.draw(st.integers(min_value=0, max_value=len(body) * 8 - 1))
        body[bit // 8] ^= 1 << (bit % 8)
    end = data.draw(st.integers(min_value=0, max_value=len(body)))
    args = (5, base_ts, 0, "t", 0, 0, Record)
    py, nat = _decode_both(native, bytes(body), 0, end, *args)
    _assert_same_outcome(py, nat)
    # Same, with the records followed by other bytes in the buffer (as in a segment).
    py, nat = _decode_both(native, bytes(body) + b"\x7f" * 16, 0, end, *args)
    _assert_same_outcome(py, nat)


@FUZZ
@given(st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), min_size=1, max_size=12))
def test_fuzz_structured_lengths(fields: list[int]) -> None:
    # Plausible-looking records: a valid length prefix, then arbitrary int32 fields.
    native = _native()
    tail = b"".join(struct.pack(">i", f) for f in fields[1:])
    rest = struct.pack(">iq", fields[0] & 0xFFFF, 0) + tail
    raw = struct.pack(">i", len(rest)) + rest
    py, nat = _decode_both(native, raw, 0, len(raw), *DECODE_ARGS)
    _assert_same_outcome(py, nat)


# ---------------------------------------------------------------------------- pure Python


@given(record_lists())
def test_python_codec_round_trip(case: Any) -> None:
    records, base_ts, deltas = case
    body = _py_encode_records(records, base_ts, deltas)
    expected = _expected_records(records, deltas, 7, "t", 1, 0)
    assert _py_decode_records(body, 0, len(body), 7, base_ts, 0, "t", 1, 0) == expected


def test_batch_module_uses_native(native: ModuleType) -> None:
    assert batch.NATIVE
    assert batch.encode_records is native.encode_records
    assert batch.decode_records is native.decode_records


def test_decoded_records_are_not_tracked_by_the_cyclic_gc() -> None:
    # Records hold only atoms and tuples of atoms; leaving them tracked made every GC pass
    # walk all decoded records held alive (half of send_batch's and compaction's time).
    raw = encode_batch(0, [(b"k", b"v", (("h", b"x"), ("n", None)), 1000)] * 3)
    header = parse_header(raw, 0)
    records = _native().decode_records(
        raw, HEADER_SIZE, header.size, 0, header.base_timestamp, 0, "t", 0, 0, Record
    )
    assert len(records) == 3
    for record in records:
        assert not gc.is_tracked(record)
        assert not gc.is_tracked(record.headers)
        assert all(not gc.is_tracked(pair) for pair in record.headers)
