"""Projectors: event handlers that build a read model, declared by subclassing.

    >>> from attrs import frozen
    >>> from eventlane.domain import DomainEvent, event
    >>> @event("Deposited")
    ... @frozen
    ... class Deposited(DomainEvent):
    ...     amount: int
    >>> class Balances(Projector):
    ...     name = "balances"
    ...     topics = ("accounts",)
    ...
    ...     def setup(self, db: Database) -> None:
    ...         db.execute("CREATE TABLE IF NOT EXISTS balances (id TEXT PRIMARY KEY, total INT)")
    ...
    ...     @handles(Deposited)
    ...     def deposited(self, event: Deposited, ctx: EventContext) -> None:
    ...         ctx.db.execute(
    ...             "INSERT INTO balances VALUES (?, ?) ON CONFLICT(id) DO UPDATE"
    ...             " SET total = total + excluded.total", (ctx.aggregate_id, event.amount))
    >>> sorted(c.__name__ for c in Balances.handled_types())
    ['Deposited']

Rules:

* ``name`` names the projector's consumer group and its read-model file
  ``<data>/readmodels/<name>.sqlite``; ``topics`` are the event topics it reads.
* One handler per event class, declared with :func:`handles`; events of other types are
  skipped (their position still advances). A handler gets the decoded, upcast event and an
  :class:`EventContext` with the coordinates, the envelope and the read-model session.
* Handlers write only to the read model: ``ctx.table(name)`` (the portable table API of
  :mod:`.tables`: the same calls on SQLite and PostgreSQL), ``ctx.conn`` (the raw
  connection: ``sqlite3.Connection``, or ``psycopg.Connection`` on a PostgreSQL read model)
  or ``ctx.db`` (on SQLite the same connection as a ``sqlite_utils.Database``; on
  PostgreSQL the psycopg connection). Raw SQL is the engine's dialect (``?`` or ``%s``).
  The framework wraps each poll's events, and the positions they advance, in one
  transaction: an event's effect is applied exactly once.
* A handler that raises is retried ``handler_attempts`` times (its writes rolled back
  each time), then the event is dead-lettered and the partition moves on.
* ``ctx.replaying`` is true during a rebuild: handlers suppress side effects then (commands
  to aggregates, e-mails). Policies issue commands with :meth:`EventContext.issue`: a
  deterministic target aggregate id per triggering event, the triggering event's id as the
  causation id (checked before the command runs), and a command that is a no-op when its
  work is done, so a redelivery never issues twice.
* ``migrations`` (a ``sqlite_utils.Migrations`` set) evolves the read model's tables; a
  worker refuses to start while one is pending (``eventlane migrate APP``), except on a new
  read model, which is created at its latest schema. With ``migrations``, create the tables
  in the first migration; ``setup`` is for projectors without them (or idempotent extras).
* ``merge_rules`` (table → rule) tells a parallel rebuild how to merge rows written from
  several partitions; see :mod:`eventlane.replay`.
* ``poison_breaker = (LIMIT, WINDOW)``: a worker stops applying (and keeps its position)
  when LIMIT of the last WINDOW events were dead-lettered, so a bug in a handler does not
  dead-letter the whole topic; ``None`` turns it off. See :mod:`.breaker`.
"""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar, overload

from eventlane.codec import Envelope
from eventlane.domain import Aggregate, DomainEvent
from eventlane.domain.dispatch import collect_marked, mark
from eventlane.errors import ConfigError, ProjectionError
from eventlane.log import Log, RecordMetadata
from eventlane.projection._sqlite_utils import Database, Migrations
from eventlane.projection.tables import Dialect, Table

__all__ = ["CommandSide", "EventContext", "Projector", "handles"]

P = TypeVar("P", bound="Projector")
E = TypeVar("E", bound=DomainEvent)
A = TypeVar("A", bound=Aggregate)
Handler = Callable[[P, E, "EventContext"], None]


class CommandSide(Protocol):
    """What a handler may do to the write side (``ctx.app``): load, save, execute and issue
    commands. The application's runtime (:class:`eventlane.Runtime`) provides it; the
    projection layer names only this Protocol, never the application layer."""

    @property
    def log(self) -> Log: ...

    def load(self, cls: type[A], aggregate_id: str, version: int | None = None) -> A:
        """The aggregate rebuilt from its events (``AggregateNotFoundError`` if none)."""
        ...

    def save(self, aggregate: Aggregate, **envelope: Any) -> list[RecordMetadata]:
        """Append what the aggregate recorded (``ConcurrencyError`` on a conflict)."""
        ...

    def execute(
        self, cls: type[A], aggregate_id: str, command: Callable[[A], Any], **options: Any
    ) -> A:
        """Load, run ``command``, save; retried on a write conflict."""
        ...

    def issue(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        caused_by: Envelope[Any] | str,
        create: bool = True,
    ) -> list[RecordMetadata]:
        """``execute`` at most once per ``caused_by`` event (see :meth:`EventContext.issue`)."""
        ...

    def schedule(self, command: Any, *, at: Any, key: str, caused_by: str | None = None) -> str:
        """Run a command that is data at a moment (:mod:`eventlane.app.schedules`)."""
        ...

    def cancel_schedule(self, key: str) -> bool:
        """Withdraw a pending schedule."""
        ...


_HANDLES_ATTR = "__eventlane_handles__"


@overload
def handles(event_cls: type[E], /) -> Callable[[Handler[P, E]], Handler[P, E]]: ...
@overload
def handles(method: Handler[P, E], /) -> Handler[P, E]: ...
def handles(target: Any, /) -> Any:
    """Mark a projector method as the handler of an event class: ``@handles`` takes it from
    the annotation of the method's event parameter, ``@handles(EventClass)`` names it."""
    return mark(target, _HANDLES_ATTR, "@handles")


def _topic_names(cls: type, topics: object) -> tuple[str, ...]:
    if isinstance(topics, str) or not isinstance(topics, Sequence):
        raise ConfigError(
            f"{cls.__qualname__}.topics must be a tuple of topic names or aggregate classes"
        )
    names = []
    for entry in topics:
        topic = entry
        if isinstance(entry, type) and issubclass(entry, Aggregate):
            topic = getattr(entry, "topic", None)
        if not isinstance(topic, str) or not topic:
            raise ConfigError(
                f"{cls.__qualname__}.topics: {entry!r} is neither a topic name nor an aggregate"
                " class with a topic"
            )
        names.append(topic)
    return tuple(names)


def _setup_migrations(cls: type[Projector]) -> Migrations:
    """``cls.setup`` as the one migration of a set named ``<name>.setup``."""
    migrations = Migrations(f"{getattr(cls, 'name', cls.__qualname__)}.setup")

    @migrations(name="m001_setup")
    def m001_setup(db: Database) -> None:
        cls().setup(db)

    return migrations


def _check_concurrency(cls: type[Projector]) -> None:
    """The rule of per-key parallelism: concurrent handlers run outside the read model's
    transaction, so a projector with ``concurrency > 1`` (or ``async def`` handlers, run
    as concurrent tasks) may not have tables to write."""
    n = cls.concurrency
    asynchronous = [name for name, h in cls._handlers.items() if inspect.iscoroutinefunction(h)]
    if asynchronous and cls.migrations is not None:
        raise ConfigError(
            f"{cls.__qualname__}: async handlers run as concurrent tasks, outside the read"
            " model's transaction, so they may not write a read model; keep the handlers of"
            " a projector with tables sync"
        )
    if type(n) is not int or n < 1:
        raise ConfigError(f"{cls.__qualname__}.concurrency must be an int >= 1, got {n!r}")
    if n > 1 and cls.migrations is not None:
        raise ConfigError(
            f"{cls.__qualname__}: concurrency = {n} runs handlers of different keys at once,"
            " outside the read model's transaction, so they may not write a read model; drop"
            " its migrations/setup (a policy that issues commands), or keep concurrency = 1"
        )


class EventContext:
    """Where an event came from, its envelope, and the session to write the read model.

    Valid during the handler call only. ``conn`` is the read model's raw connection
    (``sqlite3.Connection``, or ``psycopg.Connection`` on PostgreSQL); ``db`` wraps it in a
    ``sqlite_utils.Database`` on SQLite and is the psycopg connection on PostgreSQL;
    :meth:`table` is the portable table API. All are inside the batch's transaction: never
    commit, roll back or begin on them.
    """

    __slots__ = (
        "app",
        "conn",
        "db",
        "envelope",
        "issue_on_loop",
        "offset",
        "partition",
        "replaying",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        envelope: Envelope[Any],
        db: Any,
        replaying: bool = False,
        app: CommandSide | None = None,
        conn: Any = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.envelope = envelope
        self.db: Any = db
        """``sqlite_utils.Database`` on SQLite, ``psycopg.Connection`` on PostgreSQL."""
        self.conn: Any = db.conn if conn is None else conn
        """The raw connection: ``sqlite3.Connection`` or ``psycopg.Connection``."""
        self.replaying = replaying
        self.app = app
        """The application (command side), for policies that issue commands; None in rebuilds."""
        self.issue_on_loop: Callable[..., Awaitable[Any]] | None = None
        """Set by an async policy's applier where the log has an asyncio face: performs
        :meth:`issue_async` on the worker's loop (``(cls, id, command, caused_by, create)``)."""

    def __repr__(self) -> str:
        return (
            f"EventContext(topic={self.topic!r}, partition={self.partition},"
            f" offset={self.offset}, type={self.envelope.type_name!r},"
            f" aggregate_id={self.aggregate_id!r}, replaying={self.replaying})"
        )

    @property
    def aggregate_id(self) -> str:
        return self.envelope.aggregate_id

    @property
    def dialect(self) -> Dialect:
        """``"sqlite"`` or ``"postgresql"``: the read model's engine (its raw SQL dialect)."""
        return "sqlite" if isinstance(self.conn, sqlite3.Connection) else "postgresql"

    def table(self, name: str) -> Table:
        """Table ``name`` of the read model through the portable API (:mod:`.tables`):
        ``insert``/``upsert``/``update``/``delete``/``get``/``query`` by columns, the same
        on every engine, inside the batch's transaction."""
        return Table(self.conn, name, self.dialect)

    @property
    def aggregate_version(self) -> int:
        return self.envelope.aggregate_version

    @property
    def event_id(self) -> str:
        return str(self.envelope.event_id)

    def issue(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        create: bool = True,
    ) -> list[RecordMetadata]:
        """A policy's command: run ``command`` on aggregate ``aggregate_id`` and save it,
        at most once per triggering event, whatever the redeliveries.

        The events it records carry this event's id as their ``causation_id``; before
        running the command the target's stream is checked for an event caused by this
        one, and if there is one nothing is done (a redelivery after a crash, a zombie's
        batch). Pick ``aggregate_id`` deterministically from the triggering event (e.g.
        ``f"invoice-{ctx.aggregate_id}"``), never a fresh uuid, and make the command a
        no-op when its work is already done. In a rebuild (``replaying``) nothing is
        issued. Returns what was appended (empty when nothing was).
        See :meth:`eventlane.Runtime.issue`.
        """
        if self.replaying:
            return []
        if self.app is None:
            raise ProjectionError(
                "ctx.issue() needs the application: this applier was built without app=",
                topic=self.topic,
                partition=self.partition,
                offset=self.offset,
            )
        return self.app.issue(cls, aggregate_id, command, caused_by=self.envelope, create=create)

    async def issue_async(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        create: bool = True,
    ) -> list[RecordMetadata]:
        """:meth:`issue` from an ``async def`` handler: the same command path, without
        blocking the worker's loop. Its log calls are awaited on the log's asyncio face
        where the engine has one (JetStream, :attr:`issue_on_loop`); elsewhere (the
        embedded log) the whole command runs in one thread (concurrent issues share the
        log's fsyncs)."""
        if self.replaying:
            return []
        on_loop = self.issue_on_loop
        if on_loop is not None:
            written: list[RecordMetadata] = await on_loop(
                cls, aggregate_id, command, self.envelope, create
            )
            return written
        return await asyncio.to_thread(self.issue, cls, aggregate_id, command, create=create)

    def schedule(self, command: Any, *, at: Any, key: str) -> str | None:
        """A deadline: run ``command`` (a command that is data, registered with
        ``App(commands=...)``) at ``at`` (aware datetime or epoch ms), once in effect, by the
        app's scheduler (:mod:`eventlane.app.schedules`). ``key`` names the schedule
        (e.g. ``f"expire-{ctx.aggregate_id}"``); the schedule's id is derived from it and
        this event, so a redelivery schedules nothing new. Nothing in a rebuild (``None``)."""
        if self.replaying:
            return None
        return self._command_side("schedule").schedule(
            command, at=at, key=key, caused_by=self.event_id
        )

    def cancel_schedule(self, key: str) -> bool:
        """Withdraw the pending schedule ``key`` (False: none pending; nothing in a
        rebuild)."""
        if self.replaying:
            return False
        return self._command_side("cancel_schedule").cancel_schedule(key)

    def _command_side(self, what: str) -> CommandSide:
        if self.app is None:
            raise ProjectionError(
                f"ctx.{what}() needs the application: this applier was built without app=",
                topic=self.topic,
                partition=self.partition,
                offset=self.offset,
            )
        return self.app


class Projector:
    """Base class of projectors (see the module docstring)."""

    name: ClassVar[str]
    topics: ClassVar[Sequence[str | type[Aggregate]]]
    """The event topics it reads: topic names, or aggregate classes (their ``topic``)."""
    topic_names: ClassVar[tuple[str, ...]] = ()
    """``topics`` as names (set when the class is created)."""
    migrations: ClassVar[Migrations | None] = None
    """A ``sqlite_utils.Migrations`` set for the read model: the one way its tables are
    created and changed; pending ones block start-up (``setup`` is shorthand for a set of one)."""
    merge_rules: ClassVar[Mapping[str, str]] = {}
    """Per read-model table: how a parallel rebuild merges rows from several partitions."""
    park_after_dead_letter: ClassVar[bool] = False
    """Keep per-key order: park later events of a key behind a dead-lettered one."""
    handler_attempts: ClassVar[int] = 3
    """Tries per event before it is dead-lettered."""
    policy: ClassVar[bool] = False
    """It issues commands (``ctx.issue``): a causal wait (``Runtime.wait_causal``) waits
    for it to handle a write's events and follows the commands it issued for them."""
    concurrency: ClassVar[int] = 1
    """Per-key parallelism inside a partition (see :mod:`eventlane.projection.parallel`):
    with ``N > 1``, events of different keys of one partition are handled by up to ``N``
    threads at once, events of one key strictly in order. Only for projectors that do not
    write a read model (policies issuing commands): no ``migrations``, no ``setup``, and
    ``ctx.db``/``ctx.conn`` raise. Ignored in rebuilds (nothing is issued there)."""
    adaptive: ClassVar[bool] = True
    """With ``concurrency > 1``: run a batch's events on the polling thread instead of the
    ``N`` threads while a probe shows the handlers computing more than they wait (threads
    of one interpreter then only add hand-offs of the GIL); ``False``: always threads."""
    poison_breaker: ClassVar[tuple[int, int] | None] = (50, 100)
    """``(LIMIT, WINDOW)``: stop applying when LIMIT of the last WINDOW events were
    dead-lettered (:mod:`.breaker`); ``None``: never."""
    readmodel_url: ClassVar[str | None] = None
    """Where this projector's read model lives when not where the app's are: a
    ``postgresql://`` URL (a schema of that database) or ``"sqlite:"`` (the file in the data
    directory); see :mod:`eventlane.projection.store`."""
    state_per_key: ClassVar[bool] = False
    """Every row belongs to one aggregate (key): a parallel rebuild may split a partition
    into key groups (more tasks than partitions); see :mod:`eventlane.replay`."""

    _handlers: ClassVar[Mapping[type[DomainEvent], Callable[..., None]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._handlers = collect_marked(cls, _HANDLES_ATTR, "handle", cls._handlers)
        topics = cls.__dict__.get("topics")
        if topics is not None:
            cls.topic_names = _topic_names(cls, topics)
        if "setup" in cls.__dict__:
            if cls.migrations is not None:
                raise ConfigError(
                    f"{cls.__qualname__}: create the tables in its migrations or in setup(),"
                    " not both (setup() is the first migration of a projector without any)"
                )
            cls.migrations = _setup_migrations(cls)
        _check_concurrency(cls)

    @classmethod
    def handled_types(cls) -> tuple[type[DomainEvent], ...]:
        return tuple(cls._handlers)

    @classmethod
    def handler_for(cls, event_cls: type[DomainEvent]) -> Callable[..., None] | None:
        return cls._handlers.get(event_cls)

    def setup(self, db: Database) -> None:
        """Shorthand for a one-migration set: override it (and leave ``migrations`` unset) to
        create the tables of a projector whose schema never changes. It runs once, when the
        read model is new (or by ``eventlane migrate``), as migration ``m001_setup`` of the
        set ``<name>.setup``."""

    def handle(self, event: DomainEvent, ctx: EventContext) -> bool:
        """Dispatch ``event`` to its handler; return whether one exists."""
        handler = self._handlers.get(type(event))
        if handler is None:
            return False
        handler(self, event, ctx)
        return True
