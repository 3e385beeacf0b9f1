"""Customer profiles on the compacted ``customers.state`` topic (the seeds' "customer moved").

Every customer event is followed by the customer's whole current profile, keyed by customer
id, on a compacted topic: compaction keeps the latest profile per customer, so a new service
can bootstrap every customer's current address by reading one small topic from the start.
Publishing the same profile twice after a redelivery is harmless: it is the same latest
value.
"""

from __future__ import annotations

import orjson

from example_apps.invoicing.domain import Customer
from example_apps.invoicing.events import CustomerMoved, CustomerRegistered
from framework import EventContext, Projector, handles

STATE_TOPIC = "customers.state"


class CustomerStatePublisher(Projector):
    name = "customer_state"
    topics = ("customers",)

    @handles(CustomerRegistered)
    def registered(self, event: CustomerRegistered, ctx: EventContext) -> None:
        self._publish(ctx)

    @handles(CustomerMoved)
    def moved(self, event: CustomerMoved, ctx: EventContext) -> None:
        self._publish(ctx)

    def _publish(self, ctx: EventContext) -> None:
        if ctx.replaying or ctx.app is None:
            return
        customer = ctx.app.load(Customer, ctx.aggregate_id, ctx.aggregate_version)
        address = customer.address
        profile = {
            "customer_id": customer.id,
            "name": customer.name,
            "address": None
            if address is None
            else {"street": address.street, "city": address.city, "country": address.country},
            "version": customer.version,
        }
        log = ctx.app.log
        log.create_topic(
            STATE_TOPIC,
            log.partition_count("customers"),
            {"cleanup_policy": "compact", "retention_ms": -1},
            exist_ok=True,
        )
        log.append(
            STATE_TOPIC, ctx.partition, [(customer.id.encode(), orjson.dumps(profile), (), None)]
        )
