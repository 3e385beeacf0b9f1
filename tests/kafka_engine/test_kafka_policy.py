"""A policy on Kafka issues exactly one command per event, whatever kill -9 does to its
workers (issue 35, item 3): idempotency by causation, as on the other engines (the issued
command carries the triggering event's id; ``issue`` skips a cause already in the target
stream and appends conditionally, validated by log order).

The ``invoicing`` policy of tests/projection/bankapp.py runs in real worker processes on
the whole application over Kafka (tests/kafka_engine/kafka_worker.py ``--app``); the first
one kills itself (SIGKILL) right after issuing its 3rd invoice, before its read-model
transaction commits; others are killed -9 at seeded moments. Counted on the raw
``invoices`` partitions by the oracle (the rule applied independently), and by the log's
reads: exactly one ``InvoiceIssued`` per order, caused by that order's event."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from eventlane.codec import Envelope
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.local import LocalDir
from eventlane.log.partitioner import partition_for_key
from eventlane.testing.contracts import read_all
from tests.projection import bankapp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_oracle import judged_partition

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("kafka_worker.py")
ORDERS = 30


@pytest.fixture
def kafka(kafka_cluster: LocalKafkaCluster, namespace: str, tmp_path: Path) -> Iterator[KafkaLog]:
    url = f"{kafka_cluster.url}?namespace={namespace}"
    with KafkaLog.from_url(url, local=LocalDir.at(tmp_path / "data")) as log:
        with bankapp.app.open(log):  # creates the topics
            pass
        yield log


def _place(log: KafkaLog, first: int, count: int) -> dict[str, str]:
    codec = bankapp.app.codec(keys=None)
    batches: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]] = {}
    ids: dict[str, str] = {}
    for i in range(first, first + count):
        env = Envelope(bankapp.OrderPlaced(10 + i), f"order-{i}", 1)
        ids[f"order-{i}"] = str(env.event_id)
        key, value, headers = codec.encode(env)
        batches.setdefault(partition_for_key(key, 4), []).append((key, value, tuple(headers), None))
    for p, records in batches.items():
        log.append("orders", p, records)  # type: ignore[arg-type]
    return ids


def _invoices(log: KafkaLog) -> tuple[Counter[str], dict[str, str], Counter[str]]:
    """Per invoice: InvoiceIssued records as the log's reads see them, their causes, and
    as the oracle judges the raw partitions."""
    seen: Counter[str] = Counter()
    causes: dict[str, str] = {}
    oracle: Counter[str] = Counter()
    for p in range(4):
        for r in read_all(log, "invoices", p):
            doc = orjson.loads(r.value or b"")
            seen[doc["aggregate_id"]] += 1
            causes[doc["aggregate_id"]] = doc["causation_id"]
        for raw in judged_partition(log.bootstrap, f"{log.namespace}.invoices", p):
            if raw.visible:
                oracle[orjson.loads(raw.value or b"")["aggregate_id"]] += 1
    return seen, causes, oracle


def _start(log: KafkaLog, data: Path, logs: Path, **env: str) -> subprocess.Popen[bytes]:
    logs.mkdir(exist_ok=True)
    sink = (logs / f"worker-{time.monotonic_ns()}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, str(WORKER), log.url, str(data), "invoicing", "6000", "--app"],
        stdout=sink,
        stderr=sink,
        cwd=str(ROOT),
        env={**os.environ, **env},
    )


@pytest.mark.soak  # ~160 s here: worker starts, group joins and kill -9 rounds
def test_one_invoice_per_order_under_kill_9(kafka: KafkaLog, tmp_path: Path) -> None:
    rng = random.Random(35)
    data, logs = tmp_path / "data", tmp_path / "logs"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ids = _place(kafka, 0, ORDERS // 2)
        crasher = _start(kafka, data, logs, BANKAPP_CRASH_AFTER_ISSUE="3")
        procs.append(crasher)
        assert crasher.wait(120) == -signal.SIGKILL
        assert sum(_invoices(kafka)[0].values()) >= 3
        for _ in range(2):
            proc = _start(kafka, data, logs)
            procs.append(proc)
            time.sleep(rng.uniform(4.0, 8.0))  # joined and working, or about to
            proc.kill()
            proc.wait()
        ids |= _place(kafka, ORDERS // 2, ORDERS - ORDERS // 2)
        last = _start(kafka, data, logs)
        procs.append(last)
        deadline = time.monotonic() + 240
        while len(_invoices(kafka)[0]) < ORDERS:
            assert last.poll() is None, "the last worker died"
            assert time.monotonic() < deadline, "the policy did not catch up"
            time.sleep(1.0)
        time.sleep(2.0)  # anything issued twice would land now
        last.send_signal(signal.SIGTERM)
        assert last.wait(60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for path in sorted(logs.glob("*.log")):
            sys.stderr.write(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
    seen, causes, oracle = _invoices(kafka)
    assert len(seen) == ORDERS
    assert set(seen.values()) == {1}, {k: v for k, v in seen.items() if v != 1}
    assert oracle == seen
    for order, event_id in ids.items():
        assert causes[f"invoice-{order}"] == event_id
