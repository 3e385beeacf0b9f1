"""The shipped contract kit of the log port (:class:`framework.log.port.Log`).

:class:`LogContract` holds the behaviour every engine behind the port must have: topic
administration, appends and reads, the three marks, placement by the producer, conditional
(``expect=``) and atomic appends, per-key reads, waking waiters across threads, time
lookups, maintenance, deletion. An adapter proves itself by subclassing it in its own test
suite and implementing :meth:`LogContract.make_log` (as ``eventsourcing`` ships its recorder
test cases)::

    from framework.testing.contracts import LogContract

    class TestMyLogContract(LogContract):
        def make_log(self, directory, clock):
            return MyLog(directory, clock=clock)

Tests of a capability an engine lacks are skipped only through its ``capabilities``
(:class:`~framework.log.types.Capabilities`). This module imports pytest; ``import
framework`` and ``framework.testing`` do not import it.
"""

from __future__ import annotations

import abc
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from framework.errors import (
    ConcurrencyError,
    ConfigError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from framework.log import Expect, Log, Producer, ProducerRecord, TopicConfig
from framework.log.partitioner import partition_for_key
from framework.log.record import TimestampType
from framework.testing.clock import FakeClock

T0 = 1_700_000_000_000


class LogContract(abc.ABC):
    """Behaviour every :class:`Log` implementation must have. Subclass and implement
    :meth:`make_log`."""

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
    def test_implements_the_port(self, log: Log) -> None:
        assert isinstance(log, Log)

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
            lambda: log.compact("ghost"),
            lambda: log.cleanup("ghost"),
            lambda: log.verify("ghost"),
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

    def test_conditional_append(self, log: Log) -> None:
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

    def test_conditional_append_under_contention(self, log: Log) -> None:
        """Threads racing on the same key's expected last offset: exactly one wins each
        round, and the key's history is a chain without forks."""
        log.create_topic("t", 1)
        wins: list[int] = []
        losses = 0
        lock = threading.Lock()

        def writer(name: int) -> None:
            nonlocal losses
            for _ in range(20):
                head = log.key_head("t", 0, b"k")
                try:
                    log.append("t", 0, [(b"k", b"%d" % name, (), None)], expect=Expect(b"k", head))
                    with lock:
                        wins.append(name)
                except ConcurrencyError:
                    with lock:
                        losses += 1

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert log.offsets("t", 0).leo == len(wins) == len(log.read_key("t", 0, b"k"))
        assert len(wins) + losses == 80

    def test_per_key_reads(self, log: Log) -> None:
        if not log.capabilities.key_reads:
            pytest.skip("this engine declares no per-key reads (capabilities.key_reads)")
        log.create_topic("t", 1)
        for i in range(6):
            log.append("t", 0, [(b"k%d" % (i % 2), b"%d" % i, (), None)])
        assert [r.value for r in log.read_key("t", 0, b"k0")] == [b"0", b"2", b"4"]
        assert [r.offset for r in log.read_key("t", 0, b"k1", after=1)] == [3, 5]
        assert log.read_key("t", 0, b"none") == [] and log.key_head("t", 0, b"k1") == 5

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

    # ------------------------------------------------------------------ maintenance
    def test_maintenance_reports_per_partition(self, log: Log) -> None:
        log.create_topic("t", 3, {"cleanup_policy": "compact,delete"})
        assert len(log.compact("t")) == 3
        assert len(log.cleanup("t")) == 3
        assert log.verify("t") == [] and log.verify() == []

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
