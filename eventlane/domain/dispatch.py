"""Methods marked as the handler of one event class: the one helper behind ``@applies``
(aggregates) and ``@handles`` (projectors).

A marker decorator takes the event class explicitly (``@applies(Deposited)``), or, written
bare (``@applies``), from the annotation of the method's first parameter after ``self``, as
``functools.singledispatchmethod.register`` does::

    >>> from attrs import frozen
    >>> from eventlane.domain.events import DomainEvent, event
    >>> @event("Deposited")
    ... @frozen
    ... class Deposited(DomainEvent):
    ...     amount: int
    >>> def on_deposit(self, e: Deposited) -> None: ...
    >>> event_class_of(on_deposit, "@applies").__name__
    'Deposited'

The annotation is resolved in the method's module globals when the decorator runs (a string
annotation included), so the event class must be defined before the method; an event class
only visible in a local scope needs the explicit form. A class collects its marked methods
with :func:`collect_marked`: at most one per event class in one class body (a subclass may
override its parent's).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from eventlane.domain.events import DomainEvent
from eventlane.errors import ConfigError

__all__ = ["collect_marked", "event_class_of", "mark"]

F = TypeVar("F", bound=Callable[..., Any])


def _is_event_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, DomainEvent)


def event_class_of(method: Callable[..., Any], decorator: str) -> type[DomainEvent]:
    """The event class annotated on ``method``'s first parameter after ``self``."""
    where = getattr(method, "__qualname__", repr(method))
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        raise ConfigError(f"{decorator} on {where}: not a method with a signature") from None
    if len(params) < 2:
        raise ConfigError(f"{decorator} on {where}: it must take (self, event, ...)")
    param = params[1]
    if param.annotation is inspect.Parameter.empty:
        raise ConfigError(
            f"{decorator} on {where}: annotate {param.name!r} with the event class, or name"
            f" it: {decorator}(EventClass)"
        )
    annotation = param.annotation
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(method).get(param.name, annotation)
        except NameError as exc:
            raise ConfigError(
                f"{decorator} on {where}: cannot resolve the annotation {annotation!r} ({exc});"
                f" name the event class explicitly: {decorator}(EventClass)"
            ) from None
    if not _is_event_class(annotation):
        raise ConfigError(
            f"{decorator} on {where}: {param.name!r} is annotated {annotation!r}, not a"
            " DomainEvent subclass"
        )
    return typing.cast(type[DomainEvent], annotation)


def mark(target: object, attr: str, decorator: str) -> Any:
    """The body of a marker decorator used bare or with an event class (see the module)."""
    if _is_event_class(target):
        event_cls = target

        def marker(method: F) -> F:
            setattr(method, attr, event_cls)
            return method

        return marker
    if callable(target) and not isinstance(target, type):
        setattr(target, attr, event_class_of(target, decorator))
        return target
    raise ConfigError(f"{decorator} needs a DomainEvent subclass, got {target!r}")


def collect_marked(
    cls: type, attr: str, verb: str, inherited: Mapping[type[DomainEvent], Any]
) -> dict[type[DomainEvent], Any]:
    """``inherited`` updated with the methods of ``cls``'s own body marked by ``attr``.

    Two methods of one body for one event class are a :class:`ConfigError` naming both.
    """
    found = dict(inherited)
    seen: dict[type[DomainEvent], str] = {}
    for name, member in vars(cls).items():
        event_cls = getattr(member, attr, None)
        if event_cls is None:
            continue
        if event_cls in seen:
            raise ConfigError(
                f"{cls.__qualname__}: both {seen[event_cls]}() and {name}() {verb} "
                f"{event_cls.__qualname__}"
            )
        seen[event_cls] = name
        found[event_cls] = member
    return found
