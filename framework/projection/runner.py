"""The process runner: N worker processes of one projector, supervised.

Each worker is a separate OS process (the hidden command ``eventlane project worker``, run
as ``python -m framework.cli`` with this interpreter) and a member
of the projector's consumer group, so the topic's partitions are shared among them and move
when one joins, leaves or dies. With ``restart=True`` a worker that dies (killed, crashed)
is replaced (at once if it ran for 10 s, else after a delay doubling up to 30 s, so a crash
loop does not spin); either way its partitions flow to the survivors within the session
timeout. A worker stopped by its poison-rate breaker (status 3, :mod:`.breaker`) is never
replaced: it would trip again. A worker that exits with status 2 could not start (bad
app, pending migrations): it is never restarted, and when no worker is left the runner
stops, with :attr:`Runner.failure` set to its error line. SIGTERM/SIGINT to the runner is
forwarded to every worker, which finishes its batch, commits and leaves the group. A runner
killed outright (SIGKILL) leaves no orphans: each worker gets SIGTERM from the kernel when
its supervisor dies (:mod:`.lifeline`) and stops the same way.
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

import attrs

from framework.observability import get_logger
from framework.projection.breaker import EXIT_BREAKER, describe, load_tripped
from framework.projection.lifeline import SUPERVISOR_ENV
from framework.projection.readmodel import readmodel_path
from framework.projection.worker import EXIT_CANNOT_START

log = get_logger("eventlane.projection")

RESTART_RESET_S = 10.0
"""A worker that lived this long is restarted at once; one that died younger waits."""
RESTART_MAX_DELAY_S = 30.0


@attrs.define
class WorkerProcess:
    """One worker process as the runner sees it."""

    slot: int
    proc: subprocess.Popen[bytes]
    started: float
    exit_code: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid


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
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        readmodel: Path | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.app_spec = app_spec
        self.name = name
        self.data = data
        self.workers = workers
        self.restart = restart
        self.session_timeout_ms = session_timeout_ms
        self.env = env
        self.log_path = log_path
        self.readmodel = readmodel if readmodel is not None else readmodel_path(data, name)
        """The projector's read model (``Runtime.readmodel_path``: it is named in the app's
        namespace), where a tripped breaker leaves its record."""
        """Where the workers' stderr goes (appended); ``None``: inherited."""
        self.procs: list[WorkerProcess] = []
        self.exited: list[WorkerProcess] = []
        self.restarts = 0
        self.failure: str | None = None
        """The error line of a worker that could not start (exit status 2), if any."""
        self.crashes: list[tuple[int, int]] = []
        """(pid, exit status) of each worker that died on its own with a non-zero status."""
        self.died_out = False
        """True when :meth:`run` ended because no worker was left (none stopped by request)."""
        self._stopping = False
        self._due: dict[int, float] = {}  # slot -> when its replacement starts
        self._delays: dict[int, float] = {}  # slot -> the next restart delay

    def _spawn(self, slot: int) -> WorkerProcess:
        cmd = [
            sys.executable,
            "-m",
            "framework.cli",
            "--data",
            str(self.data),
            "project",
            "worker",
            self.app_spec,
            self.name,
            "--session-timeout-ms",
            str(self.session_timeout_ms),
        ]
        env = os.environ.copy() if self.env is None else dict(self.env)
        env[SUPERVISOR_ENV] = str(os.getpid())  # the worker stops when this process dies
        if self.log_path is None:
            proc = subprocess.Popen(cmd, env=env)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as sink:
                proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=sink)
        log.info("worker started", projector=self.name, pid=proc.pid, slot=slot)
        return WorkerProcess(slot, proc, time.monotonic())

    def start(self) -> None:
        self.procs = [self._spawn(i) for i in range(self.workers)]

    def _last_log_line(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(max(0, self.log_path.stat().st_size - 4096))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def supervise_once(self) -> list[int]:
        """Reap dead workers (replacing them when ``restart``); return their exit codes."""
        codes = []
        alive: list[WorkerProcess] = []
        for worker in self.procs:
            code = worker.proc.poll()
            if code is None:
                alive.append(worker)
                continue
            worker.exit_code = code
            self.exited.append(worker)
            codes.append(code)
            if code != 0 and not self._stopping:
                self.crashes.append((worker.pid, code))
            log.warning("worker exited", projector=self.name, pid=worker.pid, code=code)
            if code == EXIT_CANNOT_START:
                self.failure = self._last_log_line() or (
                    f"worker {worker.pid} could not start (exit status {code}; see its error above)"
                )
                continue
            if code == EXIT_BREAKER:  # the same code would trip again: never replaced
                record = load_tripped(self.readmodel)
                self.failure = (
                    describe(record)
                    if record is not None
                    else f"worker {worker.pid} stopped by its poison-rate breaker"
                )
                log.error("worker stopped by its poison-rate breaker; not replaced", pid=worker.pid)
                continue
            if self.restart and not self._stopping:
                # A worker that keeps dying young is restarted with a growing delay.
                lived = time.monotonic() - worker.started
                delay = 0.0 if lived > RESTART_RESET_S else self._delays.get(worker.slot, 0.0)
                self._delays[worker.slot] = min(RESTART_MAX_DELAY_S, max(1.0, 2 * delay))
                self._due[worker.slot] = time.monotonic() + delay
        for slot, due in sorted(self._due.items()):
            if due <= time.monotonic() and not self._stopping:
                del self._due[slot]
                alive.append(self._spawn(slot))
                self.restarts += 1
        self.procs = alive
        return codes

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every worker and wait for them (SIGKILL after ``timeout``)."""
        self._stopping = True
        for worker in self.procs:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for worker in self.procs:
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
            worker.exit_code = worker.proc.returncode
            self.exited.append(worker)
        self.procs = []

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop at its next tick (safe from a signal handler)."""
        self._stopping = True

    def run(
        self,
        *,
        tick: Callable[[Runner], Any] | None = None,
        until: Callable[[], bool] | None = None,
        interval: float = 0.5,
    ) -> None:
        """Supervise until SIGTERM/SIGINT (or ``until()``, or no worker left), calling
        ``tick`` about every ``interval`` seconds."""

        def stop(_signum: int, _frame: Any) -> None:
            self._stopping = True

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while (
                not self._stopping
                and (self.procs or self._due)
                and not (until is not None and until())
            ):
                self.supervise_once()
                if tick is not None:
                    tick(self)
                time.sleep(interval)
            self.died_out = not self._stopping and not self.procs and not self._due
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
