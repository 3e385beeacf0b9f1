"""Spark rebuild into a PostgreSQL schema against the local engine into one (issue 34 item 4).

History: bench_rebuild.py's invoicing history (``--events``, default 50,000; ``--quick``
20,000) on 8 partitions of ``invoices``. Projection rebuilt: ``customer_balances``, its
read model in a temporary PostgreSQL cluster (``$EVENTLANE_READMODELS``), so both engines
write the schema ``customer_balances__rebuild`` through the projector's own handlers:
``local`` in one process, one round trip per statement; ``spark`` (``local[2]``) in tasks
that each write a stage schema, merged inside the server by the rule ``sum``.

Rounds alternate local, spark (one warm-up of each first; the two results are checked
equal, every table, once). Figures: events/s of each, ``spark / local`` per round, the
Spark run's replay and its serial tail (merge inside the server + finalize), and the CPU
seconds per event of the PostgreSQL server's processes (what the tasks' statements cost
the server) for each engine. The SparkSession start is never inside a figure.

    .venv/bin/python benchmarks/bench_pg_rebuild.py [--quick] [--runs 5] [--events N] [--json]
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil
from _harness import Bench, bench_from_args, parser, quiet_logs, scratch_dir
from bench_pg_readmodel import postgres
from bench_rebuild import APP, PROJECTION, generate

from eventlane.projection.store import ENV as READMODELS_ENV
from eventlane.replay.rebuild import rebuild
from eventlane.replay.session import spark_session
from eventlane.replay.verify import verify_rebuild


def server_cpu(pid: int) -> float:
    """CPU seconds of the PostgreSQL server: the postmaster and its backends (those alive
    now; a backend of a closed connection has left its time with the postmaster's
    children counters, read as well)."""
    root = psutil.Process(pid)
    t = root.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in root.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            continue
    return total


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--events", type=int, default=None, help="history size (default 50,000)")
    p.add_argument("--partitions", type=int, default=8)
    args = p.parse_args()
    quiet_logs()
    events = args.events or (20_000 if args.quick else 50_000)
    bench: Bench = bench_from_args(__file__, args)
    with scratch_dir(args.tmp, "bench-pg-rebuild-") as root, postgres() as server:
        os.environ[READMODELS_ENV] = server.url
        data = root / "data"
        count = generate(data, events, args.partitions)
        bench.notes.append(f"history: {count:,} events on {args.partitions} partitions")
        runtime = APP.open(data, create_topics=False)
        spark = spark_session("local[2]", {"spark.driver.memory": "1g"})
        spark.range(1).count()

        def run(engine: str) -> Any:
            s0, w0 = server_cpu(server.pid), time.perf_counter()
            r = rebuild(runtime, PROJECTION, engine=engine, spark=spark)
            wall = time.perf_counter() - w0
            bench.record(f"server_cpu_us_{engine}", (server_cpu(server.pid) - s0) / count * 1e6)
            if engine == "spark":
                bench.record("spark_replay_s", r.replay_seconds)
                bench.record("spark_serial_s", r.seconds - r.replay_seconds)
            bench.record(f"wall_s_{engine}", wall)
            return r

        warm = run("spark")
        [engine_check, _live] = verify_rebuild(runtime, warm)
        assert engine_check.ok and engine_check.skipped is None, engine_check
        bench.notes.append("spark result == local result, every table (checked once)")
        run("local")
        for i in range(bench.runs):
            a = run("local").events_per_second
            b = run("spark").events_per_second
            bench.record("local", a)
            bench.record("spark", b)
            bench.record("spark_vs_local", b / a)
            print(f"  round {i + 1}: local {a:,.0f} ev/s, spark {b:,.0f} ev/s", flush=True)
        spark.stop()
        runtime.close()

    bench.add("local engine into PostgreSQL", "ev/s", "local")
    bench.add("spark local[2] into PostgreSQL", "ev/s", "spark", baseline="local")
    bench.add("spark / local, per round", "x", "spark_vs_local")
    bench.add("spark: replay (tasks into stage schemas)", "s", "spark_replay_s")
    bench.add("spark: serial tail (merge in the server, finalize)", "s", "spark_serial_s")
    bench.add("server CPU per event, local", "us", "server_cpu_us_local")
    bench.add(
        "server CPU per event, spark",
        "us",
        "server_cpu_us_spark",
        baseline="server_cpu_us_local",
        note="ratio = the stages' extra cost to the server (the merge's second write)",
    )
    bench.finish()


if __name__ == "__main__":
    main()
