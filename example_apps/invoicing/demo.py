"""The invoicing demo: the README's main job (``eventlane demo invoicing``).

What it shows, in order: a seeded workload of customers and orders; the invoicing policy
and the projectors running as consumer groups of worker processes, with the app's scheduler;
one worker killed with SIGKILL midway, its partitions moving to the others and a replacement
joining; live lag; the orders nobody confirmed within a few seconds cancelled by their
deadline (never invoiced); payments; a request/reply query; a Spark rebuild of ``invoices``
verified equal to the live read model; and a summary. Run it twice on the same data
directory and the second run continues (new ids), it does not duplicate.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from eventlane import Runtime
from eventlane.log import Log, TopicPartition
from eventlane.projection import Runner, open_readmodel, readmodel_path
from example_apps.invoicing.app import app
from example_apps.invoicing.domain import DEADLINE_REASON, Invoice, InvoicingError
from example_apps.invoicing.projections import CONFIRM_WITHIN_ENV
from example_apps.invoicing.queries import ask_invoice_for, serve_queries
from example_apps.invoicing.workload import Workload, pay, payment_for

APP_SPEC = "example_apps.invoicing:app"
EVENT_TOPICS = ("customers", "orders", "invoices")
CONFIRM_WITHIN_S = 5.0
"""The demo's deadline: an order not confirmed within 5 s is cancelled (the app's default is
30 minutes; ``$INVOICING_CONFIRM_WITHIN_S``)."""
SCHEDULER = "scheduler"


def _lag(runtime: Runtime, name: str) -> int:
    """Records of the projector's topics not yet applied to its read model."""
    path = runtime.log.local.readmodel(name)
    positions: dict[TopicPartition, int] = {}
    if path.exists():
        with (
            contextlib.closing(sqlite3.connect(path, timeout=30)) as db,
            contextlib.suppress(sqlite3.OperationalError),
        ):
            positions = {
                TopicPartition(t, p): o
                for t, p, o in db.execute(
                    "SELECT topic, partition, next_offset FROM _eventlane_positions"
                )
            }
    total = 0
    for topic in app.projector(name).topic_names:
        for p in range(runtime.log.partition_count(topic)):
            marks = runtime.log.offsets(topic, p)
            total += marks.hwm - max(positions.get(TopicPartition(topic, p), marks.lwm), marks.lwm)
    return total


def _count_events(log: Log) -> dict[str, int]:
    """Fold the raw JSON of the event topics (independently of any read model)."""
    counts = {"events": 0, "orders": 0, "confirmed": 0}
    for topic in EVENT_TOPICS:
        for p in range(log.partition_count(topic)):
            marks = log.offsets(topic, p)
            offset, cursor = marks.lwm, None
            while offset < marks.hwm:
                records, cursor = log.read(topic, p, offset, cursor=cursor)
                if not records:
                    break
                for r in records:
                    counts["events"] += 1
                    kind = orjson.loads(r.value or b"{}").get("type")
                    counts["orders"] += kind == "OrderPlaced"
                    counts["confirmed"] += kind == "OrderConfirmed"
                offset = records[-1].offset + 1
    return counts


def deadline_outcome(log: Log, prefix: str) -> dict[str, int]:
    """Fold the raw orders and invoices of the orders whose ids start with ``prefix``: how
    many are still open (placed, neither confirmed nor cancelled), how many were cancelled
    by their deadline, and how many were both invoiced and cancelled by their deadline
    (the invariant: none)."""
    status: dict[str, str] = {}
    for r in _raw(log, "orders"):
        doc = orjson.loads(r.value or b"{}")
        oid, kind = doc.get("aggregate_id", ""), doc.get("type")
        if not oid.startswith(prefix):
            continue
        if kind == "OrderPlaced":
            status[oid] = "open"
        elif kind == "OrderConfirmed":
            status[oid] = "confirmed"
        elif kind == "OrderCancelled":
            by_deadline = doc["data"].get("reason") == DEADLINE_REASON
            status[oid] = "deadline" if by_deadline else "cancelled"
    invoiced = {
        orjson.loads(r.value or b"{}")["data"]["order_id"]
        for r in _raw(log, "invoices")
        if b'"InvoiceIssued"' in (r.value or b"")
    }
    expired = {oid for oid, st in status.items() if st == "deadline"}
    return {
        "open": sum(st == "open" for st in status.values()),
        "deadline_cancelled": len(expired),
        "invoiced_and_expired": len(expired & invoiced),
    }


def _raw(log: Log, topic: str) -> Iterator[Any]:
    for p in range(log.partition_count(topic)):
        marks = log.offsets(topic, p)
        offset, cursor = marks.lwm, None
        while offset < marks.hwm:
            records, cursor = log.read(topic, p, offset, cursor=cursor)
            if not records:
                break
            yield from records
            offset = records[-1].offset + 1


def _next_run(data: Path) -> int:
    marker = data / "invoicing-demo.json"
    runs = orjson.loads(marker.read_bytes())["runs"] if marker.exists() else 0
    return int(runs) + 1


def _record_run(data: Path, run: int) -> None:
    (data / "invoicing-demo.json").write_bytes(orjson.dumps({"runs": run}))


def run_demo(
    data: Path,
    *,
    orders: int = 2000,
    workers: int = 2,
    seed: int = 7,
    spark: bool = True,
    console: Console | None = None,
    rebuild: Callable[..., Any] | None = None,
    confirm_within_s: float = CONFIRM_WITHIN_S,
) -> dict[str, Any]:
    """Run the demo; return the summary figures (also printed as a table)."""
    console = console or Console()
    data.mkdir(parents=True, exist_ok=True)
    run = _next_run(data)
    summary: dict[str, Any] = {"run": run}
    with app.open(data) as runtime:
        for name in app.projectors:  # eventlane migrate: create / evolve the read models
            open_readmodel(runtime, name, migrate=True).close()
        console.print(f"[bold]eventlane invoicing demo[/] — run {run}, data in {data}")
        env = {**os.environ, CONFIRM_WITHIN_ENV: str(confirm_within_s)}
        # each runner holds its group (as `eventlane run` does): a worker killed with -9
        # has its member leave as soon as it is reaped, its partitions move at once
        runners = {
            name: Runner(
                APP_SPEC,
                name,
                data,
                workers=workers,
                restart=True,
                env=env,
                coordinator=runtime.group_coordinator(name),
            )
            for name in app.projectors
        }
        runners[SCHEDULER] = Runner(  # eventlane schedules run: fires the deadlines
            APP_SPEC,
            SCHEDULER,
            data,
            workers=1,
            restart=True,
            env=env,
            argv=("schedules", "run", APP_SPEC),
            coordinator=runtime.group_coordinator(),
        )
        for runner in runners.values():
            runner.start()
        console.print(
            f"started {workers} worker process(es) for each of {', '.join(app.projectors)},"
            f" and the scheduler (orders not confirmed within {confirm_within_s:g} s are"
            " cancelled)"
        )
        try:
            workload = Workload(orders=orders, seed=seed, run=run)
            commands = list(workload.commands())
            started = time.perf_counter()
            killed = None
            policy = runners["invoicing_policy"]
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                task = progress.add_task("commands", total=len(commands))
                refused = 0
                for i, command in enumerate(commands):
                    try:
                        runtime.execute(
                            command.cls,
                            command.aggregate_id,
                            command.action,
                            create=command.create,
                        )
                    except InvoicingError:  # its deadline came first (a stalled machine)
                        refused += 1
                    progress.advance(task)
                    if (  # from halfway on, once the victim has its partitions
                        killed is None
                        and i >= len(commands) // 2
                        and i % 20 == 0
                        and policy.joined(victim := policy.procs[0])
                    ):
                        os.kill(victim.pid, signal.SIGKILL)
                        killed = victim.pid
                        progress.console.print(
                            f"[red]kill -9[/] invoicing_policy worker pid {killed}: its"
                            " partitions move to the survivors; a replacement joins"
                        )
                    if i % 200 == 0:
                        for runner in runners.values():
                            runner.supervise_once()
            command_seconds = time.perf_counter() - started
            summary["commands_per_s"] = len(commands) / command_seconds
            _wait_for_lag(runtime, runners, console, ("invoicing_policy",))
            invoices_db = readmodel_path(data, "invoices")
            _wait_for_lag(runtime, runners, console, ("invoices",))
            console.print(f"recorded {pay_open_invoices(runtime, invoices_db, run, seed)} payments")
            projected_from = time.perf_counter()
            _wait_for_lag(runtime, runners, console, tuple(app.projectors))
            summary["catch_up_s"] = time.perf_counter() - projected_from
            summary["deadline"] = _wait_for_deadlines(
                runtime, runners, console, f"r{run}-", confirm_within_s
            )
            summary["deadline"]["refused"] = refused
            summary["confirm_within_s"] = confirm_within_s
            summary["restarts"] = sum(r.restarts for r in runners.values())
            ask_one(runtime, invoices_db, console)
            summary["handed_over"] = sum(len(r.handed_over) for r in runners.values())
        finally:
            for runner in runners.values():
                runner.stop()
                if runner.coordinator is not None:
                    runner.coordinator.close()
        counts = _count_events(runtime.log)
        with contextlib.closing(sqlite3.connect(readmodel_path(data, "invoices"))) as db:
            invoices = db.execute("SELECT count(*) FROM invoices").fetchone()[0]
        summary.update(
            counts, invoices=invoices, lag={name: _lag(runtime, name) for name in app.projectors}
        )
        if spark and rebuild is not None:
            summary["rebuild"] = rebuild(runtime, "invoices", console)
        _record_run(data, run)
    _print_summary(console, summary)
    console.print(
        f"Look at it in a browser: eventlane console --data {data} {APP_SPEC}", soft_wrap=True
    )
    console.print(
        f"Serve it over HTTP: eventlane invoicing serve-http --data {data} (OpenAPI at"
        " http://127.0.0.1:8000/docs; docs/web.md)",
        soft_wrap=True,
    )
    return summary


def _wait_for_deadlines(
    runtime: Runtime,
    runners: dict[str, Runner],
    console: Console,
    prefix: str,
    within_s: float,
    timeout: float = 120.0,
) -> dict[str, int]:
    """Wait until every order of this run that nobody confirmed or cancelled has been
    cancelled by its deadline, and the projectors have caught up with that."""
    deadline = time.monotonic() + within_s + timeout
    with console.status(f"waiting for the deadlines of unconfirmed orders ({within_s:g} s)"):
        while (outcome := deadline_outcome(runtime.log, prefix))["open"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"orders still open after their deadline: {outcome}")
            for runner in runners.values():
                runner.supervise_once()
            time.sleep(0.2)
    _wait_for_lag(runtime, runners, console, tuple(app.projectors))
    return deadline_outcome(runtime.log, prefix)


def pay_open_invoices(runtime: Runtime, invoices_db: Path, run: int, seed: int) -> int:
    """Pay the open invoices of run ``run`` as the workload says; how many were paid."""
    with contextlib.closing(sqlite3.connect(invoices_db, timeout=30)) as db:
        open_invoices = db.execute(
            "SELECT invoice_id, amount_cents FROM invoices WHERE status = 'open' AND"
            " invoice_id LIKE ?",
            (f"invoice-r{run}-%",),
        ).fetchall()
    paid = 0
    for invoice_id, amount in open_invoices:
        cents = payment_for(invoice_id, amount, seed)
        if cents:
            runtime.execute(Invoice, invoice_id, functools.partial(pay, amount_cents=cents))
            paid += 1
    return paid


def ask_one(runtime: Runtime, invoices_db: Path, console: Console) -> None:
    """Serve queries from the invoices read model in a thread and ask one (request/reply)
    for the first invoiced order (the workload cancels some orders: those have none)."""
    with contextlib.closing(sqlite3.connect(f"file:{invoices_db}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT order_id FROM invoices ORDER BY order_id LIMIT 1").fetchone()
    if row is None:
        return
    order_id = str(row[0])
    stop = threading.Event()
    responder = threading.Thread(
        target=serve_queries,
        args=(runtime.log, str(invoices_db), stop),
        kwargs={"session_timeout_ms": 3000},
        daemon=True,
    )
    responder.start()
    answer = ask_invoice_for(runtime.log, order_id, timeout=15)
    console.print(f"request/reply: invoice for {order_id} → {answer['invoice']}")
    stop.set()
    responder.join(10)


def _wait_for_lag(
    runtime: Runtime,
    runners: dict[str, Runner],
    console: Console,
    names: tuple[str, ...],
    timeout: float = 300.0,
) -> None:
    deadline = time.monotonic() + timeout
    with Live(console=console, transient=True) as live:
        while True:
            lags = {name: _lag(runtime, name) for name in names}
            table = Table("projector", "lag", "workers", title="waiting for the projectors")
            for name, lag in lags.items():
                table.add_row(name, str(lag), str(len(runners[name].procs)))
            live.update(table)
            if all(lag == 0 for lag in lags.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"projectors still lagging after {timeout} s: {lags}")
            for runner in runners.values():
                runner.supervise_once()
            time.sleep(0.2)


def _print_summary(console: Console, summary: dict[str, Any]) -> None:
    table = Table("figure", "value", title="invoicing demo summary")
    table.add_row("events in the log", str(summary["events"]))
    table.add_row("orders placed", str(summary["orders"]))
    table.add_row("orders confirmed", str(summary["confirmed"]))
    ok = summary["invoices"] == summary["confirmed"]
    table.add_row(
        "invoices (= confirmed orders)",
        f"{summary['invoices']} [{'green' if ok else 'red'}]{'✓' if ok else '✗'}[/]",
    )
    for name, lag in summary["lag"].items():
        table.add_row(f"lag of {name}", str(lag))
    if "deadline" in summary:
        d = summary["deadline"]
        ok = d["open"] == 0 and d["invoiced_and_expired"] == 0
        table.add_row(
            f"orders cancelled by their deadline (not confirmed within"
            f" {summary['confirm_within_s']:g} s)",
            f"{d['deadline_cancelled']} [{'green' if ok else 'red'}]{'✓' if ok else '✗'}[/]",
        )
        table.add_row("… of them invoiced (must be 0)", str(d["invoiced_and_expired"]))
        if d.get("refused"):
            table.add_row("late confirmations refused (the deadline came first)", str(d["refused"]))
    table.add_row("workers replaced after kill -9", str(summary.get("restarts", 0)))
    if "handed_over" in summary:  # without it the partitions wait for the session timeout
        table.add_row("… their partitions moved at once", str(summary["handed_over"]))
    table.add_row("commands/s (load, run, save with fsync)", f"{summary['commands_per_s']:,.0f}")
    table.add_row("catch-up after the last command (s)", f"{summary['catch_up_s']:.1f}")
    if "rebuild" in summary:
        rebuilt = summary["rebuild"]
        table.add_row(
            "Spark rebuild of invoices",
            "identical ✓" if rebuilt.get("identical") else "DIFFERENT ✗",
        )
        if "events" in rebuilt:
            table.add_row(
                "Spark rebuild (session start excluded)",
                f"{rebuilt['events']:,} events in {rebuilt['rebuild_s']:.1f} s",
            )
    table.add_row("HTTP API (FastAPI, docs/web.md)", "eventlane invoicing serve-http")
    console.print(table)
