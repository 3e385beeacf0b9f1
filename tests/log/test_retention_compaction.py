"""Retention and compaction, beyond the stateful test: the rules of brief section 2, one by one.

Retention deletes whole segments from the front and advances the low-water mark (by time,
by size; a record dated in the future cannot keep its segment forever); a consumer whose
position fell below the LWM gets ``OffsetOutOfRangeError`` or resets per its
``auto_offset_reset``. Compaction keeps the last record of every key, keeps offsets (gaps
appear), removes tombstones only after ``delete_retention_ms``, leaves records younger than
``min_compaction_lag_ms`` and the active segment alone, never blocks a reader or an appender,
and a crash at any point of its swap leaves a readable, correct log (the intermediate states
are built on disk here; the real ``kill -9`` of a compacting process is in ``test_crash.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from eventlane.consumer import Consumer
from eventlane.errors import OffsetOutOfRangeError
from eventlane.log import LogStore, Record, TopicPartition

if TYPE_CHECKING:
    from eventlane.testing.clock import FakeClock

DAY = 86_400_000


def read_all(store: LogStore, topic: str, partition: int = 0) -> list[Record]:
    offset = store.offsets(topic, partition).lwm
    out: list[Record] = []
    cursor = None
    while True:
        records, cursor = store.read(topic, partition, offset, max_bytes=4096, cursor=cursor)
        if not records:
            return out
        out.extend(records)
        offset = records[-1].offset + 1


def part_dir(store: LogStore, topic: str, partition: int = 0) -> Path:
    return store.path / "topics" / topic / str(partition)


def segment_bases(store: LogStore, topic: str) -> list[int]:
    return sorted(int(p.name[:20]) for p in part_dir(store, topic).glob("*.log"))


def roll(store: LogStore, topic: str, partition: int = 0) -> None:
    store.partition(topic, partition).roll()


def kv(records: list[Record]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in records]


# ------------------------------------------------------------------------------ retention


def test_time_retention_advances_lwm(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", 1, {"retention_ms": 60_000, "segment_bytes": 400})
    for i in range(12):
        store.append("t", 0, [(b"k", b"old-%02d" % i, (), None)])
    roll(store, "t")
    old_segments = segment_bases(store, "t")[:-1]
    clock.advance(30_000)
    for i in range(12):
        store.append("t", 0, [(b"k", b"new-%02d" % i, (), None)])
    assert store.cleanup("t")[0].new_lwm == 0  # type: ignore[attr-defined]
    assert store.offsets("t", 0).lwm == 0  # nothing is 60 s old yet

    clock.advance(40_000)  # old records are 70 s old, new ones 40 s
    report = store.cleanup("t")[0]
    lwm, hwm, leo = store.offsets("t", 0)
    assert (lwm, hwm, leo) == (12, 24, 24)
    assert report.new_lwm == 12 and report.segments_deleted == len(old_segments)  # type: ignore[attr-defined]
    assert [r.value for r in read_all(store, "t")] == [b"new-%02d" % i for i in range(12)]
    assert not any((part_dir(store, "t") / f"{b:020d}.log").exists() for b in old_segments)
    with pytest.raises(OffsetOutOfRangeError) as info:
        store.read("t", 0, 11)
    assert (info.value.offset, info.value.lwm) == (11, 12)

    clock.advance(10 * 60_000)  # everything expires, the active segment included
    store.cleanup("t")
    assert store.offsets("t", 0) == (24, 24, 24)
    assert read_all(store, "t") == []
    assert store.append("t", 0, [(b"k", b"later", (), None)]).base_offset == 24
    assert [r.value for r in read_all(store, "t")] == [b"later"]
    assert store.verify() == []


@pytest.mark.parametrize("reset", ["earliest", "latest", "error"])
def test_consumer_below_lwm_resets_per_policy(
    store: LogStore, clock: FakeClock, reset: str
) -> None:
    store.create_topic("t", 1, {"retention_ms": 60_000, "segment_bytes": 300})
    for i in range(10):
        store.append("t", 0, [(None, b"old-%d" % i, (), None)])
    roll(store, "t")
    clock.advance(61_000)
    for i in range(3):
        store.append("t", 0, [(None, b"new-%d" % i, (), None)])
    tp = TopicPartition("t", 0)
    consumer = Consumer(store, auto_offset_reset=reset)
    consumer.assign([tp])
    consumer.seek(tp, 2)
    assert [r.offset for r in consumer.poll(0, max_records=1)] == [2]  # position 3 now
    store.cleanup("t")
    lwm = store.offsets("t", 0).lwm
    assert lwm == 10
    if reset == "error":
        with pytest.raises(OffsetOutOfRangeError) as info:
            consumer.poll(0)
        assert (info.value.offset, info.value.lwm) == (3, lwm)
        consumer.seek_to_beginning(tp)
        assert consumer.position(tp) == lwm
    elif reset == "earliest":
        assert [r.value for r in consumer.poll(0)] == [b"new-0", b"new-1", b"new-2"]
    else:
        assert consumer.poll(0) == []
        assert consumer.position(tp) == 13
        store.append("t", 0, [(None, b"after", (), None)])
        assert [r.value for r in consumer.poll(1.0)] == [b"after"]


def test_size_retention(store: LogStore) -> None:
    store.create_topic("t", 1, {"retention_ms": -1, "retention_bytes": 1000, "segment_bytes": 300})
    for i in range(40):
        store.append("t", 0, [(None, b"value-%02d" % i, (), None)])
    directory = part_dir(store, "t")
    sizes = {b: (directory / f"{b:020d}.log").stat().st_size for b in segment_bases(store, "t")}
    total = sum(sizes.values())
    assert total > 2000
    store.cleanup("t")
    kept = segment_bases(store, "t")
    kept_total = sum(sizes[b] for b in kept)
    assert kept_total >= 1000, "size retention deleted too much"
    assert kept_total - sizes[kept[0]] < 1000 or len(kept) == 1, "it could delete one more"
    lwm = store.offsets("t", 0).lwm
    assert lwm == kept[0]
    assert [r.offset for r in read_all(store, "t")] == list(range(lwm, 40))
    store.cleanup("t")  # idempotent
    assert segment_bases(store, "t") == kept


def test_future_timestamp_cannot_block_retention(tmp_path: Path, clock: FakeClock) -> None:
    """A record dated ten years ahead: its segment's age falls back to the file's mtime."""
    clock.now = time.time_ns() // 1_000_000  # file mtimes are wall-clock
    with LogStore(tmp_path / "data", clock=clock) as store:
        store.create_topic("t", 1, {"retention_ms": 7 * DAY})
        store.append("t", 0, [(b"k", b"from the future", (), clock.now + 3650 * DAY)])
        roll(store, "t")
        store.append("t", 0, [(b"k", b"normal", (), None)])
        roll(store, "t")
        store.append("t", 0, [(b"k", b"active", (), None)])
        clock.advance(DAY)
        store.cleanup("t")
        assert store.offsets("t", 0).lwm == 0
        clock.advance(7 * DAY)
        store.cleanup("t")
        assert store.offsets("t", 0).lwm == 3  # both closed segments and the old active one
        store.append("t", 0, [(b"k", b"future again", (), clock.now + 3650 * DAY)])
        clock.advance(8 * DAY)  # a future-dated record in the active segment
        store.cleanup("t")
        assert store.offsets("t", 0).lwm == 4, "a future timestamp blocked retention"


def test_retention_is_noop_without_delete_policy(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(
        "c", 1, {"cleanup_policy": "compact", "retention_ms": 1000, "segment_bytes": 200}
    )
    store.create_topic("u", 1, {"retention_ms": -1, "segment_bytes": 200})
    for topic in ("c", "u"):
        for i in range(10):
            store.append(topic, 0, [(b"k%d" % i, b"v", (), None)])
    clock.advance(100 * DAY)
    store.cleanup("c")
    store.cleanup("u")
    assert store.offsets("c", 0).lwm == 0 and store.offsets("u", 0).lwm == 0


# ------------------------------------------------------------------------------ compaction


def compact_topic(store: LogStore, name: str, **config: object) -> None:
    cfg: dict[str, object] = {
        "cleanup_policy": "compact",
        "segment_bytes": 300,
        "delete_retention_ms": 1000,
        "index_interval_bytes": 64,
    }
    cfg.update(config)
    store.create_topic(name, 1, cfg)


def test_compaction_keeps_last_per_key_and_offsets(store: LogStore, clock: FakeClock) -> None:
    compact_topic(store, "c")
    written: list[tuple[int, bytes, bytes | None]] = []
    for i in range(40):
        key = b"k%d" % (i % 5)
        value = None if i == 37 else b"v%02d" % i  # k2's last record is a tombstone
        store.append("c", 0, [(key, value, (("i", b"%d" % i),), None)])
        written.append((i, key, value))
    roll(store, "c")
    store.append("c", 0, [(b"k0", b"in the active segment", (), None)])
    written.append((40, b"k0", b"in the active segment"))
    directory = part_dir(store, "c")
    active = directory / f"{segment_bases(store, 'c')[-1]:020d}.log"
    active_bytes = active.read_bytes()

    last = {key: off for off, key, _ in written[:40]}
    expected = [w for w in written[:40] if last[w[1]] == w[0]] + [written[40]]
    store.compact("c")
    got = read_all(store, "c")
    assert kv(got) == expected  # tombstone still there: younger than delete_retention_ms
    assert got[-2].headers == (("i", b"39"),)
    assert store.offsets("c", 0) == (0, 41, 41)
    assert active.read_bytes() == active_bytes, "compaction touched the active segment"
    # gaps: reading from an offset that was compacted away gives the next record
    first_kept = expected[0][0]
    assert store.read("c", 0, 0)[0][0].offset == first_kept
    assert first_kept == 35 and store.read("c", 0, 10)[0][0].offset == 35
    assert store.offset_for_time("c", 0, 0) == first_kept

    clock.advance(999)
    store.compact("c")
    assert kv(read_all(store, "c")) == expected
    clock.advance(2)  # the tombstone is now older than delete_retention_ms
    store.compact("c")
    assert kv(read_all(store, "c")) == [e for e in expected if e[0] != 37]
    assert active.read_bytes() == active_bytes
    assert store.verify() == []
    before = kv(read_all(store, "c"))
    segments = len(segment_bases(store, "c"))
    store.compact("c")  # nothing more to remove (small cleaned segments may merge)
    assert kv(read_all(store, "c")) == before
    assert len(segment_bases(store, "c")) <= segments
    assert active.read_bytes() == active_bytes


def test_compaction_of_whole_batches_by_shape(store: LogStore, clock: FakeClock) -> None:
    """Pass 2 skips a batch none of whose records is the last of its key and copies one all
    of whose records are, without reading them; a batch with both, or with a tombstone old
    enough to drop, is scanned and re-framed. Every shape against the model, twice: before
    and after the tombstone's ``delete_retention_ms``."""
    compact_topic(store, "c", segment_bytes=100_000)
    shapes = [
        [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")],  # all superseded later: skipped
        [(b"c", b"2"), (b"a", b"2"), (b"x", b"1")],  # c superseded, a and x last: mixed
        [(b"b", b"2"), (b"d", None), (b"e", b"1")],  # all last, d a tombstone
        [(b"f", b"1"), (b"f", b"2"), (b"c", b"3")],  # f twice in one batch: mixed
        [(b"g", b"1"), (b"h", b"1")],  # all last: copied as it is
    ]
    written: list[tuple[int, bytes, bytes | None]] = []
    for ts, shape in enumerate(shapes):
        result = store.append("c", 0, [(k, v, (("h", k),), 1000 + ts) for k, v in shape])
        written += [(result.base_offset + i, k, v) for i, (k, v) in enumerate(shape)]
    roll(store, "c")
    last = {key: off for off, key, _ in written}
    expected = [w for w in written if last[w[1]] == w[0]]
    before = {r.offset: r for r in read_all(store, "c")}
    store.compact("c")
    got = read_all(store, "c")
    assert kv(got) == expected
    assert all(r == before[r.offset] for r in got)  # headers and timestamps kept
    assert store.offset_for_time("c", 0, 1003) == 10  # the time index follows the kept max
    clock.advance(1001)
    store.compact("c")
    assert kv(read_all(store, "c")) == [e for e in expected if e[1] != b"d"]
    assert store.verify() == []


def test_min_compaction_lag(store: LogStore, clock: FakeClock) -> None:
    compact_topic(store, "c", min_compaction_lag_ms=10_000, segment_bytes=10_000)
    for i in range(6):  # segment A at T0
        store.append("c", 0, [(b"k%d" % (i % 2), b"a%d" % i, (), None)])
    roll(store, "c")
    clock.advance(20_000)
    for i in range(6):  # segment B at T0 + 20 s
        store.append("c", 0, [(b"k%d" % (i % 2), b"b%d" % i, (), None)])
    roll(store, "c")
    store.append("c", 0, [(b"k0", b"active", (), None)])
    _a, b, _active = segment_bases(store, "c")
    seg_b = part_dir(store, "c") / f"{b:020d}.log"
    b_bytes = seg_b.read_bytes()

    clock.advance(5_000)  # A is 25 s old (cleanable), B only 5 s
    store.compact("c")
    values = [r.value for r in read_all(store, "c")]
    assert values == [b"a4", b"a5", b"b0", b"b1", b"b2", b"b3", b"b4", b"b5", b"active"]
    assert seg_b.read_bytes() == b_bytes, "a segment within min_compaction_lag was cleaned"

    clock.advance(10_000)  # B is 15 s old now
    store.compact("c")
    assert [r.value for r in read_all(store, "c")] == [b"b4", b"b5", b"active"]
    assert [r.offset for r in read_all(store, "c")] == [10, 11, 12]
    assert store.verify() == []


def test_reader_keeps_reading_while_compaction_swaps(store: LogStore) -> None:
    """Full scans in a thread while the main thread appends, rolls and compacts: every scan
    sees offsets in order, only records that were written at those offsets, and for every
    key a record at or after the key's last offset when the scan began."""
    compact_topic(store, "c", segment_bytes=2048, index_interval_bytes=256)
    keys = [b"key-%02d" % k for k in range(40)]
    written: dict[int, tuple[bytes, bytes]] = {}
    last_of: dict[bytes, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    scans = 0

    def append_round(round_no: int) -> None:
        records = [(k, b"r%d-%s" % (round_no, k), (), None) for k in keys]
        leo = store.offsets("c", 0).leo
        with lock:
            for i, (k, v, _, _) in enumerate(records):
                written[leo + i] = (k, v)
        store.append("c", 0, records[:20])
        store.append("c", 0, records[20:])
        with lock:
            for i, (k, _, _, _) in enumerate(records):
                last_of[k] = leo + i
        roll(store, "c")

    def reader() -> None:
        nonlocal scans
        try:
            while not stop.is_set():
                with lock:
                    floor = dict(last_of)
                offset, cursor, seen = 0, None, []
                while True:
                    records, cursor = store.read("c", 0, offset, max_bytes=700, cursor=cursor)
                    if not records:
                        break
                    seen.extend(records)
                    offset = records[-1].offset + 1
                offsets = [r.offset for r in seen]
                assert offsets == sorted(set(offsets))
                with lock:
                    for r in seen:
                        assert written[r.offset] == (r.key, r.value)
                newest: dict[bytes, int] = {}
                for r in seen:
                    newest[r.key] = r.offset  # type: ignore[index]
                for k, off in floor.items():
                    assert newest.get(k, -1) >= off, f"scan lost key {k!r}"
                scans += 1
        except BaseException as exc:
            errors.append(exc)

    append_round(0)
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_no in range(1, 16):
            append_round(round_no)
            store.compact("c")
    finally:
        time.sleep(0.05)
        stop.set()
        thread.join(30)
    assert not errors, errors[0]
    print(f"\n{scans} full scans during 15 compactions")
    assert scans >= 3
    assert [(r.key, r.value) for r in read_all(store, "c")] == [(k, b"r15-%s" % k) for k in keys]
    assert store.verify() == []


def test_appender_not_blocked_by_compaction(store: LogStore) -> None:
    compact_topic(store, "c", segment_bytes=1 << 20)
    for _ in range(150):
        store.append("c", 0, [(b"k%d" % (i % 700), b"v" * 20, (), None) for i in range(2000)])
    roll(store, "c")
    done = threading.Event()
    elapsed: list[float] = []

    def compact() -> None:
        start = time.monotonic()
        store.compact("c")
        elapsed.append(time.monotonic() - start)
        done.set()

    thread = threading.Thread(target=compact)
    latencies: list[float] = []
    thread.start()
    while not done.is_set():
        start = time.monotonic()
        store.append("c", 0, [(b"live", b"x", (), None)])
        latencies.append(time.monotonic() - start)
    thread.join()
    compaction_s = elapsed[0]
    print(
        f"\ncompaction {compaction_s:.2f} s; {len(latencies)} appends meanwhile,"
        f" max latency {max(latencies) * 1000:.1f} ms"
    )
    assert len(latencies) >= 10, "appends stalled while compaction ran"
    assert max(latencies) < max(0.5, compaction_s / 2)
    got = read_all(store, "c")
    assert [r.value for r in got if r.key == b"live"] == [b"x"] * len(latencies)
    assert len({r.key for r in got}) == 701


# ------------------------------------------------------------------------------ crash in a swap


@pytest.fixture(scope="module")
def swap_states(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(before, after): a compact topic ready to clean, and the same after compaction."""
    root = tmp_path_factory.mktemp("swap")
    before = root / "before"
    clock_now = [1_700_000_000_000]
    with LogStore(before, clock=lambda: clock_now[0]) as store:
        compact_topic(store, "c", segment_bytes=400)
        for i in range(60):
            store.append("c", 0, [(b"k%d" % (i % 7), b"value-%02d" % i, (), None)])
        roll(store, "c")
        store.append("c", 0, [(b"k0", b"active", (), None)])
    after = root / "after"
    shutil.copytree(before, after)
    clock_now[0] += 10_000
    with LogStore(after, clock=lambda: clock_now[0]) as store:
        store.compact("c")
        assert store.verify() == []
    return before, after


def _records_of(data: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    with LogStore(data, clock=lambda: 1_700_000_010_000) as store:
        return kv(read_all(store, "c"))


def _groups(before: Path, after: Path) -> list[list[int]]:
    """Which original segments each cleaned segment replaced (by base offset)."""
    old = sorted(int(p.name[:20]) for p in (before / "topics/c/0").glob("*.log"))
    new = sorted(int(p.name[:20]) for p in (after / "topics/c/0").glob("*.log"))
    active = old[-1]
    assert new[-1] == active
    starts = new[:-1]
    groups = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else active
        groups.append([b for b in old if start <= b < end])
    assert len(groups) >= 2, "the fixture should clean into several groups"
    return groups


def _set_layout_odd(directory: Path) -> None:
    """As if the swapping process died holding the lock (state.py: int64 layout at 48)."""
    state = directory / "state"
    raw = bytearray(state.read_bytes())
    layout = int.from_bytes(raw[48:56], "little") | 1
    raw[48:56] = layout.to_bytes(8, "little")
    state.write_bytes(bytes(raw))


SUFFIXES = (".log", ".index", ".timeindex")


@pytest.mark.parametrize("reopen", ["plain", "state_lost"])
@pytest.mark.parametrize(
    "stage",
    [
        "cleaned_files_no_journal",
        "journal_no_renames",
        "first_log_renamed",
        "first_group_renamed",
        "first_group_done",
        "all_renamed_nothing_unlinked",
        "all_done_journal_left",
    ],
)
def test_crash_in_compaction_swap(
    swap_states: tuple[Path, Path], tmp_path: Path, stage: str, reopen: str
) -> None:
    before, after = swap_states
    original, compacted = _records_of(before), _records_of(after)
    assert len(compacted) < len(original)
    groups = _groups(before, after)
    data = tmp_path / "data"
    shutil.copytree(before, data)
    directory = data / "topics/c/0"
    cleaned_from = after / "topics/c/0"
    for group in groups:  # the cleaner's output, as it is before the swap
        for suffix in SUFFIXES:
            name = f"{group[0]:020d}{suffix}"
            shutil.copy(cleaned_from / name, directory / (name + ".cleaned"))
    if stage != "cleaned_files_no_journal":
        (directory / "compacted").write_bytes(b"")  # written before the journal
        journal = [{"base": g[0], "replaces": g} for g in groups]
        (directory / "cleaner-journal").write_text(json.dumps(journal))

    def rename(group: list[int], suffixes: tuple[str, ...] = SUFFIXES) -> None:
        for suffix in suffixes:
            name = f"{group[0]:020d}{suffix}"
            os.replace(directory / (name + ".cleaned"), directory / name)

    def unlink_replaced(group: list[int]) -> None:
        for base in group[1:]:
            for suffix in SUFFIXES:
                (directory / f"{base:020d}{suffix}").unlink()

    in_lock = stage not in (
        "cleaned_files_no_journal",
        "journal_no_renames",
        "all_done_journal_left",
    )
    if stage == "first_log_renamed":
        rename(groups[0], (".log",))
    elif stage == "first_group_renamed":
        rename(groups[0])
    elif stage == "first_group_done":
        rename(groups[0])
        unlink_replaced(groups[0])
    elif stage in ("all_renamed_nothing_unlinked", "all_done_journal_left"):
        for group in groups:
            rename(group)
        if stage == "all_done_journal_left":
            for group in groups:
                unlink_replaced(group)
    if in_lock:
        _set_layout_odd(directory)
    if reopen == "state_lost":
        (directory / "state").unlink()

    with LogStore(data, clock=lambda: 1_700_000_010_000) as store:
        got = kv(read_all(store, "c"))
        journal_written = stage != "cleaned_files_no_journal"
        if in_lock or reopen == "state_lost":
            # the next lock holder recovered: the swap was finished, or never started
            assert got == (compacted if journal_written else original)
            assert not list(directory.glob("*.cleaned"))
            assert not (directory / "cleaner-journal").exists()
        else:
            # a crash before the lock (or after it): the live segments are consistent
            assert got in (original, compacted)
        assert store.verify() == []
        store.compact("c")  # and the next compaction finishes the job
        assert kv(read_all(store, "c")) == compacted
        assert store.offsets("c", 0) == (0, 61, 61)
        assert store.verify() == []
