"""The event store: aggregates' event streams on the log, with optimistic concurrency.

An aggregate's events are records keyed by its id, so they all land in one partition of the
aggregate class's topic (Kafka's partitioner), totally ordered. What Kafka cannot do and this
store does: an append is *conditional*. It uses only the log port: ``append(expect=Expect(key,
last_offset))`` appends iff the stream's last record is still at the offset the aggregate was
built from (``None`` for a new stream), checked by the engine atomically with the append, so
two writers can never fork a history: the loser gets
:class:`~eventlane.errors.ConcurrencyError` and nothing of its batch is written. A save's
events form one batch (``atomic=True``), so a crash never leaves part of a save visible.

An append that fails with :class:`~eventlane.errors.OutcomeUnknownError` may or may not be
stored: :meth:`EventStore.outcome` reads the stream back from the log and tells by the
event ids (the retry loop of :mod:`eventlane.store.command` uses it). A conflict, an
unavailable log or an unknown outcome drops the stream's cache entry.

When the caller knows only the expected *version* (not the offset), the store reads the
stream's last record (``key_head`` + one point read), compares its ``aggregate_version`` and
appends expecting that offset: still one atomic check in the engine.

The append and the read-back are plans (:mod:`eventlane.store.steps`: ``append_plan`` and
``outcome_plan`` yield their log calls), so that the command path drives them on a thread or
on an event loop; ``append`` and ``outcome`` drive them on the calling thread.

Reading streams (cached, caught up with the log, snapshotted) is :mod:`.stream`'s: the store
owns a :class:`~eventlane.store.stream.Streams` (``self.streams``), tells it what it
appended, and delegates its reads to it. ``cache_events=0`` turns the cache off.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Sequence
from typing import Any, Final

from eventlane.codec import HEADER_EVENT_ID, Envelope, EventCodec
from eventlane.errors import (
    ConcurrencyError,
    LogUnavailableError,
    OutcomeUnknownError,
    SerializationError,
)
from eventlane.log import KeyedLog, MaintainedLog, Record, RecordMetadata
from eventlane.log.port import keyed_log, maintained_log
from eventlane.log.types import AppendResult, Expect, KeyIndexReport, RecordTuple
from eventlane.metrics import M
from eventlane.observability import get_logger
from eventlane.store.steps import Call, Freshen, LogCall, Step, drive
from eventlane.store.stream import StreamRead, Streams, stored_version
from eventlane.store.stream_cache import DEFAULT_EVENTS, StreamCache

log = get_logger("eventlane.store")

EVENT_TOPIC_CONFIG: dict[str, object] = {
    "retention_ms": -1,
    "cleanup_policy": "delete",
    "index_interval_bytes": 1024,
}
"""The config of an event topic: unbounded retention, no compaction (a rebuild from the
low-water mark sees the whole history), and an offset index entry every KiB instead of every
4 KiB: a stream's load reads its records by offset, and every batch between the index entry
and the record is read and checked (~8 % faster loads, docs/performance.md; the
index grows by 8 bytes per KiB of log)."""
DEFAULT_PARTITIONS = 6
"""The partition count of an event topic an application creates, unless it says otherwise."""


def _event_id(record: Record) -> str | None:
    for name, raw in record.headers:
        if name == HEADER_EVENT_ID and raw is not None:
            return raw.decode(errors="replace")
    return None


class Outcome(enum.Enum):
    """What became of an append whose outcome was unknown (:meth:`EventStore.outcome`)."""

    STORED = "stored"
    """Its records are in the log."""
    SUPERSEDED = "superseded"
    """Another record holds its first version: it is not stored and never will be (it was
    conditional on that version being free)."""
    ABSENT = "absent"
    """Not in the log now; it may still land while the stream stays where it was."""


class UnknownOffset(enum.Enum):
    """The caller does not know the stream's last offset (only its version)."""

    TOKEN = 0


UNKNOWN_OFFSET: Final = UnknownOffset.TOKEN


class EventStore:
    """Appends and reads aggregate event streams on a log with the
    :class:`~eventlane.log.KeyedLog` role (per-key reads, conditional appends): refused at
    construction with a :class:`~eventlane.errors.MissingRoleError` otherwise. The
    :class:`~eventlane.log.MaintainedLog` role, where the engine has it, lets a stream that
    disagrees with the engine's per-key state rebuild that state."""

    def __init__(
        self, log_: KeyedLog, codec: EventCodec, *, cache_events: int = DEFAULT_EVENTS
    ) -> None:
        self.log: KeyedLog = keyed_log(log_, "the event store")
        self._maintained = log_ if isinstance(log_, MaintainedLog) else None
        self.codec = codec
        self.streams = Streams(log_, codec, cache_events=cache_events)
        """Aggregates' streams as commands see them (:mod:`.stream`)."""

    @property
    def cache(self) -> StreamCache | None:
        """Recently used streams, decoded (``None``: off); see :mod:`.stream_cache`."""
        return self.streams.cache

    # ------------------------------------------------------------------ placement
    def partition_of(self, topic: str, aggregate_id: str) -> int:
        return self.streams.partition_of(topic, aggregate_id)

    # ------------------------------------------------------------------ writing
    def append(
        self,
        topic: str,
        aggregate_id: str,
        expected_version: int,
        envelopes: Sequence[Envelope[Any]],
        *,
        expected_offset: int | UnknownOffset | None = UNKNOWN_OFFSET,
    ) -> list[RecordMetadata]:
        """:meth:`append_plan` on the calling thread."""
        return drive(
            self.append_plan(
                topic, aggregate_id, expected_version, envelopes, expected_offset=expected_offset
            )
        )

    def append_plan(
        self,
        topic: str,
        aggregate_id: str,
        expected_version: int,
        envelopes: Sequence[Envelope[Any]],
        *,
        expected_offset: int | UnknownOffset | None = UNKNOWN_OFFSET,
    ) -> Generator[Step, Any, list[RecordMetadata]]:
        """Append ``envelopes`` (versions ``expected_version + 1 …``) iff the stream is at
        ``expected_version``; raise :class:`ConcurrencyError` otherwise (nothing written).

        ``expected_offset``: the log offset of the stream's record ``expected_version``, when
        the caller knows it (the repository does): the append then reads nothing first.
        The envelopes are one batch: all of them are appended, or none.
        """
        if not envelopes:
            return []
        for i, env in enumerate(envelopes, start=expected_version + 1):
            if env.aggregate_id != aggregate_id or env.aggregate_version != i:
                raise SerializationError(
                    f"envelope {env.aggregate_id!r} v{env.aggregate_version} does not continue "
                    f"{aggregate_id!r} at version {i}",
                    topic=topic,
                )
        generation = self.codec.registry.generation
        if self.codec.seals_from_memory(envelopes):
            keys = self.codec.due_keys(envelopes)
            if keys is not None:  # its periodic catch-up first (see Freshen)
                yield Freshen(keys)
            records = self._records(envelopes)
        else:  # the key store will read or write the log: a call that an event loop's
            # driver hands to a thread (a thread's driver makes it in place)
            records = yield Call(self._records, (envelopes,))
        key = aggregate_id.encode()
        partition = yield from self.streams.partition_plan(topic, aggregate_id)
        if expected_version == 0:
            expected_offset = None
        elif isinstance(expected_offset, UnknownOffset):
            version, expected_offset = yield from self._head(topic, partition, key)
            if version != expected_version:
                self._forget(topic, aggregate_id)
                raise self._conflict(aggregate_id, expected_version, version, topic, partition)
        try:
            result: AppendResult = yield LogCall(
                self.log,
                "append",
                (topic, partition, records),
                {"expect": Expect(key, expected_offset), "atomic": True},
            )
        except ConcurrencyError:
            self._forget(topic, aggregate_id)
            actual = yield from self._version_after(
                topic, partition, key, expected_version, expected_offset
            )
            raise self._conflict(aggregate_id, expected_version, actual, topic, partition) from None
        except (LogUnavailableError, OutcomeUnknownError):
            self._forget(topic, aggregate_id)
            raise
        base = result.base_offset
        self.streams.appended(
            topic, aggregate_id, expected_version, expected_offset, envelopes, base, generation
        )
        return [
            RecordMetadata(topic, partition, base + i, ts) for i, ts in enumerate(result.timestamps)
        ]

    def _records(self, envelopes: Sequence[Envelope[Any]]) -> list[RecordTuple]:
        """``envelopes`` encoded, as the records of an append."""
        encode = self.codec.encode
        return [(r.key, r.value, tuple(r.headers), None) for r in map(encode, envelopes)]

    def _forget(self, topic: str, aggregate_id: str) -> None:
        """Drop the cached stream: the log may hold more than it (a conflict, an append of
        unknown outcome), so the next read of the stream reads the log."""
        self.streams.drop(topic, aggregate_id)

    def outcome(
        self, topic: str, aggregate_id: str, envelopes: Sequence[Envelope[Any]]
    ) -> tuple[Outcome, list[RecordMetadata]]:
        """:meth:`outcome_plan` on the calling thread."""
        return drive(self.outcome_plan(topic, aggregate_id, envelopes))

    def outcome_plan(
        self, topic: str, aggregate_id: str, envelopes: Sequence[Envelope[Any]]
    ) -> Generator[Step, Any, tuple[Outcome, list[RecordMetadata]]]:
        """Whether an append of ``envelopes`` (one batch, whose outcome was unknown) is in
        the log, read from the log itself (never the cache): by the event id of the record
        at the batch's first version. The records' metadata when stored."""
        self._forget(topic, aggregate_id)
        partition = yield from self.streams.partition_plan(topic, aggregate_id)
        by_version: dict[int | None, Record] = {}
        records: list[Record] = yield LogCall(
            self.log, "read_key", (topic, partition, aggregate_id.encode())
        )
        for record in records:
            by_version[stored_version(record)] = record
        first = by_version.get(envelopes[0].aggregate_version)
        if first is None:
            return Outcome.ABSENT, []
        if _event_id(first) != str(envelopes[0].event_id):
            return Outcome.SUPERSEDED, []
        stored: list[RecordMetadata] = []
        for env in envelopes:
            found = by_version.get(env.aggregate_version)
            if found is None or _event_id(found) != str(env.event_id):
                raise SerializationError(
                    f"stream {aggregate_id!r}: a batch is stored only in part (the log"
                    " itself is inconsistent)",
                    topic=topic,
                    partition=partition,
                    offset=first.offset,
                )
            stored.append(RecordMetadata(topic, partition, found.offset, found.timestamp))
        return Outcome.STORED, stored

    @staticmethod
    def _conflict(
        aggregate_id: str, expected: int, actual: int, topic: str, partition: int
    ) -> ConcurrencyError:
        if M.on:
            M.conflicts.labels(topic).inc()
        return ConcurrencyError(
            f"aggregate {aggregate_id!r} changed concurrently",
            expected=expected,
            actual=actual,
            topic=topic,
            partition=partition,
        )

    def _version_after(
        self, topic: str, partition: int, key: bytes, version: int, offset: int | None
    ) -> Generator[Step, Any, int]:
        """The stream's version now, read as the records after ``offset`` (the record of
        ``version``), which must continue the version sequence: what changed concurrently.
        A record that does not continue it means the log itself is inconsistent."""
        if offset is None:
            return (yield from self._head(topic, partition, key))[0]
        records: list[Record] = yield LogCall(
            self.log, "read_key", (topic, partition, key), {"after": offset}
        )
        for record in records:
            found = stored_version(record)
            if found != version + 1:
                raise SerializationError(
                    f"stream {key.decode(errors='replace')!r}: the record after version"
                    f" {version} has aggregate_version {found} (the log itself is inconsistent)",
                    topic=topic,
                    partition=partition,
                    offset=record.offset,
                )
            version = found
        return version

    def _head(
        self, topic: str, partition: int, key: bytes
    ) -> Generator[Step, Any, tuple[int, int | None]]:
        """``(version, offset)`` of the stream's last record (``(0, None)``: no record)."""
        offset: int | None = yield LogCall(self.log, "key_head", (topic, partition, key))
        if offset is None:
            return 0, None
        records: list[Record] = yield LogCall(
            self.log, "read_key", (topic, partition, key), {"after": offset - 1}
        )
        record = records[0] if records and records[0].offset == offset else None
        version = None if record is None else stored_version(record)
        if version is None:
            raise SerializationError(
                f"stream {key.decode(errors='replace')!r}: its last record has no"
                " aggregate_version",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        return version, offset

    # ------------------------------------------------------------------ reading
    def current_version(self, topic: str, aggregate_id: str) -> int:
        """The stream's last version (0 when it has no events)."""
        partition = self.partition_of(topic, aggregate_id)
        return drive(self._head(topic, partition, aggregate_id.encode()))[0]

    def read(
        self,
        topic: str,
        aggregate_id: str,
        after_version: int = 0,
        upto_version: int | None = None,
        *,
        checked: bool = True,
    ) -> list[Envelope[Any]]:
        """The stream's envelopes with ``after_version < version <= upto_version``."""
        return self.read_stream(
            topic, aggregate_id, after_version, upto_version, checked=checked
        ).envelopes

    def read_stream(
        self,
        topic: str,
        aggregate_id: str,
        after_version: int = 0,
        upto_version: int | None = None,
        *,
        after_offset: int | None = None,
        checked: bool = True,
    ) -> StreamRead:
        """See :meth:`Streams.read_stream <eventlane.store.stream.Streams.read_stream>`."""
        return self.streams.read_stream(
            topic,
            aggregate_id,
            after_version,
            upto_version,
            after_offset=after_offset,
            checked=checked,
        )

    # ------------------------------------------------------------------ maintenance
    def verify_index(self, topic: str, partition: int) -> KeyIndexReport:
        """Compare the partition's per-key state with a fresh scan of the log."""
        for report in self._maintenance("checking the key index").check_keys([topic]):
            if report.partition == partition:
                return report
        hwm = self.log.offsets(topic, partition).hwm
        return KeyIndexReport(topic, partition, "", "none", 0, hwm, hwm, (), 0)

    def rebuild_index(self, topic: str, partition: int) -> int:
        """Rebuild the partition's per-key state from the log; returns the records indexed."""
        return self._maintenance("rebuilding the key index").rebuild_keys(topic, partition)

    def _maintenance(self, what: str) -> MaintainedLog:
        return maintained_log(self.log, what)

    def close(self) -> None:
        """Nothing to release: per-key state belongs to the log."""
