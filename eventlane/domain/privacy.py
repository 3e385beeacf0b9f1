"""Personal data in events: which fields are personal, and whose they are.

Fields declared with :func:`personal` are encrypted per *subject* (a person, a customer) by
the codec before the event reaches the log, and decrypted on read
(:mod:`eventlane.codec.privacy`). Erasing a subject destroys its key, so every copy of its
events (backups and replays included) keeps its ids and non-personal fields and loses the
personal ones: a read shows the field's declared ``erased`` value instead. This module only
declares; it does no I/O and no cryptography.

    >>> from attrs import frozen
    >>> from eventlane.domain import DomainEvent, event
    >>> @event("CustomerRegistered")
    ... @frozen
    ... class CustomerRegistered(DomainEvent):
    ...     customer_id: str = subject()
    ...     name: str = personal()
    ...     credit_limit: int = personal(erased=0)
    >>> [(f.name, f.erased) for f in personal_fields(CustomerRegistered)]
    [('name', '[erased]'), ('credit_limit', 0)]
    >>> subject_field(CustomerRegistered)
    'customer_id'

Invariants:

* the subject of an event is the value of its :func:`subject` field, or the aggregate id
  when it declares none; at most one subject field per class;
* a personal field's ``erased`` value has the field's type (default :data:`ERASED`, a
  string: fields of other types must declare theirs), so an erased event still structures
  into its class and every handler still runs.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import frozen

from eventlane.errors import ConfigError

__all__ = ["ERASED", "PersonalField", "personal", "personal_fields", "subject", "subject_field"]

ERASED = "[erased]"
"""What a read shows for an erased personal ``str`` field unless the field says otherwise."""

_PERSONAL = "eventlane.personal"
_SUBJECT = "eventlane.subject"


@frozen
class PersonalField:
    """A personal field of an event class: its name and what to show once erased."""

    name: str
    erased: Any


def personal(*, erased: Any = ERASED, **field_options: Any) -> Any:
    """An attrs field holding personal data (encrypted per subject; see module doc).

    ``erased`` is the value a read shows once the subject is forgotten; other keyword
    arguments go to :func:`attrs.field` (``default``, ``converter``, ...).
    """
    metadata = dict(field_options.pop("metadata", None) or {})
    metadata[_PERSONAL] = erased
    return attrs.field(metadata=metadata, **field_options)


def subject(**field_options: Any) -> Any:
    """An attrs field naming the event's subject (whose personal data it carries).

    Without one, the subject is the aggregate id (the usual case: a customer's own events).
    """
    metadata = dict(field_options.pop("metadata", None) or {})
    metadata[_SUBJECT] = True
    return attrs.field(metadata=metadata, **field_options)


def personal_fields(cls: type) -> tuple[PersonalField, ...]:
    """The personal fields of an attrs class, in declaration order."""
    return tuple(
        PersonalField(f.name, f.metadata[_PERSONAL])
        for f in attrs.fields(cls)
        if _PERSONAL in f.metadata
    )


def subject_field(cls: type) -> str | None:
    """The name of the class's subject field, or ``None`` (the aggregate id is the subject).

    Raises :class:`~eventlane.errors.ConfigError` when more than one field claims it, or
    when the subject field is itself personal (ids stay in clear: they find the key).
    """
    names = [f.name for f in attrs.fields(cls) if _SUBJECT in f.metadata]
    if len(names) > 1:
        raise ConfigError(f"{cls.__qualname__} declares several subject fields: {names}")
    if names and any(f.name == names[0] for f in personal_fields(cls)):
        raise ConfigError(
            f"{cls.__qualname__}.{names[0]} is the subject id and cannot also be personal"
        )
    return names[0] if names else None
