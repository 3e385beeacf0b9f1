"""Records between eventlane and confluent-kafka: batch sizes and conversions.

The per-record work of :class:`~framework.log.kafka.log.KafkaLog`'s appends and reads and of
the group consumer's polls, kept flat because it runs once per record on the hot paths
(``benchmarks/bench_kafka_engine.py`` compares them with raw confluent-kafka doing the least
the same operation needs).

Invariants: :func:`batches` splits an append into Kafka record batches that each fit
``limit`` bytes (the topic's ``max.message.bytes`` and ``segment.bytes``) by the same size
estimate whatever the split, and refuses (nothing sent) a record that fits no batch or an
atomic append that fits no single batch. :func:`kafka_records` builds every
:class:`~framework.log.record.Record` read from Kafka (:func:`kafka_record`: one).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from confluent_kafka import Message

from framework.errors import RecordTooLargeError
from framework.log.record import Record, TimestampType
from framework.log.types import RecordTuple

BATCH_OVERHEAD = 61
"""Bytes of a v2 record batch's header."""
RECORD_OVERHEAD = 21
"""Most bytes a record adds beside its key, value and headers (attributes, varints)."""
HEADER_OVERHEAD = 10
"""Most bytes a header adds beside its name and value."""

_KINDS = (TimestampType.CREATE_TIME, TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME)
"""eventlane's timestamp type by librdkafka's (0 not available, 1 create time, 2 log append)."""
_key, _value, _headers = itemgetter(0), itemgetter(1), itemgetter(2)
_new = tuple.__new__  # a record without the named tuple's Python-level __new__


def record_size(r: RecordTuple) -> int:
    """The most bytes ``r`` takes in a record batch."""
    key, value, headers, _ = r
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    return size + _headers_size(headers) if headers else size


def _headers_size(headers: Sequence[tuple[str, bytes | None]]) -> int:
    return sum(HEADER_OVERHEAD + len(k.encode()) + len(v or b"") for k, v in headers)


def _total_size(records: Sequence[RecordTuple]) -> int:
    """The sum of :func:`record_size` over ``records``, by C-level passes over keys and
    values (Python steps only for records with headers)."""
    size = RECORD_OVERHEAD * len(records)
    size += sum(map(len, filter(None, map(_key, records))))
    size += sum(map(len, filter(None, map(_value, records))))
    return size + sum(map(_headers_size, filter(None, map(_headers, records))))


def batches(
    records: Sequence[RecordTuple], limit: int, atomic: bool, topic: str, partition: int
) -> tuple[list[Sequence[RecordTuple]], int]:
    """``records`` as consecutive batches of at most ``limit`` bytes each, and their size."""
    total = _total_size(records)
    if BATCH_OVERHEAD + total <= limit:  # the common case: one batch, no size per record
        return [records], total
    sizes = list(map(record_size, records))
    out: list[Sequence[RecordTuple]] = []
    chunk: list[RecordTuple] = []
    size = BATCH_OVERHEAD
    for r, one in zip(records, sizes, strict=True):
        if BATCH_OVERHEAD + one > limit:
            raise RecordTooLargeError(
                f"a record of about {one} bytes exceeds max_record_bytes or"
                f" segment_bytes ({limit})",
                topic=topic,
                partition=partition,
            )
        if size + one > limit and chunk:
            if atomic:
                raise RecordTooLargeError(
                    f"an atomic append must fit one batch of max_record_bytes and"
                    f" segment_bytes ({limit})",
                    topic=topic,
                    partition=partition,
                )
            out.append(chunk)
            chunk, size = [], BATCH_OVERHEAD
        chunk.append(r)
        size += one
    out.append(chunk)
    return out, total


def kafka_record(topic: str, partition: int, m: Message, offset: int) -> Record:
    """A consumed message (no error) at ``offset`` as eventlane's :class:`Record`."""
    return kafka_records(topic, partition, (m,), (offset,))[0]


def kafka_records(
    topic: str, partition: int, msgs: Sequence[Message], offsets: Sequence[int]
) -> list[Record]:
    """Consumed messages (no errors) and their offsets as eventlane's records: one
    comprehension, the read's per-record cost (no Python statement per record)."""
    return [
        _new(
            Record,
            (
                topic,
                partition,
                at,
                (t := m.timestamp())[1],
                _KINDS[t[0]],
                m.key(),
                m.value(),
                tuple(h) if (h := m.headers()) else (),
            ),
        )
        for m, at in zip(msgs, offsets)  # noqa: B905 (equal lengths by construction; strict costs)
    ]
