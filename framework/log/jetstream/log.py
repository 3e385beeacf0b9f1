"""``JetStreamLog``: the log port on a replicated NATS JetStream cluster (bytes only).

Mapping (see :mod:`.mapping` and docs/scale-out.md): one R=3 file stream per topic
partition, offset = stream sequence - 1, LWM = ``first_seq - 1``, HWM = LEO = ``last_seq``
(an acknowledged publish is on a majority and, with ``sync_interval: always``, fsynced).
Topic metadata (partition count and :class:`TopicConfig`) lives in the replicated KV bucket
``<ns>-topics``; ``describe`` reads it back. Retention maps to stream limits (``max_age``,
``max_bytes``), compaction to ``max_msgs_per_subject=1`` plus a tombstone purge after
``delete.retention.ms`` in :meth:`JetStreamLog.compact`.

Threads: nats-py is asyncio; each ``JetStreamLog`` has one event loop, run by whichever
thread needs it. A lone caller (no other thread inside the log, none in the last
:data:`IDLE_HANDBACK_S`, and no event loop of its own running) runs its coroutine on the
loop *in its own thread*: no hop to another thread and back per call, which on a loaded
machine can cost more than the replicated append itself. Concurrent callers submit their
coroutines to the loop and wait for their results, while the log's own daemon thread runs
the loop for them all (the loop is not handed from caller to caller). That thread also runs
the loop after :data:`IDLE_HANDBACK_S` without any caller, so subscriptions (the wake
subject), pings and reconnects are served while the process calls nothing; a lone caller
arriving then stops it and takes the loop over.
A concurrent caller queues its call (one wake-up of the loop for everything queued before the
loop looks) and blocks on a lock of its own that the loop releases with the result: no
``concurrent.futures.Future``, ``Event`` or closure per call. The loop starts everything
queued in one pass, so the requests of several callers leave in one socket write.
The object may be shared by threads; it must not be shared across ``fork()``.

Reads use batched direct gets, which any replica may answer; a replica can lag the leader
by a few milliseconds, so reads first learn the leader's ``last_seq`` and re-ask until the
answer reaches it (bounded), which keeps read-your-writes.

Transient cluster errors (no leader during an election, timeouts, reconnects) are retried
for up to ``retry_s`` seconds. Single-record appends carry a ``Nats-Msg-Id`` so a retried
publish is de-duplicated by the server (duplicate window 2 minutes): a record acknowledged
once is stored once. A single-record append is first published with a reply subject under
one subscription of the log (no request future, timer or task per append); anything but an
ack or a refusal (no responders, a transient error, no ack within ``timeout``) hands it to
the retrying ``js.publish`` path with the same headers and message id.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import itertools
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qs, urlsplit

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.kv import KeyValue

from framework.errors import (
    ConcurrencyError,
    ConfigError,
    FrameworkError,
    InvalidRecordError,
    LogError,
    LogUnavailableError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from framework.log.config import TopicConfig, altered_partitions, new_topic_config
from framework.log.jetstream import errors as e
from framework.log.jetstream import mapping as m
from framework.log.local import LocalDir, default_data_dir
from framework.log.names import validate_topic_name
from framework.log.record import Record, TimestampType
from framework.log.types import (
    AppendResult,
    Clock,
    CompactionReport,
    Cursor,
    Expect,
    KeyIndexReport,
    PartitionDescription,
    PartitionOffsets,
    Progress,
    RecordTuple,
    RetentionReport,
    TopicDescription,
    wall_clock_ms,
)
from framework.observability import get_logger

log = get_logger("eventlane.log")

T = TypeVar("T")
MAX_BATCH_RECORDS = 1000  # JetStream's limit of messages in one atomic batch
MAX_BATCH_BYTES = 1 << 20  # as the embedded log: one atomic append is at most 1 MiB
_META_TTL_S = 0.5
_META_BACKOFF_S = 5.0  # a topic's cached metadata is used this long when the registry is out
_NO_STREAM = (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)
_TRANSIENT = e.TRANSIENT

PING_INTERVAL_S = 1.0
"""Client-side failure detection: a PING every second, and the connection is declared stale
(and re-made to another server) after :data:`MAX_OUTSTANDING_PINGS` go unanswered, so a
server cut off from this client costs about 3 s, not nats-py's default two minutes."""

MAX_OUTSTANDING_PINGS = 2

DIRECT_TRIES = 3
"""Direct gets that time out (a replica cut off or frozen) before a read asks the leader."""


IDLE_HANDBACK_S = 0.01
"""Seconds without any caller after which the log's own thread runs the event loop."""

TRAIN_HOLD_S = 0.001
"""At most this long the loop holds calls queued by concurrent callers while callers whose
appends it just acknowledged have not queued their next call yet (see ``_drain``)."""


class _GaveUpError(Exception):
    """The backstop fired: a call did not finish in time (raised as eventlane's by _run)."""


class _Waiter:
    """A lone thread waiting for its call's result or for the loop, to take it over."""

    __slots__ = ("event", "future", "takes_over")

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self.event = threading.Event()
        self.future = future
        self.takes_over = True

    def done(self) -> bool:
        return self.future.done()


class _Call:
    """A call a concurrent caller submitted to the loop (see ``JetStreamLog._call``): a
    coroutine, or (``coro`` None) a single-record publish ``pub`` (see ``_send_pubs``).

    ``lock`` is held from creation and released exactly once, by :meth:`settle` on the loop
    once ``result`` or ``error`` is set: the caller waits by acquiring it (one futex wake,
    no ``concurrent.futures.Future``, ``Event`` or callback closure per call). A publish
    driven by its own caller's loop (``future`` set) is finished through ``future`` instead.
    """

    __slots__ = (
        "abandoned",
        "coro",
        "deadline",
        "error",
        "finished",
        "future",
        "lock",
        "pub",
        "result",
        "task",
    )
    takes_over = False

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any] | None,
        pub: tuple[str, int, str, bytes, dict[str, str]] | None = None,
    ) -> None:
        self.coro = coro
        self.pub = pub  # (topic, partition, subject, payload, headers with Nats-Msg-Id)
        self.lock = threading.Lock()
        self.lock.acquire()
        self.task: asyncio.Task[Any] | None = None
        self.future: asyncio.Future[None] | None = None
        self.deadline = 0.0  # loop time by which the publish's ack is due
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.abandoned = False  # the caller gave up (backstop): do not start it

    def done(self) -> bool:
        return self.finished

    def finish(self, task: asyncio.Task[Any]) -> None:
        """The task's done callback (on the loop)."""
        if task.cancelled():
            self.settle(None, concurrent.futures.CancelledError())
        else:
            error = task.exception()
            self.settle(None if error is not None else task.result(), error)

    def settle(self, result: Any, error: BaseException | None) -> None:
        """Record the outcome and wake the caller (on the loop; once)."""
        self.result, self.error, self.finished = result, error, True
        if self.future is None:
            self.lock.release()
        elif not self.future.done():
            self.future.set_result(None)


class _Meta(NamedTuple):
    partitions: int
    config: TopicConfig
    checked: float


def open_url(url: str, local: LocalDir) -> JetStreamLog:
    """The engine opener for ``nats://`` URLs (entry point ``eventlane.engines: nats``)."""
    return JetStreamLog.from_url(url, local=local)


def parse_url(url: str) -> dict[str, Any]:
    """``nats://h1:p1,h2:p2?namespace=ns&replicas=3`` -> keyword arguments of the log.

    >>> parse_url("nats://127.0.0.1:4222,127.0.0.1:4223?replicas=1")["servers"]
    ['nats://127.0.0.1:4222', 'nats://127.0.0.1:4223']
    """
    parts = urlsplit(url)
    if parts.scheme != "nats" or not parts.netloc:
        raise ConfigError(
            f"a JetStream log URL looks like nats://host:port[,host:port], got {url!r}"
        )
    out: dict[str, Any] = {"servers": [f"nats://{h}" for h in parts.netloc.split(",") if h]}
    for name, values in parse_qs(parts.query).items():
        if name == "namespace":
            out["namespace"] = values[-1]
        elif name == "replicas":
            out["replicas"] = int(values[-1])
        else:
            raise ConfigError(f"unknown option {name!r} in log URL {url!r}")
    return out


class JetStreamLog:
    """The log port on NATS JetStream. ``JetStreamLog.from_url("nats://h:p,h:p")``.

    Roles (:mod:`framework.log.port`): the core :class:`~framework.log.port.Log`,
    :class:`~framework.log.port.KeyedLog`, :class:`~framework.log.port.MaintainedLog` and
    :class:`~framework.log.port.FencedLog`. Compaction is not lazy: a compacted topic keeps
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
        """What :func:`framework.engine.open_log` opens this log by in another process
        (a Spark executor): the servers, the namespace and the replica count."""
        self.clock = clock
        self.timeout = timeout
        self.attempt_s = min(timeout, 2.0)
        """How long one single-record publish or direct get waits for its answer before it
        is asked again (the publish with the same ``Nats-Msg-Id``)."""
        self.retry_s = retry_s
        self._meta: dict[str, _Meta] = {}
        self._marks: dict[str, tuple[int, int]] = {}  # stream -> (lwm, hwm) last seen
        self._wake_seq = 0
        self._wake_owed = False  # an append's wake message not sent yet (see _publish)
        self._wake_timer: asyncio.TimerHandle | None = None  # pays it if nothing follows
        self._msg_ids = itertools.count()
        self._msg_id_prefix = uuid.uuid4().hex[:16]
        self._acks: dict[str, _Call] = {}  # reply token -> publish awaiting its ack, oldest first
        self._ack_ids = itertools.count()
        self._sweep: asyncio.TimerHandle | None = None  # expires acks overdue (_expire)
        self._wake = threading.Condition()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._driver = threading.Lock()  # held by the one thread running the loop
        self._guard = threading.Condition()  # guards the five fields below
        self._users = 0  # threads inside _run
        self._last_use = time.monotonic()
        self._last_concurrent = 0.0  # when a call last waited for the log's thread
        self._own_driving = False  # the log's own thread runs the loop
        self._waiters: collections.deque[_Waiter | _Call] = collections.deque()
        self._submitted: collections.deque[_Call] = collections.deque()  # not started yet
        self._drain_due = False  # a _drain callback is queued on the loop (or a hold is on)
        self._returning = 0  # concurrent appenders acknowledged, not queued again (about)
        self._holding = False  # queued calls wait for the rest of the train (see _drain)
        self._hold_timer: asyncio.TimerHandle | None = None
        self._thread = threading.Thread(
            target=self._drive_when_idle, name="eventlane-jetstream", daemon=True
        )
        self._thread.start()
        try:
            self._run(self._connect(list(servers)))
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> JetStreamLog:
        return cls(**{**parse_url(url), **kwargs})

    # ------------------------------------------------------------------ plumbing
    # For modules built on this connection (framework.log.jetstream.kv): run a coroutine on
    # the log's event loop, retry transient errors, the clients, an atomic batch.
    def run(self, coro: Coroutine[Any, Any, T], *, write: bool = False) -> T:
        """Run ``coro`` on the log's loop; a nats-py error it raises is raised as eventlane's
        (:mod:`.errors`; ``write``: a timeout leaves the outcome unknown)."""
        return self._run(coro, write=write)

    async def retry(
        self, op: Callable[[], Awaitable[T]], *, what: str = "request", write: bool = False
    ) -> T:
        return await self._retry(op, what=what, write=write)

    async def batch(
        self, msgs: list[tuple[str, bytes, dict[str, str]]], extra: dict[str, str]
    ) -> int:
        return await self._batch(msgs, extra)

    @property
    def js(self) -> Any:
        return self._js

    @property
    def nc(self) -> Any:
        return self._nc

    def _run(
        self,
        coro: Coroutine[Any, Any, T],
        call: _Call | None = None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        write: bool = False,
    ) -> T:
        """Run ``coro`` on the log's event loop and return its result (module docstring:
        in this thread when the loop is free, else by the thread running it). ``call``: the
        same work as a :class:`_Call` without a coroutine, for concurrent callers.

        The boundary of the adapter: a nats-py error is raised as eventlane's (see
        :mod:`.errors`; ``write``: the work was a write, so a timeout or a lost connection
        leaves its outcome unknown), never as itself."""
        try:
            return self._run_raw(coro, call)
        except FrameworkError:
            raise
        except _GaveUpError:
            if write:
                raise OutcomeUnknownError(
                    "JetStream write did not finish in time; it may or may not be stored",
                    topic=topic,
                    partition=partition,
                ) from None
            raise LogUnavailableError(
                "JetStream call did not finish in time", topic=topic, partition=partition
            ) from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise e.translate(exc, topic=topic, partition=partition, write=write) from exc

    def _run_raw(self, coro: Coroutine[Any, Any, T], call: _Call | None = None) -> T:
        if self._closed:
            coro.close()
            raise LogError("the JetStream log is closed")
        running = _running_loop()
        if running is self._loop:
            coro.close()
            raise LogError("a blocking JetStream call from the log's own event loop")
        with self._guard:
            self._users += 1
            # a thread that runs another event loop (an async application calling this
            # synchronous API) cannot run ours: the log's thread serves it
            # (and not while concurrent calls were seen lately: no ping-pong of the loop
            # between the log's thread and whichever caller is briefly alone)
            now = time.monotonic()
            alone = (
                self._users == 1
                and running is None
                and now - self._last_concurrent > IDLE_HANDBACK_S
            )
            if alone:
                if self._own_driving:
                    self._loop.call_soon_threadsafe(self._stop_own_driving)
            else:
                if call is None:
                    call = _Call(coro)
                else:
                    coro.close()
                self._waiters.append(call)
                self._last_concurrent = now
                if not self._own_driving:
                    self._guard.notify_all()  # the log's thread runs the loop for them
        try:
            if not alone:
                assert call is not None
                result: T = self._call(call)
                return result
            if self._driver.acquire(blocking=False):
                return self._drive(self._loop.create_task(coro))
            return self._wait(asyncio.run_coroutine_threadsafe(coro, self._loop))
        finally:
            with self._guard:  # no notify: the log's thread looks again within the idle time
                self._users -= 1
                self._last_use = time.monotonic()
                if not alone and call is not None:
                    self._waiters.remove(call)

    @property
    def _backstop_s(self) -> float:
        # every coroutine bounds its own waits; this is the backstop against a wedge
        return self.retry_s + 6 * self.timeout

    def _drive(self, task: asyncio.Future[T]) -> T:
        """Run the loop in this thread (holding ``_driver``) until ``task`` is done."""
        if self._wake_owed:
            self._loop.call_soon(self._pay_wake)  # after the task's first step (see _publish)
        timer = self._loop.call_later(self._backstop_s, task.cancel)
        try:
            return self._loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise _GaveUpError from None
        finally:
            timer.cancel()
            if not task.done():  # interrupted (KeyboardInterrupt): do not leave it running
                task.cancel()
            self._release()

    def _wait(self, future: concurrent.futures.Future[T]) -> T:
        """Wait for ``future`` (submitted to the loop another thread runs) as the only
        caller: run the loop here once it is handed over (see :meth:`_release`)."""
        waiter = _Waiter(future)
        future.add_done_callback(lambda _f: waiter.event.set())
        deadline = time.monotonic() + self._backstop_s
        with self._guard:
            self._waiters.append(waiter)
        try:
            while not future.done():
                if self._driver.acquire(blocking=False):
                    return self._drive(asyncio.wrap_future(future, loop=self._loop))
                left = deadline - time.monotonic()
                if left <= 0:
                    future.cancel()
                    raise _GaveUpError
                waiter.event.wait(left)
                waiter.event.clear()  # then both conditions are looked at again
            return future.result()
        finally:
            with self._guard:
                self._waiters.remove(waiter)

    def _call(self, call: _Call) -> Any:
        """Run ``call`` for one of several concurrent callers (registered in ``_waiters``
        by :meth:`_run`): queue it for the loop (one wake-up of the loop for all calls
        queued before it looks) and wait for its result while the log's own thread runs the
        loop. Calls queued together are started in one loop pass, so their requests leave
        in one socket write (see :meth:`_drain`)."""
        self._submitted.append(call)
        if not self._drain_due:  # (set before the loop's _drain empties the queue: no loss)
            self._drain_due = True
            self._loop.call_soon_threadsafe(self._drain)
        elif self._holding and len(self._submitted) >= self._returning:
            self._holding = False  # the train is complete: the loop starts it now
            self._loop.call_soon_threadsafe(self._drain)
        if not call.lock.acquire(timeout=self._backstop_s):
            self._loop.call_soon_threadsafe(self._abandon, call)
            raise _GaveUpError
        if call.error is not None:
            raise call.error
        return call.result

    def _drain(self) -> None:
        """Start every queued concurrent call (a loop callback): a task per coroutine, and
        one task publishing all the queued single-record appends (publish all, then their
        acks arrive: JetStream orders them, each carries its own expectations).

        Concurrent appenders come back as a train: the loop acknowledges several at once,
        and their threads queue their next appends one by one as each gets the CPU and the
        GIL. Starting each alone costs a wake-up of the loop and a socket write per append;
        so while fewer calls are queued than callers were acknowledged since the last start
        (``_returning``), the queue is held, for :data:`TRAIN_HOLD_S` at most, without the
        queuing threads waking the loop, until the caller that completes the train does."""
        queued = len(self._submitted)
        if self._hold_timer is None:
            if 0 < queued < self._returning:
                self._holding = True  # (_drain_due stays set: queuing callers do not wake us)
                self._hold_timer = self._loop.call_later(TRAIN_HOLD_S, self._end_hold)
                return
        elif self._holding:
            return  # an earlier wake-up; the hold goes on
        else:
            self._hold_timer.cancel()
            self._hold_timer = None
        self._holding = False
        self._returning = max(0, self._returning - queued)
        self._drain_due = False  # before emptying the queue (see _call)
        submitted = self._submitted
        pubs = []
        while submitted:
            call = submitted.popleft()
            if call.abandoned:
                if call.coro is not None:
                    call.coro.close()
            elif call.coro is None:
                pubs.append(call)
            else:
                call.task = self._loop.create_task(call.coro)
                call.task.add_done_callback(call.finish)
        if pubs:
            self._loop.create_task(self._send_pubs(pubs))

    def _end_hold(self) -> None:
        """The hold's time is up: the callers not back yet are not waited for."""
        self._hold_timer = None
        self._holding = False
        self._returning = 0
        self._drain()

    def _abandon(self, call: _Call) -> None:
        call.abandoned = True
        if call.task is not None:
            call.task.cancel()

    def _release(self) -> None:
        """Stop running the loop; hand it to a lone caller waiting to take it over, else, if
        calls of concurrent callers are unfinished, to the log's own thread (which then runs
        it for them all, as a dedicated loop thread, until a lone caller takes it over)."""
        self._driver.release()
        with self._guard:
            pending = [w for w in self._waiters if not w.done()]
            heir = next((w for w in pending if isinstance(w, _Waiter)), None)
            if heir is not None:
                heir.event.set()
            elif pending:
                self._guard.notify_all()

    def _on_loop(self) -> bool:
        """Whether this thread is running the log's loop now (inside a callback)."""
        return _running_loop() is self._loop

    def _stop_own_driving(self) -> None:
        # a callback: stops the loop only when the log's own thread runs it
        if threading.current_thread() is self._thread:
            self._loop.stop()

    def _drive_when_idle(self) -> None:
        """The log's own thread: run the loop once no caller has used it for
        :data:`IDLE_HANDBACK_S`, or when concurrent callers wait with nobody running it;
        until a lone caller takes it over (or the log is closed)."""
        while True:
            with self._guard:
                while True:
                    if self._closed:
                        return
                    idle = time.monotonic() - self._last_use
                    pending = [w for w in self._waiters if not w.done()]
                    serve = pending and not any(w.takes_over for w in pending)
                    quiet = not self._users and idle >= IDLE_HANDBACK_S
                    if (serve or quiet) and self._driver.acquire(blocking=False):
                        self._own_driving = True
                        break
                    wait = IDLE_HANDBACK_S if self._users else IDLE_HANDBACK_S - idle
                    self._guard.wait(max(wait, IDLE_HANDBACK_S / 4))
            try:
                self._loop.call_soon(self._pay_wake)
                self._loop.run_forever()
            finally:
                with self._guard:
                    self._own_driving = False
                self._release()

    async def _connect(self, servers: list[str]) -> None:
        self._nc = await nats.connect(
            servers=servers,
            connect_timeout=self.attempt_s,  # a server cut off is passed over quickly
            ping_interval=PING_INTERVAL_S,  # (annotated int; it sleeps that long)
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            allow_reconnect=True,
            no_echo=True,  # our own wake messages are counted locally (_bump)
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnect,
            reconnected_cb=self._on_reconnect,
        )
        self._js = self._nc.jetstream(timeout=self.timeout)
        await self._nc.subscribe(m.wake_subject(self.namespace), cb=self._on_wake)
        self._ack_prefix = self._nc.new_inbox() + "."
        await self._nc.subscribe(self._ack_prefix + "*", cb=self._on_ack)
        bucket = f"{self.namespace}-topics"
        self._kv: KeyValue = await self._retry(
            lambda: self._js.create_key_value(bucket=bucket, history=1, replicas=self.replicas)
        )

    async def _on_error(self, exc: Exception) -> None:
        log.info("jetstream connection error", error=repr(exc))

    async def _on_disconnect(self) -> None:
        log.info("jetstream disconnected; reconnecting")

    async def _on_reconnect(self) -> None:
        log.info("jetstream reconnected", server=str(self._nc.connected_url))

    async def _on_wake(self, _msg: object) -> None:
        self._bump()

    def _bump(self) -> None:
        with self._wake:
            self._wake_seq += 1
            self._wake.notify_all()

    async def _retry(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        what: str = "request",
        topic: str | None = None,
        partition: int | None = None,
        write: bool = False,
        sent: bool = False,
    ) -> T:
        """Run ``op``, retrying transient cluster errors for up to ``retry_s`` seconds.

        With ``topic``, "no responders" (no stream takes the subject) is first checked against
        the topic registry: a deleted topic raises :class:`UnknownTopicError` at once.
        When the time is up: :class:`OutcomeUnknownError` if ``write`` and any attempt may
        have been stored (``sent``: an attempt before this call may have been; a write is
        retried only when a repeat is harmless, e.g. under the same ``Nats-Msg-Id``), else
        :class:`LogUnavailableError`. A refusal is raised as nats-py's ``APIError``, which
        the caller (or :meth:`_run`) translates.
        """
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        maybe = sent
        while True:
            try:
                async with asyncio.timeout(3 * self.timeout):  # no extra task, unlike wait_for
                    return await op()
            except _TRANSIENT as exc:
                err: Exception = exc
                if topic is not None and isinstance(exc, _NO_STREAM):
                    await self._raise_if_gone(topic)
            except nats.js.errors.APIError as exc:
                if not e.retry_api_error(exc):
                    raise
                err = exc
            maybe = maybe or (write and e.maybe_stored(err))
            if time.monotonic() > deadline:
                detail = str(err) or repr(err)
                if maybe:
                    raise OutcomeUnknownError(
                        f"JetStream {what}: no answer for {self.retry_s}s ({detail}); it may or"
                        " may not be stored",
                        topic=topic,
                        partition=partition,
                    ) from err
                raise LogUnavailableError(
                    f"JetStream {what} failed for {self.retry_s}s: {detail}",
                    topic=topic,
                    partition=partition,
                ) from err
            log.debug("jetstream retry", what=what, error=repr(err))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _raise_if_gone(self, topic: str) -> None:
        """Raise :class:`UnknownTopicError` if the registry says ``topic`` is gone; a
        registry that cannot answer now (its leader is being elected too) says nothing, and
        the caller's retries go on."""
        try:
            await self._kv.get(topic)
        except nats.js.errors.KeyNotFoundError:
            self._meta.pop(topic, None)
            raise UnknownTopicError(f"topic {topic!r} does not exist", topic=topic) from None
        except _TRANSIENT:
            return
        except nats.js.errors.APIError as exc:
            if not e.retry_api_error(exc):
                raise

    # ------------------------------------------------------------------ topics
    def _stream_config(self, topic: str, p: int, cfg: TopicConfig) -> StreamConfig:
        ns = self.namespace
        by_time = cfg.delete and cfg.retention_ms > 0
        max_age = cfg.retention_ms / 1000 if by_time else 0
        return StreamConfig(
            name=m.stream_name(ns, topic, p),
            subjects=[m.subject_prefix(ns, topic, p) + ".*"],
            num_replicas=self.replicas,
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

    def create_topic(
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
        if self.topic_exists(name):
            if exist_ok:
                return self.describe_topic(name)
            raise TopicExistsError(f"topic {name!r} already exists", topic=name)
        self._run(self._add_streams(name, range(partitions), cfg))
        body = orjson.dumps(
            {
                "name": name,
                "partitions": partitions,
                "config": cfg.to_dict(),
                "created_ms": self.clock(),
            }
        )
        try:
            self._run(self._retry(lambda: self._kv.create(name, body), what="create topic"))
        except nats.js.errors.KeyWrongLastSequenceError:
            if exist_ok:
                return self.describe_topic(name)
            raise TopicExistsError(f"topic {name!r} already exists", topic=name) from None
        log.info("topic created", topic=name, partitions=partitions, engine="jetstream")
        self._meta.pop(name, None)
        return self.describe_topic(name)

    async def _add_streams(self, topic: str, parts: range, cfg: TopicConfig) -> None:
        async def one(p: int) -> None:
            sc = self._stream_config(topic, p, cfg)
            await self._retry(lambda: self._js.add_stream(sc), what="create stream")

        await asyncio.gather(*(one(p) for p in parts))

    def list_topics(self) -> list[str]:
        """The registered topics. nats-py's key listing can answer "no keys" when its
        watcher's consumer delivered every key before the watcher first looked (the keys are
        then in flight, counted neither pending nor received): an empty answer is asked
        again, twice, before it is believed."""

        async def keys() -> list[str]:
            for pause in (0.01, 0.05, None):
                try:
                    return list(await self._kv.keys())
                except nats.js.errors.NoKeysError:
                    if pause is None:
                        return []
                    await asyncio.sleep(pause)
            return []

        return sorted(self._run(self._retry(keys, what="list topics")))

    def topic_exists(self, name: str) -> bool:
        validate_topic_name(name)
        try:
            self._topic_meta(name, fresh=True)
        except UnknownTopicError:
            return False
        return True

    def _topic_meta(self, name: str, *, fresh: bool = False) -> _Meta:
        now = time.monotonic()
        meta = self._meta.get(name) if isinstance(name, str) else None
        if meta is not None and not fresh and now - meta.checked < _META_TTL_S:
            return meta
        validate_topic_name(name)

        async def get() -> bytes | None:
            try:
                entry = await self._kv.get(name)
            except nats.js.errors.KeyNotFoundError:
                return None
            return entry.value

        if meta is not None and not fresh:
            # a refresh of what is cached: when the registry cannot answer now (its leader
            # cut off, an election), keep using the cached metadata for a while, so appends
            # to partitions that are up do not wait for the registry (it only ever grows)
            try:
                raw = self._run(asyncio.wait_for(get(), self.attempt_s), topic=name)
            except LogUnavailableError:
                self._meta[name] = meta._replace(checked=now + _META_BACKOFF_S)
                return meta
        else:
            raw = self._run(self._retry(get, what="read topic metadata"), topic=name)
        if not raw:
            self._meta.pop(name, None)
            raise UnknownTopicError(f"topic {name!r} does not exist", topic=name)
        body = orjson.loads(raw)
        meta = _Meta(int(body["partitions"]), TopicConfig.from_mapping(body["config"]), now)
        self._meta[name] = meta
        return meta

    def partition_count(self, name: str) -> int:
        return self._topic_meta(name).partitions

    def topic_config(self, name: str) -> TopicConfig:
        return self._topic_meta(name).config

    def _check_partition(self, topic: str, partition: int) -> _Meta:
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise UnknownPartitionError(
                f"partition must be an integer, got {partition!r}", topic=topic
            )
        meta = self._topic_meta(topic)
        if not 0 <= partition < meta.partitions:
            meta = self._topic_meta(topic, fresh=True)
            if not 0 <= partition < meta.partitions:
                raise UnknownPartitionError(
                    f"partition {partition} does not exist (topic has {meta.partitions})",
                    topic=topic,
                    partition=partition,
                )
        return meta

    def describe_topic(self, name: str) -> TopicDescription:
        meta = self._topic_meta(name, fresh=True)
        states = self._run(self._states(name, meta.partitions))
        details = tuple(
            PartitionDescription(p, lwm, hwm, hwm, 1, size)
            for p, (lwm, hwm, size) in enumerate(states)
        )
        return TopicDescription(name, meta.partitions, meta.config, details)

    async def _state(self, topic: str, p: int) -> tuple[int, int, int]:
        """``(lwm, hwm, bytes)`` of one partition, from its stream leader."""
        stream = m.stream_name(self.namespace, topic, p)
        try:
            info = await self._retry(lambda: self._js.stream_info(stream), what="stream info")
        except nats.js.errors.NotFoundError:
            raise UnknownTopicError(
                f"topic {topic!r} has no stream for partition {p}", topic=topic, partition=p
            ) from None
        last = info.state.last_seq
        lwm = max(info.state.first_seq - 1, 0) if info.state.messages else last
        known = self._marks.get(stream)
        if known is not None:  # monotone per reader: a stale node's answer never goes back
            lwm, last = max(lwm, known[0]), max(last, known[1])
        self._marks[stream] = (lwm, last)
        return lwm, last, info.state.bytes

    async def _states(self, topic: str, count: int) -> list[tuple[int, int, int]]:
        return list(await asyncio.gather(*(self._state(topic, p) for p in range(count))))

    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
    ) -> TopicDescription:
        """Change config values (stream limits follow) or add partitions (never remove)."""
        meta = self._topic_meta(name, fresh=True)
        cfg = TopicConfig.from_mapping(config or {}, base=meta.config)
        count = meta.partitions
        if partitions is not None:
            altered_partitions(name, meta.partitions, partitions)
            if partitions > meta.partitions:
                log.warning(
                    "partition count increased: new records with the same key may land"
                    " in a different partition than older ones",
                    topic=name,
                    old=meta.partitions,
                    new=partitions,
                )
                self._run(self._add_streams(name, range(meta.partitions, partitions), cfg))
                count = partitions

        async def update() -> None:
            for p in range(count):
                sc = self._stream_config(name, p, cfg)
                await self._retry(
                    functools.partial(self._js.update_stream, sc), what="update stream"
                )
            body = {"name": name, "partitions": count, "config": cfg.to_dict()}
            await self._retry(lambda: self._kv.put(name, orjson.dumps(body)), what="alter topic")

        self._run(update())
        self._meta.pop(name, None)
        return self.describe_topic(name)

    def delete_topic(self, name: str) -> None:
        """Unregister the topic, then delete its streams."""
        meta = self._topic_meta(name, fresh=True)

        async def delete() -> None:
            await self._retry(lambda: self._kv.purge(name), what="delete topic")
            for p in range(meta.partitions):
                stream = m.stream_name(self.namespace, name, p)
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await self._retry(functools.partial(self._js.delete_stream, stream))

        self._run(delete())
        self._meta.pop(name, None)
        for p in range(meta.partitions):
            self._marks.pop(m.stream_name(self.namespace, name, p), None)
        log.info("topic deleted", topic=name, engine="jetstream")

    # ------------------------------------------------------------------ append
    def append_fenced(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        precondition: Callable[[int], None],
        atomic: bool = False,
    ) -> AppendResult:
        """The port's :class:`~framework.log.port.FencedLog` role: :meth:`append` with
        ``precondition`` (the end offset checked by the server with
        ``Nats-Expected-Last-Sequence``)."""
        return self.append(topic, partition, records, atomic=atomic, precondition=precondition)

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
        meta = self._check_partition(topic, partition)
        msgs = self._encode(topic, partition, meta.config, records)
        if atomic and (len(msgs) > MAX_BATCH_RECORDS or _size(msgs) > MAX_BATCH_BYTES):
            raise RecordTooLargeError(
                f"atomic append of {len(msgs)} records ({_size(msgs)} bytes) exceeds one batch"
                f" ({MAX_BATCH_RECORDS} records, {MAX_BATCH_BYTES} bytes)",
                topic=topic,
                partition=partition,
            )
        extra: dict[str, str] = {}
        if expect is not None:
            last = 0 if expect.last_offset is None else expect.last_offset + 1
            extra = {"Nats-Expected-Last-Subject-Sequence": str(last)}
            if expect.key != records[0][0]:  # (else the first record's subject is the key's)
                prefix = m.subject_prefix(self.namespace, topic, partition)
                subject = f"{prefix}.{m.key_token(expect.key)}"
                if subject != msgs[0][0]:
                    extra["Nats-Expected-Last-Subject-Sequence-Subject"] = subject
        while True:
            if precondition is not None:
                _, hwm, _ = self._run(self._state(topic, partition))
                precondition(hwm)
                extra["Nats-Expected-Last-Sequence"] = str(hwm)
            msg_id = f"{self._msg_id_prefix}{next(self._msg_ids)}"
            try:
                if len(msgs) == 1:
                    seqs = [self._publish_one(topic, partition, msgs[0], extra, msg_id)]
                else:
                    seqs = self._run(
                        self._publish(topic, msgs, extra),
                        write=True,
                        topic=topic,
                        partition=partition,
                    )
                break
            except ConcurrencyError as exc:  # a refused expected sequence (see .errors)
                if expect is not None:
                    self._await_visible(topic, partition, expect)
                if len(msgs) == 1 and (
                    mine := self._stored_copy(topic, partition, msgs[0], extra, msg_id)
                ):
                    seqs = [mine]  # the refusal came from a stale replica: ours is stored
                    break
                if expect is None:
                    continue  # only the end moved: ask the precondition again
                raise _conflict(exc, expect, topic, partition) from None
        stream = m.stream_name(self.namespace, topic, partition)
        if (known := self._marks.get(stream)) is not None:
            self._marks[stream] = (known[0], max(known[1], seqs[-1]))
        result = AppendResult(seqs[0] - 1, seqs[-1] - 1, [int(h[m.H_TS]) for _, _, h in msgs])
        self._bump()
        return result

    def _stored_copy(
        self,
        topic: str,
        partition: int,
        msg: tuple[str, bytes, dict[str, str]],
        extra: dict[str, str],
        msg_id: str,
    ) -> int | None:
        """The sequence of our refused publish's copy if the stream leader has it. Every
        replica receives a publish; the refusal that arrived first can be a stale ex-leader's
        while the real leader stored it (seen by the partition soak), so a refusal is
        believed only once the leader shows no record with our message id."""
        headers = {**extra, "Nats-Msg-Id": msg_id}
        find = self._find_copy(topic, partition, msg[0], headers)
        return self._run(find, topic=topic, partition=partition)

    def _await_visible(self, topic: str, partition: int, expect: Expect) -> None:
        """Wait (up to 2 s) until the write that beat ours is readable at the leader: the
        leader checks expectations against writes it has accepted but not yet applied, and
        a loser that reloads at once must see the winner (as on the embedded log)."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if self.key_head(topic, partition, expect.key) != expect.last_offset:
                return
            time.sleep(0.005)

    def _encode(
        self, topic: str, partition: int, cfg: TopicConfig, records: Sequence[RecordTuple]
    ) -> list[tuple[str, bytes, dict[str, str]]]:
        if not records:
            raise InvalidRecordError(
                "append needs at least one record", topic=topic, partition=partition
            )
        prefix = m.subject_prefix(self.namespace, topic, partition)
        now = self.clock()
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

    async def _publish(
        self, topic: str, msgs: list[tuple[str, bytes, dict[str, str]]], extra: dict[str, str]
    ) -> list[int]:
        """Publish and return the stream sequences of ``msgs``; the wake message for tailing
        readers is then owed: it goes out in the same socket write as this process's next
        request, or within :data:`IDLE_HANDBACK_S` when nothing follows (a write of its own
        per append cost as much as a second round trip on a loaded machine)."""
        if self._wake_owed:  # the previous append's, in this request's write
            self._wake_owed = False
            await self._send_wake()
        seqs = await self._publish_only(topic, msgs, extra)
        self._owe_wake()
        return seqs

    def _publish_one(
        self,
        topic: str,
        partition: int,
        msg: tuple[str, bytes, dict[str, str]],
        extra: dict[str, str],
        msg_id: str,
    ) -> int:
        """Publish one record and return its stream sequence (see :meth:`_send_pubs`)."""
        subject, payload, hdrs = msg
        headers = {**hdrs, **extra, "Nats-Msg-Id": msg_id}
        call = _Call(None, (topic, partition, subject, payload, headers))
        seq: int = self._run(
            self._publish_call(call), call, topic=topic, partition=partition, write=True
        )
        return seq

    async def _publish_call(self, call: _Call) -> int:
        """``call``'s publish, for a caller running the loop itself."""
        call.future = self._loop.create_future()
        await self._send_pubs([call])
        await call.future
        if call.error is not None:
            raise call.error
        seq: int = call.result
        return seq

    async def _send_pubs(self, calls: list[_Call]) -> None:
        """Publish single records (after the owed wake message), all before any ack.

        A lighter ``js.publish``: each goes out with a reply subject under one subscription
        of the log (:meth:`_on_ack` settles it), no request future, timer or task of its own.
        Anything but a plain ack or refusal (no responders, a transient API error, no ack
        within ``timeout``: see :meth:`_expire`, a publish error) hands the call to
        :meth:`_republish`, the retrying path, with the same ``Nats-Msg-Id`` (a record
        stored by the first try is not stored twice)."""
        if self._wake_owed:
            self._wake_owed = False
            await self._send_wake()
        deadline = self._loop.time() + self.attempt_s
        for call in calls:
            assert call.pub is not None
            _, _, subject, payload, headers = call.pub
            token = str(next(self._ack_ids))
            call.deadline = deadline
            self._acks[token] = call
            try:
                await self._nc.publish(
                    subject, payload, reply=self._ack_prefix + token, headers=headers
                )
            except Exception:  # closed, reconnecting, too large: the retrying path decides
                del self._acks[token]  # (not sent: nats-py raises before buffering it)
                self._loop.create_task(self._republish(call, sent=False))
        if self._acks and self._sweep is None:
            self._sweep = self._loop.call_at(deadline, self._expire)

    async def _on_ack(self, msg: Any) -> None:
        """A publish's ack (or refusal), on the log's reply subscription."""
        call = self._acks.pop(msg.subject.rpartition(".")[2], None)
        if call is None:  # acked after it was handed to the retrying path
            return
        if (msg.headers or {}).get("Status") == "503":  # no responders: no stream, election
            self._loop.create_task(self._republish(call, sent=False))
            return
        try:
            body = orjson.loads(msg.data)
            if "error" not in body:
                self._owe_wake()
                if call.future is None:  # a concurrent caller: likely back soon (_drain)
                    self._returning += 1
                call.settle(int(body["seq"]), None)
                return
            nats.js.errors.APIError.from_error(body["error"])  # raises it
        except nats.js.errors.APIError as exc:
            if e.retry_api_error(exc):
                self._loop.create_task(self._republish(call, sent=e.maybe_stored(exc)))
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
        now = self._loop.time()
        while self._acks:
            token, call = next(iter(self._acks.items()))
            if call.deadline > now:
                self._sweep = self._loop.call_at(call.deadline, self._expire)
                return
            del self._acks[token]
            self._loop.create_task(self._republish(call, sent=True))

    async def _republish(self, call: _Call, *, sent: bool) -> None:
        """``call``'s publish by ``js.publish`` under :meth:`_retry` (same headers, so a
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

        async def publish() -> Any:
            nonlocal maybe
            try:
                return await self._js.publish(
                    subject, payload, timeout=self.attempt_s, headers=headers
                )
            except Exception as exc:
                maybe = maybe or e.maybe_stored(exc)
                raise

        try:
            try:
                ack = await self._retry(
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
        self._owe_wake()
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
        for _ in range(64):
            get = functools.partial(self._js.get_msg, stream, seq, subject, False, True)
            try:
                msg = await self._retry(get, what="leader read", topic=topic, partition=partition)
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

    def _owe_wake(self) -> None:
        """An append was acknowledged: its wake message is owed (on the loop). It rides in
        the next request's write. A caller running the loop stops it after its call, and the
        log's thread pays the wake when it takes the loop over; the log's own thread, which
        keeps running it for concurrent callers, sends it after :data:`IDLE_HANDBACK_S` if
        no request took it."""
        self._wake_owed = True
        if self._wake_timer is None and threading.current_thread() is self._thread:
            self._wake_timer = self._loop.call_later(IDLE_HANDBACK_S, self._pay_wake_late)

    def _pay_wake_late(self) -> None:
        self._wake_timer = None
        self._pay_wake()

    def _pay_wake(self) -> None:
        """Queue the owed wake message (on the loop, before the call about to run)."""
        if self._wake_owed:
            self._wake_owed = False
            self._loop.create_task(self._send_wake())

    async def _send_wake(self) -> None:
        with contextlib.suppress(nats.errors.Error):  # closed or reconnecting: best effort
            await self._nc.publish(m.wake_subject(self.namespace), b"")

    async def _publish_only(
        self, topic: str, msgs: list[tuple[str, bytes, dict[str, str]]], extra: dict[str, str]
    ) -> list[int]:
        if len(msgs) == 1:
            subject, payload, hdrs = msgs[0]
            msg_id = f"{self._msg_id_prefix}{next(self._msg_ids)}"
            headers = {**hdrs, **extra, "Nats-Msg-Id": msg_id}
            ack = await self._retry(
                lambda: self._js.publish(subject, payload, timeout=self.attempt_s, headers=headers),
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
            last = await self._retry(
                functools.partial(self._batch, piece, head), what="append", topic=topic, write=True
            )
            seqs.extend(range(last - (end - start) + 1, last + 1))
            start, first = end, False
        return seqs

    async def _batch(
        self, msgs: list[tuple[str, bytes, dict[str, str]]], extra: dict[str, str]
    ) -> int:
        """One JetStream atomic batch: all of ``msgs`` or none; returns the last sequence.

        "No responders" means nobody took it (safe to retry); no answer in time, or a
        connection lost once any of it left, means the outcome is unknown: raised as
        :class:`OutcomeUnknownError`, never retried blindly (a batch has no message id).
        """
        try:
            async with asyncio.timeout(2 * self.timeout):
                return await self._batch_once(msgs, extra)
        except (nats.errors.NoRespondersError, nats.js.errors.APIError):
            raise  # nobody took it / a refusal: nothing stored
        except (*_TRANSIENT, nats.errors.Error) as exc:
            raise OutcomeUnknownError(
                f"atomic append: no answer from the cluster ({exc!r}); it may or may not have"
                " been stored"
            ) from exc

    async def _batch_once(
        self, msgs: list[tuple[str, bytes, dict[str, str]]], extra: dict[str, str]
    ) -> int:
        batch_id = uuid.uuid4().hex
        for i, (subject, payload, hdrs) in enumerate(msgs[:-1]):
            headers = {**hdrs, "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i + 1)}
            if i == 0:
                headers.update(extra)
            await self._nc.publish(subject, payload, headers=headers)
        subject, payload, hdrs = msgs[-1]
        headers = {
            **hdrs,
            "Nats-Batch-Id": batch_id,
            "Nats-Batch-Sequence": str(len(msgs)),
            "Nats-Batch-Commit": "1",
        }
        if len(msgs) == 1:
            headers.update(extra)
        reply = await self._nc.request(subject, payload, headers=headers, timeout=self.timeout)
        body = orjson.loads(reply.data)
        if "error" in body:
            raise nats.js.errors.APIError.from_error(body["error"])
        return int(body["seq"])

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
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise ConfigError(
                f"offset must be an integer, got {offset!r}", topic=topic, partition=partition
            )
        if upto is not None and (not isinstance(upto, int) or isinstance(upto, bool)):
            raise ConfigError(
                f"upto must be an integer or None, got {upto!r}", topic=topic, partition=partition
            )
        compacted = self._check_partition(topic, partition).config.compact
        records = self._run(self._read(topic, partition, offset, max_bytes, upto, compacted))
        return records, None

    async def _read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        upto: int | None,
        compacted: bool,
    ) -> list[Record]:
        stream = m.stream_name(self.namespace, topic, partition)
        known = self._marks.get(stream)
        if known is not None and known[0] <= offset < known[1]:
            # records below a HWM seen before exist unless retention removed them since:
            # skip asking the leader, and fall back to it if the answer has a gap
            end = known[1] if upto is None else min(known[1], upto)
            if offset >= end:
                return []
            got = await self._direct(topic, partition, {"seq": offset + 1}, end, max_bytes)
            if got and (compacted or got[0].offset == offset):
                return got
        lwm, hwm, _ = await self._state(topic, partition)
        for pause in (0.05, 0.1, 0.2, 0.4, 0.8):
            if offset <= hwm:
                break
            # above the end: a committed offset another process saw, and a node behind the
            # leader (a partitioned ex-leader) answered; ask again before refusing it
            await asyncio.sleep(pause)
            lwm, hwm, _ = await self._state(topic, partition)
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
            one = await self._leader_next(topic, partition, offset + 1, prefix + ".*")
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
            "batch": min(end - int(req["seq"]) + 1, MAX_BATCH_RECORDS),
            "max_bytes": max(max_bytes, 1),
        }
        timeouts = 0
        for attempt in range(25):
            try:
                got = await self._direct_once(stream, body, topic, partition, end)
            except _TRANSIENT:  # the replica asked is cut off, frozen or gone: ask again
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
        done: asyncio.Future[None] = self._loop.create_future()

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
                        _record(topic, partition, seq - 1, hdrs["Nats-Subject"], msg.data, hdrs)
                    )
                if "Nats-Num-Pending" not in hdrs:
                    done.set_result(None)  # a single-message answer has no end marker
            except Exception as exc:
                done.set_exception(exc)

        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox, cb=on_msg)
        try:
            await self._nc.publish(f"$JS.API.DIRECT.GET.{stream}", orjson.dumps(body), reply=inbox)
            try:
                async with asyncio.timeout(self.attempt_s):
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
        self._check_partition(topic, partition)
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.key_token(key)}"

        async def go() -> list[Record]:
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
                    one = await self._leader_next(topic, partition, first, subject)
                    if one is None or one.offset >= end:
                        break
                    got = [one]
                out.extend(got)
                first = got[-1].offset + 2
            return out

        return self._run(go())

    async def _leader_next(
        self, topic: str, partition: int, seq: int, subject: str
    ) -> Record | None:
        """The first record at or after stream sequence ``seq`` on ``subject``, read from the
        stream leader (never a lagging replica); ``None`` if there is none."""
        stream = m.stream_name(self.namespace, topic, partition)
        get = functools.partial(self._js.get_msg, stream, seq, subject, False, True)
        try:
            msg = await self._retry(get, what="leader read")
        except nats.js.errors.NotFoundError:
            return None
        hdrs = dict(msg.headers or {})
        where = msg.subject or subject
        return _record(topic, partition, int(msg.seq or 0) - 1, where, msg.data or b"", hdrs)

    def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of the last record with ``key`` (``None``: none), from the leader."""
        self._check_partition(topic, partition)
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.key_token(key)}"
        return self._run(self._key_head(topic, partition, subject))

    async def _key_head(self, topic: str, partition: int, subject: str) -> int | None:
        stream = m.stream_name(self.namespace, topic, partition)
        try:
            msg = await self._retry(
                lambda: self._js.get_msg(stream, subject=subject), what="key head"
            )
        except nats.js.errors.NotFoundError:
            return None
        return int(msg.seq or 0) - 1

    def check_keys(
        self, topics: Collection[str] | None = None, *, repair: bool = False
    ) -> list[KeyIndexReport]:
        """Nothing to check: the server's per-subject state is the per-key state."""
        return []

    def rebuild_keys(self, topic: str, partition: int) -> int:
        """Nothing to rebuild (see :meth:`check_keys`); checks the partition exists."""
        self._check_partition(topic, partition)
        return 0

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        self._check_partition(topic, partition)
        lwm, hwm, _ = self._run(self._state(topic, partition))
        return PartitionOffsets(lwm, hwm, hwm)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp`` (a scan)."""
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise ConfigError(
                f"timestamp must be an integer (ms), got {timestamp!r}",
                topic=topic,
                partition=partition,
            )
        offset = self.offsets(topic, partition).lwm
        while True:
            records, _ = self.read(topic, partition, offset)
            if not records:
                return None
            for r in records:
                if r.timestamp >= timestamp:
                    return r.offset
            offset = records[-1].offset + 1

    # ------------------------------------------------------------------ waiting
    def wait_seq(self) -> int:
        with self._wake:
            return self._wake_seq

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until an append (by any eventlane process on the cluster) after ``seen``."""
        with self._wake:
            self._wake.wait_for(lambda: self._wake_seq != seen, timeout)

    def wake(self) -> None:
        """Wake every waiter of this namespace, in every process (callable from any thread,
        the log's own event loop included)."""
        self._bump()
        publish = self._nc.publish(m.wake_subject(self.namespace), b"")
        if self._on_loop():
            self._loop.create_task(publish)
        else:
            self._run(publish)

    # ------------------------------------------------------------------ maintenance
    def compact(self, topic: str, *, progress: Progress | None = None) -> list[CompactionReport]:
        """Purge tombstones older than ``delete.retention.ms`` (values are compacted by the
        server at once, ``max_msgs_per_subject=1``)."""
        cfg = self._topic_meta(topic, fresh=True).config
        return self._each_partition(topic, progress, lambda p: self._compact_one(topic, p, cfg))

    def _each_partition(
        self, topic: str, progress: Progress | None, work: Callable[[int], T]
    ) -> list[T]:
        """``work(p)`` for every partition of ``topic``, telling ``progress`` as it goes."""
        total = self._topic_meta(topic, fresh=True).partitions
        out = []
        for p in range(total):
            out.append(work(p))
            if progress is not None:
                progress(p + 1, total, p)
        return out

    def request_compaction(self, topic: str, partition: int) -> None:
        """Nothing to schedule: the server compacts values at once (see :meth:`compact`)."""
        self._check_partition(topic, partition)

    def roll(self, topic: str, partition: int) -> None:
        """JetStream has no segments to roll; checks the partition exists."""
        self._check_partition(topic, partition)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Delete every record below ``before_offset`` (Kafka's DeleteRecords); the new LWM."""
        self._check_partition(topic, partition)
        lwm, hwm, _ = self._run(self._state(topic, partition))
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
            purge = functools.partial(self._js.purge_stream, stream, seq=before_offset + 1)
            self._run(self._retry(purge, what="delete records"))
        return self.offsets(topic, partition).lwm

    def _compact_one(self, topic: str, p: int, cfg: TopicConfig) -> CompactionReport:
        started = time.monotonic()
        lwm, hwm, size_before = self._run(self._state(topic, p))
        scanned, purged = 0, 0
        if cfg.compact:
            cutoff = self.clock() - cfg.delete_retention_ms
            stream = m.stream_name(self.namespace, topic, p)
            offset = lwm
            while offset < hwm:
                records, _ = self.read(topic, p, offset)
                if not records:
                    break
                for r in records:
                    scanned += 1
                    if r.value is None and r.timestamp <= cutoff and r.key is not None:
                        subject = (
                            f"{m.subject_prefix(self.namespace, topic, p)}.{m.key_token(r.key)}"
                        )
                        self._run(
                            self._retry(
                                functools.partial(
                                    self._js.purge_stream, stream, subject=subject, seq=r.offset + 2
                                ),
                                what="purge tombstone",
                            )
                        )
                        purged += 1
                offset = records[-1].offset + 1
        _, _, size_after = self._run(self._state(topic, p))
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
            lwm, _, _ = self._run(self._state(topic, p))
            return RetentionReport(topic, p, lwm, lwm, 0, 0, 0, 0.0)

        return self._each_partition(topic, progress, marks)

    def verify(
        self, topic: str | None = None, *, progress: Progress | None = None
    ) -> list[Exception]:
        """Check that every partition stream exists with its replicas current."""
        problems: list[Exception] = []
        for name in [topic] if topic is not None else self.list_topics():
            check = functools.partial(self._verify_one, name)
            for found in self._each_partition(name, progress, check):
                problems.extend(found)
        return problems

    def _verify_one(self, topic: str, p: int, *, settle_s: float = 3.0) -> list[Exception]:
        """Problems of one partition stream; a replica still catching up is re-checked for
        ``settle_s`` (a new or restarted replica is briefly behind) before it is reported."""
        stream = m.stream_name(self.namespace, topic, p)
        deadline = time.monotonic() + settle_s
        while True:
            try:
                info = self._run(self._retry(functools.partial(self._js.stream_info, stream)))
            except nats.js.errors.NotFoundError:
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
        _, hwm, _ = self._run(self._state(topic, partition))
        if hwm != 0:
            raise LogError("start_at needs an empty partition", topic=topic, partition=partition)
        stream = m.stream_name(self.namespace, topic, partition)
        self._run(self._retry(functools.partial(self._js.purge_stream, stream, seq=offset + 1)))

    def fill_gap(self, topic: str, partition: int, count: int) -> int:
        """Append ``count`` empty filler messages on the reserved subject ``<prefix>.g``
        (removed by :meth:`purge_fillers`), so the next record lands ``count`` offsets on."""
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.FILLER}"
        msgs = [(subject, b"", {m.H_TS: "0"})] * count
        if count:
            self._run(self._publish_only(topic, msgs, {}), topic=topic, write=True)
        return count

    def purge_fillers(self, topic: str, partition: int) -> None:
        stream = m.stream_name(self.namespace, topic, partition)
        subject = f"{m.subject_prefix(self.namespace, topic, partition)}.{m.FILLER}"
        purge = functools.partial(self._js.purge_stream, stream, subject=subject)
        self._run(self._retry(purge, what="purge fillers"))

    def placement(self, topic: str, partition: int) -> tuple[str, str | None, list[str]]:
        """``(stream, leader node, replica nodes)`` of a partition, for operators and tests."""
        self._check_partition(topic, partition)
        stream = m.stream_name(self.namespace, topic, partition)
        info = self._run(self._retry(functools.partial(self._js.stream_info, stream)))
        replicas = [
            r.name for r in (info.cluster.replicas if info.cluster else None) or [] if r.name
        ]
        return stream, info.cluster.leader if info.cluster else None, replicas

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._close_connection())
        finally:
            self._closed = True
            self._stop_loop()

    async def _close_connection(self) -> None:
        if self._wake_owed:  # the last append's wake: flushed by the client's close
            self._wake_owed = False
            await self._send_wake()
        await self._nc.close()

    def _stop_loop(self) -> None:
        self._closed = True
        with self._guard:
            self._guard.notify_all()
            if self._own_driving:
                self._loop.call_soon_threadsafe(self._stop_own_driving)
        self._thread.join(timeout=5)
        if not self._thread.is_alive() and self._driver.acquire(timeout=5):
            with contextlib.suppress(Exception):  # let cancelled client tasks finish
                self._loop.run_until_complete(asyncio.sleep(0.01))
            self._loop.close()

    def __enter__(self) -> JetStreamLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop this thread is running now, if any."""
    return asyncio._get_running_loop()


def _size(msgs: list[tuple[str, bytes, dict[str, str]]]) -> int:
    return sum(len(payload) for _, payload, _ in msgs)


def _record(
    topic: str, partition: int, offset: int, subject: str, data: bytes, hdrs: dict[str, str]
) -> Record:
    token = subject.rsplit(".", 1)[-1]
    ts = int(hdrs[m.H_TS]) if m.H_TS in hdrs else _server_time(hdrs.get("Nats-Time-Stamp"))
    return Record(
        topic,
        partition,
        offset,
        ts,
        TimestampType.LOG_APPEND_TIME if hdrs.get(m.H_TT) else TimestampType.CREATE_TIME,
        m.key_from_token(token, hdrs),
        None if hdrs.get(m.H_NULL) else data,
        m.decode_headers(hdrs.get(m.H_HDRS)),
    )


def _server_time(stamp: str | None) -> int:
    if not stamp:
        return 0
    head, _, frac = stamp.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00")
    return int(base.timestamp() * 1000) + int((frac + "000")[:3])


def _conflict(
    exc: ConcurrencyError, expect: Expect, topic: str, partition: int
) -> ConcurrencyError:
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
