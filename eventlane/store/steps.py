"""The I/O requests of the store's sans-I/O plans, and how a thread performs them.

The command path (:mod:`.command`), an aggregate's load (:mod:`.stream`) and the event
store's conditional append (:mod:`.event_store`) are plans (:mod:`eventlane._plans`): they
yield these steps and are sent the results. Their I/O is mostly the log's, and a log call
is yielded as a :class:`LogCall` (the log port's method by name), not as an opaque function,
so that a driver on an event loop can await the same method on the log's asyncio face
where it has one (JetStream: :class:`~eventlane.log.jetstream.aio.AsyncJetStreamLog`) and
runs only the rest in a thread (:mod:`eventlane.app.aio`). On a thread, :func:`perform`
makes every call in place and :func:`drive` runs a plan with it.

Invariant: a :class:`LogCall` names a method that the log port declares with the same
signature on the sync log and on an async face (``append``, ``read``, ``read_key``,
``key_head``, ...); what an async face lacks is called on the sync log.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from eventlane import _plans

R = TypeVar("R")

_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


class Call(NamedTuple):
    """A blocking call that is not the log's (a snapshot write, a read model's look). The
    driver performs it and sends back its result, or throws its exception into the plan."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


class LogCall(NamedTuple):
    """A call of the log port: ``getattr(log, method)(*args, **kwargs)`` (module docstring).

    ``cheap``: the engines answer it from memory (at worst a ``stat``: a topic's partition
    count), so a driver on an event loop may make it in place on a log with no asyncio face
    rather than hop to a thread."""

    log: Any
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = _NO_KWARGS
    cheap: bool = False


class Pause(NamedTuple):
    """Wait ``seconds`` before going on (a back-off between attempts)."""

    seconds: float


class Freshen(NamedTuple):
    """The key store ``keys`` is due for its periodic catch-up and the plan is about to
    encode from memory: a thread's driver does nothing (the encoding catches up in place);
    an async runtime catches the store up without blocking its loop
    (:meth:`~eventlane.app.aio_keys.KeyTail.freshen`) where it keeps a tail."""

    keys: Any


Step = Call | LogCall | Pause | Freshen


def perform(step: Step) -> Any:
    """Perform ``step`` on the calling thread: calls made in place, pauses slept."""
    if isinstance(step, LogCall):
        return getattr(step.log, step.method)(*step.args, **step.kwargs)
    if isinstance(step, Pause):
        time.sleep(step.seconds)
        return None
    if isinstance(step, Freshen):
        return None
    return step.fn(*step.args)


def drive(plan: Generator[Step, Any, R]) -> R:
    """Run a plan on the calling thread (:func:`perform` for each step)."""
    return _plans.drive(plan, perform)


class AsyncSteps:
    """Performs a plan's steps on an event loop (:func:`eventlane._plans.drive_async`):
    a :class:`LogCall` is awaited on ``face`` (the log's asyncio face) when ``face`` has
    that method and the call is ``log``'s, made in place when it is ``cheap`` and there is
    no face method, and every other step (a call a face lacks, a snapshot write, a sync
    log's file work) goes to ``offload`` (a thread); a :class:`Pause` is slept on the loop.

    Shared by the async runtime (:mod:`eventlane.app.aio`) and an async policy's
    ``ctx.issue_async`` (:mod:`eventlane.projection.parallel`): one rule for which I/O
    stays on the loop."""

    def __init__(
        self,
        log: Any,
        face: Any,
        offload: Callable[[Callable[[], Any]], Awaitable[Any]],
    ) -> None:
        self.log = log
        self.face = face
        self.offload = offload
        self._answers: Callable[[str, tuple[Any, ...]], Any] | None = getattr(face, "answer", None)

    def answer(self, step: Step) -> Any:
        """``step``'s answer from memory, with no I/O and no await, where the face gives one
        for its call (its ``answer(method, args)``: a topic's cached partition count or
        existence), else :data:`eventlane._plans.ASK` (``await self(step)``). The third
        argument of :func:`eventlane._plans.drive_async`."""
        answers = self._answers
        if (
            answers is not None
            and type(step) is LogCall
            and step.log is self.log
            and not step.kwargs
        ):
            return answers(step.method, step.args)
        return _plans.ASK

    async def __call__(self, step: Step) -> Any:
        if isinstance(step, LogCall):
            face = self.face
            method = (
                None
                if face is None or step.log is not self.log
                else getattr(face, step.method, None)
            )
            if method is not None:
                return await method(*step.args, **step.kwargs)
            if step.cheap:
                return perform(step)
        elif isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            return None
        elif isinstance(step, Freshen):
            return None  # (as on a thread; an async runtime with a key tail handles it)
        return await self.offload(functools.partial(perform, step))
