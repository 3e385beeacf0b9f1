"""A non-atomic append larger than the topic's segment is split to fit (Kafka refuses a
batch larger than ``segment.bytes``); an atomic one is refused before anything is sent."""

from __future__ import annotations

import pytest

from eventlane.errors import RecordTooLargeError
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog


def test_appends_are_split_to_fit_small_segments(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("small", 1, {"segment.bytes": 300})
        records = [(b"k%d" % i, b"v" * 40, (), None) for i in range(20)]
        result = log.append("small", 0, records)
        assert (result.base_offset, result.last_offset) == (0, 19)
        assert [r.value for r in log.read("small", 0, 0)[0]] == [b"v" * 40] * 20
        with pytest.raises(RecordTooLargeError):
            log.append("small", 0, records, atomic=True)
        assert log.offsets("small", 0).hwm == 20


def test_a_read_at_the_end_then_an_append_reads_the_new_record(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    """The reader met the partition's end (Kafka's EOF event) once: a later read from the
    same offset after an append must return the new records, never an old end's []."""
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("homes", 1)
        for i in range(20):
            assert log.read("homes", 0, i)[0] == []
            log.append("homes", 0, [(b"g", b"%d" % i, (), None)])
            got = log.read("homes", 0, 0)[0]
            assert [r.value for r in got] == [b"%d" % j for j in range(i + 1)], i
