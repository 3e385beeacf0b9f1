"""A stream leader cut off from the rest of its cluster and from the clients (issue 26: defects
3, 4 and 5), on real hosts simulated by network namespaces (tests/jetstream/ns_hosts.py).

Three nats-servers, each in a namespace of its own; two writer processes in a client
namespace append to every partition of a topic (one thread per partition, every other
append conditional) and read it back as they go. The leader of partition 0 (which leads no
other partition) is cut off for 15 s (its port on the bridge goes down: packets dropped,
sockets open), then healed. The oracle is the writers' own lines (partition_procs.py) and the
streams read back afterwards:

* every acknowledged append is stored once, at its acknowledged offset; no value is stored
  twice; an append reported as failed with a definite error (refused, unavailable, conflict)
  is not stored; only ``OutcomeUnknownError`` may go either way;
* callers see only eventlane's errors (no ``nats.*`` class), and no reader sees its
  high-water mark go backwards;
* appends to partition 0 resume within 10 s of the cut (asserted < 15 s; printed), while a
  majority is up;
* partitions whose leaders were not cut off keep flowing (their longest pause is printed and
  bounded).

Namespaces need root and ``ip``; elsewhere the test skips and says why, except in CI
(``CI=true``), where it fails.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ns_hosts import Hosts, NamespaceCluster, require_namespaces

PROCS = Path(__file__).parent / "partition_procs.py"
TOPIC = "cut"
PARTITIONS = 3
CUT_S = 15.0


@pytest.fixture
def hosts_cluster(tmp_path: Path) -> Iterator[tuple[Hosts, NamespaceCluster]]:
    require_namespaces("the partition test")
    hosts = Hosts(3)
    cluster = NamespaceCluster.on(hosts, tmp_path / "nats")
    try:
        hosts.create()
        cluster.start(timeout=60)
        yield hosts, cluster
    finally:
        cluster.stop()  # by PID
        hosts.remove()


class Child:
    """A ``partition_procs.py`` process in the client namespace and the lines it printed."""

    def __init__(self, hosts: Hosts, role: str, args: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [*hosts.run_in_client(), sys.executable, str(PROCS), role, json.dumps(args)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def rows(self, kind: str) -> list[list[str]]:
        return [line.split(" ") for line in list(self.lines) if line.startswith(kind + " ")]

    def acks(self, p: int | None = None) -> list[tuple[int, int, str, float, float]]:
        out = [(int(r[1]), int(r[2]), r[3], float(r[4]), float(r[5])) for r in self.rows("A")]
        return [a for a in out if p is None or a[0] == p]

    def finish(self, timeout: float = 60) -> None:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()  # by its PID
                self.proc.wait()
        self.thread.join(timeout=10)


def _once(hosts: Hosts, role: str, args: dict[str, Any]) -> Any:
    child = Child(hosts, role, args)
    child.finish(timeout=90)
    assert child.proc.returncode == 0, f"{role} failed: {child.lines[-5:]}"
    return json.loads(child.lines[-1])


def _until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _stable_leaders(hosts: Hosts, base: dict[str, Any], seen: list[str] | None) -> list[str]:
    """The partitions' leaders once two looks a second apart agree (after a heal, leaders
    can still move: a cut is aimed at the node that leads partition p when it falls)."""
    for _ in range(10):
        if seen is None:
            seen = _once(hosts, "leaders", base)["leaders"]
        time.sleep(1.0)
        now: list[str] = _once(hosts, "leaders", base)["leaders"]
        if now == seen:
            return now
        seen = now
    raise AssertionError(f"stream leaders kept moving: {seen}")


def _longest_pause(times: list[float], start: float, end: float) -> float:
    """The longest time without an ack between ``start`` and ``end``."""
    inside = sorted(t for t in times if start < t < end)
    edges = [start, *inside, end]
    return max(b - a for a, b in itertools.pairwise(edges))


def run_cuts(hosts: Hosts, cluster: NamespaceCluster, tmp: Path, cycles: int) -> dict[str, Any]:
    """Cut a stream leader off ``cycles`` times under load; check the oracle; the figures."""
    base = {"url": cluster.url, "namespace": "t" + uuid.uuid4().hex[:10], "topic": TOPIC}
    base["partitions"] = PARTITIONS
    leaders = _once(hosts, "setup", base)["leaders"]
    stop = tmp / "stop"
    seconds = 60 + cycles * (CUT_S + 15)
    writers = [
        Child(hosts, "write", {**base, "tag": tag, "stop": str(stop), "seconds": seconds})
        for tag in ("a", "b")
    ]
    commands = Child(
        hosts,
        "execute",
        {**base, "tag": "x", "aggregates": 4, "stop": str(stop), "seconds": seconds},
    )
    figures: dict[str, Any] = {"resume_s": [], "untouched_pause_s": [], "cut": []}
    try:
        for w in writers:
            _until("first appends", lambda w=w: len(w.acks()) >= 10 * PARTITIONS, 60)
        _until("first commands", lambda: len(commands.rows("A")) >= 10, 60)
        for cycle in range(cycles):
            leaders = _stable_leaders(hosts, base, leaders if not cycle else None)
            p = cycle % PARTITIONS
            victim = int(leaders[p][1:]) - 1
            untouched = [q for q in range(PARTITIONS) if leaders[q] != leaders[p]]
            cut_at = time.time()
            hosts.cut(victim)
            time.sleep(CUT_S)
            healed_at = time.time()
            hosts.heal(victim)
            resume = max(
                min((t1 for _, _, _, t0, t1 in w.acks(p) if t0 >= cut_at), default=1e9) - cut_at
                for w in writers
            )
            pause = max(
                (
                    _longest_pause([t1 for *_, t1 in w.acks(q)], cut_at, healed_at)
                    for w in writers
                    for q in untouched
                ),
                default=0.0,
            )
            figures["resume_s"].append(round(resume, 2))
            figures["untouched_pause_s"].append(round(pause, 2))
            figures["cut"].append({"partition": p, "leader": leaders[p], "untouched": untouched})
            after = time.time()  # every partition flows again once healed
            _until(
                "appends after healing",
                lambda: all(
                    any(t1 > after for *_, t1 in w.acks(q))
                    for w in writers
                    for q in range(PARTITIONS)
                ),
                60,
            )
    finally:
        stop.touch()
        for w in writers:
            w.finish()
        commands.finish()
    acked = {
        q: 1 + max((a[1] for w in writers for a in w.acks(q)), default=-1)
        for q in range(PARTITIONS)
    }
    stored = _once(hosts, "readback", {**base, "acked": acked})
    short = stored.pop("short")
    figures["stale_hwm_answers"] = stored.pop("stale")
    events = _once(hosts, "counters", base)
    figures["acks"] = sum(len(w.acks()) for w in writers)
    figures["errors"] = sorted({r[5] for w in writers for r in w.rows("E")})
    figures["unknown"] = sum(1 for w in writers for r in w.rows("E") if r[6] == "1")
    figures["stored"] = sum(len(rows) for rows in stored.values())
    figures["executed"] = len(commands.rows("A"))
    figures["execute_errors"] = sorted({r[5] for r in commands.rows("E")})
    print(f"\npartition figures: {json.dumps(figures)}")

    assert not short, f"reads answered nothing below the high-water mark: {short[:5]}"
    raw = [r for w in [*writers, commands] for r in w.rows("X")]
    assert not raw, f"errors that are not eventlane's reached the callers: {raw[:5]}"
    back = [r for w in writers for r in w.rows("H")]
    assert not back, f"a reader saw its high-water mark go backwards: {back[:5]}"
    values = [v for rows in stored.values() for _, v in rows]
    assert len(values) == len(set(values)), "a record was stored twice"
    at = {(int(p), o): v for p, rows in stored.items() for o, v in rows}
    lost = [a for w in writers for a in w.acks() if at.get((a[0], a[1])) != a[2]]
    if lost:  # (diagnosis) what is stored around the first loss
        p0, o0 = lost[0][0], lost[0][1]
        print("stored near:", [(o, v) for o, v in stored[str(p0)] if abs(o - o0) < 6])
        print("stored count per partition:", {p: len(r) for p, r in stored.items()})
        print("acks near:", sorted(a for w in writers for a in w.acks(p0) if abs(a[1] - o0) < 6))
    assert not lost, f"acknowledged appends lost or moved: {lost[:5]}"
    kept = set(values)
    refused = [r for w in writers for r in w.rows("E") if r[6] == "0" and r[2] in kept]
    assert not refused, f"appends reported as failed (not 'unknown') are stored: {refused[:5]}"
    # Runtime.execute: each command done is stored once; one that failed for sure is not
    assert figures["executed"] > 0, f"no command was executed: {commands.lines[-5:]}"
    tags = [t for stream in events.values() for t in stream]
    assert len(tags) == len(set(tags)), "a command's event was stored twice"
    done = {f"x:{r[1]}:{r[2]}" for r in commands.rows("A")}
    assert done <= set(tags), f"executed commands missing: {sorted(done - set(tags))[:5]}"
    failed = {f"x:{r[1]}:{r[2]}" for r in commands.rows("E") if r[6] == "0"}
    assert not failed & set(tags), f"failed commands stored: {sorted(failed & set(tags))[:5]}"
    for resume in figures["resume_s"]:
        assert resume < 15.0, f"appends to the cut-off partition resumed after {resume}s"
    for pause in figures["untouched_pause_s"]:
        assert pause < 10.0, f"a partition whose leader was not cut off paused {pause}s"
    return figures


def test_stream_leader_cut_off_loses_nothing_and_appends_resume(
    hosts_cluster: tuple[Hosts, NamespaceCluster], tmp_path: Path
) -> None:
    hosts, cluster = hosts_cluster
    run_cuts(hosts, cluster, tmp_path, cycles=1)


@pytest.mark.soak
def test_soak_stream_leaders_cut_off_again_and_again(
    hosts_cluster: tuple[Hosts, NamespaceCluster], tmp_path: Path
) -> None:
    hosts, cluster = hosts_cluster
    run_cuts(hosts, cluster, tmp_path, cycles=6)
