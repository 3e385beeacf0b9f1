"""``JetStreamLog``: the log port on a replicated NATS JetStream cluster (bytes only).

Mapping (see :mod:`.mapping` and docs/scale-out.md): one R=3 file stream per topic
partition, offset = stream sequence - 1, LWM = ``first_seq - 1``, HWM = LEO = ``last_seq``
(an acknowledged publish is on a majority and, with ``sync_interval: always``, fsynced).

The adapter is one object made of parts, each a module with its invariants on top:

* :mod:`.bridge`: the sync-over-async bridge (nats-py is asyncio; threads call it);
* :mod:`.connection`: the nats-py connection and the retry rule of every request;
* :mod:`.topics`: the topic registry (KV bucket ``<ns>-topics``), stream config, marks;
* :mod:`.publish`: appends (message ids, acks, atomic batches, unknown outcomes);
* :mod:`.read`: reads by offset and by key, read-your-writes from any replica;
* :mod:`.wakeups`: waking tailing readers in every process;
* :mod:`.maintenance`: compaction of tombstones, retention marks, verify, migration.

The object may be shared by threads; it must not be shared across ``fork()``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from eventlane.log.config import TopicConfig
from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.aio import AsyncJetStreamLog
from eventlane.log.jetstream.bridge import Bridge
from eventlane.log.jetstream.connection import Connection, parse_url
from eventlane.log.jetstream.maintenance import Maintenance
from eventlane.log.jetstream.publish import MAX_BATCH_BYTES, MAX_BATCH_RECORDS, Publisher
from eventlane.log.jetstream.read import Reader
from eventlane.log.jetstream.topics import Topics
from eventlane.log.jetstream.wakeups import Wakeups
from eventlane.log.local import LocalDir, default_data_dir
from eventlane.log.record import Record
from eventlane.log.types import (
    AppendResult,
    Clock,
    CompactionReport,
    Cursor,
    Expect,
    KeyIndexReport,
    PartitionOffsets,
    Progress,
    RecordTuple,
    RetentionReport,
    TopicDescription,
    wall_clock_ms,
)

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_RECORDS", "Expect", "JetStreamLog", "open_url"]

T = TypeVar("T")


def open_url(url: str, local: LocalDir) -> JetStreamLog:
    """The engine opener for ``nats://`` URLs (entry point ``eventlane.engines: nats``)."""
    return JetStreamLog.from_url(url, local=local)


class JetStreamLog:
    """The log port on NATS JetStream. ``JetStreamLog.from_url("nats://h:p,h:p")``.

    Roles (:mod:`eventlane.log.port`): the core :class:`~eventlane.log.port.Log`,
    :class:`~eventlane.log.port.KeyedLog`, :class:`~eventlane.log.port.MaintainedLog` and
    :class:`~eventlane.log.port.FencedLog`. Compaction is not lazy: a compacted topic keeps
    only a key's last record at once (``max_msgs_per_subject=1``), so
    ``min.compaction.lag.ms`` and the dirty ratio are not honoured. Also
    (docs/scale-out.md): retention drops single records by server time.
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        namespace: str = "eventlane",
        replicas: int = 3,
        clock: Clock = wall_clock_ms,
        timeout: float = 5.0,
        retry_s: float = 30.0,
        local: LocalDir | None = None,
    ) -> None:
        self.local = local if local is not None else LocalDir(default_data_dir())
        self.namespace = m.check_namespace(namespace)
        self.replicas = replicas
        hosts = ",".join(s.split("://", 1)[-1] for s in servers)
        self.url = f"nats://{hosts}?namespace={self.namespace}&replicas={replicas}"
        """What :func:`eventlane.engine.open_log` opens this log by in another process
        (a Spark executor): the servers, the namespace and the replica count."""
        self.clock = clock
        self.timeout = timeout
        self.retry_s = retry_s
        self._conn = Connection(self.namespace, replicas=replicas, timeout=timeout, retry_s=retry_s)
        self.attempt_s = self._conn.attempt_s
        # every coroutine bounds its own waits; this is the backstop against a wedge
        self._bridge = Bridge(backstop_s=retry_s + 6 * timeout)
        self._topics = Topics(self._conn, self._bridge, clock)
        self._conn.on_gone = self._topics.forget
        self._wakeups = Wakeups(self._conn, self._bridge)
        self._reader = Reader(self._conn, self._bridge, self._topics)
        self._publisher = Publisher(
            self._conn, self._bridge, self._topics, self._wakeups, clock, self._reader.head
        )
        self._maintenance = Maintenance(
            self._conn, self._bridge, self._topics, self._reader, self._publisher, clock
        )
        self._bridge.on_drive = self._wakeups.on_drive
        self._bridge.start_pubs = self._publisher.start_pubs
        self._closed = False
        try:
            self._bridge.run(self._connect(list(servers)))
        except BaseException:
            self._bridge.close()
            raise

    async def _connect(self, servers: list[str]) -> None:
        await self._conn.connect(servers, self._wakeups.on_message)
        await self._publisher.start()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> JetStreamLog:
        return cls(**{**parse_url(url), **kwargs})

    # ------------------------------------------------------------------ plumbing
    # For modules built on this connection (eventlane.log.jetstream.kv,
    # eventlane.consumer.jetstream): run a coroutine on the log's event loop, retry
    # transient errors, the clients, an atomic batch.
    def run(self, coro: Coroutine[Any, Any, T], *, write: bool = False) -> T:
        """Run ``coro`` on the log's loop; a nats-py error it raises is raised as eventlane's
        (:mod:`.errors`; ``write``: a timeout leaves the outcome unknown)."""
        return self._bridge.run(coro, write=write)

    async def retry(
        self, op: Callable[[], Awaitable[T]], *, what: str = "request", write: bool = False
    ) -> T:
        return await self._conn.retry(op, what=what, write=write)

    async def batch(
        self, msgs: list[tuple[str, bytes, dict[str, str]]], extra: dict[str, str]
    ) -> int:
        return await self._publisher.batch(msgs, extra)

    @property
    def js(self) -> Any:
        return self._conn.js

    @property
    def nc(self) -> Any:
        return self._conn.nc

    # ------------------------------------------------------------------ topics
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: TopicConfig | Mapping[str, object] | None = None,
        *,
        exist_ok: bool = False,
    ) -> TopicDescription:
        """Create the partition streams, then register the topic (create-if-absent in KV)."""
        return self._topics.create(name, partitions, config, exist_ok=exist_ok)

    def list_topics(self) -> list[str]:
        return self._topics.names()

    def topic_exists(self, name: str) -> bool:
        return self._topics.exists(name)

    def partition_count(self, name: str) -> int:
        return self._topics.get(name).partitions

    def topic_config(self, name: str) -> TopicConfig:
        return self._topics.get(name).config

    def describe_topic(self, name: str) -> TopicDescription:
        return self._topics.describe(name)

    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
    ) -> TopicDescription:
        """Change config values (stream limits follow) or add partitions (never remove)."""
        return self._topics.alter(name, partitions=partitions, config=config)

    def delete_topic(self, name: str) -> None:
        """Unregister the topic, then delete its streams."""
        self._topics.delete(name)

    # ------------------------------------------------------------------ append
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
        precondition: Callable[[int], None] | None = None,
    ) -> AppendResult:
        """Append ``records`` in order; return once a majority of replicas acknowledged them.

        ``expect`` is checked by the server (``Nats-Expected-Last-Subject-Sequence``) and
        refused with :class:`ConcurrencyError`, nothing written. ``precondition`` (outside the
        port; the contract kit's callback form) is called with the leader's end offset and
        the append is then conditional on it (``Nats-Expected-Last-Sequence``), asked again
        if another writer got in between. Records of one call get
        consecutive offsets when they fit in one atomic batch (1000 records, 1 MiB); larger
        non-atomic calls are split and another writer's records may fall between the pieces.
        """
        return self._publisher.append(
            topic, partition, records, expect=expect, atomic=atomic, precondition=precondition
        )

    def append_fenced(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        precondition: Callable[[int], None],
        atomic: bool = False,
    ) -> AppendResult:
        """The port's :class:`~eventlane.log.port.FencedLog` role: :meth:`append` with
        ``precondition`` (the end offset checked by the server with
        ``Nats-Expected-Last-Sequence``)."""
        return self.append(topic, partition, records, atomic=atomic, precondition=precondition)

    # ------------------------------------------------------------------ read
    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        cursor: Cursor | None = None,
        upto: int | None = None,
    ) -> tuple[list[Record], Cursor | None]:
        """Records from ``offset`` below ``min(HWM, upto)``, about ``max_bytes`` at most (at
        least one record if any is there)."""
        return self._reader.read(
            topic, partition, offset, max_bytes=max_bytes, cursor=cursor, upto=upto
        )

    def read_key(
        self,
        topic: str,
        partition: int,
        key: bytes,
        *,
        after: int | None = None,
        upto: int | None = None,
    ) -> list[Record]:
        """The records with ``key`` in the partition, oldest first, with offsets above
        ``after`` and below ``upto`` (a subject-filtered read, no index of our own)."""
        return self._reader.read_key(topic, partition, key, after=after, upto=upto)

    def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of the last record with ``key`` (``None``: none), from the leader."""
        return self._reader.key_head(topic, partition, key)

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        self._topics.check_partition(topic, partition)
        lwm, hwm, _ = self._bridge.run(self._topics.state(topic, partition))
        return PartitionOffsets(lwm, hwm, hwm)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp`` (a scan)."""
        return self._reader.offset_for_time(topic, partition, timestamp)

    # ------------------------------------------------------------------ waiting
    def wait_seq(self) -> int:
        return self._wakeups.wait_seq()

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until an append (by any eventlane process on the cluster) after ``seen``."""
        self._wakeups.wait(seen, timeout)

    def wake(self) -> None:
        """Wake every waiter of this namespace, in every process (callable from any thread,
        the log's own event loop included)."""
        self._wakeups.wake()

    # ------------------------------------------------------------------ maintenance
    def compact(self, topic: str, *, progress: Progress | None = None) -> list[CompactionReport]:
        """Purge tombstones older than ``delete.retention.ms`` (values are compacted by the
        server at once, ``max_msgs_per_subject=1``)."""
        return self._maintenance.compact(topic, progress=progress)

    def cleanup(self, topic: str, *, progress: Progress | None = None) -> list[RetentionReport]:
        """Retention is applied continuously by the server (stream limits): report marks."""
        return self._maintenance.cleanup(topic, progress=progress)

    def request_compaction(self, topic: str, partition: int) -> None:
        """Nothing to schedule: the server compacts values at once (see :meth:`compact`)."""
        self._topics.check_partition(topic, partition)

    def roll(self, topic: str, partition: int) -> None:
        """JetStream has no segments to roll; checks the partition exists."""
        self._topics.check_partition(topic, partition)

    def check_keys(
        self, topics: Collection[str] | None = None, *, repair: bool = False
    ) -> list[KeyIndexReport]:
        """Nothing to check: the server's per-subject state is the per-key state."""
        return []

    def rebuild_keys(self, topic: str, partition: int) -> int:
        """Nothing to rebuild (see :meth:`check_keys`); checks the partition exists."""
        self._topics.check_partition(topic, partition)
        return 0

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Delete every record below ``before_offset`` (Kafka's DeleteRecords); the new LWM."""
        return self._maintenance.delete_records(topic, partition, before_offset)

    def verify(
        self, topic: str | None = None, *, progress: Progress | None = None
    ) -> list[Exception]:
        """Check that every partition stream exists with its replicas current."""
        names = [topic] if topic is not None else self.list_topics()
        return self._maintenance.verify(names, progress=progress)

    # ------------------------------------------------------------------ migration support
    def start_at(self, topic: str, partition: int, offset: int) -> None:
        """Make an empty partition start at ``offset`` (its LWM and HWM become ``offset``)."""
        self._maintenance.start_at(topic, partition, offset)

    def fill_gap(self, topic: str, partition: int, count: int) -> int:
        """Append ``count`` empty filler messages on the reserved subject ``<prefix>.g``
        (removed by :meth:`purge_fillers`), so the next record lands ``count`` offsets on."""
        return self._maintenance.fill_gap(topic, partition, count)

    def purge_fillers(self, topic: str, partition: int) -> None:
        self._maintenance.purge_fillers(topic, partition)

    def placement(self, topic: str, partition: int) -> tuple[str, str | None, list[str]]:
        """``(stream, leader node, replica nodes)`` of a partition, for operators and tests."""
        return self._maintenance.placement(topic, partition)

    # ------------------------------------------------------------------ asyncio
    def async_face(self) -> AsyncJetStreamLog:
        """This log's data path for asyncio code, unopened (``await face.open()`` on the
        caller's loop): the same servers, namespace, clock and timeouts, a connection of
        its own; the async runtime (:mod:`eventlane.app.aio`) awaits its appends and reads
        instead of driving this log's bridge from threads."""
        return AsyncJetStreamLog(
            parse_url(self.url)["servers"],
            namespace=self.namespace,
            replicas=self.replicas,
            clock=self.clock,
            timeout=self.timeout,
            retry_s=self.retry_s,
        )

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        if self._closed:
            return
        try:
            self._bridge.run(self._close_connection())
        finally:
            self._closed = True
            self._bridge.close()

    async def _close_connection(self) -> None:
        await self._wakeups.pay_now()  # the last append's wake: flushed by the client's close
        await self._reader.sequential.close()  # (their consumers deleted)
        await self._conn.nc.close()

    def __enter__(self) -> JetStreamLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
