"""The listener's fetch from stored batches (``LogStore.read_batches`` + ``encode_stored``)
against the record path it replaces (``LogStore.read`` + ``encode_batch``) as the model.

For generated logs (keys, null keys and values, headers with null values, CreateTime and
LogAppendTime, several segments, compaction gaps, a moved low-water mark) and fetches
(offsets inside batches, ``upto`` inside batches, small ``max_bytes``), the stored-batch
answer is byte for byte the record path's, and kafka-python's own reader (an independent
decoder; CRCs checked) reads it back as exactly the records ``read`` returns. A damaged
stored batch is refused by the raw read as by ``read``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kafka_records import read_back  # kafka-python's reader, CRCs checked

from eventlane.errors import CorruptRecordError
from eventlane.kafka.records import FROM_STORED, encode_batch, encode_stored
from eventlane.log import LogStore, Record

T0 = 1_764_000_000_000

keys = st.sampled_from([None, b"a", b"b", b"c", b"d", b"a-key-longer-than-sixteen-bytes"])
values = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=40))), max_size=3
).map(tuple)
timestamps = st.one_of(st.none(), st.integers(0, 1 << 45), st.integers(T0, T0 + 5_000))
records = st.tuples(keys, values, headers, timestamps)
batches = st.lists(
    st.tuples(st.lists(records, min_size=1, max_size=25), st.booleans()), min_size=1, max_size=20
)
probes = st.lists(
    st.tuples(
        st.floats(0, 1),  # where the fetch starts, between the low- and high-water marks
        st.one_of(st.none(), st.floats(0, 1)),  # ``upto`` between the fetch offset and HWM
        st.sampled_from([1, 60, 300, 2_000, 1 << 20]),  # max_bytes
    ),
    min_size=1,
    max_size=8,
)


def as_read(records: list[Record]) -> list[tuple[object, ...]]:
    return [
        (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)) for r in records
    ]


def check_fetch(store: LogStore, offset: int, upto: int, max_bytes: int) -> int:
    """One fetch both ways; how many records it returned."""
    assert FROM_STORED, "eventlane.kafka._wire is not built (setup.py build_ext)"
    model, _ = store.read("t", 0, offset, max_bytes=max_bytes, upto=upto)
    stored = store.read_batches("t", 0, offset, max_bytes=max_bytes, upto=upto)
    assert bool(stored) == bool(model), (offset, upto, max_bytes)
    if not model:
        return 0
    blob, count = encode_stored(stored, offset, upto)
    assert count == len(model)
    assert bytes(blob) == encode_batch(model), (offset, upto, max_bytes)
    assert read_back(bytes(blob)) == as_read(model)
    return count


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches=batches,
    log_append_time=st.booleans(),
    compact=st.booleans(),
    trim=st.floats(0, 0.5),
    probes=probes,
)
def test_stored_fetch_equals_the_record_path(
    batches: list[
        tuple[
            list[
                tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int | None]
            ],
            bool,
        ]
    ],
    log_append_time: bool,
    compact: bool,
    trim: float,
    probes: list[tuple[float, float | None, int]],
) -> None:
    config = {
        "segment.bytes": 4_000,
        "flush.policy": "os",  # durability is not what this test is about
        "cleanup.policy": "compact" if compact else "delete",
        "timestamp.type": "LogAppendTime" if log_append_time else "CreateTime",
    }
    with tempfile.TemporaryDirectory() as d:
        store = LogStore(Path(d))
        try:
            store.create_topic("t", 1, config)
            for batch, roll in batches:
                # a compacted topic takes keyed records only
                keyed = [(k or b"z", v, h, ts) for k, v, h, ts in batch] if compact else batch
                store.append("t", 0, keyed)
                if roll:
                    store.roll("t", 0)
            if compact:
                store.compact("t")
            marks = store.offsets("t", 0)
            if trim and not compact:
                store.delete_records("t", 0, marks.lwm + int(trim * (marks.hwm - marks.lwm)))
            marks = store.offsets("t", 0)
            check_fetch(store, marks.lwm, marks.hwm, 1 << 30)  # the whole log at once
            for start, stop, max_bytes in probes:
                offset = marks.lwm + int(start * (marks.hwm - marks.lwm))
                upto = marks.hwm if stop is None else offset + int(stop * (marks.hwm - offset))
                check_fetch(store, offset, upto, max_bytes)
        finally:
            store.close()


def test_compaction_gaps_and_append_time_runs_are_kept(tmp_path: Path) -> None:
    """The cases the generator may rarely hit, made sure of: a compacted log whose first
    batches lost records (gaps inside and between batches, a fetch inside a gap), and a
    LogAppendTime log whose batches got different append times (one Kafka batch each)."""
    store = LogStore(tmp_path)
    try:
        store.create_topic(
            "t", 1, {"segment.bytes": 2_000, "cleanup.policy": "compact", "flush.policy": "os"}
        )
        for round_ in range(12):
            store.append(
                "t",
                0,
                [(b"k%d" % (i % 4), b"%d" % round_, (("h", None),), T0 + i) for i in range(10)],
            )
        store.roll("t", 0)
        store.compact("t")
        marks = store.offsets("t", 0)
        whole, _ = store.read("t", 0, marks.lwm, max_bytes=1 << 30)
        assert len(whole) < marks.hwm - marks.lwm  # compaction removed records
        for offset in range(marks.lwm, marks.hwm):
            check_fetch(store, offset, marks.hwm, 1 << 20)
            check_fetch(store, offset, marks.hwm, 1)
        store.create_topic("u", 1, {"timestamp.type": "LogAppendTime"})
        for _ in range(3):
            store.append("u", 0, [(None, b"v", (), None)] * 5)
        records, _ = store.read("u", 0, 0)
        blob, count = encode_stored(store.read_batches("u", 0, 0), 0, 15)
        assert count == 15 and bytes(blob) == encode_batch(records)
        assert read_back(bytes(blob)) == as_read(records)
    finally:
        store.close()


def test_a_damaged_stored_batch_is_refused_as_by_read(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    try:
        store.create_topic("t", 1)
        for _ in range(3):
            store.append("t", 0, [(b"k", b"v" * 50, (), None)] * 4)
        (segment,) = tmp_path.rglob("*.log")
        raw = bytearray(segment.read_bytes())
        raw[len(raw) // 2] ^= 0x40  # inside the second batch
        fd = os.open(segment, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(raw), 0)
        finally:
            os.close(fd)
        with pytest.raises(CorruptRecordError) as read_error:
            store.read("t", 0, 4)
        with pytest.raises(CorruptRecordError) as raw_error:
            store.read_batches("t", 0, 4)
        assert raw_error.value.offset == read_error.value.offset == 4
    finally:
        store.close()
