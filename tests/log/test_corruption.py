"""Corruption of durable data is always detected, never silently truncated or skipped.

A template partition (several closed segments and an active one, all fsynced) is copied for
each case, one bit is flipped at a chosen byte of a chosen batch (every header field, the
CRC, record fields, key and value bytes, the last byte), and then:

* ``verify()`` reports it as a :class:`CorruptRecordError` naming the file, the byte position
  of the damaged batch and its offset;
* reading from the low-water mark returns the records before the damaged batch and then
  raises the same error: nothing after it is returned as if the damaged batch did not exist;
* reopening the log (plain reopen, a simulated reboot, or a lost ``state`` file that forces a
  full recovery) never truncates the damaged durable data away: it raises, or reads raise.

Indexes are derived data: a deleted or garbage ``.index``/``.timeindex`` is rebuilt by
recovery and reads and time lookups stay correct.

Byte layout used to aim the flips (eventlane/log/embedded/batch.py): a batch header is base_offset
(0..7), batch_length (8..11), magic (12), crc (13..16), attributes (17..18),
last_offset_delta (19..22), base_timestamp (23..30), max_timestamp (31..38), record_count
(39..42); records follow at 43.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import NamedTuple

import pytest

from eventlane.errors import CorruptRecordError
from eventlane.log import LogStore, Record

TOPIC = "t"
T0 = 1_700_000_000_000
BATCHES = 18
KEY = b"key-%02d"


class Batch(NamedTuple):
    path: Path
    position: int
    size: int
    base_offset: int


def _segment_files(data: Path) -> list[Path]:
    return sorted((data / "topics" / TOPIC / "0").glob("*.log"))


def _batches(path: Path) -> list[Batch]:
    """Walk a segment file by the documented framing (base_offset int64, length int32)."""
    raw = path.read_bytes()
    out, pos = [], 0
    while pos < len(raw):
        base, length = struct.unpack_from(">qi", raw, pos)
        out.append(Batch(path, pos, 12 + length, base))
        pos += 12 + length
    return out


def _all_records(store: LogStore) -> list[Record]:
    lwm = store.offsets(TOPIC, 0).lwm
    out: list[Record] = []
    offset, cursor = lwm, None
    while True:
        records, cursor = store.read(TOPIC, 0, offset, max_bytes=256, cursor=cursor)
        if not records:
            return out
        out.extend(records)
        offset = records[-1].offset + 1


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed, clean data directory: 18 batches of 2 records over 6 segments."""
    data = tmp_path_factory.mktemp("corruption") / "data"
    with LogStore(data, clock=lambda: T0) as store:
        store.create_topic(TOPIC, 1, {"segment_bytes": 520, "index_interval_bytes": 100})
        for i in range(BATCHES):
            store.append(
                TOPIC,
                0,
                [
                    (KEY % i, b"value-%03d-" % i + b"x" * 20, (("h", b"%d" % i),), T0 + 10 * i),
                    (None, b"second-%03d" % i, (), T0 + 10 * i + 5),
                ],
            )
        assert store.verify() == []
    return data


@pytest.fixture
def data(template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(template, copy)
    return copy


def _expected(template: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    with LogStore(template, clock=lambda: T0) as store:
        return [(r.offset, r.key, r.value) for r in _all_records(store)]


# Where to flip, relative to the start of the target batch ("last" = its last byte).
FIELDS = {
    "base_offset_high": 0,
    "base_offset_low": 7,
    "batch_length_high": 8,
    "batch_length_low": 11,
    "magic": 12,
    "crc_first": 13,
    "crc_last": 16,
    "attributes": 18,
    "last_offset_delta": 22,
    "base_timestamp": 30,
    "max_timestamp": 38,
    "record_count": 42,
    "record_length": 46,
    "offset_delta": 50,
    "timestamp_delta": 58,
    "key_length": 62,
    "key": 64,
    "value": 80,
    "header_name": 111,
    "last": -1,
}
# (segment, batch) targets: a batch in the middle of a closed segment, one in the middle of
# the active segment, and the very last batch of the active segment.
TARGETS = {"closed": (1, 1), "active_middle": (-1, 1), "active_last": (-1, -1)}


def _target(data: Path, where: str) -> Batch:
    seg, batch = TARGETS[where]
    segments = _segment_files(data)
    assert len(segments) >= 4
    batches = _batches(segments[seg])
    assert len(batches) >= 2
    return batches[batch]


def _flip(data: Path, where: str, field: str, mask: int) -> Batch:
    target = _target(data, where)
    at = target.position + (FIELDS[field] % target.size)
    with target.path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))
    return target


def _check_error(err: BaseException, target: Batch, field: str) -> None:
    assert isinstance(err, CorruptRecordError), repr(err)
    assert err.path == str(target.path)
    assert err.position == target.position
    assert (err.topic, err.partition) == (TOPIC, 0)
    assert err.offset is not None
    if not field.startswith("base_offset"):
        assert err.offset == target.base_offset
    text = str(err)
    assert str(target.path) in text and f"position={target.position}" in text


@pytest.mark.parametrize("mask", [0x01, 0x80], ids=["bit0", "bit7"])
@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("where", sorted(TARGETS))
def test_flip_is_detected_by_verify_and_read(
    template: Path, data: Path, where: str, field: str, mask: int
) -> None:
    expected = _expected(template)
    target = _flip(data, where, field, mask)
    with LogStore(data, clock=lambda: T0) as store:
        problems = store.verify(TOPIC)
        assert problems, "verify missed the flip"
        _check_error(problems[0], target, field)
        # Reading from the LWM: the records before the damaged batch, then the error.
        got: list[tuple[int, bytes | None, bytes | None]] = []
        offset, cursor = 0, None
        with pytest.raises(CorruptRecordError) as info:
            while True:
                records, cursor = store.read(TOPIC, 0, offset, max_bytes=200, cursor=cursor)
                assert records, "read reached the end without meeting the damaged batch"
                got.extend((r.offset, r.key, r.value) for r in records)
                offset = records[-1].offset + 1
        _check_error(info.value, target, field)
        assert got == [e for e in expected if e[0] < target.base_offset]
        # Asking for the damaged batch's own offset raises too (a fresh read, no cursor).
        with pytest.raises(CorruptRecordError):
            store.read(TOPIC, 0, target.base_offset + 1)


def _simulate_reboot(data: Path) -> None:
    """Rewrite the state's boot hash (state.py: uint64 at byte 80), as after a reboot."""
    state = data / "topics" / TOPIC / "0" / "state"
    raw = bytearray(state.read_bytes())
    raw[80:88] = bytes(b ^ 0xFF for b in raw[80:88])
    state.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "field",
    ["base_offset_low", "batch_length_low", "magic", "crc_first", "record_count", "key", "value"],
)
@pytest.mark.parametrize("where", ["closed", "active_middle"])
@pytest.mark.parametrize("reopen", ["plain", "reboot", "state_lost"])
def test_reopen_never_truncates_durable_data(
    template: Path, data: Path, where: str, field: str, reopen: str
) -> None:
    """A flip in the middle of durable data: reopening raises, or reads raise; the damaged
    file keeps every byte and no read returns a shortened log as if nothing happened."""
    expected = _expected(template)
    target = _flip(data, where, field, 0x01)
    size_before = target.path.stat().st_size
    if reopen == "reboot":
        _simulate_reboot(data)
    elif reopen == "state_lost":
        (data / "topics" / TOPIC / "0" / "state").unlink()
    store = LogStore(data, clock=lambda: T0)
    try:
        with pytest.raises(CorruptRecordError) as info:
            store.offsets(TOPIC, 0)  # opening the partition runs recovery when needed
            _all_records(store)
        _check_error(info.value, target, field)
    finally:
        store.close()
    assert target.path.stat().st_size == size_before, "damaged durable data was truncated"
    assert expected  # the template had data to lose


@pytest.mark.parametrize("reopen", ["plain", "reboot"])
def test_flip_in_last_batch_is_not_taken_for_a_torn_tail(
    template: Path, data: Path, reopen: str
) -> None:
    """With the state known, the last acknowledged batch is durable: a flip in it raises."""
    target = _flip(data, "active_last", "value", 0x01)
    if reopen == "reboot":
        _simulate_reboot(data)
    with LogStore(data, clock=lambda: T0) as store, pytest.raises(CorruptRecordError) as info:
        store.offsets(TOPIC, 0)
        _all_records(store)
    _check_error(info.value, target, "value")
    assert target.path.stat().st_size == target.position + target.size


# ------------------------------------------------------------------------------ indexes


def _index_files(data: Path, suffix: str) -> list[Path]:
    return sorted((data / "topics" / TOPIC / "0").glob(f"*{suffix}"))


@pytest.mark.parametrize("damage", ["deleted", "garbage", "truncated", "zeroed"])
@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("segment", [0, 2, -1], ids=["first", "closed", "active"])
def test_damaged_index_is_rebuilt_by_recovery(
    template: Path, data: Path, damage: str, suffix: str, segment: int
) -> None:
    expected = _expected(template)
    originals = {p.name: p.read_bytes() for p in _index_files(data, suffix)}
    victim = _index_files(data, suffix)[segment]
    if damage == "deleted":
        victim.unlink()
    elif damage == "garbage":
        victim.write_bytes(bytes(range(7, 250, 3)) * 2)
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:5])
    else:
        victim.write_bytes(b"\x00" * len(victim.read_bytes()) + b"\x00" * 24)
    (data / "topics" / TOPIC / "0" / "state").unlink()  # force a full recovery
    with LogStore(data, clock=lambda: T0) as store:
        assert [(r.offset, r.key, r.value) for r in _all_records(store)] == expected
        assert victim.exists(), "index not rebuilt"
        assert victim.read_bytes() == originals[victim.name]
        for offset in range(BATCHES * 2):  # every start offset goes through the index
            (first, *_), _ = store.read(TOPIC, 0, offset, max_bytes=1)
            assert first.offset == offset
        stamps = {r.offset: r.timestamp for r in _all_records(store)}
        for target in range(T0 - 1, T0 + 10 * BATCHES + 7, 3):
            want = next((o for o in sorted(stamps) if stamps[o] >= target), None)
            assert store.offset_for_time(TOPIC, 0, target) == want
        assert store.verify() == []


# ------------------------------------------------------------------ power loss in a group


def _torn_group(tmp_path: Path, state: str) -> tuple[Path, list[Batch]]:
    """A partition whose last two batches were written by one write and never fsynced when
    the power went: the first one's sector never reached the disk (zeros), the second one's
    did (intact). ``state``: ``lost`` (the mapped state never reached the disk either),
    ``before`` (it did, from before the group: the HWM below both) or ``after`` (from after
    the group's fsync: both acknowledged, so the zeros are a lying disk's)."""
    data = tmp_path / "torn"
    with LogStore(data, clock=lambda: T0) as store:
        store.create_topic(TOPIC, 1, {"segment_bytes": 1 << 20})
        for n in range(4):
            store.append(TOPIC, 0, [(KEY % n, b"v" * 40, (), None)])
        before = (data / "topics" / TOPIC / "0" / "state").read_bytes()
        for n in range(4, 6):
            store.append(TOPIC, 0, [(KEY % n, b"w" * 40, (), None)])
    (path,) = _segment_files(data)
    batches = _batches(path)
    raw = bytearray(path.read_bytes())
    torn = batches[4]
    raw[torn.position : torn.position + 43] = bytes(43)  # its header: a never-written sector
    path.write_bytes(bytes(raw))
    state_file = data / "topics" / TOPIC / "0" / "state"
    if state == "lost":
        state_file.unlink()
        return data, batches
    if state == "before":
        state_file.write_bytes(before)
    _simulate_reboot(data)
    return data, batches


@pytest.mark.parametrize("state", ["lost", "before"])
def test_a_group_torn_by_power_loss_is_cut_at_its_hole(tmp_path: Path, state: str) -> None:
    """A power loss may keep a later sector of an unsynced write and lose an earlier one:
    zeros where a batch header should be, an intact batch after them. Nothing from the hole
    on was acknowledged (an fsync covers everything written before it), so recovery cuts the
    log there instead of keeping a hole that every read of the partition would fail at."""
    data, batches = _torn_group(tmp_path, state)
    with LogStore(data, clock=lambda: T0) as store:
        assert store.offsets(TOPIC, 0).leo == 4
        assert [r.key for r in _all_records(store)] == [KEY % n for n in range(4)]
        store.append(TOPIC, 0, [(b"next", b"x", (), None)])  # offset 4 is given out again
        assert [r.key for r in _all_records(store)][-1] == b"next"
    assert batches[4].path.stat().st_size > batches[4].position


def test_zeros_in_acknowledged_data_are_not_cut(tmp_path: Path) -> None:
    """The same hole below the state's HWM is acknowledged data that the disk lost: kept,
    and reading it raises, as for any damage to durable data."""
    data, batches = _torn_group(tmp_path, "after")
    size = batches[-1].path.stat().st_size
    with LogStore(data, clock=lambda: T0) as store, pytest.raises(CorruptRecordError):
        store.offsets(TOPIC, 0)
        _all_records(store)
    assert batches[-1].path.stat().st_size == size
