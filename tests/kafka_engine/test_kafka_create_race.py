"""Clients racing to create one topic with ``exist_ok=True`` (what every worker does for the
framework's own topics as it starts): each gets the topic's description, none an error.

The losers hear TOPIC_ALREADY_EXISTS from the controller while the broker they ask for
metadata may not know the topic yet; a projector worker died of exactly that in CI
(``UnknownTopicError: unknown topic '__eventlane_group_homes'``)."""

from __future__ import annotations

import threading

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog

CLIENTS = 6
ROUNDS = 12


def test_clients_racing_to_create_a_topic_all_get_its_description(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    logs = [KafkaLog(kafka_cluster.bootstrap, namespace=namespace) for _ in range(CLIENTS)]
    try:
        for r in range(ROUNDS):
            barrier = threading.Barrier(CLIENTS)
            partitions = 1 + r % 4
            results: list[object] = [None] * CLIENTS

            def create(i: int, name: str = f"raced{r}", n: int = partitions) -> None:
                barrier.wait()
                try:
                    results[i] = logs[i].create_topic(name, n, exist_ok=True).partitions
                except Exception as exc:  # the test reports what each got
                    results[i] = exc

            threads = [threading.Thread(target=create, args=(i,)) for i in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert results == [partitions] * CLIENTS, f"round {r}: {results}"
    finally:
        for log in logs:
            log.close()
