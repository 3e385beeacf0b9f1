"""A read that continues where the last one stopped, at the end of a partition, while other
producers append: every record is returned once, in order, none skipped.

The defect this guards (found by the Kafka event store's races): a fetch that returned the
partition-EOF event *and then* new records in one ``consume`` put those records aside for
the next read, while the current read went on consuming past them, so the next read dropped
them as already passed: a record skipped by ``read`` (a load that found version 6 after 3)."""

from __future__ import annotations

import threading
import time

from framework.log.kafka.cluster import LocalKafkaCluster
from framework.log.kafka.log import KafkaLog


def test_tailing_reads_skip_nothing_while_others_append(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    writers = [KafkaLog(kafka_cluster.bootstrap, namespace=namespace) for _ in range(3)]
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as reader:
        reader.create_topic("tail", 1)
        each = 60
        total = each * len(writers)

        def produce(log: KafkaLog) -> None:
            for _ in range(each):
                log.append("tail", 0, [(b"k", b"x", (), None)])
                time.sleep(0.005)

        threads = [threading.Thread(target=produce, args=(w,)) for w in writers]
        for thread in threads:
            thread.start()
        seen: list[int] = []
        offset, cursor = 0, None
        deadline = time.monotonic() + 120
        try:
            while len(seen) < total and time.monotonic() < deadline:
                hwm = reader.offsets("tail", 0).hwm
                records, cursor = reader.read("tail", 0, offset, cursor=cursor, upto=hwm)
                for r in records:
                    assert r.offset == offset, f"read from {offset} returned {r.offset}"
                    seen.append(r.offset)
                    offset += 1
        finally:
            for thread in threads:
                thread.join(120)
            for w in writers:
                w.close()
        assert seen == list(range(total))
