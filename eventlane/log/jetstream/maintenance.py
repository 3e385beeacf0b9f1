"""Maintenance on JetStream: what the server does itself, and what is left to eventlane.

* Compaction: values are compacted by the server at once (``max_msgs_per_subject=1``), so
  ``min.compaction.lag.ms`` and the dirty ratio are not honoured; :meth:`Maintenance.compact`
  only purges tombstones older than ``delete.retention.ms``.
* Retention is applied continuously by the server (stream limits; single records by server
  time): :meth:`Maintenance.cleanup` reports the marks.
* No segments to roll and no per-key index to check or rebuild (the server's per-subject
  state is the per-key state).
* Migration support (:mod:`.migrate`): an empty partition can start at an offset, and
  filler messages on the reserved subject keep a copied partition's offsets.

Invariants: nothing here reorders or rewrites records; what it removes is what Kafka's
cleaner or DeleteRecords would (tombstones past their retention, records below an offset).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TypeVar

from eventlane.errors import LogError, OffsetOutOfRangeError, UnknownTopicError
from eventlane.log.config import TopicConfig
from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.bridge import Bridge
from eventlane.log.jetstream.connection import Connection
from eventlane.log.jetstream.publish import Publisher
from eventlane.log.jetstream.read import Reader
from eventlane.log.jetstream.topics import Topics
from eventlane.log.types import Clock, CompactionReport, Progress, RetentionReport

T = TypeVar("T")


class Maintenance:
    """The maintenance and migration operations of one log (module docstring)."""

    def __init__(
        self,
        conn: Connection,
        bridge: Bridge,
        topics: Topics,
        reader: Reader,
        publisher: Publisher,
        clock: Clock,
    ) -> None:
        self.conn = conn
        self.bridge = bridge
        self.topics = topics
        self.reader = reader
        self.publisher = publisher
        self.clock = clock
        self.namespace = conn.namespace

    def _purge(self, stream: str, what: str = "request", **options: object) -> None:
        purge = functools.partial(self.conn.js.purge_stream, stream, **options)
        self.bridge.run(self.conn.retry(purge, what=what))

    def compact(self, topic: str, *, progress: Progress | None = None) -> list[CompactionReport]:
        """Purge tombstones older than ``delete.retention.ms`` (values are compacted by the
        server at once, ``max_msgs_per_subject=1``)."""
        cfg = self.topics.get(topic, fresh=True).config
        return self.each_partition(topic, progress, lambda p: self._compact_one(topic, p, cfg))

    def each_partition(
        self, topic: str, progress: Progress | None, work: Callable[[int], T]
    ) -> list[T]:
        """``work(p)`` for every partition of ``topic``, telling ``progress`` as it goes."""
        total = self.topics.get(topic, fresh=True).partitions
        out = []
        for p in range(total):
            out.append(work(p))
            if progress is not None:
                progress(p + 1, total, p)
        return out

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Delete every record below ``before_offset`` (Kafka's DeleteRecords); the new LWM."""
        self.topics.check_partition(topic, partition)
        lwm, hwm, _ = self.bridge.run(self.topics.state(topic, partition))
        if not isinstance(before_offset, int) or before_offset > hwm or before_offset < 0:
            raise OffsetOutOfRangeError(
                f"cannot delete records before {before_offset!r}: outside [0, {hwm}]",
                topic=topic,
                partition=partition,
                offset=before_offset,
                lwm=lwm,
                leo=hwm,
            )
        if before_offset > lwm:
            stream = m.stream_name(self.namespace, topic, partition)
            self._purge(stream, "delete records", seq=before_offset + 1)
        self.topics.check_partition(topic, partition)
        lwm, _, _ = self.bridge.run(self.topics.state(topic, partition))
        return lwm

    def _compact_one(self, topic: str, p: int, cfg: TopicConfig) -> CompactionReport:
        started = time.monotonic()
        lwm, hwm, size_before = self.bridge.run(self.topics.state(topic, p))
        scanned, purged = 0, 0
        if cfg.compact:
            cutoff = self.clock() - cfg.delete_retention_ms
            stream = m.stream_name(self.namespace, topic, p)
            prefix = m.subject_prefix(self.namespace, topic, p)
            offset = lwm
            while offset < hwm:
                records, _ = self.reader.read(topic, p, offset)
                if not records:
                    break
                for r in records:
                    scanned += 1
                    if r.value is None and r.timestamp <= cutoff and r.key is not None:
                        subject = f"{prefix}.{m.key_token(r.key)}"
                        self._purge(stream, "purge tombstone", subject=subject, seq=r.offset + 2)
                        purged += 1
                offset = records[-1].offset + 1
        _, _, size_after = self.bridge.run(self.topics.state(topic, p))
        return CompactionReport(
            topic,
            p,
            1,
            1,
            scanned,
            scanned - purged,
            size_before,
            size_after,
            time.monotonic() - started,
        )

    def cleanup(self, topic: str, *, progress: Progress | None = None) -> list[RetentionReport]:
        """Retention is applied continuously by the server (stream limits): report marks."""

        def marks(p: int) -> RetentionReport:
            lwm, _, _ = self.bridge.run(self.topics.state(topic, p))
            return RetentionReport(topic, p, lwm, lwm, 0, 0, 0, 0.0)

        return self.each_partition(topic, progress, marks)

    def verify(self, topics: list[str], *, progress: Progress | None = None) -> list[Exception]:
        """Check that every partition stream of ``topics`` exists with its replicas current."""
        problems: list[Exception] = []
        for name in topics:
            check = functools.partial(self._verify_one, name)
            for found in self.each_partition(name, progress, check):
                problems.extend(found)
        return problems

    def _verify_one(self, topic: str, p: int, *, settle_s: float = 3.0) -> list[Exception]:
        """Problems of one partition stream; a replica still catching up is re-checked for
        ``settle_s`` (a new or restarted replica is briefly behind) before it is reported."""
        deadline = time.monotonic() + settle_s
        while True:
            info = self.topics.stream_info(topic, p)
            if info is None:
                return [LogError("partition stream missing", topic=topic, partition=p)]
            problems: list[Exception] = [
                LogError(
                    f"replica {r.name} is {'offline' if r.offline else 'behind'}",
                    topic=topic,
                    partition=p,
                )
                for r in (info.cluster.replicas if info.cluster else None) or []
                if r.offline or not r.current
            ]
            if not problems or time.monotonic() > deadline:
                return problems
            time.sleep(0.1)

    # ------------------------------------------------------------------ migration support
    def start_at(self, topic: str, partition: int, offset: int) -> None:
        """Make an empty partition start at ``offset`` (its LWM and HWM become ``offset``)."""
        _, hwm, _ = self.bridge.run(self.topics.state(topic, partition))
        if hwm != 0:
            raise LogError("start_at needs an empty partition", topic=topic, partition=partition)
        self._purge(m.stream_name(self.namespace, topic, partition), seq=offset + 1)

    def fill_gap(self, topic: str, partition: int, count: int) -> int:
        """Append ``count`` empty filler messages on the reserved subject ``<prefix>.g``
        (removed by :meth:`purge_fillers`), so the next record lands ``count`` offsets on."""
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.FILLER}"
        msgs = [(subject, b"", {m.H_TS: "0"})] * count
        if count:
            self.bridge.run(self.publisher.publish_only(topic, msgs, {}), topic=topic, write=True)
        return count

    def purge_fillers(self, topic: str, partition: int) -> None:
        stream = m.stream_name(self.namespace, topic, partition)
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.FILLER}"
        self._purge(stream, "purge fillers", subject=subject)

    def placement(self, topic: str, partition: int) -> tuple[str, str | None, list[str]]:
        """``(stream, leader node, replica nodes)`` of a partition, for operators and tests."""
        self.topics.check_partition(topic, partition)
        stream = m.stream_name(self.namespace, topic, partition)
        info = self.topics.stream_info(topic, partition)
        if info is None:
            raise UnknownTopicError(
                f"topic {topic!r} has no stream for partition {partition}",
                topic=topic,
                partition=partition,
            )
        replicas = [
            r.name for r in (info.cluster.replicas if info.cluster else None) or [] if r.name
        ]
        return stream, info.cluster.leader if info.cluster else None, replicas
