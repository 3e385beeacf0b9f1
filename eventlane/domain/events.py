"""Domain events: frozen attrs classes with a stable type name and a schema version.

An event is pure domain data. It holds only the fields the domain needs (``order_id``,
``total`` …); everything the store knows about it (aggregate id and version, event id,
timestamp, correlation and causation ids) travels beside it in an envelope
(:class:`eventlane.codec.Envelope`), never inside it.

Declaring an event::

    >>> from attrs import frozen
    >>> @event("OrderPlaced", version=2)
    ... @frozen
    ... class OrderPlaced(DomainEvent):
    ...     order_id: str
    ...     customer: str
    >>> event_type_of(OrderPlaced)
    EventType(name='OrderPlaced', version=2)

Invariants:

* the class is an attrs class (``@frozen``, so instances are immutable and mypy sees every
  field) that subclasses :class:`DomainEvent`;
* the type name and version are declared on the class itself, never inherited: a subclass
  of an event is a different event and must declare its own name;
* the name is the stable wire name. Renaming the Python class changes nothing on the wire;
  renaming the wire name needs an alias in the codec's registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, NamedTuple, TypeVar

import attrs

from eventlane.errors import ConfigError

__all__ = ["DomainEvent", "EventType", "event", "event_type_of"]


class EventType(NamedTuple):
    """The wire identity of an event class: type name and schema version (>= 1)."""

    name: str
    version: int


class DomainEvent:
    """Base class of every domain event.

    Subclasses are ``@frozen`` attrs classes declared with :func:`event`. The base has no
    fields and empty ``__slots__``, so a slotted subclass stays slotted.
    """

    __slots__ = ()

    event_type: ClassVar[str]
    """Stable wire name, set by :func:`event`."""

    event_version: ClassVar[int]
    """Schema version (1, 2, …), set by :func:`event`."""


E = TypeVar("E", bound=type[DomainEvent])


def event(name: str, *, version: int = 1) -> Callable[[E], E]:
    """Declare an event class's stable type name and schema version.

    Apply it on top of ``@frozen``::

        @event("OrderPlaced", version=2)
        @frozen
        class OrderPlaced(DomainEvent): ...

    Raises :class:`~eventlane.errors.ConfigError` for an empty name, a version below 1, a
    class that is not an attrs class, or one that does not subclass :class:`DomainEvent`.
    """
    if not isinstance(name, str) or not name or name != name.strip():
        raise ConfigError(f"event type name must be a non-empty string, got {name!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"event {name!r}: version must be an int >= 1, got {version!r}")

    def declare(cls: E) -> E:
        if not (isinstance(cls, type) and issubclass(cls, DomainEvent)):
            raise ConfigError(f"@event({name!r}) needs a DomainEvent subclass, got {cls!r}")
        plain: type = cls  # attrs.has() narrows its argument; keep `cls` typed as E
        if not attrs.has(plain):
            raise ConfigError(
                f"@event({name!r}) must be applied on top of @frozen: {cls.__qualname__} "
                "is not an attrs class"
            )
        cls.event_type = name
        cls.event_version = version
        return cls

    return declare


def event_type_of(cls: type[DomainEvent]) -> EventType:
    """The (name, version) declared on ``cls`` itself by :func:`event`.

    Raises :class:`~eventlane.errors.ConfigError` when ``cls`` has no declaration of its own
    (an inherited one does not count).
    """
    own = cls.__dict__
    name = own.get("event_type")
    version = own.get("event_version")
    if not isinstance(name, str) or not isinstance(version, int):
        raise ConfigError(
            f"{cls.__qualname__} has no event type declaration: decorate it with "
            f'@event("Name", version=N) on top of @frozen'
        )
    return EventType(name, version)
