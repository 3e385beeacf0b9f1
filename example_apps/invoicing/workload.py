"""A seeded, deterministic workload for the invoicing app.

``Workload(seed, run)`` yields the same commands for the same seed every time: customers
register (and some move), orders are placed with 1 to 4 lines, some change (lines added or
removed, address changed), most are confirmed, some cancelled. ``run`` namespaces the ids so
a second run on the same data directory continues instead of colliding.

Payments need invoices, which the invoicing policy issues asynchronously:
:func:`payments` decides deterministically which open invoices get paid, and how much.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from example_apps.invoicing.domain import Customer, Invoice, Order
from example_apps.invoicing.events import Address, OrderLine

CITIES = [
    ("Oslo", "NO"),
    ("Lyon", "FR"),
    ("Porto", "PT"),
    ("Graz", "AT"),
    ("Turku", "FI"),
    ("Ghent", "BE"),
    ("Malmo", "SE"),
    ("Cork", "IE"),
]
SKUS = [f"sku-{i:03d}" for i in range(40)]


class Command(NamedTuple):
    """One command: run ``action`` on aggregate ``cls``/``aggregate_id`` (create if new)."""

    cls: type[Any]
    aggregate_id: str
    action: Callable[[Any], None]
    create: bool
    label: str


class Totals(NamedTuple):
    customers: int
    orders: int
    confirmed: int
    cancelled_after_confirm: int
    cancelled_before_confirm: int


class Workload:
    """The command stream of one run (see the module docstring)."""

    def __init__(self, *, orders: int, seed: int = 7, run: int = 1) -> None:
        self.orders = orders
        self.seed = seed
        self.run = run
        self.customers = max(1, orders // 5)

    def _address(self, rng: random.Random) -> Address:
        city, country = rng.choice(CITIES)
        return Address(
            f"{rng.randint(1, 200)} {rng.choice(['Main', 'Mill', 'Lake'])} St", city, country
        )

    def _line(self, rng: random.Random, exclude: set[str]) -> OrderLine:
        sku = rng.choice([s for s in SKUS if s not in exclude])
        return OrderLine(sku, rng.randint(1, 5), rng.choice([199, 450, 999, 1250, 4999]))

    def customer_id(self, i: int) -> str:
        return f"r{self.run}-customer-{i:06d}"

    def order_id(self, i: int) -> str:
        return f"r{self.run}-order-{i:07d}"

    def commands(self) -> Iterator[Command]:
        """Every command of the run, in a deterministic order."""
        rng = random.Random(f"{self.seed}/{self.run}")
        for i in range(self.customers):
            name = f"Customer {i}"
            address = self._address(rng)
            yield Command(
                Customer,
                self.customer_id(i),
                lambda c, n=name, a=address: c.register(n, a),
                True,
                "register",
            )
        for i in range(self.orders):
            oid = self.order_id(i)
            customer = self.customer_id(rng.randrange(self.customers))
            lines: list[OrderLine] = []
            for _ in range(rng.randint(1, 4)):
                lines.append(self._line(rng, {line.sku for line in lines}))
            address = self._address(rng)
            yield Command(
                Order,
                oid,
                lambda o, c=customer, ls=lines, a=address: o.place(c, ls, a),
                True,
                "place",
            )
            if rng.random() < 0.3:
                extra = self._line(rng, {line.sku for line in lines})
                yield Command(Order, oid, lambda o, x=extra: o.add_line(x), False, "add_line")
            if len(lines) > 1 and rng.random() < 0.1:
                sku = lines[0].sku
                yield Command(Order, oid, lambda o, s=sku: o.remove_line(s), False, "remove_line")
            if rng.random() < 0.15:
                moved = self._address(rng)
                yield Command(
                    Order,
                    oid,
                    lambda o, a=moved: o.change_shipping_address(a),
                    False,
                    "change_address",
                )
            roll = rng.random()
            if roll < 0.8:
                yield Command(Order, oid, lambda o: o.confirm(), False, "confirm")
                if rng.random() < 0.1:
                    yield Command(
                        Order,
                        oid,
                        lambda o: o.cancel("customer changed mind"),
                        False,
                        "cancel_confirmed",
                    )
            elif roll < 0.9:
                yield Command(Order, oid, lambda o: o.cancel("abandoned"), False, "cancel_placed")
            if rng.random() < 0.05:
                who = self.customer_id(rng.randrange(self.customers))
                moved = self._address(rng)
                yield Command(Customer, who, lambda c, a=moved: c.move(a), False, "move")

    def totals(self) -> Totals:
        """What the run will produce, counted from its commands."""
        counts: dict[str, int] = {}
        for command in self.commands():
            counts[command.label] = counts.get(command.label, 0) + 1
        return Totals(
            self.customers,
            self.orders,
            counts.get("confirm", 0),
            counts.get("cancel_confirmed", 0),
            counts.get("cancel_placed", 0),
        )


def payment_for(invoice_id: str, amount_cents: int, seed: int) -> int:
    """How much of an invoice the workload pays: all, half, or nothing (deterministic).

    >>> payment_for("invoice-r1-order-0000001", 1000, 7) in (0, 500, 1000)
    True
    """
    roll = random.Random(f"{seed}/{invoice_id}").random()
    if roll < 0.6:
        return amount_cents
    if roll < 0.8:
        return amount_cents // 2
    return 0


def pay(invoice: Invoice, amount_cents: int) -> None:
    """The payment command (skipped when the invoice was voided meanwhile)."""
    if invoice.status == "open" and amount_cents > 0 and invoice.paid_cents == 0:
        invoice.record_payment(amount_cents)
