"""One rebuild started from the console (:class:`RebuildJob`): its progress, then its verdict.

Written by the rebuild's thread (the :class:`~eventlane.replay.progress.Progress` protocol),
read by request handlers through :meth:`RebuildJob.to_json`: every field behind one lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["RebuildJob"]


class RebuildJob:
    """One rebuild started from the console: its progress, then its result and verification.

    ``state`` is ``running``, ``done`` (the rebuilt file equals the local replay and the live
    read model where comparable), ``different`` or ``failed``. Implements the rebuild's
    :class:`~eventlane.replay.progress.Progress` protocol; read from other threads through
    :meth:`to_json`.
    """

    def __init__(self, job_id: int, projection: str, engine: str) -> None:
        self.id = job_id
        self.projection = projection
        self.engine = engine
        self.state = "running"
        self.phase_name = "starting"
        self.tasks = 0
        self.tasks_done = 0
        self.offsets = 0
        self.records_done = 0
        self.started = time.time()
        self.seconds: float | None = None
        self.result: dict[str, Any] | None = None
        self.verify: list[dict[str, Any]] = []
        self.error: str | None = None
        self._lock = threading.Lock()

    def start(self, partitions: int, offsets: int) -> None:
        with self._lock:
            self.tasks, self.offsets = partitions, offsets

    def update(self, partitions_done: int, records_done: int) -> None:
        with self._lock:
            self.tasks_done, self.records_done = partitions_done, records_done

    def phase(self, name: str) -> None:
        with self._lock:
            self.phase_name = name

    def finish(
        self,
        state: str,
        *,
        result: dict[str, Any] | None = None,
        verify: list[dict[str, Any]] | None = None,
        error: str | None = None,
    ) -> None:
        with self._lock:
            self.state, self.phase_name = state, state
            self.result, self.verify, self.error = result, verify or [], error
            self.seconds = time.time() - self.started

    def _percent(self) -> int:
        if self.state in ("done", "different"):
            return 100
        return int(100 * self.records_done / self.offsets) if self.offsets else 0

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "id": self.id,
                "projection": self.projection,
                "engine": self.engine,
                "state": self.state,
                "phase": self.phase_name,
                "tasks": self.tasks,
                "tasks_done": self.tasks_done,
                "offsets": self.offsets,
                "records_done": self.records_done,
                "percent": self._percent(),
                "seconds": round(self.seconds or time.time() - self.started, 2),
                "result": self.result,
                "verify": self.verify,
                "error": self.error,
            }
