"""kill -9 of a partition's leader broker while two producer processes append through
KafkaLog: no acknowledged record is lost or stored twice (oracle: the producers' own acks,
read back from the surviving brokers and again after the killed one rejoins)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import ElectionType
from confluent_kafka import TopicPartition as Kp
from confluent_kafka.admin import AdminClient

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.testing.contracts import read_all

HERE = Path(__file__).parent
RECORDS, SECONDS = 600, 60.0


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return int(meta.topics[topic].partitions[partition].leader)


def _rejoin_and_lead(bootstrap: str, topic: str, victim: int) -> None:
    """Wait (bounded) until ``victim`` is in partition 0's in-sync replicas again, then make
    it leader (a preferred-leader election: it led partition 0 when the topic was new)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 120
    while victim not in admin.list_topics(topic, timeout=30).topics[topic].partitions[0].isrs:
        assert time.monotonic() < deadline, f"node {victim} did not rejoin partition 0's ISR"
        time.sleep(0.5)
    futures = admin.elect_leaders(ElectionType.PREFERRED, [Kp(topic, 0)])
    futures.result()
    while _leader(bootstrap, topic, 0) != victim:
        assert time.monotonic() < deadline, f"node {victim} did not become leader again"
        time.sleep(0.5)


def _outcomes(lines: list[str]) -> tuple[dict[str, tuple[int, int]], set[str]]:
    acked: dict[str, tuple[int, int]] = {}
    unknown: set[str] = set()
    for line in lines:
        kind, rid, *where = line.split()
        if kind == "ack":
            acked[rid] = (int(where[0]), int(where[1]))
        elif kind == "unknown":
            unknown.add(rid)
    return acked, unknown


@pytest.mark.soak  # about 2 minutes here: producers for 60 s, the broker's restart and rejoin
def test_kill_9_of_a_leader_loses_and_duplicates_no_acknowledged_record(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("acked", 3, {"retention_ms": -1})
    victim = _leader(kafka_cluster.bootstrap, f"{namespace}.acked", 0)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "acked_producer.py"),
                kafka_cluster.bootstrap,
                namespace,
                "acked",
                name,
                str(RECORDS),
                str(SECONDS),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    lines: list[str] = []
    try:
        assert procs[0].stdout is not None
        for _ in range(30):  # both producers are appending before the kill
            lines.append(procs[0].stdout.readline())
        kafka_cluster.kill(victim)  # SIGKILL, by PID
        killed_at = len(lines)
        for proc in procs:
            out, _ = proc.communicate(timeout=SECONDS + 60)
            lines += out.splitlines()
            assert proc.returncode == 0
    except BaseException:
        if not kafka_cluster.node(victim).pid:
            kafka_cluster.start_node(victim)  # the session's other tests need all three
        raise
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    acked, unknown = _outcomes([line for line in lines if line.strip()])
    assert killed_at == 30 and len(acked) > 100, f"too few acks to judge: {len(acked)}"

    def check(log: KafkaLog) -> None:
        stored = [
            (r.value.decode(), r.partition, r.offset)
            for p in range(3)
            for r in read_all(log, "acked", p)
            if r.value is not None
        ]
        twice = [rid for rid, n in Counter(rid for rid, _, _ in stored).items() if n > 1]
        assert not twice, f"records stored twice: {twice[:10]}"
        where = {rid: (p, o) for rid, p, o in stored}
        lost = [rid for rid in acked if rid not in where]
        assert not lost, f"acknowledged records lost: {lost[:10]}"
        moved = [rid for rid, at in acked.items() if where[rid] != at]
        assert not moved, f"records not at their acknowledged offsets: {moved[:10]}"
        invented = set(where) - set(acked) - unknown
        assert not invented, f"records stored that no producer sent: {sorted(invented)[:10]}"

    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        try:
            check(log)  # from the two survivors
        finally:
            if not kafka_cluster.node(victim).pid:
                kafka_cluster.start_node(victim)
        _rejoin_and_lead(kafka_cluster.bootstrap, f"{namespace}.acked", victim)
        check(log)  # partition 0 read from the killed node's own copy, leading again
    sys.stderr.write(
        f"\nleader kill: {len(acked)} acked, {len(unknown)} unknown, victim node {victim}\n"
    )
