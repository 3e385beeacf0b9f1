"""Sample events shared by the codec tests: every supported field type, and a type with history.

``OrderPlaced`` is at version 3. Its history, as stored in ``golden/``:

* v1 was called ``OrderCreated``: ``customer_name``; lines with ``qty`` and ``price``;
* v2 renamed it ``OrderPlaced``: ``customer`` object; lines with ``quantity``/``unit_price``;
* v3 added ``currency`` (old events: EUR) and ``coupon`` (old events: none).
"""

from __future__ import annotations

import enum
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from attrs import frozen

from framework.codec import EventRegistry
from framework.domain import DomainEvent, event


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Currency(str, enum.Enum):
    EUR = "EUR"
    USD = "USD"


@frozen
class Money:
    amount: Decimal
    currency: Currency


@frozen
class Line:
    sku: str
    quantity: int
    unit_price: Decimal


@frozen
class Customer:
    name: str
    email: str | None


@event("Everything", version=1)
@frozen
class Everything(DomainEvent):
    """One field of every supported kind."""

    text: str
    number: int
    ratio: float
    flag: bool
    amount: Decimal
    at: datetime
    day: date
    ident: UUID
    color: Color
    priority: Priority
    currency: Currency
    blob: bytes
    money: Money
    maybe_money: Money | None
    maybe_int: int | None
    ints: tuple[int, ...]
    pair: tuple[str, Decimal]
    lines: list[Line]
    tags: list[str]
    counts: dict[str, int]
    prices: dict[str, Money]


@event("OrderPlaced", version=3)
@frozen
class OrderPlaced(DomainEvent):
    order_id: str
    customer: Customer
    lines: tuple[Line, ...]
    placed_at: datetime
    currency: Currency
    coupon: str | None


def order_placed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "order_id": data["order_id"],
        "customer": {"name": data["customer_name"], "email": None},
        "lines": [
            {"sku": line["sku"], "quantity": line["qty"], "unit_price": line["price"]}
            for line in data["lines"]
        ],
        "placed_at": data["placed_at"],
    }


def order_placed_v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "currency": "EUR", "coupon": None}


def order_registry() -> EventRegistry:
    registry = EventRegistry()
    registry.register(OrderPlaced, Everything)
    registry.add_alias("OrderCreated", "OrderPlaced")
    registry.add_upcaster("OrderPlaced", 1, order_placed_v1_to_v2)
    registry.add_upcaster("OrderPlaced", 2, order_placed_v2_to_v3)
    registry.validate()
    return registry
