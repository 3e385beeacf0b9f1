"""The event envelope and its record layout.

An :class:`Envelope` wraps a pure domain event with what the store knows about it. On the
log, one envelope is one record (see ``docs/events.md`` for the full description):

* **key**: the aggregate id, UTF-8;
* **headers**, in this order (values UTF-8):

  ====================  ===============================================================
  ``event-type``        stored type name, e.g. ``OrderPlaced``
  ``event-version``     stored schema version, decimal, e.g. ``2``
  ``event-id``          event id, canonical UUID string
  ``correlation-id``    only when the envelope has one
  ``causation-id``      only when the envelope has one
  ====================  ===============================================================

* **value**: one JSON object, readable alone (by Spark, by humans), keys in this order::

    {"type": "OrderPlaced", "version": 2, "aggregate_id": "order-1",
     "aggregate_version": 3, "event_id": "6f1c…", "timestamp": "2024-05-01T12:00:00.123456+00:00",
     "correlation_id": null, "causation_id": null, "data": {…the event's fields…}}

The value is authoritative; the headers copy the routing fields so consumers can filter
records without parsing JSON. A decoder accepts a record without headers or key (a value
alone); when they are present they must agree with the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Generic, NamedTuple, TypeVar
from uuid import UUID, uuid4

from attrs import Factory, field, fields, frozen

from eventlane.codec.converter import parse_uuid
from eventlane.domain import DomainEvent, EventType, event_type_of

__all__ = [
    "HEADER_CAUSATION_ID",
    "HEADER_CORRELATION_ID",
    "HEADER_EVENT_ID",
    "HEADER_TYPE",
    "HEADER_VERSION",
    "EncodedRecord",
    "Envelope",
    "LazyEnvelope",
    "event_type_from_headers",
]

HEADER_TYPE = "event-type"
HEADER_VERSION = "event-version"
HEADER_EVENT_ID = "event-id"
HEADER_CORRELATION_ID = "correlation-id"
HEADER_CAUSATION_ID = "causation-id"

E = TypeVar("E", bound=DomainEvent)


def _utc(timestamp: datetime) -> datetime:
    if not isinstance(timestamp, datetime) or timestamp.tzinfo is None:
        raise ValueError(f"envelope timestamp must be a timezone-aware datetime: {timestamp!r}")
    return timestamp if timestamp.tzinfo is UTC else timestamp.astimezone(UTC)


def _now() -> datetime:
    return datetime.now(UTC)


def _declared_name(self: Envelope[DomainEvent]) -> str:
    return event_type_of(type(self.event)).name


def _declared_version(self: Envelope[DomainEvent]) -> int:
    return event_type_of(type(self.event)).version


@frozen
class Envelope(Generic[E]):
    """A domain event plus its store metadata.

    Invariants: ``aggregate_version >= 1`` (the event's position in its aggregate's
    history); ``timestamp`` is timezone-aware and normalised to UTC (microseconds kept);
    ``type_name``/``schema_version`` describe ``event`` (default: its class's
    ``@event`` declaration). A decoded envelope holds the *current* class and version even
    when the record stored an older version or an aliased name.
    """

    event: E
    aggregate_id: str
    aggregate_version: int
    event_id: UUID = field(factory=uuid4)
    timestamp: datetime = field(factory=_now)
    correlation_id: str | None = None
    causation_id: str | None = None
    type_name: str = field(default=Factory(_declared_name, takes_self=True))
    schema_version: int = field(default=Factory(_declared_version, takes_self=True))
    erased: tuple[str, ...] = ()
    """Personal fields whose subject was forgotten: they hold their declared ``erased``
    value (see :mod:`eventlane.codec.privacy`)."""

    def __attrs_post_init__(self) -> None:
        # One hook instead of per-field validators: envelopes are built on every decode.
        if not self.aggregate_id:
            raise ValueError("envelope aggregate_id must be a non-empty string")
        if self.aggregate_version < 1:
            raise ValueError(f"envelope aggregate_version must be >= 1: {self.aggregate_version}")
        timestamp = self.timestamp
        if type(timestamp) is not datetime or timestamp.tzinfo is not UTC:
            object.__setattr__(self, "timestamp", _utc(timestamp))


_FIELD_NAMES = tuple(f.name for f in fields(Envelope))
_SLOT = {name: Envelope.__dict__[name] for name in _FIELD_NAMES}
"""The member descriptors of Envelope's fields: how a decoder sets them without ``__init__``."""
_SET_EVENT = _SLOT["event"].__set__
_SET_ID = _SLOT["aggregate_id"].__set__
_SET_VERSION = _SLOT["aggregate_version"].__set__
_GET_EVENT_ID = _SLOT["event_id"].__get__
_SET_EVENT_ID = _SLOT["event_id"].__set__
_SET_TIMESTAMP = _SLOT["timestamp"].__set__
_SET_CORRELATION = _SLOT["correlation_id"].__set__
_SET_CAUSATION = _SLOT["causation_id"].__set__
_SET_TYPE = _SLOT["type_name"].__set__
_SET_SCHEMA = _SLOT["schema_version"].__set__
_SET_ERASED = _SLOT["erased"].__set__
_NEW = object.__new__


class LazyEnvelope(Envelope[E]):
    """An :class:`Envelope` as a projection's decoder builds it: ``event_id`` is parsed from
    its stored text when first read (most handlers never read it).

    It is an ``Envelope`` in every way a reader sees: same fields and values, equal to and
    hashed like the eager envelope of the same record, ``attrs.evolve`` and pickle work.
    Invariant: built only by :meth:`decoded`, from fields the decoder already checked (a
    canonical UUID text that parses, a non-empty id, a version >= 1, a UTC timestamp), so
    reading ``event_id`` cannot fail and no check of ``Envelope.__init__`` is skipped.
    """

    __slots__ = ("_event_id_text",)
    _event_id_text: str

    @classmethod
    def decoded(
        cls,
        event: DomainEvent,
        aggregate_id: str,
        aggregate_version: int,
        event_id_text: str,
        timestamp: datetime,
        correlation_id: str | None,
        causation_id: str | None,
        type_name: str,
        schema_version: int,
        erased: tuple[str, ...],
    ) -> LazyEnvelope[Any]:
        """The envelope, built without ``__init__`` (one slot store per field)."""
        envelope: LazyEnvelope[Any] = _NEW(cls)
        _SET_EVENT(envelope, event)
        _SET_ID(envelope, aggregate_id)
        _SET_VERSION(envelope, aggregate_version)
        _SET_TIMESTAMP(envelope, timestamp)
        _SET_CORRELATION(envelope, correlation_id)
        _SET_CAUSATION(envelope, causation_id)
        _SET_TYPE(envelope, type_name)
        _SET_SCHEMA(envelope, schema_version)
        _SET_ERASED(envelope, erased)
        _SET_TEXT(envelope, event_id_text)
        return envelope

    def _event_id(self) -> UUID:
        try:
            return _GET_EVENT_ID(self)  # type: ignore[no-any-return]
        except AttributeError:  # not parsed yet
            event_id = parse_uuid(self._event_id_text)
            _SET_EVENT_ID(self, event_id)
            return event_id

    event_id = property(_event_id, _SET_EVENT_ID)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Envelope):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELD_NAMES)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = Envelope.__hash__


_SET_TEXT = LazyEnvelope.__dict__["_event_id_text"].__set__


class EncodedRecord(NamedTuple):
    """A log record to append: ``(key, value, headers)`` (an envelope or a snapshot)."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def event_type_from_headers(headers: Sequence[tuple[str, bytes]]) -> EventType | None:
    """The *stored* (type name, version) from a record's headers, without parsing JSON.

    ``None`` when either header is missing or malformed. Useful to skip records a
    consumer does not handle; aliases and upcasting are not applied.

    >>> event_type_from_headers([("event-type", b"OrderPlaced"), ("event-version", b"2")])
    EventType(name='OrderPlaced', version=2)
    """
    name: str | None = None
    version: int | None = None
    for key, raw in headers:
        if key == HEADER_TYPE:
            try:
                name = raw.decode()
            except UnicodeDecodeError:
                return None
        elif key == HEADER_VERSION and raw.isdigit():
            version = int(raw)
    if name is None or version is None:
        return None
    return EventType(name, version)
