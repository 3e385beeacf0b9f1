"""The invoicing app's projectors and policy under ``eventlane.testing.ProjectorFixture``:
given events → rows and issued commands, no worker process; and the fixture's own promise
that a wrong projector fails with a readable diff."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from eventlane import App, EventContext, Projector, handles
from eventlane.errors import ConfigError
from eventlane.testing import Issued, ProjectorFixture, Scheduled
from example_apps.invoicing import app
from example_apps.invoicing.domain import DEADLINE_REASON, CancelUnconfirmed, Invoice, Order
from example_apps.invoicing.events import (
    Address,
    InvoiceIssued,
    InvoiceVoided,
    OrderCancelled,
    OrderConfirmed,
    OrderLine,
    OrderLineAdded,
    OrderLineRemoved,
    OrderPlaced,
    PaymentRecorded,
)
from example_apps.invoicing.projections import CONFIRM_WITHIN_ENV, deadline_key

HOME = Address("1 Main St", "Oslo", "NO")


def placed(customer: str = "c-1", *prices: int) -> OrderPlaced:
    lines = tuple(OrderLine(f"sku-{i}", 1, p) for i, p in enumerate(prices or (500,)))
    return OrderPlaced(customer, lines, HOME)


@pytest.fixture(params=["sqlite", "postgresql"])
def readmodels(request: pytest.FixtureRequest) -> str | None:
    """The read-model engine: ``None`` (SQLite) or a fresh PostgreSQL database's URL."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_url"))


def test_orders_by_status_rows(readmodels: str | None) -> None:
    with ProjectorFixture(app, "orders_by_status", readmodels=readmodels) as fx:
        fx.given(Order, "o-1", placed("c-1", 500, 250), OrderConfirmed("c-1", 750))
        fx.given(Order, "o-2", placed("c-2", 100), OrderLineAdded(OrderLine("x", 2, 50)))
        fx.given(Order, "o-3", placed("c-1", 100), OrderCancelled("changed my mind"))
        fx.given(Order, "o-4", placed("c-3", 100, 40), OrderLineRemoved("sku-0"))
        fx.then_rows(
            "orders",
            [
                {"order_id": "o-1", "status": "confirmed", "total_cents": 750, "lines": 2},
                {"order_id": "o-2", "status": "placed", "total_cents": 200, "lines": 2},
                {"order_id": "o-3", "status": "cancelled", "total_cents": 100, "lines": 1},
                {"order_id": "o-4", "status": "placed", "total_cents": 40, "lines": 1},
            ],
            order_by="order_id",
        )


def test_invoices_and_balances(readmodels: str | None) -> None:
    with ProjectorFixture(app, "customer_balances", readmodels=readmodels) as fx:
        fx.given(Invoice, "inv-1", InvoiceIssued("o-1", "c-1", 1000), PaymentRecorded(400))
        fx.given(Invoice, "inv-2", InvoiceIssued("o-2", "c-1", 300), InvoiceVoided("dup"))
        fx.then_rows(
            "customer_balances",
            [
                {
                    "customer_id": "c-1",
                    "invoiced_cents": 1300,
                    "paid_cents": 400,
                    "voided_cents": 300,
                    "invoices": 2,
                }
            ],
        )
    with ProjectorFixture(app, "invoices", readmodels=readmodels) as fx:
        fx.given(Invoice, "inv-1", InvoiceIssued("o-1", "c-1", 1000), PaymentRecorded(1000))
        fx.then_rows("invoices", [{"invoice_id": "inv-1", "status": "paid", "paid_cents": 1000}])


def test_policy_issues_one_invoice_per_confirmed_order_and_voids_on_cancel() -> None:
    with ProjectorFixture(app, "invoicing_policy") as fx:
        fx.given(Order, "o-1", placed("c-1", 700))
        fx.then_issued()  # placing an order issues nothing
        fx.when(Order, "o-1", OrderConfirmed("c-1", 700))
        fx.then_issued((Invoice, "invoice-o-1", InvoiceIssued("o-1", "c-1", 700)))
        fx.when(Order, "o-1", OrderCancelled("fraud"))
        fx.then_issued(Issued(Invoice, "invoice-o-1", InvoiceVoided("fraud")))
        # Cancelled before confirmation: there is no invoice to void, nothing is issued.
        fx.given(Order, "o-2", placed("c-2")).when(Order, "o-2", OrderCancelled("oops"))
        fx.then_issued()


def test_policy_gives_each_order_a_deadline_withdrawn_when_it_is_confirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CONFIRM_WITHIN_ENV, "90")
    with ProjectorFixture(app, "invoicing_policy") as fx:
        fx.given(Order, "o-1", placed("c-1", 700))
        fx.given(Order, "o-2", placed("c-2", 100))
        deadline = {oid: placed_at(fx, oid) + timedelta(seconds=90) for oid in ("o-1", "o-2")}
        fx.then_scheduled(
            ("confirm-o-1", CancelUnconfirmed("o-1"), deadline["o-1"]),
            Scheduled("confirm-o-2", CancelUnconfirmed("o-2"), deadline["o-2"]),
        )
        fx.when(Order, "o-1", OrderConfirmed("c-1", 700))
        fx.then_no_schedule(deadline_key("o-1"))
        fx.then_scheduled(("confirm-o-2", CancelUnconfirmed("o-2"), deadline["o-2"]))
        fx.when(Order, "o-2", OrderCancelled("changed my mind"))
        fx.then_scheduled()
        fx.then_no_schedule("confirm-o-1", "confirm-o-2")
    monkeypatch.setenv(CONFIRM_WITHIN_ENV, "0")  # no deadline
    with ProjectorFixture(app, "invoicing_policy") as fx:
        fx.given(Order, "o-1", placed("c-1", 700))
        fx.then_scheduled()


def placed_at(fx: ProjectorFixture, order_id: str) -> datetime:
    return fx.runtime.store.read("orders", order_id)[0].timestamp


def test_a_wrong_deadline_fails_with_a_readable_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIRM_WITHIN_ENV, "90")
    with ProjectorFixture(app, "invoicing_policy") as fx:
        fx.given(Order, "o-1", placed("c-1", 700))
        due = placed_at(fx, "o-1") + timedelta(seconds=90)
        with pytest.raises(AssertionError, match="pending schedules differ") as failed:
            fx.then_scheduled(("confirm-o-1", CancelUnconfirmed("o-1"), due + timedelta(1)))
        message = str(failed.value)
        assert "--- expected scheduled" in message and "+++ actual scheduled" in message
        wrong = (due + timedelta(1)).isoformat(timespec="milliseconds")
        right = due.isoformat(timespec="milliseconds")
        assert f"-confirm-o-1: CancelUnconfirmed(order_id='o-1') at {wrong}" in message
        assert f"+confirm-o-1: CancelUnconfirmed(order_id='o-1') at {right}" in message
        with pytest.raises(AssertionError, match="keys still hold pending schedules") as held:
            fx.then_no_schedule("confirm-o-1", "confirm-o-9")
        assert "-{'confirm-o-1': 'not pending', 'confirm-o-9': None}" in str(held.value)
        assert "+{'confirm-o-1': 'scheduled', 'confirm-o-9': None}" in str(held.value)


def test_the_deadline_cancels_only_an_unconfirmed_order() -> None:
    order = Order.rehydrate("o-1", [])
    order.place("c-1", [OrderLine("a", 1, 100)], HOME)
    CancelUnconfirmed("o-1")(order)
    assert order.status == "cancelled"
    assert order.pending_events[-1] == OrderCancelled(DEADLINE_REASON)
    confirmed = Order.rehydrate("o-2", [])
    confirmed.place("c-1", [OrderLine("a", 1, 100)], HOME)
    confirmed.confirm()
    CancelUnconfirmed("o-2")(confirmed)
    assert confirmed.status == "confirmed"  # a no-op: the deadline came too late


def test_policy_in_a_rebuild_issues_nothing() -> None:
    with ProjectorFixture(app, "invoicing_policy", replaying=True) as fx:
        fx.given(Order, "o-1", placed("c-1", 700), OrderConfirmed("c-1", 700))
        fx.then_issued()


class WrongOrders(Projector):
    """Deliberately wrong: counts confirmed orders' totals twice."""

    name = "wrong_orders"
    topics = ("orders",)

    def setup(self, db) -> None:  # type: ignore[no-untyped-def]
        db.execute("CREATE TABLE orders (order_id TEXT PRIMARY KEY, total INT)")

    @handles(OrderConfirmed)
    def confirmed(self, event: OrderConfirmed, ctx: EventContext) -> None:
        ctx.db.execute(
            "INSERT INTO orders VALUES (?, ?)", (ctx.aggregate_id, 2 * event.total_cents)
        )

    @handles(OrderCancelled)
    def cancelled(self, event: OrderCancelled, ctx: EventContext) -> None:
        raise RuntimeError(f"no row for {ctx.aggregate_id}")


def test_a_wrong_projector_fails_with_a_readable_diff() -> None:
    with ProjectorFixture(app, WrongOrders) as fx:
        fx.given(Order, "o-1", placed("c-1", 300), OrderConfirmed("c-1", 300))
        with pytest.raises(AssertionError) as failed:
            fx.then_rows("orders", [{"order_id": "o-1", "total": 300}])
        message = str(failed.value)
        assert "table 'orders' differs" in message
        assert "-[{'order_id': 'o-1', 'total': 300}]" in message
        assert "+[{'order_id': 'o-1', 'total': 600}]" in message


def test_a_dead_lettered_event_fails_the_fixture_with_its_error() -> None:
    with ProjectorFixture(app, WrongOrders) as fx:
        fx.given(Order, "o-1", placed("c-1", 300), OrderCancelled("x"))
        with pytest.raises(AssertionError, match=r"OrderCancelled: RuntimeError: no row for o-1"):
            fx.then_rows("orders", [])
        letters = fx.then_dead_lettered("OrderCancelled")
        assert letters[0].topic == "orders"
        fx.then_rows("orders", [])


def test_issued_is_compared_in_order_with_a_diff() -> None:
    with ProjectorFixture(app, "invoicing_policy") as fx:
        fx.given(Order, "o-1", placed("c-1", 700), OrderConfirmed("c-1", 700))
        with pytest.raises(AssertionError, match=r"issued events differ") as failed:
            fx.then_issued((Invoice, "invoice-o-1", InvoiceIssued("o-1", "c-1", 701)))
        assert "amount_cents=701" in str(failed.value)
        assert "amount_cents=700" in str(failed.value)


def test_the_fixture_leaves_nothing_behind(tmp_path: Path) -> None:
    fx = ProjectorFixture(app, "orders_by_status")
    directory = fx.directory
    fx.given(Order, "o-1", placed())
    fx.close()
    assert not directory.exists()
    kept = ProjectorFixture(app, "orders_by_status", directory=tmp_path / "fx")
    kept.given(Order, "o-1", placed())
    kept.close()
    assert (tmp_path / "fx" / "readmodels" / "orders_by_status.sqlite").exists()


def test_a_class_that_is_not_a_projector_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a projector"):
        ProjectorFixture(App("x"), dict)  # type: ignore[arg-type]
