"""The process runner: N worker processes of one projector, supervised.

Each worker is a separate OS process (the hidden command ``eventlane project worker``, run
as ``python -m eventlane.cli`` with this interpreter) and a member
of the projector's consumer group, so the topic's partitions are shared among them and move
when one joins, leaves or dies. With ``restart=True`` a worker that dies (killed, crashed)
is replaced (at once if it ran for 10 s, else after a delay doubling up to 30 s, so a crash
loop does not spin); either way its partitions flow to the survivors within the session
timeout, or at once when the runner has the group's coordinator: a worker it sees exit
(any signal or status) is made to leave the group on its behalf (below). A worker stopped
by its poison-rate breaker (status 3, :mod:`.breaker`) is never
replaced: it would trip again. A worker that exits with status 2 could not start (bad
app, pending migrations): it is never restarted, and when no worker is left the runner
stops, with :attr:`Runner.failure` set to its error line. SIGTERM/SIGINT to the runner is
forwarded to every worker, which finishes its batch, commits and leaves the group. A runner
killed outright (SIGKILL) leaves no orphans: each worker gets SIGTERM from the kernel when
its supervisor dies (:mod:`.lifeline`) and stops the same way.

Hand-over on a known death: each worker joins with a client id unique to its process
(:data:`~.lifeline.WORKER_TAG_ENV`). When the runner reaps a worker it reads the group's
authoritative state and removes every member with that client id, each by its member id and
the generation it joined at (:meth:`~eventlane.consumer.coordinator.GroupCoordinator.leave`
with ``joined_generation``): the process is gone, so no live member can be hurt, its
partitions are granted to the survivors in the same state change, and a late commit or
batch of any earlier incarnation is still refused (by the group and the read model's
generation fence). A host lost with its runner is noticed by the session timeout as before.

Rolling restart (:meth:`Runner.roll`, SIGHUP in :mod:`.supervisor`): one slot at a time, a
new worker is started and waited for until it is a member owning its share, and only then
is the old one stopped (SIGTERM: it finishes its batch, commits and leaves).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from eventlane.consumer.coordination import Coordinator
from eventlane.errors import FrameworkError
from eventlane.observability import get_logger
from eventlane.projection.breaker import EXIT_BREAKER, describe, load_tripped
from eventlane.projection.lifeline import SUPERVISOR_ENV, WORKER_TAG_ENV
from eventlane.projection.readmodel import readmodel_path
from eventlane.projection.worker import EXIT_CANNOT_START

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
    tag: str = ""
    """The client id it joins its group with (unique to this process)."""
    exit_code: int | None = None
    terminated: bool = False
    """SIGTERM was sent (by :meth:`Runner.terminate`)."""

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
        coordinator: Coordinator | None = None,
        worker_args: tuple[str, ...] = (),
        argv: tuple[str, ...] | None = None,
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
        self.argv = argv
        """The worker's command after ``--data DATA`` (default: ``project worker APP NAME
        ...``); e.g. ``schedules run APP`` for the app's scheduler."""
        self.worker_args = worker_args
        """Extra options of each worker's command line (e.g. ``--dead-letter-unknown``)."""
        self.coordinator = coordinator
        """The projector's group (``coordination_for(log).coordinator(group)``): with it a
        dead worker's member leaves at once, and :meth:`roll` waits for new members."""
        self.handed_over: list[tuple[int, str]] = []
        """(pid, member id) of each dead worker's member this runner made leave."""
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
            "eventlane.cli",
            "--data",
            str(self.data),
            *(
                self.argv
                or (
                    "project",
                    "worker",
                    self.app_spec,
                    self.name,
                    "--session-timeout-ms",
                    str(self.session_timeout_ms),
                    *self.worker_args,
                )
            ),
        ]
        env = os.environ.copy() if self.env is None else dict(self.env)
        env[SUPERVISOR_ENV] = str(os.getpid())  # the worker stops when this process dies
        tag = f"eventlane-w{slot}-{secrets.token_hex(6)}"
        env[WORKER_TAG_ENV] = tag
        if self.log_path is None:
            proc = subprocess.Popen(cmd, env=env)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as sink:
                proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=sink)
        log.info("worker started", projector=self.name, pid=proc.pid, slot=slot)
        return WorkerProcess(slot, proc, time.monotonic(), tag)

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
            self._hand_over(worker)
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

    def terminate(self) -> None:
        """SIGTERM every worker not signalled yet (the first half of :meth:`stop`: a
        supervisor of several runners signals them all before it waits for any)."""
        self._stopping = True
        for worker in self.procs:
            if worker.proc.poll() is None and not worker.terminated:
                worker.proc.send_signal(signal.SIGTERM)
                worker.terminated = True

    def stop(self, timeout: float = 30.0, *, deadline: float | None = None) -> None:
        """SIGTERM every worker and wait for them; one still running ``timeout`` seconds
        later (or at ``deadline``, ``time.monotonic()``, a supervisor's one for all its
        runners) is killed, and the log says so."""
        self.terminate()
        if deadline is None:
            deadline = time.monotonic() + timeout
        for worker in self.procs:
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "worker did not stop after SIGTERM: killed",
                    projector=self.name,
                    pid=worker.pid,
                )
                worker.proc.kill()
                worker.proc.wait()
            worker.exit_code = worker.proc.returncode
            self.exited.append(worker)
            self._hand_over(worker)
        self.procs = []

    # ------------------------------------------------------------------ membership
    def members_of(self, worker: WorkerProcess) -> list[tuple[str, int]]:
        """(member id, joined generation) of ``worker``'s members in the group's
        authoritative state (none without a coordinator)."""
        if self.coordinator is None or not worker.tag:
            return []
        with self.coordinator.locked() as state:
            return [
                (m.member_id, m.joined_generation)
                for m in state.members.values()
                if m.client_id == worker.tag
            ]

    def _hand_over(self, worker: WorkerProcess) -> None:
        """``worker`` has exited: its member (if it is still in the group) leaves now."""
        if self.coordinator is None:
            return
        try:
            for member_id, joined in self.members_of(worker):
                if self.coordinator.leave(
                    member_id, reason="worker exited", joined_generation=joined
                ):
                    self.handed_over.append((worker.pid, member_id))
                    log.info(
                        "dead worker's member left the group on its behalf",
                        projector=self.name,
                        pid=worker.pid,
                        member_id=member_id,
                        code=worker.exit_code,
                    )
        except FrameworkError as exc:  # the session timeout still evicts it
            log.warning(
                "could not make a dead worker's member leave; it is evicted when its"
                " session times out",
                projector=self.name,
                pid=worker.pid,
                error=str(exc),
            )

    def joined(self, worker: WorkerProcess) -> bool:
        """Whether ``worker`` is a member that owns every partition targeted to it."""
        if self.coordinator is None:
            return time.monotonic() - worker.started > 2.0
        with self.coordinator.locked() as state:
            return any(
                m.client_id == worker.tag and set(m.owned) == set(m.target)
                for m in state.members.values()
            )

    def roll(self, timeout: float = 60.0, *, between: Callable[[], Any] | None = None) -> int:
        """Restart every worker one at a time: start a new one for the slot, wait until it
        has joined (:meth:`joined`, ``timeout`` at most), then stop the old one and wait
        for it to exit. ``between`` is called while waiting (e.g. to supervise others).
        Returns how many workers were replaced."""
        replaced = 0
        for old in sorted(self.procs, key=lambda w: w.slot):
            if self._stopping:
                break
            if old.proc.poll() is not None:
                continue  # died meanwhile: supervise_once replaces it
            new = self._spawn(old.slot)
            self.procs.append(new)
            deadline = time.monotonic() + timeout
            while not self._stopping and new.proc.poll() is None and not self.joined(new):
                if time.monotonic() > deadline:
                    log.warning("new worker did not join in time", pid=new.pid)
                    break
                if between is not None:
                    between()
                time.sleep(0.05)
            if new.proc.poll() is not None:  # the new code cannot run: keep the old worker
                log.error("new worker exited during a roll; roll stopped", pid=new.pid)
                break
            old.proc.send_signal(signal.SIGTERM)
            try:
                old.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                old.proc.kill()
                old.proc.wait()
            old.exit_code = old.proc.returncode
            self.procs.remove(old)
            self.exited.append(old)
            self._hand_over(old)
            replaced += 1
        return replaced

    @property
    def active(self) -> bool:
        """Whether a worker runs or a replacement is due."""
        return bool(self.procs or self._due)

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
            while not self._stopping and self.active and not (until is not None and until()):
                self.supervise_once()
                if tick is not None:
                    tick(self)
                time.sleep(interval)
            self.died_out = not self._stopping and not self.procs and not self._due
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
