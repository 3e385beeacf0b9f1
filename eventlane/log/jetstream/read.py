"""Reads on JetStream: records by offset and by key, read-your-writes from any replica.

Reads use batched direct gets, which any replica may answer; a replica can lag the leader
by a few milliseconds, so a read first learns the leader's ``last_seq`` (or uses a HWM this
log already saw, :attr:`Topics.marks`) and re-asks until the answer reaches it (bounded),
falling back to the leader itself (:meth:`Reader.leader_next`): a record an append of this
process acknowledged is always readable by it next. Per-key reads are subject-filtered
(``next_by_subj``) below the key's last sequence as the leader knows it; there is no index
of our own. Offsets above the HWM a stale node reports are asked again before they are
refused as out of range (a committed offset another process saw at the leader). A read
that continues a backlog where its cursor's last read stopped is answered from an ordered
push consumer instead (:mod:`.sequential`).

Invariants: nothing here writes; every coroutine runs on the bridge's loop and bounds its
waits (:data:`DIRECT_TRIES` timeouts, then the leader under the retry rule).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any

import nats.errors
import nats.js.errors
import orjson

from eventlane.errors import ConfigError, OffsetOutOfRangeError
from eventlane.log.jetstream import errors as e
from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.bridge import Bridge
from eventlane.log.jetstream.connection import Connection
from eventlane.log.jetstream.mapping import record_of
from eventlane.log.jetstream.sequential import Sequential
from eventlane.log.jetstream.topics import Topics
from eventlane.log.record import Record
from eventlane.log.types import Cursor

READ_BATCH_RECORDS = 10_000
"""Records one batched direct get asks for; ``max_bytes`` (1 MiB for a consumer's fetch:
~4,700 records of 100 B with their headers) usually ends the answer first. 1,000 (the
atomic-publish limit, used here before) cost a round trip per 1,000 records."""

DIRECT_TRIES = 3
"""Direct gets that time out (a replica cut off or frozen) before a read asks the leader."""


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_read(topic: str, partition: int, offset: object, upto: object) -> None:
    """Refuse a read's arguments that are not offsets."""
    if not _integer(offset):
        raise ConfigError(
            f"offset must be an integer, got {offset!r}", topic=topic, partition=partition
        )
    if upto is not None and not _integer(upto):
        raise ConfigError(
            f"upto must be an integer or None, got {upto!r}", topic=topic, partition=partition
        )


class Reader:
    """The reads of one log (module docstring)."""

    def __init__(self, conn: Connection, bridge: Bridge | None, topics: Topics) -> None:
        self.conn = conn
        self.bridge = bridge  # None: the asyncio face (the sync methods are not used)
        self.topics = topics
        self.namespace = conn.namespace
        self.sequential = Sequential(conn, topics)

    @property
    def _bridge(self) -> Bridge:
        assert self.bridge is not None, "the asyncio face awaits the coroutines"
        return self.bridge

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
        check_read(topic, partition, offset, upto)
        meta = self.topics.check_partition(topic, partition)
        compacted = meta.config.compact

        def direct(at: int) -> Coroutine[Any, Any, list[Record]]:
            return self.records(topic, partition, at, max_bytes, upto, compacted)

        coro = self.sequential.read(
            topic, partition, offset, max_bytes, upto, compacted, meta.created, cursor, direct
        )
        records, position = self._bridge.run(coro)
        return records, Cursor(position)

    async def read_async(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        upto: int | None = None,
    ) -> list[Record]:
        """:meth:`read` on the caller's loop."""
        check_read(topic, partition, offset, upto)
        compacted = (await self.topics.check_partition_async(topic, partition)).config.compact
        return await self.records(topic, partition, offset, max_bytes, upto, compacted)

    async def records(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        upto: int | None,
        compacted: bool,
    ) -> list[Record]:
        stream = m.stream_name(self.namespace, topic, partition)
        known = self.topics.marks.get(stream)
        if known is not None and known[0] <= offset < known[1]:
            # records below a HWM seen before exist unless retention removed them since:
            # skip asking the leader, and fall back to it if the answer has a gap
            end = known[1] if upto is None else min(known[1], upto)
            if offset >= end:
                return []
            got = await self._direct(topic, partition, {"seq": offset + 1}, end, max_bytes)
            if got and (compacted or got[0].offset == offset):
                return got
        lwm, hwm, _ = await self.topics.state(topic, partition)
        for pause in (0.05, 0.1, 0.2, 0.4, 0.8):
            if offset <= hwm:
                break
            # above the end: a committed offset another process saw, and a node behind the
            # leader (a partitioned ex-leader) answered; ask again before refusing it
            await asyncio.sleep(pause)
            lwm, hwm, _ = await self.topics.state(topic, partition)
        if offset < lwm or offset > hwm:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{lwm}, {hwm}]",
                topic=topic,
                partition=partition,
                offset=offset,
                lwm=lwm,
                leo=hwm,
            )
        end = hwm if upto is None else min(hwm, upto)
        if offset >= end:
            return []
        got = await self._direct(topic, partition, {"seq": offset + 1}, end, max_bytes)
        if not got:  # replicas still behind the leader: one record from the leader
            prefix = m.subject_prefix(self.namespace, topic, partition)
            one = await self.leader_next(topic, partition, offset + 1, prefix + ".*")
            got = [one] if one is not None and one.offset < end else []
        return got

    async def _direct(
        self, topic: str, partition: int, req: dict[str, Any], end: int, max_bytes: int
    ) -> list[Record]:
        """One batched direct get of records from ``req["seq"]`` up to offset ``end - 1``.

        Any replica may answer; one that lags the leader answers with fewer records (a
        prefix) or none. An empty answer below ``end`` is re-asked (bounded, about 0.1 s):
        the caller learnt ``end`` from the leader, so the records exist.
        """
        stream = m.stream_name(self.namespace, topic, partition)
        body = {
            **req,
            "batch": min(end - int(req["seq"]) + 1, READ_BATCH_RECORDS),
            "max_bytes": max(max_bytes, 1),
        }
        timeouts = 0
        for attempt in range(25):
            try:
                got = await self._direct_once(stream, body, topic, partition, end)
            except e.TRANSIENT:  # the replica asked is cut off, frozen or gone: ask again
                timeouts += 1
                if timeouts >= DIRECT_TRIES:
                    return []  # the caller asks the leader (its API request is retried)
                continue
            if got:
                return got
            await asyncio.sleep(0.001 * (attempt + 1) / 2)
        return []

    async def _direct_once(
        self, stream: str, body: dict[str, Any], topic: str, partition: int, end: int
    ) -> list[Record]:
        """One batched direct get: the answers are decoded by a subscription callback as
        they arrive (no task or timer per message, unlike ``next_msg``), until the
        end-of-batch status (or a single-message answer)."""
        records: list[Record] = []
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Any) -> None:
            if done.done():
                return
            try:
                hdrs = msg.headers or {}
                if hdrs.get("Status"):
                    done.set_result(None)  # 204: end of batch; 404: nothing there (yet)
                    return
                seq = int(hdrs["Nats-Sequence"])
                if seq <= end:
                    records.append(
                        record_of(topic, partition, seq - 1, hdrs["Nats-Subject"], msg.data, hdrs)
                    )
                if "Nats-Num-Pending" not in hdrs:
                    done.set_result(None)  # a single-message answer has no end marker
            except Exception as exc:
                done.set_exception(exc)

        nc = self.conn.nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=on_msg)
        try:
            await nc.publish(f"$JS.API.DIRECT.GET.{stream}", orjson.dumps(body), reply=inbox)
            try:
                async with asyncio.timeout(self.conn.attempt_s):
                    await done
            except TimeoutError:
                raise nats.errors.TimeoutError from None
        finally:
            await sub.unsubscribe()
        return records

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
        self.topics.check_partition(topic, partition)
        return self._bridge.run(self.key_records(topic, partition, key, after, upto))

    async def read_key_async(
        self,
        topic: str,
        partition: int,
        key: bytes,
        *,
        after: int | None = None,
        upto: int | None = None,
    ) -> list[Record]:
        """:meth:`read_key` on the caller's loop."""
        await self.topics.check_partition_async(topic, partition)
        return await self.key_records(topic, partition, key, after, upto)

    async def key_records(
        self, topic: str, partition: int, key: bytes, after: int | None, upto: int | None
    ) -> list[Record]:
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.key_token(key)}"
        head = await self._key_head(topic, partition, subject)
        if head is None:
            return []
        end = head + 1 if upto is None else min(head + 1, upto)
        first = 1 if after is None else after + 2
        if first > end:
            return []
        out: list[Record] = []
        while first <= end:
            got = await self._direct(
                topic, partition, {"seq": first, "next_by_subj": subject}, end, 1 << 24
            )
            if not got:  # replicas still behind the leader's head: ask the leader
                one = await self.leader_next(topic, partition, first, subject)
                if one is None or one.offset >= end:
                    break
                got = [one]
            out.extend(got)
            first = got[-1].offset + 2
        return out

    async def leader_next(
        self, topic: str, partition: int, seq: int, subject: str
    ) -> Record | None:
        """The first record at or after stream sequence ``seq`` on ``subject``, read from the
        stream leader (never a lagging replica); ``None`` if there is none."""
        stream = m.stream_name(self.namespace, topic, partition)
        get = functools.partial(self.conn.js.get_msg, stream, seq, subject, False, True)
        try:
            msg = await self.conn.retry(get, what="leader read")
        except nats.js.errors.NotFoundError:
            return None
        hdrs = dict(msg.headers or {})
        where = msg.subject or subject
        return record_of(topic, partition, int(msg.seq or 0) - 1, where, msg.data or b"", hdrs)

    def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of the last record with ``key`` (``None``: none), from the leader."""
        self.topics.check_partition(topic, partition)
        return self._bridge.run(self.head(topic, partition, key))

    async def key_head_async(self, topic: str, partition: int, key: bytes) -> int | None:
        """:meth:`key_head` on the caller's loop."""
        await self.topics.check_partition_async(topic, partition)
        return await self.head(topic, partition, key)

    async def head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The coroutine of :meth:`key_head` (the partition checked already)."""
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.key_token(key)}"
        return await self._key_head(topic, partition, subject)

    async def _key_head(self, topic: str, partition: int, subject: str) -> int | None:
        stream = m.stream_name(self.namespace, topic, partition)
        js = self.conn.js
        try:
            msg = await self.conn.retry(
                lambda: js.get_msg(stream, subject=subject), what="key head"
            )
        except nats.js.errors.NotFoundError:
            return None
        return int(msg.seq or 0) - 1

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp`` (a scan)."""
        if not _integer(timestamp):
            raise ConfigError(
                f"timestamp must be an integer (ms), got {timestamp!r}",
                topic=topic,
                partition=partition,
            )
        self.topics.check_partition(topic, partition)
        offset, _, _ = self._bridge.run(self.topics.state(topic, partition))
        while True:
            records, _ = self.read(topic, partition, offset)
            if not records:
                return None
            for r in records:
                if r.timestamp >= timestamp:
                    return r.offset
            offset = records[-1].offset + 1
