"""The listener's produce into stored batches (``parse_batches(framed=True)`` +
``LogStore.append_framed``: a producer's batch transcoded by ``_wire.records_stored`` without
a tuple per record) against the record path it replaces (``parse_batches`` +
``LogStore.append``) as the model.

For generated batches (kafka-python's builder as the independent encoder: keys, null keys
and values, headers with null values and non-ASCII names, negative and far timestamps;
uncompressed, gzip and zstd),
topics (CreateTime and LogAppendTime, compacted, small ``max_record_bytes``) and batch
limits (the log cutting one producer batch into several stored ones), both paths leave the
same bytes in every file of the partition, give the same offsets and timestamps (or the same
error) and read back the same records. Damaged records (bytes changed, the CRC made right
again) are refused by the framed parse exactly as by the tuple parse, or parse to the same
records.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlane.kafka import records as records_module
from eventlane.kafka.records import FRAMED, BatchFormatError, KafkaBatch, parse_batches
from eventlane.log import LogStore
from eventlane.log.embedded import partition as partition_module
from eventlane.log.embedded.batch import encode_batch
from tests.kafka.wire import build

T0 = 1_764_000_000_000
NOW = 1_765_000_000_000


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    # Not a skip: `make test` builds the C extensions, so a missing one is a broken set-up.
    assert FRAMED, "eventlane.kafka._wire is not built: run `make test`"


keys = st.one_of(st.none(), st.binary(max_size=20))
values = st.one_of(st.none(), st.binary(max_size=300))
names = st.one_of(st.text(st.characters(max_codepoint=127), max_size=6), st.text(max_size=4))
headers = st.lists(st.tuples(names, st.one_of(st.none(), st.binary(max_size=30))), max_size=3)
timestamps = st.one_of(
    st.just(-1), st.integers(0, 1 << 45), st.integers(T0, T0 + 5_000), st.just(1 << 62)
)
records = st.tuples(keys, values, headers, timestamps)


def outcome(fn: object) -> object:
    try:
        return fn()  # type: ignore[operator]
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def files(root: Path) -> dict[str, bytes]:
    part = root / "topics" / "t" / "0"
    return {p.name: p.read_bytes() for p in sorted(part.iterdir()) if p.name != "lock"}


def append_framed(store: LogStore, batch: KafkaBatch) -> object:
    """What the listener does (``ProduceApis._append_and_marks``)."""
    result = None
    if batch.framed is not None:
        result = store.append_framed("t", 0, batch.framed)
    if result is None:
        result = store.append("t", 0, batch.log_records())
    return result


def same_files(
    batches: list[list[tuple[bytes | None, bytes | None, list, int]]],
    log_append_time: bool = False,
    compact: bool = False,
    max_record: int = 1_048_588,
    max_batch: int = 1 << 20,
    pid: int = -1,
    codec: int = 0,
) -> None:
    """Each batch produced both ways, into two data directories: the same files, outcomes
    and records."""
    config = {
        "segment.bytes": 3_000,
        "flush.policy": "os",  # durability is not what this test is about
        "cleanup.policy": "compact" if compact else "delete",
        "timestamp.type": "LogAppendTime" if log_append_time else "CreateTime",
        "max.record.bytes": max_record,
    }
    with (
        tempfile.TemporaryDirectory() as a,
        tempfile.TemporaryDirectory() as b,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(partition_module, "MAX_BATCH_BYTES", max_batch)
        model, framed = LogStore(Path(a), clock=lambda: NOW), LogStore(Path(b), clock=lambda: NOW)
        try:
            model.create_topic("t", 1, config)
            framed.create_topic("t", 1, config)
            for produced in batches:
                recs = produced
                if codec:  # compressible: kafka-python sends a batch plain where it would grow
                    recs = [
                        (k, None if v is None else v + bytes(64), h, ts) for k, v, h, ts in recs
                    ]
                raw = build(recs, pid=pid, compression=codec, seq=0 if pid >= 0 else -1)
                # the attributes' compression bits (nothing to compress: null values only)
                assert raw[22] & 0x07 == codec or all(r[1] is None for r in recs)
                (want,) = parse_batches(raw)
                (got,) = parse_batches(raw, framed=True)
                assert got[:3] == want[:3] and got.record_count == len(recs)
                ascii_names = all(n.isascii() for r in recs for n, _ in r[2])
                assert (got.framed is not None) == ascii_names, "the C path is not taken"
                assert got.log_records() == want.records
                expected = outcome(lambda: model.append("t", 0, want.records))
                assert outcome(lambda: append_framed(framed, got)) == expected
            assert files(Path(b)) == files(Path(a))
            assert framed.offsets("t", 0) == model.offsets("t", 0)
            assert framed.read("t", 0, 0, max_bytes=1 << 24) == model.read(
                "t", 0, 0, max_bytes=1 << 24
            )
        finally:
            model.close()
            framed.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches=st.lists(st.lists(records, min_size=1, max_size=30), min_size=1, max_size=4),
    log_append_time=st.booleans(),
    compact=st.booleans(),
    max_record=st.sampled_from([1_048_588, 200]),
    max_batch=st.sampled_from([1 << 20, 400, 60]),
    pid=st.sampled_from([-1, 7]),
    codec=st.sampled_from([0, 0, 1, 4]),  # none, gzip, zstd: decompressed, then transcoded
)
def test_framed_produce_stores_what_the_record_path_stores(
    batches: list[list[tuple[bytes | None, bytes | None, list, int]]],
    log_append_time: bool,
    compact: bool,
    max_record: int,
    max_batch: int,
    pid: int,
    codec: int,
) -> None:
    same_files(batches, log_append_time, compact, max_record, max_batch, pid, codec)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recs=st.lists(records, min_size=1, max_size=8),
    edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255), st.booleans()), max_size=3),
    count_delta=st.sampled_from([0, 0, 0, -1, 1]),
)
def test_damaged_records_are_refused_as_the_tuple_parse_refuses_them(
    recs: list[tuple[bytes | None, bytes | None, list, int]],
    edits: list[tuple[float, int, bool]],
    count_delta: int,
) -> None:
    raw = bytearray(build(recs))
    for where, byte, insert in edits:  # inside the records section (after the 61-byte header)
        at = 61 + int(where * (len(raw) - 61))
        if insert:
            raw[at:at] = bytes([byte])
        elif at < len(raw):
            raw[at] = byte
    struct.pack_into(">i", raw, 8, len(raw) - 12)  # the length and the CRC made right again
    struct.pack_into(">i", raw, 57, len(recs) + count_delta)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    model = outcome(lambda: parse_batches(bytes(raw)))
    got = outcome(lambda: parse_batches(bytes(raw), framed=True))
    if isinstance(model, tuple):  # an error: the same one
        assert got == model
        return
    assert isinstance(got, list) and isinstance(model, list)
    (want,), (batch,) = model, got
    assert batch.log_records() == want.records


def test_a_refused_record_is_refused_by_the_record_path() -> None:
    """``append_framed`` hands back records the log refuses (nothing written); appending
    their tuples raises the log's own error."""
    with tempfile.TemporaryDirectory() as d:
        store = LogStore(Path(d))
        try:
            store.create_topic("t", 1, {"max.record.bytes": 200})
            store.create_topic("c", 1, {"cleanup.policy": "compact"})
            (big,) = parse_batches(build([(b"k", b"x" * 500, [], T0)]), framed=True)
            (keyless,) = parse_batches(build([(None, b"x", [], T0)]), framed=True)
            assert big.framed is not None and keyless.framed is not None
            assert store.append_framed("t", 0, big.framed) is None
            assert store.append_framed("c", 0, keyless.framed) is None
            assert store.offsets("t", 0).leo == store.offsets("c", 0).leo == 0
            (ok,) = parse_batches(build([(b"k", b"v", [("h", None)], T0)] * 3), framed=True)
            assert ok.framed is not None
            result = store.append_framed("t", 0, ok.framed)
            assert result is not None and (result.base_offset, result.last_offset) == (0, 2)
            assert result.timestamps == [T0] * 3
        finally:
            store.close()


def test_a_batch_cut_where_the_records_fill_the_limit_exactly() -> None:
    """Records whose estimated sizes sum to the batch limit exactly stay in one batch (the
    log's cut: at most ``MAX_BATCH_BYTES``), the next starts another."""
    record = (b"k", b"v", [], T0)  # RECORD_OVERHEAD + 2 bytes
    size = partition_module.RECORD_OVERHEAD + 2
    for limit in (size, 2 * size, 3 * size - 1):
        same_files([[record] * 5], max_batch=limit)


def test_a_record_longer_than_its_fields_is_refused() -> None:
    """A record whose length covers the next record too (the batch's count and length
    otherwise right) is malformed for both parses, not two records for the framed one."""
    raw = bytearray(build([(b"a", b"1", [], T0), (b"b", b"2", [], T0)]))
    first = raw[61]  # the first record's length, a one-byte zig-zag varint
    second = raw[61 + 1 + first // 2]
    raw[61] = first + 2 + second  # both records' bytes, as one record's
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    with pytest.raises(BatchFormatError, match="length disagrees") as model:
        parse_batches(bytes(raw))
    with pytest.raises(BatchFormatError) as framed:
        parse_batches(bytes(raw), framed=True)
    assert str(framed.value) == str(model.value)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=200),
    start=st.integers(-2, 210),
    stop=st.integers(-2, 210),
    count=st.integers(-1, 40),
)
def test_the_c_functions_take_any_bytes(data: bytes, start: int, stop: int, count: int) -> None:
    """Arbitrary bytes and ranges: scanned as not transcodable, cut as ``None`` and framed
    as a ``ValueError`` unless ``records_parse`` reads them too (then all three agree)."""
    wire = records_module._WIRE
    try:
        parsed = wire.records_parse(data, start, stop, count, T0)
    except ValueError:
        parsed = None
    scanned = wire.records_scan(data, start, stop, count, T0)
    assert not scanned or parsed is not None
    cut = wire.records_cut(data, start, stop, count, T0, 28, 1 << 20, 1 << 20, False)
    assert (cut is not None) == scanned
    if not scanned or not count:
        with pytest.raises(ValueError):
            wire.records_stored(data, start, stop, count, T0, 0, False, NOW)
        return
    blob, stamps = wire.records_stored(data, start, stop, count, T0, 5, False, NOW)
    assert blob[43:] == encode_batch(5, parsed, timestamps=stamps)[43:]
    assert stamps == [NOW if r[3] is None else r[3] for r in parsed]


FAULTS = """
import resource, sys
from eventlane.kafka.server import keep_freed_memory
kept = sys.argv[1] == "keep" and keep_freed_memory()
def request():  # a megabyte copied into fresh buffers, then freed: as a produce request's are
    frame = bytearray(1 << 20)
    field = bytes(frame)
    stored = bytearray(field)
    del frame, field, stored
for _ in range(3):  # warm: the heap grows once
    request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    request()
print(int(kept), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("mode", ["keep", "default"])
def test_the_listener_process_reuses_freed_megabytes(mode: str) -> None:
    """``eventlane serve --kafka`` keeps freed buffers for reuse (``keep_freed_memory``): 50 requests' worth
    of fresh megabytes then cost almost no page faults (glibc's default returns the freed
    megabytes to the OS and faults 256 pages in again for each)."""
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    kept, faults = int(out[0]), int(out[1])
    if mode == "keep":
        assert kept, "keep_freed_memory changed nothing: the project's machines use glibc"
        assert faults < 3 * 50 * 256 // 10, faults
    else:  # what it saves (glibc's default maps each megabyte afresh): the bound above fails
        assert faults >= 3 * 50 * 256 // 10, faults
