"""What JetStream does differently, checked on the real cluster: compaction at once with
Kafka's tombstone rule, retention by stream limits, DeleteRecords, reversible names."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from eventlane.errors import (
    LogError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    TopicExistsError,
    UnknownTopicError,
)
from eventlane.log.jetstream import mapping
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.types import Expect

if TYPE_CHECKING:
    from eventlane.testing.clock import FakeClock


@pytest.fixture
def js(cluster: LocalCluster, namespace: str, clock: FakeClock) -> Iterator[JetStreamLog]:
    with JetStreamLog.from_url(cluster.url, namespace=namespace, clock=clock) as log:
        yield log


def _all(js: JetStreamLog, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    offset, out = js.offsets(topic, 0).lwm, []
    while records := js.read(topic, 0, offset)[0]:
        out.extend((r.offset, r.key, r.value) for r in records)
        offset = records[-1].offset + 1
    return out


def test_compaction_keeps_the_latest_value_and_tombstones_for_delete_retention(
    js: JetStreamLog, clock: FakeClock
) -> None:
    js.create_topic("state.v1", 1, {"cleanup.policy": "compact", "delete.retention.ms": 60_000})
    for i in range(9):
        js.append("state.v1", 0, [(b"k%d" % (i % 3), b"%d" % i, (), None)])
    js.append("state.v1", 0, [(b"k0", None, (), None)])  # tombstone for k0
    assert _all(js, "state.v1") == [(7, b"k1", b"7"), (8, b"k2", b"8"), (9, b"k0", None)]
    assert js.offsets("state.v1", 0) == (7, 10, 10)
    js.compact("state.v1")  # tombstone younger than delete.retention.ms: still readable
    assert (9, b"k0", None) in _all(js, "state.v1")
    clock.advance(60_001)
    calls: list[tuple[int, int, int]] = []
    (report,) = js.compact("state.v1", progress=lambda *a: calls.append(a))
    assert calls == [(1, 1, 0)] and report.records_kept == 2
    assert _all(js, "state.v1") == [(7, b"k1", b"7"), (8, b"k2", b"8")]  # k0 purged
    assert js.read_key("state.v1", 0, b"k0") == [] and js.key_head("state.v1", 0, b"k0") is None
    assert js.describe_topic("state.v1").config.delete_retention_ms == 60_000
    assert "state.v1" in js.list_topics()


def test_retention_by_time_is_a_stream_limit(js: JetStreamLog) -> None:
    js.create_topic("short", 1, {"retention.ms": 1000})
    js.append("short", 0, [(None, b"old", (), None)] * 3)
    deadline = time.monotonic() + 15
    while js.offsets("short", 0).lwm < 3:
        assert time.monotonic() < deadline, "records not expired by max_age"
        time.sleep(0.2)
    js.append("short", 0, [(None, b"new", (), None)])
    assert [r.value for r in js.read("short", 0, 3)[0]] == [b"new"]
    with pytest.raises(OffsetOutOfRangeError):
        js.read("short", 0, 0)


def test_delete_records_advances_the_low_water_mark(js: JetStreamLog) -> None:
    js.create_topic("d", 1)
    js.append("d", 0, [(b"k", b"%d" % i, (), None) for i in range(10)])
    assert js.delete_records("d", 0, 4) == 4
    assert js.offsets("d", 0) == (4, 10, 10)
    assert js.read("d", 0, 4)[0][0].value == b"4"
    with pytest.raises(OffsetOutOfRangeError):
        js.delete_records("d", 0, 11)


def test_names_are_reversible_and_collision_free() -> None:
    names = ["a.b", "a_b", "a-b", "a_2Eb", "A.B", "x" * 249]
    encoded = [mapping.encode_name(n) for n in names]
    assert len(set(encoded)) == len(names)
    assert [mapping.decode_name(e) for e in encoded] == names
    assert all(e.replace("_", "").isalnum() for e in encoded)


def test_an_append_on_one_connection_wakes_a_waiter_on_another(
    js: JetStreamLog, cluster: LocalCluster, namespace: str
) -> None:
    js.create_topic("w", 1)
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as other:
        seen = other.wait_seq()
        started = time.monotonic()
        js.append("w", 0, [(None, b"v", (), None)])
        other.wait(seen, 10.0)
        assert time.monotonic() - started < 2.0 and other.wait_seq() != seen
        seen = js.wait_seq()
        other.wake()  # an explicit wake reaches the other connection too
        js.wait(seen, 10.0)
        assert js.wait_seq() != seen


def test_the_last_append_before_close_still_wakes_waiters(
    cluster: LocalCluster, namespace: str
) -> None:
    """An append's wake message is sent with the next request or when the log goes idle;
    closing right after the append sends it too."""
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as other:
        writer = JetStreamLog.from_url(cluster.url, namespace=namespace)
        writer.create_topic("last", 1)
        seen = other.wait_seq()
        writer.append("last", 0, [(None, b"v", (), None)])
        writer.close()
        started = time.monotonic()
        other.wait(seen, 10.0)
        assert other.wait_seq() != seen and time.monotonic() - started < 2.0


def test_the_wake_of_concurrent_appends_is_not_left_owed(
    js: JetStreamLog, cluster: LocalCluster, namespace: str
) -> None:
    """Appends of concurrent threads (served by the log's own thread, which keeps running
    the loop afterwards) owe their wake message too: it goes out within the idle time even
    when nothing follows, not only with this process's next request."""
    js.create_topic("wc", 1)
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as other:
        seen = other.wait_seq()

        def writer() -> None:
            for _ in range(10):
                js.append("wc", 0, [(None, b"v", (), None)])

        threads = [threading.Thread(target=writer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        time.sleep(0.2)
        assert not js._wakeups.owed
        other.wait(seen, 5.0)
        assert other.wait_seq() != seen


def test_threads_sharing_one_log_each_get_their_own_answers(js: JetStreamLog) -> None:
    """Concurrent callers are served by the log's own thread, a lone caller runs the loop
    itself, and the two hand over both ways: answers never cross, nothing hangs."""
    js.create_topic("mt", 1)
    js.append("mt", 0, [(b"solo", b"-", (), None)])  # a lone caller first
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        key, last = b"w%d" % w, None
        try:
            for i in range(25):
                got = js.append("mt", 0, [(key, b"%d" % i, (), None)], expect=Expect(key, last))
                last = got.base_offset
                assert js.read_key("mt", 0, key)[-1].value == b"%d" % i
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and errors == []
    for w in range(6):
        assert [r.value for r in js.read_key("mt", 0, b"w%d" % w)] == [b"%d" % i for i in range(25)]
    time.sleep(0.05)  # idle: the log's thread runs the loop; a lone caller takes it back
    assert js.append("mt", 0, [(b"solo", b"+", (), None)]).base_offset == 151
    assert js.offsets("mt", 0).hwm == 152


def test_the_synchronous_api_works_from_inside_an_application_event_loop(
    js: JetStreamLog,
) -> None:
    """A coroutine of the caller's own event loop may call the (blocking) log: the log's
    thread runs the log's loop for it."""
    js.create_topic("in-loop", 1)

    async def handler() -> int:
        return js.append("in-loop", 0, [(b"k", b"v", (), None)]).base_offset

    assert asyncio.run(handler()) == 0
    assert [r.value for r in js.read_key("in-loop", 0, b"k")] == [b"v"]


def test_appending_to_a_topic_deleted_elsewhere_fails_fast(
    js: JetStreamLog, cluster: LocalCluster, namespace: str
) -> None:
    js.create_topic("gone", 2)
    js.append("gone", 0, [(None, b"v", (), None)])  # metadata now cached
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as other:
        other.delete_topic("gone")
    started = time.monotonic()
    for records in ([(None, b"v", (), None)], [(None, b"v", (), None)] * 3):
        with pytest.raises(UnknownTopicError):
            js.append("gone", 0, records)
    assert time.monotonic() - started < 5.0


def test_an_append_whose_ack_is_lost_is_sent_again_and_stored_once(
    cluster: LocalCluster, namespace: str
) -> None:
    """No ack within ``timeout``: the append goes to the retrying path with the same
    ``Nats-Msg-Id`` (and expectation), and the server's de-duplication answers with the
    first copy's sequence: one record, the right offset, for a lone caller and for
    concurrent ones."""
    with JetStreamLog.from_url(cluster.url, namespace=namespace, timeout=0.3) as js:
        js.create_topic("lost", 1)
        js.append("lost", 0, [(b"k", b"0", (), None)])
        answers = js._publisher.ack_prefix
        js._publisher.ack_prefix = f"{namespace}.nobody."  # acks of the next appends go nowhere
        sent_again: list[str] = []
        publish = js.js.publish

        async def counted(subject: str, *args: Any, **kwargs: Any) -> Any:
            sent_again.append(subject)
            return await publish(subject, *args, **kwargs)

        js.js.publish = counted
        got = js.append("lost", 0, [(b"k", b"1", (), None)], expect=Expect(b"k", 0))
        assert got.base_offset == 1
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            key = b"w%d" % w
            try:
                last = js.append("lost", 0, [(key, b"a", (), None)]).base_offset
                js.append("lost", 0, [(key, b"b", (), None)], expect=Expect(key, last))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        js._publisher.ack_prefix = answers
        assert errors == [] and len(sent_again) == 9
        assert js.offsets("lost", 0).hwm == 10
        assert [r.value for r in js.read_key("lost", 0, b"k")] == [b"0", b"1"]
        for w in range(4):
            assert [r.value for r in js.read_key("lost", 0, b"w%d" % w)] == [b"a", b"b"]


def test_close_ends_the_calls_in_flight_at_once(cluster: LocalCluster, namespace: str) -> None:
    """close() while other threads wait on the log: each call ends within seconds (not at
    the 60 s backstop): a write as "outcome unknown", anything else as a permanent error."""
    log = JetStreamLog.from_url(cluster.url, namespace=namespace)
    outcomes: dict[int, BaseException | None] = {}
    inside = threading.Semaphore(0)

    async def long() -> None:
        inside.release()
        await asyncio.sleep(3600)

    def caller(i: int) -> None:
        try:
            log.run(long(), write=i % 2 == 0)
            outcomes[i] = None
        except BaseException as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(4)]
    for th in threads:
        th.start()
    for _ in threads:
        assert inside.acquire(timeout=10)
    started = time.monotonic()
    log.close()
    for th in threads:
        th.join(20)
    waited = time.monotonic() - started
    assert sorted(outcomes) == [0, 1, 2, 3], f"callers still waiting after {waited:.1f} s"
    assert waited < 15
    for i, exc in outcomes.items():
        if i % 2 == 0:
            assert isinstance(exc, OutcomeUnknownError), repr(exc)
        else:
            assert type(exc) is LogError and exc.permanent, repr(exc)


def test_concurrent_creators_of_one_topic_both_succeed_with_exist_ok(
    cluster: LocalCluster, namespace: str
) -> None:
    """Two processes opening one app create its topics at once (``exist_ok=True``): the
    registry's create-if-absent picks one winner; the other sees the topic, never an error.
    Without ``exist_ok`` the loser gets TopicExistsError."""
    with (
        JetStreamLog.from_url(cluster.url, namespace=namespace) as one,
        JetStreamLog.from_url(cluster.url, namespace=namespace) as two,
    ):
        for i in range(4):
            exist_ok = i < 3
            barrier = threading.Barrier(2)
            outcomes: list[BaseException | int] = []

            def create(log: JetStreamLog, name: str = f"both{i}", ok: bool = exist_ok) -> None:
                barrier.wait()
                try:
                    outcomes.append(log.create_topic(name, 2, exist_ok=ok).partitions)
                except BaseException as exc:
                    outcomes.append(exc)

            threads = [threading.Thread(target=create, args=(log,)) for log in (one, two)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            if exist_ok:
                assert outcomes == [2, 2], outcomes
            else:
                assert 2 in outcomes and len(outcomes) == 2, outcomes
                loser = next(o for o in outcomes if o != 2)
                assert isinstance(loser, TopicExistsError), repr(loser)


def test_verify_reports_a_missing_partition_stream(js: JetStreamLog) -> None:
    js.create_topic("holes", 2)
    stream = mapping.stream_name(js.namespace, "holes", 1)
    js.run(js.js.delete_stream(stream))
    problems = js.verify("holes")
    assert [(type(p), p.partition, "missing" in str(p)) for p in problems] == [(LogError, 1, True)]
