"""The free consumer: assigned partitions, explicit positions, ``poll``, no group.

Positions are "the offset of the next record ``poll`` returns"; ``poll`` serves the assigned
partitions round-robin up to ``max_records``, returns only records below the HWM, and when
caught up sleeps until an append (from any thread or process) or the timeout, without
spinning. Where there is no valid position, ``auto_offset_reset`` decides: ``earliest`` →
LWM, ``latest`` → HWM, ``error`` → ``NoOffsetForPartitionError`` (no position yet) or
``OffsetOutOfRangeError`` (below the LWM / past the LEO), never a silent skip.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest

from eventlane.consumer import Consumer, OffsetAndTimestamp
from eventlane.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from eventlane.log import LogStore, TopicPartition

if TYPE_CHECKING:
    from eventlane.testing.clock import FakeClock

T0 = 1_700_000_000_000
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


@pytest.fixture
def filled(store: LogStore) -> LogStore:
    """Topic ``a`` (2 partitions: 10 and 5 records) and ``b`` (1 partition: 3 records)."""
    store.create_topic("a", 2)
    store.create_topic("b", 1)
    for i in range(10):
        store.append("a", 0, [(b"k", b"a0-%d" % i, (), T0 + i)])
    store.append("a", 1, [(None, b"a1-%d" % i, (), T0 + 100 + i) for i in range(5)])
    store.append("b", 0, [(b"x", b"b0-%d" % i, (), T0 + 200 + i) for i in range(3)])
    return store


def drain(consumer: Consumer, max_records: int | None = None) -> list[tuple[str, int, int]]:
    out = []
    while batch := consumer.poll(0, max_records=max_records):
        out.extend((r.topic, r.partition, r.offset) for r in batch)
    return out


def test_assign_and_poll_everything(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="earliest")
    consumer.assign([A0, A1, B0])
    assert consumer.assignment() == [A0, A1, B0]
    got = drain(consumer)
    assert sorted(got) == sorted(
        [("a", 0, i) for i in range(10)]
        + [("a", 1, i) for i in range(5)]
        + [("b", 0, i) for i in range(3)]
    )
    for tp in (A0, A1, B0):  # per partition, in offset order
        offsets = [o for t, p, o in got if (t, p) == tp]
        assert offsets == sorted(offsets)
    assert [consumer.position(tp) for tp in (A0, A1, B0)] == [10, 5, 3]
    assert consumer.poll(0) == []


def test_max_records_and_round_robin(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="earliest", max_poll_records=4)
    consumer.assign([A0, A1, B0])
    first = consumer.poll(0)
    assert len(first) == 4
    sizes = []
    seen = set()
    polls = [first]
    while batch := consumer.poll(0, max_records=2):
        polls.append(batch)
        sizes.append(len(batch))
    assert all(s <= 2 for s in sizes)
    for batch in polls:
        seen.update((r.topic, r.partition) for r in batch)
    assert seen == {A0, A1, B0}
    # no partition waits for another to be drained: each appears in the first few polls
    early = {(r.topic, r.partition) for batch in polls[:4] for r in batch}
    assert early == {A0, A1, B0}
    assert sum(len(b) for b in polls) == 18


def test_seek_position_and_seek_to(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="error")
    consumer.assign([A0, A1])
    consumer.seek(A0, 7)
    consumer.seek(A1, 4)
    assert consumer.position(A0) == 7
    assert sorted(drain(consumer)) == [("a", 0, 7), ("a", 0, 8), ("a", 0, 9), ("a", 1, 4)]
    consumer.seek(A0, 2)
    records = consumer.poll(0, max_records=1)
    assert [(r.partition, r.offset, r.value) for r in records] == [(0, 2, b"a0-2")]
    assert consumer.position(A0) == 3
    consumer.seek_to_end(A0)
    assert consumer.position(A0) == 10
    consumer.seek_to_beginning()
    assert (consumer.position(A0), consumer.position(A1)) == (0, 0)
    consumer.seek_to_end()
    assert (consumer.position(A0), consumer.position(A1)) == (10, 5)
    assert consumer.poll(0) == []
    consumer.seek(A1, 5)  # the LEO itself is a valid position: nothing yet
    assert consumer.poll(0) == []


def test_seek_past_leo(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="error")
    consumer.assign([A1])
    consumer.seek(A1, 50)
    with pytest.raises(OffsetOutOfRangeError) as info:
        consumer.poll(0)
    assert (info.value.offset, info.value.leo) == (50, 5)
    for reset, expected in (("earliest", 0), ("latest", 5)):
        consumer = Consumer(filled, auto_offset_reset=reset)
        consumer.assign([A1])
        consumer.seek(A1, 50)
        records = consumer.poll(0)
        assert consumer.position(A1) == 5
        assert [r.offset for r in records] == list(range(expected, 5))


def test_reassign_keeps_positions_of_kept_partitions(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="earliest")
    consumer.assign([A0, B0])
    consumer.seek(A0, 6)
    consumer.seek(B0, 1)
    consumer.assign([A0, A1])
    assert consumer.assignment() == [A0, A1]
    assert consumer.position(A0) == 6
    assert consumer.position(A1) == 0
    got = drain(consumer)
    assert sorted(got) == [("a", 0, o) for o in range(6, 10)] + [("a", 1, o) for o in range(5)]


@pytest.mark.parametrize("reset", ["earliest", "latest", "error"])
def test_auto_offset_reset_without_position(filled: LogStore, reset: str) -> None:
    consumer = Consumer(filled, auto_offset_reset=reset)
    consumer.assign([A0])
    if reset == "error":
        with pytest.raises(NoOffsetForPartitionError) as info:
            consumer.poll(0)
        assert (info.value.topic, info.value.partition) == ("a", 0)
        with pytest.raises(NoOffsetForPartitionError):
            consumer.position(A0)
        consumer.seek(A0, 8)  # an explicit position settles it
        assert [r.offset for r in consumer.poll(0)] == [8, 9]
        return
    if reset == "earliest":
        assert consumer.position(A0) == 0
        assert len(drain(consumer)) == 10
    else:
        assert consumer.position(A0) == 10
        assert consumer.poll(0) == []
        filled.append("a", 0, [(b"k", b"new", (), None)])
        assert [r.value for r in consumer.poll(0)] == [b"new"]


def test_poll_timeout_returns_empty_after_timeout(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="latest")
    consumer.assign([A0, A1])
    for timeout in (0.0, 0.2, 0.5):
        start = time.monotonic()
        assert consumer.poll(timeout) == []
        elapsed = time.monotonic() - start
        assert timeout * 0.9 <= elapsed < timeout + 1.5, (timeout, elapsed)
    empty = Consumer(filled)
    start = time.monotonic()
    assert empty.poll(0.2) == []  # nothing assigned: waits, returns nothing
    assert time.monotonic() - start >= 0.18


def test_poll_does_not_spin_while_waiting(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="latest")
    consumer.assign([A0, A1, B0])
    cpu = time.process_time()
    wall = time.monotonic()
    assert consumer.poll(1.0) == []
    cpu_used = time.process_time() - cpu
    assert time.monotonic() - wall >= 0.9
    assert cpu_used < 0.3, f"poll burned {cpu_used:.2f} s of CPU waiting 1 s"


def test_poll_wakes_promptly_on_append_from_another_thread(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="latest")
    consumer.assign([A0, A1, B0])
    assert consumer.poll(0) == []
    appended_at: list[float] = []

    def append_later() -> None:
        time.sleep(0.3)
        appended_at.append(time.monotonic())
        filled.append("a", 1, [(None, b"wake up", (), None)])

    thread = threading.Thread(target=append_later)
    start = time.monotonic()
    thread.start()
    records = consumer.poll(10.0)
    woke = time.monotonic()
    thread.join()
    assert [r.value for r in records] == [b"wake up"]
    assert woke - start >= 0.25
    assert woke - appended_at[0] < 1.0, f"woke {woke - appended_at[0]:.3f} s after the append"


def test_poll_wakes_for_an_append_to_another_topic_and_keeps_waiting(
    filled: LogStore,
) -> None:
    """An append elsewhere wakes the waiter, which re-checks and goes on waiting."""
    consumer = Consumer(filled, auto_offset_reset="latest")
    consumer.assign([B0])
    consumer.poll(0)

    def noise_then_data() -> None:
        time.sleep(0.1)
        filled.append("a", 0, [(b"k", b"noise", (), None)])
        time.sleep(0.2)
        filled.append("b", 0, [(b"x", b"data", (), None)])

    thread = threading.Thread(target=noise_then_data)
    thread.start()
    start = time.monotonic()
    records = consumer.poll(10.0)
    thread.join()
    assert [r.value for r in records] == [b"data"]
    assert 0.25 <= time.monotonic() - start < 3.0


def test_offsets_for_times(filled: LogStore) -> None:
    consumer = Consumer(filled)
    consumer.assign([A0, A1, B0])
    got = consumer.offsets_for_times({A0: T0 + 3, A1: T0 + 100, B0: T0 + 1_000})
    assert got == {A0: OffsetAndTimestamp(3, T0 + 3), A1: OffsetAndTimestamp(0, T0 + 100), B0: None}
    consumer.seek(A0, got[A0].offset)  # type: ignore[union-attr]
    assert consumer.poll(0, max_records=1)[0].timestamp == T0 + 3


def test_log_append_time_and_clock(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", 1, {"timestamp_type": "LogAppendTime"})
    consumer = Consumer(store, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", 0)])
    clock.advance(500)
    store.append("t", 0, [(None, b"v", (), 1)])
    (record,) = consumer.poll(0)
    assert record.timestamp == clock.now and record.timestamp_type == 1


def test_close(filled: LogStore) -> None:
    consumer = Consumer(filled, auto_offset_reset="earliest")
    consumer.assign([A0])
    consumer.poll(0, max_records=1)
    consumer.close()
    assert consumer.assignment() == []
    assert consumer.poll(0) == []
