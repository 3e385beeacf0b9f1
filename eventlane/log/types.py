"""The log port's value types: what goes into and comes out of a :class:`~eventlane.log.Log`.

Every engine (the embedded ``LogStore``, a JetStream or Kafka adapter) speaks these types, so
they live apart from any implementation. This module imports only :mod:`.record` and
:mod:`.config`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from typing import NamedTuple, NewType, Protocol

from eventlane.log.config import TopicConfig
from eventlane.log.record import Header

__all__ = [
    "AppendHook",
    "AppendResult",
    "Clock",
    "CompactionReport",
    "Cursor",
    "Expect",
    "FramedBatch",
    "FramedRecords",
    "KeyIndexReport",
    "PartitionDescription",
    "PartitionOffsets",
    "Precondition",
    "Progress",
    "RecordTuple",
    "RetentionReport",
    "SEQUENTIAL",
    "StoredBatch",
    "TopicDescription",
    "wall_clock_ms",
]

Clock = Callable[[], int]
"""Milliseconds since the epoch; an engine's source of append timestamps (tests pass a
:class:`~eventlane.testing.clock.FakeClock`)."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


RecordTuple = tuple[bytes | None, bytes | None, tuple[Header, ...], int | None]
"""``(key, value, headers, timestamp)``; :class:`ProducerRecord` has this shape."""


class AppendResult(NamedTuple):
    """Offsets given to one append call, and the timestamp the log set (LogAppendTime)."""

    base_offset: int
    last_offset: int
    timestamps: list[int]


Cursor = NewType("Cursor", object)
"""Where a sequential reader left off, so that the next ``read`` skips the lookup.

Opaque: an engine's own value behind the port's type. Callers only pass back what ``read``
returned for the same partition, or :data:`SEQUENTIAL`; an engine ignores a cursor that is
not its own."""

SEQUENTIAL = Cursor(object())
"""The cursor of a first read by a reader that will read on from where each read ends
(a consumer's fetcher after an assignment or a seek): an engine may read ahead for it
(JetStream starts an ordered consumer when a backlog is there); to the others it is no
cursor."""


class Expect(NamedTuple):
    """A condition on an append, checked by the engine atomically with the append.

    "Append only if the last record with key ``key`` in this partition is at offset
    ``last_offset``" (``None``: no record with this key exists yet). When it does not hold,
    ``append`` raises :class:`~eventlane.errors.ConcurrencyError` and writes nothing. It is a
    value, so a server can check it (JetStream: ``Nats-Expected-Last-Subject-Sequence``).
    """

    key: bytes
    last_offset: int | None


class StoredBatch(NamedTuple):
    """One batch as the embedded engine stores it (docs/file-format.md), CRC-checked, in
    ``buf[start:end]``; a raw read (:meth:`LogStore.read_batches`) returns these, each
    holding at least one record in ``[offset, upto)`` of the read (the first and last may
    hold records outside it: a reader skips those, as Kafka's clients do)."""

    buf: bytes
    start: int
    end: int


class FramedBatch(abc.ABC):
    """Records in another format that frame themselves as one batch of the embedded engine
    (docs/file-format.md) without a Python object per record: what
    :meth:`FramedRecords.cut` gives. ``len()``: how many records."""

    __slots__ = ()

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def frame(self, base_offset: int, timestamp_type: int, now: int) -> tuple[bytes, list[int]]:
        """The batch at ``base_offset`` and its records' timestamps: the bytes
        ``encode_batch(base_offset, records, timestamp_type=timestamp_type,
        timestamps=stamps)`` gives for these records, where ``stamps`` is ``now`` for a
        record without a timestamp or with ``timestamp_type`` 1 (LogAppendTime), else the
        record's own. ``ValueError`` if the records cannot be framed."""


class FramedRecords(abc.ABC):
    """Records in another format (a Kafka producer's batch) that the embedded engine can
    append without a tuple per record (:meth:`LogStore.append_framed`). ``len()``: how
    many records."""

    __slots__ = ()

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def cut(
        self, overhead: int, max_batch_bytes: int, max_record_bytes: int, keyed: bool
    ) -> list[FramedBatch] | None:
        """The records in batches as the log cuts a records append (each record's size
        estimated as ``overhead`` + key + value + the headers' bound; greedy batches of at
        most ``max_batch_bytes``, at least one record each), or ``None`` where the log would
        refuse a record (one over ``max_record_bytes``, or a null key where ``keyed``):
        the caller then appends :meth:`records`, which the log refuses with its error."""

    @abc.abstractmethod
    def records(self) -> list[RecordTuple]:
        """The same records as tuples, for an engine (or a case) without :meth:`cut`."""


class PartitionOffsets(NamedTuple):
    """The three marks of a partition: ``lwm <= hwm <= leo``."""

    lwm: int
    hwm: int
    leo: int


class PartitionDescription(NamedTuple):
    partition: int
    lwm: int
    hwm: int
    leo: int
    segments: int
    bytes: int
    active_base: int = 0
    """First offset of the active (last) segment: compaction never touches it (an engine
    without segments reports its log end offset)."""

    def to_dict(self) -> dict[str, int]:
        """The documented JSON shape (``eventlane topics describe --json``)."""
        return {k: getattr(self, k) for k in _PARTITION_JSON}


_PARTITION_JSON = ("partition", "lwm", "hwm", "leo", "segments", "bytes")


class TopicDescription(NamedTuple):
    name: str
    partitions: int
    config: TopicConfig
    partition_details: tuple[PartitionDescription, ...]

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of ``eventlane topics describe --json``."""
        return {
            "name": self.name,
            "partitions": [p.to_dict() for p in self.partition_details],
            "config": self.config.to_dict(),
        }


class CompactionReport(NamedTuple):
    topic: str
    partition: int
    segments_before: int
    segments_after: int
    records_scanned: int
    records_kept: int
    bytes_before: int
    bytes_after: int
    seconds: float


class RetentionReport(NamedTuple):
    topic: str
    partition: int
    old_lwm: int
    new_lwm: int
    segments_deleted: int
    bytes_deleted: int
    records_deleted: int
    seconds: float


class KeyIndexReport(NamedTuple):
    """A check of an engine's per-key state (the embedded key index) against the log.

    ``problems`` lists the first few differences; ``problem_count`` counts them all.
    """

    topic: str
    partition: int
    path: str
    mode: str
    entries: int
    next_offset: int
    hwm: int
    problems: tuple[str, ...]
    problem_count: int
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def unindexed(self) -> int:
        """Offsets between the index's end and the high-water mark (lag, not an error)."""
        return max(0, self.hwm - self.next_offset)


class Progress(Protocol):
    """Told how a long maintenance operation (compact, cleanup, verify) advances: called
    after each partition with the partitions done so far, the total, and the partition
    just finished."""

    def __call__(self, done: int, total: int, partition: int) -> None: ...


Precondition = Callable[[int], None]
"""Embedded adapter only: called with the log end offset under the append lock; raise to
refuse the append. Not part of the port (a callback cannot be sent to a server)."""

AppendHook = Callable[[AppendResult], None]
"""Embedded adapter only: called under the append lock once an append is durable and
published (derived data such as the key index is updated here, so no other appender can
interleave). Its errors are logged, never raised: the append has already happened. Hooks of
one group commit that share a ``group`` attribute are called once, as
``hook.together([(hook, result), ...])`` (the key index: one transaction per group)."""
