"""Offset ranges: what a replay reads, planned on the driver, read on the executors.

An :class:`OffsetRange` is ``[start, end)`` of one ``(topic, partition)``. Planning pins the
end of each partition once (by default its high-water mark at that moment, the vector
``E``), so every task of one replay reads a fixed, finite slice of the log however long the
producers keep appending. Planning reads only the partitions' marks: the driver holds
metadata, never records.

Reading (:func:`read_range`) opens the partition through the log's own read path (CRC
checked, compaction gaps skipped: a range may hold fewer records than ``end - start``) and
yields lists of records in offset order. A start below the low-water mark (retention moved
it after planning) raises :class:`~eventlane.errors.OffsetOutOfRangeError`: a replay never
silently skips history.

    >>> split_range(OffsetRange("orders", 0, 10, 35), 10)  # doctest: +NORMALIZE_WHITESPACE
    [OffsetRange(topic='orders', partition=0, start=10, end=20),
     OffsetRange(topic='orders', partition=0, start=20, end=30),
     OffsetRange(topic='orders', partition=0, start=30, end=35)]
    >>> split_range(OffsetRange("orders", 1, 5, 5), 10)
    [OffsetRange(topic='orders', partition=1, start=5, end=5)]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from eventlane.engine import log_locator, open_log
from eventlane.errors import ConfigError
from eventlane.log import Log, Record, TopicPartition

__all__ = [
    "OffsetRange",
    "end_vector",
    "open_store",
    "plan_ranges",
    "read_range",
    "split_range",
]

READ_BYTES = 4 << 20
"""Bytes of batches asked for per log read while replaying."""


class OffsetRange(NamedTuple):
    """Offsets ``[start, end)`` of one partition. Invariant: ``start <= end``."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        """Offsets covered (an upper bound of the records: compaction leaves gaps)."""
        return self.end - self.start


_stores: dict[tuple[int, str, str | None], Log] = {}


def open_store(locator: str | Path, data_dir: str | Path | None = None) -> Log:
    """This process's log at ``locator`` (opened once, then reused): what an executor reads
    its ranges with. ``locator`` is what :func:`eventlane.engine.log_locator` gave the
    driver: an embedded log's data directory (on every executor: shared storage on a
    cluster) or another engine's URL (``nats://...``: the executor reads from the cluster,
    no log files needed on its host). ``data_dir`` is the local directory of a non-embedded
    log (it creates nothing there). A data directory without ``topics/`` is refused rather
    than created empty (a wrong path on a cluster node must fail, not read nothing).

    Logs are kept per process id: a log opened before a ``fork()`` (its connections, its
    threads) is never reused by the child.
    """
    target = log_locator(locator)
    local = None if data_dir is None else str(data_dir)
    key = (os.getpid(), target, local)
    store = _stores.get(key)
    if store is None:
        if "://" not in target and not (Path(target) / "topics").is_dir():
            raise ConfigError(f"no eventlane data directory at {target!r}", path=target)
        store = _stores[key] = open_log(target, data_dir=local)
    return store


def split_range(rng: OffsetRange, max_offsets: int) -> list[OffsetRange]:
    """Cut ``rng`` into consecutive ranges of at most ``max_offsets`` offsets."""
    if max_offsets < 1:
        raise ConfigError(f"max_offsets must be >= 1, got {max_offsets}")
    if rng.size <= max_offsets:
        return [rng]
    return [
        OffsetRange(rng.topic, rng.partition, lo, min(lo + max_offsets, rng.end))
        for lo in range(rng.start, rng.end, max_offsets)
    ]


def end_vector(log: Log, topics: Iterable[str]) -> dict[TopicPartition, int]:
    """The high-water mark of every partition of ``topics`` now (missing topics: none)."""
    out: dict[TopicPartition, int] = {}
    for topic in topics:
        if not log.topic_exists(topic):
            continue
        for p in range(log.partition_count(topic)):
            out[TopicPartition(topic, p)] = log.offsets(topic, p).hwm
    return out


def end_vector_at(log: Log, topics: Iterable[str], when_ms: int) -> dict[TopicPartition, int]:
    """Time travel: per partition of ``topics``, the first offset whose timestamp is *after*
    ``when_ms`` (Kafka's ``offsetsForTimes(when_ms + 1)``), or the high-water mark when no
    record is that recent. Replaying up to this vector sees exactly the records of each
    partition that the log's time index places at or before ``when_ms``.

    The vector cuts every partition into a prefix, never a filter: with producer timestamps
    (CreateTime), a record stamped at or before ``when_ms`` that comes *after* the first
    record stamped later is left out, as Kafka's ``offsetsForTimes`` would leave it.
    """
    out: dict[TopicPartition, int] = {}
    for topic in topics:
        if not log.topic_exists(topic):
            continue
        for p in range(log.partition_count(topic)):
            found = log.offset_for_time(topic, p, when_ms + 1)
            out[TopicPartition(topic, p)] = log.offsets(topic, p).hwm if found is None else found
    return out


def plan_ranges(
    log: Log,
    topics: Iterable[str],
    *,
    start: Mapping[TopicPartition, int] | None = None,
    end: Mapping[TopicPartition, int] | None = None,
) -> list[OffsetRange]:
    """One range per partition of ``topics``: from ``start`` (default: the low-water mark)
    to ``end`` (default: the high-water mark now). Ordered by topic, then partition. With
    ``end``, exactly its partitions are planned (a partition added since is not).

    An explicit start below the low-water mark, or an end above the high-water mark, is a
    :class:`~eventlane.errors.ConfigError` naming the partition.
    """
    ends = dict(end) if end is not None else end_vector(log, topics)
    starts = start or {}
    out: list[OffsetRange] = []
    for topic in sorted(set(topics)):
        if not log.topic_exists(topic):
            continue
        for p in range(log.partition_count(topic)):
            tp = TopicPartition(topic, p)
            if end is not None and tp not in ends:
                continue
            marks = log.offsets(topic, p)
            hi = ends.get(tp, marks.hwm)
            lo = starts.get(tp, marks.lwm)
            if lo < marks.lwm:
                raise ConfigError(
                    f"start offset {lo} is below the low-water mark {marks.lwm}",
                    topic=topic,
                    partition=p,
                    offset=lo,
                )
            if hi > marks.hwm:
                raise ConfigError(
                    f"end offset {hi} is above the high-water mark {marks.hwm}",
                    topic=topic,
                    partition=p,
                    offset=hi,
                )
            out.append(OffsetRange(topic, p, min(lo, hi), hi))
    return out


def read_range(
    log: Log, rng: OffsetRange, *, max_bytes: int = READ_BYTES
) -> Iterator[list[Record]]:
    """The records of ``rng`` in offset order, as lists of about ``max_bytes`` of batches.

    Stops at ``rng.end`` or at the first empty read (nothing left below the end: the rest
    of the range was compacted away).
    """
    offset = rng.start
    cursor = None
    while offset < rng.end:
        records, cursor = log.read(
            rng.topic, rng.partition, offset, max_bytes=max_bytes, cursor=cursor, upto=rng.end
        )
        if not records:
            return
        yield records
        offset = records[-1].offset + 1
