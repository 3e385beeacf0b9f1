"""A testing kit for projectors and policies: given events → these rows, these commands.

:class:`ProjectorFixture` runs a projector's handlers with no worker process and no consumer
group, but through the code a worker runs: the app is opened on a temporary embedded log,
each given event is saved to its aggregate's stream (encoded by the app's codec, as a command
would save it), read back as a record and applied by the worker's own applier
(:func:`eventlane.projection.parallel.applier_for`: the same dispatch, transaction, retries
and dead letters) to a temporary read model created by the projector's migrations. Commands
a policy issues (``ctx.issue``) run on that application for real (causation check, retries),
so what they append is what the fixture reports.

Invariants: each given event is applied exactly once, in the order given; ``issued`` is
exactly what the projector's handlers appended to aggregate topics since the last ``when``
(or since the start), decoded; a fixture never touches anything outside its temporary
directory (removed by :meth:`ProjectorFixture.close`, or the ``with`` block).

Used as (the invoicing app's policy; docs/projections.md has more)::

    with ProjectorFixture(app, "invoicing_policy") as fx:
        fx.given(Order, "o-1", placed).when(Order, "o-1", OrderConfirmed("c-1", 1000))
        fx.then_issued((Invoice, "invoice-o-1", InvoiceIssued("o-1", "c-1", 1000)))

Deadlines a policy schedules (``ctx.schedule``) are written to the fixture's log as a worker
writes them (flushed with the event's batch): :meth:`ProjectorFixture.scheduled` lists the
pending ones (key, decoded command, moment), :meth:`~ProjectorFixture.then_scheduled` asserts
them all, :meth:`~ProjectorFixture.then_no_schedule` that keys hold none (withdrawn, or never
scheduled)::

    fx.given(Order, "o-1", placed)
    fx.then_scheduled(("confirm-o-1", CancelUnconfirmed("o-1"), deadline))
    fx.when(Order, "o-1", OrderConfirmed("c-1", 1000))
    fx.then_no_schedule("confirm-o-1")

A failed expectation raises ``AssertionError`` with a unified diff of expected and actual; an
event the projector dead-lettered fails every ``then_rows``/``then_issued`` with its error,
unless :meth:`~ProjectorFixture.then_dead_lettered` expects it.
"""

from __future__ import annotations

import difflib
import pprint
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from eventlane.app.moments import as_of_ms
from eventlane.domain import Aggregate, DomainEvent
from eventlane.errors import AggregateNotFoundError, ConfigError
from eventlane.log import Record, RecordMetadata
from eventlane.projection.applier import BatchApplier
from eventlane.projection.dead_letters import DeadLetter, list_dead_letters
from eventlane.projection.parallel import ParallelApplier, applier_for
from eventlane.projection.postgres import PgReadModel, schema_name
from eventlane.projection.projector import Projector
from eventlane.projection.readmodel import ReadModel
from eventlane.projection.schema import apply_migrations
from eventlane.projection.store import AnyReadModel
from eventlane.projection.tables import Table

if TYPE_CHECKING:
    from eventlane.app.application import App, Runtime

__all__ = ["Issued", "ProjectorFixture", "Scheduled"]


class Issued(NamedTuple):
    """An event a projector's command appended: the aggregate class, its id, the event."""

    cls: type[Aggregate]
    aggregate_id: str
    event: DomainEvent


class Scheduled(NamedTuple):
    """A pending schedule: its key, the command it will run, its moment (aware, UTC)."""

    key: str
    command: Any
    at: datetime


def _moment(at: datetime | int) -> datetime:
    """``at`` (aware datetime or epoch ms) as the UTC datetime of its millisecond."""
    return datetime.fromtimestamp(as_of_ms(at) / 1000, UTC)


def _line(s: Scheduled) -> str:
    return f"{s.key}: {s.command!r} at {s.at.isoformat(timespec='milliseconds')}"


def _diff(what: str, expected: Any, actual: Any, *, lines: bool = False) -> str:
    """A unified diff of ``expected`` and ``actual`` (pretty-printed; ``lines``: lists of
    lines as they are)."""
    diff = difflib.unified_diff(
        expected if lines else pprint.pformat(expected, width=100).splitlines(),
        actual if lines else pprint.pformat(actual, width=100).splitlines(),
        fromfile=f"expected {what}",
        tofile=f"actual {what}",
        lineterm="",
    )
    return "\n".join(diff)


class ProjectorFixture:
    """Given events → one projector's handlers (see the module docstring).

    ``projector``: its name in ``app`` or its class. ``replaying=True`` applies as a rebuild
    does (``ctx.replaying``; nothing is issued). ``directory``: where the temporary log and
    read model live (a new temporary directory by default, removed on close).
    ``readmodels``: a ``postgresql://`` URL puts the read model in a fresh schema of that
    database instead (dropped on close), to run the same expectations on PostgreSQL.
    """

    def __init__(
        self,
        app: App,
        projector: str | type[Projector],
        *,
        replaying: bool = False,
        directory: str | Path | None = None,
        readmodels: str | None = None,
    ) -> None:
        cls = app.projector(projector) if isinstance(projector, str) else projector
        if not (isinstance(cls, type) and issubclass(cls, Projector)):
            raise ConfigError(f"ProjectorFixture: {projector!r} is not a projector class")
        self._owned = directory is None
        self.directory = Path(
            tempfile.mkdtemp(prefix="eventlane-fixture-") if directory is None else directory
        )
        self.projector = cls()
        self.runtime: Runtime = app.open(self.directory / "log")
        self._topics = set(self.runtime.names.projector_topics(cls))
        self._classes = {self.runtime.names.aggregate_topic(a): a for a in app.aggregates}
        path = self.directory / "readmodels" / f"{cls.name}.sqlite"
        self.readmodel: AnyReadModel = (
            ReadModel(path)
            if readmodels is None
            else PgReadModel(readmodels, schema_name(f"fixture_{uuid.uuid4().hex}"), path)
        )
        apply_migrations(cls.migrations, self.readmodel)
        self._applier: BatchApplier = (
            BatchApplier(self.projector, self.runtime.codec, self.readmodel, replaying=True)
            if replaying
            else applier_for(self.projector, self.runtime.codec, self.readmodel, app=self.runtime)
        )
        self._given: set[tuple[str, int, int]] = set()
        self._issued: list[Issued] = []
        self._since = 0
        self._letters_expected = 0

    # ------------------------------------------------------------------ given / when
    def given(
        self, cls: type[Aggregate], aggregate_id: str, *events: DomainEvent
    ) -> ProjectorFixture:
        """Save ``events`` to ``aggregate_id``'s stream (after what it has; its apply methods
        run, so the history must be one the aggregate accepts) and apply each to the
        projector, in order, if it reads that topic."""
        try:
            aggregate = self.runtime.load(cls, aggregate_id)
        except AggregateNotFoundError:
            aggregate = cls.rehydrate(aggregate_id, [])
        for event in events:
            aggregate.record_that(event)
        written = self.runtime.save(aggregate)
        for meta in written:
            self._given.add((meta.topic, meta.partition, meta.offset))
        for meta in written:
            self._apply(meta)
        return self

    def when(
        self, cls: type[Aggregate], aggregate_id: str, *events: DomainEvent
    ) -> ProjectorFixture:
        """:meth:`given`, after which ``issued`` and ``then_issued`` see only what these
        events caused."""
        self._since = len(self._issued)
        return self.given(cls, aggregate_id, *events)

    def _apply(self, meta: RecordMetadata) -> None:
        if meta.topic not in self._topics:
            return
        marks = {t: self._marks(t) for t in self._classes}
        records, _ = self.runtime.log.read(
            meta.topic, meta.partition, meta.offset, upto=meta.offset + 1
        )
        self._applier.apply([r for r in records if r.offset == meta.offset])
        for topic, before in marks.items():
            for partition, start in enumerate(before):
                self._collect(topic, partition, start)

    def _marks(self, topic: str) -> list[int]:
        log = self.runtime.log
        return [log.offsets(topic, p).hwm for p in range(log.partition_count(topic))]

    def _collect(self, topic: str, partition: int, start: int) -> None:
        end = self.runtime.log.offsets(topic, partition).hwm
        offset = start
        while offset < end:
            records, _ = self.runtime.log.read(topic, partition, offset, upto=end)
            if not records:
                break
            for record in records:
                self._record_issued(record)
            offset = records[-1].offset + 1

    def _record_issued(self, record: Record) -> None:
        if (record.topic, record.partition, record.offset) in self._given or record.value is None:
            return
        headers = [(n, v) for n, v in record.headers if v is not None]
        envelope = self.runtime.codec.decode(
            record.key,
            record.value,
            headers,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )
        self._issued.append(
            Issued(self._classes[record.topic], envelope.aggregate_id, envelope.event)
        )

    # ------------------------------------------------------------------ what happened
    def rows(self, table: str, *, order_by: str | None = None) -> list[dict[str, Any]]:
        """The rows of a read-model table (``ORDER BY order_by`` if given)."""
        rows = Table(self.readmodel.user_conn, table, self.readmodel.dialect)
        return rows.query(order_by=order_by or ())

    def issued(self) -> list[Issued]:
        """What the projector's commands appended since the last :meth:`when`, in order."""
        return self._issued[self._since :]

    def scheduled(self) -> list[Scheduled]:
        """The pending schedules (asked for and neither withdrawn nor fired), by key."""
        schedules = self.runtime.schedules
        entries = schedules.entries()
        return [
            Scheduled(e.key, schedules.codec.decode(e.command, e.data), _moment(e.at))
            for e in sorted(entries.values(), key=lambda e: e.key)
            if e.state == "scheduled"
        ]

    def dead_letters(self) -> list[DeadLetter]:
        """The events the projector dead-lettered so far."""
        return list_dead_letters(self.readmodel)

    # ------------------------------------------------------------------ then
    def _no_surprise_letters(self) -> None:
        letters = self.dead_letters()
        if len(letters) > self._letters_expected:
            raise AssertionError(
                "the projector dead-lettered events:\n"
                + "\n".join(
                    f"  {d.topic}/{d.partition}@{d.offset}: {d.event_type}: {d.error_line}"
                    for d in letters
                )
            )

    def then_rows(
        self,
        table: str,
        expected: Sequence[Mapping[str, Any]],
        *,
        order_by: str | None = None,
    ) -> None:
        """Assert ``table`` holds exactly ``expected``: the columns the expected rows name
        (any others are not compared), in ``order_by`` order if given, else as a multiset."""
        self._no_surprise_letters()
        columns = sorted({c for row in expected for c in row})
        actual = [{c: row.get(c) for c in columns} for row in self.rows(table, order_by=order_by)]
        wanted = [{c: row.get(c) for c in columns} for row in expected]
        if order_by is None:
            actual.sort(key=repr)
            wanted.sort(key=repr)
        if actual != wanted:
            raise AssertionError(
                f"table {table!r} differs:\n" + _diff(f"rows of {table}", wanted, actual)
            )

    def then_issued(self, *expected: Issued | tuple[type[Aggregate], str, DomainEvent]) -> None:
        """Assert the projector's commands appended exactly ``expected`` since the last
        :meth:`when`: ``(aggregate class, aggregate id, event)`` in order."""
        self._no_surprise_letters()
        wanted = [Issued(*e) for e in expected]
        actual = self.issued()
        if actual != wanted:
            raise AssertionError("issued events differ:\n" + _diff("issued", wanted, actual))

    def then_scheduled(self, *expected: Scheduled | tuple[str, Any, datetime | int]) -> None:
        """Assert the pending schedules are exactly ``expected``: ``(key, command, at)``,
        ``at`` an aware datetime or epoch ms (compared to the millisecond), in any order.
        Every pending schedule counts, not only those since the last :meth:`when`."""
        self._no_surprise_letters()
        wanted = sorted(
            (Scheduled(k, c, _moment(at)) for k, c, at in expected), key=lambda e: e.key
        )
        actual = self.scheduled()
        if actual != wanted:
            raise AssertionError(
                "pending schedules differ:\n"
                + _diff("scheduled", [*map(_line, wanted)], [*map(_line, actual)], lines=True)
            )

    def then_no_schedule(self, *keys: str) -> None:
        """Assert none of ``keys`` holds a pending schedule (each withdrawn, fired or never
        scheduled); the diff shows what each key holds."""
        self._no_surprise_letters()
        entries = self.runtime.schedules.entries()
        held = {k: entries[k].state if k in entries else None for k in keys}
        pending = {k: state for k, state in held.items() if state == "scheduled"}
        if pending:
            wanted = {k: ("not pending" if s == "scheduled" else s) for k, s in held.items()}
            raise AssertionError(
                "keys still hold pending schedules:\n" + _diff("schedule states", wanted, held)
            )

    def then_dead_lettered(self, *type_names: str) -> list[DeadLetter]:
        """Assert the projector dead-lettered exactly events of these types (in order) so
        far; returns the dead letters."""
        letters = self.dead_letters()
        actual = [d.event_type for d in letters]
        if actual != list(type_names):
            raise AssertionError(
                "dead letters differ:\n" + _diff("dead-lettered types", list(type_names), actual)
            )
        self._letters_expected = len(letters)
        return letters

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the application and the read model; remove the temporary directory."""
        if isinstance(self._applier, ParallelApplier):
            self._applier.close()
        if isinstance(self.readmodel, PgReadModel):
            self.readmodel.raw.execute(f'DROP SCHEMA "{self.readmodel.schema}" CASCADE')
        self.readmodel.close()
        self.runtime.close()
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ProjectorFixture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
