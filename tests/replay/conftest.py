"""Fixtures of the replay tests: generated histories, live runs, one SparkSession.

The SparkSession is started once for the whole test run (``local[2,4]``: two cores, four
attempts per task so injected failures are retried; UI off; a deliberately small driver
of 512 MiB) and stopped at the end. Starting one costs 10-15 s on the test machine.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

from eventlane.app import Runtime  # noqa: E402
from eventlane.log import LogStore, TopicPartition  # noqa: E402
from eventlane.projection import ReadModelView, Worker, readmodel_path  # noqa: E402
from eventlane.replay.session import spark_session  # noqa: E402
from tests.replay import replay_app  # noqa: E402

APP = "tests.replay.replay_app:app"
SPARK_MASTER = "local[2,4]"
DRIVER_MEMORY = "512m"


@dataclass
class GeneratedLog:
    data: Path
    facts: dict[str, Any]


def make_history(data: Path, orders: int = 1500) -> GeneratedLog:
    log = LogStore(data)
    try:
        facts = replay_app.generate(log, orders=orders)
    finally:
        log.close()
    return GeneratedLog(data, facts)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> GeneratedLog:
    """One generated history per module (read-only for the tests using it)."""
    return make_history(tmp_path_factory.mktemp("history") / "data")


def run_live(runtime: Runtime, name: str, timeout: float = 60.0) -> dict[TopicPartition, int]:
    """Run a real worker of ``name`` in this process until it stands at the current high-water
    marks; return its positions."""
    worker = Worker(runtime, name, session_timeout_ms=3000, poll_timeout=0.1)
    ends = {
        TopicPartition(t, p): runtime.log.offsets(t, p).hwm
        for t in worker.projector.topics
        for p in range(runtime.log.partition_count(t))
    }
    deadline = time.monotonic() + timeout

    def done() -> bool:
        if time.monotonic() > deadline:
            raise AssertionError(f"live worker of {name} did not catch up in {timeout}s")
        pos = worker.readmodel.positions()
        return all(_at_end(runtime, tp, pos.get(tp), end) for tp, end in ends.items())

    worker.run(until=done)
    with ReadModelView(readmodel_path(runtime.log.path, name)) as view:
        return view.positions()


def _at_end(runtime: Runtime, tp: TopicPartition, pos: int | None, end: int) -> bool:
    if pos is None:
        pos = runtime.log.offsets(tp.topic, tp.partition).lwm
    if pos >= end:
        return True
    records, _ = runtime.log.read(tp.topic, tp.partition, pos, max_bytes=1, upto=end)
    return not records  # only compacted-away offsets left


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        return [tuple(r) for r in conn.execute(sql)]
    finally:
        conn.close()


# ---------------------------------------------------------------------------- processes
def child_env(**extra: str) -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("EVENTLANE_LOG_LEVEL", "info")
    env.update(extra)
    return env


@dataclass
class Procs:
    """Worker and producer processes of a test, stderr in files; all killed at the end."""

    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as sink:
            proc = subprocess.Popen(cmd, env=child_env(), stdout=sink, stderr=sink, cwd=ROOT)
        self.procs.append(proc)
        return proc

    def worker(self, data: Path, name: str, n: int) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "eventlane.cli",
            "--data",
            str(data),
            "project",
            "worker",
            APP,
            name,
            "--session-timeout-ms",
            "3000",
            "--max-poll-records",
            "200",
        ]
        return self.start(cmd, f"worker-{n}")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.logs.glob("*.log"))
        )


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path / "logs")
    yield p
    p.stop_all()


# ---------------------------------------------------------------------------- spark
@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test run (see the module docstring)."""
    session = spark_session(
        SPARK_MASTER,
        {
            "spark.driver.memory": DRIVER_MEMORY,
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
        },
        app_name="eventlane-tests",
    )
    yield session
    session.stop()


# ---------------------------------------------------------------------------- the fold
HANDLED = {"OrderPlaced", "OrderShipped", "CustomerRenamed", "PaymentReceived"}


def expected_markers(data: Path) -> set[tuple[str, int, int]]:
    """Coordinates of every event ``sales`` must apply, straight from the raw JSON values
    of the log (independent of the framework's codec and handlers): handled types, minus
    poison payments, from each partition's low-water mark to its high-water mark."""
    out: set[tuple[str, int, int]] = set()
    log = LogStore(data)
    try:
        for topic in ("orders", "payments", "customers"):
            for p in range(log.partition_count(topic)):
                marks = log.offsets(topic, p)
                offset = marks.lwm
                while offset < marks.hwm:
                    records, _ = log.read(topic, p, offset, upto=marks.hwm)
                    if not records:
                        break
                    for r in records:
                        doc = orjson.loads(r.value or b"null")
                        if doc["type"] not in HANDLED:
                            continue
                        if doc["type"] == "PaymentReceived" and doc["data"]["amount"] < 0:
                            continue
                        out.add((topic, p, r.offset))
                    offset = records[-1].offset + 1
    finally:
        log.close()
    return out
