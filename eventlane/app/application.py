"""The application: its declaration (:class:`App`) and its connection to a log (:class:`Runtime`).

:class:`App` declares aggregates, events and projectors and does no I/O;

``app.open(data_dir)`` connects it to a log and returns a :class:`Runtime`: the command side
(save, load, execute, ``issue`` for policies) and the query side's hooks (``wait_for`` for
read-your-writes, ``status``, ``readmodel_path``). The CLI's ``APP`` argument
(``module:attribute``, or ``$EVENTLANE_APP``) names an :class:`App`::

    app = App("invoicing", aggregates=[Order, Invoice], projectors=[Invoices])
    with app.open("./eventlane-data") as runtime:
        written = runtime.save(order)
        runtime.wait_for("invoices", written, timeout=5.0)   # read your own writes

An :class:`App` is picklable (Spark executors rebuild its codec from it) and cheap to import.

    >>> import tempfile
    >>> from typing import ClassVar
    >>> from attrs import frozen
    >>> from eventlane import Aggregate, DomainEvent, applies, event
    >>> @event("Opened")
    ... @frozen
    ... class Opened(DomainEvent):
    ...     owner: str
    >>> class Account(Aggregate):
    ...     topic: ClassVar[str] = "accounts"
    ...     owner: str
    ...     def init_state(self) -> None:
    ...         self.owner = ""
    ...     def open(self, owner: str) -> None:
    ...         self.record_that(Opened(owner))
    ...     @applies(Opened)
    ...     def _opened(self, event: Opened) -> None:
    ...         self.owner = event.owner
    >>> with tempfile.TemporaryDirectory() as data:
    ...     with App("bank", aggregates=[Account]).open(data) as runtime:
    ...         account = Account("acc-1")
    ...         account.open("ada")
    ...         _ = runtime.save(account)
    ...         (runtime.load(Account, "acc-1").owner, runtime.load(Account, "acc-1").version)
    ('ada', 1)

Event topics are created on open with the defaults an event store needs (brief section 2):
unbounded retention and no compaction, so a rebuild from the low-water mark sees the whole
history.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from eventlane.app.aio import DEFAULT_THREADS, AsyncRuntime
from eventlane.app.causal import as_position, causal_plan, check_position, drive_causal
from eventlane.app.moments import as_of_ms
from eventlane.app.namespace import Namespace
from eventlane.codec import Envelope, EventCodec, EventRegistry, SnapshotCodec
from eventlane.codec.converter import OrjsonConverter
from eventlane.codec.keystore import KeyStore, LogKeyStore
from eventlane.consumer.coordination import Coordinator, coordination_for
from eventlane.domain import Aggregate, Command, DomainEvent
from eventlane.domain.privacy import personal_fields
from eventlane.engine import open_log
from eventlane.errors import AggregateNotFoundError, ConfigError
from eventlane.log import KeyedLog, RecordMetadata, TopicPartition
from eventlane.log.port import keyed_log
from eventlane.log.position import Position, Written
from eventlane.observability import get_logger
from eventlane.projection.postgres import schema_name
from eventlane.projection.projector import Projector
from eventlane.projection.status import offsets_after, projection_status, wait_for_offsets
from eventlane.projection.store import Location, location_of, view_of
from eventlane.store import DEFAULT_PARTITIONS, EVENT_TOPIC_CONFIG, EventStore, Repository
from eventlane.store.steps import LogCall, Step, drive
from eventlane.store.stream_cache import DEFAULT_EVENTS
from eventlane.tracing import command_span

log = get_logger("eventlane.app")

A = TypeVar("A", bound=Aggregate)

__all__ = ["App", "Runtime"]


class App:
    """What an application is made of. Cheap to import; :meth:`open` does the I/O.

    ``partitions`` is the partition count of the event topics the runtime creates, one
    number or per (declared) topic; ``registry`` carries upcasters and extra event types;
    ``configure`` adds cattrs hooks to the codec's converter. ``namespace`` (e.g.
    ``"acme"``) prefixes every topic, consumer group and local file the app owns
    (``acme.orders``, ``acme.invoices``): apps, or deployments of one app, with different
    namespaces share a data directory or cluster without seeing each other; see
    :mod:`eventlane.app.namespace`. Its mapping is :attr:`names`. ``cache_events`` bounds
    the events a runtime keeps decoded from recently used streams, so that loading an
    aggregate again reads only what changed (:mod:`eventlane.store.stream_cache`; ``0``:
    off). ``readmodels`` (a ``postgresql://`` URL) puts every projector's read model in
    PostgreSQL (:mod:`eventlane.projection.store`).
    """

    def __init__(
        self,
        name: str,
        *,
        aggregates: Iterable[type[Aggregate]] = (),
        events: Iterable[type[DomainEvent]] = (),
        projectors: Iterable[type[Projector]] = (),
        registry: EventRegistry | None = None,
        partitions: int | Mapping[str, int] = DEFAULT_PARTITIONS,
        configure: Callable[[OrjsonConverter], None] | None = None,
        keys: Callable[[KeyedLog], KeyStore] | None = None,
        keys_topic: str | None = None,
        on_forget: Iterable[Callable[[Runtime, str], None]] = (),
        namespace: str | None = None,
        cache_events: int = DEFAULT_EVENTS,
        commands: Iterable[type[Command[Any]]] = (),
        readmodels: str | None = None,
    ) -> None:
        self.name = name
        self.readmodels = readmodels
        """Where the projectors' read models live: ``None`` (SQLite files in the data
        directory, or ``$EVENTLANE_READMODELS``) or ``postgresql://...`` (a schema per
        projection; :mod:`eventlane.projection.store`)."""
        self.names = Namespace(namespace)
        """How the app's declared names map to the log's (:mod:`eventlane.app.namespace`)."""
        self.aggregates = tuple(aggregates)
        self.events = tuple(events)
        self.projectors: dict[str, type[Projector]] = {}
        schemas: dict[str, str] = {}  # PostgreSQL schema -> the projector named for it
        for cls in projectors:
            pname = getattr(cls, "name", None)
            if not isinstance(pname, str) or not pname:
                raise ConfigError(f"projector {cls.__qualname__} has no name")
            if pname in self.projectors:
                raise ConfigError(f"two projectors named {pname!r}")
            other = schemas.setdefault(schema_name(pname), pname)
            if other != pname:
                raise ConfigError(
                    f"projectors {other!r} and {pname!r} differ only by case or"
                    " punctuation: their read models would share one PostgreSQL schema"
                    f" ({schema_name(pname)}); rename one"
                )
            self.projectors[pname] = cls
        self.registry = registry if registry is not None else EventRegistry()
        self.partitions = partitions
        self.configure = configure
        self.keys = keys
        self.keys_topic = keys_topic or f"{name}.keys"
        self.on_forget = tuple(on_forget)
        self.cache_events = cache_events
        self.commands = tuple(commands)
        """Command classes that are data (:mod:`eventlane.domain.commands`): what schedules
        (:mod:`eventlane.app.schedules`) may hold."""

    @property
    def namespace(self) -> str | None:
        """The app's namespace (``None``: none)."""
        return self.names.prefix

    def projector(self, name: str) -> type[Projector]:
        """The projector named ``name``; a ``ConfigError`` naming the known ones otherwise."""
        try:
            return self.projectors[name]
        except KeyError:
            raise ConfigError(
                f"app {self.name!r} has no projector {name!r}; it has "
                f"{', '.join(sorted(self.projectors)) or 'none'}"
            ) from None

    def _registered(self) -> EventRegistry:
        registry = self.registry
        registry.register_aggregate(*self.aggregates)
        registry.register(*self.events)
        for projector in self.projectors.values():
            registry.register(*projector.handled_types())
        registry.validate()
        return registry

    def codec(self, keys: KeyStore | None = None) -> EventCodec:
        """The event codec of this application, without opening anything: its registry
        (``registry``, with the types of its aggregates, events and projectors' handlers
        registered, and validated) and its converter hooks (``configure``). What a runtime
        decodes with; golden-file tests of events need nothing more (events with personal
        fields also need ``keys``, e.g. a :class:`~eventlane.codec.keystore.MemoryKeyStore`)."""
        return EventCodec(self._registered(), configure=self.configure, keys=keys)

    def has_personal_data(self) -> bool:
        """Whether any event class of the app declares personal fields (``personal()``)."""
        return any(personal_fields(cls) for cls in self._registered().classes())

    def key_store(self, log: KeyedLog) -> KeyStore | None:
        """Where this app's personal-data keys live on ``log``: the ``keys`` factory given
        to the app, else (when an event declares personal fields) the compacted topic
        ``keys_topic`` (default ``<name>.keys``, in the app's namespace); ``None`` when
        nothing is personal."""
        if self.keys is not None:
            return self.keys(log)
        if not self.has_personal_data():
            return None
        return LogKeyStore(log, self.names.topic(self.keys_topic))

    def open(
        self,
        log: KeyedLog | str | Path | None = None,
        *,
        create_topics: bool = True,
        cache_events: int | None = None,
    ) -> Runtime:
        """Connect to a log (a :class:`~eventlane.log.KeyedLog`: refused with a
        :class:`~eventlane.errors.MissingRoleError` naming the engine and the role where the
        engine has no per-key reads and conditional appends; or a data directory for the
        embedded one; default ``$EVENTLANE_DATA`` or ``./eventlane-data``).

        ``create_topics=False`` opens without creating the aggregates' topics (tools that
        only look). ``cache_events``: this runtime's stream-cache bound instead of the
        app's (a worker process keeps few, :data:`~eventlane.store.stream_cache.WORKER_EVENTS`)."""
        return Runtime(self, log, create_topics=create_topics, cache_events=cache_events)

    def open_async(
        self,
        log: KeyedLog | str | Path | None = None,
        *,
        create_topics: bool = True,
        threads: int = DEFAULT_THREADS,
    ) -> AsyncRuntime:
        """The asyncio face (:mod:`eventlane.app.aio`): ``async with app.open_async(data)
        as runtime: await runtime.execute(...)``. Opens on ``__aenter__``, off the loop;
        ``threads`` bounds the blocking calls in flight."""
        return AsyncRuntime(
            lambda: Runtime(self, log, create_topics=create_topics), threads=threads
        )


class Runtime:
    """An :class:`App` connected to a log: save, load and execute on aggregates, issue
    policy commands, wait for and inspect read models. A context manager (or ``close()``).

    ``log`` is a :class:`~eventlane.log.Log` (left open on close), or a data directory for
    the embedded log (opened and closed by the runtime). Opening configures no logging: eventlane's
    loggers are standard-library loggers under ``eventlane.`` that the application's own
    configuration governs (see :mod:`eventlane.observability`).

    Thread-safe: one runtime serves every thread of a process (a web framework's thread
    pool): its event store, stream cache (which locks itself) and the embedded log may be
    called concurrently, and concurrent saves share fsyncs. The objects it returns are not:
    an :class:`~eventlane.domain.Aggregate` belongs to the thread that loaded it, and a
    consumer to one thread. For asyncio, :meth:`App.open_async` (the same core).

    Every name it puts on the log or the local directory goes through the app's namespace
    (:attr:`names`): records and errors carry the full topic (``acme.orders``), methods
    take declared names (``status("invoices")``, ``partitions_for("orders")``).
    """

    def __init__(
        self,
        app: App,
        log: KeyedLog | str | Path | None = None,
        *,
        create_topics: bool = True,
        cache_events: int | None = None,
    ) -> None:
        self.app = app
        self.log: KeyedLog
        if log is None or isinstance(log, str | Path):
            opened = open_log(log)
            try:
                self.log, self._owns_log = keyed_log(opened, "App.open"), True
            except BaseException:
                opened.close()
                raise
        else:
            self.log, self._owns_log = keyed_log(log, "App.open"), False
        for cls in app.aggregates:
            if not isinstance(getattr(cls, "topic", None), str):
                raise ConfigError(f"aggregate {cls.__qualname__} does not name its topic")
        self.names = app.names
        self.registry = app.registry
        self.keys = app.key_store(self.log)
        self.codec = app.codec(keys=self.keys)
        self.store = EventStore(
            self.log,
            self.codec,
            cache_events=app.cache_events if cache_events is None else cache_events,
        )
        self.repository = Repository(
            self.store,
            SnapshotCodec(configure=app.configure, keys=self.keys),
            topic_of=self.names.aggregate_topic,
        )
        self.partitions = app.partitions
        if create_topics:
            for cls in app.aggregates:
                topic = self.names.aggregate_topic(cls)
                wanted = self.partitions_for(cls.topic)
                self.log.create_topic(topic, wanted, EVENT_TOPIC_CONFIG, exist_ok=True)
                self._check_partitions(cls.topic, wanted)

    def _check_partitions(self, declared: str, wanted: int) -> None:
        """An existing event topic must have the declared partition count: an aggregate's
        partition is ``murmur2(id) % count``, so another count would look in the wrong
        partition for every stored history."""
        topic = self.names.topic(declared)
        have = self.log.partition_count(topic)
        if have != wanted:
            raise ConfigError(
                f"topic {topic!r} exists with {have} partition(s), but the app declares"
                f" {wanted}: declare partitions={{{declared!r}: {have}}} (an event topic's"
                " count cannot change without moving every aggregate's history), or use"
                " another data directory or namespace",
                topic=topic,
            )

    def declared(self, cls: type[A]) -> type[A]:
        """``cls`` if the app declares it (or another class of its topic, such as a new
        release of a declared aggregate), else a :class:`ConfigError` saying what to add:
        an undeclared aggregate has no topic and its events no codec entry."""
        aggregates = self.app.aggregates
        if cls not in aggregates and all(a.topic != cls.topic for a in aggregates):
            names = ", ".join(a.__qualname__ for a in aggregates) or "none"
            raise ConfigError(
                f"aggregate {cls.__qualname__} is not declared by this application (it has"
                f" {names}): add {cls.__qualname__} to App(aggregates=[...])"
            )
        return cls

    def partitions_for(self, topic: str) -> int:
        """The partition count of the declared topic ``topic`` when this runtime creates it."""
        if isinstance(self.partitions, int):
            return self.partitions
        return self.partitions.get(topic, DEFAULT_PARTITIONS)

    # ------------------------------------------------------------------ commands
    def save(self, aggregate: Aggregate, **envelope: Any) -> Written:
        """See :meth:`Repository.save`. Returns the records written (a list), whose
        ``position`` (and its ``token``) :meth:`wait_for` and :meth:`wait_causal` take."""
        cls = self.declared(type(aggregate))
        with command_span("save", cls.__name__, self.names.aggregate_topic(cls)):
            return self.repository.save(aggregate, **envelope)

    def load(
        self,
        cls: type[A],
        aggregate_id: str,
        version: int | None = None,
        *,
        as_of: datetime | int | None = None,
    ) -> A:
        """The aggregate at ``version`` (default: latest; see :meth:`Repository.load`), or as
        it was at the moment ``as_of`` (a timezone-aware datetime or epoch ms): its events
        before the partition's first record stamped after that moment (time travel,
        ``docs/time-travel.md``). :class:`~eventlane.errors.AggregateNotFoundError` when it
        had no event yet."""
        return drive(self.load_plan(cls, aggregate_id, version, as_of=as_of))

    def load_plan(
        self,
        cls: type[A],
        aggregate_id: str,
        version: int | None = None,
        *,
        as_of: datetime | int | None = None,
    ) -> Generator[Step, Any, A]:
        """:meth:`load` as a plan of I/O requests (:mod:`eventlane.store.steps`), for the
        sync driver or the async runtime's."""
        if as_of is None:
            return (yield from self.repository.load_plan(self.declared(cls), aggregate_id, version))
        if version is not None:
            raise ConfigError("load takes version= or as_of=, not both")
        when = as_of_ms(as_of)
        topic = self.names.aggregate_topic(cls)
        partition = yield from self.store.streams.partition_plan(topic, aggregate_id)
        cut = yield LogCall(self.log, "offset_for_time", (topic, partition, when + 1))
        records = yield LogCall(self.log, "read_key", (topic, partition, aggregate_id.encode()))
        count = sum(1 for r in records if cut is None or r.offset < cut)
        if count == 0:
            raise AggregateNotFoundError(
                f"{cls.__qualname__} {aggregate_id!r} had no events as of {as_of!r}",
                topic=topic,
                partition=partition,
            )
        return (yield from self.repository.load_plan(self.declared(cls), aggregate_id, count))

    def execute(
        self, cls: type[A], aggregate_id: str, command: Callable[[A], Any], **options: Any
    ) -> A:
        """See :meth:`Repository.execute` (load, run, save, retry on conflict). The
        aggregate's ``stored_position`` is where its stored state ends (the write's position,
        or where it already was when the command recorded nothing)."""
        declared = self.declared(cls)
        with command_span("execute", cls.__name__, self.names.aggregate_topic(cls)):
            return self.repository.execute(declared, aggregate_id, command, **options)

    def issue(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        caused_by: Envelope[Any] | str,
        create: bool = True,
        attempts: int = 20,
    ) -> Written:
        """A policy's command, at most once per ``caused_by`` event: see
        :meth:`Repository.issue <eventlane.store.Repository.issue>` (``ctx.issue`` in a
        handler calls it with the handled event)."""
        declared = self.declared(cls)
        with command_span("issue", cls.__name__, self.names.aggregate_topic(cls)):
            return self.repository.issue(
                declared,
                aggregate_id,
                command,
                caused_by=caused_by,
                create=create,
                attempts=attempts,
            )

    # ------------------------------------------------------------------ schedules
    @functools.cached_property
    def schedules(self) -> Any:
        """The app's :class:`~eventlane.app.schedules.Schedules` (typed ``Any`` here: that
        module builds on this one)."""
        from eventlane.app.schedules import Schedules  # noqa: PLC0415 - it builds on Runtime

        return Schedules(self)

    def schedule(
        self,
        command: Command[Any],
        *,
        at: datetime | int,
        key: str,
        caused_by: str | None = None,
    ) -> str:
        """Run ``command`` (a command that is data, registered with ``App(commands=...)``) at
        ``at``, once in effect, by the app's scheduler; returns the schedule's id. ``key``
        names the schedule: scheduling the key again replaces it, :meth:`cancel_schedule`
        withdraws it."""
        sid: str = self.schedules.schedule(command, at=at, key=key, caused_by=caused_by)
        return sid

    def cancel_schedule(self, key: str) -> bool:
        """Withdraw the pending schedule ``key``; False if it holds none."""
        done: bool = self.schedules.cancel(key)
        return done

    def schedule_batch(self) -> Any:
        """A :class:`~eventlane.app.schedules.ScheduleBatch`: schedules and cancels written
        together by its ``flush`` (what a worker's handlers schedule through)."""
        from eventlane.app.schedules import ScheduleBatch  # noqa: PLC0415 - builds on Runtime

        return ScheduleBatch(self.schedules)

    # ------------------------------------------------------------------ queries
    def projector(self, name: str) -> type[Projector]:
        """See :meth:`App.projector`."""
        return self.app.projector(name)

    def readmodel_path(self, projector: str) -> Path:
        """Where projector ``projector``'s read-model file is."""
        self.app.projector(projector)
        return self.log.local.readmodel(self.names.local(projector))

    def readmodel_location(self, projector: str) -> Location:
        """Where projector ``projector``'s read model is: its file, or its PostgreSQL schema
        (:mod:`eventlane.projection.store`)."""
        return location_of(self, projector)

    def topics_of(self, projector: str) -> tuple[str, ...]:
        """The topics (full names) projector ``projector`` consumes."""
        return self.names.projector_topics(self.app.projector(projector))

    def wait_for(
        self,
        projector: str,
        written: Position | str | Iterable[RecordMetadata] | Mapping[TopicPartition, int],
        timeout: float = 10.0,
    ) -> bool:
        """Read-your-writes: wait until ``projector`` has applied ``written`` (what
        :meth:`save` or :meth:`issue` returned, an aggregate's ``stored_position`` after
        :meth:`execute`, a position token string, or ``{partition: next offset}``). False
        on timeout; :class:`~eventlane.errors.InvalidPositionError` for a bad token.

        Records of topics the projector does not consume are ignored (it has nothing to
        apply there), so one ``written`` list serves every projector."""
        topics = set(self.topics_of(projector))
        position = as_position(written)
        check_position(self.log, position)
        wanted = {tp: off for tp, off in offsets_after(position).items() if tp.topic in topics}
        return wait_for_offsets(self.log, self.readmodel_location(projector), wanted, timeout)

    def wait_causal(
        self,
        projector: str,
        written: Position | str | Iterable[RecordMetadata],
        timeout: float = 10.0,
    ) -> Position:
        """Wait until ``projector`` reflects ``written`` *and everything the app's policies
        (projectors with ``policy = True``) did because of it*, following causation ids
        from policy to policy (:mod:`eventlane.app.causal`). Returns the position reached
        (its ``token`` covers the policies' writes too);
        :class:`~eventlane.errors.WaitTimeoutError` names the policy or projection not
        reached within ``timeout`` seconds."""
        self.app.projector(projector)
        plan = causal_plan(self, projector, as_position(written), timeout)
        return drive_causal(plan, self.log)

    def status(self, projector: str) -> dict[str, Any]:
        """Positions, high-water marks, lag and members of ``projector`` (see
        :func:`eventlane.projection.status.projection_status`); ``projector`` is the declared
        name, ``group`` its consumer group (in the app's namespace)."""
        cls = self.app.projector(projector)
        group = self.names.group(projector)
        doc = projection_status(
            self.log,
            group,
            self.topics_of(projector),
            self.readmodel_path(projector),
            cls.migrations,
            view_of(self, projector),
        )
        return {**doc, "projector": projector}

    def group_coordinator(self, projector: str | None = None) -> Coordinator:
        """A handle on the consumer group of ``projector`` (``None``: the app's schedulers'
        group), for a :class:`~eventlane.projection.Runner` (its ``coordinator``): with it a
        worker that dies, even by ``kill -9``, has its member leave the group as soon as the
        runner reaps it, so its partitions move at once instead of after the session
        timeout. Close it when the runner is done."""
        if projector is None:
            from eventlane.app.schedules import scheduler_group  # noqa: PLC0415 - builds on Runtime

            group = scheduler_group(self)
        else:
            self.app.projector(projector)
            group = self.names.group(projector)
        return coordination_for(self.log).coordinator(group, wake=self.log.wake)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the event store (and the log, when the runtime opened it)."""
        self.store.close()
        if self._owns_log:
            self.log.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
