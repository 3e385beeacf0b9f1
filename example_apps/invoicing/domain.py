"""Aggregates of the invoicing app: Customer, Order, Invoice.

Command methods check invariants and raise :class:`InvoicingError` subclasses; apply
methods change state. An invoice's id is derived from its order's (``invoice_id_for``), so
"issue the invoice of order X" is naturally idempotent: the invoice either exists or not.

:class:`CancelUnconfirmed` is a command that is data (``eventlane.domain.commands``): the
deadline the invoicing policy schedules for every placed order. It cancels the order only
while it is still placed (unconfirmed), so it is a no-op once the order was confirmed or
cancelled: an order is never both confirmed and cancelled by its deadline, whichever of the
confirmation and the deadline comes first (the aggregate's version check orders them).
"""

from __future__ import annotations

from typing import ClassVar

from attrs import frozen

from eventlane import Aggregate, DomainError, applies
from eventlane.domain import Command, command
from example_apps.invoicing.events import (
    Address,
    CustomerMoved,
    CustomerRegistered,
    InvoiceIssued,
    InvoiceVoided,
    OrderCancelled,
    OrderConfirmed,
    OrderLine,
    OrderLineAdded,
    OrderLineRemoved,
    OrderPlaced,
    PaymentRecorded,
    ShippingAddressChanged,
)

DEADLINE_REASON = "not confirmed in time"
"""The reason of an ``OrderCancelled`` written by an order's deadline."""


class InvoicingError(DomainError):
    """A command broke an invariant of the invoicing domain."""


def invoice_id_for(order_id: str) -> str:
    """The one invoice an order can have.

    >>> invoice_id_for("order-7")
    'invoice-order-7'
    """
    return f"invoice-{order_id}"


class Customer(Aggregate):
    topic: ClassVar[str] = "customers"
    name: str
    address: Address | None

    def init_state(self) -> None:
        self.name = ""
        self.address = None

    def register(self, name: str, address: Address) -> None:
        if self.version:
            raise InvoicingError(f"customer {self.id} is already registered")
        self.record_that(CustomerRegistered(name, address))

    def move(self, address: Address) -> None:
        if not self.version:
            raise InvoicingError(f"customer {self.id} is not registered")
        if address != self.address:
            self.record_that(CustomerMoved(address))

    @applies(CustomerRegistered)
    def _registered(self, event: CustomerRegistered) -> None:
        self.name = event.name
        self.address = event.address

    @applies(CustomerMoved)
    def _moved(self, event: CustomerMoved) -> None:
        self.address = event.address


class Order(Aggregate):
    topic: ClassVar[str] = "orders"
    snapshot_every: ClassVar[int | None] = 50
    snapshot_subject: ClassVar[str | None] = "customer_id"  # its shipping address is personal
    customer_id: str
    lines: dict[str, OrderLine]
    shipping_address: Address | None
    status: str

    def init_state(self) -> None:
        self.customer_id = ""
        self.lines = {}
        self.shipping_address = None
        self.status = "new"

    @property
    def total_cents(self) -> int:
        return sum(line.total_cents for line in self.lines.values())

    def _require_open(self) -> None:
        if self.status != "placed":
            raise InvoicingError(f"order {self.id} is {self.status}, not open for changes")

    def place(self, customer_id: str, lines: list[OrderLine], address: Address) -> None:
        if self.status != "new":
            raise InvoicingError(f"order {self.id} was already placed")
        if not lines:
            raise InvoicingError("an order needs at least one line")
        if any(line.quantity <= 0 or line.unit_price_cents < 0 for line in lines):
            raise InvoicingError("quantities must be positive and prices non-negative")
        self.record_that(OrderPlaced(customer_id, tuple(lines), address))

    def add_line(self, line: OrderLine) -> None:
        self._require_open()
        if line.sku in self.lines:
            raise InvoicingError(f"order {self.id} already has a line for {line.sku}")
        self.record_that(OrderLineAdded(line))

    def remove_line(self, sku: str) -> None:
        self._require_open()
        if sku not in self.lines:
            raise InvoicingError(f"order {self.id} has no line for {sku}")
        if len(self.lines) == 1:
            raise InvoicingError("an order needs at least one line; cancel it instead")
        self.record_that(OrderLineRemoved(sku))

    def change_shipping_address(self, address: Address) -> None:
        self._require_open()
        self.record_that(ShippingAddressChanged(self.customer_id, address))

    def confirm(self) -> None:
        self._require_open()
        self.record_that(OrderConfirmed(self.customer_id, self.total_cents))

    def cancel(self, reason: str) -> None:
        if self.status not in ("placed", "confirmed"):
            raise InvoicingError(f"order {self.id} is {self.status}; it cannot be cancelled")
        self.record_that(OrderCancelled(reason))

    def cancel_unconfirmed(self) -> None:
        """The deadline: cancel the order if it is still unconfirmed; else a no-op."""
        if self.status == "placed":
            self.record_that(OrderCancelled(DEADLINE_REASON))

    @applies(OrderPlaced)
    def _placed(self, event: OrderPlaced) -> None:
        self.customer_id = event.customer_id
        self.lines = {line.sku: line for line in event.lines}
        self.shipping_address = event.shipping_address
        self.status = "placed"

    @applies(OrderLineAdded)
    def _line_added(self, event: OrderLineAdded) -> None:
        self.lines = {**self.lines, event.line.sku: event.line}

    @applies(OrderLineRemoved)
    def _line_removed(self, event: OrderLineRemoved) -> None:
        self.lines = {sku: line for sku, line in self.lines.items() if sku != event.sku}

    @applies(ShippingAddressChanged)
    def _address_changed(self, event: ShippingAddressChanged) -> None:
        self.shipping_address = event.address

    @applies(OrderConfirmed)
    def _confirmed(self, event: OrderConfirmed) -> None:
        self.status = "confirmed"

    @applies(OrderCancelled)
    def _cancelled(self, event: OrderCancelled) -> None:
        self.status = "cancelled"


class Invoice(Aggregate):
    topic: ClassVar[str] = "invoices"
    order_id: str
    customer_id: str
    amount_cents: int
    paid_cents: int
    status: str

    def init_state(self) -> None:
        self.order_id = ""
        self.customer_id = ""
        self.amount_cents = 0
        self.paid_cents = 0
        self.status = "none"

    def issue(self, order_id: str, customer_id: str, amount_cents: int) -> None:
        """Issue the invoice; a no-op if it was already issued (idempotent)."""
        if self.status != "none":
            return
        self.record_that(InvoiceIssued(order_id, customer_id, amount_cents))

    def record_payment(self, amount_cents: int) -> None:
        if self.status not in ("open", "paid"):
            raise InvoicingError(f"invoice {self.id} is {self.status}; it takes no payment")
        if amount_cents <= 0:
            raise InvoicingError("a payment must be positive")
        self.record_that(PaymentRecorded(amount_cents))

    def void(self, reason: str) -> None:
        """Void the invoice; a no-op if it is already void or was never issued."""
        if self.status in ("none", "void"):
            return
        self.record_that(InvoiceVoided(reason))

    @applies(InvoiceIssued)
    def _issued(self, event: InvoiceIssued) -> None:
        self.order_id = event.order_id
        self.customer_id = event.customer_id
        self.amount_cents = event.amount_cents
        self.status = "open"

    @applies(PaymentRecorded)
    def _paid(self, event: PaymentRecorded) -> None:
        self.paid_cents += event.amount_cents
        if self.paid_cents >= self.amount_cents:
            self.status = "paid"

    @applies(InvoiceVoided)
    def _voided(self, event: InvoiceVoided) -> None:
        self.status = "void"


@command("CancelUnconfirmedOrder")
@frozen
class CancelUnconfirmed(Command[Order]):
    """The deadline of an order: cancel it if nobody confirmed it in time (scheduled by
    :class:`~example_apps.invoicing.projections.InvoicingPolicy`)."""

    order_id: str
    aggregate: ClassVar[type[Aggregate]] = Order

    def target(self) -> str:
        return self.order_id

    def __call__(self, order: Order) -> None:
        order.cancel_unconfirmed()
