"""The invoicing app end to end, with real worker processes, kill -9 and rebalances.

The read models are compared with folds of the topics computed here, independently, from
the raw JSON values of the records (never through the framework's codec or projectors).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventlane.app import Runtime
from eventlane.log import Log
from eventlane.projection import Runner, open_readmodel, readmodel_path
from example_apps.invoicing import app
from example_apps.invoicing.domain import Invoice, invoice_id_for
from example_apps.invoicing.queries import ask_invoice_for, serve_queries
from example_apps.invoicing.workload import Workload, pay, payment_for

APP = "example_apps.invoicing:app"
PROJECTORS = ("invoices", "customer_balances", "orders_by_status", "invoicing_policy")


def raw_events(log: Log, topic: str) -> list[dict[str, Any]]:
    """Every event of ``topic`` as its raw JSON, in per-partition offset order."""
    out = []
    for p in range(log.partition_count(topic)):
        marks = log.offsets(topic, p)
        offset, cursor = marks.lwm, None
        while offset < marks.hwm:
            records, cursor = log.read(topic, p, offset, cursor=cursor)
            if not records:
                break
            out.extend(orjson.loads(r.value or b"null") for r in records)
            offset = records[-1].offset + 1
    return out


def fold_orders(events: list[dict[str, Any]]) -> dict[str, tuple[str, str, int, int]]:
    """order_id -> (customer, status, total_cents, lines), from raw OrderX events."""
    orders: dict[str, dict[str, Any]] = {}
    for e in events:
        oid, data, kind = e["aggregate_id"], e["data"], e["type"]
        if kind == "OrderPlaced":
            lines = {ln["sku"]: ln["quantity"] * ln["unit_price_cents"] for ln in data["lines"]}
            orders[oid] = {"customer": data["customer_id"], "status": "placed", "lines": lines}
        elif kind == "OrderLineAdded":
            line = data["line"]
            orders[oid]["lines"][line["sku"]] = line["quantity"] * line["unit_price_cents"]
        elif kind == "OrderLineRemoved":
            del orders[oid]["lines"][data["sku"]]
        elif kind == "OrderConfirmed":
            orders[oid]["status"] = "confirmed"
            assert data["total_cents"] == sum(orders[oid]["lines"].values())
        elif kind == "OrderCancelled":
            orders[oid]["status"] = "cancelled"
    return {
        oid: (o["customer"], o["status"], sum(o["lines"].values()), len(o["lines"]))
        for oid, o in orders.items()
    }


def fold_invoices(events: list[dict[str, Any]]) -> dict[str, tuple[str, str, int, int, str]]:
    """invoice_id -> (order, customer, amount, paid, status), from raw invoice events."""
    invoices: dict[str, list[Any]] = {}
    for e in events:
        iid, data, kind = e["aggregate_id"], e["data"], e["type"]
        if kind == "InvoiceIssued":
            assert iid not in invoices, f"{iid} issued twice"
            invoices[iid] = [data["order_id"], data["customer_id"], data["amount_cents"], 0, "open"]
        elif kind == "PaymentRecorded":
            inv = invoices[iid]
            inv[3] += data["amount_cents"]
            if inv[3] >= inv[2]:
                inv[4] = "paid"
        elif kind == "InvoiceVoided":
            invoices[iid][4] = "void"
    return {iid: tuple(v) for iid, v in invoices.items()}  # type: ignore[misc]


def fold_balances(
    invoices: dict[str, tuple[str, str, int, int, str]],
) -> dict[str, tuple[int, int, int, int]]:
    balances: dict[str, list[int]] = {}
    for _order, customer, amount, paid, status in invoices.values():
        b = balances.setdefault(customer, [0, 0, 0, 0])
        b[0] += amount
        b[1] += paid
        b[2] += amount if status == "void" else 0
        b[3] += 1
    return {c: tuple(b) for c, b in balances.items()}  # type: ignore[misc]


def lag(runtime: Runtime, name: str) -> int:
    path = readmodel_path(runtime.log.path, name)
    with sqlite3.connect(path, timeout=30) as db:
        positions = {
            (t, p): o
            for t, p, o in db.execute(
                "SELECT topic, partition, next_offset FROM _eventlane_positions"
            )
        }
    total = 0
    for topic in app.projector(name).topics:
        for p in range(runtime.log.partition_count(topic)):
            marks = runtime.log.offsets(topic, p)
            total += marks.hwm - positions.get((topic, p), marks.lwm)
    return total


def wait_caught_up(
    runtime: Runtime, runners: dict[str, Runner], names: tuple[str, ...], timeout: float = 180.0
) -> None:
    deadline = time.monotonic() + timeout
    while any(lag(runtime, n) for n in names):
        assert time.monotonic() < deadline, {n: lag(runtime, n) for n in names}
        for r in runners.values():
            r.supervise_once()
        time.sleep(0.2)


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    with app.open(tmp_path / "data") as rt:
        for name in app.projectors:
            open_readmodel(rt, name, migrate=True).close()
        yield rt


def test_exactly_one_invoice_per_confirmed_order_under_kills_and_rebalances(
    runtime: Runtime,
) -> None:
    data = runtime.log.path
    runners = {
        name: Runner(APP, name, data, workers=2, restart=True, session_timeout_ms=2000)
        for name in PROJECTORS
    }
    for r in runners.values():
        r.start()
    try:
        workload = Workload(orders=150, seed=11)
        commands = list(workload.commands())
        kills = {
            len(commands) // 3: "invoicing_policy",
            len(commands) // 2: "invoices",
            2 * len(commands) // 3: "invoicing_policy",
        }
        for i, command in enumerate(commands):
            runtime.execute(
                command.cls, command.aggregate_id, command.action, create=command.create
            )
            if i in kills:  # kill -9 a worker mid-run: a rebalance, then a replacement joins
                victim = runners[kills[i]].procs[0]
                os.kill(victim.pid, signal.SIGKILL)
            if i % 50 == 0:
                for r in runners.values():
                    r.supervise_once()
        wait_caught_up(runtime, runners, ("invoicing_policy", "invoices"))
        with sqlite3.connect(readmodel_path(data, "invoices")) as db:
            open_invoices = db.execute(
                "SELECT invoice_id, amount_cents FROM invoices WHERE status = 'open'"
            ).fetchall()
        for invoice_id, amount in open_invoices:
            cents = payment_for(invoice_id, amount, 11)
            if cents:
                runtime.execute(Invoice, invoice_id, lambda inv, c=cents: pay(inv, c))
        wait_caught_up(runtime, runners, PROJECTORS)
        deadline = time.monotonic() + 30
        while sum(r.restarts for r in runners.values()) < 3:  # every killed worker replaced
            assert time.monotonic() < deadline
            for r in runners.values():
                r.supervise_once()
            time.sleep(0.1)
    finally:
        for r in runners.values():
            r.stop()

    orders = fold_orders(raw_events(runtime.log, "orders"))
    invoice_events = raw_events(runtime.log, "invoices")
    issued = Counter(e["aggregate_id"] for e in invoice_events if e["type"] == "InvoiceIssued")
    assert all(n == 1 for n in issued.values()), "an invoice was issued twice"
    invoices = fold_invoices(invoice_events)
    confirmed_ever = {
        e["aggregate_id"]
        for e in raw_events(runtime.log, "orders")
        if e["type"] == "OrderConfirmed"
    }
    # Exactly one invoice per confirmed order, and none for other orders.
    assert {inv[0] for inv in invoices.values()} == confirmed_ever
    assert set(invoices) == {invoice_id_for(o) for o in confirmed_ever}
    # Voided exactly when the order was cancelled after its confirmation.
    for iid, (order_id, *_rest, status) in invoices.items():
        assert (status == "void") == (orders[order_id][1] == "cancelled"), iid

    with sqlite3.connect(readmodel_path(data, "invoices")) as db:
        live = {
            r[0]: tuple(r[1:])
            for r in db.execute(
                "SELECT invoice_id, order_id, customer_id, amount_cents, paid_cents, status"
                " FROM invoices"
            )
        }
    assert live == invoices
    with sqlite3.connect(readmodel_path(data, "customer_balances")) as db:
        balances = {
            r[0]: tuple(r[1:])
            for r in db.execute(
                "SELECT customer_id, invoiced_cents, paid_cents, voided_cents, invoices"
                " FROM customer_balances"
            )
        }
    assert balances == fold_balances(invoices)
    with sqlite3.connect(readmodel_path(data, "orders_by_status")) as db:
        by_status = {
            r[0]: tuple(r[1:])
            for r in db.execute(
                "SELECT order_id, customer_id, status, total_cents, lines FROM orders"
            )
        }
    assert by_status == orders
    for name in PROJECTORS:
        with sqlite3.connect(readmodel_path(data, name)) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert db.execute("SELECT count(*) FROM _eventlane_dead_letters").fetchone() == (0,)


def test_request_reply_answers_and_times_out_cleanly(runtime: Runtime) -> None:
    log = runtime.log
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no reply"):
        ask_invoice_for(log, "order-nobody", timeout=1.5)
    waited = time.monotonic() - started
    assert 1.4 <= waited < 6.0, waited

    readmodel = open_readmodel(runtime, "invoices", migrate=True)
    readmodel.conn.execute(
        "INSERT INTO invoices VALUES ('invoice-o-1', 'o-1', 'c-1', 500, 0, 'open')"
    )
    readmodel.close()
    stop = threading.Event()
    responder = threading.Thread(
        target=serve_queries,
        args=(log, str(readmodel_path(log.path, "invoices")), stop),
        kwargs={"session_timeout_ms": 2000},
        daemon=True,
    )
    responder.start()
    try:
        answer = ask_invoice_for(log, "o-1", timeout=20)
        assert answer == {
            "order_id": "o-1",
            "invoice": {
                "invoice_id": "invoice-o-1",
                "amount_cents": 500,
                "paid_cents": 0,
                "status": "open",
            },
        }
        assert ask_invoice_for(log, "o-404", timeout=20) == {"order_id": "o-404", "invoice": None}
    finally:
        stop.set()
        responder.join(15)
    assert not responder.is_alive()
