"""The command side of an application: log, event registry, codec, store and repository.

    >>> import tempfile
    >>> from attrs import frozen
    >>> from typing import ClassVar
    >>> from framework.domain import Aggregate, DomainEvent, applies, event
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
    ...     with Application(data, aggregates=[Account]) as app:
    ...         account = Account("acc-1")
    ...         account.open("ada")
    ...         _ = app.save(account)
    ...         (app.load(Account, "acc-1").owner, app.load(Account, "acc-1").version)
    ('ada', 1)

Event topics are created on start with the defaults an event store needs (brief section 2):
unbounded retention and no compaction, so a rebuild from the low-water mark sees the whole
history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from framework.codec import EventCodec, EventRegistry, SnapshotCodec
from framework.codec.converter import OrjsonConverter
from framework.domain import Aggregate, DomainEvent
from framework.errors import ConfigError
from framework.log import Log, LogStore, RecordMetadata
from framework.store.event_store import EventStore
from framework.store.repository import Repository

A = TypeVar("A", bound=Aggregate)

EVENT_TOPIC_CONFIG: Mapping[str, object] = {"retention_ms": -1, "cleanup_policy": "delete"}
DEFAULT_PARTITIONS = 6


class Application:
    """Wires an application's aggregates to a log. Use as a context manager or ``close()``.

    ``log`` is a :class:`~framework.log.Log`, or a data directory for the embedded
    :class:`~framework.log.LogStore` (default: ``$EVENTLANE_DATA`` or ``./eventlane-data``).
    ``partitions`` is the partition count of event topics created on start, one number
    or per topic.
    """

    def __init__(
        self,
        log: Log | str | Path | None = None,
        *,
        aggregates: Iterable[type[Aggregate]] = (),
        events: Iterable[type[DomainEvent]] = (),
        registry: EventRegistry | None = None,
        partitions: int | Mapping[str, int] = DEFAULT_PARTITIONS,
        configure: Callable[[OrjsonConverter], None] | None = None,
        create_topics: bool = True,
    ) -> None:
        self._owns_log = not hasattr(log, "append")
        self.log: Log = LogStore(log) if self._owns_log else log  # type: ignore[assignment,arg-type]
        self.registry = registry if registry is not None else EventRegistry()
        self.aggregates: tuple[type[Aggregate], ...] = tuple(aggregates)
        for cls in self.aggregates:
            if not isinstance(getattr(cls, "topic", None), str):
                raise ConfigError(f"aggregate {cls.__qualname__} does not name its topic")
        self.registry.register_aggregate(*self.aggregates)
        self.registry.register(*events)
        self.registry.validate()
        self.codec = EventCodec(self.registry, configure=configure)
        self.store = EventStore(self.log, self.codec)
        self.repository = Repository(self.store, SnapshotCodec(configure=configure))
        self.partitions = partitions
        if create_topics:
            for cls in self.aggregates:
                wanted = self.partitions_for(cls.topic)
                self.log.create_topic(cls.topic, wanted, EVENT_TOPIC_CONFIG, exist_ok=True)
                self._check_partitions(cls.topic, wanted)

    def _check_partitions(self, topic: str, wanted: int) -> None:
        """An existing event topic must have the declared partition count: an aggregate's
        partition is ``murmur2(id) % count``, so another count would look in the wrong
        partition for every stored history."""
        have = self.log.partition_count(topic)
        if have != wanted:
            raise ConfigError(
                f"topic {topic!r} exists with {have} partition(s), but the app declares"
                f" {wanted}: declare partitions={{{topic!r}: {have}}} (an event topic's count"
                " cannot change without moving every aggregate's history), or use another"
                " data directory",
                topic=topic,
            )

    def partitions_for(self, topic: str) -> int:
        if isinstance(self.partitions, int):
            return self.partitions
        return self.partitions.get(topic, DEFAULT_PARTITIONS)

    def declared(self, cls: type[A]) -> type[A]:
        """``cls`` if this application declares it (or another class of its topic, such as
        a new release of a declared aggregate), else a :class:`ConfigError` saying what to
        add: an undeclared aggregate has no topic and its events no codec entry."""
        if cls not in self.aggregates and all(a.topic != cls.topic for a in self.aggregates):
            names = ", ".join(a.__qualname__ for a in self.aggregates) or "none"
            raise ConfigError(
                f"aggregate {cls.__qualname__} is not declared by this application (it has"
                f" {names}): add {cls.__qualname__} to App(aggregates=[...])"
            )
        return cls

    def save(self, aggregate: Aggregate, **envelope: Any) -> list[RecordMetadata]:
        """See :meth:`Repository.save`."""
        self.declared(type(aggregate))
        return self.repository.save(aggregate, **envelope)

    def load(self, cls: type[A], aggregate_id: str, version: int | None = None) -> A:
        """See :meth:`Repository.load`."""
        return self.repository.load(self.declared(cls), aggregate_id, version)

    def execute(
        self, cls: type[A], aggregate_id: str, command: Callable[[A], Any], **options: Any
    ) -> A:
        """See :meth:`Repository.execute` (load, run, save, retry on conflict)."""
        return self.repository.execute(self.declared(cls), aggregate_id, command, **options)

    def close(self) -> None:
        self.store.close()
        if self._owns_log:
            self.log.close()

    def __enter__(self) -> Application:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
