"""Helpers of the projection tests (fixtures: conftest.py): produce events fast, start worker processes, fold the log.

Worker processes run ``python -m eventlane.cli --data DATA project worker
tests.projection.bankapp:app NAME`` (the hidden command ``project run`` starts) with the repository root on ``PYTHONPATH``; their stderr goes to a file under
the test's ``tmp_path`` (read by the tests that look for a log line, and printed when a test
fails). The *fold* is computed here independently of the framework: straight from the raw
JSON values of the log's records.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eventlane.app import Runtime  # noqa: E402
from eventlane.codec import Envelope  # noqa: E402
from eventlane.consumer.coordinator import GroupCoordinator  # noqa: E402
from eventlane.consumer.free import Consumer  # noqa: E402
from eventlane.log import LogStore, TopicPartition  # noqa: E402
from eventlane.log.partitioner import partition_for_key  # noqa: E402
from eventlane.projection import ReadModelView, readmodel_path  # noqa: E402
from eventlane.projection.postgres import PgReadModelView, schema_name  # noqa: E402
from eventlane.projection.store import ENV as READMODELS_ENV  # noqa: E402
from tests.projection import bankapp  # noqa: E402

APP = "tests.projection.bankapp:app"


def child_env(**extra: str) -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("EVENTLANE_LOG_LEVEL", "info")
    env.update(extra)
    return env


# ---------------------------------------------------------------------------- producing
@dataclass
class Producer:
    """Appends encoded events straight to the log (one batch per partition per call)."""

    runtime: Runtime
    versions: dict[str, int] = field(default_factory=dict)
    count: int = 0

    def deposits(
        self,
        n: int,
        *,
        accounts: int = 50,
        poison: Callable[[int], bool] = lambda i: False,
        topic: str = "accounts",
    ) -> None:
        partitions = self.runtime.log.partition_count(topic)
        batches: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]] = {}
        for _ in range(n):
            i = self.count
            self.count += 1
            aid = f"acc-{i % accounts}"
            version = self.versions.get(aid, 0) + 1
            self.versions[aid] = version
            memo = "poison" if poison(i) else ""
            event = (
                bankapp.Withdrawn(i % 7)
                if i % 5 == 4 and not memo
                else bankapp.Deposited(i % 100 + 1, memo)
            )
            key, value, headers = self.runtime.codec.encode(Envelope(event, aid, version))
            batches.setdefault(partition_for_key(key, partitions), []).append(
                (key, value, tuple(headers), None)
            )
        for p, records in batches.items():
            for start in range(0, len(records), 2000):
                self.runtime.log.append(topic, p, records[start : start + 2000])


@pytest.fixture
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The read models' engine: ``sqlite`` unless a test parametrises it (``indirect``) with
    ``postgresql``: then ``$EVENTLANE_READMODELS`` names a fresh database of the session's
    PostgreSQL cluster, for this process and the workers it starts."""
    name = str(getattr(request, "param", "sqlite"))
    if name == "postgresql":
        monkeypatch.setenv(READMODELS_ENV, request.getfixturevalue("postgres_url"))
    else:
        monkeypatch.delenv(READMODELS_ENV, raising=False)
    return name


BOTH = pytest.mark.parametrize("engine", ["sqlite", "postgresql"], indirect=True)
"""Run a test on both read-model engines."""


@pytest.fixture
def data(tmp_path: Path, engine: str) -> Path:
    return tmp_path / "data"


def view(data: Path, name: str) -> ReadModelView | PgReadModelView:
    """A read-only view of read model ``name`` on the engine the test runs on."""
    url = os.environ.get(READMODELS_ENV)
    if url:
        return PgReadModelView(url, schema_name(name))
    return ReadModelView(readmodel_path(data, name))


@pytest.fixture
def runtime(data: Path) -> Iterator[Runtime]:
    with bankapp.app.open(data) as rt:
        yield rt


@pytest.fixture
def producer(runtime: Runtime) -> Producer:
    return Producer(runtime)


# ---------------------------------------------------------------------------- the fold
@dataclass
class Fold:
    balances: dict[str, tuple[int, int]]  # account -> (total, events)
    poison: set[tuple[str, int, int]]  # coordinates of poison deposits
    events: set[tuple[str, int, int]]  # coordinates of every event


def fold_accounts(data: Path, *, include_poison: bool = False) -> Fold:
    """The balances read model as the log says it must be, from the raw JSON values."""
    log = LogStore(data)
    try:
        consumer = Consumer(log, auto_offset_reset="earliest", max_poll_records=10_000)
        partitions = log.partition_count("accounts")
        consumer.assign([TopicPartition("accounts", p) for p in range(partitions)])
        ends = {p: log.offsets("accounts", p).hwm for p in range(partitions)}
        balances: dict[str, tuple[int, int]] = {}
        poison: set[tuple[str, int, int]] = set()
        events: set[tuple[str, int, int]] = set()
        seen = dict.fromkeys(ends, 0)
        while any(seen[p] < ends[p] for p in ends):
            for r in consumer.poll(1.0):
                seen[r.partition] = r.offset + 1
                coord = (r.topic, r.partition, r.offset)
                events.add(coord)
                try:
                    doc = orjson.loads(r.value)  # type: ignore[arg-type]
                except orjson.JSONDecodeError:
                    continue  # not an event at all: dead-lettered, no effect
                if doc["type"] not in ("Deposited", "Withdrawn"):
                    continue
                amount = doc["data"]["amount"]
                if doc["type"] == "Withdrawn":
                    amount = -amount
                elif doc["data"].get("memo") == "poison":
                    poison.add(coord)
                    if not include_poison:
                        continue
                total, count = balances.get(doc["aggregate_id"], (0, 0))
                balances[doc["aggregate_id"]] = (total + amount, count + 1)
        consumer.close()
        return Fold(balances, poison, events)
    finally:
        log.close()


def read_balances(data: Path) -> dict[str, tuple[int, int]]:
    with connect(data, "balances") as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, total, events FROM balances")}


def read_markers(data: Path) -> list[tuple[str, int, int]]:
    with connect(data, "balances") as conn:
        return [tuple(r) for r in conn.execute('SELECT topic, partition, "offset" FROM applied')]


class connect:
    """A read-only connection to a read model (SQLite file or PostgreSQL schema), closed on
    exit."""

    def __init__(self, data: Path, name: str) -> None:
        url = os.environ.get(READMODELS_ENV)
        self.conn: Any
        if url:
            self.conn = psycopg.connect(url, autocommit=True)
            self.conn.execute(f'SET search_path TO "{schema_name(name)}"')
            return
        path = readmodel_path(data, name)
        self.conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=60)

    def __enter__(self) -> Any:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def integrity(data: Path, name: str) -> str:
    """SQLite's ``integrity_check``; on PostgreSQL, ``ok`` once every table reads in full
    (a heap scan of each: what a torn page would break)."""
    with connect(data, name) as conn:
        if isinstance(conn, sqlite3.Connection):
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        ]
        for table in tables:
            conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
        return "ok"


# ---------------------------------------------------------------------------- processes
@dataclass
class Workers:
    """Worker processes of the test app, with their stderr in files; all killed at the end."""

    data: Path
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    n: int = 0

    def start(
        self,
        name: str = "balances",
        *,
        session_timeout_ms: int = 1000,
        env: dict[str, str] | None = None,
        module: str | None = None,
        max_poll_records: int = 500,
        app: str = APP,
    ) -> subprocess.Popen[bytes]:
        self.n += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        if module is None:
            cmd = [
                sys.executable,
                "-m",
                "eventlane.cli",
                "--data",
                str(self.data),
                "project",
                "worker",
                app,
                name,
                "--session-timeout-ms",
                str(session_timeout_ms),
                "--max-poll-records",
                str(max_poll_records),
            ]
        else:
            cmd = [sys.executable, "-m", module, str(self.data), name, str(session_timeout_ms)]
        with (self.logs / f"worker-{self.n}.log").open("ab") as sink:
            proc = subprocess.Popen(
                cmd, env=env or child_env(), stdout=sink, stderr=sink, cwd=str(ROOT)
            )
        proc.log_path = self.logs / f"worker-{self.n}.log"  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def wait_joined(
        self, proc: subprocess.Popen[bytes], name: str = "balances", timeout: float = 120
    ) -> None:
        """Wait until ``proc`` is a member of group ``name`` owning a partition (a loaded
        machine can take seconds to start a Python process)."""
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"worker exited with {proc.returncode}"
            owners = group_members(self.data, name)
            if owners.get(proc.pid):
                return
            assert time.monotonic() < deadline, f"worker {proc.pid} never joined: {owners}"
            time.sleep(0.05)

    def kill9(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def term(self, proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()

    def output(self) -> str:
        out = []
        for path in sorted(self.logs.glob("worker-*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(out)


@pytest.fixture
def workers(data: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workers]:
    w = Workers(data, tmp_path / "logs")
    yield w
    w.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(w.output())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]


def group_members(data: Path, group: str) -> dict[int, list[TopicPartition]]:
    """pid -> partitions owned, from the group's shared state (empty: no such group)."""
    if not (data / "groups" / group).is_dir():
        return {}
    log = LogStore(data)
    coord = GroupCoordinator(log, group)
    try:
        return {m.pid: sorted(m.owned) for m in coord.current().members.values()}
    finally:
        coord.close()
        log.close()


def positions(data: Path, name: str) -> dict[TopicPartition, int]:
    with view(data, name) as v:
        return v.positions()


def hwms(data: Path, topic: str) -> dict[TopicPartition, int]:
    log = LogStore(data)
    try:
        return {
            TopicPartition(topic, p): log.offsets(topic, p).hwm
            for p in range(log.partition_count(topic))
        }
    finally:
        log.close()


def wait_caught_up(
    data: Path,
    name: str,
    topic: str = "accounts",
    timeout: float = 60.0,
    check: Callable[[], None] | None = None,
) -> float:
    """Wait until every partition's position is its HWM; return the seconds it took."""
    t0 = time.monotonic()
    ends = hwms(data, topic)
    with view(data, name) as v:
        while True:
            pos = v.positions()
            if all(pos.get(tp, -1) >= end for tp, end in ends.items()):
                return time.monotonic() - t0
            if check is not None:
                check()
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"not caught up after {timeout}s: {pos} vs {ends}")
            time.sleep(0.05)


def expect_model(data: Path) -> None:
    """The balances read model equals a fold of the log, every event applied exactly once
    (the markers table)."""
    fold = fold_accounts(data)
    assert read_balances(data) == fold.balances
    markers = read_markers(data)
    assert len(markers) == len(set(markers))  # nothing applied twice
    assert set(markers) == fold.events  # nothing skipped


def expect_workers_carry_on_after_swap(
    producer: Producer, data: Path, procs: list[subprocess.Popen[bytes]], workers: Workers
) -> None:
    """After a swap of ``balances`` under live workers: 300 more events are applied by the
    same worker processes on the new read model, which equals the fold, with no dead
    letters and each worker saying it reopened the read model."""
    producer.deposits(300)
    wait_caught_up(data, "balances", timeout=120)
    for proc in procs:
        assert proc.poll() is None, workers.output()
    expect_model(data)
    with view(data, "balances") as v:
        assert v.dead_letter_counts() == {}
    assert "read model reopened after a hand-off" in workers.output()
