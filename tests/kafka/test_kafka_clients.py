"""Real Kafka clients against ``eventlane serve --kafka``: produce, placement, fetch, headers,
timestamps, and the same records through eventlane's own reader."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTP
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KNewTopic

from eventlane.log import LogStore
from eventlane.log.partitioner import partition_for_key

N = 3000
PARTITIONS = 4
T0 = 1_700_000_000_000


def records(tag: str) -> list[tuple[bytes, bytes, int]]:
    return [(f"{tag}-key-{i % 500}".encode(), f"{tag}-{i}".encode(), T0 + i) for i in range(N)]


def expected(tag: str) -> dict[int, list[tuple[bytes, bytes, int]]]:
    out: dict[int, list[tuple[bytes, bytes, int]]] = {p: [] for p in range(PARTITIONS)}
    for key, value, ts in records(tag):
        out[partition_for_key(key, PARTITIONS)].append((key, value, ts))
    return out


def stored(log: LogStore, topic: str) -> dict[int, list[tuple[bytes, bytes, int, tuple]]]:
    out = {}
    for p in range(PARTITIONS):
        recs, _ = log.read(topic, p, 0, max_bytes=1 << 26)
        out[p] = [(r.key, r.value, r.timestamp, tuple(r.headers)) for r in recs]
    return out


def check_log(kafka, topic: str, tag: str) -> None:
    log = LogStore(kafka.data)
    try:
        got = stored(log, topic)
    finally:
        log.close()
    want = expected(tag)
    for p in range(PARTITIONS):
        assert [(k, v, ts) for k, v, ts, _ in got[p]] == want[p], f"partition {p}"
        assert all(h == (("client", tag.encode()),) for *_, h in got[p])


def test_confluent_kafka_produce_and_consume(kafka) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.create_topics([NewTopic("ck", PARTITIONS, 1)]).values():
        f.result(10)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random", "linger.ms": 5}
    )
    acks: list[tuple[int, int]] = []
    for key, value, ts in records("ck"):
        producer.produce(
            "ck",
            key=key,
            value=value,
            timestamp=ts,
            headers=[("client", b"ck")],
            on_delivery=lambda err, msg: (
                acks.append((msg.partition(), msg.offset())) if err is None else None
            ),
        )
    assert producer.flush(30) == 0
    assert len(acks) == N
    check_log(kafka, "ck", "ck")

    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "ck-reader", "enable.auto.commit": False}
    )
    consumer.assign([CTP("ck", p, 0) for p in range(PARTITIONS)])
    got: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < N and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        got[msg.partition()].append((msg.key(), msg.value(), msg.timestamp()[1], msg.headers()))
    consumer.close()
    want = expected("ck")
    for p in range(PARTITIONS):
        assert [(k, v, ts) for k, v, ts, _ in got[p]] == want[p]
        assert all(h == [("client", b"ck")] for *_, h in got[p])


def test_kafka_python_produce_and_consume(kafka) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    admin.create_topics([KNewTopic("kp", PARTITIONS, 1)])
    admin.close()
    producer = KafkaProducer(
        bootstrap_servers=kafka.bootstrap, linger_ms=5
    )  # idempotent by default
    futures = [
        producer.send("kp", key=k, value=v, timestamp_ms=ts, headers=[("client", b"kp")])
        for k, v, ts in records("kp")
    ]
    producer.flush(30)
    assert all(f.get(10).offset >= 0 for f in futures)
    producer.close()
    check_log(kafka, "kp", "kp")
    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    consumer.assign([TopicPartition("kp", p) for p in range(PARTITIONS)])
    got: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    for msg in consumer:
        got[msg.partition].append((msg.key, msg.value, msg.timestamp))
        if sum(map(len, got.values())) == N:
            break
    consumer.close()
    assert got == expected("kp")


def test_aiokafka_produce_and_consume(kafka) -> None:
    async def run() -> dict[int, list]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
        await producer.start()
        try:
            LogStore(kafka.data).create_topic("ak", PARTITIONS)
            for k, v, ts in records("ak"):
                await producer.send(
                    "ak", key=k, value=v, timestamp_ms=ts, headers=[("client", b"ak")]
                )
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        got: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        try:
            consumer.assign([TopicPartition("ak", p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + 30
            while sum(map(len, got.values())) < N and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for tp, msgs in batch.items():
                    got[tp.partition] += [(m.key, m.value, m.timestamp) for m in msgs]
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(run())
    check_log(kafka, "ak", "ak")
    assert got == expected("ak")


def test_eventlane_consume_reads_what_kafka_clients_wrote(kafka) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"})
    LogStore(kafka.data).create_topic("mixed", 2)
    for i in range(10):
        producer.produce(
            "mixed", key=f"k{i}", value=f"v{i}", timestamp=T0 + i, headers=[("h", b"x")]
        )
    assert producer.flush(10) == 0
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from eventlane.cli import main; main()",
            "--data",
            str(kafka.data),
            "consume",
            "mixed",
            "--max",
            "10",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [orjson.loads(line) for line in out.splitlines() if line.strip()]
    assert sorted((r["key"], r["value"]) for r in rows) == sorted(
        (f"k{i}", f"v{i}") for i in range(10)
    )
    assert {r["partition"] for r in rows} == {
        partition_for_key(f"k{i}".encode(), 2) for i in range(10)
    }
    assert all(r["timestamp"] >= T0 for r in rows)


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_unknown_topic_without_auto_create(tmp_path, client) -> None:
    from tests.kafka.conftest import KafkaProcess, free_port  # noqa: PLC0415

    server = KafkaProcess(tmp_path / "data", free_port(), "--no-auto-create-topics")
    server.start()
    try:
        if client == "confluent":
            producer = Producer(
                {
                    "bootstrap.servers": server.bootstrap,
                    "message.timeout.ms": 5000,
                    "topic.metadata.propagation.max.ms": 200,
                }
            )
            errors = []
            producer.produce("nope", value=b"x", on_delivery=lambda err, msg: errors.append(err))
            producer.flush(10)
            assert errors and errors[0] is not None
            assert "UNKNOWN_TOPIC" in errors[0].name(), errors[0]
        else:
            producer = KafkaProducer(bootstrap_servers=server.bootstrap, max_block_ms=2000)
            from kafka.errors import KafkaTimeoutError  # noqa: PLC0415

            with pytest.raises(KafkaTimeoutError):
                producer.send("nope", b"x").get(5)
            producer.close(0)
        assert not (tmp_path / "data" / "topics" / "nope").exists()
    finally:
        server.stop()
