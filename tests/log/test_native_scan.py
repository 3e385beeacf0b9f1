"""The cleaner's key scans (C against pure Python) and the producer's lazy metadata.

``index_keys`` (the cleaner's pass 1) must leave the same ``key -> last offset`` map and
return the same record count as ``batch._py_index_keys`` for any batch, and reject malformed
framing with ``ValueError`` as the decoder does; ``keep_flags`` (pass 2's decision) must
agree with ``cleaner._py_keep_flags`` the same way. ``SentBatch`` must hold exactly the
``RecordMetadata`` items the producer used to build as a list.
"""

from __future__ import annotations

import importlib
import random
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlane.log.embedded import batch, cleaner
from eventlane.log.embedded.batch import _py_encode_records, _py_index_keys
from eventlane.log.embedded.cleaner import _py_keep_flags, key_id
from eventlane.log.producer import SentBatch
from eventlane.log.record import RecordMetadata


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The C extension; a missing build is a test failure, not a skip."""
    return importlib.import_module("eventlane.log._native")


keys = st.none() | st.binary(max_size=24)  # some longer than 16 bytes: hashed by key_id
values = st.none() | st.binary(max_size=12)
header_lists = st.lists(st.tuples(st.text(max_size=4), values), max_size=2).map(tuple)
records = st.lists(
    st.tuples(keys, values, header_lists, st.integers(0, 2**40)), min_size=0, max_size=12
)


def _both(native: ModuleType, buf: Any, start: int, end: int, base: int) -> tuple[Any, Any]:
    out: list[Any] = []
    for fn in (_py_index_keys, native.index_keys):
        last: dict[bytes, int] = {b"old": -1}
        try:
            out.append((fn(buf, start, end, base, last, key_id), last))
        except (ValueError, IndexError) as exc:
            out.append(type(exc))
    return out[0], out[1]


@given(records, st.integers(0, 2**50), st.booleans())
def test_index_keys_agrees_with_python(recs: list[Any], base: int, gaps: bool) -> None:
    native = importlib.import_module("eventlane.log._native")
    deltas = [i * 3 + 1 for i in range(len(recs))] if gaps else None
    body = _py_encode_records(recs, 0, deltas)
    py, nat = _both(native, b"xx" + body, 2, 2 + len(body), base)
    assert nat == py
    count, last = nat
    assert count == len(recs)
    expected = {b"old": -1}
    for i, (key, *_rest) in enumerate(recs):
        if key is not None:
            expected[key_id(key)] = base + (i if deltas is None else deltas[i])
    assert last == expected


@given(st.binary(max_size=80))
def test_index_keys_rejects_garbage_like_the_decoder(raw: bytes) -> None:
    native = importlib.import_module("eventlane.log._native")
    py, nat = _both(native, raw, 0, len(raw), 0)
    if isinstance(py, type):
        assert nat is ValueError
    else:
        assert nat == py


def test_index_keys_on_truncated_and_flipped_batches(native: ModuleType) -> None:
    rng = random.Random(15)
    recs = [(b"k%d" % i, b"v" * i, (("h", b"x"),), 1000 + i) for i in range(20)]
    body = _py_encode_records(recs, 1000, None)
    for _ in range(300):
        raw = bytearray(body)
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        cut = rng.randrange(len(raw) + 1)
        py, nat = _both(native, bytes(raw[:cut]), 0, cut, 7)
        if isinstance(py, type):
            assert nat is ValueError
        else:
            assert nat == py


def test_index_keys_span_outside_the_buffer(native: ModuleType) -> None:
    with pytest.raises(ValueError, match="outside the buffer"):
        native.index_keys(b"abc", 0, 10, 0, {}, key_id)


def test_batch_module_uses_native_index_keys(native: ModuleType) -> None:
    assert batch.index_keys is native.index_keys


def _flags_both(
    native: ModuleType, buf: Any, start: int, end: int, base: int, last: Any, horizon: int
) -> tuple[Any, Any]:
    out: list[Any] = []
    for fn in (_py_keep_flags, native.keep_flags):
        try:
            out.append(fn(buf, start, end, base, dict(last), key_id, horizon))
        except (ValueError, IndexError) as exc:
            out.append(type(exc))
    return out[0], out[1]


@given(records, st.integers(0, 2**50), st.booleans(), st.randoms(use_true_random=False))
def test_keep_flags_agrees_with_python(
    recs: list[Any], base: int, gaps: bool, rng: random.Random
) -> None:
    native = importlib.import_module("eventlane.log._native")
    deltas = [i * 3 + 1 for i in range(len(recs))] if gaps else None
    offsets = [base + (i if deltas is None else deltas[i]) for i in range(len(recs))]
    last: dict[bytes, int] = {}
    for (key, *_rest), offset in zip(recs, offsets, strict=True):
        if key is not None and rng.random() < 0.8:  # some keys unseen, some stale
            last[key_id(key)] = offset if rng.random() < 0.7 else offset + rng.choice((-1, 1))
    horizon = rng.choice([-1, base, *offsets, 2**62])
    body = _py_encode_records(recs, 1000, deltas)
    py, nat = _flags_both(native, b"xx" + body, 2, 2 + len(body), base, last, horizon)
    assert nat == py
    flags, max_delta = nat
    expected = [
        key is not None
        and last.get(key_id(key)) == offset
        and not (value is None and offset < horizon)
        for (key, value, _h, _t), offset in zip(recs, offsets, strict=True)
    ]
    assert list(map(bool, flags)) == expected
    kept_ts = [r[3] - 1000 for r, keep in zip(recs, expected, strict=True) if keep]
    assert max_delta == (max(kept_ts) if kept_ts else None)


@given(st.binary(max_size=80))
def test_keep_flags_rejects_garbage_like_the_decoder(raw: bytes) -> None:
    native = importlib.import_module("eventlane.log._native")
    py, nat = _flags_both(native, raw, 0, len(raw), 0, {}, 0)
    if isinstance(py, type):
        assert nat is ValueError
    else:
        assert nat == py


def test_keep_flags_on_truncated_and_flipped_batches(native: ModuleType) -> None:
    rng = random.Random(16)
    recs = [
        (b"k%d" % (i % 7), None if i % 5 == 0 else b"v" * i, (("h", b"x"),), i) for i in range(20)
    ]
    body = _py_encode_records(recs, 0, None)
    last = {b"k%d" % k: 7 + 13 + k - 6 for k in range(7)}
    for _ in range(300):
        raw = bytearray(body)
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        cut = rng.randrange(len(raw) + 1)
        py, nat = _flags_both(native, bytes(raw[:cut]), 0, cut, 7, last, 17)
        if isinstance(py, type):
            assert nat is ValueError
        else:
            assert nat == py


def test_keep_flags_compares_other_offsets_as_python_does(native: ModuleType) -> None:
    body = _py_encode_records([(b"k", b"v", (), 0), (b"j", b"v", (), 0)], 0, None)
    last: Any = {b"k": 5.0, b"j": 2**70}  # not exact ints: still compared by value
    assert native.keep_flags(body, 0, len(body), 5, last, key_id, 0) == (b"\x01\x00", 0)
    with pytest.raises(ValueError, match="outside the buffer"):
        native.keep_flags(b"abc", 0, 10, 0, {}, key_id, 0)


def test_cleaner_uses_native_keep_flags(native: ModuleType) -> None:
    assert cleaner.keep_flags is native.keep_flags


@given(
    st.text(max_size=5),
    st.integers(0, 99),
    st.integers(0, 2**60),
    st.lists(st.integers(0, 2**62), max_size=20),
)
def test_sent_batch_is_the_metadata_list(
    topic: str, part: int, base: int, stamps: list[int]
) -> None:
    expected = [RecordMetadata(topic, part, base + i, t) for i, t in enumerate(stamps)]
    got = SentBatch(topic, part, range(base, base + len(stamps)), stamps)
    assert got == expected and expected == got and list(got) == expected
    assert [got[i] for i in range(-len(got), len(got))] == expected + expected
    assert got[1:3] == expected[1:3] and len(got) == len(expected)
    assert all(type(m) is RecordMetadata for m in got)
    with pytest.raises(IndexError):
        got[len(stamps)]


def test_sent_batch_of_several_partitions() -> None:
    got = SentBatch("t", [2, 0, 2], [7, 3, 8], [10, 11, 12])
    assert list(got) == [
        RecordMetadata("t", 2, 7, 10),
        RecordMetadata("t", 0, 3, 11),
        RecordMetadata("t", 2, 8, 12),
    ]
    assert got[-2] == RecordMetadata("t", 0, 3, 11)
    assert got != [RecordMetadata("t", 2, 7, 10)] and got != "t"
    with pytest.raises(ValueError, match="as long"):
        SentBatch("t", [1], [1, 2], [1, 2])
