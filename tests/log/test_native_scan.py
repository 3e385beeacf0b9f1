"""The cleaner's key scan and the producer's metadata builder: C against pure Python.

``index_keys`` (the cleaner's pass 1) must leave the same ``key -> last offset`` map and
return the same record count as ``batch._py_index_keys`` for any batch, and reject malformed
framing with ``ValueError`` as the decoder does; ``metadata_list`` must build exactly the
``RecordMetadata`` list the Python expression builds, untracked by the cyclic GC.
"""

from __future__ import annotations

import gc
import importlib
import random
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from framework.log import batch
from framework.log.batch import _py_encode_records, _py_index_keys
from framework.log.cleaner import key_id
from framework.log.producer import _py_metadata_list
from framework.log.record import RecordMetadata


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The C extension; a missing build is a test failure, not a skip."""
    return importlib.import_module("framework.log._native")


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
    native = importlib.import_module("framework.log._native")
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
    native = importlib.import_module("framework.log._native")
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


@given(
    st.text(max_size=5),
    st.integers(0, 99),
    st.integers(0, 2**60),
    st.lists(st.integers(0, 2**62), max_size=20),
)
def test_metadata_list_agrees_with_python(
    topic: str, part: int, base: int, stamps: list[int]
) -> None:
    native = importlib.import_module("framework.log._native")
    got = native.metadata_list(RecordMetadata, topic, part, base, stamps)
    assert got == _py_metadata_list(RecordMetadata, topic, part, base, stamps)
    assert all(type(m) is RecordMetadata for m in got)


def test_metadata_is_not_tracked_by_the_cyclic_gc(native: ModuleType) -> None:
    metas = native.metadata_list(RecordMetadata, "t", 3, 10, [5, 6, 7])
    assert metas[2] == RecordMetadata("t", 3, 12, 7)
    assert metas[2].offset == 12 and metas[2]._asdict()["timestamp"] == 7
    assert not any(gc.is_tracked(m) for m in metas)


def test_metadata_list_calls_other_classes(native: ModuleType) -> None:
    got = native.metadata_list(lambda *a: a, "t", 0, 1, [9])
    assert got == [("t", 0, 1, 9)]
    with pytest.raises(TypeError):
        native.metadata_list(RecordMetadata, "t", 0, 1)
    with pytest.raises(TypeError):
        native.metadata_list(RecordMetadata, "t", 0, 1, 5)
