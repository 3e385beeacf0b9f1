"""The event store on JetStream: optimistic concurrency across OS processes, checked by the
server (``Expect`` -> ``Nats-Expected-Last-Subject-Sequence``), on the real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "eventlane.engine",
    reason="the event store on JetStream needs the honest log port (eventlane.engine, expect=/read_key in the store)",
)

from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_domain import Counter, make_app, raw_streams

PROCS = Path(__file__).parent / "procs.py"
INITIAL = 7
PER_PROCESS = 100  # the default suite; the soak run below does the 2 x 500


@pytest.fixture
def js(cluster: LocalCluster, namespace: str) -> Iterator[JetStreamLog]:
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as log:
        with make_app(log) as app:  # creates the topics
            counter = Counter("hot")
            for _ in range(INITIAL):
                counter.increment(1, "seed")
            app.save(counter)
        yield log


def _spawn(
    role: str, cluster: LocalCluster, namespace: str, **args: object
) -> subprocess.Popen[str]:
    body = {"url": cluster.url, "namespace": namespace, "topic": "counters", "tag": "", **args}
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


def _history(js: JetStreamLog) -> list[dict[str, object]]:
    return raw_streams(js, "counters")["hot"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "per_process", [PER_PROCESS, pytest.param(500, marks=pytest.mark.soak)], ids=["100", "500"]
)
def test_two_processes_execute_with_retry_exactly_once(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, per_process: int
) -> None:
    procs = [
        _spawn("execute", cluster, namespace, aggregate="hot", count=per_process, writer=w)
        for w in ("p1", "p2")
    ]
    try:
        for proc in procs:
            assert _line(proc) == "R"
        for proc in procs:
            _send(proc, "go")
        done = [_line(proc).split() for proc in procs]
    finally:
        for proc in procs:
            proc.communicate(timeout=60)
    stream = _history(js)
    versions = [doc["aggregate_version"] for doc in stream]
    assert versions == list(range(1, INITIAL + 2 * per_process + 1))  # exactly once, in order
    writers = [doc["data"]["writer"] for doc in stream]  # type: ignore[index]
    assert writers.count("p1") == writers.count("p2") == per_process
    (_, a1, s1, e1), (_, a2, s2, e2) = done
    assert float(s1) < float(e2) and float(s2) < float(e1)  # they really raced
    assert int(a1) + int(a2) > 2 * per_process  # and conflicts were retried
    with make_app(js) as app:
        loaded = app.load(Counter, "hot")
        assert (loaded.version, loaded.value) == (INITIAL + 2 * per_process,) * 2


def test_without_retry_the_loser_gets_concurrency_error_and_writes_nothing(
    js: JetStreamLog, cluster: LocalCluster, namespace: str
) -> None:
    batches = {"a": 3, "b": 2}
    procs = {
        w: _spawn("race", cluster, namespace, aggregate="hot", batch=n, writer=w)
        for w, n in batches.items()
    }
    version, wins, history = INITIAL, {"a": 0, "b": 0}, []
    try:
        for _ in range(30):
            loads = {w: _line(p) for w, p in procs.items()}
            assert set(loads.values()) == {f"L {version}"}, (loads, wins, history)
            for proc in procs.values():
                _send(proc, "GO")
            outcome = {w: _line(p).split() for w, p in procs.items()}
            history.append(outcome)
            (winner,) = [w for w, line in outcome.items() if line[0] == "W"]
            (loser,) = set(procs) - {winner}
            assert outcome[loser][:2] == ["C", str(version)]
            version += batches[winner]
            wins[winner] += 1
        for proc in procs.values():
            assert _line(proc) == f"L {version}"
            _send(proc, "Q")
    finally:
        for proc in procs.values():
            proc.communicate(timeout=60)
    writers = [doc["data"]["writer"] for doc in _history(js)]  # type: ignore[index]
    assert writers.count("a") == 3 * wins["a"] and writers.count("b") == 2 * wins["b"]
    assert [doc["aggregate_version"] for doc in _history(js)] == list(range(1, version + 1))
