"""The codec layer: events ↔ log records (JSON values, cattrs + orjson).

* :class:`EventRegistry` maps wire type names and schema versions to event classes, with
  aliases for renamed types and upcaster chains for old versions;
* :class:`Envelope` wraps an event with its store metadata; :class:`EventCodec` encodes an
  envelope to ``(key, value, headers)`` and decodes records back, upcasting on the way;
* :class:`SnapshotCodec` does the same for aggregate snapshots;
* :func:`make_converter` is the tuned cattrs converter they share.

Layout of records and versioning rules: ``docs/events.md``.
"""

from eventlane.codec.converter import describe_structure_error, make_converter
from eventlane.codec.envelope import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_EVENT_ID,
    HEADER_TYPE,
    HEADER_VERSION,
    EncodedRecord,
    Envelope,
    event_type_from_headers,
)
from eventlane.codec.event_codec import EventCodec
from eventlane.codec.registry import EventRegistry, Resolution
from eventlane.codec.snapshot import (
    HEADER_AGGREGATE_VERSION,
    HEADER_SNAPSHOT_VERSION,
    SnapshotCodec,
)
from eventlane.codec.upcasting import UpcastChain, Upcaster, check_upcasters

__all__ = [
    "EventRegistry",
    "Resolution",
    "Upcaster",
    "UpcastChain",
    "check_upcasters",
    "Envelope",
    "EncodedRecord",
    "EventCodec",
    "event_type_from_headers",
    "HEADER_TYPE",
    "HEADER_VERSION",
    "HEADER_EVENT_ID",
    "HEADER_CORRELATION_ID",
    "HEADER_CAUSATION_ID",
    "SnapshotCodec",
    "HEADER_SNAPSHOT_VERSION",
    "HEADER_AGGREGATE_VERSION",
    "make_converter",
    "describe_structure_error",
]
