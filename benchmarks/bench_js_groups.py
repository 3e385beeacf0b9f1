"""Consumer groups on a JetStream cluster vs the embedded coordinator, as ratios in one run.

The members are the processes of ``bench_groups.py`` (re-run with ``--child``), started with
their imports done and released through a "go" file; the cluster is a real 3-node
nats-server cluster on loopback ports started by this script (replicas 3, fsync before
ack). Each round measures the same things on both engines, interleaved:

* ``consume``   one member draining ``--records`` records from 4 partitions (auto-commit):
                records per second per member
* ``failover``  seconds from ``kill -9`` of one of two members to the survivor owning every
                partition (``session_timeout_ms=1000``, heartbeat 100 ms)
* ``join``      seconds from a new member's first ``poll()`` to it owning its share
                (cooperative: the old member revokes first)
* ``leave``     seconds from a member's ``close()`` to the other owning everything
* ``join``/``leave`` again on an empty topic: the protocol alone (with records, a member
                notices a rebalance only after the fetch it is in, so the log's read speed
                shows in the figures above)

The ratio of each cluster figure is to the embedded figure of the same round (above 1: the
cluster's number is larger, i.e. slower for a time, faster for a rate).

    .venv/bin/python benchmarks/bench_js_groups.py [--quick] [--runs 5] [--json]
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import bench_from_args, parser, quiet_logs, scratch_dir
from bench_groups import PARTITIONS, TOPIC, VALUE, Proc, fill, finish, ready, wait

from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog


def fill_cluster(url: str, namespace: str, total: int) -> None:
    with JetStreamLog.from_url(url, namespace=namespace) as js:
        js.create_topic(TOPIC, PARTITIONS)
        per = total // PARTITIONS
        for p in range(PARTITIONS):
            for start in range(0, per, 1000):
                js.append(TOPIC, p, [(None, VALUE, (), None)] * min(1000, per - start))


def measures(root: Path, engine: dict[str, Any], total: int, max_records: int) -> dict[str, Any]:
    """The four measurements on one engine (``engine``: the child's log arguments)."""
    counter = iter(range(1_000_000))
    tag = uuid.uuid4().hex[:6]  # event files of this call's members are its own

    def opts(**extra: Any) -> dict[str, Any]:
        return {
            **engine,
            "total": total,
            "max_records": max_records,
            "group": f"g{uuid.uuid4().hex[:8]}",
            "session_ms": 10_000,
            "heartbeat_ms": 1_000,
            **extra,
        }

    def name() -> str:
        return f"{tag}-{next(counter)}"

    def consume() -> float:
        proc = Proc(root, name(), role="drain", mode="auto", **opts())
        ready(proc)
        proc.release()
        (done,) = finish(proc)
        assert done["count"] >= total, (done, total)
        return float(done["count"] / (done["last"] - done["first"]))

    def failover() -> float:
        common = opts(session_ms=1000, heartbeat_ms=100)
        a = Proc(root, name(), role="idle", mode="auto", **common)
        b = Proc(root, name(), role="idle", mode="auto", **common)
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
        return float(took)

    def join_leave() -> dict[str, float]:
        common = opts()
        a = Proc(root, name(), role="idle", mode="auto", **common)
        b = Proc(root, name(), role="idle", mode="auto", **common)
        ready(a, b)
        a.release()
        wait(lambda: len(a.owned()) == PARTITIONS)
        b.release()
        wait(lambda: len(b.owned()) == PARTITIONS // 2)
        joined = (b.first("joining") or {})["t"]
        got = max(e["t"] for e in b.events() if e["ev"] == "assigned")
        time.sleep(0.2)
        a.proc.send_signal(signal.SIGTERM)
        wait(lambda: a.first("closing") is not None)
        closing = (a.first("closing") or {})["t"]
        wait(lambda: len(b.owned()) == PARTITIONS)
        left = max(e["t"] for e in b.events() if e["ev"] == "assigned")
        b.proc.send_signal(signal.SIGTERM)
        finish(a, b)
        return {"join": got - joined, "leave": left - closing}

    return {"consume": consume, "failover": failover, "rebalance": join_leave}


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--records", type=int, default=40_000)
    p.add_argument("--max-records", type=int, default=2_000)
    args = p.parse_args()
    quiet_logs()
    bench = bench_from_args(__file__, args)
    total = 8_000 if args.quick else args.records
    total -= total % PARTITIONS
    with scratch_dir(args.tmp, "js-groups") as root:
        cluster = LocalCluster.create(root / "nats", nodes=3)
        cluster.start()
        try:
            data = root / "data"
            fill(data, total)
            namespace = "bench" + uuid.uuid4().hex[:8]
            fill_cluster(cluster.url, namespace, total)
            local = measures(root, {"data": str(data)}, total, args.max_records)
            remote = measures(
                root,
                {"data": str(data), "log_url": cluster.url, "namespace": namespace},
                total,
                args.max_records,
            )
            # the same rebalances on an empty topic: the protocol alone, no fetch in flight
            empty_data, empty_ns = root / "empty", namespace + "e"
            fill(empty_data, 0)
            fill_cluster(cluster.url, empty_ns, 0)
            local["idle"] = measures(root, {"data": str(empty_data)}, 0, 1)["rebalance"]
            remote["idle"] = measures(
                root,
                {"data": str(empty_data), "log_url": cluster.url, "namespace": empty_ns},
                0,
                1,
            )["rebalance"]
            rounds: dict[str, Callable[[], Any]] = {}
            for key in ("consume", "failover", "rebalance", "idle"):
                rounds[f"embedded_{key}"] = local[key]
                rounds[f"cluster_{key}"] = remote[key]
            bench.rounds(rounds)
        finally:
            cluster.stop()
    for engine in ("embedded", "cluster"):
        base = None if engine == "embedded" else "embedded"
        bench.add(
            f"{engine}: consume, 1 member, auto-commit",
            "rec/s",
            f"{engine}_consume",
            baseline=base and f"{base}_consume",
        )
        bench.add(
            f"{engine}: kill -9 to full reassignment (session 1 s)",
            "s",
            f"{engine}_failover",
            baseline=base and f"{base}_failover",
        )
        bench.add(
            f"{engine}: join, first poll to owning its share",
            "s",
            f"{engine}_rebalance.join",
            baseline=base and f"{base}_rebalance.join",
        )
        bench.add(
            f"{engine}: leave, close() to the other owning all",
            "s",
            f"{engine}_rebalance.leave",
            baseline=base and f"{base}_rebalance.leave",
        )
        for step in ("join", "leave"):
            bench.add(
                f"{engine}: {step} on an empty topic (the protocol alone)",
                "s",
                f"{engine}_idle.{step}",
                baseline=base and f"{base}_idle.{step}",
            )
    bench.notes.append(
        f"{total} records of {len(VALUE)} B in {PARTITIONS} partitions; cluster: 3 local"
        " nats-server nodes, replicas 3, sync always; the machine is shared (2 cores)"
    )
    bench.finish()


if __name__ == "__main__":
    main()
