"""Item 5: a handler bug trips the poison-rate breaker instead of dead-lettering the topic;
the position is kept, ``project status`` and ``project run``'s exit status say so."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.newcomer.kit import eventlane, seed, start_workers, status, wait_until


def test_a_systematic_bug_trips_the_breaker_and_keeps_the_position(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    seed(workdir, 150, prefix="member-vip")  # every one of them is poison for the buggy handler
    run = start_workers(workdir, "loans_view", LIBRARY_BUGGY="1")
    try:
        code = run.wait(60)  # not restarting: the run ends once its worker tripped
    except subprocess.TimeoutExpired:
        run.kill()
        raise
    assert code == 1
    log = (workdir / "run-loans_view.log").read_text()
    assert "poison-rate breaker tripped, 50 of the last 100 events dead-lettered" in log
    assert log.count("Error: projector 'loans_view' stopped applying") == 1
    doc = status(workdir, "loans_view")
    assert doc["lag"] == 150  # the position is kept: nothing was skipped
    assert doc["dead_letters"].get("dead", 0) < 50  # the tripping batch was rolled back
    assert doc["breaker"]["dead"] == 50 and "ValueError" in doc["breaker"]["error"]
    shown = eventlane("--data", "d", "project", "status", "library.app:app", cwd=workdir)
    assert "BREAKER TRIPPED" in shown.stdout
    # fixed code: a new worker clears the breaker and applies everything
    run = start_workers(workdir, "loans_view")
    try:
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "lag 0 after the fix")
    finally:
        run.terminate()
        run.wait(30)
    doc = status(workdir, "loans_view")
    assert doc["breaker"] is None and doc["dead_letters"].get("dead", 0) == 0


def test_single_poison_events_are_dead_lettered_as_before(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    seed(workdir, 40, prefix="m")
    seed(workdir, 3, prefix="member-vip")
    seed(workdir, 40, prefix="n")
    run = start_workers(workdir, "loans_view", LIBRARY_BUGGY="1")
    try:
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "lag 0")
    finally:
        run.terminate()
        assert run.wait(30) == 0
    doc = status(workdir, "loans_view")
    assert doc["dead_letters"]["dead"] == 3 and doc["breaker"] is None
