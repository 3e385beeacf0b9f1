"""A non-atomic append larger than the topic's segment is split to fit (Kafka refuses a
batch larger than ``segment.bytes``); an atomic one is refused before anything is sent."""

from __future__ import annotations

import pytest

from framework.errors import RecordTooLargeError
from framework.log.kafka.cluster import LocalKafkaCluster
from framework.log.kafka.log import KafkaLog


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
