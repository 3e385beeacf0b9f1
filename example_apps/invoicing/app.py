"""The invoicing application object: ``example_apps.invoicing:app``."""

from __future__ import annotations

from typing import Any

from eventlane import App, EventRegistry
from example_apps.invoicing.domain import CancelUnconfirmed, Customer, Invoice, Order
from example_apps.invoicing.projections import (
    CustomerBalances,
    Invoices,
    InvoicingPolicy,
    OrdersByStatus,
)
from example_apps.invoicing.state_topic import CustomerStatePublisher, forget_profile

registry = EventRegistry()


@registry.upcaster("OrderPlaced", 1)
def _order_placed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 stored the shipping address as one line, "street, city, country"."""
    if not isinstance(data["shipping_address"], str):
        return data  # erased personal data (docs/privacy.md): nothing to split
    street, city, country = (part.strip() for part in data["shipping_address"].split(",", 2))
    return {**data, "shipping_address": {"street": street, "city": city, "country": country}}


@registry.upcaster("ShippingAddressChanged", 1)
def _address_changed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 stored the address in clear and did not name the customer (the subject of
    version 2): an empty ``customer_id`` marks such an event. Its plain text stays in the
    old segments until they are rewritten (docs/privacy.md, "Data stored in clear")."""
    return {"customer_id": "", **data}


app = App(
    "invoicing",
    aggregates=[Customer, Order, Invoice],
    projectors=[
        Invoices,
        CustomerBalances,
        OrdersByStatus,
        InvoicingPolicy,
        CustomerStatePublisher,
    ],
    registry=registry,
    partitions=6,
    on_forget=[forget_profile],
    commands=[CancelUnconfirmed],
)
