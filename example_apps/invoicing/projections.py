"""Read models of the invoicing app, and the invoicing policy.

* ``invoices``: one row per invoice (amounts in integer cents, status).
* ``customer_balances``: per customer, invoiced / paid / voided cents. A customer's invoices
  live in many partitions of the ``invoices`` topic, so its row is written from several
  partitions: the projector declares ``sum`` as its merge rule for parallel rebuilds.
* ``orders_by_status``: one row per order with its status and total.
* Every handler writes through the portable table API (``ctx.table``): the projections run
  unchanged on SQLite and on PostgreSQL read models (``App(readmodels=...)``).
* ``InvoicingPolicy``: the "invoicing microservice" of the seeds: issues exactly one invoice
  per confirmed order and voids it when the order is cancelled. Idempotent by construction:
  the invoice id is derived from the order id and ``issue``/``void`` are no-ops when done.
  It also gives every placed order a deadline: unless the order is confirmed (or cancelled)
  within :func:`confirm_within_s` seconds of being placed, the app's scheduler runs
  :class:`~example_apps.invoicing.domain.CancelUnconfirmed` on it (schedule key
  ``confirm-<order id>``, withdrawn when the order is confirmed or cancelled).
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import ClassVar

from eventlane import AggregateNotFoundError, EventContext, Projector, handles
from example_apps.invoicing import migrations as schema
from example_apps.invoicing.domain import CancelUnconfirmed, Invoice, invoice_id_for
from example_apps.invoicing.events import (
    InvoiceIssued,
    InvoiceVoided,
    OrderCancelled,
    OrderConfirmed,
    OrderLineAdded,
    OrderLineRemoved,
    OrderPlaced,
    PaymentRecorded,
)


class Invoices(Projector):
    name = "invoices"
    topics = ("invoices",)
    migrations = schema.invoices

    @handles(InvoiceIssued)
    def issued(self, event: InvoiceIssued, ctx: EventContext) -> None:
        ctx.table("invoices").insert(
            {
                "invoice_id": ctx.aggregate_id,
                "order_id": event.order_id,
                "customer_id": event.customer_id,
                "amount_cents": event.amount_cents,
                "paid_cents": 0,
                "status": "open",
            }
        )

    @handles(PaymentRecorded)
    def paid(self, event: PaymentRecorded, ctx: EventContext) -> None:
        invoices = ctx.table("invoices")
        row = invoices.get(invoice_id=ctx.aggregate_id)
        if row is None:
            raise LookupError(f"payment for invoice {ctx.aggregate_id} before it was issued")
        paid = row["paid_cents"] + event.amount_cents
        status = "paid" if paid >= row["amount_cents"] else row["status"]
        invoices.update(
            {"invoice_id": ctx.aggregate_id}, set={"paid_cents": paid, "status": status}
        )

    @handles(InvoiceVoided)
    def voided(self, event: InvoiceVoided, ctx: EventContext) -> None:
        ctx.table("invoices").update({"invoice_id": ctx.aggregate_id}, set={"status": "void"})


class CustomerBalances(Projector):
    name = "customer_balances"
    topics = ("invoices",)
    migrations = schema.customer_balances
    merge_rules: ClassVar[dict[str, str]] = {"customer_balances": "sum"}

    def _add(
        self,
        ctx: EventContext,
        customer_id: str,
        invoiced: int = 0,
        paid: int = 0,
        voided: int = 0,
        count: int = 0,
    ) -> None:
        ctx.table("customer_balances").upsert(
            {
                "customer_id": customer_id,
                "invoiced_cents": invoiced,
                "paid_cents": paid,
                "voided_cents": voided,
                "invoices": count,
            },
            key=("customer_id",),
            add=("invoiced_cents", "paid_cents", "voided_cents", "invoices"),
        )

    @handles(InvoiceIssued)
    def issued(self, event: InvoiceIssued, ctx: EventContext) -> None:
        ctx.table("invoice_owners").insert(
            {
                "invoice_id": ctx.aggregate_id,
                "customer_id": event.customer_id,
                "amount_cents": event.amount_cents,
            }
        )
        self._add(ctx, event.customer_id, invoiced=event.amount_cents, count=1)

    @handles(PaymentRecorded)
    def paid(self, event: PaymentRecorded, ctx: EventContext) -> None:
        self._add(ctx, _customer_of(ctx), paid=event.amount_cents)

    @handles(InvoiceVoided)
    def voided(self, event: InvoiceVoided, ctx: EventContext) -> None:
        self._add(ctx, _customer_of(ctx), voided=_amount_of(ctx))


def _invoice_issue(ctx: EventContext) -> tuple[str, int]:
    """(customer, amount) of the invoice an event belongs to. All of an invoice's events are
    in one partition (keyed by invoice id), so this lookup also works in a rebuild that
    replays partitions in parallel."""
    row = ctx.table("invoice_owners").get(invoice_id=ctx.aggregate_id)
    if row is None:
        raise LookupError(f"invoice {ctx.aggregate_id} seen before it was issued")
    return str(row["customer_id"]), int(row["amount_cents"])


def _customer_of(ctx: EventContext) -> str:
    return _invoice_issue(ctx)[0]


def _amount_of(ctx: EventContext) -> int:
    return _invoice_issue(ctx)[1]


class OrdersByStatus(Projector):
    name = "orders_by_status"
    topics = ("orders",)
    migrations = schema.orders_by_status

    @handles(OrderPlaced)
    def placed(self, event: OrderPlaced, ctx: EventContext) -> None:
        total = sum(line.total_cents for line in event.lines)
        ctx.table("orders").insert(
            {
                "order_id": ctx.aggregate_id,
                "customer_id": event.customer_id,
                "status": "placed",
                "total_cents": total,
                "lines": len(event.lines),
            }
        )
        lines = ctx.table("order_lines")
        for line in event.lines:
            lines.insert(
                {"order_id": ctx.aggregate_id, "sku": line.sku, "total_cents": line.total_cents}
            )

    @handles(OrderLineAdded)
    def line_added(self, event: OrderLineAdded, ctx: EventContext) -> None:
        ctx.table("orders").update(
            {"order_id": ctx.aggregate_id},
            add={"total_cents": event.line.total_cents, "lines": 1},
        )
        ctx.table("order_lines").insert(
            {
                "order_id": ctx.aggregate_id,
                "sku": event.line.sku,
                "total_cents": event.line.total_cents,
            }
        )

    @handles(OrderLineRemoved)
    def line_removed(self, event: OrderLineRemoved, ctx: EventContext) -> None:
        lines = ctx.table("order_lines")
        line = lines.get(order_id=ctx.aggregate_id, sku=event.sku)
        if line is not None:  # the amount of the line removed comes off the total
            ctx.table("orders").update(
                {"order_id": ctx.aggregate_id},
                add={"total_cents": -line["total_cents"], "lines": -1},
            )
            lines.delete(order_id=ctx.aggregate_id, sku=event.sku)

    @handles(OrderConfirmed)
    def confirmed(self, event: OrderConfirmed, ctx: EventContext) -> None:
        ctx.table("orders").update(
            {"order_id": ctx.aggregate_id},
            set={"status": "confirmed", "total_cents": event.total_cents},
        )

    @handles(OrderCancelled)
    def cancelled(self, event: OrderCancelled, ctx: EventContext) -> None:
        ctx.table("orders").update({"order_id": ctx.aggregate_id}, set={"status": "cancelled"})


CONFIRM_WITHIN_ENV = "INVOICING_CONFIRM_WITHIN_S"
CONFIRM_WITHIN_DEFAULT_S = 30 * 60


def confirm_within_s() -> float:
    """How long a placed order may stay unconfirmed before its deadline cancels it, in
    seconds: ``$INVOICING_CONFIRM_WITHIN_S`` (read by the policy's workers; the demo uses a
    few seconds), default 30 minutes; ``0``: no deadline.

    >>> confirm_within_s() > 0
    True
    """
    text = os.environ.get(CONFIRM_WITHIN_ENV, "").strip()
    return float(text) if text else float(CONFIRM_WITHIN_DEFAULT_S)


def deadline_key(order_id: str) -> str:
    """The schedule key of an order's deadline (one per order)."""
    return f"confirm-{order_id}"


class InvoicingPolicy(Projector):
    """Orders in, exactly one invoice per confirmed order out (a process manager); a
    deadline per placed order (cancel it if it is not confirmed in time)."""

    name = "invoicing_policy"
    topics = ("orders",)
    policy = True
    concurrency = 8
    """Orders are independent: up to 8 are handled at once, each order's events in order
    (per-key parallelism); the invoices they issue share fsyncs (group commit)."""

    @handles(OrderPlaced)
    def placed(self, event: OrderPlaced, ctx: EventContext) -> None:
        # The moment comes from the event, so a redelivery schedules the same deadline.
        within = confirm_within_s()
        if within > 0:
            ctx.schedule(
                CancelUnconfirmed(ctx.aggregate_id),
                at=ctx.envelope.timestamp + timedelta(seconds=within),
                key=deadline_key(ctx.aggregate_id),
            )

    @handles(OrderConfirmed)
    def confirmed(self, event: OrderConfirmed, ctx: EventContext) -> None:
        # Confirmed in time: the deadline is withdrawn (were it to fire anyway, a cancel
        # coming too late, the command is a no-op on a confirmed order).
        ctx.cancel_schedule(deadline_key(ctx.aggregate_id))
        # At most once per confirmation (the invoice's events carry its id as causation id);
        # nothing is issued while rebuilding.
        ctx.issue(
            Invoice,
            invoice_id_for(ctx.aggregate_id),
            lambda invoice: invoice.issue(ctx.aggregate_id, event.customer_id, event.total_cents),
        )

    @handles(OrderCancelled)
    def cancelled(self, event: OrderCancelled, ctx: EventContext) -> None:
        ctx.cancel_schedule(deadline_key(ctx.aggregate_id))
        # Cancelled before it was confirmed: there is no invoice to void.
        with contextlib.suppress(AggregateNotFoundError):
            ctx.issue(
                Invoice,
                invoice_id_for(ctx.aggregate_id),
                lambda invoice: invoice.void(event.reason),
                create=False,
            )
