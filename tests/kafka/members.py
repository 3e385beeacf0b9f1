"""A consumer-group member process for the Kafka group tests.

``python members.py {confluent|kafka-python} BOOTSTRAP TOPIC GROUP OUT``: subscribes, and
for every record appends ``partition offset`` to OUT (flushed) before committing it
synchronously (at-least-once); its current assignment is written to OUT.assignment.
Runs until killed.
"""

from __future__ import annotations

import os
import sys
import time


def write_assignment(path: str, partitions: list[int]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(" ".join(map(str, sorted(partitions))))
    os.replace(tmp, path)


def confluent(bootstrap: str, topic: str, group: str, out: str) -> None:
    from confluent_kafka import Consumer  # noqa: PLC0415

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe([topic])
    with open(out, "a") as f:
        while True:
            msg = consumer.poll(0.2)
            write_assignment(out + ".assignment", [tp.partition for tp in consumer.assignment()])
            if msg is None or msg.error():
                continue
            f.write(f"{msg.partition()} {msg.offset()}\n")
            f.flush()
            consumer.commit(msg, asynchronous=False)


def kafka_python(bootstrap: str, topic: str, group: str, out: str) -> None:
    from kafka import KafkaConsumer, OffsetAndMetadata  # noqa: PLC0415

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    with open(out, "a") as f:
        while True:
            batch = consumer.poll(200)
            write_assignment(out + ".assignment", [tp.partition for tp in consumer.assignment()])
            for tp, msgs in batch.items():
                for msg in msgs:
                    f.write(f"{msg.partition} {msg.offset}\n")
                f.flush()
                consumer.commit({tp: OffsetAndMetadata(msgs[-1].offset + 1, "", -1)})


if __name__ == "__main__":
    kind, bootstrap, topic, group, out = sys.argv[1:6]
    time.sleep(0)
    (confluent if kind == "confluent" else kafka_python)(bootstrap, topic, group, out)
