"""The repository: save and load aggregates, with optional snapshots.

``save`` appends an aggregate's pending events as one conditional, atomic batch (see
:mod:`framework.store.event_store`). ``load`` rebuilds the aggregate from the latest usable
snapshot plus the events after it, or from all its events.

Snapshots live in the compacted topic ``<topic>.snapshots`` (same partition count as the
event topic, keyed by aggregate id, so compaction keeps the latest per aggregate). One is
written whenever a save crosses a multiple of the class's ``snapshot_every``. A snapshot
whose ``snapshot_version`` is not the class's current one is ignored (the aggregate is
rebuilt from its events and a fresh snapshot is written at the next threshold), never
misread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from framework.codec import Envelope, SnapshotCodec
from framework.domain import Aggregate, Snapshot
from framework.errors import AggregateNotFoundError, ConcurrencyError, StaleSnapshotError
from framework.log import RecordMetadata
from framework.log.partition import AppendResult
from framework.store.event_store import EventStore

log = structlog.get_logger("eventlane.store")

A = TypeVar("A", bound=Aggregate)

SNAPSHOT_SUFFIX = ".snapshots"


def snapshot_topic(topic: str) -> str:
    return topic + SNAPSHOT_SUFFIX


class Repository:
    """Saves and loads aggregates through an :class:`EventStore`."""

    def __init__(self, store: EventStore, snapshots: SnapshotCodec | None = None) -> None:
        self.store = store
        self.snapshots = snapshots if snapshots is not None else SnapshotCodec()

    # ------------------------------------------------------------------ save
    def save(
        self,
        aggregate: Aggregate,
        *,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> list[RecordMetadata]:
        """Append the aggregate's pending events iff nobody saved it since it was loaded.

        Raises :class:`~framework.errors.ConcurrencyError` (nothing written) otherwise.
        """
        pending = aggregate.pending_events
        if not pending:
            return []
        base = aggregate.committed_version
        envelopes = [
            Envelope(
                event,
                aggregate.id,
                base + i,
                correlation_id=correlation_id,
                causation_id=causation_id,
            )
            for i, event in enumerate(pending, start=1)
        ]
        topic = type(aggregate).topic
        written = self.store.append(topic, aggregate.id, base, envelopes)
        aggregate.mark_committed()
        every = type(aggregate).snapshot_every
        if every and aggregate.version // every > base // every:
            self._save_snapshot(aggregate)
        return written

    def _save_snapshot(self, aggregate: Aggregate) -> None:
        cls = type(aggregate)
        topic = snapshot_topic(cls.topic)
        log_ = self.store.log
        try:
            log_.create_topic(
                topic,
                log_.partition_count(cls.topic),
                {"cleanup_policy": "compact", "retention_ms": -1},
                exist_ok=True,
            )
            record = self.snapshots.encode(cls, aggregate.take_snapshot())
            partition = self.store.partition_of(topic, aggregate.id)
            index = self.store.index(topic, partition)
            key = aggregate.id.encode()
            first_seq = [0]

            def check(leo: int) -> None:
                index.catch_up(leo)
                first_seq[0] = index.head(key) + 1

            def indexed(result: AppendResult) -> None:
                index.add(key, first_seq[0], [result.base_offset], result.last_offset + 1)

            log_.append(
                topic,
                partition,
                [(record.key, record.value, tuple(record.headers), None)],
                precondition=check,
                on_appended=indexed,
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
    def load(self, cls: type[A], aggregate_id: str, version: int | None = None) -> A:
        """The aggregate as of ``version`` (default: latest).

        Raises :class:`~framework.errors.AggregateNotFoundError` when it has no events (or
        fewer than ``version``).
        """
        snapshot = self._load_snapshot(cls, aggregate_id, version)
        after = snapshot.aggregate_version if snapshot is not None else 0
        envelopes = self.store.read(cls.topic, aggregate_id, after, version)
        if snapshot is None and not envelopes:
            raise AggregateNotFoundError(
                f"no events for {cls.__qualname__} {aggregate_id!r}", topic=cls.topic
            )
        aggregate = cls.rehydrate(aggregate_id, [e.event for e in envelopes], snapshot=snapshot)
        if version is not None and aggregate.version != version:
            raise AggregateNotFoundError(
                f"{cls.__qualname__} {aggregate_id!r} has {aggregate.version} events, not"
                f" {version}",
                topic=cls.topic,
            )
        return aggregate

    def _load_snapshot(
        self, cls: type[A], aggregate_id: str, version: int | None
    ) -> Snapshot | None:
        if not cls.snapshot_every:
            return None
        topic = snapshot_topic(cls.topic)
        log_ = self.store.log
        if not log_.topic_exists(topic):
            return None
        partition = self.store.partition_of(topic, aggregate_id)
        index = self.store.index(topic, partition)
        key = aggregate_id.encode()
        hwm = log_.offsets(topic, partition).hwm
        tail = index.scan_tail(hwm, key) if index.next_offset() < hwm else []
        offset = tail[-1][1] if tail else index.last_offset(key)
        if offset is None:
            return None
        records, _ = log_.read(topic, partition, offset, max_bytes=1)
        if not records or records[0].offset != offset or records[0].key != key:
            return None  # compacted away since indexed, or the index is stale
        r = records[0]
        try:
            snap = self.snapshots.decode(
                cls,
                r.key,
                r.value,
                r.headers,  # type: ignore[arg-type]
                topic=topic,
                partition=partition,
                offset=r.offset,
            )
        except StaleSnapshotError:
            log.info(
                "stale snapshot ignored", topic=topic, aggregate_id=aggregate_id, offset=r.offset
            )
            return None
        if version is not None and snap.aggregate_version > version:
            return None
        return snap

    # ------------------------------------------------------------------ commands
    def execute(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        create: bool = False,
        attempts: int = 20,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> A:
        """Load, run ``command`` on the aggregate, save; on a concurrency conflict reload
        and run it again (up to ``attempts`` times). ``create=True`` starts from a new
        aggregate when none exists."""
        for attempt in range(1, attempts + 1):
            try:
                aggregate = self.load(cls, aggregate_id)
            except AggregateNotFoundError:
                if not create:
                    raise
                aggregate = cls(aggregate_id)
            command(aggregate)
            try:
                self.save(aggregate, correlation_id=correlation_id, causation_id=causation_id)
                return aggregate
            except ConcurrencyError:
                if attempt == attempts:
                    raise
                log.debug(
                    "concurrency conflict; retrying", aggregate_id=aggregate_id, attempt=attempt
                )
        raise AssertionError("unreachable")  # pragma: no cover
