"""A consumer group of real Kafka clients (two confluent-kafka, one kafka-python) in separate
processes: balanced assignment, commits, a SIGKILLed member's partitions reassigned within
the session timeout, every record consumed at least once, offsets and lag 0 in eventlane."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Producer

from eventlane.log import LogStore
from tests.kafka.members import POLL_INTERVAL_MS, SESSION_MS

MEMBERS = Path(__file__).with_name("members.py")
TOPIC, GROUP, PARTITIONS, N = "orders", "billing", 6, 3000


def assignment(out: Path) -> list[int]:
    try:
        text = Path(str(out) + ".assignment").read_text().strip()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()] if text else []


def wait(predicate, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def produce(bootstrap: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for i in range(start, start + count):
        producer.produce(TOPIC, key=f"order-{i}", value=f"v{i}")
    assert producer.flush(30) == 0


def test_a_mixed_group_shares_partitions_survives_a_kill_and_commits_into_eventlane(
    kafka, tmp_path
) -> None:
    log = LogStore(kafka.data)
    log.create_topic(TOPIC, PARTITIONS)
    produce(kafka.bootstrap, 0, N // 2)
    kinds = ["confluent", "confluent", "kafka-python"]
    outs = [tmp_path / f"member-{i}.txt" for i in range(3)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(MEMBERS), kind, kafka.bootstrap, TOPIC, GROUP, str(out)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        for kind, out in zip(kinds, outs, strict=True)
    ]
    try:
        wait(
            lambda: sorted(len(assignment(o)) for o in outs) == [2, 2, 2], 120, "a 2/2/2 assignment"
        )
        owned = [assignment(o) for o in outs]
        assert sorted(p for ps in owned for p in ps) == list(range(PARTITIONS))
        victim = 0
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait(10)
        produce(kafka.bootstrap, N // 2, N // 2)
        took = wait(
            lambda: sorted(assignment(outs[1]) + assignment(outs[2])) == list(range(PARTITIONS)),
            # the session timeout, and a rebalance timeout more if the member died with its
            # JoinGroup pending (see docs/kafka-protocol.md, "Known gaps"), + generous slack
            (SESSION_MS + POLL_INTERVAL_MS) / 1000 + 30,
            "the killed member's partitions to move",
        )
        print(f"reassigned {took:.1f} s after the kill")

        def consumed() -> set[tuple[int, int]]:
            seen = set()
            for out in outs:
                if out.exists():
                    seen |= {
                        tuple(map(int, line.split()))
                        for line in out.read_text().splitlines()
                        if line.strip()
                    }
            return seen

        want = {(p, o) for p in range(PARTITIONS) for o in range(log.offsets(TOPIC, p).hwm)}
        assert sum(log.offsets(TOPIC, p).hwm for p in range(PARTITIONS)) == N
        wait(lambda: want <= consumed(), 60, "every record consumed at least once")

        def lag_zero() -> bool:
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from eventlane.cli import main; main()",
                    "--data",
                    str(kafka.data),
                    "groups",
                    "describe",
                    GROUP,
                    "--json",
                ],
                capture_output=True,
                check=True,
                timeout=60,
            ).stdout
            doc = json.loads(out)
            rows = [r for r in doc["offsets"] if r["topic"] == TOPIC]
            return len(rows) == PARTITIONS and all(r["lag"] == 0 for r in rows)

        wait(lag_zero, 60, "committed offsets at the high-water marks (lag 0)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        log.close()
