"""A classic Kafka group's generation, read from its coordinator's own record.

Kafka's group description (``DescribeGroups``) carries no generation id, and neither does
anything else an admin client can ask for. The coordinator keeps it in
``__consumer_offsets``: at the end of every rebalance it writes the group's *GroupMetadata*
record (key version 2: the group id; value: protocol type, **generation**, protocol,
leader, members), in the partition ``abs(javaHashCode(group id)) % partitions`` that also
holds its offset commits. :func:`group_generation` reads the latest such record of a group,
scanning back from the partition's high-water mark in growing windows (the offset commits
written since the last rebalance lie after it).

Invariants: the generation returned is the one the coordinator last stored for the group (it
is the generation its members synchronised with, and only grows); -1 when there is none (no
group, a group deleted, one whose records the log cleaner removed, or nothing found within
``timeout``). A record that does not parse as the documented schema is skipped, never
misread.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as Kp

OFFSETS_TOPIC = "__consumer_offsets"
_GROUP_METADATA_KEY = 2
_FIRST_WINDOW = 2_000


def coordinator_partition(group_id: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` that holds ``group_id``'s records (Kafka's
    ``Utils.abs(groupId.hashCode()) % partitions``).

    >>> coordinator_partition("workers", 50), coordinator_partition("polygenelubricants", 50)
    (41, 0)
    """
    units = group_id.encode("utf-16-be")  # Java's String.hashCode runs over UTF-16 units
    h = 0
    for (unit,) in struct.iter_unpack(">H", units):
        h = (31 * h + unit) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def _group_of(key: bytes | None) -> str | None:
    """The group id of a GroupMetadata key (``None``: another kind of record)."""
    if key is None or len(key) < 4:
        return None
    version, length = struct.unpack_from(">hh", key)
    if version != _GROUP_METADATA_KEY or len(key) != 4 + length:
        return None
    return key[4:].decode(errors="replace")


def _generation_of(value: bytes | None) -> int | None:
    """The generation in a GroupMetadata value (``None``: a tombstone or unparsable).
    Versions 0-3 write the protocol type as an int16-prefixed string, version 4 (flexible)
    as a compact string (unsigned varint length + 1)."""
    if value is None or len(value) < 2:
        return None
    (version,) = struct.unpack_from(">h", value)
    at = 2
    try:
        if version >= 4:
            n, shift = 0, 0
            while True:
                byte = value[at]
                at += 1
                n |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            at += max(n - 1, 0)
        else:
            (length,) = struct.unpack_from(">h", value, at)
            at += 2 + max(length, 0)
        (generation,) = struct.unpack_from(">i", value, at)
    except (IndexError, struct.error):
        return None
    return int(generation)


def group_generation(config: dict[str, Any], group_id: str, timeout: float) -> int:
    """``group_id``'s generation as its coordinator last stored it (module docstring)."""
    consumer = Consumer(
        {
            **config,
            "group.id": "eventlane-unused",  # assign() only: never joined nor committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    deadline = time.monotonic() + timeout
    try:
        meta = consumer.list_topics(OFFSETS_TOPIC, timeout=timeout).topics.get(OFFSETS_TOPIC)
        if meta is None or meta.error is not None or not meta.partitions:
            return -1
        partition = coordinator_partition(group_id, len(meta.partitions))
        low, high = consumer.get_watermark_offsets(
            Kp(OFFSETS_TOPIC, partition), timeout=timeout, cached=False
        )
        end, window = high, _FIRST_WINDOW
        while end > low and time.monotonic() < deadline:
            start = max(low, end - window)
            found = _latest(consumer, partition, group_id, start, end, deadline)
            if found is not None:
                return found if found >= 0 else -1
            end, window = start, window * 4
        return -1
    finally:
        consumer.close()


def _latest(
    consumer: Consumer, partition: int, group_id: str, start: int, end: int, deadline: float
) -> int | None:
    """The generation in the last GroupMetadata record of ``group_id`` in ``[start, end)``
    (-2 for a tombstone: the group was deleted), ``None`` when there is none."""
    consumer.assign([Kp(OFFSETS_TOPIC, partition, start)])
    found: int | None = None
    nxt = start
    while nxt < end and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=1000, timeout=0.5):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return found
                continue
            offset = m.offset() or 0
            if offset >= end:
                return found
            nxt = offset + 1
            if _group_of(m.key()) == group_id:
                value = m.value()
                generation = _generation_of(value)
                if value is None:
                    found = -2
                elif generation is not None:
                    found = generation
    return found
