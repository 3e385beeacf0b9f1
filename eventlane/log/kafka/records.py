"""Records between eventlane and confluent-kafka: batch sizes and conversions.

The per-record work of :class:`~eventlane.log.kafka.log.KafkaLog`'s appends and reads and of
the group consumer's polls, kept flat because it runs once per record on the hot paths
(``benchmarks/bench_kafka_engine.py`` compares them with raw confluent-kafka doing the least
the same operation needs).

Invariants: :func:`batches` splits an append into Kafka record batches that each fit
``limit`` bytes (the topic's ``max.message.bytes`` and ``segment.bytes``) by the same size
estimate whatever the split, and refuses (nothing sent) a record that fits no batch or an
atomic append that fits no single batch. :func:`take_messages` builds the records of
:class:`~eventlane.log.kafka.log.KafkaLog`'s reads, :func:`kafka_record` the group
consumer's, the same :class:`~eventlane.log.record.Record` for the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter

from confluent_kafka import Message

from eventlane.errors import RecordTooLargeError
from eventlane.log.record import Record, TimestampType
from eventlane.log.types import RecordTuple

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
    t = m.timestamp()
    h = m.headers()
    return _new(
        Record,
        (topic, partition, offset, t[1], _KINDS[t[0]], m.key(), m.value(), tuple(h) if h else ()),
    )


def _py_take_messages(
    msgs: list[Message],
    topic: str,
    partition: int,
    nxt: int,
    stop: int,
    size: int,
    max_bytes: int,
    kinds: tuple[int, ...],
    out: list[Record],
    record_cls: type[Record] = Record,
) -> tuple[int, int, int]:
    """The reference of :func:`take_messages` (used without the C extension)."""
    del kinds, record_cls  # the C version's; kafka_record knows them
    for i, m in enumerate(msgs):
        if m.error() is not None:
            return i, size, nxt
        offset = m.offset() or 0
        if offset < nxt:
            continue  # fetched for an earlier assignment of this partition
        if 0 <= stop <= offset or (out and size >= max_bytes):
            return i, size, nxt
        out.append(kafka_record(topic, partition, m, offset))
        size += len(m)
        nxt = offset + 1
    return len(msgs), size, nxt


TakeFn = Callable[
    [list[Message], str, int, int, int, int, int, tuple[int, ...], list[Record], type[Record]],
    tuple[int, int, int],
]

try:  # pragma: no cover - exercised by whichever implementation is present
    from eventlane.log import _native  # type: ignore[attr-defined]

    _take: TakeFn = _native.take_messages
except ImportError:  # pragma: no cover
    _take = _py_take_messages


def take_messages(
    msgs: list[Message],
    topic: str,
    partition: int,
    nxt: int,
    stop: int,
    size: int,
    max_bytes: int,
    out: list[Record],
) -> tuple[int, int, int]:
    """A read's step over consumed messages ``msgs``, in one pass: skip those below offset
    ``nxt`` (fetched for an earlier assignment), then append each message's record to
    ``out`` while its offset is below ``stop`` (negative: no bound) and ``size`` (the value
    bytes ``out`` holds) is below ``max_bytes`` (the first record of an empty ``out``
    always), stopping at the first message with an error (an event). Returns the index of
    the first message not used (an event, or a record left for the next read), the new
    ``size`` and the offset after the last record taken.

    In C (``eventlane.log._native.take_messages``: no Python step per message, records
    without headers untracked from the cyclic GC) when the extension is built; the same
    as :func:`_py_take_messages` either way (``tests/kafka_engine/test_kafka_take.py``)."""
    return _take(msgs, topic, partition, nxt, stop, size, max_bytes, _KINDS, out, Record)
