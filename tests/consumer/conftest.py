"""Fixtures of the consumer-group tests: member processes that are always cleaned up."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from group_members import Member


@pytest.fixture
def members() -> Iterator[list[Member]]:
    """A list to put started member processes in; any still running at the end is killed
    (after a SIGCONT, in case the test stopped it)."""
    started: list[Member] = []
    yield started
    for m in started:
        m.signal(signal.SIGCONT)
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()
