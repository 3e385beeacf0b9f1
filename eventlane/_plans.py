"""The one driver of eventlane's sans-I/O plans, sync and async.

A *plan* is a generator that does no I/O itself: it yields each request it needs done (a
step: an append, a read, a pause, a wait) and is sent the result back, or has the request's
exception thrown in, until it returns its answer. The rules (retries, version checks,
settling unknown outcomes) are written once in the plan; who performs the steps is the
driver's business: a thread that blocks, or a task that awaits on an event loop. The command
path (:mod:`eventlane.store.command`), the causal wait (:mod:`eventlane.app.causal`) and the
JetStream append (:mod:`eventlane.log.jetstream.publish`) are such plans.

This module is the loop that runs one: :func:`drive` with a blocking ``perform(step)``,
:func:`drive_async` with an awaitable one. Invariants: every step is performed exactly once,
in the order yielded (or, on an event loop, answered from memory by the driver's ``answer``
without an await: the same answer, with no I/O); a step's :class:`Exception` goes back
into the plan (which may catch it and go on), anything else (``KeyboardInterrupt``, a
cancelled task) leaves the plan suspended where it was and propagates; the plan's return
value is the driver's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

S = TypeVar("S")
R = TypeVar("R")

ASK: Any = object()
"""What an ``answer`` of :func:`drive_async` returns for a step it cannot answer from memory
(the step is then awaited through ``perform``)."""


def drive(plan: Generator[S, Any, R], perform: Callable[[S], Any]) -> R:
    """Run ``plan`` on the calling thread, each step through ``perform`` (blocking)."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(value) if error is None else plan.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            value = perform(step)
        except Exception as exc:
            error = exc


async def drive_async(
    plan: Generator[S, Any, R],
    perform: Callable[[S], Awaitable[Any]],
    answer: Callable[[S], Any] | None = None,
) -> R:
    """Run ``plan`` on the running event loop, each step awaited through ``perform``; with
    ``answer``, a step it answers from memory (anything but :data:`ASK`; its exception goes
    into the plan as ``perform``'s would) is not awaited: no coroutine, no task switch (a
    topic's cached partition count, asked twice a command)."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(value) if error is None else plan.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            if answer is not None:
                value = answer(step)
                if value is not ASK:
                    continue
            value = await perform(step)
        except Exception as exc:
            error = exc
