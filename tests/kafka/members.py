"""A consumer-group member process for the Kafka group tests.

``python members.py {confluent|kafka-python} BOOTSTRAP TOPIC GROUP OUT``: subscribes, and
for every record appends ``partition offset`` to OUT (flushed) before committing it
synchronously (at-least-once); its current assignment is written to OUT.assignment.
Runs until killed.

Generous timeouts (a member on a loaded 2-core machine can be starved for seconds: with a
6 s session two librdkafka members were once evicted for missed heartbeats): a 20 s session,
a heartbeat every 2 s, and a 30 s poll interval, which is also the member's rebalance
timeout (librdkafka's default of 300 s would let a member killed while its JoinGroup is
pending hold the group's join phase for five minutes).
"""

from __future__ import annotations

import os
import sys
import time

SESSION_MS = 20_000
HEARTBEAT_MS = 2_000
POLL_INTERVAL_MS = 30_000


def write_assignment(path: str, partitions: list[int]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(" ".join(map(str, sorted(partitions))))
    os.replace(tmp, path)


def confluent(bootstrap: str, topic: str, group: str, out: str) -> None:
    from confluent_kafka import Consumer, KafkaException  # noqa: PLC0415

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "max.poll.interval.ms": POLL_INTERVAL_MS,
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
            try:
                consumer.commit(msg, asynchronous=False)
            except KafkaException:  # e.g. the group rebalanced: a later commit covers it
                continue


def kafka_python(bootstrap: str, topic: str, group: str, out: str) -> None:
    from kafka import KafkaConsumer, OffsetAndMetadata  # noqa: PLC0415
    from kafka.errors import KafkaError  # noqa: PLC0415

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_interval_ms=POLL_INTERVAL_MS,
    )
    with open(out, "a") as f:
        while True:
            batch = consumer.poll(200)
            write_assignment(out + ".assignment", [tp.partition for tp in consumer.assignment()])
            for tp, msgs in batch.items():
                for msg in msgs:
                    f.write(f"{msg.partition} {msg.offset}\n")
                f.flush()
                try:
                    consumer.commit({tp: OffsetAndMetadata(msgs[-1].offset + 1, "", -1)})
                except KafkaError:  # e.g. the group rebalanced: a later commit covers it
                    continue


if __name__ == "__main__":
    kind, bootstrap, topic, group, out = sys.argv[1:6]
    time.sleep(0)
    (confluent if kind == "confluent" else kafka_python)(bootstrap, topic, group, out)
