"""The event store on Kafka (issue 35): optimistic concurrency across OS processes on a
real 3-broker cluster, validated by log order (eventlane.log.kafka.order).

The oracle reads the raw partition with confluent-kafka and applies the rule itself
(tests/kafka_engine/oracle.py): every eventlane reader (loads, the log's reads, the group
consumer) must see exactly the records it judges visible, and they must form one chain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from eventlane.consumer import GroupConsumer
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.partitioner import partition_for_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from kafka_oracle import judged_partition
from store_domain import Counter, make_app, raw_streams

PROCS = Path(__file__).parent / "store_procs.py"
INITIAL = 3
PER_PROCESS = 15  # the default suite; the soak run does the 2 x 500


@pytest.fixture
def kafka(kafka_cluster: LocalKafkaCluster, namespace: str) -> Iterator[KafkaLog]:
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        with make_app(log) as app:  # creates the topics
            counter = Counter("hot")
            for _ in range(INITIAL):
                counter.increment(1, "seed")
            app.save(counter)
        yield log


def _spawn(role: str, log: KafkaLog, **args: object) -> subprocess.Popen[str]:
    body = {"bootstrap": log.bootstrap, "namespace": log.namespace, **args}
    return subprocess.Popen(
        [sys.executable, str(PROCS), role, json.dumps(body)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _send(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


def _oracle_versions(log: KafkaLog, aggregate: str) -> tuple[list[int], int]:
    """The aggregate's versions as the oracle sees them, and how many records it rejected."""
    partition = partition_for_key(aggregate.encode(), log.partition_count("counters"))
    judged = judged_partition(log.bootstrap, f"{log.namespace}.counters", partition)
    mine = [r for r in judged if r.key == aggregate.encode()]
    versions = [orjson.loads(r.value or b"")["aggregate_version"] for r in mine if r.visible]
    return versions, sum(not r.visible for r in mine)


def _every_reader(log: KafkaLog, aggregate: str, expected: int) -> None:
    """Loads, the log's reads and a group consumer see versions 1..expected, once each,
    exactly the records the oracle judges visible."""
    oracle, _ = _oracle_versions(log, aggregate)
    assert oracle == list(range(1, expected + 1))
    stream = raw_streams(log, "counters")[aggregate]
    assert [doc["aggregate_version"] for doc in stream] == oracle
    with make_app(log) as app:
        assert app.load(Counter, aggregate).version == expected
    consumer = GroupConsumer(
        log, group_id="check", topics=["counters"], auto_offset_reset="earliest"
    )
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(seen) < expected and time.monotonic() < deadline:
            for record in consumer.poll(1.0):
                if record.key == aggregate.encode():
                    seen.append(orjson.loads(record.value or b"")["aggregate_version"])
    finally:
        consumer.close()
    assert seen == oracle


@pytest.mark.parametrize(
    "per_process", [PER_PROCESS, pytest.param(500, marks=pytest.mark.soak)], ids=["15", "500"]
)
def test_two_processes_execute_with_retry_exactly_once(kafka: KafkaLog, per_process: int) -> None:
    procs = [
        _spawn("execute", kafka, aggregate="hot", count=per_process, writer=w) for w in ("p1", "p2")
    ]
    try:
        for proc in procs:
            assert _line(proc) == "R"
        for proc in procs:
            _send(proc, "go")
        outputs = [proc.communicate(timeout=60 + per_process)[0].split("\n") for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    done = [next(line.split() for line in out if line.startswith("D")) for out in outputs]
    acked = sorted(int(line.split()[1]) for out in outputs for line in out if line[:1] == "A")
    total = INITIAL + 2 * per_process
    assert acked == list(range(INITIAL + 1, total + 1))  # each command once, every version
    _every_reader(kafka, "hot", total)
    (_, a1, s1, e1), (_, a2, s2, e2) = done
    assert float(s1) < float(e2) and float(s2) < float(e1)  # they really raced
    assert int(a1) + int(a2) > 2 * per_process  # and conflicts were retried


def test_without_retry_the_loser_gets_concurrency_error(kafka: KafkaLog) -> None:
    batches = {"a": 3, "b": 2}
    procs = {
        w: _spawn("race", kafka, aggregate="hot", batch=n, writer=w) for w, n in batches.items()
    }
    version, wins = INITIAL, {"a": 0, "b": 0}
    try:
        for _ in range(5):
            loads = {w: _line(p) for w, p in procs.items()}
            assert set(loads.values()) == {f"L {version}"}, loads
            for proc in procs.values():
                _send(proc, "GO")
            outcome = {w: _line(p).split() for w, p in procs.items()}
            (winner,) = [w for w, line in outcome.items() if line[0] == "W"]
            (loser,) = set(procs) - {winner}
            assert outcome[loser][0] == "C", outcome
            version += batches[winner]
            wins[winner] += 1
        for proc in procs.values():
            assert _line(proc) == f"L {version}"
            _send(proc, "Q")
    finally:
        for proc in procs.values():
            proc.communicate(timeout=60)
    _every_reader(kafka, "hot", version)
    writers = [doc["data"]["writer"] for doc in raw_streams(kafka, "counters")["hot"]]
    assert writers.count("a") == 3 * wins["a"] and writers.count("b") == 2 * wins["b"]


def test_a_writer_stopped_and_resumed_never_forks_a_stream(kafka: KafkaLog) -> None:
    """SIGSTOP one of two racing writers at seeded moments (often between its check and
    its write), let the other run on, SIGCONT it: what it then writes expecting a stale
    head is rejected by the rule, as the oracle judges the raw partition; no acknowledged
    command is lost or applied twice."""
    count = 20
    procs = {w: _spawn("execute", kafka, aggregate="hot", count=count, writer=w) for w in "ab"}
    stopped = procs["a"]
    try:
        for proc in procs.values():
            assert _line(proc) == "R"
        for proc in procs.values():
            _send(proc, "go")
        for pause in (0.05, 0.13, 0.21, 0.08, 0.17):
            time.sleep(pause)
            os.kill(stopped.pid, signal.SIGSTOP)
            time.sleep(0.6)  # the other writer moves the stream on meanwhile
            os.kill(stopped.pid, signal.SIGCONT)
        outputs = {w: p.communicate(timeout=180)[0].split("\n") for w, p in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
    acked = sorted(
        int(line.split()[1]) for out in outputs.values() for line in out if line[:1] == "A"
    )
    total = INITIAL + 2 * count
    assert acked == list(range(INITIAL + 1, total + 1))
    _every_reader(kafka, "hot", total)
