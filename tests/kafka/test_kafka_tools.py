"""Apache Kafka's own tools (Kafka 4.4.0 from Maven Central, run by main class) as judges of
the listener: kafka-topics (create, list, describe), the console producer and consumer,
kafka-consumer-groups (describe, reset-offsets) and the producer and consumer perf tests.
The jars come from ``make kafka-jars`` (tools/kafka/jars.py)."""

from __future__ import annotations

import re
import subprocess

import pytest

from eventlane.consumer.offsets import OffsetStore
from eventlane.log import LogStore
from eventlane.log import TopicPartition as LogTP
from tools.kafka.jars import java

TOOLS = "org.apache.kafka.tools."


def run(main: str, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    done = subprocess.run(
        java(TOOLS + main, *args),
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{main} {args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def bootstrap(kafka) -> str:
    return str(kafka.bootstrap)


def test_kafka_topics_creates_lists_and_describes(bootstrap: str, kafka) -> None:
    b = ("--bootstrap-server", bootstrap)
    run(
        "TopicCommand",
        *b,
        "--create",
        "--topic",
        "judged",
        "--partitions",
        "2",
        "--replication-factor",
        "1",
        "--config",
        "retention.ms=60000",
    )
    assert "judged" in run("TopicCommand", *b, "--list").split()
    described = run("TopicCommand", *b, "--describe", "--topic", "judged")
    assert re.search(
        r"Topic: judged\s+TopicId: \S+\s+PartitionCount: 2\s+ReplicationFactor: 1", described
    ), described
    assert "retention.ms=60000" in described  # a set config; defaults are not listed
    assert "cleanup.policy" not in described
    assert len(re.findall(r"Partition: \d\s+Leader: 0\s+Replicas: 0\s+Isr: 0", described)) == 2
    log = LogStore(kafka.data)
    assert log.partition_count("judged") == 2
    assert log.topic_config("judged").retention_ms == 60000
    log.close()


def test_console_tools_and_consumer_groups_describe_and_reset(bootstrap: str, kafka) -> None:
    b = ("--bootstrap-server", bootstrap)
    run(
        "TopicCommand",
        *b,
        "--create",
        "--topic",
        "console",
        "--partitions",
        "1",
        "--replication-factor",
        "1",
    )
    lines = [f"line-{i}" for i in range(5)]
    run("ConsoleProducer", *b, "--topic", "console", stdin="\n".join(lines) + "\n")
    out = run(
        "consumer.ConsoleConsumer",
        *b,
        "--topic",
        "console",
        "--from-beginning",
        "--max-messages",
        "5",
        "--group",
        "judges",
    )
    assert out.split() == lines

    described = run("consumer.group.ConsumerGroupCommand", *b, "--describe", "--group", "judges")
    row = re.search(r"judges\s+console\s+0\s+(\d+)\s+(\d+)\s+(\d+)", described)
    assert row is not None, described
    assert row.groups() == ("5", "5", "0")  # current offset, log end, lag

    reset = run(
        "consumer.group.ConsumerGroupCommand",
        *b,
        "--reset-offsets",
        "--to-earliest",
        "--execute",
        "--group",
        "judges",
        "--topic",
        "console",
    )
    assert re.search(r"judges\s+console\s+0\s+0", reset), reset
    log = LogStore(kafka.data)
    assert OffsetStore(log).committed("judges", LogTP("console", 0)).offset == 0
    log.close()
    described = run("consumer.group.ConsumerGroupCommand", *b, "--describe", "--group", "judges")
    assert re.search(r"judges\s+console\s+0\s+0\s+5\s+5", described), described
    assert "judges" in run("consumer.group.ConsumerGroupCommand", *b, "--list").split()


def test_producer_and_consumer_perf_tests(bootstrap: str, kafka) -> None:
    n = 5000
    out = run(
        "ProducerPerformance",
        "--topic",
        "perf",
        "--num-records",
        str(n),
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--command-property",
        f"bootstrap.servers={bootstrap}",
        "acks=all",
    )
    assert f"{n} records sent" in out, out
    log = LogStore(kafka.data)
    assert sum(log.offsets("perf", p).hwm for p in range(log.partition_count("perf"))) == n
    log.close()
    out = run(
        "ConsumerPerformance",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        "perf",
        "--num-records",
        str(n),
        "--timeout",
        "60000",
    )
    header, values = out.strip().splitlines()[-2:]
    fields = dict(
        zip(
            [h.strip() for h in header.split(",")],
            [v.strip() for v in values.split(",")],
            strict=True,
        )
    )
    assert fields["data.consumed.in.nMsg"] == str(n), out
