"""The invoicing app's deadline (issue 32 item 4) with real processes on the real clock:
``eventlane run`` of the policy and the scheduler, orders that are confirmed in time, some
never, some confirmed right at their deadline (a race the aggregate decides), some cancelled
by the customer.

Oracle: folds of the raw log (orders, invoices, the schedules topic) and the client's log of
its confirmations (acknowledged or refused): no order is both confirmed and cancelled by its
deadline; every confirmed order has exactly one invoice, a deadline-cancelled one none;
every order neither confirmed nor cancelled by its customer is cancelled by its deadline
exactly once, no earlier than its moment; an acknowledged confirmation is in the log, a
refused one was refused because the deadline came first; no schedule is left pending, none
fired twice.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from eventlane.app import Runtime
from example_apps.invoicing.domain import (
    DEADLINE_REASON,
    InvoicingError,
    Order,
    invoice_id_for,
)
from example_apps.invoicing.events import Address, OrderLine
from example_apps.invoicing.projections import CONFIRM_WITHIN_ENV, deadline_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_invoicing_e2e import (
    APP,
    lag,
    raw_events,
    runtime,  # noqa: F401  (the fixture)
)

ROOT = Path(__file__).resolve().parents[2]
CLI = "from eventlane.cli import main; main(prog_name='eventlane')"
WITHIN_S = 2.0
HOME = Address("1 Main St", "Oslo", "NO")


def place(rt: Runtime, order_id: str) -> None:
    rt.execute(
        Order,
        order_id,
        lambda o: o.place("c-1", [OrderLine("sku-1", 1, 500)], HOME),
        create=True,
    )


def moment(e: dict[str, Any]) -> float:
    return datetime.fromisoformat(e["timestamp"]).timestamp()


def wait_for(cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def deadline_cancelled(rt: Runtime, order_id: str) -> bool:
    return any(
        e["aggregate_id"] == order_id
        and e["type"] == "OrderCancelled"
        and e["data"]["reason"] == DEADLINE_REASON
        for e in raw_events(rt.log, "orders")
    )


def test_orders_not_confirmed_in_time_are_cancelled_once_and_never_invoiced(
    runtime: Runtime,  # noqa: F811
    tmp_path: Path,
) -> None:
    rt = runtime
    proc = subprocess.Popen(
        [
            *(sys.executable, "-c", CLI, "run", APP, "--only", "invoicing_policy"),
            *("--only", "scheduler", "--session-timeout-ms", "3000", "--data", str(rt.log.path)),
        ],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "EVENTLANE_LOG_LEVEL": "warning",
            CONFIRM_WITHIN_ENV: str(WITHIN_S),
        },
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "run.log").open("wb"),
    )
    rng = random.Random(32)
    plans = {
        f"order-{i:03d}": rng.choice(["confirm", "never", "late", "cancel"]) for i in range(32)
    }
    outcomes: dict[str, str] = {}  # the client's log of its confirmations
    try:
        # Both processes up: a warm-up order's deadline has been scheduled and has fired.
        place(rt, "warm-up")
        wait_for(lambda: deadline_cancelled(rt, "warm-up"), "the warm-up order's deadline")
        placed_at: dict[str, float] = {}
        for oid, plan in plans.items():
            place(rt, oid)
            placed_at[oid] = time.monotonic()
            if plan == "confirm":
                rt.execute(Order, oid, lambda o: o.confirm())
                outcomes[oid] = "acknowledged"
            elif plan == "cancel":
                rt.execute(Order, oid, lambda o: o.cancel("changed my mind"))
        late = sorted(
            (placed_at[oid] + WITHIN_S + rng.uniform(-0.6, 0.6), oid)
            for oid, plan in plans.items()
            if plan == "late"
        )
        for when, oid in late:  # confirmations around the deadline: either may win
            time.sleep(max(0.0, when - time.monotonic()))
            try:
                rt.execute(Order, oid, lambda o: o.confirm())
                outcomes[oid] = "acknowledged"
            except InvoicingError as refused:
                assert "is cancelled" in str(refused)
                outcomes[oid] = "refused"

        def settled() -> bool:
            events = raw_events(rt.log, "orders")
            ended = {e["aggregate_id"] for e in events if e["type"] != "OrderPlaced"}
            return ended >= set(plans) and lag(rt, "invoicing_policy") == 0

        wait_for(settled, "every order confirmed or cancelled, the policy caught up")
        time.sleep(0.5)  # a wrong second firing would have shown by now
        wait_for(lambda: lag(rt, "invoicing_policy") == 0, "the policy caught up again")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]

    orders: dict[str, list[dict[str, Any]]] = {}
    for e in raw_events(rt.log, "orders"):
        orders.setdefault(e["aggregate_id"], []).append(e)
    issued = Counter(
        e["aggregate_id"] for e in raw_events(rt.log, "invoices") if e["type"] == "InvoiceIssued"
    )
    states: dict[str, str] = {}
    fired: Counter[str] = Counter()
    for body in raw_events(rt.log, "invoicing.schedules"):
        key = deadline_key(body["data"]["order_id"])
        states[key] = body["state"]
        fired[key] += body["state"] == "fired"
    timed_out = confirmed = 0
    for oid, plan in plans.items():
        kinds = Counter(e["type"] for e in orders[oid])
        by_deadline = [
            e
            for e in orders[oid]
            if e["type"] == "OrderCancelled" and e["data"]["reason"] == DEADLINE_REASON
        ]
        placed_event = orders[oid][0]
        assert placed_event["type"] == "OrderPlaced"
        assert not (kinds["OrderConfirmed"] and by_deadline), (oid, kinds)
        assert kinds["OrderCancelled"] <= 1 and kinds["OrderConfirmed"] <= 1, (oid, kinds)
        assert issued[invoice_id_for(oid)] == kinds["OrderConfirmed"], (oid, plan)
        if plan in ("never", "late") and not kinds["OrderConfirmed"]:
            assert len(by_deadline) == 1, (oid, plan, kinds)
        if by_deadline:
            timed_out += 1
            assert moment(by_deadline[0]) >= moment(placed_event) + WITHIN_S - 0.001, oid
            assert states[deadline_key(oid)] == "fired", oid
        else:
            assert states[deadline_key(oid)] in ("cancelled", "fired"), oid
        assert fired[deadline_key(oid)] <= 1, oid
        if outcomes.get(oid) == "acknowledged":
            confirmed += 1
            assert kinds["OrderConfirmed"] == 1, oid
        elif outcomes.get(oid) == "refused":
            assert by_deadline, oid
        if plan == "cancel":
            assert not by_deadline and kinds["OrderCancelled"] == 1, oid
    assert timed_out >= 4 and confirmed >= 4, (timed_out, confirmed)
    print(
        f"deadlines: {confirmed} confirmed, {timed_out} cancelled at their deadline,"
        f" {sum(v == 'refused' for v in outcomes.values())} late confirmations refused",
        file=sys.stderr,
    )
