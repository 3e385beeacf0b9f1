"""Consumer groups across processes: throughput, failover and rebalance times.

Every member is a separate OS process (this script re-run with ``--child``), started with
its imports done and then released together through a "go" file, so process start-up is not
timed. Times come from CLOCK_MONOTONIC, one clock for every process of the machine.

Figures (each the median of ``--runs`` rounds, subjects interleaved with their baseline):

* ``free``            baseline: one free-consumer process assigned every partition, polling
                      until it has read all ``--records`` records (4 partitions, 100-byte
                      values)
* ``group1_auto``     one group member, auto-commit (every 5 s, and on close)
* ``group1_commit``   one group member, a synchronous commit after every poll of up to
                      ``--max-records`` records (at-least-once; one fsync per commit)
* ``group2_auto``     two group members started together (the first one to join takes every
                      partition, the second one's arrival moves half of them): aggregate rate
                      = records / (last record anywhere - first record anywhere)
* ``failover``        seconds from ``kill -9`` of one of two members to the survivor owning
                      every partition, with ``session_timeout_ms=1000``, heartbeat 100 ms
                      (the floor is the session timeout; the rest is detection + rebalance)
* ``join``            seconds from a new member's first ``poll()`` (it joins) to it owning its
                      share, the old member having revoked it first (cooperative)
* ``leave``           seconds from a member's ``close()`` to the other owning everything

    .venv/bin/python benchmarks/bench_groups.py [--quick] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import bench_from_args, parser, quiet_logs, scratch_dir

from eventlane.consumer.free import Consumer
from eventlane.consumer.group import GroupConsumer
from eventlane.log.embedded.store import LogStore
from eventlane.log.record import TopicPartition

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
TOPIC = "bench"
PARTITIONS = 4
VALUE = b"v" * 100


# ---------------------------------------------------------------------------- child side
def child(args: dict[str, Any]) -> None:
    quiet_logs()
    fd = os.open(args["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(**event: Any) -> None:
        event.setdefault("t", time.monotonic())
        os.write(fd, (json.dumps(event) + "\n").encode())

    stopping = False

    def on_term(_signo: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    store: Any = LogStore(args["data"]) if "log_url" not in args else None
    coordination = None
    if store is None:  # bench_js_groups.py: the log and the group on a JetStream cluster
        from eventlane.consumer.jetstream import JetStreamCoordination  # noqa: PLC0415
        from eventlane.log.jetstream.log import JetStreamLog  # noqa: PLC0415

        store = JetStreamLog.from_url(args["log_url"], namespace=args["namespace"])
        coordination = JetStreamCoordination(store)
    emit(ev="ready")
    go = Path(args["go"])
    while not go.exists():
        time.sleep(0.001)
    role = args["role"]
    max_records = args["max_records"]
    count, first, last = 0, None, None
    if role == "free":
        consumer = Consumer(store, auto_offset_reset="earliest", max_poll_records=max_records)
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        while count < args["total"]:
            records = consumer.poll(1.0)
            if records:
                first = first or time.monotonic()
                count += len(records)
                last = time.monotonic()
        emit(ev="done", count=count, first=first, last=last)
        return
    member: GroupConsumer

    def listener(kind: str) -> Any:
        return lambda tps: emit(ev=kind, tps=[tp.partition for tp in tps])

    member = GroupConsumer(
        store,
        coordination=coordination,
        group_id=args["group"],
        topics=[TOPIC],
        auto_offset_reset="earliest",
        enable_auto_commit=args["mode"] == "auto",
        session_timeout_ms=args["session_ms"],
        heartbeat_interval_ms=args["heartbeat_ms"],
        max_poll_records=max_records,
        on_assigned=listener("assigned"),
        on_revoked=listener("revoked"),
        on_lost=listener("lost"),
    )
    emit(ev="joining")
    while not stopping:
        records = member.poll(0.2)
        if records:
            first = first or time.monotonic()
            count += len(records)
            last = time.monotonic()
            if args["mode"] == "commit":
                member.commit()
        elif (
            role == "drain"
            and member.assignment()
            and all(
                member.position(tp) >= store.offsets(tp.topic, tp.partition).hwm
                for tp in member.assignment()
            )
        ):
            break
    emit(ev="closing")
    member.close()
    emit(ev="done", count=count, first=first, last=last)


# ---------------------------------------------------------------------------- bench side
class Proc:
    def __init__(self, root: Path, name: str, **args: Any) -> None:
        self.events_path = root / f"{name}.events"
        self.go = root / f"{name}.go"
        args = {"events": str(self.events_path), "go": str(self.go), **args}
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{HERE.parent}"}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--child", json.dumps(args)], env=env, cwd=ROOT
        )

    def events(self) -> list[dict[str, Any]]:
        try:
            lines = self.events_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def first(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in self.events() if e["ev"] == kind), None)

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for e in self.events():
            if e["ev"] == "assigned":
                owned |= set(e["tps"])
            elif e["ev"] in ("revoked", "lost"):
                owned -= set(e["tps"])
        return owned

    def release(self) -> float:
        self.go.touch()
        return time.monotonic()


def wait(condition: Any, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.002)
    return time.monotonic()


def ready(*procs: Proc) -> None:
    wait(lambda: all(p.first("ready") for p in procs))


def finish(*procs: Proc) -> list[dict[str, Any]]:
    for p in procs:
        if p.proc.wait(300) != 0:
            raise RuntimeError(f"benchmark child failed with {p.proc.returncode}")
    return [p.first("done") or {} for p in procs]


def fill(data: Path, total: int) -> None:
    store = LogStore(data)
    store.create_topic(TOPIC, PARTITIONS, {"flush_policy": "os"})
    per = total // PARTITIONS
    for p in range(PARTITIONS):
        for start in range(0, per, 10_000):
            store.append(TOPIC, p, [(None, VALUE, (), None)] * min(10_000, per - start))
    store.close()


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--max-records", type=int, default=2_000)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    quiet_logs()
    bench = bench_from_args(__file__, args)
    total = 100_000 if args.quick else args.records
    total -= total % PARTITIONS
    with scratch_dir(args.tmp, "groups") as root:
        data = root / "data"
        fill(data, total)
        counter = iter(range(1_000_000))

        def common(group: bool = True) -> dict[str, Any]:
            return {
                "data": str(data),
                "total": total,
                "max_records": args.max_records,
                "group": f"g{next(counter)}" if group else "",
                "session_ms": 10_000,
                "heartbeat_ms": 1_000,
            }

        def rate(results: list[dict[str, Any]]) -> float:
            count = sum(r["count"] for r in results)
            assert count >= total, (count, total)
            return count / (max(r["last"] for r in results) - min(r["first"] for r in results))

        def free() -> float:
            proc = Proc(root, f"free{next(counter)}", role="free", **common(False))
            ready(proc)
            proc.release()
            return rate(finish(proc))

        def group(members: int, mode: str) -> Any:
            def measure() -> float:
                opts = common()
                procs = [
                    Proc(root, f"m{next(counter)}", role="drain", mode=mode, **opts)
                    for _ in range(members)
                ]
                ready(*procs)
                for proc in procs:
                    proc.release()
                return rate(finish(*procs))

            return measure

        bench.rounds(
            {
                "free": free,
                "group1_auto": group(1, "auto"),
                "group1_commit": group(1, "commit"),
                "group2_auto": group(2, "auto"),
            },
            warmup=not args.quick,
        )

        def failover() -> dict[str, float]:
            opts = {**common(), "session_ms": 1000, "heartbeat_ms": 100}
            a = Proc(root, f"m{next(counter)}", role="idle", mode="auto", **opts)
            b = Proc(root, f"m{next(counter)}", role="idle", mode="auto", **opts)
            ready(a, b)
            a.release()
            wait(lambda: len(a.owned()) == PARTITIONS)
            b.release()
            wait(lambda: len(a.owned()) == len(b.owned()) == PARTITIONS // 2)
            time.sleep(0.3)
            killed = time.monotonic()
            a.proc.kill()
            a.proc.wait()
            wait(lambda: len(b.owned()) == PARTITIONS)
            took = max(e["t"] for e in b.events() if e["ev"] == "assigned") - killed
            b.proc.send_signal(signal.SIGTERM)
            finish(b)
            return {"seconds": took, "beyond_session": took - 1.0}

        def join_leave() -> dict[str, float]:
            opts = common()
            a = Proc(root, f"m{next(counter)}", role="idle", mode="auto", **opts)
            b = Proc(root, f"m{next(counter)}", role="idle", mode="auto", **opts)
            ready(a, b)
            a.release()
            wait(lambda: len(a.owned()) == PARTITIONS)
            b.release()
            wait(lambda: len(b.owned()) == PARTITIONS // 2)
            joined = b.first("joining")["t"]
            got = max(e["t"] for e in b.events() if e["ev"] == "assigned")
            time.sleep(0.2)
            a.proc.send_signal(signal.SIGTERM)
            wait(lambda: a.first("closing") is not None)
            closing = a.first("closing")["t"]
            wait(lambda: len(b.owned()) == PARTITIONS)
            left = max(e["t"] for e in b.events() if e["ev"] == "assigned")
            b.proc.send_signal(signal.SIGTERM)
            finish(a, b)
            return {"join": got - joined, "leave": left - closing}

        bench.rounds({"failover": failover, "rebalance": join_leave})

    bench.add("free consumer read (1 process, 4 partitions)", "rec/s", "free")
    bench.add("group, 1 member, auto-commit", "rec/s", "group1_auto", baseline="free")
    bench.add(
        f"group, 1 member, commit per poll ({args.max_records})",
        "rec/s",
        "group1_commit",
        baseline="free",
    )
    bench.add("group, 2 member processes, auto-commit", "rec/s", "group2_auto", baseline="free")
    bench.add("kill -9 to full reassignment (session 1 s)", "s", "failover.seconds")
    bench.add("  of which beyond the session timeout", "s", "failover.beyond_session")
    bench.add("graceful join: first poll to owning its share", "s", "rebalance.join")
    bench.add("graceful leave: close() to the other owning all", "s", "rebalance.leave")
    bench.notes.append(
        f"{total} records of {len(VALUE)} B in {PARTITIONS} partitions,"
        f" page cache warm; max_poll_records={args.max_records}"
    )
    bench.finish()


if __name__ == "__main__":
    main()
