"""The log port: what every layer above may use of a log, and nothing more.

:class:`Log` is a typed Protocol. The embedded :class:`~framework.log.store.LogStore` is its
first implementation; another engine (JetStream, a Kafka front) stands behind the same
surface. The shipped contract kit (:class:`framework.testing.contracts.LogContract`) is
written against this Protocol; an adapter proves itself by subclassing it. What an engine
does not support it declares in :attr:`Log.capabilities`.

This module imports only :mod:`.types`, :mod:`.record`, :mod:`.config` and :mod:`.local`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from framework.log.config import TopicConfig
    from framework.log.local import LocalDir
    from framework.log.record import Record
    from framework.log.types import (
        AppendResult,
        Capabilities,
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


@runtime_checkable
class Log(Protocol):
    """A partitioned, append-only log of byte records (brief section 2).

    Invariants every implementation keeps: offsets within a partition strictly increase;
    ``lwm <= hwm <= leo``; ``read`` never returns a record at or above the high-water mark
    nor below the low-water mark (it raises ``OffsetOutOfRangeError`` there); an append is
    acknowledged only once durable per the topic's flush policy; an append with ``expect``
    is checked and written atomically (``ConcurrencyError``, nothing written, when the key's
    last record is not at ``expect.last_offset``).
    """

    @property
    def capabilities(self) -> Capabilities: ...

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
        expect: Expect | None = None,
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

    # per-key state (capabilities.key_reads)
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

    def check_keys(
        self, topics: Collection[str] | None = None, *, repair: bool = False
    ) -> list[KeyIndexReport]:
        """Compare derived per-key state with the log (``[]`` where there is none)."""
        ...

    def rebuild_keys(self, topic: str, partition: int) -> int:
        """Rebuild derived per-key state of a partition from the log (0 where none)."""
        ...

    # waiting for appends (any process)
    def wait_seq(self) -> int: ...
    def wait(self, seen: int, timeout: float) -> None: ...
    def wake(self) -> None:
        """Wake every :meth:`wait` er (of every process), as an append does."""
        ...

    # maintenance
    def roll(self, topic: str, partition: int) -> None:
        """Close the partition's active segment (a no-op where that means nothing)."""
        ...

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Advance the low-water mark to ``before_offset`` (Kafka's DeleteRecords); the new
        low-water mark. ``OffsetOutOfRangeError`` above the high-water mark."""
        ...

    def compact(
        self, topic: str, *, progress: Progress | None = None
    ) -> list[CompactionReport]: ...
    def request_compaction(self, topic: str, partition: int) -> None:
        """Ask for a compaction soon, in the background (coalesced; never blocks)."""
        ...

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

    def close(self) -> None: ...
