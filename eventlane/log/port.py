"""The log port: what every layer above may use of a log, split into typed roles.

An engine implements the roles it can, and its type says which (as ``eventsourcing`` splits
its recorders by role): a layer asks for the role it uses, checked by mypy where it is
typed and at run time by :func:`keyed_log` and its siblings (a
:class:`~eventlane.errors.MissingRoleError` naming the engine and the role it lacks).

* :class:`Log`, the core every engine has: Kafka-shaped topics, appends (atomic batches
  included), reads, the three marks, time lookups, deleting records below an offset,
  waiting for appends, and a compaction hint. A plain Kafka cluster can serve it.
* :class:`KeyedLog`: per-key reads (``read_key``, ``key_head``) and conditional appends
  (``append(expect=)``), checked atomically with the write. The event store needs it.
* :class:`MaintainedLog`: maintenance run when eventlane asks (roll, compact, cleanup,
  verify) and the check/rebuild of derived per-key state. ``eventlane compact``/``cleanup``/
  ``verify`` and ``forget`` need it.
* :class:`FencedLog`: ``append_fenced``, an append refused by a callback run against the
  partition's end under the engine's append serialisation. The file-based consumer-group
  coordination fences its offset commits with it.

A read returns a :data:`~eventlane.log.types.Cursor`: opaque to callers (the engine's own
type behind it), handed back to the next ``read`` of the same partition.

The shipped contract kit (:mod:`eventlane.testing.contracts`) is split the same way: an
engine's test suite runs exactly the kits of the roles it claims.

This module imports only :mod:`.types`, :mod:`.record`, :mod:`.config`, :mod:`.local` and
:mod:`eventlane.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from eventlane.errors import MissingRoleError

if TYPE_CHECKING:
    from eventlane.log.config import TopicConfig
    from eventlane.log.local import LocalDir
    from eventlane.log.record import Record
    from eventlane.log.types import (
        AppendResult,
        CompactionReport,
        Cursor,
        Expect,
        KeyIndexReport,
        PartitionOffsets,
        Progress,
        RecordTuple,
        RetentionReport,
        TopicDescription,
    )

__all__ = [
    "ROLES",
    "FencedLog",
    "KeyedLog",
    "Log",
    "MaintainedLog",
    "core_log",
    "fenced_log",
    "keyed_log",
    "maintained_log",
    "role_members",
]


@runtime_checkable
class Log(Protocol):
    """The core role: a partitioned, append-only log of byte records (brief section 2).

    Invariants every implementation keeps: offsets within a partition strictly increase;
    ``lwm <= hwm <= leo``; ``read`` never returns a record at or above the high-water mark
    nor below the low-water mark (it raises ``OffsetOutOfRangeError`` there); an append is
    acknowledged only once durable per the topic's flush policy; an ``atomic`` append's
    records become visible together or not at all; everything acknowledged survives a close
    and a reopen, at the same offsets.
    """

    @property
    def local(self) -> LocalDir:
        """The local directory for state that lives on this host (read models, pause
        files, shadows; the embedded engine's group state and key indexes)."""
        ...

    # topics
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: TopicConfig | Mapping[str, object] | None = None,
        *,
        exist_ok: bool = False,
    ) -> TopicDescription: ...
    def list_topics(self) -> list[str]: ...
    def topic_exists(self, name: str) -> bool: ...
    def describe_topic(self, name: str) -> TopicDescription: ...
    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
    ) -> TopicDescription: ...
    def delete_topic(self, name: str) -> None: ...
    def partition_count(self, name: str) -> int: ...
    def topic_config(self, name: str) -> TopicConfig: ...

    # records
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        atomic: bool = False,
    ) -> AppendResult: ...
    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = ...,
        cursor: Cursor | None = None,
        upto: int | None = None,
    ) -> tuple[list[Record], Cursor | None]: ...
    def offsets(self, topic: str, partition: int) -> PartitionOffsets: ...
    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None: ...
    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Advance the low-water mark to ``before_offset`` (Kafka's DeleteRecords); the new
        low-water mark. ``OffsetOutOfRangeError`` above the high-water mark."""
        ...

    def request_compaction(self, topic: str, partition: int) -> None:
        """Ask for a compaction soon, in the background (coalesced; never blocks). A hint:
        an engine that compacts on its own schedule may ignore it."""
        ...

    # waiting for appends (any process)
    def wait_seq(self) -> int: ...
    def wait(self, seen: int, timeout: float) -> None: ...
    def wake(self) -> None:
        """Wake every :meth:`wait` er (of every process), as an append does."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class KeyedLog(Log, Protocol):
    """Per-key reads and conditional appends.

    Invariant: an append with ``expect`` is checked and written atomically, across threads
    and processes (``ConcurrencyError``, nothing written, when the key's last record is not
    at ``expect.last_offset``); ``key_head`` and ``read_key`` agree with ``read``.
    """

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
    ) -> AppendResult: ...
    def read_key(
        self, topic: str, partition: int, key: bytes, *, after: int | None = None
    ) -> list[Record]:
        """The records with ``key`` and an offset above ``after``, ascending, below the
        high-water mark. On a compacted topic, at least the key's last record."""
        ...

    def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of ``key``'s last record in ``[lwm, hwm)`` (``None``: none).

        Records below the low-water mark (removed by ``delete_records`` or retention) do not
        count: a key whose records all lie there has no head (``None``), in every process
        and after a reopen, and ``append(expect=Expect(key, None))`` is what succeeds for
        it; ``expect`` checks against the same answer."""
        ...


@runtime_checkable
class MaintainedLog(Log, Protocol):
    """Maintenance that runs when eventlane asks, and derived per-key state it can check.

    Invariant: ``compact`` keeps each key's last record at its offset and never renumbers;
    ``cleanup`` only advances the low-water mark; neither moves the high-water mark.
    """

    def roll(self, topic: str, partition: int) -> None:
        """Close the partition's active segment (a no-op where that means nothing)."""
        ...

    def compact(
        self, topic: str, *, progress: Progress | None = None
    ) -> list[CompactionReport]: ...
    def cleanup(self, topic: str, *, progress: Progress | None = None) -> list[RetentionReport]: ...
    def verify(
        self,
        topic: str | None = None,
        *,
        progress: Progress | None = None,
        skip_lost_offsets: bool = False,
    ) -> list[Exception]:
        """Check every record of ``topic`` (or all); return the problems. With
        ``skip_lost_offsets`` an engine that refuses to open a partition whose acknowledged
        offsets are missing repairs it by skipping them for good (never reusing them)."""
        ...

    def check_keys(
        self, topics: Collection[str] | None = None, *, repair: bool = False
    ) -> list[KeyIndexReport]:
        """Compare derived per-key state with the log (``[]`` where there is none)."""
        ...

    def rebuild_keys(self, topic: str, partition: int) -> int:
        """Rebuild derived per-key state of a partition from the log (0 where none)."""
        ...


@runtime_checkable
class FencedLog(Log, Protocol):
    """Appends fenced by a callback: ``precondition`` is called with the partition's end
    offset where no other append of the partition can come between it and the write, and
    refuses the append by raising (nothing written)."""

    def append_fenced(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        precondition: Callable[[int], None],
        atomic: bool = False,
    ) -> AppendResult: ...


ROLES: dict[str, str] = {
    "Log": "the core log (topics, append, read, offsets, waiting)",
    "KeyedLog": "per-key reads and conditional appends (read_key, key_head, append(expect=))",
    "MaintainedLog": "maintenance (roll, compact, cleanup, verify, check_keys, rebuild_keys)",
    "FencedLog": "fenced appends (append_fenced)",
}
"""Each role by name and, in words, what it adds: error messages and the contract kit use it."""


def keyed_log(log: object, user: str) -> KeyedLog:
    """``log`` as a :class:`KeyedLog`, else :class:`~eventlane.errors.MissingRoleError`
    naming the engine, the role and ``user`` (what needs it)."""
    return cast(KeyedLog, _require(log, KeyedLog, user))


def maintained_log(log: object, user: str) -> MaintainedLog:
    """``log`` as a :class:`MaintainedLog` (see :func:`keyed_log`)."""
    return cast(MaintainedLog, _require(log, MaintainedLog, user))


def fenced_log(log: object, user: str) -> FencedLog:
    """``log`` as a :class:`FencedLog` (see :func:`keyed_log`)."""
    return cast(FencedLog, _require(log, FencedLog, user))


def core_log(log: object, user: str) -> Log:
    """``log`` as a :class:`Log` (see :func:`keyed_log`)."""
    return cast(Log, _require(log, Log, user))


def _require(log: object, role: type, user: str) -> object:
    if isinstance(log, role):
        return log
    missing = [name for name in role_members(role) if not hasattr(log, name)]
    raise MissingRoleError(
        f"{type(log).__name__} does not implement the {role.__name__} role"
        f" ({ROLES[role.__name__]}) that {user} needs"
        + (f": it has no {', '.join(missing)}" if missing else ""),
        engine=type(log).__name__,
        role=role.__name__,
    )


def role_members(role: type) -> list[str]:
    """The names a role's protocol requires (its own and its bases')."""
    attrs = getattr(role, "__protocol_attrs__", None)
    if attrs is None:  # Python < 3.12
        attrs = {
            n
            for c in role.__mro__
            if c is not object and c.__name__ not in ("Protocol", "Generic")
            for n in (*vars(c), *getattr(c, "__annotations__", {}))
            if not n.startswith("_")
        }
    return sorted(cast("set[str]", attrs))
