"""The process runner: N worker processes of one projector, supervised.

Each worker is a separate OS process (``python -m framework.projection.worker``) and a member
of the projector's consumer group, so the topic's partitions are shared among them and move
when one joins, leaves or dies. With ``restart=True`` a worker that dies (killed, crashed) is
replaced; either way its partitions flow to the survivors within the session timeout.
SIGTERM/SIGINT to the runner is forwarded to every worker, which finishes its batch, commits
and leaves the group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("eventlane.projection")


class Runner:
    """Starts and supervises the worker processes of one projector."""

    def __init__(
        self,
        app_spec: str,
        name: str,
        data: Path,
        *,
        workers: int = 1,
        restart: bool = False,
        session_timeout_ms: int = 10_000,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.app_spec = app_spec
        self.name = name
        self.data = data
        self.workers = workers
        self.restart = restart
        self.session_timeout_ms = session_timeout_ms
        self.procs: list[subprocess.Popen[bytes]] = []
        self.restarts = 0
        self._stopping = False

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "framework.projection.worker",
            self.app_spec,
            self.name,
            str(self.data),
            str(self.session_timeout_ms),
        ]
        proc = subprocess.Popen(cmd, env=os.environ.copy())
        log.info("worker started", projector=self.name, pid=proc.pid)
        return proc

    def start(self) -> None:
        self.procs = [self._spawn() for _ in range(self.workers)]

    def supervise_once(self) -> list[int]:
        """Reap dead workers (replacing them when ``restart``); return their exit codes."""
        codes = []
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is None:
                continue
            codes.append(code)
            log.warning("worker exited", projector=self.name, pid=proc.pid, code=code)
            if self.restart and not self._stopping:
                self.procs[i] = self._spawn()
                self.restarts += 1
        if not self.restart:
            self.procs = [p for p in self.procs if p.poll() is None]
        return codes

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every worker and wait for them (SIGKILL after ``timeout``)."""
        self._stopping = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run(
        self,
        *,
        tick: Callable[[Runner], Any] | None = None,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Supervise until SIGTERM/SIGINT (or ``until()``), calling ``tick`` about every 0.5 s."""

        def stop(_signum: int, _frame: Any) -> None:
            self._stopping = True

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not self._stopping and self.procs and not (until is not None and until()):
                self.supervise_once()
                if tick is not None:
                    tick(self)
                time.sleep(0.5)
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
