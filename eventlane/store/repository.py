"""The repository: save and load aggregates, with optional snapshots.

``save`` appends an aggregate's pending events as one conditional, atomic batch (see
:mod:`eventlane.store.event_store`). ``load`` rebuilds the aggregate from the latest usable
snapshot plus the events after it, or from all its events. ``execute`` runs a command with
retry on concurrency conflicts (load, run, save; again on :class:`ConcurrencyError`); the
retry loop of ``execute``, ``issue`` and ``save`` is :mod:`eventlane.store.command`.

How an aggregate id becomes the aggregate a command or query sees (the cache, catching up
with the log, snapshots and their reconciliation) is :mod:`eventlane.store.stream`'s alone:
the repository names the topic and the snapshot codec, and drives the command path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from eventlane.codec import Envelope, SnapshotCodec
from eventlane.domain import Aggregate
from eventlane.log import RecordMetadata
from eventlane.log.position import Written
from eventlane.observability import get_logger
from eventlane.store import command
from eventlane.store.event_store import EventStore
from eventlane.store.stream import snapshot_topic
from eventlane.tracing import decide_span, load_span, loaded

log = get_logger("eventlane.store")

__all__ = ["SAVE_ATTEMPTS", "Repository", "causation_of", "snapshot_topic"]

A = TypeVar("A", bound=Aggregate)

SAVE_ATTEMPTS = 10
"""Appends a ``save`` may make: a conflict is never retried (the caller decides again), but
an unavailable log is waited for, and an append of unknown outcome is settled by reading the
stream back (:mod:`eventlane.store.command`)."""


def causation_of(caused_by: Envelope[Any] | str) -> tuple[str, str]:
    """``(causation_id, correlation_id)`` of a policy's command caused by ``caused_by`` (an
    event, or an event id)."""
    if isinstance(caused_by, str):
        return caused_by, caused_by
    causation = str(caused_by.event_id)
    return causation, caused_by.correlation_id or causation


def _given(aggregate: A) -> Generator[command.Step, Any, A]:
    """A save's decision: the aggregate it was given (a plan with nothing to load)."""
    yield from ()
    return aggregate


def _declared_topic(cls: type[Aggregate]) -> str:
    return cls.topic


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
        application maps it to (an app's namespace, :mod:`eventlane.app.namespace`)."""

    # ------------------------------------------------------------------ save
    def save(
        self,
        aggregate: Aggregate,
        *,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> Written:
        """Append the aggregate's pending events iff nobody saved it since it was loaded.

        Raises :class:`~eventlane.errors.ConcurrencyError` (nothing written) otherwise. An
        unavailable log is waited for, and an append of unknown outcome is settled by reading
        the stream back (:mod:`eventlane.store.command`): the events are stored once, or
        :class:`~eventlane.errors.OutcomeUnknownError` says the log cannot tell yet.
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
    ) -> Generator[command.Step, Any, Written]:
        """:meth:`save` as a plan of I/O requests (:mod:`eventlane.store.command`), for a
        sync or an async driver."""
        if not aggregate.pending_events:
            return Written()
        _, written = yield from command.plan(
            self.store,
            self.topic_of(type(aggregate)),
            aggregate.id,
            functools.partial(_given, aggregate),
            attempts=SAVE_ATTEMPTS,
            retry_conflicts=False,
            correlation_id=correlation_id,
            causation_id=causation_id,
        )
        yield from self._committed(aggregate, written)
        return Written(written)

    def _committed(
        self, aggregate: Aggregate, written: list[RecordMetadata]
    ) -> Generator[command.Step, Any, None]:
        return self.store.streams.committed_plan(
            aggregate, written, self.topic_of(type(aggregate)), self.snapshots
        )

    def _save_snapshot(self, aggregate: Aggregate) -> None:
        self.store.streams.save_snapshot(aggregate, self.topic_of(type(aggregate)), self.snapshots)

    def load(
        self, cls: type[A], aggregate_id: str, version: int | None = None, *, checked: bool = True
    ) -> A:
        """The aggregate as of ``version`` (default: latest): see
        :meth:`Streams.load <eventlane.store.stream.Streams.load>`.

        ``checked=False`` (commands): a cached stream is used as it is, without asking the
        log whether it moved; the conditional save catches a stale one. Raises
        :class:`~eventlane.errors.AggregateNotFoundError` when it has no events (or fewer
        than ``version``)."""
        return command.drive(self.load_plan(cls, aggregate_id, version, checked=checked))

    def load_plan(
        self, cls: type[A], aggregate_id: str, version: int | None = None, *, checked: bool = True
    ) -> Generator[command.Step, Any, A]:
        """:meth:`load` as a plan of I/O requests (:mod:`eventlane.store.steps`)."""
        return self.store.streams.load_plan(
            cls,
            aggregate_id,
            version,
            topic=self.topic_of(cls),
            snapshots=self.snapshots,
            checked=checked,
        )

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
        short random pause, see :func:`~eventlane.store.command.conflict_pause`), likewise
        when the log is unavailable (after :func:`~eventlane.store.command.unavailable_pause`);
        an append of unknown outcome is settled by reading the stream back, never repeated
        blindly (:mod:`eventlane.store.command`). ``create=True`` starts from a new
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
    ) -> Written:
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
        _, written = command.drive(
            self.issue_plan(
                cls, aggregate_id, command_, caused_by=caused_by, create=create, attempts=attempts
            )
        )
        return written

    def issue_plan(
        self,
        cls: type[A],
        aggregate_id: str,
        command_: Callable[[A], Any],
        *,
        caused_by: Envelope[Any] | str,
        create: bool = True,
        attempts: int = 20,
    ) -> Generator[command.Step, Any, tuple[A | None, Written]]:
        """:meth:`issue` as a plan of I/O requests, for the sync driver or an async one
        (the async runtime, an async policy's ``ctx.issue_async``)."""
        causation, correlation = causation_of(caused_by)
        return self.run_plan(
            cls, aggregate_id, command_, create, attempts, correlation, causation, once=True
        )

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
    ) -> Generator[command.Step, Any, tuple[A | None, Written]]:
        """:meth:`execute` and :meth:`issue` as a plan of I/O requests (a sync or an async
        driver runs it): load, run, save, and on a conflict again, on the command path of
        :mod:`eventlane.store.command`. ``once``: load from the whole stream
        and do nothing (``None, []``) when an event in it was caused by ``causation_id``."""
        topic = self.topic_of(cls)

        def decide() -> Generator[command.Step, Any, A | None]:
            with load_span(cls.__name__, topic) as span:
                aggregate = yield from self.store.streams.for_command(
                    cls,
                    aggregate_id,
                    topic=topic,
                    snapshots=self.snapshots,
                    create=create,
                    causation_id=causation_id,
                    once=once,
                )
                loaded(span, None if aggregate is None else aggregate.version)
            if aggregate is not None:
                with decide_span(cls.__name__):
                    command_(aggregate)
            return aggregate

        aggregate, written = yield from command.plan(
            self.store,
            topic,
            aggregate_id,
            decide,
            attempts=attempts,
            retry_conflicts=True,
            correlation_id=correlation_id,
            causation_id=causation_id,
        )
        if aggregate is not None:
            yield from self._committed(aggregate, written)
        return aggregate, Written(written)
