"""The tests' oracle of the Kafka event store: a partition read raw with confluent-kafka
(no eventlane reader), judged by the log-order rule written here again, independently of
:mod:`eventlane.log.kafka.order` (headers ``eventlane.expect``, ``eventlane.expect.key``,
``eventlane.follows``; docs/scale-out.md states the rule)."""

from __future__ import annotations

from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as Kp


class Raw(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    visible: bool


def judged_partition(bootstrap: str, kafka_topic: str, partition: int) -> list[Raw]:
    """Every record of the partition, in offset order, with the rule's verdict."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "oracle",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(Kp(kafka_topic, partition), timeout=30)
        consumer.assign([Kp(kafka_topic, partition, low)])
        raw: list[tuple[int, bytes | None, bytes | None, dict[str, bytes]]] = []
        at_end = low >= high
        while not at_end:
            batch = consumer.consume(500, timeout=10)
            assert batch, "the oracle's read stopped before the high-water mark"
            for m in batch:
                err = m.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    at_end = (m.offset() or 0) >= high
                    continue
                headers = {k: v or b"" for k, v in (m.headers() or [])}
                raw.append((m.offset() or 0, m.key(), m.value(), headers))
    finally:
        consumer.close()
    heads: dict[bytes, int] = {}
    verdict: dict[int, bool] = {}
    out: list[Raw] = []
    for offset, key, value, headers in raw:
        if "eventlane.follows" in headers:
            ok = verdict[offset - int(headers["eventlane.follows"])]
        elif "eventlane.expect" in headers:
            want = headers["eventlane.expect"].decode()
            head = heads.get(headers.get("eventlane.expect.key", key or b""))
            ok = (head is None or head < int(want[1:])) if want[0] == "-" else head == int(want)
        else:
            ok = True
        verdict[offset] = ok
        if ok and key is not None:
            heads[key] = offset
        out.append(Raw(offset, key, value, headers, ok))
    return out
