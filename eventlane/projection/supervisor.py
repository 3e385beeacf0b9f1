"""One supervisor for every projector and policy of an app (``eventlane run APP``).

It owns one :class:`~.runner.Runner` per projector (the per-projector runner does the work:
spawning, restarting with backoff, the hand-over on a known death) and drives them from one
loop:

* each tick reaps and restarts the workers of every runner (``supervise_once``);
* SIGTERM / SIGINT stops every worker (each finishes its batch, commits and leaves) and
  ends the loop;
* SIGHUP restarts every worker one at a time (:meth:`~.runner.Runner.roll`: the new one has
  joined its group and owns its share before the old one is stopped), runner after
  runner, while the others keep being supervised; a second SIGHUP during a roll starts
  another roll after it;
* the loop ends by itself when no runner has a worker left (each could not start, or its
  breaker tripped): :attr:`AppSupervisor.failures` says why.
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from eventlane.observability import get_logger
from eventlane.projection.runner import Runner

__all__ = ["AppSupervisor"]

log = get_logger("eventlane.projection")

STOP_GRACE_S = 30.0
"""How long a stopping supervisor waits, after SIGTERM to every worker of every projector,
before it kills the workers still running (one grace for all, not one per projector)."""


def stop_runners(runners: Iterable[Runner], grace: float = STOP_GRACE_S) -> None:
    """Stop several runners as one: SIGTERM to every worker of every runner first, then one
    ``grace`` for all of them (a worker still running at its end is killed and named)."""
    runners = list(runners)
    for runner in runners:
        runner.terminate()
    deadline = time.monotonic() + grace
    for runner in runners:
        runner.stop(deadline=deadline)


class AppSupervisor:
    """Supervises several runners (projector name -> runner) as one."""

    def __init__(self, runners: Mapping[str, Runner], *, stop_grace: float = STOP_GRACE_S) -> None:
        self.runners = dict(runners)
        self.stop_grace = stop_grace
        """Seconds between SIGTERM to every worker and killing those still running."""
        self.rolls = 0
        """Completed rolling restarts (SIGHUP)."""
        self._stopping = False
        self._roll_requested = False

    # ------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Stop at the next tick (safe from a signal handler)."""
        self._stopping = True

    def request_roll(self) -> None:
        """Roll every worker at the next tick (safe from a signal handler)."""
        self._roll_requested = True

    @property
    def failures(self) -> dict[str, str]:
        """Projector -> why its workers are not running (could not start, breaker)."""
        return {n: r.failure for n, r in self.runners.items() if r.failure is not None}

    def supervise_once(self, skip: Runner | None = None) -> None:
        for runner in self.runners.values():
            if runner is not skip:
                runner.supervise_once()

    def roll(self) -> int:
        """Restart every worker of every runner one at a time; return how many."""
        replaced = 0
        for name, runner in self.runners.items():
            if self._stopping:
                break
            log.info("rolling restart", projector=name, workers=len(runner.procs))
            replaced += runner.roll(between=functools.partial(self.supervise_once, skip=runner))
        self.rolls += 1
        return replaced

    def _alive(self) -> bool:
        return any(r.active for r in self.runners.values())

    def run(
        self,
        *,
        tick: Callable[[AppSupervisor], Any] | None = None,
        until: Callable[[], bool] | None = None,
        interval: float = 0.2,
    ) -> None:
        """Start every runner and supervise until SIGTERM/SIGINT (or ``until()``, or no
        worker left anywhere); SIGHUP rolls every worker."""

        def stop(_signum: int, _frame: Any) -> None:
            self.request_stop()
            for runner in self.runners.values():
                runner.request_stop()  # also ends a roll in progress

        def hup(_signum: int, _frame: Any) -> None:
            self.request_roll()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hup)
        try:
            for runner in self.runners.values():
                runner.start()
            while not self._stopping and self._alive() and not (until is not None and until()):
                self.supervise_once()
                if self._roll_requested:
                    self._roll_requested = False
                    replaced = self.roll()
                    log.info("rolling restart done", replaced=replaced)
                if tick is not None:
                    tick(self)
                time.sleep(interval)
        finally:
            for runner in self.runners.values():
                runner.request_stop()
            stop_runners(self.runners.values(), self.stop_grace)
            for s, handler in previous.items():
                signal.signal(s, handler)
