"""Projector workers on Kafka as real processes: exactly-once effect under kill -9 and a
SIGSTOPped zombie (issue 33, item 3; the embedded engine's tests/projection/
test_projection_group.py on Kafka's group coordinator).

The workers are the real :class:`~eventlane.projection.Worker` (tests/kafka_engine/
kafka_worker.py) of the ``balances`` projector of tests/projection/bankapp.py, whose marker
table has one row per applied event keyed by ``(topic, partition, offset)``: applying an
event twice raises inside the handler (a dead letter), so a duplicate cannot hide; the
markers must equal the log's coordinates, so a gap cannot hide either. The oracle folds the
raw JSON records read straight from Kafka.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from eventlane.codec import Envelope
from eventlane.consumer.kafka_admin import KafkaCoordination
from eventlane.log import TopicPartition
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.local import LocalDir
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import ReadModelView
from eventlane.store import EVENT_TOPIC_CONFIG
from tests.projection import bankapp

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("kafka_worker.py")
SESSION_MS = 6000
APP = bankapp.app
TOPIC = APP.names.topic("accounts")
GROUP = APP.names.group("balances")


@pytest.fixture
def kafka(kafka_cluster: LocalKafkaCluster, namespace: str) -> Iterator[KafkaLog]:
    with KafkaLog.from_url(f"{kafka_cluster.url}?namespace={namespace}") as log:
        log.create_topic(TOPIC, 6, EVENT_TOPIC_CONFIG)
        yield log


class Deposits:
    """Appends encoded ``Deposited``/``Withdrawn`` events to the accounts topic."""

    def __init__(self, log: KafkaLog) -> None:
        self.log = log
        self.codec = APP.codec(keys=None)
        self.versions: dict[str, int] = {}
        self.count = 0

    def add(self, n: int, accounts: int = 60) -> None:
        batches: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]] = {}
        for _ in range(n):
            i = self.count
            self.count += 1
            aid = f"acc-{i % accounts}"
            self.versions[aid] = self.versions.get(aid, 0) + 1
            event = bankapp.Withdrawn(i % 7) if i % 5 == 4 else bankapp.Deposited(i % 100 + 1)
            key, value, headers = self.codec.encode(Envelope(event, aid, self.versions[aid]))
            batches.setdefault(partition_for_key(key, 6), []).append(
                (key, value, tuple(headers), None)
            )
        for p, records in batches.items():
            self.log.append(TOPIC, p, records)  # type: ignore[arg-type]


class Workers:
    def __init__(self, url: str, data: Path, logs: Path) -> None:
        self.url, self.data, self.logs = url, data, logs
        self.procs: list[subprocess.Popen[bytes]] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        path = self.logs / f"worker-{len(self.procs)}.log"
        cmd = [sys.executable, str(WORKER), self.url, str(self.data), "balances"]
        with path.open("ab") as sink:
            proc = subprocess.Popen(
                [*cmd, str(SESSION_MS), *extra],
                stdout=sink,
                stderr=sink,
                cwd=str(ROOT),
            )
        proc.log_path = path  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.logs.glob("*.log"))
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(kafka: KafkaLog, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(kafka.url, tmp_path / "data", tmp_path / "logs")
    yield w
    w.stop_all()
    sys.stderr.write(w.output()[-12000:])  # captured: shown when the test failed


def _readmodel(data: Path) -> Path:
    return LocalDir.at(data).readmodel(APP.names.local("balances"))


def _owners(kafka: KafkaLog) -> dict[str, list[int]]:
    state = KafkaCoordination(kafka).describe(GROUP)
    return {mid: sorted(tp.partition for tp in m.owned) for mid, m in state.members.items()}


def _wait(condition: object, timeout: float, what: str, workers: Workers) -> float:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        for proc in workers.procs:
            assert proc.poll() in (None, 0, -9), f"a worker died: {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic()


def _caught_up(kafka: KafkaLog, data: Path) -> bool:
    path = _readmodel(data)
    if not path.exists():
        return False
    with ReadModelView(path) as view:
        positions = view.positions()
    return all(
        positions.get(TopicPartition(TOPIC, p), -1) >= kafka.offsets(TOPIC, p).hwm for p in range(6)
    )


class MonotonicPositions(threading.Thread):
    """Samples the read model's positions; any step backwards is recorded."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.stop = path, threading.Event()
        self.backwards: list[tuple[TopicPartition, int, int]] = []
        self.samples = 0

    def run(self) -> None:
        last: dict[TopicPartition, int] = {}
        while not self.path.exists() and not self.stop.wait(0.05):
            pass
        with ReadModelView(self.path) as view:
            while not self.stop.wait(0.02):
                for tp, pos in view.positions().items():
                    if pos < last.get(tp, -1):
                        self.backwards.append((tp, last[tp], pos))
                    last[tp] = max(pos, last.get(tp, -1))
                self.samples += 1


def _fold(kafka: KafkaLog) -> tuple[set[tuple[str, int, int]], dict[str, tuple[int, int]]]:
    """Every event's coordinates and each account's (total, events), from the raw JSON."""
    events: set[tuple[str, int, int]] = set()
    balances: dict[str, tuple[int, int]] = {}
    for p in range(6):
        offset, hwm = kafka.offsets(TOPIC, p).lwm, kafka.offsets(TOPIC, p).hwm
        while offset < hwm:
            records, _ = kafka.read(TOPIC, p, offset)
            for r in records:
                events.add((TOPIC, p, r.offset))
                doc = orjson.loads(r.value or b"{}")
                amount = doc["data"]["amount"] * (-1 if doc["type"] == "Withdrawn" else 1)
                total, count = balances.get(doc["aggregate_id"], (0, 0))
                balances[doc["aggregate_id"]] = (total + amount, count + 1)
            offset = records[-1].offset + 1
    return events, balances


def test_projector_workers_exactly_once_under_kill9_and_a_fenced_zombie(
    kafka: KafkaLog, workers: Workers, tmp_path: Path
) -> None:
    """3 projector workers share the 6 partitions (2/2/2) on Kafka's coordinator while
    events flow; one is killed -9; a zombie freezes itself between poll and apply, is evicted
    after its session, and on SIGCONT its batch is refused by the read model (a newer
    generation claimed its partitions); every event is applied exactly once, positions never
    go backwards, and the balances equal a fold of the raw log."""
    deposits = Deposits(kafka)
    deposits.add(1200)
    sampler = MonotonicPositions(_readmodel(workers.data))
    sampler.start()
    first = [workers.start() for _ in range(3)]
    _wait(
        lambda: sorted(len(v) for v in _owners(kafka).values()) == [2, 2, 2],
        90,
        "3 workers at 2/2/2",
        workers,
    )
    feeding = threading.Event()

    def feed() -> None:
        while not feeding.wait(0.1):
            deposits.add(60)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        time.sleep(1.0)
        first[0].kill()  # kill -9: its partitions move after its session timeout
        first[0].wait()
        flag = tmp_path / "zombie.json"
        zombie = workers.start("--self-stop", str(flag))
        _wait(lambda: flag.exists() and flag.read_text(), 90, "the zombie froze", workers)
        stopped_at = time.monotonic()
        in_hand = json.loads(flag.read_text())
        _wait(lambda: len(_owners(kafka)) == 2, SESSION_MS / 1000 + 60, "zombie evicted", workers)
        assert time.monotonic() - stopped_at > SESSION_MS / 1000 - 1.0
        time.sleep(1.0)
    finally:
        feeding.set()
        feeder.join()
    _wait(lambda: _caught_up(kafka, workers.data), 120, "the others caught up", workers)
    zombie.send_signal(signal.SIGCONT)
    log_path: Path = zombie.log_path  # type: ignore[attr-defined]
    _wait(lambda: "ZOMBIE-RESULT" in log_path.read_text(), 60, "the zombie's result", workers)
    text = log_path.read_text()
    assert "ZOMBIE-RESULT refused" in text, text[-3000:]
    assert "batch refused: partition owned by a newer generation" in text
    assert in_hand["spans"]
    deposits.add(600)  # the zombie rejoins as a new member and shares the work
    _wait(lambda: _caught_up(kafka, workers.data), 120, "caught up again", workers)
    for proc in (*first[1:], zombie):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    sampler.stop.set()
    sampler.join()
    assert sampler.samples > 10 and sampler.backwards == []
    events, balances = _fold(kafka)
    with sqlite3.connect(_readmodel(workers.data)) as db:
        markers = [tuple(r) for r in db.execute("SELECT topic, partition, offset FROM applied")]
        rows = {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, total, events FROM balances")}
        dead = db.execute("SELECT COUNT(*) FROM _eventlane_dead_letters").fetchone()[0]
    assert len(markers) == len(set(markers))
    assert set(markers) == events  # every event applied once: no gap, no duplicate
    assert rows == balances
    assert dead == 0
