"""The stream as a command sees it: one aggregate's events, cached, caught up with the
log, and snapshotted.

The one owner of how an aggregate id becomes an aggregate. A command's load, a query's load
and a policy's check for its causation mark all come here (:class:`Streams`); the event
store (:mod:`.event_store`) only appends conditionally and reads an unknown outcome back,
telling this module what it appended (:meth:`Streams.appended`) or that the log may hold
more than the cache (:meth:`Streams.drop`); the repository (:mod:`.repository`) is the
command path's face.

*Cached* (:mod:`.stream_cache`): streams read or appended recently are kept decoded;
loading one again costs one ``key_head`` when nothing changed, else a read of the records
after the cached ones; a command's load (``checked=False``) not even the ``key_head``, its
conditional save being the check. *Caught up*: a cached stream is used only once the engine
confirms its last record is still the cached one's, or after the records appended since are
read and added. *Snapshotted*: snapshots live in the compacted topic ``<topic>.snapshots``
(created on the first snapshot with the event topic's partition count; keyed by aggregate
id, so compaction keeps the latest per aggregate). One is written whenever a save crosses a
multiple of the class's ``snapshot_every``. Its header ``event-offset`` holds the log offset
of the event it was taken at, so a load reads only the events after that offset. A snapshot
is *ignored*, never misread, when its ``snapshot_version`` is not the class's current one,
when it cannot be decoded, or when it is ahead of the stream; the aggregate is then rebuilt
from its events, and a load of the latest version writes a fresh snapshot. Writing a
snapshot is best effort: the events are already saved, so a failure is logged, not raised.

Reading a stream uses the engine's per-key reads (``read_key``: the embedded engine's key
index, never a partition scan). Records come back checked by key; each record's
``aggregate_version`` must continue the stream. On a gap the engine's per-key state is
rebuilt once (``rebuild_keys``) and the read repeated. A difference that survives a rebuild
is in the log itself: :class:`~eventlane.errors.SerializationError` naming the topic,
partition and offset.

Sans I/O: the reads are plans (:mod:`eventlane.store.steps`: ``*_plan`` methods yield each
log call as a :class:`~eventlane.store.steps.LogCall`), so a command's load runs under the
sync driver on a thread and under the async runtime's on an event loop, awaiting the log's
asyncio face where it has one; the plain methods drive them on the calling thread.

Thread-safety: a :class:`Streams` is shared by every thread of a runtime; its only mutable
state is the cache, which locks itself.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple, TypeVar

import orjson

from eventlane.codec import Envelope, EventCodec, SnapshotCodec
from eventlane.domain import Aggregate, Snapshot
from eventlane.errors import AggregateNotFoundError, SerializationError, StaleSnapshotError
from eventlane.log import KeyedLog, MaintainedLog, Record, RecordMetadata, TopicPartition
from eventlane.log.partitioner import partition_for_key
from eventlane.log.position import Position
from eventlane.observability import get_logger
from eventlane.store.steps import Call, LogCall, Step, drive
from eventlane.store.stream_cache import DEFAULT_EVENTS, CachedStream, StreamCache
from eventlane.tracing import loaded_from

log = get_logger("eventlane.store")

A = TypeVar("A", bound=Aggregate)

SNAPSHOT_SUFFIX = ".snapshots"
SNAPSHOT_TOPIC_CONFIG: dict[str, object] = {
    "cleanup_policy": "compact",
    "retention_ms": -1,
    "segment_bytes": 16 << 20,
}
"""Snapshot topics keep the latest snapshot per aggregate: compacted, never expired, and
with segments small enough for compaction (which never touches the active segment) to
reclaim space early."""

HEADER_EVENT_OFFSET = "event-offset"
"""Snapshot record header: the log offset of the event the snapshot was taken at."""


def snapshot_topic(topic: str) -> str:
    return topic + SNAPSHOT_SUFFIX


def _event_offset(headers: Sequence[tuple[str, bytes | None]]) -> int | None:
    for name, raw in headers:
        if name == HEADER_EVENT_OFFSET and raw is not None and raw.isdigit():
            return int(raw)
    return None


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


class Streams:
    """Aggregates' streams as commands and queries see them (see the module docstring)."""

    def __init__(
        self, log_: KeyedLog, codec: EventCodec, *, cache_events: int = DEFAULT_EVENTS
    ) -> None:
        self.log = log_
        self.codec = codec
        self.cache = StreamCache(cache_events) if cache_events > 0 else None
        """Recently used streams, decoded (``None``: off); see :mod:`.stream_cache`."""

    def partition_of(self, topic: str, aggregate_id: str) -> int:
        return partition_for_key(aggregate_id.encode(), self.log.partition_count(topic))

    def partition_plan(self, topic: str, aggregate_id: str) -> Generator[Step, Any, int]:
        """:meth:`partition_of` as a plan (the partition count is the log's to tell)."""
        count: int = yield LogCall(self.log, "partition_count", (topic,), cheap=True)
        return partition_for_key(aggregate_id.encode(), count)

    @staticmethod
    def _place(aggregate: Aggregate, topic: str, partition: int) -> None:
        """Record where the loaded aggregate's stored state ends on the log."""
        if aggregate._stored_offset is not None:
            tp = TopicPartition(topic, partition)
            aggregate._position = Position({tp: aggregate._stored_offset + 1})

    # ------------------------------------------------------------------ what the writer says
    def appended(
        self,
        topic: str,
        aggregate_id: str,
        version: int,
        offset: int | None,
        envelopes: Sequence[Envelope[Any]],
        base: int,
        generation: int,
    ) -> None:
        """The event store appended ``envelopes`` at offsets ``base…`` after the stream's
        record ``version`` at ``offset`` (proved current by the conditional append)."""
        if self.cache is not None:
            self.cache.extend(
                topic,
                aggregate_id,
                version,
                offset,
                envelopes,
                range(base, base + len(envelopes)),
                generation,
            )

    def drop(self, topic: str, aggregate_id: str) -> None:
        """Drop the cached stream: the log may hold more than it (a conflict, an append of
        unknown outcome), so the next read of the stream reads the log."""
        if self.cache is not None:
            self.cache.drop(topic, aggregate_id)

    # ------------------------------------------------------------------ reading
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
        """:meth:`read_stream_plan` on the calling thread."""
        return drive(
            self.read_stream_plan(
                topic,
                aggregate_id,
                after_version,
                upto_version,
                after_offset=after_offset,
                checked=checked,
            )
        )

    def read_stream_plan(
        self,
        topic: str,
        aggregate_id: str,
        after_version: int = 0,
        upto_version: int | None = None,
        *,
        after_offset: int | None = None,
        checked: bool = True,
    ) -> Generator[Step, Any, StreamRead]:
        """The envelopes with ``after_version < version <= upto_version``, checked against
        the stream's version sequence (see the module docstring).

        ``after_offset``: the offset of the stream's record ``after_version``, when known (a
        snapshot records it): only the records after it are read. ``checked=False``: a
        cached stream is returned without asking the log whether it moved, for a command
        about to save conditionally (a stale stream then makes the save conflict, which
        drops it from the cache: the retry reads the log).
        """
        key = aggregate_id.encode()
        partition = yield from self.partition_plan(topic, aggregate_id)
        whole = after_version == 0 and after_offset is None and self.cache is not None
        generation = self.codec.registry.generation
        if whole:
            cached = yield from self._cached(
                topic, partition, aggregate_id, key, generation, upto_version, checked
            )
            if cached is not None:
                loaded_from("cache")
                envelopes, offsets = cached.envelopes, cached.offsets
                if upto_version is not None and upto_version < len(envelopes):
                    envelopes, offsets = envelopes[:upto_version], offsets[:upto_version]
                return StreamRead(list(envelopes), offsets[-1] if offsets else None, len(offsets))
        for attempt in (1, 2):
            records: list[Record] = yield LogCall(
                self.log, "read_key", (topic, partition, key), {"after": after_offset}
            )
            try:
                read = yield from self._decoded(
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
                if isinstance(self.log, MaintainedLog):  # derived per-key state to rebuild
                    yield LogCall(self.log, "rebuild_keys", (topic, partition))
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
    ) -> Generator[Step, Any, CachedStream | None]:
        """The cached stream, brought up to date with the log (records appended since are
        read and decoded alone) unless it already holds version ``upto``; ``None`` when
        not cached or the log disagrees with it."""
        cache = self.cache
        assert cache is not None
        entry = cache.get(topic, aggregate_id, generation)
        if entry is None or not checked:
            return entry
        last = entry.offsets[-1]
        head: int | None = yield LogCall(self.log, "key_head", (topic, partition, key))
        if head == last:
            return entry
        if head is not None and head > last:
            if upto is not None and upto <= len(entry.envelopes):
                return entry  # history before the head does not change
            records: list[Record] = yield LogCall(
                self.log, "read_key", (topic, partition, key), {"after": last}
            )
            try:
                tail = yield from self._decoded(
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

    def _decoded(
        self,
        topic: str,
        partition: int,
        records: list[Record],
        after_version: int,
        upto_version: int | None,
        after_offset: int | None,
    ) -> Generator[Step, Any, StreamRead]:
        """:meth:`_decode_stream`; with a key store, as a :class:`Call` (opening personal
        fields may read the key topic: blocking work that an event loop's driver hands to
        a thread)."""
        args = (topic, partition, records, after_version, upto_version, after_offset)
        if records and self.codec.keys is not None:
            read: StreamRead = yield Call(self._decode_stream, args)
            return read
        return self._decode_stream(*args)

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

    # ------------------------------------------------------------------ aggregates
    def committed_plan(
        self,
        aggregate: Aggregate,
        written: list[RecordMetadata],
        topic: str,
        snapshots: SnapshotCodec,
    ) -> Generator[Step, Any, None]:
        """The aggregate's pending events are stored at ``written``: mark them committed,
        and take a snapshot when the save crossed a multiple of ``snapshot_every`` (the
        only blocking work: a :class:`~eventlane.store.steps.Call`)."""
        if not written:
            return
        base = aggregate.committed_version
        aggregate.mark_committed()
        aggregate._stored_offset = written[-1].offset
        aggregate._position = Position.of(written)
        every = type(aggregate).snapshot_every
        if every and aggregate.version // every > base // every:
            yield Call(self.save_snapshot, (aggregate, topic, snapshots))

    def save_snapshot(self, aggregate: Aggregate, events: str, snapshots: SnapshotCodec) -> None:
        """Write a snapshot of ``aggregate`` (best effort: a failure is logged)."""
        cls = type(aggregate)
        topic = snapshot_topic(events)
        log_ = self.log
        try:
            log_.create_topic(
                topic, log_.partition_count(events), SNAPSHOT_TOPIC_CONFIG, exist_ok=True
            )
            record = snapshots.encode(cls, aggregate.take_snapshot())
            headers = tuple(record.headers)
            if aggregate._stored_offset is not None:
                headers += ((HEADER_EVENT_OFFSET, str(aggregate._stored_offset).encode()),)
            partition = self.partition_of(topic, aggregate.id)
            log_.append(topic, partition, [(record.key, record.value, headers, None)])
            log.debug(
                "snapshot saved",
                topic=topic,
                partition=partition,
                aggregate_id=aggregate.id,
                version=aggregate.version,
            )
        except Exception as exc:  # the events are saved; a missing snapshot only costs time
            log.warning(
                "snapshot not written",
                topic=topic,
                aggregate_id=aggregate.id,
                version=aggregate.version,
                error=str(exc),
            )

    # ------------------------------------------------------------------ load
    def load(
        self,
        cls: type[A],
        aggregate_id: str,
        version: int | None = None,
        *,
        topic: str,
        snapshots: SnapshotCodec,
        checked: bool = True,
    ) -> A:
        """:meth:`load_plan` on the calling thread."""
        return drive(
            self.load_plan(
                cls, aggregate_id, version, topic=topic, snapshots=snapshots, checked=checked
            )
        )

    def load_plan(
        self,
        cls: type[A],
        aggregate_id: str,
        version: int | None = None,
        *,
        topic: str,
        snapshots: SnapshotCodec,
        checked: bool = True,
    ) -> Generator[Step, Any, A]:
        """The aggregate as of ``version`` (default: latest).

        ``checked=False`` (commands): a stream in the store's cache is used as it is, without
        asking the log whether it moved; the conditional save catches a stale one.

        Raises :class:`~eventlane.errors.AggregateNotFoundError` when it has no events (or
        fewer than ``version``). A snapshot that cannot be used (stale schema, undecodable)
        is ignored; the aggregate is rebuilt from its events and, on a load of the latest
        version, a fresh snapshot replaces it.
        """
        if version is not None and version < 1:
            raise AggregateNotFoundError(
                f"{cls.__qualname__} {aggregate_id!r} has no version {version}", topic=topic
            )
        snapshot, at, unusable = yield from self._load_snapshot(
            cls, aggregate_id, version, topic, snapshots
        )
        stream: StreamRead | None = None
        if snapshot is not None and at is not None:
            stream = yield from self._read_after_snapshot(
                aggregate_id, snapshot, at, version, topic
            )
            if stream is None:
                snapshot, unusable = None, True
        if snapshot is None or at is None:
            after = snapshot.aggregate_version if snapshot is not None else 0
            stream = yield from self.read_stream_plan(
                topic, aggregate_id, after, version, checked=checked
            )
            if snapshot is not None and stream.version < snapshot.aggregate_version:
                self._ahead(topic, aggregate_id, snapshot)  # the event topic was recreated
                snapshot, unusable = None, True
                stream = yield from self.read_stream_plan(topic, aggregate_id, 0, version)
        assert stream is not None
        if snapshot is not None:
            loaded_from("snapshot")
        envelopes = stream.envelopes
        if snapshot is None and not envelopes:
            raise AggregateNotFoundError(
                f"no events for {cls.__qualname__} {aggregate_id!r}", topic=topic
            )
        aggregate = cls.rehydrate(aggregate_id, [e.event for e in envelopes], snapshot=snapshot)
        aggregate._stored_offset = stream.last_offset if stream.last_offset is not None else at
        partition = yield from self.partition_plan(topic, aggregate_id)
        self._place(aggregate, topic, partition)
        if version is not None and aggregate.version != version:
            raise AggregateNotFoundError(
                f"{cls.__qualname__} {aggregate_id!r} has {aggregate.version} events, not"
                f" {version}",
                topic=topic,
            )
        every = cls.snapshot_every
        if unusable and version is None and every and aggregate.version >= every:
            yield Call(self.save_snapshot, (aggregate, topic, snapshots))
        return aggregate

    @staticmethod
    def _ahead(topic: str, aggregate_id: str, snapshot: Snapshot) -> None:
        log.warning(
            "snapshot ahead of its stream ignored",
            topic=topic,
            aggregate_id=aggregate_id,
            version=snapshot.aggregate_version,
        )

    def _read_after_snapshot(
        self, aggregate_id: str, snapshot: Snapshot, at: int, version: int | None, topic: str
    ) -> Generator[Step, Any, StreamRead | None]:
        """The events after a snapshot taken at offset ``at``; ``None`` when the stream does
        not continue it (the event topic was recreated: the snapshot is ignored)."""
        partition = yield from self.partition_plan(topic, aggregate_id)
        head: int | None = yield LogCall(
            self.log, "key_head", (topic, partition, aggregate_id.encode())
        )
        if head is None or head < at:
            self._ahead(topic, aggregate_id, snapshot)
            return None
        try:
            return (
                yield from self.read_stream_plan(
                    topic, aggregate_id, snapshot.aggregate_version, version, after_offset=at
                )
            )
        except SerializationError as exc:
            log.warning(
                "snapshot does not continue its stream; ignored",
                topic=topic,
                aggregate_id=aggregate_id,
                error=str(exc),
            )
            return None

    def _load_snapshot(
        self,
        cls: type[A],
        aggregate_id: str,
        version: int | None,
        events: str,
        snapshots: SnapshotCodec,
    ) -> Generator[Step, Any, tuple[Snapshot | None, int | None, bool]]:
        """The latest usable snapshot at or below ``version``, the event offset it was
        taken at (``None``: not recorded), and whether the latest one stored was unusable
        (stale schema, undecodable)."""
        if not cls.snapshot_every:
            return None, None, False
        topic = snapshot_topic(events)
        if not (yield LogCall(self.log, "topic_exists", (topic,))):
            return None, None, False
        partition = yield from self.partition_plan(topic, aggregate_id)
        records: list[Record] = yield LogCall(
            self.log, "read_key", (topic, partition, aggregate_id.encode())
        )
        if not records:
            return None, None, False
        record = records[-1]
        if record.value is None:  # removed (forget's tombstone): none, and not unusable
            return None, None, False
        where = {"topic": topic, "partition": partition, "offset": record.offset}
        decode = functools.partial(
            snapshots.decode,
            cls,
            record.key,
            record.value,
            record.headers,  # type: ignore[arg-type]
            topic=topic,
            partition=partition,
            offset=record.offset,
        )
        try:
            # with a key store, opening the state may read the key topic (as in _decoded)
            snap: Snapshot = (yield Call(decode)) if snapshots.keys is not None else decode()
        except StaleSnapshotError:
            log.info("stale snapshot ignored", aggregate_id=aggregate_id, **where)
            return None, None, True
        except SerializationError as exc:
            log.warning(
                "undecodable snapshot ignored", aggregate_id=aggregate_id, error=str(exc), **where
            )
            return None, None, True
        if version is not None and snap.aggregate_version > version:
            return None, None, False
        return snap, _event_offset(record.headers), False

    def for_command(
        self,
        cls: type[A],
        aggregate_id: str,
        *,
        topic: str,
        snapshots: SnapshotCodec,
        create: bool,
        causation_id: str | None,
        once: bool,
    ) -> Generator[Step, Any, A | None]:
        """The aggregate a command decides on: its cached stream as it is (the conditional
        append checks it), or, for a policy's command (``once``), its whole stream, and
        ``None`` when an event in it was caused by ``causation_id`` (issued already)."""
        if not once:
            try:
                return (
                    yield from self.load_plan(
                        cls, aggregate_id, topic=topic, snapshots=snapshots, checked=False
                    )
                )
            except AggregateNotFoundError:
                if not create:
                    raise
                return cls(aggregate_id)
        stream = yield from self.read_stream_plan(topic, aggregate_id, checked=False)
        history = stream.envelopes
        if any(env.causation_id == causation_id for env in history):
            log.info(
                "command already issued for this event; not again",
                topic=topic,
                aggregate_id=aggregate_id,
                causation_id=causation_id,
            )
            return None
        if not history and not create:
            raise AggregateNotFoundError(
                f"no events for {cls.__qualname__} {aggregate_id!r}", topic=topic
            )
        aggregate = cls.rehydrate(aggregate_id, [env.event for env in history])
        aggregate._stored_offset = stream.last_offset  # the conditional save's expectation
        partition = yield from self.partition_plan(topic, aggregate_id)
        self._place(aggregate, topic, partition)
        return aggregate
