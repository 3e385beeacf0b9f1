"""Snapshot records for the compacted ``<topic>.snapshots`` topic.

Layout of one snapshot record:

* **key**: the aggregate id, UTF-8 (compaction keeps the latest snapshot per aggregate);
* **headers**: ``snapshot-version`` (the aggregate class's ``snapshot_version`` when it was
  taken) and ``aggregate-version``, both decimal;
* **value**: a JSON object, keys in this order::

    {"aggregate_id": "order-1", "aggregate_version": 100, "snapshot_version": 1,
     "state": {…one key per state attribute, encoded like event fields…}}

The state attributes and their types come from :meth:`Aggregate.state_fields`; they are
encoded with the same converter rules as events (``eventlane.codec.converter``).

Personal data: when the codec has a key store and the aggregate class names a
``snapshot_subject``, ``state`` is one cipher object (see :mod:`eventlane.codec.privacy`)
sealed under that subject's key, with the associated data bound to the aggregate id and
version. Once the subject is forgotten the snapshot cannot be opened: decoding raises
:class:`~eventlane.errors.StaleSnapshotError`, and the store rebuilds from the events
(whose personal fields then read as erased).

A snapshot whose ``snapshot_version`` is not the class's current one raises
:class:`~eventlane.errors.StaleSnapshotError` *before* its state is read: the store ignores
it and rebuilds from events. Any other defect raises
:class:`~eventlane.errors.SerializationError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import orjson

from eventlane.codec.converter import OrjsonConverter, describe_structure_error, make_converter
from eventlane.codec.envelope import EncodedRecord
from eventlane.codec.keystore import KeyStore
from eventlane.codec.privacy import CIPHER_MARK, FieldCipher
from eventlane.domain import Aggregate, Snapshot
from eventlane.errors import SerializationError, StaleSnapshotError

__all__ = ["HEADER_AGGREGATE_VERSION", "HEADER_SNAPSHOT_VERSION", "SnapshotCodec"]

HEADER_SNAPSHOT_VERSION = "snapshot-version"
HEADER_AGGREGATE_VERSION = "aggregate-version"


class SnapshotCodec:
    """Encodes and decodes :class:`~eventlane.domain.Snapshot` records per aggregate class.

    ``configure`` registers hooks for the user's own value types, as for
    :class:`~eventlane.codec.EventCodec`.
    """

    def __init__(
        self,
        *,
        configure: Callable[[OrjsonConverter], None] | None = None,
        keys: KeyStore | None = None,
    ) -> None:
        self._cipher = None if keys is None else FieldCipher(keys)
        self._converter = make_converter()
        self._detailed = make_converter(detailed_validation=True)
        if configure is not None:
            configure(self._converter)
            configure(self._detailed)
        self._state_classes: dict[type[Aggregate], type] = {}

    @property
    def keys(self) -> KeyStore | None:
        """The key store snapshot states are encrypted with (``None``: not configured)."""
        return None if self._cipher is None else self._cipher.keys

    def _state_class(self, aggregate_cls: type[Aggregate]) -> type:
        state_cls = self._state_classes.get(aggregate_cls)
        if state_cls is None:
            state_cls = attrs.make_class(
                f"{aggregate_cls.__qualname__}State",
                {
                    name: attrs.field(type=hint)
                    for name, hint in aggregate_cls.state_fields().items()
                },
                frozen=True,
            )
            self._state_classes[aggregate_cls] = state_cls
        return state_cls

    def encode(self, aggregate_cls: type[Aggregate], snapshot: Snapshot) -> EncodedRecord:
        """The record for ``snapshot`` of an ``aggregate_cls`` aggregate."""
        state_cls = self._state_class(aggregate_cls)
        try:
            state = self._converter.unstructure(state_cls(**snapshot.state), state_cls)
            subject = self._subject(aggregate_cls, snapshot)
            if subject is not None:
                assert self._cipher is not None
                state = self._cipher.seal_value(
                    subject, state, "state", _snapshot_id(snapshot.aggregate_id, snapshot)
                )
            value = orjson.dumps(
                {
                    "aggregate_id": snapshot.aggregate_id,
                    "aggregate_version": snapshot.aggregate_version,
                    "snapshot_version": snapshot.snapshot_version,
                    "state": state,
                }
            )
        except Exception as exc:
            raise SerializationError(
                f"cannot encode snapshot of {aggregate_cls.__qualname__} "
                f"{snapshot.aggregate_id!r}: {exc}",
                version=snapshot.snapshot_version,
            ) from exc
        headers = [
            (HEADER_SNAPSHOT_VERSION, str(snapshot.snapshot_version).encode()),
            (HEADER_AGGREGATE_VERSION, str(snapshot.aggregate_version).encode()),
        ]
        return EncodedRecord(snapshot.aggregate_id.encode(), value, headers)

    def _subject(self, aggregate_cls: type[Aggregate], snapshot: Snapshot) -> str | None:
        attribute = aggregate_cls.snapshot_subject
        if attribute is None or self._cipher is None:
            return None
        subject = snapshot.aggregate_id if attribute == "id" else snapshot.state.get(attribute)
        return subject if isinstance(subject, str) and subject else None

    def decode(
        self,
        aggregate_cls: type[Aggregate],
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Snapshot:
        """The snapshot stored in a record.

        Raises :class:`~eventlane.errors.StaleSnapshotError` when it was taken under another
        ``snapshot_version`` than ``aggregate_cls.snapshot_version``.
        """
        where: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
        name = aggregate_cls.__qualname__
        try:
            doc = orjson.loads(value)  # type: ignore[arg-type]
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise SerializationError(
                f"snapshot record of {name} is not valid JSON ({exc})", **where
            ) from None
        if not (
            type(doc) is dict
            and type(doc.get("aggregate_id")) is str
            and type(doc.get("aggregate_version")) is int
            and type(doc.get("snapshot_version")) is int
            and type(doc.get("state")) is dict
        ):
            raise SerializationError(
                f"snapshot record of {name} lacks aggregate_id, aggregate_version, "
                "snapshot_version or state",
                **where,
            )
        version: int = doc["snapshot_version"]
        if version != aggregate_cls.snapshot_version:
            raise StaleSnapshotError(
                f"snapshot of {name} {doc['aggregate_id']!r} has schema version {version}, "
                f"the class has {aggregate_cls.snapshot_version}: ignore it and rebuild",
                version=version,
                **where,
            )
        if key is not None and key != doc["aggregate_id"].encode():
            raise SerializationError(
                f"snapshot record key {key!r} differs from its aggregate_id "
                f"{doc['aggregate_id']!r}",
                version=version,
                **where,
            )
        for header, raw in headers:
            if header == HEADER_SNAPSHOT_VERSION and raw != str(version).encode():
                raise SerializationError(
                    f"snapshot record header {header}={raw!r} disagrees with its value",
                    version=version,
                    **where,
                )
        raw_state = doc["state"]
        if CIPHER_MARK in raw_state:
            if self._cipher is None:
                raise StaleSnapshotError(
                    f"snapshot of {name} {doc['aggregate_id']!r} is encrypted and the codec "
                    "has no key store: rebuild from events",
                    version=version,
                    **where,
                )
            raw_state = self._cipher.open_value(
                raw_state, "state", _snapshot_id(doc["aggregate_id"], doc), **where
            )
            if raw_state is None:
                raise StaleSnapshotError(
                    f"snapshot of {name} {doc['aggregate_id']!r}: its subject was forgotten; "
                    "rebuild from events",
                    version=version,
                    **where,
                )
        state_cls = self._state_class(aggregate_cls)
        try:
            state: Any = self._converter.structure(raw_state, state_cls)
        except Exception as exc:
            error: BaseException = exc
            try:
                self._detailed.structure(raw_state, state_cls)
            except Exception as detailed:
                error = detailed
            raise SerializationError(
                f"cannot decode snapshot state of {name}: "
                f"{describe_structure_error(error, root='state')}",
                version=version,
                **where,
            ) from None
        try:
            return Snapshot(
                aggregate_id=doc["aggregate_id"],
                aggregate_version=doc["aggregate_version"],
                snapshot_version=version,
                state=attrs.asdict(state, recurse=False),
            )
        except ValueError as exc:
            raise SerializationError(
                f"bad snapshot record of {name}: {exc}", version=version, **where
            ) from None


def _snapshot_id(aggregate_id: str, snapshot: Any) -> str:
    """What a sealed snapshot state is bound to: aggregate id and version."""
    version = (
        snapshot["aggregate_version"] if isinstance(snapshot, dict) else snapshot.aggregate_version
    )
    return f"snapshot:{aggregate_id}@{version}"
