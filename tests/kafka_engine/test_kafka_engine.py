"""KafkaLog as an engine: opened by URL (``open_log``, ``--log``/``EVENTLANE_LOG``) and placing
keys exactly where Kafka's own producer and the embedded log do."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer as RawProducer

from eventlane.engine import log_locator, open_log
from eventlane.errors import InvalidRecordError
from eventlane.log import LogStore, Producer, ProducerRecord
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import META_REFRESH_S, KafkaLog
from eventlane.testing.contracts import read_all

KEYS = 3_000
PARTITIONS = 7


def _keys() -> list[bytes]:
    rng = random.Random(33)
    keys = {b"", b"\x00", b"alice", b"bob"}
    while len(keys) < KEYS:
        keys.add(rng.randbytes(rng.randrange(1, 40)))
    return sorted(keys)


def _placed(log: KafkaLog, topic: str) -> dict[bytes, int]:
    return {
        r.key: p
        for p in range(log.partition_count(topic))
        for r in read_all(log, topic, p)
        if r.key is not None
    }


def test_placement_of_3000_keys_equals_the_embedded_logs_and_kafkas_own(
    kafka_cluster: LocalKafkaCluster, namespace: str, tmp_path: Path
) -> None:
    """Where 3,000 keys land: eventlane's producer on KafkaLog (read back from the brokers)
    == eventlane's producer on the embedded log == librdkafka's Java-compatible murmur2
    partitioner producing to Kafka directly (the placement any Kafka client gives)."""
    keys = _keys()
    records = [ProducerRecord(k, k) for k in keys]
    with LogStore(tmp_path / "embedded") as embedded:
        embedded.create_topic("placed", PARTITIONS)
        local = [m.partition for m in Producer(embedded).send_batch("placed", records)]
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("placed", PARTITIONS)
        log.create_topic("raw", PARTITIONS)
        metas = Producer(log).send_batch("placed", records)
        raw = RawProducer(
            {"bootstrap.servers": kafka_cluster.bootstrap, "partitioner": "murmur2_random"}
        )
        for k in keys:
            raw.produce(f"{namespace}.raw", k, k)
        assert raw.flush(60) == 0
        on_kafka, by_kafka = _placed(log, "placed"), _placed(log, "raw")
    assert len(on_kafka) == len(by_kafka) == len(keys)
    assert [m.partition for m in metas] == local
    assert dict(zip(keys, local, strict=True)) == on_kafka == by_kafka
    assert len(set(local)) == PARTITIONS


def test_opened_by_url_and_by_the_cli(kafka_cluster: LocalKafkaCluster, namespace: str) -> None:
    """``open_log("kafka://...?namespace=ns")`` is a KafkaLog whose ``url`` opens it again
    (Spark executors, worker processes); the CLI reaches it through ``EVENTLANE_LOG``."""
    url = f"{kafka_cluster.url}?namespace={namespace}"
    log = open_log(url)
    try:
        assert isinstance(log, KafkaLog) and log_locator(log) == url
        log.create_topic("orders", 3, {"retention_ms": -1})
    finally:
        log.close()
    env = {**os.environ, "EVENTLANE_LOG": url}
    out = subprocess.run(
        [sys.executable, "-m", "eventlane.cli", "topics", "describe", "orders", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    described = orjson.loads(out.stdout)
    assert described["name"] == "orders" and len(described["partitions"]) == 3
    assert described["config"]["retention_ms"] == -1


def _in_another_process(bootstrap: str, namespace: str, action: str) -> None:
    code = (
        "import sys\n"
        "from eventlane.log.kafka.log import KafkaLog\n"
        f"with KafkaLog({bootstrap!r}, namespace={namespace!r}) as log:\n"
        f"    {action}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_waiters_wake_on_another_processs_append_and_wake(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    """A waiting reader (``wait``, as ``consume --follow`` and group members tail) wakes
    when another process appends or calls ``wake()``, long before its timeout."""
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("tail", 2)
        for action in (
            "log.append('tail', 1, [(b'k', b'v', (), None)])",
            "log.wake()",
        ):
            seen = log.wait_seq()
            log.wait(seen, 0.5)  # the tailing consumer is following before the other acts
            seen = log.wait_seq()
            _in_another_process(kafka_cluster.bootstrap, namespace, action)
            started = time.monotonic()
            log.wait(seen, 30.0)
            assert time.monotonic() - started < 10.0, f"not woken by another process: {action}"
            assert log.wait_seq() != seen
        assert log.list_topics() == ["tail"]  # the wake topic is not one of the log's


def test_another_clients_topic_change_is_seen_within_the_refresh_age(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    """A log reads a topic's cached metadata again in the background once it is
    ``META_REFRESH_S`` old (its appends never wait for the admin's round trips), so a change
    another client makes (compaction turned on) reaches its appends within that age plus
    the round trips: a keyless record is then refused, and nothing of it written."""
    url = f"{kafka_cluster.url}?namespace={namespace}"
    with KafkaLog.from_url(url) as a, KafkaLog.from_url(url) as b:
        a.create_topic("m", 1)
        keyless = [(None, b"v", (), None)]
        a.append("m", 0, keyless)
        b.alter_topic("m", config={"cleanup_policy": "compact"})
        changed = time.monotonic()
        while True:
            try:
                a.append("m", 0, keyless)
            except InvalidRecordError:
                break
            assert time.monotonic() - changed < META_REFRESH_S + 30, "the change was not seen"
            time.sleep(0.2)
        before = a.offsets("m", 0).hwm
        with pytest.raises(InvalidRecordError):
            a.append("m", 0, keyless)
        assert a.offsets("m", 0).hwm == before
