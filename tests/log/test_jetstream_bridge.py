"""The JetStream adapter's sync-over-async bridge, without a cluster (no nats-server).

The bridge (eventlane/log/jetstream/bridge.py) serves one event loop to any number of
threads: a lone caller runs the loop in its own thread, concurrent callers are served by the
bridge's thread, single-record publishes go out in trains. These tests drive it with plain
coroutines and a fake publisher (calls settled on the loop), against a model that is just
"every call gets its own answer, exactly once, in bounded time, with the right error kind".
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

pytest.importorskip("nats", reason="the nats extra is not installed")

import nats.errors

from eventlane.errors import (
    ErrorKind,
    LogError,
    LogUnavailableError,
    OutcomeUnknownError,
)
from eventlane.log.jetstream.bridge import IDLE_HANDBACK_S, Bridge, Call


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge(backstop_s=30.0)
    try:
        yield b
    finally:
        b.close()


async def _where(value: int) -> tuple[int, str]:
    await asyncio.sleep(0)
    return value, threading.current_thread().name


def test_a_lone_caller_runs_the_loop_in_its_own_thread(bridge: Bridge) -> None:
    time.sleep(IDLE_HANDBACK_S * 3)  # the bridge's thread has taken the idle loop
    value, ran_in = bridge.run(_where(7))
    assert (value, ran_in) == (7, threading.current_thread().name)


def test_an_idle_loop_is_run_by_the_bridge_thread(bridge: Bridge) -> None:
    """Subscriptions and pings are served while nobody calls: a callback scheduled on the
    idle loop runs on the bridge's own thread, within a generous bound."""
    bridge.run(_where(1))
    ran = threading.Event()
    names: list[str] = []

    def callback() -> None:
        names.append(threading.current_thread().name)
        ran.set()

    bridge.loop.call_soon_threadsafe(callback)
    assert ran.wait(5.0)
    assert names == [bridge.thread.name]


def test_a_thread_running_its_own_event_loop_is_served_by_the_bridge(bridge: Bridge) -> None:
    async def app() -> tuple[int, str]:
        return bridge.run(_where(3))  # a blocking call from inside an application's loop

    assert asyncio.run(app()) == (3, bridge.thread.name)


def test_a_call_from_the_bridge_loop_itself_is_refused(bridge: Bridge) -> None:
    async def inner() -> int:
        return 1

    async def outer() -> None:
        coro = inner()
        with pytest.raises(LogError, match="own event loop"):
            bridge.run(coro)

    bridge.run(outer())


def test_concurrent_callers_each_get_their_own_answers(bridge: Bridge) -> None:
    """8 threads x 100 calls with random awaits: every call answered with its own value."""
    rng = random.Random(7)
    delays = [[rng.choice((0.0, 0.0, 0.0005, 0.002)) for _ in range(100)] for _ in range(8)]
    answers: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    async def echo(value: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return value

    def worker(t: int) -> None:
        try:
            answers[t] = [bridge.run(echo(t * 1000 + i, d)) for i, d in enumerate(delays[t])]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    assert answers == {t: [t * 1000 + i for i in range(100)] for t in range(8)}


class _FakePublisher:
    """Settles queued publishes on the loop after a tick, as acks would arrive; counts
    how many trains (start_pubs calls) the bridge formed."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.trains: list[int] = []

    def start_pubs(self, calls: list[Call]) -> None:
        self.trains.append(len(calls))
        self.bridge.loop.call_soon(self._ack, calls)

    def _ack(self, calls: list[Call]) -> None:
        for call in calls:
            assert call.pub is not None
            if call.future is None:
                self.bridge.answered()
            call.settle(call.pub[1], None)

    async def publish_alone(self, call: Call) -> int:
        """The same call driven by a lone caller's own loop."""
        call.future = self.bridge.loop.create_future()
        self.start_pubs([call])
        await call.future
        result: int = call.result
        return result


def test_publishes_of_concurrent_callers_are_answered_once_each_in_trains(bridge: Bridge) -> None:
    fake = _FakePublisher(bridge)
    bridge.start_pubs = fake.start_pubs
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(t: int) -> None:
        try:
            barrier.wait()
            out = []
            for i in range(200):
                call = Call(None, ("t", t * 1000 + i, "s", b"", {}))
                out.append(bridge.run(fake.publish_alone(call), call, write=True))
            got[t] = out
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    started = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors
    assert got == {t: [t * 1000 + i for i in range(200)] for t in range(8)}
    assert sum(fake.trains) <= 8 * 200  # each publish started once at most
    assert time.monotonic() - started < 60


def _swallow(b: Bridge, coro: Coroutine[Any, Any, None]) -> None:
    with contextlib.suppress(LogError):  # (the helper meets the short backstop too)
        b.run(coro)


@pytest.mark.parametrize("concurrent", [False, True], ids=["lone", "concurrent"])
@pytest.mark.parametrize(
    ("write", "error", "kind"),
    [
        (False, LogUnavailableError, ErrorKind.RETRIABLE),
        (True, OutcomeUnknownError, ErrorKind.INDETERMINATE),
    ],
    ids=["read", "write"],
)
def test_the_backstop_ends_a_wedged_call_with_the_right_kind(
    concurrent: bool, write: bool, error: type[LogError], kind: ErrorKind
) -> None:
    """A coroutine that never finishes: the caller gets eventlane's error after the
    backstop (unavailable for a read, outcome unknown for a write), and the coroutine is
    cancelled rather than left running."""
    b = Bridge(backstop_s=0.3)
    cancelled = threading.Event()

    async def wedged() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()

    hold = threading.Event()

    async def busy() -> None:
        while not hold.is_set():
            await asyncio.sleep(0.01)

    helper = None
    try:
        if concurrent:  # another thread inside the bridge: this call is queued, not driven
            helper = threading.Thread(target=_swallow, args=(b, busy()))
            helper.start()
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(error) as raised:
            b.run(wedged(), topic="orders", partition=2, write=write)
        assert raised.value.kind is kind
        assert (raised.value.topic, raised.value.partition) == ("orders", 2)
        assert time.monotonic() - started < 10
        assert cancelled.wait(5)
    finally:
        hold.set()
        if helper is not None:
            helper.join(10)
        b.close()


@pytest.mark.parametrize(
    ("raised", "write", "error"),
    [
        (nats.errors.TimeoutError, True, OutcomeUnknownError),
        (nats.errors.TimeoutError, False, LogUnavailableError),
        (nats.errors.NoRespondersError, True, LogUnavailableError),
        (nats.errors.ConnectionClosedError, True, OutcomeUnknownError),
    ],
)
def test_client_errors_leave_the_bridge_as_eventlanes(
    bridge: Bridge, raised: type[Exception], write: bool, error: type[LogError]
) -> None:
    async def fails() -> None:
        raise raised

    with pytest.raises(error):
        bridge.run(fails(), write=write)
    assert bridge.run(_where(5))[0] == 5  # the bridge still serves


@pytest.mark.parametrize("concurrent", [False, True], ids=["lone", "concurrent"])
def test_close_ends_calls_in_flight_promptly_with_the_right_kind(concurrent: bool) -> None:
    """close() while calls wait (backstop 60 s): each ends within seconds; a write is
    "outcome unknown", a read a permanent LogError; the coroutines are cancelled; a call
    after close is refused."""
    b = Bridge(backstop_s=60.0)
    callers = 4 if concurrent else 1
    outcomes: dict[int, BaseException | None] = {}
    cancelled: list[int] = []
    inside = threading.Semaphore(0)

    async def long(i: int) -> None:
        inside.release()
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.append(i)

    def caller(i: int) -> None:
        try:
            b.run(long(i), write=i % 2 == 0)
            outcomes[i] = None
        except BaseException as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for th in threads:
        th.start()
    for _ in range(callers):
        assert inside.acquire(timeout=10)
    started = time.monotonic()
    b.close()
    for th in threads:
        th.join(15)
    assert time.monotonic() - started < 15
    assert sorted(outcomes) == list(range(callers))
    for i, exc in outcomes.items():
        if i % 2 == 0:
            assert isinstance(exc, OutcomeUnknownError), exc
        else:
            assert type(exc) is LogError and exc.permanent, exc
    assert sorted(cancelled) == list(range(callers))

    async def later() -> None:
        return None

    with pytest.raises(LogError, match="closed"):
        b.run(later())
    b.close()  # idempotent
