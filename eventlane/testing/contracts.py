"""The shipped contract kit of the log port (:mod:`eventlane.log.port`), one kit per role.

* :class:`LogContract`, the core role (:class:`~eventlane.log.port.Log`): topic
  administration, appends (atomic ones included) and reads, the three marks, placement by
  the producer, waking waiters across threads, time lookups, deleting records, a close and
  reopen.
* :class:`KeyedLogContract` (:class:`~eventlane.log.port.KeyedLog`): conditional
  (``expect=``) appends racing across threads and processes, per-key reads, per-key state
  across a reopen. ``refused_appends_leave_gaps`` (default false) says whether a refused
  append that lost a race may hold offsets no read returns (validation by log order).
* :class:`MaintainedLogContract` (:class:`~eventlane.log.port.MaintainedLog`): compaction,
  retention, verification. ``lazy_compaction`` (a class attribute, default true) says
  whether superseded records stay readable until a compaction runs.
* :class:`FencedLogContract` (:class:`~eventlane.log.port.FencedLog`): fenced appends.

An adapter proves itself by subclassing the kits of exactly the roles it implements in its
own test suite, and implementing ``make_log`` (as ``eventsourcing`` ships its recorder test
cases)::

    from eventlane.testing.contracts import KeyedLogContract, MaintainedLogContract

    class TestMyLogContract(KeyedLogContract, MaintainedLogContract):
        def make_log(self, directory, clock):
            return MyLog(directory, clock=clock)

The core kit's ``test_claims_exactly_its_roles`` fails where the engine implements a role
whose kit the class does not run, or the class runs a kit of a role the engine lacks: there
are no skips.

What the kit checks where a weak engine would slip through: conditional appends racing
across threads and across processes (each key's history must be one chain, one winner per
expected position, no loser's record stored); atomic batches seen whole or not at all;
compaction (each key's last record kept at its offset, superseded records of closed segments
gone, the active segment untouched, tombstones kept until ``delete_retention_ms``);
retention (the low-water mark advances, reads below it are out of range); a close and
reopen that keeps every acknowledged record at its offset. The suite proves the kit catches
engines broken in each of these ways (tests/log/test_contract_kit_proof.py).

This module imports pytest; ``import eventlane`` and ``eventlane.testing`` do not import it.

One module for the four role kits (over 700 lines): they share the fixtures, the racing
writers and the helpers that read a partition back, and a user imports them together.
"""

from __future__ import annotations

import abc
import gc
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pytest

from eventlane.errors import (
    ConcurrencyError,
    ConfigError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    PreconditionFailedError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from eventlane.log import Expect, Log, Producer, ProducerRecord, TopicConfig
from eventlane.log.partitioner import partition_for_key
from eventlane.log.port import (
    FencedLog,
    KeyedLog,
    MaintainedLog,
    fenced_log,
    keyed_log,
    maintained_log,
)
from eventlane.log.record import Record, TimestampType
from eventlane.testing.clock import FakeClock
from eventlane.testing.logs import capture_logs

T0 = 1_700_000_000_000
RACE_KEYS = (b"k", b"j")


class _RaceResult(NamedTuple):
    """One racing writer's outcome: ``(value, expected head, offset)`` of each append it was
    told succeeded, and the values of those refused with ConcurrencyError."""

    wins: list[tuple[bytes, int | None, int]]
    losses: list[bytes]


def _race(log: KeyedLog, topic: str, name: str, *, rounds: int) -> _RaceResult:
    """Read a key's head, append expecting it; the value names the writer, the round and
    the head it expected, so the log itself shows which record each append followed."""
    wins: list[tuple[bytes, int | None, int]] = []
    losses: list[bytes] = []
    for n in range(rounds):
        key = RACE_KEYS[n % len(RACE_KEYS)]
        head = log.key_head(topic, 0, key)
        value = f"{name}/{n}/{head}".encode()
        try:
            result = log.append(topic, 0, [(key, value, (), None)], expect=Expect(key, head))
        except ConcurrencyError:
            losses.append(value)
        else:
            wins.append((value, head, result.base_offset))
    return _RaceResult(wins, losses)


def read_all(log: Log, topic: str, partition: int = 0) -> list[Record]:
    """Every record of a partition from its low-water mark up to its high-water mark."""
    offset = log.offsets(topic, partition).lwm
    out: list[Record] = []
    cursor = None
    while True:
        records, cursor = log.read(topic, partition, offset, cursor=cursor)
        if not records:
            return out
        out.extend(records)
        offset = records[-1].offset + 1


def _check_chains(
    log: Log, topic: str, results: list[_RaceResult], *, attempts: int, gaps: bool = False
) -> None:
    """Each key's records form one chain; one winner per expected position; losers absent;
    the winners are exactly the records, at the offsets they were told. ``gaps``: a
    refused append may hold offsets that no read returns (and nothing else may)."""
    records = read_all(log, topic)
    forks: list[str] = []
    for key in RACE_KEYS:
        previous: int | None = None
        for r in (r for r in records if r.key == key):
            assert r.value is not None
            expected = r.value.decode().rsplit("/", 1)[1]
            if expected != str(previous):
                forks.append(
                    f"{key!r} at offset {r.offset} was appended expecting the key's last "
                    f"record at {expected}, but the record before it is at {previous}"
                )
            previous = r.offset
    assert not forks, f"forked history: {len(forks)} forked append(s): " + "; ".join(forks[:5])
    wins = [w for result in results for w in result.wins]
    losses = {value for result in results for value in result.losses}
    assert len(wins) + len(losses) == attempts
    per_position = Counter(
        (RACE_KEYS[int(value.decode().split("/")[1]) % len(RACE_KEYS)], head)
        for value, head, _ in wins
    )
    twice = [pos for pos, n in per_position.items() if n > 1]
    assert not twice, f"two winners for one expected position (key, last offset): {twice[:5]}"
    stored = {r.value: r.offset for r in records}
    assert not losses & stored.keys(), (
        f"records of refused appends are in the log: {sorted(losses & stored.keys())[:5]}"
    )
    assert {value: offset for value, _, offset in wins} == stored, (
        "the log's records are not exactly the acknowledged appends at their offsets"
    )
    assert len(records) == len(wins)
    if gaps:
        assert len(wins) <= log.offsets(topic, 0).leo <= attempts
    else:
        assert log.offsets(topic, 0).leo == len(wins)


class LogContract(abc.ABC):
    """The core role's behaviour (:class:`~eventlane.log.port.Log`): every engine has it.
    Subclass it (or the kits of the other roles the engine has, which include it) and
    implement :meth:`make_log`."""

    ROLE: ClassVar[type] = Log

    @abc.abstractmethod
    def make_log(self, directory: Path, clock: FakeClock) -> Log:
        """A fresh, empty log for one test (``directory`` is private to the test)."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        """The log's clock: it moves only when a test advances it."""
        return FakeClock()

    @pytest.fixture
    def log(self, tmp_path: Path, clock: FakeClock) -> Iterator[Log]:
        log = self.make_log(tmp_path / "log", clock)
        yield log
        log.close()

    # ------------------------------------------------------------------ the port itself
    def test_claims_exactly_its_roles(self, log: Log) -> None:
        """The engine implements the core role; it implements each other role exactly when
        this test class runs that role's kit (no role untested, no kit skipped)."""
        assert isinstance(log, Log), f"{type(log).__name__} does not implement the core Log role"
        kits = {k.__dict__["ROLE"] for k in type(self).__mro__ if "ROLE" in k.__dict__}
        for role, kit in ROLE_KITS.items():
            has = isinstance(log, role)
            runs = role in kits
            assert has or not runs, (
                f"{type(log).__name__} does not implement {role.__name__}, yet this class runs"
                f" {kit}: drop that kit"
            )
            assert runs or not has, (
                f"{type(log).__name__} implements {role.__name__}: run its kit, {kit}, too"
            )

    # ------------------------------------------------------------------ topic admin
    def test_create_list_describe(self, log: Log) -> None:
        desc = log.create_topic("orders", 3, {"retention_ms": -1})
        assert desc.name == "orders" and desc.partitions == 3
        assert desc.config.retention_ms == -1
        assert [p.partition for p in desc.partition_details] == [0, 1, 2]
        assert all((p.lwm, p.hwm, p.leo) == (0, 0, 0) for p in desc.partition_details)
        log.create_topic("audit", 1)
        assert log.list_topics() == ["audit", "orders"]
        assert log.topic_exists("orders") and not log.topic_exists("nope")
        assert log.partition_count("orders") == 3
        assert log.topic_config("orders").retention_ms == -1
        assert log.describe_topic("orders").to_dict()["name"] == "orders"

    def test_create_accepts_a_topic_config(self, log: Log) -> None:
        cfg = TopicConfig(cleanup_policy="compact", segment_bytes=4096)
        assert log.create_topic("snapshots", 1, cfg).config == cfg

    def test_create_existing_topic(self, log: Log) -> None:
        log.create_topic("t", 2)
        with pytest.raises(TopicExistsError) as info:
            log.create_topic("t", 2)
        assert info.value.topic == "t"
        assert log.create_topic("t", 2, exist_ok=True).partitions == 2

    def test_unknown_topic_everywhere(self, log: Log) -> None:
        calls: list[Callable[[], object]] = [
            lambda: log.describe_topic("ghost"),
            lambda: log.partition_count("ghost"),
            lambda: log.topic_config("ghost"),
            lambda: log.append("ghost", 0, [(None, b"v", (), None)]),
            lambda: log.read("ghost", 0, 0),
            lambda: log.offsets("ghost", 0),
            lambda: log.offset_for_time("ghost", 0, 0),
            lambda: log.alter_topic("ghost", partitions=2),
            lambda: log.delete_topic("ghost"),
        ]
        for call in calls:
            with pytest.raises(UnknownTopicError) as info:
                call()
            assert info.value.topic == "ghost"
        assert log.list_topics() == []

    def test_unknown_partition(self, log: Log) -> None:
        log.create_topic("t", 2)
        for bad in (2, -1, 99):
            with pytest.raises(UnknownPartitionError):
                log.append("t", bad, [(None, b"v", (), None)])
            with pytest.raises(UnknownPartitionError):
                log.read("t", bad, 0)
            with pytest.raises(UnknownPartitionError):
                log.offsets("t", bad)

    def test_alter_increase_warns_and_decrease_is_refused(self, log: Log) -> None:
        log.create_topic("t", 2)
        log.append("t", 1, [(b"k", b"v", (), None)])
        with capture_logs() as logs:
            desc = log.alter_topic("t", partitions=4)
        assert desc.partitions == 4 and log.partition_count("t") == 4
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert warnings and warnings[0]["topic"] == "t"
        assert "partition" in warnings[0]["event"]
        log.append("t", 3, [(b"k", b"new", (), None)])  # the new partition is usable
        assert log.offsets("t", 3).leo == 1
        with pytest.raises(ConfigError):
            log.alter_topic("t", partitions=3)
        assert log.partition_count("t") == 4
        assert log.offsets("t", 1).leo == 1  # nothing lost

    def test_alter_config(self, log: Log) -> None:
        log.create_topic("t", 1)
        desc = log.alter_topic("t", config={"retention.ms": "60000"})
        assert desc.config.retention_ms == 60_000
        assert log.topic_config("t").retention_ms == 60_000
        with pytest.raises(ConfigError):
            log.alter_topic("t", config={"no_such_key": 1})
        assert log.topic_config("t").retention_ms == 60_000

    def test_delete_topic(self, log: Log) -> None:
        log.create_topic("t", 2)
        log.append("t", 0, [(None, b"v", (), None)])
        log.delete_topic("t")
        assert log.list_topics() == []
        assert not log.topic_exists("t")
        with pytest.raises(UnknownTopicError):
            log.read("t", 0, 0)
        log.create_topic("t", 1)  # the name is free again, and the new topic is empty
        assert log.offsets("t", 0) == (0, 0, 0)

    # ------------------------------------------------------------------ records
    def test_append_and_read_back(self, log: Log, clock: FakeClock) -> None:
        log.create_topic("t", 1)
        records = [
            (b"k1", b"v1", (("h", b"x"), ("h", None)), T0 - 5),
            (None, b"keyless", (), None),
            (b"k1", None, (), T0 - 10),  # a tombstone, timestamp out of order
        ]
        result = log.append("t", 0, records)
        assert (result.base_offset, result.last_offset) == (0, 2)
        assert list(result.timestamps) == [T0 - 5, clock.now, T0 - 10]
        got, _ = log.read("t", 0, 0)
        assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == [
            (0, b"k1", b"v1", (("h", b"x"), ("h", None)), T0 - 5),
            (1, None, b"keyless", (), clock.now),
            (2, b"k1", None, (), T0 - 10),
        ]
        assert all(r.topic == "t" and r.partition == 0 for r in got)
        assert all(r.timestamp_type == TimestampType.CREATE_TIME for r in got)
        later = log.append("t", 0, [(b"k2", b"v", (), None)])
        assert later.base_offset == 3
        got, _ = log.read("t", 0, 2)
        assert [r.offset for r in got] == [2, 3]

    def test_log_append_time(self, log: Log, clock: FakeClock) -> None:
        log.create_topic("t", 1, {"timestamp_type": "LogAppendTime"})
        clock.advance(1234)
        result = log.append("t", 0, [(b"k", b"v", (), 42)])
        assert list(result.timestamps) == [clock.now]
        (record,), _ = log.read("t", 0, 0)
        assert record.timestamp == clock.now
        assert record.timestamp_type == TimestampType.LOG_APPEND_TIME

    def test_marks(self, log: Log) -> None:
        log.create_topic("t", 2)
        assert log.offsets("t", 0) == (0, 0, 0)
        log.append("t", 0, [(None, b"a", (), None), (None, b"b", (), None)])
        lwm, hwm, leo = log.offsets("t", 0)
        assert (lwm, hwm, leo) == (0, 2, 2)
        assert log.offsets("t", 1) == (0, 0, 0)
        assert log.describe_topic("t").partition_details[0].leo == 2

    def test_read_bounds(self, log: Log) -> None:
        log.create_topic("t", 1)
        log.append("t", 0, [(None, b"a", (), None)] * 3)
        assert log.read("t", 0, 3)[0] == []  # at the LEO: nothing yet, not an error
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read("t", 0, 4)
        assert (info.value.offset, info.value.lwm, info.value.leo) == (4, 0, 3)
        assert (info.value.topic, info.value.partition) == ("t", 0)

    def test_read_with_cursor_and_small_max_bytes(self, log: Log) -> None:
        log.create_topic("t", 1, {"segment_bytes": 300})
        for i in range(30):
            log.append("t", 0, [(b"k", b"%d" % i, (), None)])
        offset, cursor = 0, None
        seen: list[bytes | None] = []
        while True:
            records, cursor = log.read("t", 0, offset, max_bytes=1, cursor=cursor)
            if not records:
                break
            seen.extend(r.value for r in records)
            offset = records[-1].offset + 1
        assert seen == [b"%d" % i for i in range(30)]
        offset = 0
        below: list[int] = []
        while records := log.read("t", 0, offset, upto=5)[0]:
            below.extend(r.offset for r in records)
            offset = records[-1].offset + 1
        assert below == [0, 1, 2, 3, 4]  # ``upto`` caps a read like the HWM does

    def test_keyed_placement_is_kafkas(self, log: Log) -> None:
        log.create_topic("t", 6)
        producer = Producer(log)
        keys = [b"alice", b"bob", b"carol", b"", b"\x00\xff"]
        metas = producer.send_batch("t", [ProducerRecord(k, b"v") for k in keys])
        assert [m.partition for m in metas] == [partition_for_key(k, 6) for k in keys]
        again = producer.send_batch("t", [ProducerRecord(k, b"w") for k in keys])
        assert [m.partition for m in again] == [m.partition for m in metas]

    def test_keyless_records_spread(self, log: Log) -> None:
        log.create_topic("t", 4)
        producer = Producer(log)
        for _ in range(40):
            producer.send_batch("t", [ProducerRecord(None, b"v")])
        with producer:
            futures = [producer.send("t", b"w") for _ in range(40)]
        counts = Counter(f.result(timeout=10).partition for f in futures)
        assert len(counts) == 4
        totals = [log.offsets("t", p).leo for p in range(4)]
        assert sum(totals) == 80 and min(totals) >= 5

    def test_explicit_partition(self, log: Log) -> None:
        log.create_topic("t", 3)
        producer = Producer(log)
        metas = producer.send_batch(
            "t", [ProducerRecord(b"a", b"1"), ProducerRecord(None, b"2")], partition=2
        )
        assert [(m.partition, m.offset) for m in metas] == [(2, 0), (2, 1)]
        assert producer.send("t", b"3", key=b"zz", partition=1).result(10).partition == 1
        producer.close()
        with pytest.raises(InvalidRecordError):
            producer.send_batch("t", [ProducerRecord(None, b"x")], partition=3)
        assert [log.offsets("t", p).leo for p in range(3)] == [0, 1, 2]

    def test_wake_wakes_a_waiter(self, log: Log) -> None:
        seen = log.wait_seq()
        woke = threading.Event()

        def waiter() -> None:
            log.wait(seen, 10.0)
            woke.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.1)
        log.wake()
        assert woke.wait(5.0), "wake() did not wake the waiter"
        thread.join()

    def test_atomic_append(self, log: Log) -> None:
        log.create_topic("t", 1, {"max_record_bytes": 600_000})
        result = log.append("t", 0, [(b"k", b"v" * 100, (), None)] * 50, atomic=True)
        assert (result.base_offset, result.last_offset) == (0, 49)
        too_big = [(b"k", b"x" * 500_000, (), None)] * 3  # > one batch
        with pytest.raises(RecordTooLargeError):
            log.append("t", 0, too_big, atomic=True)
        assert log.offsets("t", 0).leo == 50
        assert log.append("t", 0, too_big).last_offset == 52  # fine when not atomic

    def test_empty_append_is_refused(self, log: Log) -> None:
        log.create_topic("t", 1)
        with pytest.raises(InvalidRecordError):
            log.append("t", 0, [])
        assert log.offsets("t", 0).leo == 0

    def test_offset_for_time(self, log: Log) -> None:
        log.create_topic("t", 1, {"segment_bytes": 200, "index_interval_bytes": 64})
        stamps = [T0 + 10, T0 + 5, T0 + 30, T0 + 20, T0 + 40, T0 + 40, T0 + 50]
        for ts in stamps:
            log.append("t", 0, [(b"k", b"value", (), ts)])
        for target in range(T0, T0 + 56):
            expected = next((i for i, ts in enumerate(stamps) if ts >= target), None)
            assert log.offset_for_time("t", 0, target) == expected, target

    # ------------------------------------------------------------------ waiting
    def test_wait_wakes_on_append_from_another_thread(self, log: Log) -> None:
        log.create_topic("t", 1)
        seen = log.wait_seq()
        woke = threading.Event()
        elapsed: list[float] = []

        def waiter() -> None:
            start = time.monotonic()
            log.wait(seen, 10.0)
            elapsed.append(time.monotonic() - start)
            woke.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.2)
        assert not woke.is_set()
        appended = time.monotonic()
        log.append("t", 0, [(None, b"v", (), None)])
        assert woke.wait(5.0), "waiter not woken by an append"
        thread.join()
        assert time.monotonic() - appended < 2.0
        assert log.wait_seq() != seen

    def test_wait_times_out(self, log: Log) -> None:
        seen = log.wait_seq()
        start = time.monotonic()
        log.wait(seen, 0.3)
        assert 0.25 <= time.monotonic() - start < 3.0

    def test_wait_returns_at_once_if_something_was_appended(self, log: Log) -> None:
        log.create_topic("t", 1)
        seen = log.wait_seq()
        log.append("t", 0, [(None, b"v", (), None)])
        start = time.monotonic()
        log.wait(seen, 5.0)
        assert time.monotonic() - start < 1.0

    # ------------------------------------------------------------------ deleting records
    def test_delete_records_advances_the_low_water_mark(self, log: Log) -> None:
        log.create_topic("t", 1)
        log.append("t", 0, [(b"k", b"%d" % i, (), None) for i in range(10)])
        assert log.delete_records("t", 0, 4) == 4
        assert log.offsets("t", 0).lwm == 4
        with pytest.raises(OffsetOutOfRangeError):
            log.read("t", 0, 2)
        assert [r.offset for r in log.read("t", 0, 4)[0]][:1] == [4]
        assert log.delete_records("t", 0, 1) == 4  # never backwards
        with pytest.raises(OffsetOutOfRangeError):
            log.delete_records("t", 0, 11)

    # ------------------------------------------------------------------ atomic batches
    def test_atomic_batch_is_seen_whole_or_not_at_all(self, log: Log) -> None:
        """A reader racing a writer of atomic batches never sees part of one (the marks and
        reads move a whole batch at a time); a batch refused for one bad record leaves
        nothing."""
        log.create_topic("t", 1)
        size, batches = 5, 30
        done = threading.Event()
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                for n in range(batches):
                    records = [(b"k", b"%d/%d" % (n, i), (), None) for i in range(size)]
                    log.append("t", 0, records, atomic=True)
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        torn: list[str] = []
        while not done.is_set() and len(torn) < 5:
            hwm = log.offsets("t", 0).hwm
            if hwm % size:
                torn.append(f"high-water mark {hwm}")
            got, _ = log.read("t", 0, 0)
            if len(got) % size:
                torn.append(f"a read from 0 returned {len(got)} records")
        thread.join()
        assert not errors, errors
        assert not torn, f"part of an atomic batch was visible: {torn}"
        assert log.offsets("t", 0).hwm == size * batches
        log.create_topic("c", 1, {"cleanup_policy": "compact"})
        bad = [(b"a", b"1", (), None), (b"b", b"2", (), None), (None, b"keyless", (), None)]
        with pytest.raises(InvalidRecordError):
            log.append("c", 0, bad, atomic=True)
        assert log.offsets("c", 0).leo == 0 and log.read("c", 0, 0)[0] == []

    # ------------------------------------------------------------------ close and reopen
    def test_everything_acknowledged_survives_reopen(
        self, tmp_path: Path, clock: FakeClock
    ) -> None:
        """Close the log and open it again on the same directory: topics, their configs and
        every acknowledged record (same offsets, keys, values, headers, timestamps) are
        there, per-key state agrees, and appends continue at the old end (no offset is
        reused). Per-key state: :meth:`KeyedLogContract.test_key_state_survives_reopen`."""
        directory = tmp_path / "reopened"
        first = self.make_log(directory, clock)
        try:
            first.create_topic("r", 3, {"retention_ms": -1})
            first.create_topic("c", 1, {"cleanup_policy": "compact", "segment_bytes": 4096})
            for p in range(3):
                first.append("r", p, [(b"k%d" % p, b"v", (("h", b"x"),), T0 + p)])
                first.append("r", p, [(None, b"keyless", (), None), (b"k", None, (), None)])
            first.append("r", 1, [(b"a", b"%d" % i, (), None) for i in range(7)], atomic=True)
            for i in range(12):
                first.append("c", 0, [(b"c%d" % (i % 3), b"%d" % i, (), None)])
            topics = first.list_topics()
            configs = {t: first.topic_config(t) for t in topics}
            marks = {
                (t, p): first.offsets(t, p) for t in topics for p in range(first.partition_count(t))
            }
            stored = {tp: [_fields(r) for r in read_all(first, *tp)] for tp in marks}
        finally:
            first.close()
        clock.advance(1000)
        second = self.make_log(directory, clock)
        try:
            assert second.list_topics() == topics, "topics lost or invented by a reopen"
            assert {t: second.topic_config(t) for t in topics} == configs
            assert {tp: second.offsets(*tp) for tp in marks} == marks
            for tp, records in stored.items():
                assert [_fields(r) for r in read_all(second, *tp)] == records, tp
            assert second.append("c", 0, [(b"c0", b"x", (), None)]).base_offset == (
                marks[("c", 0)].leo
            )
            assert (
                second.append("r", 1, [(None, b"next", (), None)]).base_offset
                == marks[("r", 1)].leo
            )
        finally:
            second.close()


class KeyedLogContract(LogContract):
    """The :class:`~eventlane.log.port.KeyedLog` role's behaviour: conditional appends and
    per-key reads (and the core kit)."""

    ROLE: ClassVar[type] = KeyedLog
    refused_appends_leave_gaps: ClassVar[bool] = False
    """True for an engine that validates conditional appends by log order (Kafka): a
    conditional append that loses a race is written, then rejected by every reader, so
    its offsets are never read (as a compaction gap); the kit still checks that no read
    returns a refused append and that every acknowledged one is where it was told."""

    def keyed(self, log: Log) -> KeyedLog:
        return keyed_log(log, "the KeyedLog contract kit")

    def test_conditional_append(self, log: KeyedLog) -> None:
        """``expect=Expect(key, last_offset)``: appended only if the key's last record is at
        ``last_offset`` (``None``: no record yet); otherwise ConcurrencyError, nothing
        written. Other keys are not affected."""
        log.create_topic("t", 1)
        first = log.append("t", 0, [(b"a", b"1", (), None)], expect=Expect(b"a", None))
        assert first.base_offset == 0
        with pytest.raises(ConcurrencyError):
            log.append("t", 0, [(b"a", b"2", (), None)] * 3, expect=Expect(b"a", None))
        assert log.offsets("t", 0).leo == 1  # the refused append left nothing
        assert [r.value for r in log.read("t", 0, 0)[0]] == [b"1"]
        other = log.append("t", 0, [(b"b", b"x", (), None)], expect=Expect(b"b", None))
        assert other.base_offset == 1
        assert log.append("t", 0, [(b"a", b"3", (), None)], expect=Expect(b"a", 0)).base_offset == 2
        with pytest.raises(ConcurrencyError):
            log.append("t", 0, [(b"a", b"4", (), None)], expect=Expect(b"a", 0))
        assert log.key_head("t", 0, b"a") == 2 and log.key_head("t", 0, b"zz") is None

    def test_conditional_append_under_contention(self, log: KeyedLog) -> None:
        """Threads racing on the same keys' expected last offsets: each key's history is
        a single chain (every record was appended expecting the record just before it),
        one winner per expected position, and no loser's record is in the log."""
        log.create_topic("t", 1)
        results: list[_RaceResult] = []
        lock = threading.Lock()

        def writer(name: int) -> None:
            outcome = _race(log, "t", f"thread-{name}", rounds=20)
            with lock:
                results.append(outcome)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _check_chains(log, "t", results, attempts=80, gaps=self.refused_appends_leave_gaps)

    def test_conditional_append_across_processes(self, log: KeyedLog, tmp_path: Path) -> None:
        """As above with writers in separate OS processes, each with its own log opened on
        the same directory: the check and the write are atomic across processes, not only
        across threads."""
        log.create_topic("t", 1)
        ctx = multiprocessing.get_context("fork")
        go = ctx.Event()
        queue: multiprocessing.Queue[_RaceResult | str] = ctx.Queue()
        procs = [
            ctx.Process(target=self._race_in_process, args=(tmp_path / "log", i, go, queue))
            for i in range(3)
        ]
        # a forked child must not collect the parent's garbage: finalising a client
        # library's handles (librdkafka's) without their threads crashes the child
        gc.collect()
        gc.freeze()
        try:
            for proc in procs:
                proc.start()
        finally:
            gc.unfreeze()
        try:
            go.set()
            results = []
            for _ in procs:
                got = queue.get(timeout=120)
                assert not isinstance(got, str), f"a writer process failed: {got}"
                results.append(got)
        finally:
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        _check_chains(log, "t", results, attempts=3 * 25, gaps=self.refused_appends_leave_gaps)

    def _race_in_process(
        self, directory: Path, name: int, go: Any, queue: multiprocessing.Queue[Any]
    ) -> None:
        try:
            other = self.keyed(self.make_log(directory, FakeClock()))
            try:
                go.wait(60)
                queue.put(_race(other, "t", f"process-{name}", rounds=25))
            finally:
                other.close()
        except BaseException as exc:
            queue.put(f"{type(exc).__name__}: {exc}")

    def test_per_key_reads(self, log: KeyedLog) -> None:
        log.create_topic("t", 1)
        for i in range(6):
            log.append("t", 0, [(b"k%d" % (i % 2), b"%d" % i, (), None)])
        assert [r.value for r in log.read_key("t", 0, b"k0")] == [b"0", b"2", b"4"]
        assert [r.offset for r in log.read_key("t", 0, b"k1", after=1)] == [3, 5]
        assert log.read_key("t", 0, b"none") == [] and log.key_head("t", 0, b"k1") == 5

    def test_key_state_survives_reopen(self, tmp_path: Path, clock: FakeClock) -> None:
        """Per-key state after a close and a reopen on the same directory: each key's head
        is where it was, an append expecting a stale head is refused and one expecting the
        current head lands at the old end."""
        directory = tmp_path / "reopened"
        first = self.keyed(self.make_log(directory, clock))
        try:
            first.create_topic("c", 1, {"cleanup_policy": "compact", "segment_bytes": 4096})
            for i in range(12):
                key = b"c%d" % (i % 3)
                head = first.key_head("c", 0, key)
                first.append("c", 0, [(key, b"%d" % i, (), None)], expect=Expect(key, head))
            heads = {k: first.key_head("c", 0, k) for k in (b"c0", b"c1", b"c2", b"new")}
            leo = first.offsets("c", 0).leo
            by_key = {k: [r.value for r in first.read_key("c", 0, k)] for k in heads}
        finally:
            first.close()
        clock.advance(1000)
        second = self.keyed(self.make_log(directory, clock))
        try:
            assert {k: second.key_head("c", 0, k) for k in heads} == heads
            assert {k: [r.value for r in second.read_key("c", 0, k)] for k in heads} == by_key
            with pytest.raises(ConcurrencyError):
                second.append("c", 0, [(b"c0", b"x", (), None)], expect=Expect(b"c0", None))
            after = second.append(
                "c", 0, [(b"c0", b"x", (), None)], expect=Expect(b"c0", heads[b"c0"])
            )
            assert after.base_offset == leo
        finally:
            second.close()


class MaintainedLogContract(LogContract):
    """The :class:`~eventlane.log.port.MaintainedLog` role's behaviour: compaction,
    retention and verification when asked (and the core kit).

    ``lazy_compaction``: superseded records stay readable until a compaction runs (honouring
    ``min_compaction_lag_ms``); set it false for an engine that keeps only a key's last
    record at once (JetStream)."""

    ROLE: ClassVar[type] = MaintainedLog
    lazy_compaction: ClassVar[bool] = True

    @pytest.fixture
    def log(self, tmp_path: Path, clock: FakeClock) -> Iterator[MaintainedLog]:
        log = self.make_log(tmp_path / "log", clock)
        try:
            yield maintained(log)
        finally:
            log.close()

    def test_unknown_topic_in_maintenance(self, log: MaintainedLog) -> None:
        calls: list[Callable[[], object]] = [
            lambda: log.compact("ghost"),
            lambda: log.cleanup("ghost"),
            lambda: log.verify("ghost"),
        ]
        for call in calls:
            with pytest.raises(UnknownTopicError) as info:
                call()
            assert info.value.topic == "ghost"

    def test_maintenance_reports_per_partition(self, log: MaintainedLog) -> None:
        log.create_topic("t", 3, {"cleanup_policy": "compact,delete"})
        assert len(log.compact("t")) == 3
        assert len(log.cleanup("t")) == 3
        assert log.verify("t") == [] and log.verify() == []

    def test_compaction_keeps_each_keys_last_record(
        self, log: MaintainedLog, clock: FakeClock
    ) -> None:
        """``compact()`` on a compacted topic: each key's last record stays, at its offset,
        with its value; records superseded before the active segment are gone; records of
        the active segment are untouched (engines that compact lazily); a tombstone stays
        until ``delete_retention_ms`` after compaction first saw it, then goes; the marks
        do not move backwards and offsets are never renumbered."""
        log.create_topic(
            "t",
            1,
            {"cleanup_policy": "compact", "segment_bytes": 300, "delete_retention_ms": 60_000},
        )
        appended: dict[int, tuple[bytes | None, bytes | None]] = {}

        def put(key: bytes, value: bytes | None) -> None:
            offset = log.append("t", 0, [(key, value, (), None)]).base_offset
            appended[offset] = (key, value)

        for n in range(24):  # several closed segments of superseded values
            put(b"k%d" % (n % 4), b"v%d" % n)
        put(b"k1", None)  # k1's last record is a tombstone
        log.roll("t", 0)
        closed_end = log.offsets("t", 0).leo
        put(b"k0", b"active-1")  # the active segment: one key twice, one new key
        put(b"k0", b"active-2")
        put(b"k9", b"active")
        lazy = self.lazy_compaction
        if lazy:
            assert [(r.key, r.value) for r in read_all(log, "t")] == list(appended.values()), (
                "superseded records must stay readable until a compaction runs"
            )
        lwm, hwm, leo = log.offsets("t", 0)

        def last_in(end: int) -> dict[bytes | None, int]:
            last: dict[bytes | None, int] = {}
            for offset, (key, _) in sorted(appended.items()):
                if offset < end:
                    last[key] = offset
            return last

        last_closed, last_all = last_in(closed_end), last_in(leo)
        superseded = [o for o in appended if o < closed_end and last_closed[appended[o][0]] != o]

        def check(tombstone_kept: bool) -> dict[int, tuple[bytes | None, bytes | None]]:
            got = {r.offset: (r.key, r.value) for r in read_all(log, "t")}
            assert list(got) == sorted(got)
            renumbered = {o: kv for o, kv in got.items() if appended.get(o) != kv}
            assert not renumbered, f"records not at the offset they were appended at: {renumbered}"
            after = log.offsets("t", 0)
            assert (after.hwm, after.leo) == (hwm, leo) and after.lwm >= lwm
            missing = [o for o in last_all.values() if o not in got and appended[o][1] is not None]
            assert not missing, f"compaction removed a key's last record: offsets {missing}"
            kept = [o for o in superseded if o in got]
            assert not kept, (
                f"compaction kept {len(kept)} superseded record(s) of closed segments: {kept[:6]}"
            )
            if lazy:
                active = [o for o in appended if o >= closed_end and o not in got]
                assert not active, f"compaction touched the active segment: lost {active}"
            tomb = last_all[b"k1"]
            assert (tomb in got) == tombstone_kept, (
                "a tombstone was removed before delete_retention_ms"
                if tombstone_kept
                else "a tombstone outlived delete_retention_ms"
            )
            return got

        log.compact("t")
        first = check(tombstone_kept=True)
        clock.advance(60_001)
        log.compact("t")
        second = check(tombstone_kept=False)
        assert {o: kv for o, kv in first.items() if o != last_all[b"k1"]} == second

    def test_size_retention_advances_the_low_water_mark(self, log: MaintainedLog) -> None:
        """A topic over ``retention_bytes`` loses its oldest records once retention runs:
        the low-water mark advances, reads below it are out of range, the rest keep their
        offsets and values, and the high-water mark does not move."""
        log.create_topic(
            "t",
            1,
            {
                "cleanup_policy": "delete",
                "retention_bytes": 2000,
                "segment_bytes": 500,
                "retention_ms": -1,
            },
        )
        values = [b"%03d" % n + b"x" * 60 for n in range(80)]
        for value in values:
            log.append("t", 0, [(b"k", value, (), None)])
        log.roll("t", 0)
        log.cleanup("t")
        lwm, hwm, leo = log.offsets("t", 0)
        assert (hwm, leo) == (80, 80)
        assert 0 < lwm < 80, f"retention did not advance the low-water mark ({lwm})"
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read("t", 0, lwm - 1)
        assert (info.value.offset, info.value.lwm) == (lwm - 1, lwm)
        assert [(r.offset, r.value) for r in read_all(log, "t")] == [
            (o, values[o]) for o in range(lwm, 80)
        ]
        log.append("t", 0, [(b"k", b"after", (), None)])
        assert log.offsets("t", 0).leo == 81  # offsets are never reused


class FencedLogContract(LogContract):
    """The :class:`~eventlane.log.port.FencedLog` role's behaviour: ``append_fenced`` (and
    the core kit)."""

    ROLE: ClassVar[type] = FencedLog

    def test_fenced_append(self, log: Log) -> None:
        """The precondition sees the partition's end; raising refuses the append (nothing
        written); threads each fencing on the end they read never write at another offset."""
        fenced = fenced_log(log, "the FencedLog contract kit")
        fenced.create_topic("t", 1)
        seen: list[int] = []
        result = fenced.append_fenced("t", 0, [(b"k", b"1", (), None)], precondition=seen.append)
        assert (result.base_offset, seen) == (0, [0])

        def refuse(_leo: int) -> None:
            raise PreconditionFailedError("fenced", topic="t", partition=0)

        with pytest.raises(PreconditionFailedError):
            fenced.append_fenced("t", 0, [(b"k", b"2", (), None)], precondition=refuse)
        assert fenced.offsets("t", 0).leo == 1
        landed: list[tuple[int, int]] = []
        lock = threading.Lock()

        def writer(name: int) -> None:
            for _ in range(10):
                at: list[int] = []

                def note(leo: int, at: list[int] = at) -> None:
                    at.append(leo)

                got = fenced.append_fenced(
                    "t", 0, [(b"w", b"%d" % name, (), None)], precondition=note
                )
                with lock:
                    landed.append((at[-1], got.base_offset))

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        moved = [(leo, offset) for leo, offset in landed if leo != offset]
        assert not moved, f"appends landed elsewhere than the end their fence saw: {moved[:5]}"
        assert sorted(o for _, o in landed) == list(range(1, 31))


ROLE_KITS: dict[type, str] = {
    KeyedLog: "KeyedLogContract",
    MaintainedLog: "MaintainedLogContract",
    FencedLog: "FencedLogContract",
}
"""Each role beyond the core and the name of its kit (``test_claims_exactly_its_roles``)."""


def maintained(log: Log) -> MaintainedLog:
    return maintained_log(log, "the MaintainedLog contract kit")


def _fields(r: Record) -> tuple[object, ...]:
    return (r.offset, r.key, r.value, r.headers, r.timestamp, r.timestamp_type)
