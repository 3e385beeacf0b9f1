"""Lag over time, sampled by the console itself: a ring buffer per consumer group.

A daemon thread calls ``sample()`` (``{group: total lag}``) every ``interval`` seconds and
keeps the last ``keep`` points per group as ``(unix seconds, lag)``. The history lives only
in this process: it starts when the console starts. Sampling errors are logged and skipped
(a group deleted meanwhile, a log being compacted), never fatal.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from eventlane.observability import get_logger

log = get_logger("eventlane.console")

__all__ = ["LagSampler"]


class LagSampler:
    def __init__(
        self, sample: Callable[[], dict[str, int]], *, interval: float = 5.0, keep: int = 360
    ) -> None:
        self._sample = sample
        self.interval = interval
        self._keep = keep
        self._history: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-lag", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)

    def sample_once(self) -> None:
        lags = self._sample()
        now = round(time.time(), 3)
        with self._lock:
            for group, lag in lags.items():
                self._history.setdefault(group, deque(maxlen=self._keep)).append((now, lag))

    def history(self, group: str) -> list[tuple[float, int]]:
        with self._lock:
            return list(self._history.get(group, ()))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # the next tick tries again
                log.warning("lag sample failed", error=str(exc))
            self._stop.wait(self.interval)
