"""The invoicing app's events: pure domain data, frozen attrs classes with wire names.

Amounts are integer cents. ``OrderPlaced`` is at schema version 2 (version 1 stored the
shipping address as one string), ``ShippingAddressChanged`` too (version 1 stored the
address in clear); the upcasters live in :mod:`.app`.

Personal data (``docs/privacy.md``): a customer's name and addresses are encrypted per
customer, so ``eventlane forget`` of a customer erases them everywhere; an order's shipping
address belongs to its customer (``customer_id`` is the subject).
"""

from __future__ import annotations

from attrs import frozen

from eventlane import DomainEvent, event, personal, subject


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


NO_ADDRESS = Address("", "", "")
"""What an erased address reads as."""


# -- customers --------------------------------------------------------------------------
@event("CustomerRegistered")
@frozen
class CustomerRegistered(DomainEvent):
    name: str = personal()
    address: Address = personal(erased=NO_ADDRESS)


@event("CustomerMoved")
@frozen
class CustomerMoved(DomainEvent):
    address: Address = personal(erased=NO_ADDRESS)


# -- orders -----------------------------------------------------------------------------
@event("OrderPlaced", version=2)
@frozen
class OrderPlaced(DomainEvent):
    customer_id: str = subject()
    lines: tuple[OrderLine, ...]
    shipping_address: Address = personal(erased=NO_ADDRESS)


@event("OrderLineAdded")
@frozen
class OrderLineAdded(DomainEvent):
    line: OrderLine


@event("OrderLineRemoved")
@frozen
class OrderLineRemoved(DomainEvent):
    sku: str


@event("ShippingAddressChanged", version=2)
@frozen
class ShippingAddressChanged(DomainEvent):
    """Version 1 stored the address in clear, without its customer; version 2 names the
    customer as the subject and encrypts the address (the upcaster lives in :mod:`.app`)."""

    customer_id: str = subject()
    address: Address = personal(erased=NO_ADDRESS)


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
