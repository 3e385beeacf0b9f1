"""The repository: save and load aggregates, with optional snapshots.

``save`` appends an aggregate's pending events as one conditional, atomic batch (see
:mod:`framework.store.event_store`). ``load`` rebuilds the aggregate from the latest usable
snapshot plus the events after it, or from all its events. ``execute`` runs a command with
retry on concurrency conflicts (load, run, save; again on :class:`ConcurrencyError`); the
retry loop of ``execute``, ``issue`` and ``save`` is :mod:`framework.store.command`.

Snapshots live in the compacted topic ``<topic>.snapshots`` (created on the first snapshot
with the event topic's partition count; keyed by aggregate id, so compaction keeps the
latest per aggregate; the log's per-key read finds it without a scan). One is written
whenever a save crosses a multiple of the class's ``snapshot_every``. Its header
``event-offset`` holds the log offset of the event it was taken at, so a load reads only the
events after that offset. A snapshot is
*ignored*, never misread, when its ``snapshot_version`` is not the class's current one,
when it cannot be decoded, or when it is ahead of the stream; the aggregate is then rebuilt
from its events, and a load of the latest version writes a fresh snapshot. Writing a
snapshot is best effort: the events are already saved, so a failure is logged, not raised.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from framework.codec import Envelope, SnapshotCodec
from framework.domain import Aggregate, Snapshot
from framework.errors import (
    AggregateNotFoundError,
    SerializationError,
    StaleSnapshotError,
)
from framework.log import RecordMetadata
from framework.observability import get_logger
from framework.store import command
from framework.store.event_store import EventStore, StreamRead

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


SAVE_ATTEMPTS = 10
"""Appends a ``save`` may make: a conflict is never retried (the caller decides again), but
an unavailable log is waited for, and an append of unknown outcome is settled by reading the
stream back (:mod:`framework.store.command`)."""

HEADER_EVENT_OFFSET = "event-offset"
"""Snapshot record header: the log offset of the event the snapshot was taken at."""


def snapshot_topic(topic: str) -> str:
    return topic + SNAPSHOT_SUFFIX


def causation_of(caused_by: Envelope[Any] | str) -> tuple[str, str]:
    """``(causation_id, correlation_id)`` of a policy's command caused by ``caused_by`` (an
    event, or an event id)."""
    if isinstance(caused_by, str):
        return caused_by, caused_by
    causation = str(caused_by.event_id)
    return causation, caused_by.correlation_id or causation


def _declared_topic(cls: type[Aggregate]) -> str:
    return cls.topic


def _event_offset(headers: Sequence[tuple[str, bytes | None]]) -> int | None:
    for name, raw in headers:
        if name == HEADER_EVENT_OFFSET and raw is not None and raw.isdigit():
            return int(raw)
    return None


class Repository:
    """Saves and loads aggregates through an :class:`EventStore`."""

    def __init__(
        self,
        store: EventStore,
        snapshots: SnapshotCodec | None = None,
        *,
        topic_of: Callable[[type[Aggregate]], str] | None = None,
    ) -> None:
        self.store = store
        self.snapshots = snapshots if snapshots is not None else SnapshotCodec()
        self.topic_of: Callable[[type[Aggregate]], str] = (
            topic_of if topic_of is not None else _declared_topic
        )
        """The event topic of an aggregate class on the log: its ``topic``, or what the
        application maps it to (an app's namespace, :mod:`framework.app.namespace`)."""

    # ------------------------------------------------------------------ save
    def save(
        self,
        aggregate: Aggregate,
        *,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> list[RecordMetadata]:
        """Append the aggregate's pending events iff nobody saved it since it was loaded.

        Raises :class:`~framework.errors.ConcurrencyError` (nothing written) otherwise. An
        unavailable log is waited for, and an append of unknown outcome is settled by reading
        the stream back (:mod:`framework.store.command`): the events are stored once, or
        :class:`~framework.errors.OutcomeUnknownError` says the log cannot tell yet.
        """
        return command.drive(
            self.save_plan(aggregate, correlation_id=correlation_id, causation_id=causation_id)
        )

    def save_plan(
        self,
        aggregate: Aggregate,
        *,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> Generator[command.Step, Any, list[RecordMetadata]]:
        """:meth:`save` as a plan of I/O requests (:mod:`framework.store.command`), for a
        sync or an async driver."""
        if not aggregate.pending_events:
            return []
        _, written = yield from command.plan(
            self.store,
            self.topic_of(type(aggregate)),
            aggregate.id,
            lambda: aggregate,
            attempts=SAVE_ATTEMPTS,
            retry_conflicts=False,
            correlation_id=correlation_id,
            causation_id=causation_id,
        )
        yield command.Call(self._committed, (aggregate, written))
        return written

    def _committed(self, aggregate: Aggregate, written: list[RecordMetadata]) -> None:
        """The aggregate's pending events are stored at ``written``: mark them committed,
        and take a snapshot when the save crossed a multiple of ``snapshot_every``."""
        if not written:
            return
        base = aggregate.committed_version
        aggregate.mark_committed()
        aggregate._stored_offset = written[-1].offset
        every = type(aggregate).snapshot_every
        if every and aggregate.version // every > base // every:
            self._save_snapshot(aggregate)

    def _save_snapshot(self, aggregate: Aggregate) -> None:
        cls = type(aggregate)
        events = self.topic_of(cls)
        topic = snapshot_topic(events)
        log_ = self.store.log
        try:
            log_.create_topic(
                topic, log_.partition_count(events), SNAPSHOT_TOPIC_CONFIG, exist_ok=True
            )
            record = self.snapshots.encode(cls, aggregate.take_snapshot())
            headers = tuple(record.headers)
            if aggregate._stored_offset is not None:
                headers += ((HEADER_EVENT_OFFSET, str(aggregate._stored_offset).encode()),)
            partition = self.store.partition_of(topic, aggregate.id)
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
        self, cls: type[A], aggregate_id: str, version: int | None = None, *, checked: bool = True
    ) -> A:
        """The aggregate as of ``version`` (default: latest).

        ``checked=False`` (commands): a stream in the store's cache is used as it is, without
        asking the log whether it moved; the conditional save catches a stale one.

        Raises :class:`~framework.errors.AggregateNotFoundError` when it has no events (or
        fewer than ``version``). A snapshot that cannot be used (stale schema, undecodable)
        is ignored; the aggregate is rebuilt from its events and, on a load of the latest
        version, a fresh snapshot replaces it.
        """
        topic = self.topic_of(cls)
        if version is not None and version < 1:
            raise AggregateNotFoundError(
                f"{cls.__qualname__} {aggregate_id!r} has no version {version}", topic=topic
            )
        snapshot, at, unusable = self._load_snapshot(cls, aggregate_id, version)
        if snapshot is not None and at is not None:
            stream = self._read_after_snapshot(cls, aggregate_id, snapshot, at, version)
            if stream is None:
                snapshot, unusable = None, True
        if snapshot is None or at is None:
            after = snapshot.aggregate_version if snapshot is not None else 0
            stream = self.store.read_stream(topic, aggregate_id, after, version, checked=checked)
            if snapshot is not None and stream.version < snapshot.aggregate_version:
                self._ahead(cls, aggregate_id, snapshot)  # the event topic was recreated
                snapshot, unusable = None, True
                stream = self.store.read_stream(topic, aggregate_id, 0, version)
        assert stream is not None
        envelopes = stream.envelopes
        if snapshot is None and not envelopes:
            raise AggregateNotFoundError(
                f"no events for {cls.__qualname__} {aggregate_id!r}", topic=topic
            )
        aggregate = cls.rehydrate(aggregate_id, [e.event for e in envelopes], snapshot=snapshot)
        aggregate._stored_offset = stream.last_offset if stream.last_offset is not None else at
        if version is not None and aggregate.version != version:
            raise AggregateNotFoundError(
                f"{cls.__qualname__} {aggregate_id!r} has {aggregate.version} events, not"
                f" {version}",
                topic=topic,
            )
        every = cls.snapshot_every
        if unusable and version is None and every and aggregate.version >= every:
            self._save_snapshot(aggregate)
        return aggregate

    def _ahead(self, aggregate_cls: type[Aggregate], aggregate_id: str, snapshot: Snapshot) -> None:
        log.warning(
            "snapshot ahead of its stream ignored",
            topic=self.topic_of(aggregate_cls),
            aggregate_id=aggregate_id,
            version=snapshot.aggregate_version,
        )

    def _read_after_snapshot(
        self, cls: type[A], aggregate_id: str, snapshot: Snapshot, at: int, version: int | None
    ) -> StreamRead | None:
        """The events after a snapshot taken at offset ``at``; ``None`` when the stream does
        not continue it (the event topic was recreated: the snapshot is ignored)."""
        topic = self.topic_of(cls)
        partition = self.store.partition_of(topic, aggregate_id)
        head = self.store.log.key_head(topic, partition, aggregate_id.encode())
        if head is None or head < at:
            self._ahead(cls, aggregate_id, snapshot)
            return None
        try:
            return self.store.read_stream(
                topic, aggregate_id, snapshot.aggregate_version, version, after_offset=at
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
        self, cls: type[A], aggregate_id: str, version: int | None
    ) -> tuple[Snapshot | None, int | None, bool]:
        """The latest usable snapshot at or below ``version``, the event offset it was
        taken at (``None``: not recorded), and whether the latest one stored was unusable
        (stale schema, undecodable)."""
        if not cls.snapshot_every:
            return None, None, False
        topic = snapshot_topic(self.topic_of(cls))
        log_ = self.store.log
        if not log_.topic_exists(topic):
            return None, None, False
        partition = self.store.partition_of(topic, aggregate_id)
        records = log_.read_key(topic, partition, aggregate_id.encode())
        if not records:
            return None, None, False
        record = records[-1]
        if record.value is None:  # removed (forget's tombstone): none, and not unusable
            return None, None, False
        where = {"topic": topic, "partition": partition, "offset": record.offset}
        try:
            snap = self.snapshots.decode(
                cls,
                record.key,
                record.value,
                record.headers,  # type: ignore[arg-type]
                topic=topic,
                partition=partition,
                offset=record.offset,
            )
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

    # ------------------------------------------------------------------ commands
    def execute(
        self,
        cls: type[A],
        aggregate_id: str,
        command_: Callable[[A], Any],
        *,
        create: bool = False,
        attempts: int = 20,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> A:
        """Load, run ``command`` on the aggregate, save; on a concurrency conflict reload
        and run it again (up to ``attempts`` times; from the second conflict on after a
        short random pause, see :func:`~framework.store.command.conflict_pause`), likewise
        when the log is unavailable (after :func:`~framework.store.command.unavailable_pause`);
        an append of unknown outcome is settled by reading the stream back, never repeated
        blindly (:mod:`framework.store.command`). ``create=True`` starts from a new
        aggregate when none exists."""
        aggregate, _ = command.drive(
            self.run_plan(
                cls,
                aggregate_id,
                command_,
                create,
                attempts,
                correlation_id,
                causation_id,
                once=False,
            )
        )
        assert aggregate is not None
        return aggregate

    def issue(
        self,
        cls: type[A],
        aggregate_id: str,
        command_: Callable[[A], Any],
        *,
        caused_by: Envelope[Any] | str,
        create: bool = True,
        attempts: int = 20,
    ) -> list[RecordMetadata]:
        """Run ``command`` on aggregate ``aggregate_id`` and save what it records, unless an
        event caused by ``caused_by`` is already in that aggregate's stream.

        The idempotent command of a policy: the saved events carry ``caused_by``'s event id
        as their ``causation_id`` (and its correlation id, or that event id, as their
        ``correlation_id``). The check and the save are one optimistic-concurrency step: if
        two deliveries of the same event race (a zombie and the partition's new owner), one
        save conflicts, reloads, sees the other's event and does nothing. Hence: pick
        ``aggregate_id`` deterministically from the triggering event, and still make the
        command a no-op when its work is done (a command that records nothing leaves no
        causation mark to find). The target's whole stream is read: keep policy targets
        small (an invoice, a shipment), not a long-lived ledger.

        Returns the appended records' metadata (empty when nothing was appended).
        """
        causation, correlation = causation_of(caused_by)
        _, written = command.drive(
            self.run_plan(
                cls, aggregate_id, command_, create, attempts, correlation, causation, once=True
            )
        )
        return written

    def run_plan(
        self,
        cls: type[A],
        aggregate_id: str,
        command_: Callable[[A], Any],
        create: bool,
        attempts: int,
        correlation_id: str | None,
        causation_id: str | None,
        *,
        once: bool,
    ) -> Generator[command.Step, Any, tuple[A | None, list[RecordMetadata]]]:
        """:meth:`execute` and :meth:`issue` as a plan of I/O requests (a sync or an async
        driver runs it): load, run, save, and on a conflict again, on the command path of
        :mod:`framework.store.command`. ``once``: load from the whole stream
        and do nothing (``None, []``) when an event in it was caused by ``causation_id``."""

        def decide() -> A | None:
            aggregate = self._load_for_command(cls, aggregate_id, create, causation_id, once)
            if aggregate is not None:
                command_(aggregate)
            return aggregate

        aggregate, written = yield from command.plan(
            self.store,
            self.topic_of(cls),
            aggregate_id,
            decide,
            attempts=attempts,
            retry_conflicts=True,
            correlation_id=correlation_id,
            causation_id=causation_id,
        )
        if aggregate is not None:
            yield command.Call(self._committed, (aggregate, written))
        return aggregate, written

    def _load_for_command(
        self, cls: type[A], aggregate_id: str, create: bool, causation_id: str | None, once: bool
    ) -> A | None:
        if not once:
            try:
                return self.load(cls, aggregate_id, checked=False)
            except AggregateNotFoundError:
                if not create:
                    raise
                return cls(aggregate_id)
        topic = self.topic_of(cls)
        stream = self.store.read_stream(topic, aggregate_id, checked=False)
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
        return aggregate
