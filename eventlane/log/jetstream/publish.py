"""Appends on JetStream: encoding, message ids, acks, retries and outcomes.

Rules (each a test in tests/jetstream):

* A single-record append carries a ``Nats-Msg-Id`` (``<16 hex of the log><counter>``), so a
  retried publish is de-duplicated by the server (duplicate window 2 minutes): a record
  acknowledged once is stored once. It is first published with a reply subject under one
  subscription of the log (:meth:`Publisher._send_pubs`: no request future, timer or task
  per append); anything but an ack or a refusal (no responders, a transient error, no ack
  within ``attempt_s``) hands it to the retrying ``js.publish`` path
  (:meth:`Publisher._republish`) with the same headers and message id.
* Several records go out as JetStream atomic batches (:data:`MAX_BATCH_RECORDS`,
  :data:`MAX_BATCH_BYTES`): all of a batch or none. A batch has no message id, so one whose
  answer is lost is :class:`~eventlane.errors.OutcomeUnknownError`, never sent again.
* ``expect`` is checked by the server (``Nats-Expected-Last-Subject-Sequence``); a refusal
  is a :class:`~eventlane.errors.ConcurrencyError` only once the leader shows that our own
  copy is not stored (a stale ex-leader's refusal can arrive first while the real leader
  stored it): a retried conditional publish may be refused by *its own first copy*.
* An outcome that cannot be told is :class:`~eventlane.errors.OutcomeUnknownError`, never
  reported as refused or done.

Invariants: the table of publishes awaiting their acks (``_acks``, oldest first) and its
sweep timer are touched only on the loop. Every publish in it ends exactly once: settled by
its ack, or removed by the sweep and handed to the retrying path, which settles it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import uuid
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
import orjson

from eventlane import _plans
from eventlane.errors import (
    ConcurrencyError,
    FrameworkError,
    InvalidRecordError,
    OutcomeUnknownError,
    RecordTooLargeError,
)
from eventlane.log.config import TopicConfig
from eventlane.log.jetstream import errors as e
from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.bridge import Bridge, Call
from eventlane.log.jetstream.connection import Connection
from eventlane.log.jetstream.topics import Topics
from eventlane.log.jetstream.wakeups import Wakeups
from eventlane.log.types import AppendResult, Clock, Expect, RecordTuple
from eventlane.metrics import M, appended, publish_failed

MAX_BATCH_RECORDS = 1000  # JetStream's limit of messages in one atomic batch
MAX_BATCH_BYTES = 1 << 20  # as the embedded log: one atomic append is at most 1 MiB

Msg = tuple[str, bytes, dict[str, str]]  # (subject, payload, headers)


def size_of(msgs: list[Msg]) -> int:
    return sum(len(payload) for _, payload, _ in msgs)


def encode(
    prefix: str,
    cfg: TopicConfig,
    records: Sequence[RecordTuple],
    now: int,
    topic: str,
    partition: int,
) -> list[Msg]:
    """``records`` as messages under the partition's subject ``prefix`` (checked as the
    embedded log checks them: shape, keys of compacted topics, types, size)."""
    if not records:
        raise InvalidRecordError(
            "append needs at least one record", topic=topic, partition=partition
        )
    msgs = []
    for i, rec in enumerate(records):
        try:
            key, value, headers, ts = rec
        except (TypeError, ValueError):
            raise InvalidRecordError(
                f"record {i} must be (key, value, headers, timestamp)",
                topic=topic,
                partition=partition,
            ) from None
        if cfg.compact and key is None:
            raise InvalidRecordError(
                f"record {i} has no key; a compacted topic needs a key on every record",
                topic=topic,
                partition=partition,
            )
        if (key is not None and not isinstance(key, bytes)) or (
            value is not None and not isinstance(value, bytes)
        ):
            raise InvalidRecordError(
                f"record {i}: key and value must be bytes or None",
                topic=topic,
                partition=partition,
            )
        size = (
            len(key or b"")
            + len(value or b"")
            + sum(len(n.encode()) + len(v or b"") for n, v in headers)
        )
        if size > cfg.max_record_bytes:
            raise RecordTooLargeError(
                f"record {i} is {size} bytes; max_record_bytes is {cfg.max_record_bytes}",
                topic=topic,
                partition=partition,
            )
        stamp = now if ts is None or cfg.log_append_time else ts
        hdrs = m.encode_headers(key, value, tuple(headers), stamp, cfg.log_append_time)
        msgs.append((f"{prefix}.{m.key_token(key)}", value or b"", hdrs))
    return msgs


def conflict(exc: ConcurrencyError, expect: Expect, topic: str, partition: int) -> ConcurrencyError:
    """The server refused an expected-sequence header: ``ConcurrencyError`` for an
    :class:`Expect` (offsets: ``expected`` = ``last_offset`` or -1 for "none yet", ``actual`` =
    the key's last offset as the server saw it, -1 if none, when it says)."""
    return ConcurrencyError(
        f"key {expect.key!r} moved on",
        expected=-1 if expect.last_offset is None else expect.last_offset,
        actual=-1 if exc.actual is None else exc.actual,
        topic=topic,
        partition=partition,
    )


class Io(NamedTuple):
    """A request of the append plan: a coroutine to run on the log's loop (``call``: the
    same work as a :class:`Call`, for a concurrent thread; ``write``: its outcome may be
    unknown when no answer comes)."""

    coro: Coroutine[Any, Any, Any]
    call: Call | None = None
    write: bool = False


class Sleep(NamedTuple):
    """A request of the append plan: wait ``seconds``."""

    seconds: float


Step = Io | Sleep


class Publisher:
    """Appends of one log (module docstring). ``key_head(topic, partition, key)`` reads a
    key's last offset from the leader (a conflict's loser waits until the winner shows)."""

    def __init__(
        self,
        conn: Connection,
        bridge: Bridge | None,
        topics: Topics,
        wakeups: Wakeups,
        clock: Clock,
        key_head: Callable[[str, int, bytes], Coroutine[Any, Any, int | None]],
    ) -> None:
        self.conn = conn
        self.bridge = bridge  # None: the asyncio face (no thread calls it)
        self.topics = topics
        self.wakeups = wakeups
        self.clock = clock
        self.key_head = key_head
        self.namespace = conn.namespace
        self._msg_ids = itertools.count()
        self._msg_id_prefix = uuid.uuid4().hex[:16]
        self._acks: dict[str, Call] = {}  # reply token -> publish awaiting its ack, oldest first
        self._ack_ids = itertools.count()
        self._sweep: asyncio.TimerHandle | None = None  # expires acks overdue (_expire)
        self.ack_prefix = ""
        self._tasks: set[asyncio.Task[None]] = set()  # background publishes (on the loop)

    async def start(self) -> None:
        """Subscribe to the acks of this log's single-record publishes (on the loop)."""
        self.ack_prefix = self.conn.nc.new_inbox() + "."
        await self.conn.nc.subscribe(self.ack_prefix + "*", cb=self._on_ack)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task of the running loop, held until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def next_msg_id(self) -> str:
        return f"{self._msg_id_prefix}{next(self._msg_ids)}"

    # ------------------------------------------------------------------ the port's append
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
        """See :meth:`eventlane.log.jetstream.log.JetStreamLog.append` (:meth:`plan`
        driven from a thread: each step through the bridge)."""
        bridge = self.bridge
        assert bridge is not None, "the asyncio face appends with append_async"
        cfg = self.topics.check_partition(topic, partition).config
        plan = self.plan(topic, partition, cfg, records, expect, atomic, precondition)

        def perform(step: Step) -> Any:
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                return None
            return bridge.run(
                step.coro, step.call, topic=topic, partition=partition, write=step.write
            )

        return _plans.drive(plan, perform)

    async def append_async(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
        precondition: Callable[[int], None] | None = None,
    ) -> AppendResult:
        """:meth:`append` on the caller's event loop (:meth:`plan` awaited in place)."""
        cfg = (await self.topics.check_partition_async(topic, partition)).config
        plan = self.plan(topic, partition, cfg, records, expect, atomic, precondition)

        async def perform(step: Step) -> Any:
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                return None
            try:
                return await step.coro
            except FrameworkError:
                raise
            except (nats.errors.Error, TimeoutError) as exc:
                raise e.translate(exc, topic=topic, partition=partition, write=step.write) from exc

        return await _plans.drive_async(plan, perform)

    def plan(
        self,
        topic: str,
        partition: int,
        cfg: TopicConfig,
        records: Sequence[RecordTuple],
        expect: Expect | None,
        atomic: bool,
        precondition: Callable[[int], None] | None,
    ) -> Generator[Step, Any, AppendResult]:
        """The append, sans I/O: it yields each request (:class:`Io`, :class:`Sleep`) and
        is sent its result, or thrown its error as eventlane's (a refused expectation is a
        :class:`ConcurrencyError`). Driven from threads by :meth:`append` and on an event
        loop by :meth:`append_async`: one copy of the rules (module docstring)."""
        begun = time.perf_counter() if M.on else 0.0
        prefix = m.subject_prefix(self.namespace, topic, partition)
        msgs = encode(prefix, cfg, records, self.clock(), topic, partition)
        if atomic and (len(msgs) > MAX_BATCH_RECORDS or size_of(msgs) > MAX_BATCH_BYTES):
            raise RecordTooLargeError(
                f"atomic append of {len(msgs)} records ({size_of(msgs)} bytes) exceeds one"
                f" batch ({MAX_BATCH_RECORDS} records, {MAX_BATCH_BYTES} bytes)",
                topic=topic,
                partition=partition,
            )
        extra: dict[str, str] = {}
        if expect is not None:
            last = 0 if expect.last_offset is None else expect.last_offset + 1
            extra = {"Nats-Expected-Last-Subject-Sequence": str(last)}
            if expect.key != records[0][0]:  # (else the first record's subject is the key's)
                subject = f"{prefix}.{m.key_token(expect.key)}"
                if subject != msgs[0][0]:
                    extra["Nats-Expected-Last-Subject-Sequence-Subject"] = subject
        while True:
            if precondition is not None:
                _, hwm, _ = yield Io(self.topics.state(topic, partition))
                precondition(hwm)
                extra["Nats-Expected-Last-Sequence"] = str(hwm)
            msg_id = self.next_msg_id()
            sent = time.perf_counter() if M.on else 0.0
            try:
                if len(msgs) == 1:
                    subject, payload, hdrs = msgs[0]
                    headers = {**hdrs, **extra, "Nats-Msg-Id": msg_id}
                    call = Call(None, (topic, partition, subject, payload, headers))
                    seqs = [(yield Io(self._publish_call(call), call, write=True))]
                else:
                    seqs = yield Io(self.publish(topic, msgs, extra), write=True)
                break
            except ConcurrencyError as exc:  # a refused expected sequence (see .errors)
                if expect is not None:
                    yield from self._await_visible(topic, partition, expect)
                if len(msgs) == 1:
                    # a refusal is believed only once the stream leader shows no copy of
                    # ours: the one that arrived first can be a stale ex-leader's while the
                    # real leader stored it (seen by the partition soak)
                    find = self._find_copy(
                        topic, partition, msgs[0][0], {**extra, "Nats-Msg-Id": msg_id}
                    )
                    if mine := (yield Io(find)):
                        seqs = [mine]  # the refusal came from a stale replica: ours is stored
                        break
                if M.on:
                    publish_failed(exc)
                if expect is None:
                    continue  # only the end moved: ask the precondition again
                raise conflict(exc, expect, topic, partition) from None
            except FrameworkError as exc:
                if M.on:
                    publish_failed(exc)
                raise
        if M.on:
            M.publish_seconds.observe(time.perf_counter() - sent)
            appended(topic, len(msgs), size_of(msgs), time.perf_counter() - begun)
        self.topics.appended(topic, partition, seqs[-1])
        result = AppendResult(seqs[0] - 1, seqs[-1] - 1, [int(h[m.H_TS]) for _, _, h in msgs])
        self.wakeups.bump()
        return result

    def _await_visible(
        self, topic: str, partition: int, expect: Expect
    ) -> Generator[Step, Any, None]:
        """Wait (up to 2 s) until the write that beat ours is readable at the leader: the
        leader checks expectations against writes it has accepted but not yet applied, and
        a loser that reloads at once must see the winner (as on the embedded log)."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if (yield Io(self.key_head(topic, partition, expect.key))) != expect.last_offset:
                return
            yield Sleep(0.005)

    # ------------------------------------------------------------------ single records
    async def _publish_call(self, call: Call) -> int:
        """``call``'s publish, for a caller running the loop itself."""
        call.future = asyncio.get_running_loop().create_future()
        await self._send_pubs([call])
        await call.future
        if call.error is not None:
            raise call.error
        seq: int = call.result
        return seq

    def start_pubs(self, calls: list[Call]) -> None:
        """The bridge's hook: publish the single records queued by concurrent callers."""
        self._spawn(self._send_pubs(calls))

    async def _send_pubs(self, calls: list[Call]) -> None:
        """Publish single records (after the owed wake message), all before any ack.

        A lighter ``js.publish``: each goes out with a reply subject under one subscription
        of the log (:meth:`_on_ack` settles it), no request future, timer or task of its own.
        Anything but a plain ack or refusal (no responders, a transient API error, no ack
        within ``attempt_s``: see :meth:`_expire`, a publish error) hands the call to
        :meth:`_republish`, the retrying path, with the same ``Nats-Msg-Id`` (a record
        stored by the first try is not stored twice)."""
        await self.wakeups.pay_now()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.conn.attempt_s
        nc = self.conn.nc
        for call in calls:
            assert call.pub is not None
            _, _, subject, payload, headers = call.pub
            token = str(next(self._ack_ids))
            call.deadline = deadline
            self._acks[token] = call
            try:
                await nc.publish(subject, payload, reply=self.ack_prefix + token, headers=headers)
            except Exception:  # closed, reconnecting, too large: the retrying path decides
                del self._acks[token]  # (not sent: nats-py raises before buffering it)
                self._spawn(self._republish(call, sent=False))
        if self._acks and self._sweep is None:
            self._sweep = loop.call_at(deadline, self._expire)

    async def _on_ack(self, msg: Any) -> None:
        """A publish's ack (or refusal), on the log's reply subscription."""
        call = self._acks.pop(msg.subject.rpartition(".")[2], None)
        if call is None:  # acked after it was handed to the retrying path
            return
        if (msg.headers or {}).get("Status") == "503":  # no responders: no stream, election
            self._spawn(self._republish(call, sent=False))
            return
        try:
            body = orjson.loads(msg.data)
            if "error" not in body:
                self.wakeups.owe()
                if call.future is None and self.bridge is not None:  # a thread: back soon
                    self.bridge.answered()  # (a train, see the bridge)
                call.settle(int(body["seq"]), None)
                return
            nats.js.errors.APIError.from_error(body["error"])  # raises it
        except nats.js.errors.APIError as exc:
            if e.retry_api_error(exc):
                self._spawn(self._republish(call, sent=e.maybe_stored(exc)))
            else:
                call.settle(None, exc)
        except Exception as exc:  # not an ack: what became of the append is not known
            assert call.pub is not None
            topic, partition = call.pub[0], call.pub[1]
            unknown = OutcomeUnknownError(
                f"JetStream answered an append with {msg.data!r} ({exc}); it may or may not"
                " be stored",
                topic=topic,
                partition=partition,
            )
            call.settle(None, unknown)

    def _expire(self) -> None:
        """Hand publishes without an ack by their deadline to the retrying path (a timer,
        re-armed for the oldest publish still waiting)."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._acks:
            token, call = next(iter(self._acks.items()))
            if call.deadline > now:
                self._sweep = loop.call_at(call.deadline, self._expire)
                return
            del self._acks[token]
            self._spawn(self._republish(call, sent=True))

    async def _republish(self, call: Call, *, sent: bool) -> None:
        """``call``'s publish by ``js.publish`` under the retry rule (same headers, so a
        copy stored by an earlier try is answered as a duplicate, not stored twice).
        ``sent``: the first try may have been stored (it went out and got no answer), so
        running out of time is :class:`OutcomeUnknownError`, not "unavailable".

        A conditional publish whose earlier try may have been stored can be refused with
        "wrong last sequence" by *its own first copy* (a leader that changed meanwhile does
        not always answer it as a duplicate): the refusal is then checked against the
        partition (:meth:`_own_copy`) and is a success if the copy is there, "unknown" if it
        cannot be told, and a conflict only when no try may have been stored."""
        assert call.pub is not None
        topic, partition, subject, payload, headers = call.pub
        maybe = sent
        js, attempt_s = self.conn.js, self.conn.attempt_s

        async def publish() -> Any:
            nonlocal maybe
            try:
                return await js.publish(subject, payload, timeout=attempt_s, headers=headers)
            except Exception as exc:
                maybe = maybe or e.maybe_stored(exc)
                raise

        try:
            try:
                ack = await self.conn.retry(
                    publish, what="append", topic=topic, partition=partition, write=True, sent=sent
                )
                seq = int(ack.seq)
            except nats.js.errors.APIError as exc:
                refused = (getattr(exc, "description", None) or "").startswith("wrong last")
                if not (maybe and refused):
                    raise
                seq = await self._own_copy(topic, partition, subject, headers)
        except BaseException as exc:
            call.settle(None, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.wakeups.owe()
        call.settle(seq, None)

    async def _find_copy(
        self, topic: str, partition: int, subject: str, headers: dict[str, str]
    ) -> int | None:
        """The stream sequence of the stored copy of the publish with ``headers``' message
        id, looked up on the stream leader among the records of ``subject`` after the
        expected sequence; ``None`` if there is none (yet)."""
        msg_id = headers["Nats-Msg-Id"]
        expected = headers.get("Nats-Expected-Last-Subject-Sequence") or headers.get(
            "Nats-Expected-Last-Sequence"
        )
        seq = int(expected) + 1 if expected is not None else 1
        stream = m.stream_name(self.namespace, topic, partition)
        js = self.conn.js
        for _ in range(64):
            get = functools.partial(js.get_msg, stream, seq, subject, False, True)
            try:
                msg = await self.conn.retry(
                    get, what="leader read", topic=topic, partition=partition
                )
            except nats.js.errors.NotFoundError:
                break
            if (msg.headers or {}).get("Nats-Msg-Id") == msg_id:
                return int(msg.seq or 0)
            seq = int(msg.seq or 0) + 1
        return None

    async def _own_copy(
        self, topic: str, partition: int, subject: str, headers: dict[str, str]
    ) -> int:
        """:meth:`_find_copy`, or :class:`OutcomeUnknownError` if there is none: a first copy
        may still be in flight at a leader that lost its quorum."""
        found = await self._find_copy(topic, partition, subject, headers)
        if found is not None:
            return found
        raise OutcomeUnknownError(
            "a retried conditional append was refused and its first copy is not (yet) in the"
            " partition: it may or may not be stored",
            topic=topic,
            partition=partition,
        )

    # ------------------------------------------------------------------ batches
    async def publish(self, topic: str, msgs: list[Msg], extra: dict[str, str]) -> list[int]:
        """Publish and return the stream sequences of ``msgs``; the wake message for tailing
        readers is then owed (see :mod:`.wakeups`)."""
        await self.wakeups.pay_now()  # the previous append's, in this request's write
        seqs = await self.publish_only(topic, msgs, extra)
        self.wakeups.owe()
        return seqs

    async def publish_only(self, topic: str, msgs: list[Msg], extra: dict[str, str]) -> list[int]:
        """Publish ``msgs`` (one record under a message id, more as atomic batches of at
        most :data:`MAX_BATCH_RECORDS` / :data:`MAX_BATCH_BYTES`, ``extra`` headers on the
        first); no wake message."""
        conn = self.conn
        if len(msgs) == 1:
            subject, payload, hdrs = msgs[0]
            headers = {**hdrs, **extra, "Nats-Msg-Id": self.next_msg_id()}
            ack = await conn.retry(
                lambda: conn.js.publish(subject, payload, timeout=conn.attempt_s, headers=headers),
                what="append",
                topic=topic,
                write=True,
            )
            return [ack.seq]
        seqs: list[int] = []
        start, first = 0, True
        while start < len(msgs):
            end, size = start, 0
            while end < len(msgs) and end - start < MAX_BATCH_RECORDS:
                size += len(msgs[end][1]) + 64
                if size > MAX_BATCH_BYTES and end > start:
                    break
                end += 1
            piece, head = msgs[start:end], extra if first else {}
            last = await conn.retry(
                functools.partial(self.batch, piece, head), what="append", topic=topic, write=True
            )
            seqs.extend(range(last - (end - start) + 1, last + 1))
            start, first = end, False
        return seqs

    async def batch(self, msgs: list[Msg], extra: dict[str, str]) -> int:
        """One JetStream atomic batch: all of ``msgs`` or none; returns the last sequence.

        "No responders" means nobody took it (safe to retry); no answer in time, or a
        connection lost once any of it left, means the outcome is unknown: raised as
        :class:`OutcomeUnknownError`, never retried blindly (a batch has no message id).
        """
        try:
            async with asyncio.timeout(2 * self.conn.timeout):
                return await self._batch_once(msgs, extra)
        except (nats.errors.NoRespondersError, nats.js.errors.APIError):
            raise  # nobody took it / a refusal: nothing stored
        except (*e.TRANSIENT, nats.errors.Error) as exc:
            raise OutcomeUnknownError(
                f"atomic append: no answer from the cluster ({exc!r}); it may or may not have"
                " been stored"
            ) from exc

    async def _batch_once(self, msgs: list[Msg], extra: dict[str, str]) -> int:
        nc = self.conn.nc
        batch_id = uuid.uuid4().hex
        for i, (subject, payload, hdrs) in enumerate(msgs[:-1]):
            headers = {**hdrs, "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i + 1)}
            if i == 0:
                headers.update(extra)
            await nc.publish(subject, payload, headers=headers)
        subject, payload, hdrs = msgs[-1]
        headers = {
            **hdrs,
            "Nats-Batch-Id": batch_id,
            "Nats-Batch-Sequence": str(len(msgs)),
            "Nats-Batch-Commit": "1",
        }
        if len(msgs) == 1:
            headers.update(extra)
        reply = await nc.request(subject, payload, headers=headers, timeout=self.conn.timeout)
        body = orjson.loads(reply.data)
        if "error" in body:
            raise nats.js.errors.APIError.from_error(body["error"])
        return int(body["seq"])
