"""Sequential reads on JetStream: an ordered push consumer carried by a read's cursor.

A partition read sequentially (each read asking for the offset the last one ended at, the
same cursor handed back) is answered from an :class:`OrderedReader`: nats-py's ordered
consumer (R1, in memory, no acks, flow control) started at the asked offset, whose callback
decodes each message to a :class:`~eventlane.log.record.Record` into a buffer. The servers
push a partition's messages once, instead of answering a batched direct get per read
(issue 36 item 3: about half the servers' CPU a record). Any other read (another offset, a
first read, a reader that stalled or died) is answered by direct gets (:mod:`.read`) as
before, and the reader, if any, is dropped.

:class:`Position` is this engine's :data:`~eventlane.log.types.Cursor`: the stream, the
offset the next read should ask for, and the reader (if one runs). A reader is started only
for a read that continues where the cursor's last read stopped *short of the end*, or for
a first read passed :data:`~eventlane.log.types.SEQUENTIAL` (the free consumer's, so the
group member's) with :data:`MIN_BACKLOG` records ahead: a one-off read or a caught-up tail
costs no consumer.

Invariants (everything below runs on the bridge's loop, except :meth:`Position.drop`):

* Order and completeness: the buffer holds the partition's records from the reader's start
  offset, in stream order, each once: nats-py's ordered consumer checks the consumer
  sequence of every delivery and, on a gap or missed heartbeats, recreates its consumer
  from the last stream sequence + 1. That recreation is a *new consumer name* in the
  delivered messages' reply subjects; the reader then dies (it never mixes two consumers'
  deliveries, nor a stream deleted and recreated under it, whose sequence restarts).
* A read takes from the buffer only when it asks for the cursor's next offset, and returns
  records below ``min(HWM, upto)`` only (the HWM as :attr:`Topics.marks` last saw it, asked
  of the leader when the buffer holds records at or above it): the rest stays buffered.
  A non-compacted partition's first record must be the one asked (else the direct path
  decides: records removed by retention are an offset out of range); a compacted
  partition's gaps are accepted, as the direct path accepts them.
* A read waits on the buffer while the marks say records exist beyond it only as long as
  the reader delivers: :data:`WAIT_S` from the read's start or the reader's last delivery,
  :data:`MAX_WAIT_S` at most (a consumer whose server died is recreated by nats-py only
  after two missed 5 s heartbeats); it then drops the reader and reads directly.
* Bounded: a reader buffering :data:`MAX_RECORDS` records or :data:`MAX_BYTES` of values
  deletes its consumer (a member that stops polling stops the push) and starts a new one
  at the next offset once reads took the buffer below half.
* Released: a cursor dropped (garbage) or replaced deletes its reader's consumer
  (a finalizer), :meth:`Sequential.close` deletes every reader's (the log's ``close``); a
  killed process's consumer goes by the server's inactive threshold (5 s).
* A topic recreated under a reader (the registry's ``created_ms`` differs from the one the
  reader started with) drops it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.connection import Connection
from eventlane.log.jetstream.mapping import record_of
from eventlane.log.jetstream.topics import Topics
from eventlane.log.record import Record
from eventlane.log.types import SEQUENTIAL

MAX_RECORDS = 10_000
"""Records a reader buffers before it stops its consumer (about two reads' worth)."""

MAX_BYTES = 8 << 20
"""Bytes of values (and keys) a reader buffers before it stops its consumer."""

MIN_BACKLOG = 1_000
"""Records a first read marked :data:`~eventlane.log.types.SEQUENTIAL` must find ahead of
it to start a reader at once (fewer: direct gets, and a reader once a read stops short)."""

RECORD_OVERHEAD = 128
"""Bytes a record is counted for beyond its value when a read's ``max_bytes`` is filled
from the buffer: about its stored subject and headers, as a direct get counts them."""

WAIT_S = 0.2
"""How long a read waits for a reader to deliver what the marks say exists, from the
read's start or the reader's last delivery (a loaded machine delays a healthy one)."""

MAX_WAIT_S = 1.0
"""The longest a read waits for a reader that keeps delivering below the asked offset."""

BACKOFF_S = 1.0
"""After a reader was dropped as stalled (or could not start), reads of that cursor are
direct for this long before a new reader is started."""

HEARTBEAT_S = 5.0
"""The ordered consumer's idle heartbeat (nats-py's default)."""


class OrderedReader:
    """One partition's ordered consumer and its buffer of records (module docstring)."""

    def __init__(
        self,
        owner: Sequential,
        topic: str,
        partition: int,
        stream: str,
        created: int | None,
    ) -> None:
        self.owner = owner
        self.topic = topic
        self.partition = partition
        self.stream = stream
        self.created = created
        self.subject = m.subject_prefix(owner.conn.namespace, topic, partition) + ".*"
        self.buffer: collections.deque[Record] = collections.deque()
        self.bytes = 0
        self.covered = 0  # the offset after the last record delivered (its stream sequence)
        self.dead = False
        self.paused = False
        self.last = 0.0  # time.monotonic() of the last delivery
        self.arrived = asyncio.Event()
        self.sub: Any = None
        self.consumer: str | None = None
        self._token: object = None
        self._starting: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ the consumer
    async def start(self, offset: int) -> None:
        """Start the ordered consumer at ``offset`` (raises if it cannot be created)."""
        self.covered = offset
        await self._subscribe(offset)

    async def _subscribe(self, offset: int) -> None:
        conn = self.owner.conn
        token = self._token = object()
        config = ConsumerConfig(  # nats-py's ordered consumer (js.subscribe), made public
            deliver_subject=conn.nc.new_inbox(),
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=offset + 1,
            filter_subject=self.subject,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            ack_wait=22 * 3600,
            flow_control=True,
            idle_heartbeat=HEARTBEAT_S,
            num_replicas=1,
            mem_storage=True,
        )

        async def on_msg(msg: Msg) -> None:
            if self._token is token:
                self._deliver(msg)

        async with asyncio.timeout(conn.attempt_s):
            info = await conn.js.add_consumer(self.stream, config=config)
        if self._token is not token:  # stopped or paused meanwhile
            with contextlib.suppress(Exception):
                await conn.js.delete_consumer(self.stream, info.name)
            return
        self.consumer = info.name
        self.sub = await conn.js.subscribe_bind(
            self.stream, config, info.name, cb=on_msg, ordered_consumer=True
        )

    def _deliver(self, msg: Msg) -> None:
        """The subscription's callback: one message to the buffer (module docstring)."""
        if self.dead or self.paused:
            return
        reply = msg.reply
        tokens = reply.split(".")
        if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ns>.<n>
            consumer, seq, stamp = tokens[3], int(tokens[5]), int(tokens[7])
        else:  # the domain form
            meta = Msg.Metadata._from_reply(reply)
            consumer, seq = meta.consumer, meta.sequence.stream
            stamp = int(meta.timestamp.timestamp() * 1e9)
        if consumer != self.consumer:
            self._die()  # nats-py recreated the consumer: not ours to trust (docstring)
            return
        if seq <= self.covered:
            return  # already delivered (never, with an ordered consumer)
        hdrs = msg.headers or {}
        data = msg.data
        self.buffer.append(
            record_of(self.topic, self.partition, seq - 1, msg.subject, data, hdrs, stamp)
        )
        self.covered = seq
        self.last = time.monotonic()
        self.bytes += len(data)
        if len(self.buffer) >= MAX_RECORDS or self.bytes >= MAX_BYTES:
            self._pause()
        self.arrived.set()

    def _pause(self) -> None:
        self.owner.pauses += 1
        self.paused = True
        self._token = None
        asyncio.get_running_loop().create_task(self._unsubscribe())

    def _resume(self) -> None:
        self.paused = False
        self._starting = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        try:
            await self._subscribe(self.covered)
        except Exception:  # the next reads that find the buffer empty drop the reader
            self._die()

    def _die(self) -> None:
        self.dead = True
        self._token = None
        self.arrived.set()

    async def _unsubscribe(self) -> None:
        sub, name = self.sub, self.consumer
        self.sub = self.consumer = None
        js = self.owner.conn.js
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if name is not None:
            with contextlib.suppress(Exception, TimeoutError):
                async with asyncio.timeout(self.owner.conn.attempt_s):
                    await js.delete_consumer(self.stream, name)

    async def stop(self) -> None:
        """Delete the consumer and forget the buffer (idempotent)."""
        self.owner.readers.discard(self)
        self._die()
        self.buffer.clear()
        self.bytes = 0
        if self._starting is not None and not self._starting.done():
            with contextlib.suppress(BaseException):
                await self._starting
        await self._unsubscribe()

    # ------------------------------------------------------------------ reads
    async def take(
        self, offset: int, max_bytes: int, upto: int | None, compacted: bool
    ) -> list[Record] | None:
        """Records from ``offset`` (the cursor's next), or ``None``: read directly."""
        start = time.monotonic()
        topics = self.owner.topics
        refreshed = False
        while True:
            if self.dead:
                return None
            buffer = self.buffer
            if buffer:
                first = buffer[0].offset
                if first != offset and (first < offset or not compacted):
                    return None  # records removed below it: the direct path decides
                end = self._end(upto)
                if first >= end:
                    if upto is not None and first >= upto:
                        return []
                    if refreshed:
                        return []  # delivered, not below the leader's HWM yet (a batch)
                    await topics.state(self.topic, self.partition)
                    refreshed = True
                    continue
                return self._pop(end, max_bytes)
            # nothing buffered: is there anything at or after ``offset``?
            if upto is not None and offset >= upto:
                return None  # the direct path checks the range
            if self._end(None) <= max(offset, self.covered) and not refreshed:
                await topics.state(self.topic, self.partition)  # the leader's marks
                refreshed = True
            hwm = self._end(None)
            if hwm <= max(offset, self.covered):
                return [] if hwm >= offset else None  # caught up (or out of range)
            due = min(start + MAX_WAIT_S, max(start, self.last) + WAIT_S)
            left = due - time.monotonic()
            if left <= 0:
                return None  # stalled: drop it (a failover) and read directly
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.arrived.wait()

    def _end(self, upto: int | None) -> int:
        known = self.owner.topics.marks.get(self.stream)
        hwm = known[1] if known is not None else 0
        return hwm if upto is None else min(hwm, upto)

    def _pop(self, end: int, max_bytes: int) -> list[Record]:
        """Buffered records below ``end``, about ``max_bytes`` (at least one)."""
        buffer = self.buffer
        out: list[Record] = []
        size = 0
        while buffer and buffer[0].offset < end and (not out or size < max_bytes):
            r = buffer.popleft()
            size += len(r.value or b"") + RECORD_OVERHEAD
            out.append(r)
        self.bytes = max(0, self.bytes - size + RECORD_OVERHEAD * len(out))
        if (
            self.paused
            and not self.dead
            and len(buffer) <= MAX_RECORDS // 2
            and (self.bytes <= MAX_BYTES // 2)
        ):
            self._resume()
        return out


class Position:
    """The JetStream engine's read cursor: where the next read should start, and the reader
    carried for it (module docstring). Opaque to callers; dropping it stops the reader."""

    __slots__ = ("__weakref__", "_release", "more", "next", "not_before", "reader", "stream")

    def __init__(self, stream: str, next_offset: int) -> None:
        self.stream = stream
        self.next = next_offset
        self.more = False  # the last direct read stopped short of the end
        self.not_before = 0.0  # monotonic time before which no reader is started
        self.reader: OrderedReader | None = None
        self._release: weakref.finalize | None = None  # type: ignore[type-arg]

    def attach(self, reader: OrderedReader) -> None:
        self.reader = reader
        self._release = weakref.finalize(self, reader.owner.release, reader)
        self._release.atexit = False

    def drop(self) -> None:
        """Stop the reader (if any): its consumer is deleted on the loop."""
        release, self._release, self.reader = self._release, None, None
        if release is not None:
            release()


class Sequential:
    """The readers of one log (module docstring): started, released, closed."""

    def __init__(self, conn: Connection, topics: Topics) -> None:
        self.conn = conn
        self.topics = topics
        self.readers: set[OrderedReader] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        # what tests and benchmarks look at: reads a reader answered, reads answered by
        # direct gets, times a reader stopped its consumer at the buffer's bound
        self.served = self.direct = self.pauses = 0

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        upto: int | None,
        compacted: bool,
        created: int | None,
        cursor: object,
        direct: Callable[[int], Awaitable[list[Record]]],
    ) -> tuple[list[Record], Position]:
        """A read through ``cursor``'s reader when it can answer, else ``direct`` (the
        coroutine function of a direct read: ``direct(offset)`` -> records)."""
        self.loop = asyncio.get_running_loop()
        stream = m.stream_name(self.conn.namespace, topic, partition)
        pos = cursor if isinstance(cursor, Position) and cursor.stream == stream else None
        if pos is not None and pos.next != offset:
            pos.drop()  # another offset than the last read's end: a seek
            pos.more = False
        if pos is None:
            pos = Position(stream, offset)
            if cursor is SEQUENTIAL:  # a consumer's first read: a backlog gets a reader
                known = self.topics.marks.get(stream)
                if known is None or known[1] <= offset:
                    await self.topics.state(topic, partition)
                pos.more = self._end(stream, upto) - offset >= MIN_BACKLOG
        pos.next = offset
        reader = pos.reader
        if reader is not None and (reader.dead or reader.created != created):
            pos.drop()
            reader = None
        if reader is None and pos.more and time.monotonic() >= pos.not_before:
            reader = await self._start(topic, partition, stream, offset, created)
            if reader is None:
                pos.not_before = time.monotonic() + BACKOFF_S
            else:
                pos.attach(reader)
        if reader is not None:
            got = await reader.take(offset, max_bytes, upto, compacted)
            if got is not None:
                self.served += 1
                if got:
                    pos.next = got[-1].offset + 1
                return got, pos
        records: list[Record] = await direct(offset)
        self.direct += 1
        if records:
            if reader is not None:  # it could not answer what exists: stalled or behind
                pos.drop()
                pos.not_before = time.monotonic() + BACKOFF_S
            pos.next = records[-1].offset + 1
            pos.more = pos.next < self._end(stream, upto)
        return records, pos

    def _end(self, stream: str, upto: int | None) -> int:
        known = self.topics.marks.get(stream)
        hwm = known[1] if known is not None else 0
        return hwm if upto is None else min(hwm, upto)

    async def _start(
        self, topic: str, partition: int, stream: str, offset: int, created: int | None
    ) -> OrderedReader | None:
        reader = OrderedReader(self, topic, partition, stream, created)
        self.readers.add(reader)
        try:
            await reader.start(offset)
        except (nats.errors.Error, TimeoutError, OSError):
            await reader.stop()
            return None
        return reader

    def release(self, reader: OrderedReader) -> None:
        """Stop ``reader`` from any thread (a cursor's finalizer): on the loop, later."""
        loop = self.loop
        if loop is None:
            self.readers.discard(reader)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: close() stopped it
            loop.call_soon_threadsafe(lambda: loop.create_task(reader.stop()))

    async def close(self) -> None:
        """Stop every reader (the log is closing)."""
        readers = list(self.readers)
        if readers:
            await asyncio.gather(*(r.stop() for r in readers), return_exceptions=True)
