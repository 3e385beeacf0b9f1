"""The event store: aggregates' event streams on the log, with optimistic concurrency.

An aggregate's events are records keyed by its id, so they all land in one partition of the
aggregate class's topic (Kafka's partitioner), totally ordered. What Kafka cannot do and this
store does: an append is *conditional*. It uses only the log port: ``append(expect=Expect(key,
last_offset))`` appends iff the stream's last record is still at the offset the aggregate was
built from (``None`` for a new stream), checked by the engine atomically with the append, so
two writers can never fork a history: the loser gets
:class:`~framework.errors.ConcurrencyError` and nothing of its batch is written. A save's
events form one batch (``atomic=True``), so a crash never leaves part of a save visible.

An append that fails with :class:`~framework.errors.OutcomeUnknownError` may or may not be
stored: :meth:`EventStore.outcome` reads the stream back from the log and tells by the
event ids (the retry loop of :mod:`framework.store.command` uses it). A conflict, an
unavailable log or an unknown outcome drops the stream's cache entry.

When the caller knows only the expected *version* (not the offset), the store reads the
stream's last record (``key_head`` + one point read), compares its ``aggregate_version`` and
appends expecting that offset: still one atomic check in the engine.

Streams read or appended recently are kept decoded (:mod:`.stream_cache`): loading one
again costs one ``key_head`` when nothing changed, else a read of the records after the
cached ones; a command's load (``checked=False``) not even the ``key_head``, its conditional
save being the check. ``cache_events=0`` turns it off.

Reading a stream uses the engine's per-key reads (``read_key``: the embedded engine's key
index, never a partition scan). Records come back checked by key; the store checks each
record's ``aggregate_version`` continues the stream. On a gap the engine's per-key state is
rebuilt once (``rebuild_keys``) and the read repeated. A difference that survives a rebuild
is in the log itself: :class:`~framework.errors.SerializationError` naming the topic,
partition and offset.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import orjson

from framework.codec import HEADER_EVENT_ID, Envelope, EventCodec
from framework.errors import (
    ConcurrencyError,
    LogUnavailableError,
    OutcomeUnknownError,
    SerializationError,
)
from framework.log import KeyedLog, MaintainedLog, Record, RecordMetadata
from framework.log.partitioner import partition_for_key
from framework.log.port import keyed_log, maintained_log
from framework.log.types import Expect, KeyIndexReport
from framework.observability import get_logger
from framework.store.stream_cache import DEFAULT_EVENTS, CachedStream, StreamCache

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


class _StreamMismatchError(Exception):
    """Internal: a record of the stream does not continue its version sequence."""

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem


def stored_version(record: Record) -> int | None:
    """The ``aggregate_version`` in an event record's JSON value (``None`` if absent)."""
    try:
        doc = orjson.loads(record.value) if record.value is not None else None
    except orjson.JSONDecodeError:
        return None
    version = doc.get("aggregate_version") if type(doc) is dict else None
    return version if type(version) is int else None


class StreamRead(NamedTuple):
    """What :meth:`EventStore.read_stream` read."""

    envelopes: list[Envelope[Any]]
    """The envelopes in the requested version range."""
    last_offset: int | None
    """Offset of the last record read (``None``: none)."""
    version: int
    """Version of the last record read (``after_version`` when none was read after it)."""


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
    :class:`~framework.log.KeyedLog` role (per-key reads, conditional appends): refused at
    construction with a :class:`~framework.errors.MissingRoleError` otherwise. The
    :class:`~framework.log.MaintainedLog` role, where the engine has it, lets a stream that
    disagrees with the engine's per-key state rebuild that state."""

    def __init__(
        self, log_: KeyedLog, codec: EventCodec, *, cache_events: int = DEFAULT_EVENTS
    ) -> None:
        self.log: KeyedLog = keyed_log(log_, "the event store")
        self._maintained = log_ if isinstance(log_, MaintainedLog) else None
        self.codec = codec
        self.cache = StreamCache(cache_events) if cache_events > 0 else None
        """Recently used streams, decoded (``None``: off); see :mod:`.stream_cache`."""

    # ------------------------------------------------------------------ placement
    def partition_of(self, topic: str, aggregate_id: str) -> int:
        return partition_for_key(aggregate_id.encode(), self.log.partition_count(topic))

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
        encoded = [self.codec.encode(env) for env in envelopes]
        records = [(r.key, r.value, tuple(r.headers), None) for r in encoded]
        key = aggregate_id.encode()
        partition = self.partition_of(topic, aggregate_id)
        if expected_version == 0:
            expected_offset = None
        elif isinstance(expected_offset, UnknownOffset):
            version, expected_offset = self._head(topic, partition, key)
            if version != expected_version:
                self._forget(topic, aggregate_id)
                raise self._conflict(aggregate_id, expected_version, version, topic, partition)
        try:
            result = self.log.append(
                topic, partition, records, expect=Expect(key, expected_offset), atomic=True
            )
        except ConcurrencyError:
            self._forget(topic, aggregate_id)
            actual = self._version_after(topic, partition, key, expected_version, expected_offset)
            raise self._conflict(aggregate_id, expected_version, actual, topic, partition) from None
        except (LogUnavailableError, OutcomeUnknownError):
            self._forget(topic, aggregate_id)
            raise
        base = result.base_offset
        if self.cache is not None:
            self.cache.extend(
                topic,
                aggregate_id,
                expected_version,
                expected_offset,
                envelopes,
                range(base, base + len(envelopes)),
                generation,
            )
        return [
            RecordMetadata(topic, partition, base + i, ts) for i, ts in enumerate(result.timestamps)
        ]

    def _forget(self, topic: str, aggregate_id: str) -> None:
        """Drop the cached stream: the log may hold more than it (a conflict, an append of
        unknown outcome), so the next read of the stream reads the log."""
        if self.cache is not None:
            self.cache.drop(topic, aggregate_id)

    def outcome(
        self, topic: str, aggregate_id: str, envelopes: Sequence[Envelope[Any]]
    ) -> tuple[Outcome, list[RecordMetadata]]:
        """Whether an append of ``envelopes`` (one batch, whose outcome was unknown) is in
        the log, read from the log itself (never the cache): by the event id of the record
        at the batch's first version. The records' metadata when stored."""
        self._forget(topic, aggregate_id)
        partition = self.partition_of(topic, aggregate_id)
        by_version: dict[int | None, Record] = {}
        for record in self.log.read_key(topic, partition, aggregate_id.encode()):
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
        return ConcurrencyError(
            f"aggregate {aggregate_id!r} changed concurrently",
            expected=expected,
            actual=actual,
            topic=topic,
            partition=partition,
        )

    def _version_after(
        self, topic: str, partition: int, key: bytes, version: int, offset: int | None
    ) -> int:
        """The stream's version now, read as the records after ``offset`` (the record of
        ``version``), which must continue the version sequence: what changed concurrently.
        A record that does not continue it means the log itself is inconsistent."""
        if offset is None:
            return self._head(topic, partition, key)[0]
        for record in self.log.read_key(topic, partition, key, after=offset):
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

    def _head(self, topic: str, partition: int, key: bytes) -> tuple[int, int | None]:
        """``(version, offset)`` of the stream's last record (``(0, None)``: no record)."""
        offset = self.log.key_head(topic, partition, key)
        if offset is None:
            return 0, None
        records = self.log.read_key(topic, partition, key, after=offset - 1)
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
        return self._head(topic, partition, aggregate_id.encode())[0]

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
        """The envelopes with ``after_version < version <= upto_version``, checked against
        the stream's version sequence (see the module docstring).

        ``after_offset``: the offset of the stream's record ``after_version``, when known (a
        snapshot records it): only the records after it are read. ``checked=False``: a
        cached stream is returned without asking the log whether it moved, for a command
        about to save conditionally (a stale stream then makes the save conflict, which
        drops it from the cache: the retry reads the log).
        """
        key = aggregate_id.encode()
        partition = self.partition_of(topic, aggregate_id)
        whole = after_version == 0 and after_offset is None and self.cache is not None
        generation = self.codec.registry.generation
        if whole:
            cached = self._cached(
                topic, partition, aggregate_id, key, generation, upto_version, checked
            )
            if cached is not None:
                envelopes, offsets = cached.envelopes, cached.offsets
                if upto_version is not None and upto_version < len(envelopes):
                    envelopes, offsets = envelopes[:upto_version], offsets[:upto_version]
                return StreamRead(list(envelopes), offsets[-1] if offsets else None, len(offsets))
        for attempt in (1, 2):
            records = self.log.read_key(topic, partition, key, after=after_offset)
            try:
                read = self._decode_stream(
                    topic, partition, records, after_version, upto_version, after_offset
                )
                if whole and upto_version is None and read.envelopes:
                    self.cache.put(  # type: ignore[union-attr]
                        topic,
                        aggregate_id,
                        read.envelopes,
                        [r.offset for r in records[: len(read.envelopes)]],
                        generation,
                    )
                return read
            except _StreamMismatchError as exc:
                if attempt == 2:
                    raise SerializationError(
                        f"stream {aggregate_id!r}: {exc.problem}",
                        topic=topic,
                        partition=partition,
                        offset=exc.offset,
                    ) from None
                log.warning(
                    "stream disagrees with the key index; rebuilding it",
                    topic=topic,
                    partition=partition,
                    offset=exc.offset,
                    problem=exc.problem,
                )
                if self._maintained is not None:
                    self._maintained.rebuild_keys(topic, partition)
        raise AssertionError("unreachable")  # pragma: no cover

    def _cached(
        self,
        topic: str,
        partition: int,
        aggregate_id: str,
        key: bytes,
        generation: int,
        upto: int | None,
        checked: bool,
    ) -> CachedStream | None:
        """The cached stream, brought up to date with the log (records appended since are
        read and decoded alone) unless it already holds version ``upto``; ``None`` when
        not cached or the log disagrees with it."""
        cache = self.cache
        assert cache is not None
        entry = cache.get(topic, aggregate_id, generation)
        if entry is None or not checked:
            return entry
        last = entry.offsets[-1]
        head = self.log.key_head(topic, partition, key)
        if head == last:
            return entry
        if head is not None and head > last:
            if upto is not None and upto <= len(entry.envelopes):
                return entry  # history before the head does not change
            records = self.log.read_key(topic, partition, key, after=last)
            try:
                tail = self._decode_stream(
                    topic, partition, records, len(entry.envelopes), None, last
                )
            except _StreamMismatchError:
                tail = None  # the uncached read sorts it out (rebuilds the key index)
            if tail is not None and tail.envelopes:
                return cache.extend(
                    topic,
                    aggregate_id,
                    len(entry.envelopes),
                    last,
                    tail.envelopes,
                    [r.offset for r in records[: len(tail.envelopes)]],
                    generation,
                )
        cache.drop(topic, aggregate_id)
        return None

    def _decode_stream(
        self,
        topic: str,
        partition: int,
        records: list[Record],
        after_version: int,
        upto_version: int | None,
        after_offset: int | None,
    ) -> StreamRead:
        envelopes: list[Envelope[Any]] = []
        last: int | None = None
        # Without the offset of ``after_version``, the stream is read from its start.
        expected = after_version + 1 if after_offset is not None else 1
        decode = self.codec.decode
        for record in records:
            if upto_version is not None and expected > upto_version:
                break
            if expected <= after_version:  # before the range: check the version only
                if stored_version(record) != expected:
                    raise _StreamMismatchError(
                        record.offset,
                        f"expected version {expected}, found version {stored_version(record)}",
                    )
                last = record.offset
                expected += 1
                continue
            env = decode(
                record.key,
                record.value,
                record.headers,  # type: ignore[arg-type]
                topic=topic,
                partition=partition,
                offset=record.offset,
            )
            if env.aggregate_version != expected:
                raise _StreamMismatchError(
                    record.offset,
                    f"expected version {expected}, found version {env.aggregate_version}",
                )
            envelopes.append(env)
            last = record.offset
            expected += 1
        return StreamRead(envelopes, last, expected - 1)

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
