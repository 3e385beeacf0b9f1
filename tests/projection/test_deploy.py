"""Deploy-safe upgrades (issue 32 item 3): a rolling deploy with real processes.

Release 1 workers run (``eventlane run``, 2 workers per projector); a writer with release 2
appends ``GuestRegistered`` v2 events and bookings of those guests; no dead letter appears,
``project status`` shows the waits (the ``guests`` projector decoding a v2 event, the
``confirmations`` policy loading a guest whose stream holds one) while other partitions keep
flowing; then the code on disk becomes release 2 and SIGHUP rolls the workers; every read
model equals a fold of the raw log and each booking is confirmed exactly once with its
guest's name (oracle: the log).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner
from projection_kit import ROOT, child_env

from eventlane.cli import main
from eventlane.log import Log
from eventlane.projection import readmodel_path
from tests.projection import deployapp

APP = "tests.projection.deployapp:app"
CLI = "from eventlane.cli import main; main(prog_name='eventlane')"


def raw(log: Log, topic: str) -> list[dict[str, Any]]:
    out = []
    for p in range(log.partition_count(topic)):
        marks = log.offsets(topic, p)
        offset, cursor = marks.lwm, None
        while offset < marks.hwm:
            records, cursor = log.read(topic, p, offset, cursor=cursor)
            out.extend(orjson.loads(r.value or b"null") for r in records)
            offset = records[-1].offset + 1
    return out


def fold_guests(log: Log) -> dict[str, tuple[str, int]]:
    guests: dict[str, tuple[str, int]] = {}
    for e in raw(log, "guests"):
        d = e["data"]
        name = d["name"] if e["version"] == 1 else f"{d['first_name']} {d['last_name']}"
        guests[e["aggregate_id"]] = (name, guests.get(e["aggregate_id"], ("", 0))[1] + 1)
    return guests


def status(data: Path, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    result = CliRunner().invoke(
        main, ["project", "status", APP, "--json", "--data", str(data)], env=env
    )
    assert result.exit_code == 0, result.output
    return {d["projector"]: d for d in orjson.loads(result.stdout)["projectors"]}


def write(data: Path, env: dict[str, str], what: str, first: int, count: int) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.projection.deployapp",
            str(data),
            what,
            str(first),
            str(count),
        ],
        env=env,
        cwd=str(ROOT),
        check=True,
        timeout=120,
    )


def wait_for(cond: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def dead_letters(data: Path) -> int:
    total = 0
    for name in ("guests", "confirmations"):
        with sqlite3.connect(readmodel_path(data, name)) as db:
            total += db.execute("SELECT count(*) FROM _eventlane_dead_letters").fetchone()[0]
    return total


def test_rolling_deploy_never_dead_letters(tmp_path: Path) -> None:
    data = tmp_path / "data"
    release = tmp_path / "release"
    release.write_text("1")
    env = child_env(DEPLOYAPP_CODE_FILE=str(release), EVENTLANE_LOG_LEVEL="warning")
    write(data, env, "guests", 0, 12)  # release 1: v1 guests and their bookings
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "run", APP, "--workers", "2", "--data", str(data)],
        env=env,
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "run.log").open("wb"),
    )
    try:
        # Every worker has imported release 1 (is a live member) and caught up, before the
        # release file changes (a worker still starting would import release 2).
        wait_for(
            lambda: all(
                d["lag"] == 0 and len([m for m in d["members"] if m["alive"]]) == 2
                for d in status(data, env).values()
            ),
            "2 members per group, caught up",
        )
        release.write_text("2")  # the writer runs release 2; the workers still run 1
        write(data, env, "guests", 100, 2)  # two v2 guests, one booking each
        release.write_text("1")
        write(data, env, "bookings", 0, 12)  # bookings of v1 guests: must keep flowing
        docs: dict[str, dict[str, Any]] = {}

        def both_wait() -> bool:
            docs.update(status(data, env))
            return all(docs[n]["waiting"] for n in ("guests", "confirmations"))

        wait_for(both_wait, "both projectors waiting")
        for name in ("guests", "confirmations"):
            doc = docs[name]
            for w in doc["waiting"]:
                assert w["event_type"] == "GuestRegistered" and w["version"] == 2
                assert w["message"].startswith("waiting for code that knows GuestRegistered v2")
            stuck = {(w["topic"], w["partition"]) for w in doc["waiting"]}
            # the other partitions flow: caught up
            wait_for(
                lambda name=name, stuck=stuck: all(
                    r["lag"] == 0
                    for r in status(data, env)[name]["partitions"]
                    if (r["topic"], r["partition"]) not in stuck
                ),
                f"{name}'s other partitions caught up",
            )
        table = CliRunner().invoke(main, ["project", "status", APP, "--data", str(data)], env=env)
        assert "waiting for code that knows GuestRegistered v2" in table.stdout
        assert dead_letters(data) == 0
        # Deploy: the code on disk becomes release 2; SIGHUP rolls every worker.
        release.write_text("2")
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: all(d["lag"] == 0 and not d["waiting"] for d in status(data, env).values()),
            "caught up after the deploy",
            timeout=240,
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert dead_letters(data) == 0
    with deployapp.app.open(data) as runtime:
        guests = fold_guests(runtime.log)
        with sqlite3.connect(readmodel_path(data, "guests")) as db:
            rows = {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, name, events FROM guests")}
        assert rows == guests
        bookings = {e["aggregate_id"]: e["data"]["guest_id"] for e in raw(runtime.log, "bookings")}
        confirmed = [
            e for e in raw(runtime.log, "confirmations") if e["type"] == "BookingConfirmed"
        ]
    assert Counter(e["data"]["booking_id"] for e in confirmed) == Counter(
        dict.fromkeys(bookings, 1)
    )
    for e in confirmed:
        assert e["data"]["guest_name"] == guests[bookings[e["data"]["booking_id"]]][0]
