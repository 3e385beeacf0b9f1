"""The invoicing sample declares every personal field (issue 27, item 7).

A field of an event that holds a name, an address or an e-mail (by its name, or because
its type is ``Address``) must be ``personal()``: checked over every event class the sample
registers, so a new one that forgets it fails here. And the one that did
(``ShippingAddressChanged`` version 1): version 2 encrypts the address under the order's
customer, old records still read through the upcaster, and after the customer is forgotten
the changed address reads as the placeholder and is gone from the log's files.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import attrs
import orjson

from eventlane import forget
from eventlane.domain.privacy import personal_fields
from example_apps.invoicing.app import app
from example_apps.invoicing.domain import Customer, Order
from example_apps.invoicing.events import NO_ADDRESS, Address, OrderLine, ShippingAddressChanged

PERSONAL_NAME = re.compile(r"(^|_)(name|first_name|last_name|address|street|email|e_mail|phone)$")


def _holds_address(hint: object) -> bool:
    if hint is Address:
        return True
    return any(_holds_address(arg) for arg in typing.get_args(hint))


def test_every_name_address_or_email_field_is_personal() -> None:
    offenders = []
    classes = app.codec().registry.classes()
    assert len(classes) > 5  # the registry is filled: the check sees every event
    for cls in classes:
        personal = {f.name for f in personal_fields(cls)}
        hints = typing.get_type_hints(cls)
        for field in attrs.fields(cls):
            if field.name in personal:
                continue
            if PERSONAL_NAME.search(field.name) or _holds_address(hints.get(field.name)):
                offenders.append(f"{cls.__qualname__}.{field.name}")
    assert offenders == []


def test_a_version_1_address_change_still_reads() -> None:
    golden_v1 = orjson.dumps(
        {
            "type": "ShippingAddressChanged",
            "version": 1,
            "aggregate_id": "order-1",
            "aggregate_version": 2,
            "event_id": "44e32e1c-3771-48d2-9233-ae055bafed40",
            "timestamp": "2026-11-24T18:28:00+00:00",
            "correlation_id": None,
            "causation_id": None,
            "data": {"address": {"street": "1 Old Road", "city": "Lyon", "country": "FR"}},
        }
    )
    env = app.codec().decode(None, golden_v1)
    assert env.event == ShippingAddressChanged("", Address("1 Old Road", "Lyon", "FR"))
    assert env.schema_version == 2


def test_a_changed_shipping_address_is_erased_with_its_customer(tmp_path: Path) -> None:
    data = tmp_path / "data"
    street = "77 Vanishing Avenue"
    with app.open(data) as rt:
        customer = Customer("cust-1")
        customer.register("Ines Forgettable", Address("1 Home Street", "Oslo", "NO"))
        rt.save(customer)
        order = Order("order-1")
        order.place("cust-1", [OrderLine("sku-1", 1, 100)], Address("1 Home Street", "Oslo", "NO"))
        order.change_shipping_address(Address(street, "Oslo", "NO"))
        rt.save(order)
        assert rt.load(Order, "order-1").shipping_address.street == street
        report = forget(rt, ["cust-1"])
        assert report.ok, report.not_scrubbed
        assert rt.load(Order, "order-1").shipping_address == NO_ADDRESS
    leaks = [p for p in data.rglob("*") if p.is_file() and street.encode() in p.read_bytes()]
    assert leaks == []
