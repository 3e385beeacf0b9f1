"""1,000 deadlines across kill -9s of real scheduler processes and an outage longer than many
deadlines (issue 32's acceptance): every schedule not cancelled fired exactly once in effect,
cancelled ones never, none before its moment. Oracle: the schedule records written and the
target streams (each ring carries its schedule's id as causation id), not the scheduler's
own bookkeeping."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sched_app import Rang, Ring, app

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COUNT = int(os.environ.get("EVENTLANE_SCHEDULES", "1000"))


def _scheduler(data: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventlane.cli",
            "--data",
            str(data),
            "schedules",
            "run",
            "sched_app:app",
            "--poll-interval",
            "0.2",
            "--session-timeout-ms",
            "2000",
        ],
        env={**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.timeout(600)
def test_deadlines_fire_exactly_once_across_kill_9_and_an_outage(tmp_path: Path) -> None:
    rng = random.Random(20261127)
    data = tmp_path / "data"
    log = tmp_path / "schedulers.log"
    start_ms = time.time_ns() // 1_000_000
    wanted: dict[str, tuple[str, int]] = {}  # key -> (alarm id, at)
    cancelled: set[str] = set()
    with app.open(data) as runtime:
        for i in range(COUNT):
            key = f"k{i}"
            at = start_ms + rng.randint(1_500, 9_000)
            runtime.schedule(Ring(f"ring-{i}", key), at=at, key=key)
            wanted[key] = (f"ring-{i}", at)
        for key in rng.sample(sorted(wanted), COUNT // 10):
            assert runtime.cancel_schedule(key)
            cancelled.add(key)
        ids = {k: e.id for k, e in runtime.schedules.entries().items()}
    procs = [_scheduler(data, log), _scheduler(data, log)]
    kills = 0
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # kill -9 one scheduler every ~1.5 s, restart it
            time.sleep(rng.uniform(1.0, 2.0))
            victim = rng.randrange(len(procs))
            _kill(procs[victim])
            kills += 1
            procs[victim] = _scheduler(data, log)
        for proc in procs:  # the outage: longer than the deadlines falling inside it
            _kill(proc)
        kills += len(procs)
        time.sleep(4)
        procs = [_scheduler(data, log), _scheduler(data, log)]
        with app.open(data) as runtime:
            give_up = time.monotonic() + 120
            while True:
                states = {k: e.state for k, e in runtime.schedules.entries().items()}
                pending = [k for k, s in states.items() if s == "scheduled"]
                if not pending or time.monotonic() > give_up:
                    break
                time.sleep(0.5)
            assert pending == [], f"{len(pending)} never fired: {pending[:5]}"
            fired_twice, fired_cancelled, early, missing = [], [], [], []
            for key, (alarm, at) in wanted.items():
                mine = [
                    e
                    for e in (
                        runtime.store.read("alarms", alarm)
                        if runtime.store.read("alarms", alarm)
                        else []
                    )
                    if isinstance(e.event, Rang) and e.causation_id == ids[key]
                ]
                if key in cancelled:
                    if mine:
                        fired_cancelled.append(key)
                    continue
                if not mine:
                    missing.append(key)
                elif len(mine) > 1:
                    fired_twice.append(key)
                elif mine[0].timestamp.timestamp() * 1000 < at:
                    early.append(key)
            assert (missing, fired_twice, fired_cancelled, early) == ([], [], [], [])
    finally:
        for proc in procs:
            _kill(proc)
    print(
        f"{COUNT} schedules, {len(cancelled)} cancelled, {kills} scheduler kills", file=sys.stderr
    )
