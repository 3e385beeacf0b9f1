"""The log port: what every layer above may use of a log, and nothing more.

:class:`Log` is a typed Protocol. The embedded :class:`~framework.log.store.LogStore` is its
first implementation; a replicated log could stand behind the same surface later. Contract
tests (``tests/log/test_log_contract.py``) are written against this Protocol and run against
each implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pathlib import Path

    from framework.log.cleaner import CompactionReport
    from framework.log.config import TopicConfig
    from framework.log.partition import (
        AppendHook,
        AppendResult,
        Cursor,
        Precondition,
        RecordTuple,
    )
    from framework.log.record import Record
    from framework.log.retention import RetentionReport
    from framework.log.store import PartitionOffsets, TopicDescription


@runtime_checkable
class Log(Protocol):
    """A partitioned, append-only log of byte records (brief section 2).

    Invariants every implementation keeps: offsets within a partition strictly increase;
    ``lwm <= hwm <= leo``; ``read`` never returns a record at or above the high-water mark
    nor below the low-water mark (it raises ``OffsetOutOfRangeError`` there); an append is
    acknowledged only once durable per the topic's flush policy.
    """

    path: Path

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
        precondition: Precondition | None = None,
        on_appended: AppendHook | None = None,
        atomic: bool = False,
        combine: bool = False,
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

    # waiting for appends (any process)
    def wait_seq(self) -> int: ...
    def wait(self, seen: int, timeout: float) -> None: ...

    # maintenance
    def compact(self, topic: str) -> list[CompactionReport]: ...
    def cleanup(self, topic: str) -> list[RetentionReport]: ...
    def verify(self, topic: str | None = None) -> list[Exception]: ...
    def close(self) -> None: ...
