"""Commands as data: frozen attrs classes with a stable name, a target aggregate and a body.

A closure (``lambda order: order.cancel(...)``) cannot be stored, sent or scheduled; a
command that is data can. Declaring one::

    >>> from attrs import frozen
    >>> from eventlane.domain import Aggregate, DomainEvent, applies, event
    >>> @event("Rang")
    ... @frozen
    ... class Rang(DomainEvent):
    ...     why: str
    >>> class Alarm(Aggregate, topic="alarms"):
    ...     @applies
    ...     def _rang(self, e: Rang) -> None:
    ...         pass
    >>> @command("Ring")
    ... @frozen
    ... class Ring(Command[Alarm]):
    ...     alarm_id: str
    ...     why: str
    ...     aggregate = Alarm
    ...     def target(self) -> str:
    ...         return self.alarm_id
    ...     def __call__(self, alarm: Alarm) -> None:
    ...         alarm.record_that(Rang(self.why))
    >>> command_name_of(Ring), Ring("a-1", "wake up").target()
    ('Ring', 'a-1')

Invariants (as for events, :mod:`.events`): the class is an attrs class subclassing
:class:`Command`; its name is declared on the class itself (the stable wire name); its
fields are what the app's converter encodes (no personal values: a command is stored in
clear where it is scheduled); ``aggregate`` names the target's class and ``target()`` its
id; calling the command on the aggregate runs it (and should be a no-op when its work is
done, so a redelivery changes nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

import attrs

from eventlane.domain.aggregate import Aggregate
from eventlane.errors import ConfigError

__all__ = ["Command", "command", "command_name_of"]

A = TypeVar("A", bound=Aggregate)
C = TypeVar("C", bound=type)


class Command(Generic[A]):
    """Base class of commands that are data (see the module docstring)."""

    __slots__ = ()

    command_name: ClassVar[str]
    """Stable wire name, set by :func:`command`."""
    aggregate: ClassVar[type[Aggregate]]
    """The class of the aggregate the command runs on."""
    create: ClassVar[bool] = False
    """Whether the command may start a new aggregate (``execute(..., create=True)``)."""

    def target(self) -> str:
        """The id of the aggregate the command runs on."""
        raise NotImplementedError

    def __call__(self, aggregate: A) -> None:
        """Run the command on the aggregate (record events through ``record_that``)."""
        raise NotImplementedError


def command(name: str) -> Callable[[C], C]:
    """Declare a command class's stable name; apply it on top of ``@frozen``. Raises
    :class:`~eventlane.errors.ConfigError` for an empty name, a class that is not an attrs
    class or not a :class:`Command`, or one without ``aggregate``."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ConfigError(f"command name must be a non-empty string, got {name!r}")

    def declare(cls: C) -> C:
        if not (isinstance(cls, type) and issubclass(cls, Command)):
            raise ConfigError(f"@command({name!r}) needs a Command subclass, got {cls!r}")
        plain: type = cls  # attrs.has() narrows its argument; keep `cls` typed as C
        if not attrs.has(plain):
            raise ConfigError(
                f"@command({name!r}) must be applied on top of @frozen: {cls.__qualname__}"
                " is not an attrs class"
            )
        target = getattr(cls, "aggregate", None)
        if not (isinstance(target, type) and issubclass(target, Aggregate)):
            raise ConfigError(f"command {name!r} must name its aggregate class (aggregate = X)")
        cls.command_name = name
        return cls

    return declare


def command_name_of(cls: type[Command[A]]) -> str:
    """The declared wire name of a command class."""
    name = cls.__dict__.get("command_name")
    if not isinstance(name, str):
        raise ConfigError(f"{cls.__qualname__} is not declared with @command(...)")
    return name
