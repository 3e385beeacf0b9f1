"""``AsyncJetStreamLog``: the JetStream log's data path for asyncio code, on the caller's loop.

The same parts as :class:`~eventlane.log.jetstream.log.JetStreamLog` (:mod:`.topics`,
:mod:`.read`, :mod:`.publish`, :mod:`.wakeups`, :mod:`.connection`), not a second copy: an
append is the publisher's one plan (:meth:`Publisher.plan`) awaited in place instead of
driven through the bridge, reads are the reader's coroutines. What differs is who runs them:
here the connection is made on the caller's running event loop and every call awaits
nats-py there, with no thread and no hop (the sync log serves threads through its bridge:
:mod:`.bridge`). Concurrent tasks' single-record appends share the connection's writes and
one reply subscription, as concurrent threads' do.

Invariants: an :class:`AsyncJetStreamLog` belongs to the loop that opened it (nats-py's
connection is bound to it). Errors leave as eventlane's, as from the sync log (a write with
no answer is :class:`~eventlane.errors.OutcomeUnknownError`). A task cancelled while its
append is in flight leaves that append's outcome unknown to it (the server may store it):
read the key before deciding again. Topic administration and maintenance stay on the sync
log (they are rare and may run for minutes).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import nats.errors

from eventlane import _plans
from eventlane.errors import FrameworkError
from eventlane.log.config import TopicConfig
from eventlane.log.jetstream import errors as e
from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.connection import Connection, parse_url
from eventlane.log.jetstream.publish import Publisher
from eventlane.log.jetstream.read import Reader
from eventlane.log.jetstream.topics import Topics
from eventlane.log.jetstream.wakeups import Wakeups
from eventlane.log.record import Record
from eventlane.log.types import (
    AppendResult,
    Clock,
    Expect,
    PartitionOffsets,
    RecordTuple,
    wall_clock_ms,
)

T = TypeVar("T")


class AsyncJetStreamLog:
    """The data path of a JetStream log for asyncio (module docstring)::

        async with AsyncJetStreamLog.from_url("nats://h:p,h:p?namespace=ns") as log:
            await log.append("orders", 0, [(b"k", b"v", (), None)], expect=Expect(b"k", None))

    Topics are created with the sync :class:`~eventlane.log.jetstream.log.JetStreamLog`
    (same URL); both see the same streams and registry."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        namespace: str = "eventlane",
        replicas: int = 3,
        clock: Clock = wall_clock_ms,
        timeout: float = 5.0,
        retry_s: float = 30.0,
    ) -> None:
        self.servers = list(servers)
        self.namespace = m.check_namespace(namespace)
        self.clock = clock
        self._conn = Connection(self.namespace, replicas=replicas, timeout=timeout, retry_s=retry_s)
        self._topics = Topics(self._conn, None, clock)
        self._conn.on_gone = self._topics.forget
        self._wakeups = Wakeups(self._conn, None)
        self._reader = Reader(self._conn, None, self._topics)
        self._publisher = Publisher(
            self._conn, None, self._topics, self._wakeups, clock, self._reader.head
        )
        self._open = False

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncJetStreamLog:
        """An unopened log for ``nats://...`` (``async with`` opens it; or :meth:`open`)."""
        return cls(**{**parse_url(url), **kwargs})

    async def open(self) -> AsyncJetStreamLog:
        """Connect on the running loop (idempotent)."""
        if not self._open:
            await self._call(self._conn.connect(self.servers, self._wakeups.on_message))
            await self._call(self._publisher.start())
            self._open = True
        return self

    async def close(self) -> None:
        if self._open:
            self._open = False
            await self._wakeups.pay_now()  # the last append's wake message
            await self._conn.nc.close()

    async def __aenter__(self) -> AsyncJetStreamLog:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        topic: str | None = None,
        partition: int | None = None,
        write: bool = False,
    ) -> T:
        """Await ``coro``; a nats-py error leaves as eventlane's (as the bridge does)."""
        try:
            return await coro
        except FrameworkError:
            raise
        except (nats.errors.Error, TimeoutError) as exc:
            raise e.translate(exc, topic=topic, partition=partition, write=write) from exc

    # ------------------------------------------------------------------ the data path
    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
        precondition: Callable[[int], None] | None = None,
    ) -> AppendResult:
        """See :meth:`JetStreamLog.append <eventlane.log.jetstream.log.JetStreamLog.append>`."""
        append = self._publisher.append_async(
            topic, partition, records, expect=expect, atomic=atomic, precondition=precondition
        )
        return await self._call(append, topic=topic, partition=partition, write=True)

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        upto: int | None = None,
    ) -> list[Record]:
        """See :meth:`JetStreamLog.read <eventlane.log.jetstream.log.JetStreamLog.read>`."""
        read = self._reader.read_async(topic, partition, offset, max_bytes=max_bytes, upto=upto)
        return await self._call(read, topic=topic, partition=partition)

    async def read_key(
        self,
        topic: str,
        partition: int,
        key: bytes,
        *,
        after: int | None = None,
        upto: int | None = None,
    ) -> list[Record]:
        """The records with ``key``, oldest first, above ``after`` and below ``upto``."""
        read = self._reader.read_key_async(topic, partition, key, after=after, upto=upto)
        return await self._call(read, topic=topic, partition=partition)

    async def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of the last record with ``key`` (``None``: none), from the leader."""
        head = self._reader.key_head_async(topic, partition, key)
        return await self._call(head, topic=topic, partition=partition)

    async def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        await self._call(self._topics.check_partition_async(topic, partition), topic=topic)
        state = self._topics.state(topic, partition)
        lwm, hwm, _ = await self._call(state, topic=topic, partition=partition)
        return PartitionOffsets(lwm, hwm, hwm)

    async def topic_exists(self, name: str) -> bool:
        """Whether the topic is registered, as of at most ``META_TTL_S`` ago (a load's
        check for a snapshot topic, made per command: an answer either way is cached that
        long; a snapshot topic created meanwhile is used by loads a little later)."""
        return await self._call(self._topics.exists_async(name, fresh=False), topic=name)

    def answer(self, method: str, args: tuple[Any, ...]) -> Any:
        """What ``await getattr(self, method)(*args)`` answers now, where that is in memory
        (no I/O, no await: a topic's cached partition count, a cached :meth:`topic_exists`);
        else :data:`eventlane._plans.ASK`. The command path asks these three times a
        command; its async driver takes the answer without awaiting the call
        (:meth:`eventlane.store.steps.AsyncSteps.answer`)."""
        if method == "partition_count" and len(args) == 1:
            meta = self._topics.cached(args[0])
            return _plans.ASK if meta is None else meta.partitions
        if method == "topic_exists" and len(args) == 1:
            known = self._topics.known_exists(args[0])
            return _plans.ASK if known is None else known
        return _plans.ASK

    async def partition_count(self, name: str) -> int:
        return (await self._call(self._topics.get_async(name), topic=name)).partitions

    async def topic_config(self, name: str) -> TopicConfig:
        return (await self._call(self._topics.get_async(name), topic=name)).config

    def wait_seq(self) -> int:
        """The wake-up sequence (appends of this log and wake messages received)."""
        return self._wakeups.wait_seq()
