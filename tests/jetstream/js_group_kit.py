"""Helpers shared by the JetStream consumer-group tests (not a test module)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from framework.consumer.jetstream import JetStreamCoordination
from framework.errors import FrameworkError
from framework.log.jetstream.log import JetStreamLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumer"))
from group_members import Member

START_S = 60.0  # a member process may take long to start on a loaded machine


@pytest.fixture(name="members")
def members_fixture() -> Iterator[list[Member]]:
    """The member processes a test starts; stopped (gracefully, else killed) at its end."""
    group: list[Member] = []
    yield group
    for m in group:
        m.stop()


def counts(group: list[Member]) -> list[int]:
    """How many partitions each member owns, sorted."""
    return sorted(len(m.owned()) for m in group)


def union(group: list[Member]) -> set[int]:
    """Every partition some member of ``group`` owns."""
    return set().union(*(m.owned() for m in group))


class OffsetWatch:
    """Samples ``group``'s committed offsets every 50 ms in a thread and records any that
    went backwards: an independent oracle (the KV keeps only the latest commit). A sample
    that fails (the cluster is electing a leader) is skipped."""

    def __init__(self, js: JetStreamLog, group: str) -> None:
        self.coordination = JetStreamCoordination(js)
        self.group = group
        self.backwards: list[tuple[int, int, int]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last: dict[int, int] = {}
        while not self._stop.wait(0.05):
            try:
                offsets = self.coordination.offsets.group_offsets(self.group)
            except FrameworkError:
                continue
            for tp, entry in offsets.items():
                if entry.offset < last.get(tp.partition, 0):
                    self.backwards.append((tp.partition, last[tp.partition], entry.offset))
                last[tp.partition] = max(last.get(tp.partition, 0), entry.offset)
            self.samples += 1

    def __enter__(self) -> OffsetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
