"""Shared fixtures: a controllable clock and a ``LogStore`` on a fresh temporary directory.

The test run is an entry point: it configures eventlane's logging once (warnings and above
on standard error, ``EVENTLANE_LOG_LEVEL`` to change it), as the ``eventlane`` command does;
``import framework`` itself configures nothing.

Hypothesis profiles: ``default`` (what the suite runs) and ``soak`` (many more examples and
longer stateful runs), picked with ``HYPOTHESIS_PROFILE=soak``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from framework.log import LogStore
from framework.observability import configure_logging

configure_logging()

settings.register_profile(
    "soak",
    max_examples=2000,
    stateful_step_count=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

T0_MS = 1_700_000_000_000
"""Where :class:`FakeClock` starts: a fixed, realistic epoch time in milliseconds."""


class FakeClock:
    """A millisecond clock that moves only when told: ``LogStore(path, clock=clock)``."""

    def __init__(self, now: int = T0_MS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path, clock: FakeClock) -> Iterator[LogStore]:
    """A ``LogStore`` on a fresh directory, driven by the ``clock`` fixture."""
    log = LogStore(data_dir, clock=clock)
    yield log
    log.close()
