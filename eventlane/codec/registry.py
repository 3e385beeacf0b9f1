"""The event registry: wire names and versions ↔ event classes, aliases, upcasters.

One class per type name: the current one, declared ``@event(name, version=N)``. Older
versions of a type have no class; their stored data is upcast (:mod:`.upcasting`) to
version N on read. A renamed type keeps reading through an alias (old name → new name),
after which the new name's upcasters apply from the stored version.

Invariants once :meth:`EventRegistry.validate` has passed (it runs automatically before
the first resolution after any change):

* every type name maps to exactly one class and every class to one (name, version);
* no alias source is a registered name, alias targets resolve to a registered name, and
  alias chains have no cycle;
* every upcaster chain is complete (see :func:`.upcasting.check_upcasters`).

Resolutions (stored name, stored version) → (class, chain) are cached until the next
registration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import frozen

from eventlane.codec.upcasting import UpcastChain, Upcaster, check_upcasters, lowest_upcastable
from eventlane.domain import Aggregate, DomainEvent, EventType, event_type_of
from eventlane.errors import (
    ConfigError,
    NewerEventVersionError,
    UnknownEventTypeError,
    UpcastError,
)

__all__ = ["EventRegistry", "Resolution"]


@frozen
class Resolution:
    """How to read data stored as some (name, version): as ``cls`` after ``chain``.

    ``event_type`` is the current (name, version) of ``cls``; ``chain`` is ``None`` when
    the stored version is the current one.
    """

    cls: type[DomainEvent]
    event_type: EventType
    chain: UpcastChain | None


class EventRegistry:
    """Event classes by (type name, schema version), plus aliases and upcasters."""

    def __init__(self) -> None:
        self._by_name: dict[str, type[DomainEvent]] = {}
        self._by_class: dict[type[DomainEvent], EventType] = {}
        self._topics: dict[type[DomainEvent], frozenset[str]] = {}
        self._aliases: dict[str, str] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._resolved: dict[tuple[str, int], Resolution] = {}
        self._valid = False
        self._generation = 0

    @property
    def generation(self) -> int:
        """A counter bumped by every registration, so codecs know to drop their caches."""
        return self._generation

    # -- registration ---------------------------------------------------------------------

    def register(self, *classes: type[DomainEvent]) -> None:
        """Register event classes under their declared (name, version).

        Registering the same class twice is harmless; another class under a taken name,
        or a name that is an alias, is a :class:`~eventlane.errors.ConfigError`.
        """
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, DomainEvent)):
                raise ConfigError(f"not a DomainEvent subclass: {cls!r}")
            declared = event_type_of(cls)
            taken = self._by_name.get(declared.name)
            if taken is cls:
                continue
            if taken is not None:
                raise ConfigError(
                    f"event type name {declared.name!r} is taken by {taken.__qualname__}; "
                    f"cannot register {cls.__qualname__} under it"
                )
            if declared.name in self._aliases:
                raise ConfigError(
                    f"event type name {declared.name!r} is an alias of "
                    f"{self._aliases[declared.name]!r}"
                )
            self._by_name[declared.name] = cls
            self._by_class[cls] = declared
            self._changed()

    def register_aggregate(self, *aggregates: type[Aggregate]) -> None:
        """Register every event class the aggregates have apply methods for."""
        for aggregate in aggregates:
            self.register(*aggregate.event_types())
            topic = getattr(aggregate, "topic", None)
            if isinstance(topic, str) and topic:
                for cls in aggregate.event_types():
                    self._topics[cls] = self._topics.get(cls, frozenset()) | {topic}
            self._changed()

    def topics_of(self, cls: type[DomainEvent]) -> frozenset[str]:
        """The logical topics (aggregates' ``topic``, without an engine's or namespace's
        prefix) the registered aggregates record ``cls`` in; empty when none registered it
        (personal fields' cipher texts are bound to these: docs/privacy.md)."""
        return self._topics.get(cls, frozenset())

    def add_alias(self, old_name: str, new_name: str) -> None:
        """Read events stored under ``old_name`` as type ``new_name`` (a renamed type)."""
        if old_name == new_name:
            raise ConfigError(f"alias {old_name!r} → itself")
        if old_name in self._by_name:
            raise ConfigError(f"cannot alias {old_name!r}: it is a registered event type name")
        existing = self._aliases.get(old_name)
        if existing is not None and existing != new_name:
            raise ConfigError(f"{old_name!r} is already an alias of {existing!r}")
        self._aliases[old_name] = new_name
        self._changed()

    def add_upcaster(self, name: str, from_version: int, upcaster: Upcaster) -> None:
        """Register ``upcaster`` for data of ``name`` at ``from_version`` (→ +1).

        A second upcaster for the same (name, version) is an
        :class:`~eventlane.errors.UpcastError`.
        """
        if isinstance(from_version, bool) or not isinstance(from_version, int):
            raise ConfigError(f"upcaster of {name!r}: from_version must be an int")
        key = (name, from_version)
        existing = self._upcasters.get(key)
        if existing is not None:
            raise UpcastError(
                f"duplicate upcaster for {name} from version {from_version} to "
                f"{from_version + 1}: {getattr(existing, '__qualname__', existing)} and "
                f"{getattr(upcaster, '__qualname__', upcaster)}",
                type_name=name,
                version=from_version,
            )
        self._upcasters[key] = upcaster
        self._changed()

    def upcaster(self, name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorator form of :meth:`add_upcaster`."""

        def register(upcaster: Upcaster) -> Upcaster:
            self.add_upcaster(name, from_version, upcaster)
            return upcaster

        return register

    def _changed(self) -> None:
        self._valid = False
        self._generation += 1
        self._resolved.clear()

    # -- validation -----------------------------------------------------------------------

    def validate(self) -> None:
        """Check aliases and upcaster chains; raise :class:`~eventlane.errors.UpcastError`.

        Called automatically before resolving after any change; call it at start-up to
        fail early.
        """
        if self._valid:
            return
        for old_name in self._aliases:
            self._follow_aliases(old_name)
        current = {declared.name: declared.version for declared in self._by_class.values()}
        check_upcasters(current, self._upcasters, self._aliases)
        self._valid = True

    def _follow_aliases(self, name: str) -> str:
        seen = [name]
        while name in self._aliases:
            name = self._aliases[name]
            if name in seen:
                raise UpcastError(f"alias cycle: {' → '.join([*seen, name])}", type_name=seen[0])
            seen.append(name)
        if name not in self._by_name:
            raise UpcastError(
                f"alias {' → '.join(seen)}: {name!r} is not a registered event type",
                type_name=seen[0],
            )
        return name

    # -- lookups --------------------------------------------------------------------------

    def type_of(self, cls: type[DomainEvent]) -> EventType:
        """The current (name, version) of a registered class.

        Raises :class:`~eventlane.errors.UnknownEventTypeError` for an unregistered class.
        """
        declared = self._by_class.get(cls)
        if declared is None:
            raise UnknownEventTypeError(
                f"event class {cls.__qualname__} is not registered with the codec's"
                " EventRegistry: add the aggregate that records it to App(aggregates=[...]),"
                f" or add {cls.__qualname__} to App(events=[...])",
                type_name=cls.__dict__.get("event_type"),
                version=cls.__dict__.get("event_version"),
            )
        return declared

    def classes(self) -> tuple[type[DomainEvent], ...]:
        """The registered (current) event classes, in registration order."""
        return tuple(self._by_name.values())

    def resolve(
        self,
        name: str,
        version: int,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Resolution:
        """How to read data stored as ``(name, version)``.

        Raises :class:`~eventlane.errors.UnknownEventTypeError` (naming the type, the
        version and the coordinates passed in) when no class or upcaster chain leads from
        it to a registered class.
        """
        resolved = self._resolved.get((name, version))
        if resolved is not None:
            return resolved
        self.validate()
        where: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
        current_name = name
        if name not in self._by_name and name in self._aliases:
            current_name = self._follow_aliases(name)
        cls = self._by_name.get(current_name)
        if cls is None:
            raise UnknownEventTypeError(
                f"unknown event type {name!r} (version {version}): no class registered "
                "under that name or alias",
                type_name=name,
                version=version,
                **where,
            )
        declared = self._by_class[cls]
        renamed = "" if current_name == name else f" (alias of {current_name!r})"
        if version == declared.version:
            resolved = Resolution(cls, declared, None)
        elif version > declared.version:
            raise NewerEventVersionError(
                f"event {name!r}{renamed} version {version} is newer than the registered "
                f"class {cls.__qualname__} (version {declared.version}): deploy the code "
                "that wrote it",
                known_version=declared.version,
                type_name=name,
                version=version,
                **where,
            )
        else:
            lowest = lowest_upcastable(current_name, self._upcasters)
            if lowest is None or version < lowest:
                raise UnknownEventTypeError(
                    f"event {name!r}{renamed} version {version} cannot be read: no upcaster "
                    f"chain from version {version} to {declared.version}",
                    type_name=name,
                    version=version,
                    **where,
                )
            steps = tuple(
                self._upcasters[(current_name, v)] for v in range(version, declared.version)
            )
            resolved = Resolution(
                cls, declared, UpcastChain(current_name, version, declared.version, steps)
            )
        self._resolved[(name, version)] = resolved
        return resolved
