"""Records as producers hand them in and as consumers get them back.

A record is the log's unit of data (brief section 2): an optional key, an optional value (a
null value is a *tombstone*), ordered headers, and a timestamp in milliseconds. The log knows
nothing of what the bytes mean.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

RECORD_OVERHEAD = 28
"""Bytes a record takes in a batch beyond its key and value (an upper bound for the size
check against ``max_record_bytes``)."""

Header = tuple[str, bytes | None]
"""One header: a UTF-8 name and an optional byte value. Names may repeat; order is kept."""


class TimestampType(enum.IntEnum):
    """Who set a record's timestamp: the producer (``CREATE_TIME``) or the log on append."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ProducerRecord(NamedTuple):
    """A record to append. ``timestamp`` is ms since the epoch; ``None`` means "now"."""

    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[Header, ...] = ()
    timestamp: int | None = None


class Record(NamedTuple):
    """A record read back from a partition.

    Invariant: within one ``(topic, partition)`` offsets strictly increase in read order.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


class RecordMetadata(NamedTuple):
    """Where an appended record landed. Returned only once the record is durable."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class TopicPartition(NamedTuple):
    """A partition of a topic, as consumers name it."""

    topic: str
    partition: int
