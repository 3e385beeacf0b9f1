"""Event declarations: @event on @frozen, declared per class, validated."""

from __future__ import annotations

import attrs
import pytest
from domain_samples import CartOpened, ItemAdded

from eventlane.domain import DomainEvent, EventType, event, event_type_of
from eventlane.errors import ConfigError


def test_declaration_is_read_back() -> None:
    assert event_type_of(ItemAdded) == EventType("ItemAdded", 2)
    assert (ItemAdded.event_type, ItemAdded.event_version) == ("ItemAdded", 2)
    assert event_type_of(CartOpened).version == 1


def test_events_are_frozen_slotted_values() -> None:
    opened = CartOpened("ada")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        opened.owner = "bob"  # type: ignore[misc]
    assert opened == CartOpened("ada")
    assert not hasattr(opened, "__dict__")


def test_declaration_is_not_inherited() -> None:
    @attrs.frozen
    class Special(CartOpened):
        reason: str

    with pytest.raises(ConfigError, match="no event type declaration"):
        event_type_of(Special)


@pytest.mark.parametrize(("name", "version"), [("", 1), (" Padded", 1), ("X", 0), ("X", True)])
def test_bad_declarations(name: str, version: int) -> None:
    with pytest.raises(ConfigError):
        event(name, version=version)


def test_must_be_an_attrs_domain_event() -> None:
    class NotAttrs(DomainEvent):
        pass

    with pytest.raises(ConfigError, match="on top of @frozen"):
        event("NotAttrs")(NotAttrs)

    @attrs.frozen
    class NotDomain:
        x: int

    with pytest.raises(ConfigError, match="DomainEvent subclass"):
        event("NotDomain")(NotDomain)  # type: ignore[type-var]
