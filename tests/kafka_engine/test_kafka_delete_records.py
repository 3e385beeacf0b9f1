"""DeleteRecords while a partition has no leader the admin client can reach: the call waits for
the election and moves the low-water mark, instead of failing with "no leader" (CI saw
``Failed to query partition leaders: No leaders found`` in a migration to Kafka, right after
its first appends: tests/kafka_engine/test_kafka_migrate.py)."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog


def _leader(bootstrap: str, topic: str) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return int(meta.topics[topic].partitions[0].leader)


def test_delete_records_waits_out_a_killed_leader(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("trimmed", 1)
        log.append("trimmed", 0, [(b"k%d" % i, b"v", (), None) for i in range(20)])
        victim = _leader(kafka_cluster.bootstrap, f"{namespace}.trimmed")
        kafka_cluster.kill(victim)
        try:
            started = time.monotonic()
            assert log.delete_records("trimmed", 0, 10) == 10
            waited = time.monotonic() - started
            offsets = log.offsets("trimmed", 0)
            assert (offsets.lwm, offsets.hwm) == (10, 20)
            records, _ = log.read("trimmed", 0, 10)
            assert [r.offset for r in records] == list(range(10, 20))
            assert _leader(kafka_cluster.bootstrap, f"{namespace}.trimmed") != victim
            assert waited < log.timeout, f"waited {waited:.1f} s for a new leader"
        finally:
            kafka_cluster.start_node(victim)
