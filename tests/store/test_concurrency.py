"""Optimistic concurrency across OS processes: no forked history, ever.

Two real processes (``store_procs.py``) run commands against the same aggregate in the same
data directory. The stored history is then read *without* the store (raw records of the
partition, JSON values) and checked version by version.
"""

from __future__ import annotations

from pathlib import Path

from store_domain import Counter, SnapCounter, make_app, raw_streams
from store_helpers import finish, read_line, send, spawn

from eventlane.store.repository import snapshot_topic

INITIAL = 7
PER_PROCESS = 500


def _seed(data: Path, cls: type[Counter], aggregate_id: str) -> None:
    with make_app(data) as app:
        counter = cls(aggregate_id)
        for _ in range(INITIAL):
            counter.increment(1, "seed")
        app.save(counter)


def _check_history(data: Path, cls: type[Counter], aggregate_id: str, total: int) -> None:
    with make_app(data) as app:
        stream = raw_streams(app.log, cls.topic)[aggregate_id]
        versions = [doc["aggregate_version"] for doc in stream]
        assert versions == list(range(1, total + 1)), "a version is missing or duplicated"
        assert len({doc["_partition"] for doc in stream}) == 1
        offsets = [doc["_offset"] for doc in stream]
        assert offsets == sorted(offsets)
        loaded = app.load(cls, aggregate_id)
        assert (loaded.version, loaded.value) == (total, total)
        for partition in range(app.log.partition_count(cls.topic)):
            report = app.store.verify_index(cls.topic, partition)
            assert report.ok, report.problems


def _run_two_executors(data: Path, cls: type[Counter], aggregate_id: str) -> list[list[str]]:
    procs = [
        spawn(
            "execute",
            data=str(data),
            aggregate=aggregate_id,
            count=PER_PROCESS,
            writer=f"p{i}",
            cls=cls.__name__,
        )
        for i in (1, 2)
    ]
    for proc in procs:
        assert read_line(proc) == "R"
    for proc in procs:
        send(proc, "GO")
    done = [read_line(proc).split() for proc in procs]
    for proc in procs:
        finish(proc)
    return done


def test_two_processes_execute_500_times_each_with_retry(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _seed(data, Counter, "hot")
    done = _run_two_executors(data, Counter, "hot")

    _check_history(data, Counter, "hot", INITIAL + 2 * PER_PROCESS)
    with make_app(data) as app:
        writers = [doc["data"]["writer"] for doc in raw_streams(app.log, "counters")["hot"]]
    assert writers.count("p1") == writers.count("p2") == PER_PROCESS
    # The processes really raced: their loops overlapped and conflicts were retried.
    (_, attempts1, start1, end1), (_, attempts2, start2, end2) = done
    assert float(start1) < float(end2) and float(start2) < float(end1)
    assert int(attempts1) + int(attempts2) > 2 * PER_PROCESS


def test_retry_with_snapshots_keeps_one_history(tmp_path: Path) -> None:
    """The same race on an aggregate with a snapshot every 10 events: loads start from
    snapshots written by either process, and the history is still whole."""
    data = tmp_path / "data"
    _seed(data, SnapCounter, "hot")
    _run_two_executors(data, SnapCounter, "hot")
    _check_history(data, SnapCounter, "hot", INITIAL + 2 * PER_PROCESS)
    with make_app(data) as app:
        snapshots = raw_streams(app.log, snapshot_topic(SnapCounter.topic))["hot"]
        assert {doc["aggregate_version"] % 10 for doc in snapshots} == {0}
        assert max(doc["aggregate_version"] for doc in snapshots) >= 1000


def test_without_retry_the_loser_always_gets_concurrency_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _seed(data, Counter, "contested")
    batches = {"a": 3, "b": 2}
    procs = {
        writer: spawn("race", data=str(data), aggregate="contested", batch=size, writer=writer)
        for writer, size in batches.items()
    }
    wins = {"a": 0, "b": 0}
    version = INITIAL
    for _ in range(60):
        for proc in procs.values():
            assert read_line(proc) == f"L {version}"  # both hold the same version
        for proc in procs.values():
            send(proc, "GO")
        outcome = {writer: read_line(proc).split() for writer, proc in procs.items()}
        winners = [w for w, line in outcome.items() if line[0] == "W"]
        assert len(winners) == 1, outcome  # never both, never neither
        winner = winners[0]
        (loser,) = set(procs) - {winner}
        assert outcome[loser] == ["C", str(version), str(version + batches[winner])]
        version += batches[winner]
        assert outcome[winner] == ["W", str(version)]
        wins[winner] += 1
    for proc in procs.values():
        assert read_line(proc) == f"L {version}"
        send(proc, "Q")
        finish(proc)

    _check_history(data, Counter, "contested", version)
    with make_app(data) as app:
        writers = [doc["data"]["writer"] for doc in raw_streams(app.log, "counters")["contested"]]
    # Only winners' batches are stored, each whole; no event of a losing batch exists.
    assert writers.count("a") == 3 * wins["a"]
    assert writers.count("b") == 2 * wins["b"]
    assert writers.count("seed") == INITIAL
