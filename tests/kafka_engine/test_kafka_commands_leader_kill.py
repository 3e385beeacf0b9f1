"""kill -9 of the leader broker of an aggregate's partition while two processes execute
commands on it (issue 35): no acknowledged command lost, none applied twice, and commands
resume; the gap in acknowledgements around the kill is reported on stderr.

Each command's event names it (``writer:i``); the oracle judges the raw partition
(tests/kafka_engine/oracle.py) from the survivors."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.partitioner import partition_for_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from kafka_oracle import judged_partition
from store_domain import Counter as CounterAggregate
from store_domain import make_app

PROCS = Path(__file__).parent / "store_procs.py"
COUNT = 80


@pytest.mark.soak  # a broker's kill, the commands' resumption and its restart: minutes here
def test_leader_kill_during_commands(kafka_cluster: LocalKafkaCluster, namespace: str) -> None:
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        with make_app(log) as app:
            app.execute(CounterAggregate, "hot", lambda c: c.increment(1, "seed"), create=True)
        partition = partition_for_key(b"hot", log.partition_count("counters"))
    topic = f"{namespace}.counters"
    meta = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap}).list_topics(
        topic, timeout=30
    )
    victim = int(meta.topics[topic].partitions[partition].leader)
    body = {"bootstrap": kafka_cluster.bootstrap, "namespace": namespace, "aggregate": "hot"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(PROCS),
                "execute",
                json.dumps({**body, "count": COUNT, "writer": w}),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in ("p1", "p2")
    ]
    lines: list[str] = []
    killed = 0.0
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "R"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        assert procs[0].stdout is not None
        for _ in range(15):
            lines.append(procs[0].stdout.readline())
        kafka_cluster.kill(victim)
        killed = time.time()
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            lines += out.splitlines()
            assert proc.returncode == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        try:
            judged = judged_partition(kafka_cluster.bootstrap, topic, partition)
        finally:
            if not kafka_cluster.node(victim).pid:
                kafka_cluster.start_node(victim)
    acked = {f[2]: (int(f[1]), float(f[3])) for f in (x.split() for x in lines) if f[:1] == ["A"]}
    unknown = {f"{f[0]}" for f in (x.split() for x in lines) if f[:1] == ["U"]}
    stream = [orjson.loads(r.value or b"") for r in judged if r.key == b"hot" and r.visible]
    assert [d["aggregate_version"] for d in stream] == list(range(1, len(stream) + 1))
    names = Counter(d["data"]["writer"] for d in stream)
    twice = [n for n, c in names.items() if c > 1]
    assert not twice, f"commands applied twice: {twice[:10]}"
    where = {d["data"]["writer"]: d["aggregate_version"] for d in stream}
    lost = [n for n in acked if where.get(n) != acked[n][0]]
    assert not lost, f"acknowledged commands lost or moved: {lost[:10]}"
    assert len(acked) + len(unknown) == 2 * COUNT
    times = sorted(t for _, t in acked.values())
    assert times[-1] > killed, "no command acknowledged after the kill"
    stall = max(b - a for a, b in itertools.pairwise(times) if b > killed)
    # librdkafka's default metadata refresh (5 min) once stalled the key index's reads
    # for 296 s here; with the log's 3 s refresh commands resumed after about 11 s
    assert stall < 60, f"commands stalled {stall:.0f}s after the leader's kill"
    sys.stderr.write(
        f"\nleader kill during commands: victim node {victim}, {len(acked)} acked,"
        f" {len(unknown)} unknown, longest pause between acks after the kill {stall:.1f}s\n"
    )
