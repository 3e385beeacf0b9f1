"""The invoicing app's events: pure domain data, frozen attrs classes with wire names.

Amounts are integer cents. ``OrderPlaced`` is at schema version 2 (version 1 stored the
shipping address as one string); the upcaster lives in :mod:`.app`.
"""

from __future__ import annotations

from attrs import frozen

from framework import DomainEvent, event


@frozen
class OrderLine:
    sku: str
    quantity: int
    unit_price_cents: int

    @property
    def total_cents(self) -> int:
        return self.quantity * self.unit_price_cents


@frozen
class Address:
    street: str
    city: str
    country: str


# -- customers --------------------------------------------------------------------------
@event("CustomerRegistered")
@frozen
class CustomerRegistered(DomainEvent):
    name: str
    address: Address


@event("CustomerMoved")
@frozen
class CustomerMoved(DomainEvent):
    address: Address


# -- orders -----------------------------------------------------------------------------
@event("OrderPlaced", version=2)
@frozen
class OrderPlaced(DomainEvent):
    customer_id: str
    lines: tuple[OrderLine, ...]
    shipping_address: Address


@event("OrderLineAdded")
@frozen
class OrderLineAdded(DomainEvent):
    line: OrderLine


@event("OrderLineRemoved")
@frozen
class OrderLineRemoved(DomainEvent):
    sku: str


@event("ShippingAddressChanged")
@frozen
class ShippingAddressChanged(DomainEvent):
    address: Address


@event("OrderConfirmed")
@frozen
class OrderConfirmed(DomainEvent):
    customer_id: str
    total_cents: int


@event("OrderCancelled")
@frozen
class OrderCancelled(DomainEvent):
    reason: str


# -- invoices ---------------------------------------------------------------------------
@event("InvoiceIssued")
@frozen
class InvoiceIssued(DomainEvent):
    order_id: str
    customer_id: str
    amount_cents: int


@event("PaymentRecorded")
@frozen
class PaymentRecorded(DomainEvent):
    amount_cents: int


@event("InvoiceVoided")
@frozen
class InvoiceVoided(DomainEvent):
    reason: str
