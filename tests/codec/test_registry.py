"""EventRegistry: registration rules, aliases, upcaster validation and resolution errors."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from codec_samples import OrderPlaced, order_placed_v1_to_v2, order_placed_v2_to_v3

from eventlane.codec import EventRegistry
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.errors import ConfigError, UnknownEventTypeError, UpcastError


@event("Shipped", version=4)
@attrs.frozen
class Shipped(DomainEvent):
    carrier: str


def same(data: dict[str, Any]) -> dict[str, Any]:
    return data


def test_register_reads_the_declaration() -> None:
    registry = EventRegistry()
    registry.register(Shipped)
    registry.register(Shipped)  # idempotent
    assert registry.type_of(Shipped) == ("Shipped", 4)
    assert registry.classes() == (Shipped,)


def test_two_classes_cannot_share_a_name() -> None:
    @event("Shipped")
    @attrs.frozen
    class Impostor(DomainEvent):
        x: int

    registry = EventRegistry()
    registry.register(Shipped)
    with pytest.raises(ConfigError, match="taken by Shipped"):
        registry.register(Impostor)


def test_unregistered_class_is_unknown() -> None:
    with pytest.raises(UnknownEventTypeError, match="not registered") as info:
        EventRegistry().type_of(Shipped)
    assert (info.value.type_name, info.value.version) == ("Shipped", 4)


def test_duplicate_upcaster_is_refused_naming_type_and_versions() -> None:
    registry = EventRegistry()
    registry.add_upcaster("Shipped", 2, same)
    with pytest.raises(UpcastError, match=r"duplicate upcaster for Shipped from version 2 to 3"):
        registry.add_upcaster("Shipped", 2, same)


def test_gap_in_a_chain_is_refused() -> None:
    registry = EventRegistry()
    registry.register(Shipped)
    registry.add_upcaster("Shipped", 1, same)
    registry.add_upcaster("Shipped", 3, same)
    with pytest.raises(UpcastError, match=r"gap: no upcaster from version 2 to 3") as info:
        registry.validate()
    assert (info.value.type_name, info.value.version) == ("Shipped", 2)
    assert "chain 1 → 4" in str(info.value)


def test_chain_must_end_at_the_current_version() -> None:
    registry = EventRegistry()
    registry.register(Shipped)
    registry.add_upcaster("Shipped", 4, same)
    with pytest.raises(
        UpcastError, match=r"from version 4 is out of range: the current version is 4"
    ):
        registry.validate()


def test_upcaster_for_unknown_type_or_alias_is_refused() -> None:
    registry = EventRegistry()
    registry.register(Shipped)
    registry.add_upcaster("Shiped", 1, same)
    with pytest.raises(UpcastError, match="unknown event type 'Shiped'"):
        registry.validate()

    registry = EventRegistry()
    registry.register(Shipped)
    registry.add_alias("Dispatched", "Shipped")
    registry.add_upcaster("Dispatched", 3, same)
    with pytest.raises(UpcastError, match="alias of 'Shipped'"):
        registry.validate()


def test_alias_rules() -> None:
    registry = EventRegistry()
    registry.register(Shipped)
    with pytest.raises(ConfigError):
        registry.add_alias("Shipped", "Other")  # a current name cannot be an alias
    registry.add_alias("Dispatched", "Nowhere")
    with pytest.raises(UpcastError, match="'Nowhere' is not a registered event type"):
        registry.validate()

    cyclic = EventRegistry()
    cyclic.add_alias("A", "B")
    cyclic.add_alias("B", "A")
    with pytest.raises(UpcastError, match="alias cycle: A → B → A"):
        cyclic.validate()


def test_resolve_follows_aliases_and_builds_the_chain() -> None:
    registry = EventRegistry()
    registry.register(OrderPlaced)
    registry.add_alias("OrderCreated", "OrderPlaced")
    registry.upcaster("OrderPlaced", 1)(order_placed_v1_to_v2)
    registry.upcaster("OrderPlaced", 2)(order_placed_v2_to_v3)
    current = registry.resolve("OrderPlaced", 3)
    assert (current.cls, current.event_type, current.chain) == (
        OrderPlaced,
        ("OrderPlaced", 3),
        None,
    )
    old = registry.resolve("OrderCreated", 1)
    assert old.cls is OrderPlaced
    assert old.chain is not None
    assert (old.chain.from_version, old.chain.to_version) == (1, 3)
    assert old.chain.steps == (order_placed_v1_to_v2, order_placed_v2_to_v3)


@pytest.mark.parametrize(
    ("name", "version", "why"),
    [
        ("Nope", 1, "unknown event type 'Nope'"),
        ("Shipped", 5, "version 5 is newer than the registered class"),
        ("Shipped", 1, "no upcaster chain from version 1 to 4"),
    ],
)
def test_unknown_type_or_version_names_everything(name: str, version: int, why: str) -> None:
    registry = EventRegistry()
    registry.register(Shipped)
    registry.add_upcaster("Shipped", 2, same)
    registry.add_upcaster("Shipped", 3, same)
    with pytest.raises(UnknownEventTypeError) as info:
        registry.resolve(name, version, topic="orders", partition=3, offset=1234)
    error = info.value
    assert why in str(error)
    assert (error.type_name, error.version) == (name, version)
    assert (error.topic, error.partition, error.offset) == ("orders", 3, 1234)
    for fragment in (
        f"type={name}",
        f"version={version}",
        "topic=orders",
        "partition=3",
        "offset=1234",
    ):
        assert fragment in str(error)


def test_registration_after_validation_revalidates() -> None:
    registry = EventRegistry()
    registry.register(Shipped)
    registry.validate()
    generation = registry.generation
    registry.add_upcaster("Shipped", 2, same)
    assert registry.generation > generation
    with pytest.raises(UpcastError, match="gap"):
        registry.resolve("Shipped", 4)


def test_register_aggregate_registers_its_applied_events() -> None:
    class Parcel(Aggregate):
        topic = "parcels"

        @applies(Shipped)
        def _shipped(self, event: Shipped) -> None:
            pass

    registry = EventRegistry()
    registry.register_aggregate(Parcel)
    assert registry.classes() == (Shipped,)
