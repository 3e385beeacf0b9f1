"""Engine defects found by the red team (issue 17), each pinned by a test through the API or
the CLI: acknowledged offsets are never reused, holes and wrong index entries are detected,
tombstones expire by the log's clock, appends into a deleted topic fail, a deleted topic
stays deleted, descriptors are bounded, and a failed fsync acknowledges nothing."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result

from eventlane.cli import main
from eventlane.errors import CorruptRecordError, DataLossError, UnknownTopicError
from eventlane.log import LogStore, Record

if TYPE_CHECKING:
    from eventlane.testing.clock import FakeClock

TOPIC = "t"


def pdir(data: Path, topic: str = TOPIC, partition: int = 0) -> Path:
    return data / "topics" / topic / str(partition)


def batch_positions(path: Path) -> list[tuple[int, int]]:
    """``(position, base_offset)`` of every batch of a segment, by the documented framing."""
    raw, out, pos = path.read_bytes(), [], 0
    while pos < len(raw):
        base, length = struct.unpack_from(">qi", raw, pos)
        out.append((pos, base))
        pos += 12 + length
    return out


def read_all(store: LogStore, topic: str = TOPIC) -> list[Record]:
    out: list[Record] = []
    offset = store.offsets(topic, 0).lwm
    while True:
        records, _ = store.read(topic, 0, offset)
        if not records:
            return out
        out.extend(records)
        offset = records[-1].offset + 1


def simulate_reboot(data: Path) -> None:
    """Rewrite the state's boot hash (state.py: uint64 at byte 80), as after a reboot."""
    state = pdir(data) / "state"
    raw = bytearray(state.read_bytes())
    raw[80:88] = (int.from_bytes(raw[80:88], "little") ^ 1).to_bytes(8, "little")
    state.write_bytes(bytes(raw))


def cli(data: Path, *args: str) -> Result:
    runner = CliRunner(env={"EVENTLANE_DATA": None, "EVENTLANE_LOG_LEVEL": None})
    return runner.invoke(main, ["--data", str(data), *args], catch_exceptions=False)


def ten_records(data: Path, **config: object) -> None:
    with LogStore(data) as store:
        store.create_topic(TOPIC, 1, config)
        for i in range(10):
            store.append(TOPIC, 0, [(b"k%d" % i, b"v%d" % i, (), None)])


# ------------------------------------------------------------------ 1: lost acknowledged tail
@pytest.mark.parametrize("reopen", ["plain", "reboot"])
def test_lost_tail_is_refused_then_skipped_never_reused(data_dir: Path, reopen: str) -> None:
    ten_records(data_dir)
    segment = pdir(data_dir) / "00000000000000000000.log"
    cut = {base: pos for pos, base in batch_positions(segment)}[6]
    os.truncate(segment, cut)  # a lying disk: the acknowledged tail 6..9 is gone
    if reopen == "reboot":
        simulate_reboot(data_dir)

    with LogStore(data_dir) as store, pytest.raises(DataLossError) as caught:
        store.offsets(TOPIC, 0)
    assert "[6, 10)" in str(caught.value) and "--skip-lost-offsets" in str(caught.value)
    assert caught.value.offset == 6 and segment.stat().st_size == cut  # nothing changed

    result = cli(data_dir, "verify", TOPIC)
    assert result.exit_code == 1 and "[6, 10)" in result.output
    result = cli(data_dir, "verify", TOPIC, "--skip-lost-offsets")
    assert result.exit_code == 0, result.output
    assert "skipped lost acknowledged offsets" in result.output and "end=10" in result.output

    with LogStore(data_dir) as store:
        assert tuple(store.offsets(TOPIC, 0)) == (0, 10, 10)
        assert store.append(TOPIC, 0, [(b"k", b"new", (), None)]).base_offset == 10
        assert [r.offset for r in read_all(store)] == [0, 1, 2, 3, 4, 5, 10]
        # a consumer that had committed the old end (10) sees the new record
        records, _ = store.read(TOPIC, 0, 10)
        assert [r.value for r in records] == [b"new"]
        assert store.verify() == []
    simulate_reboot(data_dir)  # the skip survives a full recovery
    with LogStore(data_dir) as store:
        assert tuple(store.offsets(TOPIC, 0)) == (0, 11, 11)


def test_deleted_first_segment_is_not_taken_for_retention(data_dir: Path) -> None:
    ten_records(data_dir, segment_bytes=200)
    bases = sorted(int(p.name[:20]) for p in pdir(data_dir).glob("*.log"))
    assert len(bases) >= 3
    for suffix in (".log", ".index", ".timeindex"):
        (pdir(data_dir) / f"{bases[0]:020d}{suffix}").unlink()
    simulate_reboot(data_dir)
    with LogStore(data_dir) as store, pytest.raises(DataLossError, match=rf"\[0, {bases[1]}\)"):
        store.offsets(TOPIC, 0)
    with LogStore(data_dir) as store:
        [refused] = store.verify(TOPIC)
        assert isinstance(refused, DataLossError)
        assert store.verify(TOPIC, skip_lost_offsets=True) == []  # the API's repair
        assert store.offsets(TOPIC, 0).lwm == bases[1]


# ------------------------------------------------------------------ fsync failure
_FSYNC_CHILD = textwrap.dedent(
    """
    import errno, json, os, sys
    from eventlane.errors import PartitionReadOnlyError
    from eventlane.log import LogStore

    data, fail_at = sys.argv[1], int(sys.argv[2])
    store = LogStore(data)
    store.offsets("t", 0)  # opened and recovered before the fault is armed
    calls = 0
    real_fdatasync = os.fdatasync

    def failing_fdatasync(fd):
        global calls
        calls += 1
        if calls == fail_at:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real_fdatasync(fd)

    os.fdatasync = failing_fdatasync
    acked, refused = [], []
    for i in range(8):
        try:
            result = store.append("t", 0, [(b"k", b"after-%d" % i, (), None)])
            acked.append(result.base_offset)
        except PartitionReadOnlyError as err:
            refused.append(str(err))
    print(json.dumps({"acked": acked, "refused": refused, "fdatasync_calls": calls}))
    """
)


def test_failed_fsync_acknowledges_nothing_and_makes_the_partition_read_only(
    data_dir: Path,
) -> None:
    ten_records(data_dir)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", _FSYNC_CHILD, str(data_dir), "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["acked"] == [10, 11]  # the third append's fdatasync failed
    assert len(report["refused"]) == 6  # and every later one is refused, not retried
    assert report["fdatasync_calls"] == 3  # nothing was fsynced again "as if safe"
    assert "reopened" in report["refused"][0]
    with LogStore(data_dir) as store:  # reopened: recovered, writable again
        values = [r.value for r in read_all(store)]
        assert values[10:] == [b"after-0", b"after-1"]  # the failed append is not there
        assert store.append(TOPIC, 0, [(b"k", b"later", (), None)]).base_offset == 12


# ------------------------------------------------------------------ 4 and 6: deleted topics
def test_append_into_a_deleted_or_recreated_topic_fails(data_dir: Path) -> None:
    with LogStore(data_dir) as writer, LogStore(data_dir) as admin:
        admin.create_topic(TOPIC, 1)
        assert writer.append(TOPIC, 0, [(b"k", b"before", (), None)]).base_offset == 0
        admin.delete_topic(TOPIC)
        with pytest.raises(UnknownTopicError, match="deleted"):
            writer.append(TOPIC, 0, [(b"k", b"into the void", (), None)])
        with pytest.raises(UnknownTopicError):  # still gone: not acknowledged either
            writer.append(TOPIC, 0, [(b"k", b"again", (), None)])

        admin.create_topic(TOPIC, 1)  # re-created: another incarnation, same name
        assert writer.partition(TOPIC, 0)  # re-resolved by name
        other = LogStore(data_dir)
        stale = other.partition(TOPIC, 0)
        admin.delete_topic(TOPIC)
        admin.create_topic(TOPIC, 1)
        with pytest.raises(UnknownTopicError, match="deleted"):
            stale.read(0)
        with pytest.raises(UnknownTopicError, match="deleted"):
            other.append(TOPIC, 0, [(b"k", b"stale incarnation", (), None)])
        other.close()
        assert read_all(admin) == []  # nothing of the stale appends reached any log
        with pytest.raises(UnknownTopicError):  # writer held the second incarnation
            writer.append(TOPIC, 0, [(b"k", b"stale too", (), None)])
        assert writer.append(TOPIC, 0, [(b"k", b"fresh", (), None)]).base_offset == 0


def test_deleted_topic_directory_never_comes_back(data_dir: Path) -> None:
    with LogStore(data_dir) as reader, LogStore(data_dir) as admin:
        admin.create_topic(TOPIC, 4)
        assert reader.partition_count(TOPIC) == 4  # metadata cached, partitions not opened
        admin.delete_topic(TOPIC)
        with pytest.raises(UnknownTopicError):
            reader.read(TOPIC, 2, 0)
        assert not (data_dir / "topics" / TOPIC).exists()
        assert TOPIC not in admin.list_topics()
        admin.create_topic(TOPIC, 1)  # not "already exists"
        assert admin.list_topics() == [TOPIC]


# ------------------------------------------------------------------ 3: tombstones, log clock
DAY = 86_400_000


def test_tombstone_expires_by_the_logs_clock_not_the_producers(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic(
        "c",
        1,
        {"cleanup_policy": "compact", "delete_retention_ms": DAY, "min_compaction_lag_ms": 0},
    )
    store.append("c", 0, [(b"k", b"v", (), None)])
    store.append("c", 0, [(b"k", None, (), clock() - 2 * DAY)])  # stamped 2 days old
    store.partition("c", 0).roll()
    store.append("c", 0, [(b"other", b"x", (), None)])

    def tombstones() -> list[int]:
        return [r.offset for r in read_all(store, "c") if r.value is None]

    store.compact("c")
    assert tombstones() == [1]  # a consumer one record behind still sees the delete
    clock.advance(DAY - 1)
    store.compact("c")
    assert tombstones() == [1]
    clock.advance(2)  # a day after the cleaner first saw it, by the log's clock
    store.compact("c")
    assert tombstones() == []


# ------------------------------------------------------------------ 2: holes in the log
def segment_logs(data: Path) -> list[Path]:
    return sorted(pdir(data).glob("*.log"))


def read_until_error(store: LogStore) -> tuple[list[int], CorruptRecordError]:
    got: list[int] = []
    offset, cursor = 0, None
    with pytest.raises(CorruptRecordError) as info:
        while True:
            records, cursor = store.read(TOPIC, 0, offset, max_bytes=100, cursor=cursor)
            assert records, "read the whole log without meeting the hole"
            got.extend(r.offset for r in records)
            offset = records[-1].offset + 1
    return got, info.value


def cut_batch(path: Path, index: int) -> int:
    """Remove one whole batch from a segment file; return its base offset."""
    raw = path.read_bytes()
    batches = batch_positions(path)
    pos, base = batches[index]
    end = batches[index + 1][0] if index + 1 < len(batches) else len(raw)
    path.write_bytes(raw[:pos] + raw[end:])
    return base


@pytest.mark.parametrize("hole", ["middle_segment_deleted", "closed_segment_cut", "batch_cut"])
def test_holes_are_reported_by_verify_and_reads(data_dir: Path, hole: str) -> None:
    ten_records(data_dir, segment_bytes=200)
    logs = segment_logs(data_dir)
    assert len(logs) >= 4
    victim = logs[1]
    if hole == "middle_segment_deleted":
        missing = int(victim.name[:20])
        for suffix in (".log", ".index", ".timeindex"):
            victim.with_suffix(suffix).unlink()
    elif hole == "closed_segment_cut":  # truncated at a batch boundary
        pos, missing = batch_positions(victim)[-1]
        os.truncate(victim, pos)
    else:
        missing = cut_batch(victim, 1)
    with LogStore(data_dir) as store:
        problems = store.verify(TOPIC)
        assert len(problems) == 1, problems
        assert problems[0].offset == missing and "missing" in problems[0].message
        assert problems[0].path is not None and problems[0].position is not None
        got, err = read_until_error(store)
        assert got == list(range(missing))  # every record before the hole, then the error
        assert err.offset == missing and "missing" in err.message
    result = cli(data_dir, "verify", TOPIC)
    assert result.exit_code == 1 and f"offset={missing}" in result.output
    simulate_reboot(data_dir)  # recovery opens the partition: only the hole is unreadable
    with LogStore(data_dir) as store:
        got, err = read_until_error(store)
        assert got == list(range(missing)) and err.offset == missing
        records, _ = store.read(TOPIC, 0, store.offsets(TOPIC, 0).hwm - 1)
        assert records  # past the hole, the log reads on


def test_zero_filled_region_is_reported_at_its_real_offset(data_dir: Path) -> None:
    ten_records(data_dir)
    segment = segment_logs(data_dir)[0]
    pos, base = batch_positions(segment)[4]
    raw = bytearray(segment.read_bytes())
    raw[pos : pos + 100] = bytes(100)
    segment.write_bytes(bytes(raw))
    with LogStore(data_dir) as store:
        [problem] = store.verify(TOPIC)
        assert (problem.offset, problem.position) == (base, pos) == (4, pos)
        got, err = read_until_error(store)
        assert got == [0, 1, 2, 3] and err.offset == 4


@pytest.mark.parametrize("reopen", ["plain", "reboot"])
def test_one_bad_batch_fails_only_reads_of_that_batch(data_dir: Path, reopen: str) -> None:
    with LogStore(data_dir) as store:  # 3 records a batch, one big segment, sparse index
        store.create_topic(TOPIC, 1, {"index_interval_bytes": 1 << 20})
        for i in range(0, 30, 3):
            store.append(TOPIC, 0, [(b"k", b"v%d" % j, (), None) for j in range(i, i + 3)])
    segment = segment_logs(data_dir)[0]
    pos, _ = batch_positions(segment)[2]  # offsets 6..8
    raw = bytearray(segment.read_bytes())
    raw[pos + 60] ^= 0x01
    segment.write_bytes(bytes(raw))
    if reopen == "reboot":  # recovery scans the damage: it must not refuse the partition
        simulate_reboot(data_dir)
    with LogStore(data_dir) as store:
        assert store.offsets(TOPIC, 0).hwm == 30
        for offset in (6, 7, 8):
            with pytest.raises(CorruptRecordError):
                store.read(TOPIC, 0, offset)
        for offset in (0, 9, 10, 20, 29):
            records, _ = store.read(TOPIC, 0, offset)
            assert records[0].offset == offset, offset


# ------------------------------------------------------------------ 7: wrong index entries
def test_wrong_index_entries_never_skip_records(data_dir: Path) -> None:
    with LogStore(data_dir) as store:
        store.create_topic(TOPIC, 1, {"index_interval_bytes": 1})  # every batch indexed
        for i in range(10):
            store.append(TOPIC, 0, [(b"k", b"v%d" % i, (), 1_000 * (i + 1))])
    index = pdir(data_dir) / "00000000000000000000.index"
    entries = bytearray(index.read_bytes())
    entries[4 * 8 + 4 : 4 * 8 + 8] = entries[7 * 8 + 4 : 7 * 8 + 8]  # "offset 4 is where 7 is"
    index.write_bytes(bytes(entries))
    times = pdir(data_dir) / "00000000000000000000.timeindex"
    stamps = bytearray(times.read_bytes())
    stamps[2 * 12 : 2 * 12 + 8] = (0).to_bytes(8, "big")  # "nothing before offset 2 is late"
    stamps[3 * 12 : 3 * 12 + 8] = (0).to_bytes(8, "big")
    times.write_bytes(bytes(stamps))
    with LogStore(data_dir) as store:
        records, _ = store.read(TOPIC, 0, 4)
        assert [r.offset for r in records] == [4, 5, 6, 7, 8, 9]
        assert store.offset_for_time(TOPIC, 0, 2_500) == 2
        problems = store.verify(TOPIC)
        assert {(p.path, p.offset) for p in problems} == {
            (str(index), 4),
            (str(times), 2),
            (str(times), 3),
        }
    result = cli(data_dir, "verify", TOPIC)
    assert result.exit_code == 1 and "offset index entry 4" in result.output


# ------------------------------------------------------------------ 8: file descriptors
_MANY_PARTITIONS_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    from click.testing import CliRunner
    from eventlane.cli import main
    from eventlane.log import LogStore

    data, count = sys.argv[1], int(sys.argv[2])
    with LogStore(data) as store:
        store.create_topic("wide", count, {"flush_policy": "os"})
        for p in range(count):
            store.append("wide", p, [(b"k", b"p%d" % p, (), None)])
        values = [store.read("wide", p, 0)[0][0].value for p in range(count)]
        assert values == [b"p%d" % p for p in range(count)]
        described = store.describe_topic("wide")
        assert sum(d.hwm for d in described.partition_details) == count
        assert store.verify("wide") == []
        open_fds = len(os.listdir("/proc/self/fd"))
    runner = CliRunner(env={"EVENTLANE_DATA": None, "EVENTLANE_LOG_LEVEL": None})
    results = [
        runner.invoke(main, ["--data", data, *args])
        for args in (["topics", "describe", "wide"], ["verify", "wide"])
    ]
    print(json.dumps({"open_fds": open_fds, "exit_codes": [r.exit_code for r in results],
                      "outputs": [r.output[-300:] for r in results]}))
    """
)


def test_two_thousand_partitions_under_ulimit_1024(data_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", _MANY_PARTITIONS_CHILD, str(data_dir), "2000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["exit_codes"] == [0, 0], report["outputs"]
    assert report["open_fds"] < 512, report
