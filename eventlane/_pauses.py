"""Fault injection: "this process is descheduled here", at named points in critical sections.

A loaded host can stop any process for tens of milliseconds at any instruction: in the
middle of a seqlock write, while it holds a lock another process waits for. Lock-order
bugs show up only then (issue 26's cross-process deadlock was found by hand-placing a
sleep). This module places those sleeps for tests: every lock eventlane keeps across
processes (:class:`eventlane._locks.FileLock`: after taking it, before letting go) and
the named points of the embedded engine's critical sections call :func:`pause`.

Off unless the environment variable ``EVENTLANE_PAUSES`` is set when this module is
imported (read once)::

    EVENTLANE_PAUSES="SEED,PROBABILITY,MAX_MS"     e.g. "7,0.05,30"

Each point then sleeps, with ``PROBABILITY``, a uniformly random time up to ``MAX_MS``
milliseconds, drawn from a generator seeded with ``SEED`` and the process id (a forked
child draws its own sequence). Off, a point costs one check of a module global::

    if PAUSE is not None:
        PAUSE("partition.append.written")

``EVENTLANE_PAUSES="stop:TEXT"`` stops the process instead, deterministically: at the first
point whose name contains ``TEXT`` (``stop:TEXT#N``: the ``N``-th) it sends itself
``SIGSTOP`` (once), as an operator's ``kill -STOP`` or a frozen VM would, exactly inside
that critical section; whoever started it resumes it with ``SIGCONT`` or kills it there
(``kill -9``: a crash at that point). File locks name their points with their full
path (``locked /data/topics/t/0/lock``), so ``TEXT`` can pick one partition's locks.

Never set it in production; a value that does not parse is a :class:`ValueError` at import.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable

__all__ = ["ENV", "PAUSE", "Pauses", "StopAt", "parse"]

ENV = "EVENTLANE_PAUSES"


class Pauses:
    """Random sleeps at named points (see the module docstring). Thread-safe."""

    def __init__(self, seed: int, probability: float, max_ms: float) -> None:
        if not 0.0 <= probability <= 1.0 or max_ms < 0:
            raise ValueError(f"{ENV}: probability must be in [0, 1] and max_ms >= 0")
        self.seed = seed
        self.probability = probability
        self.max_s = max_ms / 1000.0
        self._lock = threading.Lock()
        self._pid = -1
        self._rng = random.Random()
        self.count = 0
        """Pauses taken by this process so far."""

    def __call__(self, point: str) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: its own sequence
                self._pid = os.getpid()
                self._rng.seed(f"{self.seed}/{self._pid}")
            if self._rng.random() >= self.probability:
                return
            delay = self._rng.uniform(0.0, self.max_s)
            self.count += 1
        del point  # named for the reader of a stack dump: the sleep is in this frame
        time.sleep(delay)


class StopAt:
    """``SIGSTOP`` to this process at the ``nth`` point whose name contains ``text``."""

    def __init__(self, text: str, nth: int = 1) -> None:
        if not text or nth < 1:
            raise ValueError(f"{ENV}: stop: needs the text of a point (and #N >= 1)")
        self.text = text
        self.nth = nth
        self._lock = threading.Lock()
        self.seen = 0
        """How many matching points this process passed (it stops at the ``nth`` only)."""

    def __call__(self, point: str) -> None:
        if self.text not in point:
            return
        with self._lock:
            self.seen += 1
            if self.seen != self.nth:
                return
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once someone sends SIGCONT


def parse(value: str | None) -> Pauses | StopAt | None:
    """The pauses ``value`` (the variable's text) asks for, or ``None`` (unset or empty)."""
    if not value:
        return None
    if value.startswith("stop:"):
        text, _, nth = value[len("stop:") :].partition("#")
        return StopAt(text, int(nth) if nth else 1)
    try:
        seed, probability, max_ms = value.split(",")
        return Pauses(int(seed), float(probability), float(max_ms))
    except ValueError as exc:
        raise ValueError(f'{ENV}={value!r}: expected "SEED,PROBABILITY,MAX_MS" ({exc})') from None


PAUSE: Callable[[str], None] | None = parse(os.environ.get(ENV))
"""The pause of this process, or ``None`` (off: the usual case)."""


def pause(point: str) -> None:
    """Pause at ``point`` if pauses are on (callers on hot paths check :data:`PAUSE`)."""
    if PAUSE is not None:
        PAUSE(point)
