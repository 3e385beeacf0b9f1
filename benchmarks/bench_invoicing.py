"""End-to-end figures of the invoicing app on a large history (issue 7's benchmark).

    .venv/bin/python benchmarks/bench_invoicing.py                 # 1M events, 5 runs
    .venv/bin/python benchmarks/bench_invoicing.py --quick         # 100k events, smoke run
    .venv/bin/python benchmarks/bench_invoicing.py --policy        # the deadline's cost

``--policy`` (issue 32: the orders' deadlines) measures only the invoicing policy's catch-up
from a cold start on a smaller history (``--events``, default 12k), one worker, with the
deadline (a schedule appended per placed order, withdrawn per confirmed one) and without it
(``$INVOICING_CONFIRM_WITHIN_S=0``), interleaved (the order alternates each round): medians
of the rounds and the ratio on/off. ``--before DIR`` adds a third series, the deadline on with
the code in ``DIR`` (e.g. ``git archive COMMIT | tar -x -C DIR``: the policy's workers run
from there), to compare a change before/after in the same rounds.

The history (orders placed, confirmed, cancelled; invoices issued, paid, voided) is built
once with the app's own codec and bulk-appended, then cached under /tmp. Each run measures,
from a cold start (fresh read-model files, new worker processes), the time until the
``invoices`` and ``orders_by_status`` projectors have caught up with 1 and then 2 worker
processes each, and rebuilds ``invoices`` with the local engine and with Spark (local[2],
session start excluded). The same-run baseline is a plain loop reading the same records,
``orjson.loads`` of each value and ``executemany`` into SQLite in one transaction per
10,000 rows: the least any projector must do. Figures: the median of the runs, and the
ratio against the baseline's median.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eventlane.codec import Envelope
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import Runner, open_readmodel, readmodel_path
from eventlane.replay.rebuild import rebuild
from eventlane.replay.session import spark_session
from example_apps.invoicing import app
from example_apps.invoicing.domain import invoice_id_for
from example_apps.invoicing.events import (
    Address,
    InvoiceIssued,
    InvoiceVoided,
    OrderCancelled,
    OrderConfirmed,
    OrderLine,
    OrderPlaced,
    PaymentRecorded,
)
from example_apps.invoicing.projections import CONFIRM_WITHIN_ENV

APP = "example_apps.invoicing:app"
PROJECTORS = ("invoices", "orders_by_status")


def build_history(data: Path, events: int, seed: int = 7) -> int:
    """Bulk-append about ``events`` invoicing events; return how many were written."""
    rng = random.Random(seed)
    written = 0
    with app.open(data) as rt:
        codec = rt.codec
        pending: dict[
            tuple[str, int], list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]
        ] = {}

        def add(topic: str, aggregate_id: str, version: int, event: object) -> None:
            key, value, headers = codec.encode(Envelope(event, aggregate_id, version))
            p = partition_for_key(key, rt.log.partition_count(topic))
            pending.setdefault((topic, p), []).append((key, value, tuple(headers), None))

        def flush() -> None:
            for (topic, p), records in pending.items():
                rt.log.append(topic, p, records)
            pending.clear()

        i = 0
        address = Address("1 Main St", "Oslo", "NO")
        while written < events:
            oid = f"bench-order-{i:08d}"
            lines = tuple(
                OrderLine(f"sku-{k}", rng.randint(1, 5), rng.choice([199, 999, 4999]))
                for k in range(rng.randint(1, 3))
            )
            customer = f"bench-customer-{rng.randrange(max(1, events // 20)):07d}"
            add("orders", oid, 1, OrderPlaced(customer, lines, address))
            written += 1
            if rng.random() < 0.8:
                total = sum(line.total_cents for line in lines)
                add("orders", oid, 2, OrderConfirmed(customer, total))
                iid = invoice_id_for(oid)
                add("invoices", iid, 1, InvoiceIssued(oid, customer, total))
                written += 2
                version = 1
                if rng.random() < 0.6:
                    version += 1
                    add("invoices", iid, version, PaymentRecorded(total))
                    written += 1
                if rng.random() < 0.1:
                    add("orders", oid, 3, OrderCancelled("bench"))
                    add("invoices", iid, version + 1, InvoiceVoided("order cancelled"))
                    written += 2
            i += 1
            if i % 5000 == 0:
                flush()
        flush()
    return written


def topic_records(data: Path, topics: tuple[str, ...]) -> int:
    with app.open(data) as rt:
        return sum(
            rt.log.offsets(t, p).hwm for t in topics for p in range(rt.log.partition_count(t))
        )


def baseline(data: Path, topic: str, scratch: Path) -> float:
    """Records/s of a plain read + orjson decode + executemany loop over ``topic``."""
    db_path = scratch / "baseline.sqlite"
    if db_path.exists():
        db_path.unlink()
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (id TEXT PRIMARY KEY, kind TEXT, body TEXT) WITHOUT ROWID")
    count = 0
    started = time.perf_counter()
    with app.open(data) as rt:
        for p in range(rt.log.partition_count(topic)):
            offset, hwm, cursor = 0, rt.log.offsets(topic, p).hwm, None
            while offset < hwm:
                records, cursor = rt.log.read(topic, p, offset, cursor=cursor)
                rows = []
                for r in records:
                    doc = orjson.loads(r.value or b"{}")
                    rows.append((doc["event_id"], doc["type"], r.key))
                db.execute("BEGIN")
                db.executemany("INSERT OR REPLACE INTO t VALUES (?, ?, ?)", rows)
                db.execute("COMMIT")
                count += len(records)
                offset = records[-1].offset + 1
    seconds = time.perf_counter() - started
    db.close()
    return count / seconds


def catch_up(data: Path, name: str, workers: int) -> float:
    """Events/s of ``name`` from a cold start with ``workers`` processes until lag 0."""
    path = readmodel_path(data, name)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    topics = app.projector(name).topics
    total = topic_records(data, topics)
    with app.open(data) as rt:
        open_readmodel(rt, name, migrate=True).close()
        runner = Runner(APP, name, data, workers=workers, session_timeout_ms=5000)
        started = time.perf_counter()
        runner.start()
        try:
            while True:
                with sqlite3.connect(path, timeout=30) as db:
                    done = db.execute(
                        "SELECT coalesce(sum(next_offset), 0) FROM _eventlane_positions"
                    ).fetchone()[0]
                if done >= total:
                    break
                time.sleep(0.05)
            seconds = time.perf_counter() - started
        finally:
            runner.stop()
    return total / seconds


def policy_catch_up(data: Path, deadlines: bool, code: Path | None = None) -> float:
    """Events/s of the invoicing policy (1 worker) from a cold start until lag 0, with or
    without the orders' deadlines; its schedules topic is emptied first. ``code``: a tree
    of the framework's code the worker runs (``python -m`` puts its cwd first on the path)."""
    name = "invoicing_policy"
    path = readmodel_path(data, name)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    total = topic_records(data, ("orders",))
    env = {**os.environ, CONFIRM_WITHIN_ENV: "1800" if deadlines else "0"}
    here = Path.cwd()
    if code is not None:
        env["PYTHONPATH"] = str(code)
    with app.open(data) as rt:
        if rt.log.topic_exists("invoicing.schedules"):
            rt.log.delete_topic("invoicing.schedules")
        open_readmodel(rt, name, migrate=True).close()
        runner = Runner(APP, name, data, workers=1, session_timeout_ms=5000, env=env)
        started = time.perf_counter()
        if code is not None:
            os.chdir(code)
        try:
            runner.start()
        finally:
            os.chdir(here)
        try:
            while True:
                with (
                    contextlib.suppress(sqlite3.OperationalError),
                    sqlite3.connect(path, timeout=30) as db,
                ):
                    done = db.execute(
                        "SELECT coalesce(sum(next_offset), 0) FROM _eventlane_positions"
                    ).fetchone()[0]
                    if done >= total:
                        break
                time.sleep(0.05)
            seconds = time.perf_counter() - started
        finally:
            runner.stop()
    return total / seconds


def policy_main(events: int, runs: int, before: Path | None = None) -> None:
    root = Path(tempfile.gettempdir()) / f"eventlane-bench-invoicing-{events}"
    data = root / "data"
    if not (root / "built").exists():
        shutil.rmtree(root, ignore_errors=True)
        (root / "built").parent.mkdir(parents=True, exist_ok=True)
        (root / "built").write_text(str(build_history(data, events)))
    orders = topic_records(data, ("orders",))
    kinds: list[str] = ["on", "off", *(["before"] if before is not None else [])]
    series: dict[str, list[float]] = {k: [] for k in kinds}
    for run in range(runs):
        for kind in kinds if run % 2 == 0 else kinds[::-1]:
            code = before if kind == "before" else None
            series[kind].append(policy_catch_up(data, kind != "off", code))
        print(
            f"round {run + 1}/{runs}: "
            + ", ".join(f"{k} {series[k][-1]:,.0f}" for k in kinds)
            + " events/s",
            flush=True,
        )
    on, off = statistics.median(series["on"]), statistics.median(series["off"])
    print(
        f"\ninvoicing policy catch-up, 1 worker, {orders:,} order events;"
        f" medians of {runs} interleaved rounds (events/s)\n"
    )
    print("| figure | median | min | max |\n|---|---|---|---|")
    labels = {
        "off": "deadlines off",
        "on": "deadlines on (a schedule per order)",
        "before": f"deadlines on, the code in {before}",
    }
    for kind in kinds:
        values = series[kind]
        print(
            f"| {labels[kind]} | {statistics.median(values):,.0f} | {min(values):,.0f} |"
            f" {max(values):,.0f} |"
        )
    print(f"\nratio on/off: {on / off:.2f}x")
    if before is not None:
        was = statistics.median(series["before"])
        print(
            f"ratio on/off with the code in {before}: {was / off:.2f}x;"
            f" on now / on then: {on / was:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="100k events, 5 runs")
    parser.add_argument(
        "--policy",
        action="store_true",
        help="only the policy's catch-up with and without deadlines",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="with --policy: also the deadline on with the code in this tree",
    )
    args = parser.parse_args()
    if args.policy:
        os.environ.setdefault("EVENTLANE_LOG_LEVEL", "error")
        events = 12_000 if args.events == 1_000_000 else args.events
        policy_main(events, max(5, args.runs), args.before)
        return
    events = 100_000 if args.quick else args.events
    runs = max(5, args.runs)
    os.environ.setdefault("EVENTLANE_LOG_LEVEL", "error")
    root = Path(tempfile.gettempdir()) / f"eventlane-bench-invoicing-{events}"
    data = root / "data"
    if not (root / "built").exists():
        shutil.rmtree(root, ignore_errors=True)
        started = time.perf_counter()
        n = build_history(data, events)
        (root / "built").write_text(str(n))
        print(f"built {n:,} events in {time.perf_counter() - started:.1f} s under {root}")
    n = int((root / "built").read_text())
    series: dict[str, list[float]] = {}
    spark = spark_session(master="local[2]")
    try:
        for run in range(runs):
            series.setdefault("baseline orders (read + orjson + executemany)", []).append(
                baseline(data, "orders", root)
            )
            for name in PROJECTORS:
                for workers in (1, 2):
                    series.setdefault(f"{name} catch-up, {workers} worker(s)", []).append(
                        catch_up(data, name, workers)
                    )
            for engine in ("local", "spark"):
                with app.open(data) as rt:
                    result = rebuild(
                        rt,
                        "invoices",
                        engine=engine,
                        spark=spark,
                        output=root / f"invoices.{engine}.sqlite",
                    )
                series.setdefault(f"rebuild invoices, {engine}", []).append(
                    result.events_per_second
                )
            print(f"run {run + 1}/{runs} done", flush=True)
    finally:
        spark.stop()
    base = statistics.median(series["baseline orders (read + orjson + executemany)"])
    print(f"\ninvoicing workload: {n:,} events; medians of {runs} runs (events/s)\n")
    print("| figure | median | min | max | ratio to baseline |\n|---|---|---|---|---|")
    for name, values in series.items():
        med = statistics.median(values)
        print(
            f"| {name} | {med:,.0f} | {min(values):,.0f} | {max(values):,.0f} | {med / base:.2f} |"
        )
    local = statistics.median(series["rebuild invoices, local"])
    spark_rate = statistics.median(series["rebuild invoices, spark"])
    print(f"\nSpark local[2] / local engine (invoices rebuild): {spark_rate / local:.2f}x")


if __name__ == "__main__":
    main()
