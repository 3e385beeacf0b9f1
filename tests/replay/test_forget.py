"""Crypto-shredding on the invoicing app: forget one customer, and no byte of their personal
data is readable anywhere in the data directory, while everything else still works.

The app is the invoicing sample plus a small directory read model that copies names and
cities (the sample's own read models hold no personal data), so forgetting must also reach
a read model. The oracle for "readable anywhere" is a raw byte search of every file under
the data directory for the customer's name and street (a positive control finds another
customer's name in the read model, so the search would see plain text if it were there).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlite_utils import Migrations

from eventlane import (
    App,
    EventContext,
    Projector,
    Worker,
    forget,
    handles,
    rebuild,
    verify_rebuild,
)
from eventlane.domain.privacy import ERASED
from eventlane.projection import readmodel_path
from example_apps.invoicing.app import app as invoicing
from example_apps.invoicing.domain import Customer, Order
from example_apps.invoicing.events import Address, CustomerMoved, CustomerRegistered, OrderLine

directory_schema = Migrations("privacy-test.directory")


@directory_schema()
def m001_directory(db) -> None:  # type: ignore[no-untyped-def]
    db.execute("CREATE TABLE directory (customer_id TEXT PRIMARY KEY, name TEXT, city TEXT)")


class Directory(Projector):
    name = "directory"
    topics = (Customer,)
    migrations = directory_schema

    @handles
    def registered(self, e: CustomerRegistered, ctx: EventContext) -> None:
        ctx.db.execute(
            "INSERT OR REPLACE INTO directory VALUES (?, ?, ?)",
            (ctx.aggregate_id, e.name, e.address.city),
        )

    @handles
    def moved(self, e: CustomerMoved, ctx: EventContext) -> None:
        ctx.db.execute(
            "UPDATE directory SET city = ? WHERE customer_id = ?",
            (e.address.city, ctx.aggregate_id),
        )


app = App(
    "invoicing",
    aggregates=invoicing.aggregates,
    projectors=[*invoicing.projectors.values(), Directory],
    registry=invoicing.registry,
    partitions=3,
    on_forget=invoicing.on_forget,
)

CUSTOMERS = 12
FORGOTTEN = "cust-0003"


def name_of(i: int) -> str:
    return f"Ada Quixotic-{i:02d} Lovelace"


def street_of(i: int) -> str:
    return f"{i:02d} Zanzibar Crescent"


def grep(root: Path, needle: str) -> list[str]:
    """Files under ``root`` whose raw bytes contain ``needle`` (UTF-8)."""
    raw = needle.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes()]


def catch_up(runtime) -> None:  # type: ignore[no-untyped-def]
    """Every projector at the high-water marks (the policy first: it appends invoices)."""
    order = ["invoicing_policy", *(n for n in app.projectors if n != "invoicing_policy")]
    for name in order:
        worker = Worker(runtime, name, session_timeout_ms=3000)
        worker.run(until=lambda n=name: runtime.status(n)["lag"] == 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    data = tmp_path_factory.mktemp("privacy") / "data"
    written = []
    with app.open(data) as rt:
        for i in range(CUSTOMERS):
            cid = f"cust-{i:04d}"
            customer = Customer(cid)
            customer.register(name_of(i), Address(street_of(i), "Oslo" if i % 2 else "Lyon", "NO"))
            written += rt.save(customer)
            if i % 3 == 0:
                customer.move(Address(f"{i:02d} Moved Lane", "Graz", "AT"))
                written += rt.save(customer)
            order = Order(f"order-{i:04d}")
            order.place(cid, [OrderLine("sku-001", 2, 500)], Address(street_of(i), "Oslo", "NO"))
            order.confirm()
            written += rt.save(order)
        catch_up(rt)
    yield data


def test_forgetting_a_customer_erases_their_personal_data_everywhere(data: Path) -> None:
    i = int(FORGOTTEN.split("-")[1])
    assert grep(data, name_of(i + 1))  # positive control: plain text in the read model is found
    assert grep(data, name_of(i))  # before: the directory read model holds the name
    with app.open(data) as rt:
        report = forget(rt, [FORGOTTEN])
        assert report.keys_destroyed == (FORGOTTEN,)
        assert (
            report.unreadable.get("customers", 0) >= 1 and report.unreadable.get("orders", 0) >= 1
        )
        assert "directory" in report.rebuilt
        # the aggregate still loads, with the declared placeholders
        forgotten = rt.load(Customer, FORGOTTEN)
        assert forgotten.name == ERASED and forgotten.address == Address("", "", "")
        assert forgotten.version >= 1
        order = rt.load(Order, f"order-{i:04d}")
        assert order.shipping_address == Address("", "", "") and order.customer_id == FORGOTTEN
        # everyone else is unaffected
        other = rt.load(Customer, f"cust-{i + 1:04d}")
        assert other.name == name_of(i + 1)
    for needle in (name_of(i), street_of(i), f"{i:02d} Moved Lane"):
        assert grep(data, needle) == [], f"{needle!r} still readable"
    assert grep(data, name_of(i + 1))  # other customers' read-model rows are intact
    live = readmodel_path(data, "directory")
    with sqlite3.connect(live) as conn:
        rows = dict(conn.execute("SELECT customer_id, name FROM directory").fetchall())
    assert rows[FORGOTTEN] == ERASED and rows[f"cust-{i + 1:04d}"] == name_of(i + 1)


def test_read_models_and_rebuilds_agree_after_forgetting(data: Path, tmp_path: Path) -> None:
    with app.open(data, create_topics=False) as rt:
        for name in ("directory", "invoices", "customer_balances", "orders_by_status"):
            result = rebuild(rt, name, engine="local", output=tmp_path / f"{name}.sqlite")
            checks = verify_rebuild(rt, result)
            assert checks and all(c.ok for c in checks), (name, checks)


@pytest.mark.spark
def test_a_spark_rebuild_after_forgetting_agrees(data: Path, tmp_path: Path, spark) -> None:  # type: ignore[no-untyped-def]
    with app.open(data, create_topics=False) as rt:
        for name in ("directory", "invoices"):
            result = rebuild(
                rt, name, engine="spark", spark=spark, output=tmp_path / f"{name}.sqlite"
            )
            checks = verify_rebuild(rt, result)  # against the local engine and the live model
            assert checks and all(c.ok for c in checks), (name, checks)


def test_raw_tools_show_cipher_text_never_plain_text(data: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from eventlane.cli import main; main()",
            "--data",
            str(data),
            "consume",
            "customers",
            "--max",
            "100",
        ],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    assert b"$eventlane" in out and name_of(5).encode() not in out
