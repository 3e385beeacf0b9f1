"""Customer profiles on the compacted ``customers.state`` topic (the seeds' "customer moved").

Every customer event is followed by the customer's whole current profile, keyed by customer
id, on a compacted topic: compaction keeps the latest profile per customer, so a new service
can bootstrap every customer's current address by reading one small topic from the start.
Publishing the same profile twice after a redelivery is harmless: it is the same latest
value.

The profiles copy personal data out of the encrypted events, so forgetting a customer must
remove them too: :func:`forget_profile` (the app's ``on_forget`` hook) writes a tombstone for
the customer and compacts the topic, so only the tombstone is left.
"""

from __future__ import annotations

from typing import Any

import orjson

from eventlane import EventContext, Projector, handles
from eventlane.log.partitioner import partition_for_key
from example_apps.invoicing.domain import Customer
from example_apps.invoicing.events import CustomerMoved, CustomerRegistered

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
        topic = f"{ctx.topic}.state"  # customers.state, in the app's namespace if it has one
        log.create_topic(
            topic,
            log.partition_count(ctx.topic),
            {"cleanup_policy": "compact", "retention_ms": -1},
            exist_ok=True,
        )
        log.append(topic, ctx.partition, [(customer.id.encode(), orjson.dumps(profile), (), None)])


def forget_profile(runtime: Any, customer_id: str) -> None:
    """``on_forget`` hook: tombstone the customer's profile and compact it away."""
    log = runtime.log
    topic = runtime.names.topic(STATE_TOPIC)
    if not log.topic_exists(topic):
        return
    key = customer_id.encode()
    partition = partition_for_key(key, log.partition_count(topic))
    log.append(topic, partition, [(key, None, (), None)])
    log.roll(topic, partition)
    log.compact(topic)
