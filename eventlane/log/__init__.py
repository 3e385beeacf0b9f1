"""The partitioned, append-only log (bytes only; knows nothing of events).

Public surface: :class:`Log` (the port's core role), the other roles (:class:`KeyedLog`,
:class:`MaintainedLog`, :class:`FencedLog`; :mod:`.port`) and the value types (:mod:`.types`), the
:class:`LocalDir` of local state, :class:`Producer`, records and topic configuration.
:class:`LogStore`, the embedded implementation, is loaded on first use (PEP 562), so that
importing the port does not import an engine (nor :class:`Producer` its threads); layers
above open an engine through :mod:`eventlane.engine`, never by naming ``LogStore``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventlane.log.config import TopicConfig
from eventlane.log.local import LocalDir
from eventlane.log.port import FencedLog, KeyedLog, Log, MaintainedLog
from eventlane.log.record import (
    Header,
    ProducerRecord,
    Record,
    RecordMetadata,
    TimestampType,
    TopicPartition,
)
from eventlane.log.types import Cursor, Expect, PartitionOffsets, TopicDescription

if TYPE_CHECKING:
    from eventlane.log.embedded.store import LogStore
    from eventlane.log.producer import Producer

__all__ = [
    "Cursor",
    "Expect",
    "FencedLog",
    "Header",
    "KeyedLog",
    "LocalDir",
    "Log",
    "LogStore",
    "MaintainedLog",
    "PartitionOffsets",
    "Producer",
    "ProducerRecord",
    "Record",
    "RecordMetadata",
    "TimestampType",
    "TopicConfig",
    "TopicDescription",
    "TopicPartition",
]


if not TYPE_CHECKING:  # type checkers see the import above

    def __getattr__(name: str) -> Any:
        if name == "LogStore":
            from eventlane.log.embedded.store import LogStore  # noqa: PLC0415

            return LogStore
        if name == "Producer":  # its threads and futures cost a CLI command's start-up
            from eventlane.log.producer import Producer  # noqa: PLC0415

            return Producer
        raise AttributeError(f"module 'eventlane.log' has no attribute {name!r}")
