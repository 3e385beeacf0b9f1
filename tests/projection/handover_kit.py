"""The kill -9 hand-over scenario (issue 32 item 2), shared by the embedded and JetStream tests.

Two real worker processes of the bank app's ``balances`` projector under a
:class:`~eventlane.projection.Runner` that holds the group's coordinator; the session timeout
is long (20 s), so only the runner's leave on the dead worker's behalf can move its
partitions in under 2 s. The oracle is a fold of the raw log (any engine): the read model's
balances equal it, and its ``applied`` table holds every record's coordinates exactly once
(its primary key refuses a second apply; a missed record is a missing row).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson

from eventlane.app import Runtime
from eventlane.consumer.coordination import coordination_for
from eventlane.log import Log, TopicPartition
from eventlane.projection import Runner, readmodel_path

APP = "tests.projection.bankapp:app"
SESSION_MS = 20_000


def fold(log: Log) -> tuple[dict[str, tuple[int, int]], set[tuple[str, int, int]]]:
    """(account -> (total, events), every record's coordinates) from the raw values."""
    balances: dict[str, tuple[int, int]] = {}
    coords: set[tuple[str, int, int]] = set()
    for p in range(log.partition_count("accounts")):
        marks = log.offsets("accounts", p)
        offset, cursor = marks.lwm, None
        while offset < marks.hwm:
            records, cursor = log.read("accounts", p, offset, cursor=cursor)
            for r in records:
                coords.add((r.topic, r.partition, r.offset))
                doc = orjson.loads(r.value or b"null")
                amount = doc["data"]["amount"] * (-1 if doc["type"] == "Withdrawn" else 1)
                total, n = balances.get(doc["aggregate_id"], (0, 0))
                balances[doc["aggregate_id"]] = (total + amount, n + 1)
            offset = records[-1].offset + 1
    return balances, coords


def read_model(data: Path) -> tuple[dict[str, tuple[int, int]], list[tuple[str, int, int]]]:
    with sqlite3.connect(readmodel_path(data, "balances"), timeout=60) as db:
        balances = {
            r[0]: (r[1], r[2]) for r in db.execute("SELECT id, total, events FROM balances")
        }
        applied = [tuple(r) for r in db.execute("SELECT topic, partition, offset FROM applied")]
    return balances, applied


def lag(runtime: Runtime, data: Path) -> int:
    with sqlite3.connect(readmodel_path(data, "balances"), timeout=60) as db:
        try:
            rows = db.execute("SELECT topic, partition, next_offset FROM _eventlane_positions")
            positions = {TopicPartition(t, p): o for t, p, o in rows}
        except sqlite3.OperationalError:
            positions = {}
    total = 0
    for p in range(runtime.log.partition_count("accounts")):
        marks = runtime.log.offsets("accounts", p)
        total += marks.hwm - positions.get(TopicPartition("accounts", p), marks.lwm)
    return total


def owners(runner: Runner) -> dict[str, set[TopicPartition]]:
    """client id (the worker's tag) -> partitions owned, from the authoritative state."""
    assert runner.coordinator is not None
    with runner.coordinator.locked() as state:
        return {m.client_id: set(m.owned) for m in state.members.values()}


def wait(cond: Any, what: str, runner: Runner, timeout: float = 120.0) -> float:
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        runner.supervise_once()
        time.sleep(0.02)
    return time.monotonic() - start


def kill_one_of_two(
    runtime: Runtime, data: Path, env: dict[str, str], produce: Any, log_path: Path
) -> dict[str, Any]:
    """Run the scenario; return its figures (hand-over seconds, the dead member id)."""
    group = runtime.names.group("balances")
    coordinator = coordination_for(runtime.log).coordinator(group, wake=runtime.log.wake)
    runner = Runner(
        APP,
        "balances",
        data,
        workers=2,
        restart=False,
        session_timeout_ms=SESSION_MS,
        env=env,
        log_path=log_path,
        coordinator=coordinator,
    )
    partitions = {
        TopicPartition("accounts", p) for p in range(runtime.log.partition_count("accounts"))
    }
    produce(2_000)
    runner.start()
    try:
        tags = {w.tag for w in runner.procs}

        def both_own() -> bool:
            seen = owners(runner)
            return set(seen) == tags and all(seen[t] for t in tags)

        wait(both_own, "two members owning partitions", runner)
        produce(1_000)
        victim, survivor = runner.procs
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        elapsed = wait(
            lambda: owners(runner).get(survivor.tag) == partitions,
            "the survivor owning every partition",
            runner,
            timeout=30.0,
        )
        figures: dict[str, Any] = {
            "handover_s": round(time.monotonic() - t0, 3),
            "waited_s": elapsed,
        }
        figures["handed_over"] = list(runner.handed_over)
        produce(1_000)
        wait(lambda: lag(runtime, data) == 0, "lag 0", runner)
    finally:
        runner.stop()
        coordinator.close()
    balances, coords = fold(runtime.log)
    got, applied = read_model(data)
    figures["fold_equal"] = got == balances
    figures["applied_once"] = sorted(applied) == sorted(coords) and len(applied) == len(
        set(applied)
    )
    figures["victim"] = victim.pid
    return figures
