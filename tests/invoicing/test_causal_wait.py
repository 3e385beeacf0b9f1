"""Read-your-writes with position tokens, and the causal wait through the invoicing policy.

Real worker processes (``Runner``) of the policy and the projectors, a real log on disk.
The causal wait must return only once the invoice the policy issued for a just-confirmed
order is in the invoices read model; a plain wait for the confirmation's own position
promises nothing about the invoice (the policy runs after it).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlane.app import Runtime
from eventlane.errors import InvalidPositionError, WaitTimeoutError
from eventlane.log.position import Position
from eventlane.projection import Runner, open_readmodel
from example_apps.invoicing import app
from example_apps.invoicing.domain import Customer, Order, invoice_id_for
from example_apps.invoicing.events import Address, OrderLine

APP = "example_apps.invoicing:app"
HOME = Address("1 Main St", "Springfield", "US")


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    with app.open(tmp_path / "data") as rt:
        for name in app.projectors:
            open_readmodel(rt, name, migrate=True).close()
        yield rt


def place_and_confirm(runtime: Runtime, n: int) -> Order:
    customer = f"cust-{n}"
    runtime.execute(Customer, customer, lambda c: c.register(f"C{n}", HOME), create=True)
    runtime.execute(
        Order,
        f"order-{n}",
        lambda o: o.place(customer, [OrderLine("sku-1", 2, 150 + n)], HOME),
        create=True,
    )
    return runtime.execute(Order, f"order-{n}", lambda o: o.confirm())


def row(runtime: Runtime, projector: str, sql: str, *args: object) -> tuple[object, ...] | None:
    with sqlite3.connect(runtime.readmodel_path(projector)) as db:
        found: tuple[object, ...] | None = db.execute(sql, args).fetchone()
        return found


def test_the_async_runtime_waits_for_tokens_and_causally(tmp_path: Path) -> None:
    """The same waits on the async face, driven by the same plans."""
    data = tmp_path / "data"
    with app.open(data) as rt:
        for name in app.projectors:
            open_readmodel(rt, name, migrate=True).close()
    runners = [Runner(APP, name, data, workers=1) for name in ("invoicing_policy", "invoices")]
    for r in runners:
        r.start()

    async def main() -> list[tuple[object, ...] | None]:
        found = []
        async with app.open_async(data) as runtime:
            for n in range(4):
                await runtime.execute(
                    Customer, f"cust-{n}", lambda c, n=n: c.register(f"C{n}", HOME), create=True
                )
                await runtime.execute(
                    Order,
                    f"order-{n}",
                    lambda o, n=n: o.place(f"cust-{n}", [OrderLine("sku-1", 1, 100 + n)], HOME),
                    create=True,
                )
                order = await runtime.execute(Order, f"order-{n}", lambda o: o.confirm())
                await runtime.wait_causal("invoices", order.stored_position.token, timeout=60)
                found.append(
                    await runtime.run(
                        row,
                        runtime.sync,
                        "invoices",
                        "SELECT amount_cents FROM invoices WHERE order_id = ?",
                        order.id,
                    )
                )
            assert order.stored_position is not None  # orders_by_status is not running:
            with pytest.raises(WaitTimeoutError, match="'orders_by_status' has not reached"):
                await runtime.wait_causal("orders_by_status", order.stored_position, timeout=0.3)
        return found

    try:
        assert asyncio.run(main()) == [(100,), (101,), (102,), (103,)]
    finally:
        for r in runners:
            r.stop()


def test_token_waits_and_the_causal_wait_returns_the_policys_invoice(runtime: Runtime) -> None:
    runners = [
        Runner(APP, name, runtime.log.path, workers=1)
        for name in ("invoicing_policy", "invoices", "orders_by_status")
    ]
    for r in runners:
        r.start()
    try:
        for n in range(6):
            order = place_and_confirm(runtime, n)
            position = order.stored_position
            assert position is not None
            token = position.token
            assert Position.parse(token) == position
            # read-your-writes with the token string: the order is confirmed in the model
            assert runtime.wait_for("orders_by_status", token, timeout=60)
            status = row(
                runtime,
                "orders_by_status",
                "SELECT status FROM orders WHERE order_id = ?",
                order.id,
            )
            assert status == ("confirmed",)
            # causal: the invoice the policy issued because of the confirmation
            reached = runtime.wait_causal("invoices", token, timeout=60)
            invoice = row(
                runtime,
                "invoices",
                "SELECT order_id, amount_cents, status FROM invoices WHERE invoice_id = ?",
                invoice_id_for(order.id),
            )
            assert invoice == (order.id, 2 * (150 + n), "open")
            assert len(reached) > len(position)  # the invoice's partition joined it
    finally:
        for r in runners:
            r.stop()


def test_the_causal_wait_names_a_policy_that_is_not_running(runtime: Runtime) -> None:
    order = place_and_confirm(runtime, 1)
    assert order.stored_position is not None
    with pytest.raises(WaitTimeoutError, match="policy 'invoicing_policy' has not handled"):
        runtime.wait_causal("invoices", order.stored_position, timeout=0.5)


FORGED = {  # well-formed tokens naming what this log never had: no wait could reach them
    "p1~orders~9999~3-5": "partition 9999 of 'orders', which has",
    "p1~nosuch~0~3-5": "topic 'nosuch', which this log does not have",
    "p1~orders~0~1000-1001": "offset 1001 of orders-0, beyond its high-water mark",
}


def test_a_forged_token_is_refused_at_once_not_waited_for(runtime: Runtime) -> None:
    """(adversarial review, 2026-11-29: these held a request for the whole timeout and then
    blamed the read model, or failed with UnknownPartitionError/OffsetOutOfRangeError)."""
    order = place_and_confirm(runtime, 1)
    assert order.stored_position is not None
    for token, why in FORGED.items():
        for wait in (runtime.wait_for, runtime.wait_causal):
            started = time.monotonic()
            with pytest.raises(InvalidPositionError, match=why):
                wait("orders_by_status", token, timeout=30)
            assert time.monotonic() - started < 5, (token, wait)

    async def main() -> None:
        async with app.open_async(runtime.log.local.root) as rt:
            for token, why in FORGED.items():
                for wait in (rt.wait_for, rt.wait_causal):
                    with pytest.raises(InvalidPositionError, match=why):
                        await asyncio.wait_for(wait("orders_by_status", token, timeout=30), 5)
            # a real token is not refused (the projection is not running: a plain timeout)
            assert not await rt.wait_for("orders_by_status", order.stored_position, timeout=0.2)

    asyncio.run(main())
