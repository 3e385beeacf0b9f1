"""Committed offsets of consumer groups, stored in the internal topic ``__consumer_offsets``.

A committed offset is the offset of the *next* record a group will read in a partition: the
last processed offset + 1. Every commit is a record in ``__consumer_offsets``, a compacted
topic created on demand, so the latest commit of every (group, topic, partition) survives
compaction and older ones are cleaned away. Record format (JSON, so humans and Spark can
read it)::

    key    {"group": G, "topic": T, "partition": P}                 (this exact key order)
    value  {"offset": O, "metadata": M, "generation": N, "member_id": ID, "commit_ms": MS}
           or null: a tombstone, written when the group's offsets are deleted

All commits of one group go to the partition ``abs(java_hash(group)) % partitions``, exactly as
Kafka places them, so a group's commits are totally ordered by that partition's offsets.

Reading back is a replay of that partition, cached in each process and refreshed
incrementally from where the cache stopped (usually a single ``offsets()`` call when nothing
new was committed).

Compaction: after every ``compact_every`` commits it appended to a partition, a store asks
the log to compact that partition (``Log.request_compaction``: the log schedules it in the
background), so the topic stays about one segment plus one record per key, and a new
process's replay stays short.

Fencing: :meth:`OffsetStore.commit` appends with a *precondition* that the caller supplies
(the group's membership/ownership check); it runs under the partition's append lock, so a
commit is accepted iff it is valid at the instant it is ordered in the log. That needs an
engine with the port's :class:`~eventlane.log.port.FencedLog` role (``append_fenced``); this
store is the file-based coordination's offset store, not part of the log port. A new owner of a
partition calls :meth:`OffsetStore.barrier` before reading committed offsets: it waits for
every append that was validated before it, so it always sees the last accepted commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import orjson

from eventlane.errors import ConfigError, PreconditionFailedError, UnknownTopicError
from eventlane.log.port import FencedLog, Log, fenced_log
from eventlane.log.record import TopicPartition
from eventlane.log.types import Cursor
from eventlane.observability import get_logger

__all__ = [
    "OFFSETS_TOPIC",
    "CommittedOffset",
    "OffsetAndMetadata",
    "OffsetStore",
    "java_string_hash",
    "partition_for_group",
]

log = get_logger("eventlane.consumer.offsets")

OFFSETS_TOPIC = "__consumer_offsets"
DEFAULT_OFFSETS_PARTITIONS = 8
DEFAULT_COMPACT_EVERY = 50_000
OFFSETS_TOPIC_CONFIG: dict[str, object] = {
    "cleanup_policy": "compact",
    "segment_bytes": 16 << 20,
    "flush_policy": "always",
    "min_compaction_lag_ms": 0,
}
ADMIN_MEMBER = "admin"
"""``member_id`` of commits written by ``groups reset-offsets`` (generation -1, as Kafka)."""


class OffsetAndMetadata(NamedTuple):
    """What to commit for a partition: the next offset to read, and free-form metadata."""

    offset: int
    metadata: str = ""


class CommittedOffset(NamedTuple):
    """A commit read back from ``__consumer_offsets``."""

    offset: int
    metadata: str
    generation: int
    member_id: str
    commit_ms: int
    log_offset: int
    """Where the commit record sits in its ``__consumer_offsets`` partition."""


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (a signed 32-bit int over UTF-16 code units).

    >>> java_string_hash("hello")
    99162322
    >>> java_string_hash("my-group")
    -1906497762
    """
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_group(group: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition of ``group``, as Kafka computes it:
    ``Utils.abs(groupId.hashCode()) % partitions`` (``abs(MIN_VALUE)`` is 0).

    >>> partition_for_group("my-group", 50)
    12
    """
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def encode_key(group: str, tp: TopicPartition) -> bytes:
    """The record key of a commit.

    >>> encode_key("g", TopicPartition("orders", 3))
    b'{"group":"g","topic":"orders","partition":3}'
    """
    return orjson.dumps({"group": group, "topic": tp.topic, "partition": tp.partition})


class _Barrier(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the barrier's precondition so that nothing is appended."""


class _PartitionCache:
    """Replayed commits of one ``__consumer_offsets`` partition, up to ``position``."""

    __slots__ = ("cursor", "entries", "position")

    def __init__(self) -> None:
        self.position = 0
        self.cursor: Cursor | None = None
        self.entries: dict[tuple[str, str, int], CommittedOffset] = {}


class OffsetStore:
    """Reads and writes group offsets in ``__consumer_offsets``. Thread-safe.

    ``partitions`` is used only when this store creates the topic; an existing topic keeps
    its partition count (a group's partition is computed from the count found).
    """

    def __init__(
        self,
        log_: Log,
        *,
        partitions: int = DEFAULT_OFFSETS_PARTITIONS,
        compact_every: int = DEFAULT_COMPACT_EVERY,
    ) -> None:
        if partitions < 1:
            raise ConfigError(f"offsets topic partitions must be >= 1, got {partitions}")
        self.log: FencedLog = fenced_log(log_, "the file-based group coordination")
        self.compact_every = compact_every
        self._compacted_at: dict[int, int] = {}
        self._create_partitions = partitions
        self._count: int | None = None
        self._caches: dict[int, _PartitionCache] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ topic
    def exists(self) -> bool:
        return self.log.topic_exists(OFFSETS_TOPIC)

    def ensure_topic(self) -> int:
        """Create ``__consumer_offsets`` if missing; return its partition count."""
        if self._count is None:
            if not self.log.topic_exists(OFFSETS_TOPIC):
                self.log.create_topic(
                    OFFSETS_TOPIC, self._create_partitions, OFFSETS_TOPIC_CONFIG, exist_ok=True
                )
            self._count = self.log.partition_count(OFFSETS_TOPIC)
        return self._count

    def partition_of(self, group: str) -> int:
        return partition_for_group(group, self.ensure_topic())

    # ------------------------------------------------------------------ reading
    def _refresh(self, partition: int) -> _PartitionCache:
        with self._lock:
            cache = self._caches.setdefault(partition, _PartitionCache())
            marks = self.log.offsets(OFFSETS_TOPIC, partition)
            if cache.position < marks.lwm:
                # Retention removed records we never saw: rebuild from what is left.
                cache.entries.clear()
                cache.position, cache.cursor = marks.lwm, None
            while cache.position < marks.hwm:
                records, cursor = self.log.read(
                    OFFSETS_TOPIC, partition, cache.position, cursor=cache.cursor
                )
                if not records:
                    break
                for record in records:
                    if record.key is None:
                        continue
                    try:
                        key = orjson.loads(record.key)
                        ident = (str(key["group"]), str(key["topic"]), int(key["partition"]))
                    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                        log.warning(
                            "skipping a malformed key in __consumer_offsets",
                            partition=partition,
                            offset=record.offset,
                        )
                        continue
                    if record.value is None:
                        cache.entries.pop(ident, None)
                        continue
                    try:
                        body = orjson.loads(record.value)
                        entry = CommittedOffset(
                            int(body["offset"]),
                            str(body.get("metadata", "")),
                            int(body.get("generation", -1)),
                            str(body.get("member_id", "")),
                            int(body.get("commit_ms", record.timestamp)),
                            record.offset,
                        )
                    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                        log.warning(
                            "skipping a malformed commit in __consumer_offsets",
                            partition=partition,
                            offset=record.offset,
                            group=ident[0],
                            topic=ident[1],
                        )
                        continue
                    cache.entries[ident] = entry
                cache.position = records[-1].offset + 1
                cache.cursor = cursor
            return cache

    def committed(self, group: str, tp: TopicPartition) -> CommittedOffset | None:
        """The latest commit of ``group`` for ``tp``, or ``None`` (refreshes the cache)."""
        if not self.exists():
            return None
        cache = self._refresh(self.partition_of(group))
        return cache.entries.get((group, tp.topic, tp.partition))

    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        """Every committed offset of ``group``, by partition."""
        if not self.exists():
            return {}
        cache = self._refresh(self.partition_of(group))
        return {
            TopicPartition(t, p): entry
            for (g, t, p), entry in sorted(cache.entries.items())
            if g == group
        }

    def groups(self) -> set[str]:
        """Every group with at least one committed offset."""
        if not self.exists():
            return set()
        out: set[str] = set()
        for partition in range(self.ensure_topic()):
            out.update(g for g, _, _ in self._refresh(partition).entries)
        return out

    def history(self, group: str) -> Iterator[tuple[int, TopicPartition, int | None]]:
        """Every commit record of ``group`` still in the log, in log order, as
        ``(log offset, partition, committed offset or None for a tombstone)``. For audits
        and tests: compaction keeps only the latest record per key."""
        if not self.exists():
            return
        partition = self.partition_of(group)
        position = self.log.offsets(OFFSETS_TOPIC, partition).lwm
        cursor: Cursor | None = None
        while True:
            records, cursor = self.log.read(OFFSETS_TOPIC, partition, position, cursor=cursor)
            if not records:
                return
            for record in records:
                if record.key is None:
                    continue
                key = orjson.loads(record.key)
                if key.get("group") != group:
                    continue
                tp = TopicPartition(key["topic"], int(key["partition"]))
                value = None if record.value is None else int(orjson.loads(record.value)["offset"])
                yield record.offset, tp, value
            position = records[-1].offset + 1

    # ------------------------------------------------------------------ writing
    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        generation: int,
        member_id: str,
        precondition: Callable[[], None] | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> int:
        """Append one commit record per partition, atomically (all or none).

        ``precondition()`` runs under the partition's append lock just before the write and
        raises (e.g. :class:`~eventlane.errors.CommitFailedError`) to refuse the commit.
        Returns the log offset of the last record.
        """
        if not offsets:
            raise ConfigError("nothing to commit")
        partition = self.partition_of(group)
        stamp = now_ms or _wall_ms
        records = []
        for tp, om in sorted(offsets.items()):
            if not isinstance(om.offset, int) or isinstance(om.offset, bool) or om.offset < 0:
                raise ConfigError(
                    f"committed offset must be an integer >= 0, got {om.offset!r}",
                    topic=tp.topic,
                    partition=tp.partition,
                )
            value = orjson.dumps(
                {
                    "offset": om.offset,
                    "metadata": om.metadata,
                    "generation": generation,
                    "member_id": member_id,
                    "commit_ms": stamp(),
                }
            )
            records.append((encode_key(group, tp), value, (), None))

        def check(_leo: int) -> None:
            if precondition is not None:
                precondition()

        result = self.log.append_fenced(
            OFFSETS_TOPIC, partition, records, precondition=check, atomic=True
        )
        self._maybe_compact(partition, result.last_offset)
        return result.last_offset

    def _maybe_compact(self, partition: int, last_offset: int) -> None:
        since = self._compacted_at.setdefault(partition, last_offset)
        if last_offset - since < self.compact_every:
            return
        self._compacted_at[partition] = last_offset
        self.log.request_compaction(OFFSETS_TOPIC, partition)

    def delete_group(self, group: str, *, precondition: Callable[[], None] | None = None) -> int:
        """Tombstone every committed offset of ``group``; returns how many were deleted."""
        current = self.group_offsets(group)
        if not current:
            return 0
        records = [(encode_key(group, tp), None, (), None) for tp in sorted(current)]

        def check(_leo: int) -> None:
            if precondition is not None:
                precondition()

        self.log.append_fenced(
            OFFSETS_TOPIC, self.partition_of(group), records, precondition=check, atomic=True
        )
        return len(records)

    def barrier(self, group: str) -> None:
        """Wait until every commit of ``group`` already validated is in the log.

        Takes and releases the append lock of the group's partition (appending nothing):
        an in-flight commit holds that lock from its validation to its publication.
        """
        if not self.exists():
            return

        def stop(_leo: int) -> None:
            raise _Barrier

        try:
            self.log.append_fenced(
                OFFSETS_TOPIC,
                self.partition_of(group),
                [(b'{"barrier":true}', None, (), None)],
                precondition=stop,
            )
        except (_Barrier, PreconditionFailedError):
            pass
        except UnknownTopicError:
            self._count = None


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000
