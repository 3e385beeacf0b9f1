"""Helpers shared by the JetStream consumer-group tests (not a test module)."""

from __future__ import annotations

import threading

from framework.consumer.jetstream import JetStreamCoordination
from framework.errors import FrameworkError
from framework.log.jetstream.log import JetStreamLog


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
