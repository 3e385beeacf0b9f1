"""The newcomer's path end to end (and the test of items 5 and 11): a small app outside the repository, run only through the
``eventlane`` command and the app's own scripts, from the app's directory.

migrate -> two workers -> kill -9 of the supervisor (no orphans) -> a handler bug trips the
poison-rate breaker -> fix + ``dlq retry`` -> rename a projector and remove the old one ->
Spark rebuild with ``--verify`` -> the read model equals an independent fold of the log.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil

from tests.newcomer.kit import (
    error_line,
    eventlane,
    python,
    seed,
    start_workers,
    status,
    stop,
    wait_until,
)

FOLD = """
import json, sqlite3
from eventlane.consumer.free import Consumer
from eventlane.log import TopicPartition
from library.app import app
from library.events import LoanRequested, LoanReturned

want = {}
with app.open("d", create_topics=False) as rt:
    consumer = Consumer(rt.log, auto_offset_reset="earliest")
    count = rt.log.partition_count("loans")
    consumer.assign([TopicPartition("loans", p) for p in range(count)])
    while batch := consumer.poll(timeout=0):
        for r in batch:
            env = rt.codec.decode(r.key, r.value, r.headers)
            if isinstance(env.event, LoanRequested):
                want[env.aggregate_id] = [env.event.member_id, "active"]
            elif isinstance(env.event, LoanReturned):
                want[env.aggregate_id][1] = "returned"
    consumer.close()
    path = rt.readmodel_path("loans_view")
got = {row[0]: [row[1], row[2]] for row in sqlite3.connect(path).execute("SELECT * FROM loans")}
print(json.dumps({"want": want, "got": got}))
"""


def _alive(workdir: Path, projector: str) -> int:
    return sum(m["alive"] for m in status(workdir, projector)["members"])


def test_newcomer_path_end_to_end(workdir: Path) -> None:
    # migrate, seed, two workers per projector
    done = eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir)
    assert done.returncode == 0, done.stderr
    seed(workdir, 60, members=10, prefix="m")
    run = start_workers(workdir, "loans_view", "--workers", "2")
    members = start_workers(workdir, "members_view", "--workers", "2")
    try:
        wait_until(lambda: _alive(workdir, "loans_view") == 2, 60, "two loans_view workers")
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "loans_view lag 0")
        # kill -9 of the supervisor: its workers go too, and leave the group
        workers = psutil.Process(run.pid).children()
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        assert len(workers) == 2
        _, orphans = psutil.wait_procs(workers, timeout=15)  # session timeout: 2 s
        assert not orphans, f"orphan workers: {[p.pid for p in orphans]}"
        wait_until(lambda: _alive(workdir, "loans_view") == 0, 15, "no loans_view member")

        # a handler bug: three single poison events, then a burst that trips the breaker
        seed(workdir, 20, prefix="n")
        seed(workdir, 3, prefix="member-vip")
        seed(workdir, 20, prefix="o")
        buggy = start_workers(workdir, "loans_view", "--workers", "2", LIBRARY_BUGGY="1")
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "lag 0 (buggy)")
        assert status(workdir, "loans_view")["dead_letters"]["dead"] == 3
        seed(workdir, 120, prefix="member-vip-burst")
        assert buggy.wait(90) == 1  # both workers tripped: `project run` fails
        doc = status(workdir, "loans_view")
        assert doc["breaker"] is not None and doc["lag"] > 0  # stopped, position kept
        dead = doc["dead_letters"]["dead"]  # each worker stops at 50 of its last 100
        assert 3 < dead < 3 + 2 * 50
        log = (workdir / "run-loans_view.log").read_text()
        assert "poison-rate breaker tripped, 50 of the last 100 events dead-lettered" in log
        assert "Error: projector 'loans_view' stopped applying" in log
        assert doc["breaker"]["dead"] == 50 and "ValueError" in doc["breaker"]["error"]
        shown = eventlane("--data", "d", "project", "status", "library.app:app", cwd=workdir)
        assert "BREAKER TRIPPED" in shown.stdout

        # the fix (the code without the bug), dead letters retried, workers again
        retried = eventlane(
            "--data", "d", "dlq", "retry", "library.app:app", "-p", "loans_view", cwd=workdir
        )
        assert retried.returncode == 0 and f"succeeded: {dead}  failed: 0" in retried.stdout
        run = start_workers(workdir, "loans_view", "--workers", "2")
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "lag 0 after fix")
        doc = status(workdir, "loans_view")
        assert doc["breaker"] is None and doc["dead_letters"].get("dead", 0) == 0
        assert stop(run) == 0
    finally:
        stop(run)
        stop(members)

    # rename members_view -> members_by_id, then remove what the old name left
    app_py = workdir / "library" / "projections.py"
    app_py.write_text(app_py.read_text().replace('"members_view"', '"members_by_id"'))
    renamed = start_workers(workdir, "members_by_id")
    try:
        wait_until(lambda: status(workdir, "members_by_id")["lag"] == 0, 60, "renamed lag 0")
    finally:
        assert stop(renamed) == 0
    gone = eventlane("--data", "d", "project", "remove", "members_view", cwd=workdir)
    assert gone.returncode == 0, gone.stderr
    assert "removed: consumer group members_view" in gone.stdout
    assert not list((workdir / "d" / "readmodels").glob("members_view.*"))
    assert "members_view" not in eventlane("--data", "d", "groups", "list", cwd=workdir).stdout
    bad = error_line(
        eventlane(
            "--data", "d", "project", "status", "library.app:app", "-p", "members_view", cwd=workdir
        )
    )
    assert "has no projector 'members_view'" in bad

    # a Spark rebuild, verified against the local engine and the live read model
    rebuilt = eventlane(
        "--data",
        "d",
        "rebuild",
        "library.app:app",
        "-p",
        "loans_view",
        "--engine",
        "spark",
        "--master",
        "local[1]",
        "--verify",
        "--json",
        cwd=workdir,
        timeout=300,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    checks = json.loads(rebuilt.stdout)["verify"]
    assert checks and all(c["ok"] for c in checks)

    # the read model equals an independent fold of the log
    folded = json.loads(python(FOLD, cwd=workdir))
    assert len(folded["want"]) == 60 + 20 + 3 + 20 + 120
    assert folded["got"] == folded["want"]
