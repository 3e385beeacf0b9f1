"""Topics on JetStream: the registry, the partition streams' config, and the marks.

* A topic partition is one R=``replicas`` file stream (:mod:`.mapping`). Retention maps to
  stream limits (``max_age``, ``max_bytes``), compaction to ``max_msgs_per_subject=1``.
* Topic metadata (partition count and :class:`TopicConfig`) lives in the replicated KV
  bucket ``<ns>-topics``: created after the streams (create-if-absent, so one of two
  concurrent creators wins), removed before them. The registry only ever grows a topic, so
  metadata cached for :data:`META_TTL_S` is safe to use, and for :data:`META_BACKOFF_S` more
  when the registry cannot answer (appends to partitions that are up do not wait for it).
* Marks: LWM = ``first_seq - 1``, HWM = LEO = ``last_seq``, from the stream leader. The
  marks one log object has seen never go back (``marks``: stream -> (lwm, hwm) last seen):
  a stale node's answer is raised to what was seen before.
* A HWM never falls inside an atomic batch: the leader stores a batch's messages one by one,
  and its stream state can be read between them (seen: HWM 127 with batches of 5). When
  ``last_seq`` moved past the HWM seen before, the message there is looked at: one that
  carries ``Nats-Batch-Id`` without ``Nats-Batch-Commit`` is inside a batch, and the HWM is
  the sequence before that batch's first message (``Nats-Batch-Sequence`` says how far in it
  is). Reads end at a HWM, so they never return part of a batch either.

Invariants: ``meta`` and ``marks`` are dictionaries updated with single assignments from
callers' threads and the loop alike; an entry is a whole immutable tuple, so a reader sees
an old or a new entry, never a torn one (a lost update only costs a registry read).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
import orjson
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from eventlane.errors import (
    ConfigError,
    LogUnavailableError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from eventlane.log.config import (
    TopicConfig,
    altered_partitions,
    new_topic_config,
    warn_partitions_increased,
)
from eventlane.log.jetstream import errors as e
from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.bridge import Bridge
from eventlane.log.jetstream.connection import Connection
from eventlane.log.names import validate_topic_name
from eventlane.log.types import Clock, PartitionDescription, TopicDescription
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

META_TTL_S = 0.5
META_BACKOFF_S = 5.0  # a topic's cached metadata is used this long when the registry is out


class Meta(NamedTuple):
    partitions: int
    config: TopicConfig
    checked: float
    created: int | None = None  # the registry's created_ms: a recreated topic differs


def _exists(meta: Meta, partition: object) -> bool:
    return (
        isinstance(partition, int)
        and not isinstance(partition, bool)
        and 0 <= partition < meta.partitions
    )


class Topics:
    """The topic registry and the partition streams of one log (module docstring)."""

    def __init__(self, conn: Connection, bridge: Bridge | None, clock: Clock) -> None:
        self.conn = conn
        self.bridge = bridge  # None: the asyncio face (only the *_async methods are used)
        self.clock = clock
        self.namespace = conn.namespace
        self.meta: dict[str, Meta] = {}
        self.absent: dict[str, float] = {}  # topic -> monotonic time the registry lacked it
        self.marks: dict[str, tuple[int, int]] = {}  # stream -> (lwm, hwm) last seen
        self._refreshing: dict[str, asyncio.Task[Meta]] = {}  # (on the loop only)

    @property
    def _bridge(self) -> Bridge:
        assert self.bridge is not None, "the asyncio face awaits the coroutines"
        return self.bridge

    def forget(self, topic: str) -> None:
        """The registry says ``topic`` is gone: drop what is cached of it."""
        self.meta.pop(topic, None)

    def stream_config(self, topic: str, p: int, cfg: TopicConfig) -> StreamConfig:
        ns = self.namespace
        by_time = cfg.delete and cfg.retention_ms > 0
        max_age = cfg.retention_ms / 1000 if by_time else 0
        return StreamConfig(
            name=m.stream_name(ns, topic, p),
            subjects=[m.subject_prefix(ns, topic, p) + ".*"],
            num_replicas=self.conn.replicas,
            storage=StorageType.FILE,
            allow_direct=True,
            allow_atomic=True,
            allow_rollup_hdrs=True,
            discard=DiscardPolicy.OLD,
            max_age=max_age,
            max_bytes=cfg.retention_bytes if cfg.delete else -1,
            max_msgs_per_subject=1 if cfg.compact else -1,
            duplicate_window=min(120, max_age) if max_age else 120,
            metadata={"eventlane.topic": topic, "eventlane.partition": str(p)},
        )

    def create(
        self,
        name: str,
        partitions: int = 1,
        config: TopicConfig | Mapping[str, object] | None = None,
        *,
        exist_ok: bool = False,
    ) -> TopicDescription:
        """Create the partition streams, then register the topic (create-if-absent in KV)."""
        cfg = new_topic_config(name, partitions, config)
        if len(m.stream_name(self.namespace, name, partitions)) > 255:
            raise ConfigError("topic name too long for a JetStream stream name", topic=name)
        if self.exists(name):
            if exist_ok:
                return self._describe_new(name)
            raise TopicExistsError(f"topic {name!r} already exists", topic=name)
        self._bridge.run(self._add_streams(name, range(partitions), cfg))
        body = orjson.dumps(
            {
                "name": name,
                "partitions": partitions,
                "config": cfg.to_dict(),
                "created_ms": self.clock(),
            }
        )
        kv = self.conn.kv

        async def register() -> bool:
            """Create-if-absent: whether this call registered the topic (the error is
            caught here, before the bridge would raise it as a refused expectation)."""
            try:
                await kv.create(name, body)
            except nats.js.errors.KeyWrongLastSequenceError:
                return False  # another creator registered it first
            return True

        if not self._bridge.run(self.conn.retry(register, what="create topic"), topic=name):
            if exist_ok:
                return self._describe_new(name)
            raise TopicExistsError(f"topic {name!r} already exists", topic=name)
        log.info("topic created", topic=name, partitions=partitions, engine="jetstream")
        self.meta.pop(name, None)
        return self._describe_new(name)

    def _describe_new(self, name: str, settle_s: float = 5.0) -> TopicDescription:
        """:meth:`describe` of a topic just registered: a partition stream that two creators
        added at once can answer "not found" for a moment (seen when two logs create one
        topic together), so that is asked again for up to ``settle_s`` seconds."""
        deadline = time.monotonic() + settle_s
        while True:
            try:
                return self.describe(name)
            except UnknownTopicError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    async def _add_streams(self, topic: str, parts: range, cfg: TopicConfig) -> None:
        async def one(p: int) -> None:
            sc = self.stream_config(topic, p, cfg)
            await self.conn.retry(lambda: self.conn.js.add_stream(sc), what="create stream")

        await asyncio.gather(*(one(p) for p in parts))

    def names(self) -> list[str]:
        """The registered topics. nats-py's key listing can answer "no keys" when its
        watcher's consumer delivered every key before the watcher first looked (the keys are
        then in flight, counted neither pending nor received): an empty answer is asked
        again, twice, before it is believed."""

        async def keys() -> list[str]:
            for pause in (0.01, 0.05, None):
                try:
                    return list(await self.conn.kv.keys())
                except nats.js.errors.NoKeysError:
                    if pause is None:
                        return []
                    await asyncio.sleep(pause)
            return []

        return sorted(self._bridge.run(self.conn.retry(keys, what="list topics")))

    def exists(self, name: str) -> bool:
        return self._bridge.run(self.exists_async(name), topic=name)

    async def exists_async(self, name: str, *, fresh: bool = True) -> bool:
        """Whether the registry holds ``name`` now (``fresh``: read afresh, never from the
        cache); with ``fresh`` false, as of at most :data:`META_TTL_S` ago (an answer
        either way is cached that long: a load's check for a snapshot topic, where a topic
        created meanwhile only costs a longer read)."""
        validate_topic_name(name)
        if not fresh:
            known = self.known_exists(name)
            if known is not None:
                return known
        try:
            await (self.fetch(name, fresh=True) if fresh else self.get_async(name))
        except UnknownTopicError:
            return False
        return True

    def known_exists(self, name: str) -> bool | None:
        """Whether ``name`` is registered as cached within :data:`META_TTL_S` (either way;
        no I/O): ``None`` when not known. Only names that passed the registry's checks are
        cached."""
        if self.cached(name) is not None:
            return True
        absent = self.absent.get(name) if isinstance(name, str) else None
        if absent is not None and time.monotonic() - absent < META_TTL_S:
            return False
        return None

    def cached(self, name: str) -> Meta | None:
        """A topic's metadata if cached within :data:`META_TTL_S` (no I/O)."""
        meta = self.meta.get(name) if isinstance(name, str) else None
        if meta is not None and time.monotonic() - meta.checked < META_TTL_S:
            return meta
        return None

    def get(self, name: str, *, fresh: bool = False) -> Meta:
        """A topic's metadata: cached (module docstring), or read from the registry."""
        meta = None if fresh else self.cached(name)
        if meta is not None:
            return meta
        return self._bridge.run(self.get_async(name, fresh=fresh), topic=name)

    async def get_async(self, name: str, *, fresh: bool = False) -> Meta:
        """:meth:`get` on the caller's loop. Callers that find the cache stale together
        share one registry read (begun by the first of them, at most :data:`META_TTL_S`
        before any of them came: as fresh as the cache promises); a fresh read is each
        caller's own."""
        if fresh:
            return await self.fetch(name, fresh=True)
        meta = self.cached(name)
        if meta is not None:
            return meta
        refresh = self._refreshing.get(name)
        if refresh is None or refresh.done():  # (done: its callback has not run yet)
            refresh = asyncio.get_running_loop().create_task(self.fetch(name))
            self._refreshing[name] = refresh
            refresh.add_done_callback(functools.partial(self._refreshed, name))
        # shielded: a caller cancelled while it waits does not cancel the others' read
        return await asyncio.shield(refresh)

    def _refreshed(self, name: str, task: asyncio.Task[Meta]) -> None:
        if self._refreshing.get(name) is task:
            del self._refreshing[name]

    async def fetch(self, name: str, *, fresh: bool = False) -> Meta:
        """A topic's metadata from the registry; with ``fresh`` false and metadata cached,
        the cached metadata when the registry cannot answer now (module docstring)."""
        now = time.monotonic()
        meta = self.meta.get(name) if isinstance(name, str) else None
        validate_topic_name(name)
        kv = self.conn.kv

        async def get() -> bytes | None:
            try:
                entry = await kv.get(name)
            except nats.js.errors.KeyNotFoundError:
                return None
            return entry.value

        if meta is not None and not fresh:
            # a refresh of what is cached: when the registry cannot answer now (its leader
            # cut off, an election), keep using the cached metadata for a while, so appends
            # to partitions that are up do not wait for the registry (it only ever grows)
            try:
                async with asyncio.timeout(self.conn.attempt_s):
                    raw = await get()
            except (TimeoutError, nats.errors.Error) as exc:
                if not isinstance(e.translate(exc, topic=name), LogUnavailableError):
                    raise
                self.meta[name] = meta._replace(checked=now + META_BACKOFF_S)
                return meta
        else:
            raw = await self.conn.retry(get, what="read topic metadata")
        if not raw:
            self.meta.pop(name, None)
            self.absent[name] = now
            raise UnknownTopicError(f"topic {name!r} does not exist", topic=name)
        self.absent.pop(name, None)
        body = orjson.loads(raw)
        meta = Meta(
            int(body["partitions"]),
            TopicConfig.from_mapping(body["config"]),
            now,
            body.get("created_ms"),
        )
        self.meta[name] = meta
        return meta

    def check_partition(self, topic: str, partition: int) -> Meta:
        """The topic's metadata, once ``partition`` is known to exist (a cached partition
        count too low is read again before the partition is refused)."""
        meta = self.cached(topic)
        if meta is not None and _exists(meta, partition):
            return meta
        return self._bridge.run(self.check_partition_async(topic, partition), topic=topic)

    async def check_partition_async(self, topic: str, partition: int) -> Meta:
        """:meth:`check_partition` on the caller's loop."""
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise UnknownPartitionError(
                f"partition must be an integer, got {partition!r}", topic=topic
            )
        meta = await self.get_async(topic)
        if not _exists(meta, partition):
            meta = await self.fetch(topic, fresh=True)
            if not _exists(meta, partition):
                raise UnknownPartitionError(
                    f"partition {partition} does not exist (topic has {meta.partitions})",
                    topic=topic,
                    partition=partition,
                )
        return meta

    def describe(self, name: str) -> TopicDescription:
        meta = self.get(name, fresh=True)
        states = self._bridge.run(self._states(name, meta.partitions))
        details = tuple(
            PartitionDescription(p, lwm, hwm, hwm, 1, size)
            for p, (lwm, hwm, size) in enumerate(states)
        )
        return TopicDescription(name, meta.partitions, meta.config, details)

    async def state(self, topic: str, p: int) -> tuple[int, int, int]:
        """``(lwm, hwm, bytes)`` of one partition, from its stream leader."""
        stream = m.stream_name(self.namespace, topic, p)
        js = self.conn.js
        try:
            info = await self.conn.retry(lambda: js.stream_info(stream), what="stream info")
        except nats.js.errors.NotFoundError:
            raise UnknownTopicError(
                f"topic {topic!r} has no stream for partition {p}", topic=topic, partition=p
            ) from None
        last = info.state.last_seq
        lwm = max(info.state.first_seq - 1, 0) if info.state.messages else last
        known = self.marks.get(stream)
        if last > (known[1] if known is not None else 0):
            last = await self._batch_boundary(stream, last)
            lwm = min(lwm, last)
        if known is not None:  # monotone per reader: a stale node's answer never goes back
            lwm, last = max(lwm, known[0]), max(last, known[1])
        self.marks[stream] = (lwm, last)
        return lwm, last, info.state.bytes

    async def _batch_boundary(self, stream: str, last: int) -> int:
        """``last``, or the sequence before the atomic batch it is inside (module docstring)."""
        js = self.conn.js
        try:
            msg = await self.conn.retry(lambda: js.get_msg(stream, last), what="stream info")
        except nats.js.errors.NotFoundError:  # removed since (retention, compaction)
            return last
        headers = msg.headers or {}
        if "Nats-Batch-Id" not in headers or "Nats-Batch-Commit" in headers:
            return last
        return last - int(headers.get("Nats-Batch-Sequence", "1"))

    def appended(self, topic: str, partition: int, last_seq: int) -> None:
        """An append was acknowledged up to stream sequence ``last_seq``: the HWM seen."""
        stream = m.stream_name(self.namespace, topic, partition)
        if (known := self.marks.get(stream)) is not None:
            self.marks[stream] = (known[0], max(known[1], last_seq))

    async def _states(self, topic: str, count: int) -> list[tuple[int, int, int]]:
        return list(await asyncio.gather(*(self.state(topic, p) for p in range(count))))

    def alter(
        self,
        name: str,
        *,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
    ) -> TopicDescription:
        """Change config values (stream limits follow) or add partitions (never remove)."""
        meta = self.get(name, fresh=True)
        cfg = TopicConfig.from_mapping(config or {}, base=meta.config)
        count = meta.partitions
        if partitions is not None:
            altered_partitions(name, meta.partitions, partitions)
            if partitions > meta.partitions:
                warn_partitions_increased(name, meta.partitions, partitions)
                self._bridge.run(self._add_streams(name, range(meta.partitions, partitions), cfg))
                count = partitions
        conn = self.conn

        async def update() -> None:
            for p in range(count):
                sc = self.stream_config(name, p, cfg)
                await conn.retry(functools.partial(conn.js.update_stream, sc), what="update stream")
            body = {"name": name, "partitions": count, "config": cfg.to_dict()}
            await conn.retry(lambda: conn.kv.put(name, orjson.dumps(body)), what="alter topic")

        self._bridge.run(update())
        self.meta.pop(name, None)
        return self.describe(name)

    def delete(self, name: str) -> None:
        """Unregister the topic, then delete its streams."""
        meta = self.get(name, fresh=True)
        conn = self.conn

        async def delete() -> None:
            await conn.retry(lambda: conn.kv.purge(name), what="delete topic")
            for p in range(meta.partitions):
                stream = m.stream_name(self.namespace, name, p)
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await conn.retry(functools.partial(conn.js.delete_stream, stream))

        self._bridge.run(delete())
        self.meta.pop(name, None)
        for p in range(meta.partitions):
            self.marks.pop(m.stream_name(self.namespace, name, p), None)
        log.info("topic deleted", topic=name, engine="jetstream")

    def stream_info(self, topic: str, partition: int) -> Any:
        """The partition stream's info (``nats.js.api.StreamInfo``), from its leader;
        ``None`` if the stream does not exist."""
        stream = m.stream_name(self.namespace, topic, partition)
        js = self.conn.js

        async def info() -> Any:
            try:
                return await self.conn.retry(functools.partial(js.stream_info, stream))
            except nats.js.errors.NotFoundError:  # (caught before the bridge translates it)
                return None

        return self._bridge.run(info(), topic=topic, partition=partition)
