"""Encode envelopes to log records and decode records back, upcasting old versions.

The record layout is described in :mod:`eventlane.codec.envelope` and ``docs/events.md``.

Speed: per event class and per stored (name, version), the generated cattrs functions,
the upcaster chain and the header bytes are looked up once and cached; a decode is one
``orjson.loads``, a few type checks and one call of the generated structure function.

Errors: nothing raw escapes. Bad JSON, a missing or mistyped envelope field, a field of the
event with the wrong type, a key or header disagreeing with the value: all raise
:class:`~eventlane.errors.SerializationError` with the type name and version when known and
the ``topic``/``partition``/``offset`` the caller passed in. An unknown type or version
raises :class:`~eventlane.errors.UnknownEventTypeError`; a failing upcaster
:class:`~eventlane.errors.UpcastError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import attrs
import orjson
from attrs import frozen

from eventlane.codec.converter import (
    OrjsonConverter,
    describe_structure_error,
    fast_structure_fn,
    make_converter,
    parse_uuid,
)
from eventlane.codec.envelope import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_EVENT_ID,
    HEADER_TYPE,
    HEADER_VERSION,
    EncodedRecord,
    Envelope,
    LazyEnvelope,
)
from eventlane.codec.keystore import KeyStore
from eventlane.codec.privacy import CIPHER_MARK, FieldCipher
from eventlane.codec.registry import EventRegistry
from eventlane.codec.upcasting import UpcastChain
from eventlane.domain import DomainEvent
from eventlane.domain.privacy import personal_fields, subject_field
from eventlane.errors import SerializationError
from eventlane.tracing import TRACEPARENT, inject

__all__ = ["EventCodec"]

_STR = str
_INT = int
_NAME = itemgetter(0)
_OTHER_HEADERS = frozenset((HEADER_EVENT_ID, HEADER_CORRELATION_ID, HEADER_CAUSATION_ID))
_CANONICAL_UUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
).fullmatch
"""The form whose parse cannot fail: a :class:`LazyEnvelope` may defer it."""
_FROM_ISO = datetime.fromisoformat


@frozen
class _Writer:
    name: str
    version: int
    name_bytes: bytes
    version_bytes: bytes
    unstructure: Callable[[Any], Any]
    personal: bool
    topic: str
    """The logical topic personal fields' cipher texts are bound to ("" when unknown)."""


@frozen
class _Reader:
    cls: type[DomainEvent]
    name: str  # current
    version: int  # current
    stored_name_bytes: bytes
    stored_version_bytes: bytes
    routing: tuple[tuple[str, bytes], tuple[str, bytes]]
    """The first two headers :meth:`EventCodec.encode` writes for this stored type."""
    chain: UpcastChain | None
    structure: Callable[[Any, type], Any]
    per_field: bool
    """Whether values may hold per-field (``enc1``) cipher objects: the class declares
    personal fields, or the stored version is upcast (an older one may have)."""
    topics: frozenset[str]
    """The logical topics an ``enc4`` cipher object of this class may be bound to (empty:
    not checked, a codec whose registry knows no aggregate of the class)."""


class EventCodec:
    """Encodes :class:`Envelope` objects to records and decodes them, via a registry.

    ``configure`` is called with each converter the codec builds (a fast one and a
    detailed one for error messages), to register hooks for the user's own value types.
    """

    def __init__(
        self,
        registry: EventRegistry,
        *,
        configure: Callable[[OrjsonConverter], None] | None = None,
        keys: KeyStore | None = None,
    ) -> None:
        self._registry = registry
        self._converter = make_converter()
        self._detailed = make_converter(detailed_validation=True)
        if configure is not None:
            configure(self._converter)
            configure(self._detailed)
        self._fast = configure is None  # user hooks may change how any field structures
        self._writers: dict[type[DomainEvent], _Writer] = {}
        self._readers: dict[tuple[str, int], _Reader] = {}
        self._generation = -1
        self._cipher = None if keys is None else FieldCipher(keys, self._converter.unstructure)

    @property
    def keys(self) -> KeyStore | None:
        """The key store personal fields are encrypted with (``None``: not configured)."""
        return None if self._cipher is None else self._cipher.keys

    def seals_from_memory(self, envelopes: Iterable[Envelope[Any]]) -> bool:
        """Whether encoding ``envelopes`` asks the key store for no record of its own (no
        key store, no personal field, or the subjects' keys in memory: see
        :meth:`KeyStore.holds <eventlane.codec.keystore.KeyStore.holds>`). When it does
        (a subject's first key: a read, a conditional write), the encoding is blocking work
        that an event loop hands to a thread; the store's periodic catch-up is not counted
        (an async runtime keeps it caught up from its loop: :mod:`eventlane.app.aio_keys`)."""
        cipher = self._cipher
        if cipher is None:
            return True
        return all(cipher.seals_from_memory(env.event, env.aggregate_id) for env in envelopes)

    def due_keys(self, envelopes: Iterable[Envelope[Any]]) -> KeyStore | None:
        """The key store when encoding ``envelopes`` asks it for a key (a personal field)
        and it is due for its periodic catch-up (its ``due``); else ``None``."""
        cipher = self._cipher
        if cipher is None or not getattr(cipher.keys, "due", False):
            return None
        if any(cipher.plan(type(env.event)).fields for env in envelopes):
            return cipher.keys
        return None

    def plain_values(self, value: bytes | None) -> tuple[str, ...]:
        """The personal plain text in a stored record's value (error paths only: see
        :meth:`FieldCipher.plain_values`); ``()`` without a key store."""
        if self._cipher is None:
            return ()
        try:
            doc = orjson.loads(value or b"null")
            reader = self._readers.get((doc["type"], doc["version"])) or self._reader(
                doc["type"], doc["version"], None, None, None
            )
        except Exception:  # not an event this codec reads: no plain text of it
            return ()
        return self._cipher.plain_values(value, reader.topics)

    @property
    def registry(self) -> EventRegistry:
        """The registry the codec reads types, aliases and upcasters from."""
        return self._registry

    @property
    def converter(self) -> OrjsonConverter:
        """The (fast) converter used for event data."""
        return self._converter

    def _sync(self) -> None:
        if self._generation != self._registry.generation:
            self._registry.validate()
            self._writers.clear()
            self._readers.clear()
            self._generation = self._registry.generation

    # -- encode ---------------------------------------------------------------------------

    def _writer(self, cls: type[DomainEvent]) -> _Writer:
        declared = self._registry.type_of(cls)
        writer = _Writer(
            name=declared.name,
            version=declared.version,
            name_bytes=declared.name.encode(),
            version_bytes=str(declared.version).encode(),
            unstructure=self._converter.get_unstructure_hook(cls),
            personal=_declares_personal(cls),
            topic=min(self._registry.topics_of(cls), default=""),
        )
        self._writers[cls] = writer
        return writer

    def encode(self, envelope: Envelope[Any]) -> EncodedRecord:
        """The record for ``envelope``: ``(key, value, headers)``.

        The event's class must be registered, and ``envelope.type_name``/``schema_version``
        must be its current declaration.
        """
        self._sync()
        event = envelope.event
        writer = self._writers.get(type(event)) or self._writer(type(event))
        if envelope.type_name != writer.name or envelope.schema_version != writer.version:
            raise SerializationError(
                f"envelope says {envelope.type_name!r} version {envelope.schema_version} but "
                f"its event is a {type(event).__qualname__}, registered as {writer.name!r} "
                f"version {writer.version}",
                type_name=envelope.type_name,
                version=envelope.schema_version,
            )
        try:
            data = writer.unstructure(event)
        except Exception as exc:
            raise SerializationError(
                f"cannot encode {type(event).__qualname__} as JSON: {exc}",
                type_name=writer.name,
                version=writer.version,
            ) from exc
        if self._cipher is not None:
            data = self._cipher.seal(
                type(event), data, envelope.aggregate_id, str(envelope.event_id), writer.topic
            )
        elif writer.personal:
            raise SerializationError(
                f"{type(event).__qualname__} has personal fields but the codec has no key "
                "store: give the App a key store (App(..., keys=...)) to encrypt them; a test"
                " without a log: app.codec(keys=MemoryKeyStore()), from eventlane.codec.privacy",
                type_name=writer.name,
                version=writer.version,
            )
        try:
            value = orjson.dumps(
                {
                    "type": writer.name,
                    "version": writer.version,
                    "aggregate_id": envelope.aggregate_id,
                    "aggregate_version": envelope.aggregate_version,
                    "event_id": envelope.event_id,
                    "timestamp": envelope.timestamp,
                    "correlation_id": envelope.correlation_id,
                    "causation_id": envelope.causation_id,
                    "data": data,
                }
            )
        except Exception as exc:
            raise SerializationError(
                f"cannot encode {type(event).__qualname__} as JSON: {exc}",
                type_name=writer.name,
                version=writer.version,
            ) from exc
        headers = [
            (HEADER_TYPE, writer.name_bytes),
            (HEADER_VERSION, writer.version_bytes),
            (HEADER_EVENT_ID, str(envelope.event_id).encode()),
        ]
        if envelope.correlation_id is not None:
            headers.append((HEADER_CORRELATION_ID, envelope.correlation_id.encode()))
        if envelope.causation_id is not None:
            headers.append((HEADER_CAUSATION_ID, envelope.causation_id.encode()))
        traceparent = inject()  # the appending span, where tracing is on (eventlane.tracing)
        if traceparent is not None:
            headers.append((TRACEPARENT, traceparent))
        return EncodedRecord(envelope.aggregate_id.encode(), value, headers)

    # -- decode ---------------------------------------------------------------------------

    def _reader(
        self, name: str, version: int, topic: str | None, partition: int | None, offset: int | None
    ) -> _Reader:
        resolution = self._registry.resolve(
            name, version, topic=topic, partition=partition, offset=offset
        )
        structure = self._converter.get_structure_hook(resolution.cls)
        if self._fast:
            structure = fast_structure_fn(resolution.cls, structure) or structure
        reader = _Reader(
            cls=resolution.cls,
            name=resolution.event_type.name,
            version=resolution.event_type.version,
            stored_name_bytes=name.encode(),
            stored_version_bytes=str(version).encode(),
            routing=((HEADER_TYPE, name.encode()), (HEADER_VERSION, str(version).encode())),
            chain=resolution.chain,
            structure=structure,
            per_field=resolution.chain is not None or _declares_personal(resolution.cls),
            topics=self._registry.topics_of(resolution.cls),
        )
        self._readers[(name, version)] = reader
        return reader

    def decode(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        lazy: bool = False,
    ) -> Envelope[DomainEvent]:
        """The envelope stored in a record, its event upcast to the current class.

        ``key`` and ``headers`` may be omitted (a value read alone); when given they must
        agree with the value. ``topic``/``partition``/``offset`` only label errors.
        ``lazy=True`` (what projectors use): a :class:`LazyEnvelope`, equal to the eager
        one, whose ``event_id`` is parsed when first read; every check is made and every
        error raised as without it.
        """
        self._sync()
        try:
            doc = orjson.loads(value)  # type: ignore[arg-type]
        except (orjson.JSONDecodeError, TypeError) as exc:
            what = "a tombstone (null value)" if value is None else f"not valid JSON ({exc})"
            raise SerializationError(
                f"event record value is {what}", topic=topic, partition=partition, offset=offset
            ) from None
        if type(doc) is not dict:
            raise SerializationError(
                f"event record value is a JSON {type(doc).__name__}, expected an object",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        name = doc.get("type")
        version = doc.get("version")
        if type(name) is not _STR or type(version) is not _INT:
            raise SerializationError(
                'event record value lacks a string "type" and an integer "version"',
                type_name=name if type(name) is _STR else None,
                topic=topic,
                partition=partition,
                offset=offset,
            )
        reader = self._readers.get((name, version)) or self._reader(
            name, version, topic, partition, offset
        )
        try:
            aggregate_id = doc["aggregate_id"]
            aggregate_version = doc["aggregate_version"]
            event_id = doc["event_id"]
            timestamp = doc["timestamp"]
            correlation_id = doc["correlation_id"]
            causation_id = doc["causation_id"]
            data = doc["data"]
        except KeyError as exc:
            raise SerializationError(
                f"event record value lacks the envelope field {exc}",
                type_name=name,
                version=version,
                topic=topic,
                partition=partition,
                offset=offset,
            ) from None
        if (
            type(aggregate_id) is not _STR
            or type(aggregate_version) is not _INT
            or type(event_id) is not _STR
            or type(timestamp) is not _STR
            or (correlation_id is not None and type(correlation_id) is not _STR)
            or (causation_id is not None and type(causation_id) is not _STR)
            or type(data) is not dict
        ):
            raise self._envelope_error(doc, name, version, topic, partition, offset)
        if key is not None and key != aggregate_id.encode():
            raise SerializationError(
                f"record key {key!r} differs from the value's aggregate_id {aggregate_id!r}",
                type_name=name,
                version=version,
                topic=topic,
                partition=partition,
                offset=offset,
            )
        if (
            headers
            and (  # the encoder's own layout agrees at a glance; anything else: checked
                tuple(headers[:2]) != reader.routing
                or not _OTHER_HEADERS.issuperset(map(_NAME, headers[2:]))
            )
        ):
            self._check_headers(headers, reader, name, version, topic, partition, offset)
        erased: tuple[str, ...] = ()
        if self._cipher is not None and (reader.per_field or CIPHER_MARK in data):
            open4 = self._cipher.open4  # the same in one C call, or False: see its note
            if open4 is None or not (
                open4(data, event_id, aggregate_id, reader.topics)
                or (  # a subject's first event: its key opened, then the C call again
                    self._cipher.open_key(data)
                    and open4(data, event_id, aggregate_id, reader.topics)
                )
            ):
                erased = self._cipher.open(
                    data, event_id, topic, partition, offset, aggregate_id, reader.topics
                )
        elif CIPHER_MARK in data:
            raise self._no_key_store(reader, topic, partition, offset)
        if erased:  # upcasters see placeholders, never a Sealed marker (privacy.md)
            data = self._cipher.erase(reader.cls, data)  # type: ignore[union-attr]
        if reader.chain is not None:
            data = reader.chain(data, topic=topic, partition=partition, offset=offset)
            if erased:  # what an upcaster made of a placeholder is a placeholder again
                data = self._cipher.placeholders(reader.cls, data, erased)  # type: ignore[union-attr]
                erased = tuple(f.name for f in personal_fields(reader.cls)) or erased
        try:
            event = reader.structure(data, reader.cls)
        except Exception as exc:
            raise self._structure_error(exc, reader, data, topic, partition, offset) from None
        if lazy and aggregate_id and aggregate_version >= 1 and _CANONICAL_UUID(event_id):
            try:
                at = _FROM_ISO(timestamp)
            except ValueError:
                at = None  # the eager path below raises the error
            if at is not None and at.tzinfo is UTC:
                return LazyEnvelope.decoded(
                    event,
                    aggregate_id,
                    aggregate_version,
                    event_id,
                    at,
                    correlation_id,
                    causation_id,
                    reader.name,
                    reader.version,
                    erased,
                )
        try:
            return Envelope(
                event,
                aggregate_id,
                aggregate_version,
                parse_uuid(event_id),
                datetime.fromisoformat(timestamp),
                correlation_id,
                causation_id,
                reader.name,
                reader.version,
                erased,
            )
        except (ValueError, TypeError) as exc:
            raise SerializationError(
                f"bad envelope field in event record value: {exc}",
                type_name=name,
                version=version,
                topic=topic,
                partition=partition,
                offset=offset,
            ) from None

    def _check_headers(
        self,
        headers: Sequence[tuple[str, bytes]],
        reader: _Reader,
        name: str,
        version: int,
        topic: str | None,
        partition: int | None,
        offset: int | None,
    ) -> None:
        for header, raw in headers:
            if (header == HEADER_TYPE and raw != reader.stored_name_bytes) or (
                header == HEADER_VERSION and raw != reader.stored_version_bytes
            ):
                raise SerializationError(
                    f"record header {header}={raw!r} disagrees with the value's "
                    f"type {name!r} version {version}",
                    type_name=name,
                    version=version,
                    topic=topic,
                    partition=partition,
                    offset=offset,
                )

    @staticmethod
    def _envelope_error(
        doc: dict[str, Any],
        name: str,
        version: int,
        topic: str | None,
        partition: int | None,
        offset: int | None,
    ) -> SerializationError:
        expected = {
            "aggregate_id": "a string",
            "aggregate_version": "an integer",
            "event_id": "a UUID string",
            "timestamp": "an ISO 8601 string",
            "correlation_id": "a string or null",
            "causation_id": "a string or null",
            "data": "an object",
        }
        wrong = [
            f"{field} must be {what}, got {type(doc[field]).__name__}"
            for field, what in expected.items()
            if not _has_type(doc[field], field)
        ]
        return SerializationError(
            f"bad envelope in event record value: {'; '.join(wrong)}",
            type_name=name,
            version=version,
            topic=topic,
            partition=partition,
            offset=offset,
        )

    @staticmethod
    def _no_key_store(
        reader: _Reader, topic: str | None, partition: int | None, offset: int | None
    ) -> SerializationError:
        return SerializationError(
            f"{reader.name} has encrypted personal fields and the codec has no key store: "
            "open the App with its key store to read them",
            type_name=reader.name,
            version=reader.version,
            topic=topic,
            partition=partition,
            offset=offset,
        )

    def _structure_error(
        self,
        exc: Exception,
        reader: _Reader,
        data: dict[str, Any],
        topic: str | None,
        partition: int | None,
        offset: int | None,
    ) -> SerializationError:
        try:
            self._detailed.structure(data, reader.cls)
        except Exception as detailed:
            exc = detailed
        upcast = (
            "" if reader.chain is None else f" (upcast from version {reader.chain.from_version})"
        )
        if self._cipher is None and any(
            type(v) is dict and CIPHER_MARK in v for v in data.values()
        ):
            return self._no_key_store(reader, topic, partition, offset)
        described = describe_structure_error(exc, root="data")
        return SerializationError(
            f"cannot decode {reader.name}{upcast} into {reader.cls.__qualname__}: "
            f"{described}{_schema_change_hint(described, data, reader)}",
            type_name=reader.name,
            version=reader.version,
            topic=topic,
            partition=partition,
            offset=offset,
        )


def _declares_personal(cls: type) -> bool:
    """Whether ``cls`` has personal fields (checking its declaration: see
    :func:`~eventlane.domain.privacy.subject_field`)."""
    subject_field(cls)
    return bool(personal_fields(cls))


def _schema_change_hint(described: str, data: dict[str, Any], reader: _Reader) -> str:
    """A hint when stored data lacks a field the class requires: the class changed shape
    without a new version (a renamed or added field)."""
    if "required field missing" not in described or not attrs.has(reader.cls):
        return ""
    declared = {f.name for f in attrs.fields(reader.cls)}
    unknown = sorted(set(data) - declared)
    stored = f" (stored data has {', '.join(map(repr, unknown))})" if unknown else ""
    return (
        f"; renamed a field?{stored} bump the version of {reader.name!r} and add an upcaster"
        " from the stored version (docs/events.md, section 5)"
    )


def _has_type(value: object, field: str) -> bool:
    if field in ("correlation_id", "causation_id"):
        return value is None or type(value) is str
    if field == "aggregate_version":
        return type(value) is int
    if field == "data":
        return type(value) is dict
    return type(value) is str
