"""Group coordination as a port: membership, generations, heartbeats and committed offsets.

Kafka's broker is a log *and* a group coordinator. Here the coordinator is a separate port,
so each engine brings its own:

* :class:`GroupCoordination`: a :class:`Coordinator` per group (membership, generations,
  heartbeats, assignment) and the :class:`OffsetStorage` (fenced commits, list, reset,
  delete);
* :class:`FileCoordination`: the embedded engine's, on files under the log's local
  directory (``LocalDir.groups()``, :mod:`.coordinator`) and the ``__consumer_offsets``
  topic (:mod:`.offsets`, whose fenced commits need the embedded log).

A JetStream engine provides one on its KV store (issue 13: :mod:`.jetstream`). A Kafka
engine's groups run on Kafka's own coordinator: its members are
:class:`~.kafka.KafkaGroupConsumer` (:func:`native_consumer`, which ``GroupConsumer(log)``
returns for such a log) and its coordination only reads groups and administers offsets
(:mod:`.kafka_admin`).
:func:`coordination_for` picks the coordination that goes with a log (every default in the
consumer, projection and CLI layers goes through it), so a member of any host agrees with
every other on the engine's one group state; :func:`register_coordination` adds another
engine's.
"""

from __future__ import annotations

import importlib
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

from eventlane.consumer.coordinator import GroupCoordinator, groups_root
from eventlane.consumer.membership import GroupState, Member
from eventlane.consumer.offsets import CommittedOffset, OffsetAndMetadata, OffsetStore
from eventlane.log.port import Log
from eventlane.log.record import TopicPartition

__all__ = [
    "Coordinator",
    "FileCoordination",
    "GroupCoordination",
    "OffsetStorage",
    "coordination_for",
    "native_consumer",
    "register_coordination",
]

T = TypeVar("T")


class Coordinator(Protocol):
    """One process's handle on one group's shared state. Thread-safe.

    Every state change happens under the group's lock (one writer at a time, across
    processes); readers see the last complete state.
    """

    group: str

    def current(self) -> GroupState: ...
    def version(self) -> int: ...
    def locked(self) -> AbstractContextManager[GroupState]: ...
    def mutate(self, change: Callable[[GroupState], T]) -> T: ...
    def try_mutate(self, change: Callable[[GroupState], T]) -> tuple[bool, T | None]: ...
    def expired(self, state: GroupState, now_ns: int | None = None) -> list[str]: ...
    def alive(self, state: GroupState) -> list[str]: ...
    def evict_expired(self, *, blocking: bool = True) -> list[str]: ...
    def beat(self, member: Member) -> bool: ...
    def polled(self, member: Member) -> None: ...
    def join(
        self,
        *,
        topics: tuple[str, ...],
        assignor: str,
        session_timeout_ms: int,
        instance_id: str | None = None,
        client_id: str = "eventlane",
    ) -> Member: ...
    def leave(
        self,
        member_id: str,
        reason: str = "close",
        *,
        blocking: bool = True,
        joined_generation: int | None = None,
    ) -> bool: ...
    def release(self, member_id: str, partitions: set[TopicPartition]) -> bool: ...
    def refresh_partitions(self, *, blocking: bool = True) -> bool: ...
    def close(self) -> None: ...


class OffsetStorage(Protocol):
    """Committed offsets of every group. A commit is accepted iff its ``precondition``
    holds at the instant it is ordered (fencing); :meth:`barrier` waits for every commit
    already validated, so a new owner reads the last accepted one."""

    def exists(self) -> bool: ...
    def committed(self, group: str, tp: TopicPartition) -> CommittedOffset | None: ...
    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]: ...
    def groups(self) -> set[str]: ...
    def history(self, group: str) -> Iterator[tuple[int, TopicPartition, int | None]]: ...
    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        generation: int,
        member_id: str,
        precondition: Callable[[], None] | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> int: ...
    def delete_group(
        self, group: str, *, precondition: Callable[[], None] | None = None
    ) -> int: ...
    def barrier(self, group: str) -> None: ...


class GroupCoordination(Protocol):
    """An engine's group coordinator and offset store.

    ``spans_hosts``: members may run on several hosts (the state is on a cluster), so what
    a member keeps in its local directory is not seen by the others."""

    spans_hosts: bool

    @property
    def offsets(self) -> OffsetStorage: ...
    def coordinator(self, group: str, *, wake: Callable[[], None] | None = None) -> Coordinator:
        """A handle on ``group`` (created on first use); close it when done."""
        ...

    def group_names(self) -> set[str]:
        """Groups with membership state (those with only committed offsets excluded)."""
        ...

    def has_state(self, group: str) -> bool: ...
    def delete_state(self, group: str) -> None:
        """Forget ``group``'s membership state (its offsets are deleted separately)."""
        ...

    def claim_home(self, group: str, home: str) -> None:
        """Pin ``group``'s workers to ``home`` (a host and a local path: where a read model
        file lives). The first claim wins; a claim naming another home raises
        :class:`~eventlane.errors.ConfigError` naming both. Forgotten with the state."""
        ...


class FileCoordination:
    """The embedded engine's coordination: group files under ``log.local.groups()`` and
    offsets in ``__consumer_offsets`` on the (embedded) log itself. Every member shares
    the data directory, so they are on one host (``claim_home`` has nothing to check)."""

    spans_hosts = False

    def __init__(self, log_: Log, offsets: OffsetStore | None = None) -> None:
        self.log = log_
        self._offsets = offsets if offsets is not None else OffsetStore(log_)

    @property
    def offsets(self) -> OffsetStore:
        return self._offsets

    def coordinator(
        self, group: str, *, wake: Callable[[], None] | None = None
    ) -> GroupCoordinator:
        return GroupCoordinator(self.log, group, wake=wake)

    def group_names(self) -> set[str]:
        root = groups_root(self.log)
        if not root.is_dir():
            return set()
        return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}

    def has_state(self, group: str) -> bool:
        return (groups_root(self.log) / group).is_dir()

    def delete_state(self, group: str) -> None:
        shutil.rmtree(groups_root(self.log) / group, ignore_errors=True)

    def claim_home(self, group: str, home: str) -> None:
        """Members of a data directory are on its host: always granted."""


CoordinationFactory = Callable[[Log], GroupCoordination]

# Log class (module, name) -> "module:factory", imported when such a log is first seen (so
# this module imports no optional dependency).
_KNOWN: dict[tuple[str, str], str] = {
    ("eventlane.log.jetstream.log", "JetStreamLog"): (
        "eventlane.consumer.jetstream:JetStreamCoordination"
    ),
    ("eventlane.log.kafka.log", "KafkaLog"): "eventlane.consumer.kafka_admin:KafkaCoordination",
}
# Log class -> "module:class" of the group consumer its engine brings (a broker that runs
# groups itself: Kafka's coordinator); other logs use GroupConsumer with their coordination.
_NATIVE_CONSUMERS: dict[tuple[str, str], str] = {
    ("eventlane.log.kafka.log", "KafkaLog"): "eventlane.consumer.kafka:KafkaGroupConsumer",
}
_factories: dict[type, CoordinationFactory] = {}
_CACHE_ATTR = "_eventlane_group_coordination"
_cache_lock = threading.Lock()


def register_coordination(log_type: type, factory: CoordinationFactory) -> None:
    """Make :func:`coordination_for` use ``factory(log)`` for logs of ``log_type``."""
    _factories[log_type] = factory


def _factory(log_: Log) -> CoordinationFactory | None:
    for cls in type(log_).__mro__:
        if cls in _factories:
            return _factories[cls]
        target = _KNOWN.get((cls.__module__, cls.__qualname__))
        if target is not None:
            module, _, name = target.partition(":")
            factory: CoordinationFactory = getattr(importlib.import_module(module), name)
            _factories[cls] = factory
            return factory
    return None


def native_consumer(log_: Log) -> type | None:
    """The group consumer class of ``log_``'s engine when its broker runs the groups itself
    (Kafka's coordinator), else ``None``."""
    for cls in type(log_).__mro__:
        target = _NATIVE_CONSUMERS.get((cls.__module__, cls.__qualname__))
        if target is not None:
            module, _, name = target.partition(":")
            found: type = getattr(importlib.import_module(module), name)
            return found
    return None


def coordination_for(log_: Log) -> GroupCoordination:
    """The group coordination of ``log_``'s engine, one per open log: the registered one
    for its class (the JetStream log's KV coordination), else the file-based one."""
    factory = _factory(log_)
    if factory is None:
        return FileCoordination(log_)
    with _cache_lock:  # kept on the log itself: it lives (and is collected) with it
        found: GroupCoordination | None = getattr(log_, _CACHE_ATTR, None)
        if found is None:
            found = factory(log_)
            setattr(log_, _CACHE_ATTR, found)
        return found
