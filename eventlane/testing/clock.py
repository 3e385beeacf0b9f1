"""A clock for tests: epoch milliseconds that move only when a test says so."""

from __future__ import annotations

__all__ = ["T0_MS", "FakeClock"]

T0_MS = 1_700_000_000_000
"""Where :class:`FakeClock` starts: a fixed, realistic epoch time in milliseconds."""


class FakeClock:
    """A millisecond clock that moves only when told: ``LogStore(path, clock=clock)``.

    >>> clock = FakeClock()
    >>> clock.advance(5) - T0_MS
    5
    """

    def __init__(self, now: int = T0_MS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now
