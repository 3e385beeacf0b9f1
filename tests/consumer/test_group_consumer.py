"""GroupConsumer behaviour within one process (several consumers, real files and threads).

The multi-process acceptance tests are in ``test_group_processes.py``; these cover the API:
commits and their fencing, auto-commit, listeners, static membership, liveness knobs,
topics gaining partitions, independent groups and offset resets.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eventlane.consumer.group import GroupConsumer, RebalanceListener
from eventlane.consumer.offsets import OffsetAndMetadata
from eventlane.errors import (
    CommitFailedError,
    ConfigError,
    ConsumerError,
    NoOffsetForPartitionError,
)
from eventlane.log import LogStore, TopicPartition

T = "orders"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogStore]:
    store = LogStore(tmp_path / "data")
    yield store
    store.close()


@pytest.fixture
def consumers() -> Iterator[list[GroupConsumer]]:
    made: list[GroupConsumer] = []
    yield made
    for c in made:
        c.close()


def fill(log: LogStore, partitions: int, per_partition: int, topic: str = T) -> None:
    if not log.topic_exists(topic):
        log.create_topic(topic, partitions)
    for p in range(partitions):
        log.append(topic, p, [(None, f"{p}:{i}".encode(), (), None) for i in range(per_partition)])


def eventually(
    condition: Callable[[], bool], timeout: float = 15.0, step: Callable[[], object] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        if step is not None:
            step()
        else:
            time.sleep(0.02)


def drain(consumer: GroupConsumer, expect: int, timeout: float = 15.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        got.extend(consumer.poll(0.2))
    return got


def make(log: LogStore, consumers: list[GroupConsumer], **kw: object) -> GroupConsumer:
    options: dict = {
        "group_id": "g",
        "topics": [T],
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 200,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
    }
    options.update(kw)
    c = GroupConsumer(log, **options)
    consumers.append(c)
    return c


class Polling:
    """Polls a consumer in a background thread (as its own application thread would)."""

    def __init__(self, consumer: GroupConsumer) -> None:
        self.consumer = consumer
        self.records: list = []
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.records.extend(self.consumer.poll(0.1))
            except Exception as exc:
                self.errors.append(exc)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------- commits
def test_commit_stores_next_offset_and_a_new_member_resumes_there(log, consumers) -> None:
    fill(log, 2, 10)
    a = make(log, consumers)
    records = drain(a, 20)
    assert len(records) == 20
    a.commit()
    assert a.committed(TopicPartition(T, 0)) == 10
    entry = a.committed_entry(TopicPartition(T, 1))
    assert entry is not None and entry.member_id == a.member_id and entry.generation == a.generation
    a.commit({TopicPartition(T, 0): OffsetAndMetadata(7, "note")})
    assert a.committed_entry(TopicPartition(T, 0)).metadata == "note"
    a.close()
    b = make(log, consumers)
    again = drain(b, 3)
    assert sorted(r.value for r in again) == [b"0:7", b"0:8", b"0:9"]


def test_commit_of_an_unowned_partition_is_rejected_with_coordinates(log, consumers) -> None:
    fill(log, 2, 1)
    a = make(log, consumers)
    b = make(log, consumers)
    pa, pb = Polling(a), Polling(b)
    eventually(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1)
    pa.stop(), pb.stop()
    theirs = next(iter(b.assignment()))
    with pytest.raises(CommitFailedError) as err:
        a.commit({theirs: 0})
    assert "'g'" in str(err.value) and f"generation {a.generation}" in str(err.value)
    assert (err.value.topic, err.value.partition) == (theirs.topic, theirs.partition)
    assert a.committed(theirs) is None


def test_commit_async_completes_in_order_and_reports_through_callback(log, consumers) -> None:
    fill(log, 1, 5)
    a = make(log, consumers)
    drain(a, 5)
    seen: list[tuple[int, Exception | None]] = []
    tp = TopicPartition(T, 0)
    futures = [
        a.commit_async({tp: n}, callback=lambda offs, err: seen.append((offs[tp].offset, err)))
        for n in (1, 2, 3, 4, 5)
    ]
    for f in futures:
        f.result(10)
    assert seen == [(n, None) for n in (1, 2, 3, 4, 5)]
    assert a.committed(tp) == 5
    bad = a.commit_async({TopicPartition(T, 1): 1})  # no such partition owned
    with pytest.raises(CommitFailedError):
        bad.result(10)


def test_auto_commit_on_interval_and_on_close(log, consumers) -> None:
    fill(log, 1, 5)
    a = make(log, consumers, enable_auto_commit=True, auto_commit_interval_ms=100)
    drain(a, 5)
    tp = TopicPartition(T, 0)
    eventually(lambda: a.committed(tp) == 5, step=lambda: a.poll(0.05))
    log.append(T, 0, [(None, b"more", (), None)])
    drain(a, 1)
    a.close()  # commits what was consumed
    b = make(log, consumers)
    assert b.committed(tp) == 6


# ---------------------------------------------------------------------- positions
def test_auto_offset_reset_policies(log, consumers) -> None:
    fill(log, 1, 3)
    latest = make(log, consumers, group_id="late", auto_offset_reset="latest")
    tp = TopicPartition(T, 0)
    # "latest" is resolved when the partition is assigned: on an engine whose coordinator
    # answers late (Kafka on a loaded machine) a record appended before that is not "new".
    eventually(lambda: tp in latest.assignment(), step=lambda: latest.poll(0.05))
    assert latest.position(tp) == 3
    assert latest.poll(0.3) == []
    log.append(T, 0, [(None, b"new", (), None)])
    assert [r.value for r in drain(latest, 1)] == [b"new"]
    strict = make(log, consumers, group_id="strict", auto_offset_reset="error")
    with pytest.raises(NoOffsetForPartitionError):
        eventually(lambda: False, step=lambda: strict.poll(0.1))


def test_on_assigned_can_seek_to_positions_stored_elsewhere(log, consumers) -> None:
    fill(log, 2, 10)
    stored = {TopicPartition(T, 0): 8, TopicPartition(T, 1): 9}

    class FromReadModel(RebalanceListener):
        def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
            for tp in assigned:
                a.seek(tp, stored[tp])

    a = make(log, consumers, listener=FromReadModel())
    got = drain(a, 3)
    assert sorted(r.value for r in got) == [b"0:8", b"0:9", b"1:9"]
    assert a.position(TopicPartition(T, 0)) == 10


# ---------------------------------------------------------------------- rebalancing
def test_blocked_poll_notices_a_join_and_hands_over_promptly(log, consumers) -> None:
    fill(log, 4, 1)
    events: list[tuple[str, list[int]]] = []
    a = make(
        log,
        consumers,
        on_revoked=lambda tps: events.append(("revoked", [tp.partition for tp in tps])),
    )
    drain(a, 4)
    assert len(a.assignment()) == 4
    result: list = []
    waiting = threading.Thread(target=lambda: result.append(a.poll(2.5)))
    waiting.start()  # blocked in poll: nothing new to read
    time.sleep(0.2)
    b = make(log, consumers)
    started = time.monotonic()
    eventually(lambda: len(b.assignment()) == 2, step=lambda: b.poll(0.05))
    assert time.monotonic() - started < 2.0
    assert events and len(events[0][1]) == 2
    waiting.join()


def test_eager_assignor_revokes_everything_then_assigns(log, consumers) -> None:
    fill(log, 4, 1)
    events: list[tuple[str, int]] = []
    a = make(
        log,
        consumers,
        assignor="range",
        on_revoked=lambda tps: events.append(("revoked", len(tps))),
        on_assigned=lambda tps: events.append(("assigned", len(tps))),
    )
    drain(a, 4)
    pa = Polling(a)
    b = make(log, consumers, assignor="range")
    pb = Polling(b)
    eventually(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    pa.stop(), pb.stop()
    assert events == [("assigned", 4), ("revoked", 4), ("assigned", 2)]
    with pytest.raises(ConfigError, match="assignor"):
        make(log, consumers, assignor="roundrobin").poll(0)


def test_topic_gaining_partitions_triggers_a_rebalance(log, consumers) -> None:
    fill(log, 2, 1)
    a = make(log, consumers)
    b = make(log, consumers)
    pa, pb = Polling(a), Polling(b)
    eventually(lambda: len(a.assignment() | b.assignment()) == 2)
    log.alter_topic(T, partitions=4)
    log.append(T, 3, [(None, b"in-new-partition", (), None)])
    eventually(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    eventually(lambda: any(r.value == b"in-new-partition" for r in pa.records + pb.records))
    pa.stop(), pb.stop()
    assert not pa.errors and not pb.errors


def test_groups_are_independent(log, consumers) -> None:
    fill(log, 3, 4)
    one = make(log, consumers, group_id="one")
    two = make(log, consumers, group_id="two")
    assert len(drain(one, 12)) == 12
    one.commit()
    assert len(drain(two, 12)) == 12
    assert two.committed(TopicPartition(T, 0)) is None
    assert one.committed(TopicPartition(T, 0)) == 4


# ---------------------------------------------------------------------- liveness
def test_max_poll_interval_leaves_the_group_and_poll_rejoins(log, consumers) -> None:
    fill(log, 2, 1)
    lost: list[list[TopicPartition]] = []
    slow = make(log, consumers, max_poll_interval_ms=400, on_lost=lost.append)
    drain(slow, 2)
    tp = TopicPartition(T, 0)
    assert slow.owns(tp)
    other = make(log, consumers)
    po = Polling(other)
    eventually(lambda: other.assignment() == {TopicPartition(T, 0), TopicPartition(T, 1)})
    assert not slow.owns(tp)  # cheap check from any thread sees it at once
    with pytest.raises(CommitFailedError, match="no longer in group"):
        slow.commit({tp: 1})
    old_member = slow.member_id
    slow.poll(0.5)  # learns it lost everything, rejoins as a new member
    assert lost and set(lost[0]) == {TopicPartition(T, 0), TopicPartition(T, 1)}
    assert slow.member_id != old_member
    eventually(lambda: len(slow.assignment()) == 1, step=lambda: slow.poll(0.05))
    po.stop()


def test_static_member_restart_keeps_its_partitions(log, consumers) -> None:
    fill(log, 4, 1)
    a = make(log, consumers, group_instance_id="worker-1", session_timeout_ms=5000)
    b = make(log, consumers, group_instance_id="worker-2", session_timeout_ms=5000)
    pa, pb = Polling(a), Polling(b)
    eventually(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    pa.stop()
    before = a.assignment()
    a.close()  # a static member does not leave: its partitions wait for it
    time.sleep(0.3)
    assert len(b.assignment()) == 2
    again = make(log, consumers, group_instance_id="worker-1", session_timeout_ms=5000)
    eventually(lambda: again.assignment() == before, step=lambda: again.poll(0.05))
    assert len(b.assignment()) == 2
    pb.stop()


def test_duplicate_live_static_instance_fences_the_older(log, consumers) -> None:
    fill(log, 2, 1)
    old = make(log, consumers, group_instance_id="worker-1")
    drain(old, 2)
    new = make(log, consumers, group_instance_id="worker-1")
    new.poll(0.2)
    assert len(new.assignment()) == 2
    with pytest.raises(CommitFailedError, match="fenced"):
        old.commit({TopicPartition(T, 0): 1})
    with pytest.raises(ConsumerError, match="fenced"):
        old.poll(0.1)
    with pytest.raises(ConsumerError, match="fenced"):
        old.poll(0.1)  # for good


# ---------------------------------------------------------------------- configuration
def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ConfigError, match="heartbeat_interval_ms"):
        GroupConsumer(None, group_id="g", session_timeout_ms=100, heartbeat_interval_ms=100)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="illegal"):
        GroupConsumer(None, group_id="../etc")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="assignor"):
        GroupConsumer(None, group_id="g", assignor="fair")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        GroupConsumer(None, group_id="g", auto_offset_reset="smallest")  # type: ignore[arg-type]


def test_poll_without_subscription_and_after_close(log, consumers) -> None:
    c = make(log, consumers, topics=[])
    with pytest.raises(ConfigError, match="subscribe"):
        c.poll()
    c.subscribe([T])
    fill(log, 1, 1)
    assert len(drain(c, 1)) == 1
    c.close()
    with pytest.raises(ConsumerError, match="closed"):
        c.poll()


def test_a_frozen_lock_holder_does_not_stop_other_members_heartbeats(log, consumers) -> None:
    """A process frozen while holding the group lock (simulated: this test holds it) must not
    freeze the others' heartbeats, or they would all be evicted once it resumes."""
    fill(log, 4, 1)
    lost: list[str] = []
    a = make(
        log,
        consumers,
        session_timeout_ms=1000,
        heartbeat_interval_ms=100,
        on_lost=lambda tps: lost.append("a"),
    )
    b = make(
        log,
        consumers,
        session_timeout_ms=1000,
        heartbeat_interval_ms=100,
        on_lost=lambda tps: lost.append("b"),
    )
    dead = make(
        log, consumers, group_instance_id="gone", session_timeout_ms=1000, heartbeat_interval_ms=100
    )
    pa, pb = Polling(a), Polling(b)
    eventually(lambda: dead.poll(0.05) is not None and len(dead.assignment()) > 0)
    dead.close()  # static: stays a member without heartbeats, expires in 1 s
    eventually(lambda: a.member_id is not None and b.member_id is not None)
    ids = (a.member_id, b.member_id)
    fd = os.open(log.path / "groups" / "g" / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "frozen" while holding the lock, for 2.5 s
    time.sleep(2.5)  # meanwhile a and b try to evict the expired member, and must go on beating
    os.close(fd)
    eventually(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    pa.stop(), pb.stop()
    assert (a.member_id, b.member_id) == ids and lost == []
