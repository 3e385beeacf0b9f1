"""``eventlane run`` supervises the app's scheduler too (issue 32 item 1 with item 4): for an
app with commands it starts ``schedules run`` processes (named ``scheduler``); kill -9 of one
of two: the other owns every partition of the schedules topic within 2 s (the supervisor
makes the dead one leave); SIGTERM stops both and they leave the group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eventlane.app.schedules import scheduler_group, schedules_topic
from eventlane.consumer.coordination import coordination_for
from tests.schedules.sched_app import app

ROOT = Path(__file__).resolve().parents[2]
CLI = "from eventlane.cli import main; main(prog_name='eventlane')"


def test_eventlane_run_supervises_the_scheduler(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "run",
            "tests.schedules.sched_app:app",
            "--only",
            "scheduler",
            "-w",
            "2",
            "--session-timeout-ms",
            "20000",
            "--data",
            str(data),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT), "EVENTLANE_LOG_LEVEL": "warning"},
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "run.log").open("wb"),
    )
    try:
        deadline = time.monotonic() + 120
        while not (data / "groups").is_dir():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        with app.open(data) as runtime:
            coord = coordination_for(runtime.log).coordinator(scheduler_group(runtime))

            def owners() -> dict[int, int]:
                with coord.locked() as state:
                    return {m.pid: len(m.owned) for m in state.members.values()}

            try:
                while not (len(owners()) == 2 and all(owners().values())):
                    assert time.monotonic() < deadline, owners()
                    time.sleep(0.05)
                every = runtime.log.partition_count(schedules_topic(runtime))
                victim = min(owners())
                os.kill(victim, signal.SIGKILL)
                t0 = time.monotonic()
                while not (victim not in (o := owners()) and sum(o.values()) == every):
                    assert time.monotonic() - t0 < 30, o
                    time.sleep(0.02)
                moved = time.monotonic() - t0
                print(f"scheduler hand-over {moved:.3f} s", file=sys.stderr)
                assert moved < 2.0
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(120) == 0, (tmp_path / "run.log").read_text()[-3000:]
                assert coord.current().members == {}
            finally:
                coord.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
