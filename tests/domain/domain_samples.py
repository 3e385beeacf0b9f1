"""A small shopping-cart domain used by the domain and snapshot tests."""

from __future__ import annotations

from decimal import Decimal
from typing import ClassVar

from attrs import frozen

from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.errors import DomainError


@event("CartOpened")
@frozen
class CartOpened(DomainEvent):
    owner: str


@event("ItemAdded", version=2)
@frozen
class ItemAdded(DomainEvent):
    sku: str
    price: Decimal


@event("CartCheckedOut")
@frozen
class CartCheckedOut(DomainEvent):
    total: Decimal


@event("CartAbandoned")
@frozen
class CartAbandoned(DomainEvent):
    """Recorded by a buggy command: Cart has no apply method for it."""


class CartError(DomainError):
    pass


class Cart(Aggregate):
    topic: ClassVar[str] = "carts"
    snapshot_every: ClassVar[int | None] = 3
    snapshot_version: ClassVar[int] = 2

    owner: str | None
    items: list[tuple[str, Decimal]]
    checked_out: bool

    def init_state(self) -> None:
        self.owner = None
        self.items = []
        self.checked_out = False

    @classmethod
    def open(cls, cart_id: str, owner: str) -> Cart:
        cart = cls(cart_id)
        cart.record_that(CartOpened(owner))
        return cart

    def add(self, sku: str, price: Decimal) -> None:
        if self.owner is None:
            raise CartError("cart is not open")
        if self.checked_out:
            raise CartError("cart is checked out")
        if price <= 0:
            raise CartError(f"price must be positive: {price}")
        self.record_that(ItemAdded(sku, price))

    def check_out(self) -> None:
        if not self.items:
            raise CartError("cannot check out an empty cart")
        if self.checked_out:
            raise CartError("already checked out")
        self.record_that(CartCheckedOut(sum((p for _, p in self.items), Decimal(0))))

    def abandon(self) -> None:
        self.record_that(CartAbandoned())

    @property
    def total(self) -> Decimal:
        return sum((price for _, price in self.items), Decimal(0))

    @applies(CartOpened)
    def _opened(self, event: CartOpened) -> None:
        self.owner = event.owner

    @applies(ItemAdded)
    def _item_added(self, event: ItemAdded) -> None:
        self.items.append((event.sku, event.price))

    @applies(CartCheckedOut)
    def _checked_out(self, event: CartCheckedOut) -> None:
        self.checked_out = True
