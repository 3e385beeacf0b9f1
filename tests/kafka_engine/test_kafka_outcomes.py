"""Outcomes of appends on Kafka: an append whose acknowledgement does not come in time (its
partition's leader broker frozen by SIGSTOP) is OutcomeUnknownError (indeterminate), never
refused nor done; the record is then stored at most once, and the log keeps appending."""

from __future__ import annotations

import os
import signal
import time

import pytest
from confluent_kafka.admin import AdminClient

from eventlane.errors import LogError, OutcomeUnknownError
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.testing.contracts import read_all


def test_an_unacknowledged_append_is_outcome_unknown(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace, timeout=3.0) as log:
        log.create_topic("frozen", 1)
        log.append("frozen", 0, [(b"k", b"before", (), None)])
        meta = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap}).list_topics(
            f"{namespace}.frozen", timeout=30
        )
        leader = kafka_cluster.node(meta.topics[f"{namespace}.frozen"].partitions[0].leader)
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(OutcomeUnknownError) as info:
                log.append("frozen", 0, [(b"k", b"maybe", (), None)])
            assert time.monotonic() - started < 30
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        assert info.value.indeterminate and not info.value.retriable
        assert (info.value.topic, info.value.partition) == ("frozen", 0)
        del info  # its traceback holds this frame, and so the log's librdkafka handles, in a
        # cycle: they reconnected to the stopped cluster until a GC, long after the test
        deadline = time.monotonic() + 60
        while True:  # the log appends again once the leader answers (or another leads)
            try:
                after = log.append("frozen", 0, [(b"k", b"after", (), None)])
                break
            except OutcomeUnknownError:
                assert time.monotonic() < deadline, "no append succeeded after SIGCONT"
        values = [r.value for r in read_all(log, "frozen")]
        assert values.count(b"before") == 1 and values.count(b"maybe") <= 1
        assert values[-1] == b"after" and after.base_offset == len(values) - 1


def test_close_releases_the_producers(kafka_cluster: LocalKafkaCluster, namespace: str) -> None:
    """A closed log's librdkafka producers are closed, not left to the garbage collector: one
    left alive reconnects (and logs) to a stopped cluster for as long as anything holds the
    log. An append after close is refused with eventlane's error, nothing sent."""
    log = KafkaLog(kafka_cluster.bootstrap, namespace=namespace, timeout=10.0)
    log.create_topic("closing", partitions=1)
    log.append("closing", 0, [(b"k", b"v", [], None)])
    log.wake()
    log.close()
    for producer in (*log._producers._all, log._waker):
        with pytest.raises(RuntimeError, match="closed"):
            producer.flush(0.1)
    with pytest.raises(LogError, match="closed"):
        log.append("closing", 0, [(b"k", b"w", [], None)])
