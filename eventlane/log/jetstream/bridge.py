"""The sync-over-async bridge: threads call coroutines on one event loop (nats-py is asyncio).

A :class:`Bridge` owns one event loop, run by whichever thread needs it. A lone caller (no
other thread inside the bridge, none in the last :data:`IDLE_HANDBACK_S`, and no event loop
of its own running) runs its coroutine on the loop *in its own thread*: no hop to another
thread and back per call, which on a loaded machine can cost more than the replicated append
itself. Concurrent callers submit their calls to the loop and wait for their results, while
the bridge's own daemon thread runs the loop for them all (the loop is not handed from caller
to caller). That thread also runs the loop after :data:`IDLE_HANDBACK_S` without any caller,
so subscriptions, pings and reconnects are served while the process calls nothing; a lone
caller arriving then stops it and takes the loop over.

A concurrent caller queues its :class:`Call` (one wake-up of the loop for everything queued
before the loop looks) and blocks on a lock of its own that the loop releases with the
result: no ``concurrent.futures.Future``, ``Event`` or closure per call. The loop starts
everything queued in one pass, so the requests of several callers leave in one socket write;
calls without a coroutine (single-record publishes, :attr:`Call.pub`) go to ``start_pubs``
together. Concurrent appenders come back as a *train* (see :meth:`Bridge._drain`).

Invariants (who owns what; nothing here relies on the GIL):

* The loop runs only in the thread holding ``_driver``; state that only loop callbacks touch
  (a caller's publisher tables, owed wake messages) is therefore confined to that holder.
* ``_guard`` (a condition) guards ``_users``, ``_last_use``, ``_last_concurrent``,
  ``_own_driving`` and ``_waiters``: who is inside, and who may take the loop over.
* ``_queue`` (a lock, never held while taking another) guards ``_submitted``,
  ``_drain_due`` and ``_holding``: the calls queued by callers' threads and drained by the
  loop. ``_returning`` (callers answered, not back yet) is written on the loop only; a
  caller reads it without the lock, and a stale value only starts a train up to
  :data:`TRAIN_HOLD_S` later (the hold's timer starts it anyway). ``_drain_due`` is true
  from the moment a drain is scheduled (or a hold is on) until the drain takes the queue, so
  every queued call is started by a drain that was scheduled after it was queued, or by one
  that sees it (no lost wake-up).
* Every call ends exactly once: with its result or error (:meth:`Call.settle`, on the loop),
  by the backstop (``backstop_s``: :class:`GaveUpError`; the call is abandoned, a task of it
  cancelled), or by :meth:`Bridge.close` (:class:`ClosedError` for every call still waiting).
  :meth:`Bridge.run` turns those into eventlane's errors: a write whose answer never came
  is :class:`~eventlane.errors.OutcomeUnknownError`, never "refused" or "done".

The object may be shared by threads; it must not be shared across ``fork()``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import nats.errors

from eventlane.errors import FrameworkError, LogError, LogUnavailableError, OutcomeUnknownError
from eventlane.log.jetstream import errors as e

T = TypeVar("T")

IDLE_HANDBACK_S = 0.01
"""Seconds without any caller after which the bridge's own thread runs the event loop."""

TRAIN_HOLD_S = 0.001
"""At most this long the loop holds calls queued by concurrent callers while callers whose
appends it just acknowledged have not queued their next call yet (see ``Bridge._drain``)."""


class GaveUpError(Exception):
    """The backstop fired: a call did not finish in time (raised as eventlane's by run)."""


class ClosedError(Exception):
    """The bridge was closed while the call waited (raised as eventlane's by run)."""


class _Waiter:
    """A lone thread waiting for its call's result or for the loop, to take it over."""

    __slots__ = ("event", "future", "takes_over")

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self.event = threading.Event()
        self.future = future
        self.takes_over = True

    def done(self) -> bool:
        return self.future.done()

    def close(self) -> None:
        """The bridge closed: end the wait (the future fails with :class:`ClosedError`)."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.future.set_exception(ClosedError())
        self.event.set()


class Call:
    """A call a concurrent caller submitted to the loop: a coroutine, or (``coro`` None) a
    single-record publish ``pub`` (started by the bridge's ``start_pubs``).

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
        self.abandoned = False  # the caller gave up (backstop, close): do not start it

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
        """Record the outcome and wake the caller (on the loop, or by ``close``; once)."""
        if self.finished:
            return
        self.result, self.error, self.finished = result, error, True
        if self.future is None:
            self.lock.release()
        elif not self.future.done():
            self.future.set_result(None)

    def close(self) -> None:
        """The bridge closed with this call unfinished: it fails with :class:`ClosedError`."""
        self.abandoned = True
        self.settle(None, ClosedError())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop this thread is running now, if any."""
    return asyncio._get_running_loop()


class Bridge:
    """One event loop served to any number of threads (module docstring).

    ``backstop_s`` bounds every call (its coroutine should bound its own waits; this is the
    backstop against a wedge). Hooks, both called with the loop confined to the calling
    thread: ``on_drive()`` just before a thread starts running the loop (a caller that takes
    it, or the bridge's own thread), and ``start_pubs(calls)`` on the loop with the queued
    calls that have no coroutine."""

    def __init__(
        self,
        *,
        backstop_s: float,
        on_drive: Callable[[], None] = lambda: None,
        start_pubs: Callable[[list[Call]], None] | None = None,
        name: str = "eventlane-jetstream",
    ) -> None:
        self.backstop_s = backstop_s
        self.on_drive = on_drive
        self.start_pubs = start_pubs
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self._driver = threading.Lock()  # held by the one thread running the loop
        self._guard = threading.Condition()  # guards the five fields below
        self._users = 0  # threads inside run_raw
        self._last_use = time.monotonic()
        self._last_concurrent = 0.0  # when a call last waited for the bridge's thread
        self._own_driving = False  # the bridge's own thread runs the loop
        self._waiters: collections.deque[_Waiter | Call] = collections.deque()
        self._queue = threading.Lock()  # guards the three fields below
        self._submitted: collections.deque[Call] = collections.deque()  # not started yet
        self._drain_due = False  # a _drain callback is queued on the loop (or a hold is on)
        self._holding = False  # queued calls wait for the rest of the train (see _drain)
        self._returning = 0  # concurrent callers answered, not queued again (loop writes)
        self._hold_timer: asyncio.TimerHandle | None = None  # (on the loop only)
        self.thread = threading.Thread(target=self._drive_when_idle, name=name, daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ callers
    def run(
        self,
        coro: Coroutine[Any, Any, T],
        call: Call | None = None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        write: bool = False,
    ) -> T:
        """Run ``coro`` on the loop and return its result (module docstring: in this thread
        when the loop is free, else by the thread running it). ``call``: the same work as a
        :class:`Call` without a coroutine, for concurrent callers.

        The boundary of the adapter: a nats-py error is raised as eventlane's (see
        :mod:`.errors`; ``write``: the work was a write, so a timeout, a lost connection or
        a close while it was in flight leaves its outcome unknown), never as itself."""
        try:
            return self.run_raw(coro, call)
        except FrameworkError:
            raise
        except (GaveUpError, ClosedError) as exc:
            closed = isinstance(exc, ClosedError)
            if write:
                raise OutcomeUnknownError(
                    "JetStream write "
                    + ("in flight when the log was closed" if closed else "did not finish in time")
                    + "; it may or may not be stored",
                    topic=topic,
                    partition=partition,
                ) from None
            if closed:
                raise LogError(
                    "the JetStream log was closed during the call", topic=topic, partition=partition
                ) from None
            raise LogUnavailableError(
                "JetStream call did not finish in time", topic=topic, partition=partition
            ) from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise e.translate(exc, topic=topic, partition=partition, write=write) from exc

    def run_raw(self, coro: Coroutine[Any, Any, T], call: Call | None = None) -> T:
        """:meth:`run` without the translation of errors."""
        if self.closed:
            coro.close()
            raise LogError("the JetStream log is closed")
        running = _running_loop()
        if running is self.loop:
            coro.close()
            raise LogError("a blocking JetStream call from the log's own event loop")
        with self._guard:
            self._users += 1
            # a thread that runs another event loop (an async application calling this
            # synchronous API) cannot run ours: the bridge's thread serves it
            # (and not while concurrent calls were seen lately: no ping-pong of the loop
            # between the bridge's thread and whichever caller is briefly alone)
            now = time.monotonic()
            alone = (
                self._users == 1
                and running is None
                and now - self._last_concurrent > IDLE_HANDBACK_S
            )
            if alone:
                if self._own_driving:
                    self.loop.call_soon_threadsafe(self._stop_own_driving)
            else:
                if call is None:
                    call = Call(coro)
                else:
                    coro.close()
                self._waiters.append(call)
                self._last_concurrent = now
                if not self._own_driving:
                    self._guard.notify_all()  # the bridge's thread runs the loop for them
        try:
            if not alone:
                assert call is not None
                result: T = self._call(call)
                return result
            if self._driver.acquire(blocking=False):
                return self._drive(self.loop.create_task(coro))
            return self._wait(asyncio.run_coroutine_threadsafe(coro, self.loop))
        finally:
            with self._guard:  # no notify: the bridge's thread looks again within the idle time
                self._users -= 1
                self._last_use = time.monotonic()
                if not alone and call is not None:
                    self._waiters.remove(call)

    def _closed_now(self) -> bool:
        return self.closed  # (a method: read again, not narrowed by an earlier check)

    def on_loop(self) -> bool:
        """Whether this thread is running the bridge's loop now (inside a callback)."""
        return _running_loop() is self.loop

    def own_thread(self) -> bool:
        """Whether this is the bridge's own thread (running the loop for others)."""
        return threading.current_thread() is self.thread

    def answered(self) -> None:
        """A concurrent caller's call was answered (on the loop): it is likely back soon
        with its next call, which :meth:`_drain` may hold the queue for."""
        self._returning += 1  # (written on the loop only: see the module docstring)

    def _drive(self, task: asyncio.Future[T]) -> T:
        """Run the loop in this thread (holding ``_driver``) until ``task`` is done."""
        self.on_drive()  # (its callbacks run after the task's first step)
        timer = self.loop.call_later(self.backstop_s, task.cancel)
        try:
            return self.loop.run_until_complete(task)
        except asyncio.CancelledError:
            if self.closed:
                raise ClosedError from None
            raise GaveUpError from None
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
        deadline = time.monotonic() + self.backstop_s
        with self._guard:
            self._waiters.append(waiter)
        try:
            while not future.done():
                if self.closed:
                    raise ClosedError
                if self._driver.acquire(blocking=False):
                    if self._closed_now():  # (close ran the loop to its end meanwhile)
                        self._driver.release()
                        raise ClosedError
                    return self._drive(asyncio.wrap_future(future, loop=self.loop))
                left = deadline - time.monotonic()
                if left <= 0:
                    future.cancel()
                    raise GaveUpError
                waiter.event.wait(left)
                waiter.event.clear()  # then both conditions are looked at again
            return future.result()
        except concurrent.futures.CancelledError:
            raise ClosedError if self.closed else GaveUpError from None
        finally:
            with self._guard:
                self._waiters.remove(waiter)

    def _call(self, call: Call) -> Any:
        """Run ``call`` for one of several concurrent callers (registered in ``_waiters``
        by :meth:`run_raw`): queue it for the loop (one wake-up of the loop for all calls
        queued before it looks) and wait for its result while the bridge's own thread runs
        the loop. Calls queued together are started in one loop pass, so their requests
        leave in one socket write (see :meth:`_drain`)."""
        with self._queue:
            self._submitted.append(call)
            wake = not self._drain_due
            if wake:
                self._drain_due = True
            elif self._holding and len(self._submitted) >= self._returning:
                self._holding = False  # the train is complete: the loop starts it now
                wake = True
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop was closed meanwhile (close ends the call)
                raise ClosedError from None
        if not call.lock.acquire(timeout=self.backstop_s):
            with contextlib.suppress(RuntimeError):  # (a closed loop has nothing to cancel)
                self.loop.call_soon_threadsafe(self._abandon, call)
            raise GaveUpError
        if call.error is not None:
            if isinstance(call.error, concurrent.futures.CancelledError) and self.closed:
                raise ClosedError
            raise call.error
        return call.result

    def _drain(self) -> None:
        """Start every queued concurrent call (a loop callback): a task per coroutine, and
        the queued single-record publishes together through ``start_pubs`` (publish all,
        then their acks arrive: JetStream orders them, each carries its own expectations).

        Concurrent appenders come back as a train: the loop acknowledges several at once,
        and their threads queue their next appends one by one as each gets the CPU and the
        GIL. Starting each alone costs a wake-up of the loop and a socket write per append;
        so while fewer calls are queued than callers were answered since the last start
        (``_returning``), the queue is held, for :data:`TRAIN_HOLD_S` at most, without the
        queuing threads waking the loop, until the caller that completes the train does."""
        with self._queue:
            queued = len(self._submitted)
            if self._hold_timer is None:
                if 0 < queued < self._returning:
                    self._holding = True  # (_drain_due stays set: queuing callers do not wake us)
                    self._hold_timer = self.loop.call_later(TRAIN_HOLD_S, self._end_hold)
                    return
            elif self._holding:
                return  # an earlier wake-up; the hold goes on
            else:
                self._hold_timer.cancel()
                self._hold_timer = None
            self._holding = False
            self._returning = max(0, self._returning - queued)
            self._drain_due = False  # with the queue taken (see _call)
            calls = list(self._submitted)
            self._submitted.clear()
        pubs = []
        for call in calls:
            if call.abandoned:
                if call.coro is not None:
                    call.coro.close()
            elif call.coro is None:
                pubs.append(call)
            else:
                call.task = self.loop.create_task(call.coro)
                call.task.add_done_callback(call.finish)
        if pubs:
            if self.start_pubs is None:
                for call in pubs:
                    call.settle(None, LogError("no publisher for a call without a coroutine"))
            else:
                self.start_pubs(pubs)

    def _end_hold(self) -> None:
        """The hold's time is up: the callers not back yet are not waited for."""
        with self._queue:
            self._hold_timer = None
            self._holding = False
            self._returning = 0
        self._drain()

    def _abandon(self, call: Call) -> None:
        call.abandoned = True
        if call.task is not None:
            call.task.cancel()

    def _release(self) -> None:
        """Stop running the loop; hand it to a lone caller waiting to take it over, else, if
        calls of concurrent callers are unfinished, to the bridge's own thread (which then
        runs it for them all, as a dedicated loop thread, until a lone caller takes it)."""
        self._driver.release()
        with self._guard:
            pending = [w for w in self._waiters if not w.done()]
            heir = next((w for w in pending if isinstance(w, _Waiter)), None)
            if heir is not None:
                heir.event.set()
            elif pending:
                self._guard.notify_all()

    def _stop_own_driving(self) -> None:
        # a callback: stops the loop only when the bridge's own thread runs it
        if self.own_thread():
            self.loop.stop()

    def _drive_when_idle(self) -> None:
        """The bridge's own thread: run the loop once no caller has used it for
        :data:`IDLE_HANDBACK_S`, or when concurrent callers wait with nobody running it;
        until a lone caller takes it over (or the bridge is closed)."""
        while True:
            with self._guard:
                while True:
                    if self.closed:
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
                self.on_drive()
                self.loop.run_forever()
            finally:
                with self._guard:
                    self._own_driving = False
                self._release()

    # ------------------------------------------------------------------ closing
    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and its thread, end every call still waiting (with
        :class:`ClosedError`: :meth:`run` raises it as eventlane's) and close the loop.
        Idempotent; call it after the last coroutine that must run (closing a connection)."""
        with self._guard:
            if self.closed:
                return
            self.closed = True
            self._guard.notify_all()
            with contextlib.suppress(RuntimeError):  # (a loop closed already)
                self.loop.call_soon_threadsafe(self._cancel_all)  # whoever runs the loop
                if self._own_driving:
                    self.loop.call_soon_threadsafe(self._stop_own_driving)
        self.thread.join(timeout=timeout)
        if self.thread.is_alive() or not self._driver.acquire(timeout=timeout):
            return  # a caller still runs the loop: its calls end there (or by the backstop)
        try:
            for _ in range(2):  # let cancelled tasks finish (the queued _cancel_all may
                with contextlib.suppress(Exception, asyncio.CancelledError):  # cut the first)
                    self._cancel_all()
                    self.loop.run_until_complete(asyncio.sleep(0.01))
            self.loop.close()
        finally:
            self._driver.release()
        self._end_waiting_calls()

    def _cancel_all(self) -> None:
        """Cancel every task on the loop (a callback of :meth:`close`): calls in flight end
        now, not at their backstop."""
        for task in asyncio.all_tasks(self.loop):
            task.cancel()

    def _end_waiting_calls(self) -> None:
        """End the calls still waiting once the loop is closed (so nothing else settles
        them: each is settled once)."""
        with self._guard:
            waiting = list(self._waiters)
        with self._queue:
            waiting.extend(self._submitted)
            self._submitted.clear()
        for waiter in waiting:
            if not waiter.done():
                waiter.close()
