"""Sample events shared by the codec tests: every supported field type, and a type with history.

``OrderPlaced`` is at version 3. Its history, as stored in ``golden/``:

* v1 was called ``OrderCreated``: ``customer_name``; lines with ``qty`` and ``price``;
* v2 renamed it ``OrderPlaced``: ``customer`` object; lines with ``quantity``/``unit_price``;
* v3 added ``currency`` (old events: EUR) and ``coupon`` (old events: none).
"""

from __future__ import annotations

import enum
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID

from attrs import frozen

from eventlane.codec import Envelope, EventRegistry
from eventlane.domain import Aggregate, DomainEvent, applies, event


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Currency(enum.StrEnum):
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


@event("Counted")
@frozen
class Counted(DomainEvent):
    sku: str
    price: Money
    at: datetime


class Tally(Aggregate):
    """An aggregate whose state uses nested attrs classes, enums, tuples and dicts."""

    topic: ClassVar[str] = "tallies"
    snapshot_version: ClassVar[int] = 2

    counts: dict[str, int]
    last: tuple[str, Money] | None
    seen_at: list[datetime]
    currency: Currency | None

    def init_state(self) -> None:
        self.counts = {}
        self.last = None
        self.seen_at = []
        self.currency = None

    def count(self, sku: str, price: Money, at: datetime) -> None:
        self.record_that(Counted(sku, price, at))

    @applies(Counted)
    def _counted(self, event: Counted) -> None:
        self.counts[event.sku] = self.counts.get(event.sku, 0) + 1
        self.last = (event.sku, event.price)
        self.seen_at.append(event.at)
        self.currency = event.price.currency


GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> bytes:
    """A checked-in record value (a trailing newline added by an editor is ignored)."""
    return (GOLDEN / name).read_bytes().removesuffix(b"\n")


EXPECTED_ORDER = Envelope(
    OrderPlaced(
        order_id="order-7",
        customer=Customer("Ada", None),
        lines=(Line("A-1", 2, Decimal("9.90")), Line("B-2", 1, Decimal("1E+2"))),
        placed_at=datetime(2024, 5, 1, 14, 30, 45, tzinfo=timezone(timedelta(hours=2))),
        currency=Currency.EUR,
        coupon=None,
    ),
    aggregate_id="order-7",
    aggregate_version=1,
    event_id=UUID("0d3f6c2e-5b1a-4c8e-9f7d-2a6b4e8c1f30"),
    timestamp=datetime(2024, 5, 1, 12, 30, 45, 123456, tzinfo=UTC),
    correlation_id="req-42",
)
"""What every file in ``golden/`` decodes to."""


def sample_everything() -> Everything:
    return Everything(
        text="t",
        number=1,
        ratio=1.0,
        flag=False,
        amount=Decimal("1.10"),
        at=datetime(2024, 1, 1, tzinfo=UTC),
        day=date(2024, 1, 1),
        ident=UUID(int=1),
        color=Color.RED,
        priority=Priority.LOW,
        currency=Currency.EUR,
        blob=b"\x00",
        money=Money(Decimal("0"), Currency.USD),
        maybe_money=None,
        maybe_int=None,
        ints=(),
        pair=("a", Decimal("1E+3")),
        lines=[],
        tags=[],
        counts={},
        prices={},
    )
