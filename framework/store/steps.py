"""The I/O requests of the store's sans-I/O plans, and how a thread performs them.

The command path (:mod:`.command`), an aggregate's load (:mod:`.stream`) and the event
store's conditional append (:mod:`.event_store`) are plans (:mod:`framework._plans`): they
yield these steps and are sent the results. Their I/O is mostly the log's, and a log call
is yielded as a :class:`LogCall` (the log port's method by name), not as an opaque function,
so that a driver on an event loop can await the same method on the log's asyncio face
where it has one (JetStream: :class:`~framework.log.jetstream.aio.AsyncJetStreamLog`) and
runs only the rest in a thread (:mod:`framework.app.aio`). On a thread, :func:`perform`
makes every call in place and :func:`drive` runs a plan with it.

Invariant: a :class:`LogCall` names a method that the log port declares with the same
signature on the sync log and on an async face (``append``, ``read``, ``read_key``,
``key_head``, ...); what an async face lacks is called on the sync log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from framework import _plans

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


Step = Call | LogCall | Pause


def perform(step: Step) -> Any:
    """Perform ``step`` on the calling thread: calls made in place, pauses slept."""
    if isinstance(step, LogCall):
        return getattr(step.log, step.method)(*step.args, **step.kwargs)
    if isinstance(step, Pause):
        time.sleep(step.seconds)
        return None
    return step.fn(*step.args)


def drive(plan: Generator[Step, Any, R]) -> R:
    """Run a plan on the calling thread (:func:`perform` for each step)."""
    return _plans.drive(plan, perform)
