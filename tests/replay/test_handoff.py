"""Hand-off edge cases with the local engine (no Spark): a worker that does not pause, no
live workers at all, and a file another connection keeps open. The hand-off under load
with live worker processes is in ``test_spark.py``."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from eventlane.cli import main
from eventlane.errors import ReplayError
from eventlane.projection import ReadModelView, readmodel_path
from eventlane.projection.pause import PauseControl
from eventlane.replay.handoff import rebuild_and_swap, shadow_path, swap_file
from tests.replay import replay_app
from tests.replay.conftest import APP, Procs, expected_markers, make_history, rows


def positions(data: Path) -> dict[object, int]:
    with ReadModelView(readmodel_path(data, "sales")) as view:
        return dict(view.positions())


def wait_for(cond: object, timeout: float, procs: Procs, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{procs.output()}")
        time.sleep(0.1)


def test_a_worker_that_does_not_pause_aborts_the_hand_off(tmp_path: Path, procs: Procs) -> None:
    gen = make_history(tmp_path / "data", 300)
    data = gen.data
    live = readmodel_path(data, "sales")
    worker = procs.worker(data, "sales", 0)
    wait_for(lambda: live.exists() and positions(data), 60, procs, "the worker to start")
    time.sleep(1.0)
    before = positions(data)
    inode = live.stat().st_ino
    worker.send_signal(signal.SIGSTOP)  # frozen: still a member for its 3 s session timeout
    try:
        with replay_app.app.open(data, create_topics=False) as runtime:
            with pytest.raises(ReplayError, match="did not pause"):
                rebuild_and_swap(runtime, "sales", engine="local", pause_timeout=1.0)
    finally:
        worker.send_signal(signal.SIGCONT)
    assert live.stat().st_ino == inode  # nothing swapped
    assert not PauseControl(data, "sales").path.exists()
    assert not shadow_path(data, "sales").exists()
    # the worker goes on with the live file as if nothing happened
    with replay_app.app.open(data, create_topics=False) as runtime:
        replay_app.History(runtime.log, seed=99).add(20)
    wait_for(lambda: positions(data) != before, 30, procs, "the worker to go on")
    assert worker.poll() is None


def test_hand_off_without_live_workers(tmp_path: Path) -> None:
    gen = make_history(tmp_path / "data", 300)
    data = gen.data
    live = readmodel_path(data, "sales")
    with replay_app.app.open(data, create_topics=False) as runtime:
        result = rebuild_and_swap(runtime, "sales", engine="local")
    assert result.members == [] and result.final_records == 0
    assert set(rows(live, "SELECT topic, partition, offset FROM applied")) == expected_markers(data)
    assert rows(live, "PRAGMA journal_mode") == [("wal",)]
    assert not Path(f"{shadow_path(data, 'sales')}-wal").exists()
    assert {d.topic for d in result.dead_letters} == {"payments"}


def test_swap_refuses_a_file_another_connection_keeps_open(tmp_path: Path) -> None:
    live, shadow = tmp_path / "live.sqlite", tmp_path / "shadow.sqlite"
    for path, value in ((live, "old"), (shadow, "new")):
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE t (v TEXT)")
        conn.execute("INSERT INTO t VALUES (?)", (value,))
        conn.commit()
        conn.close()
    holder = sqlite3.connect(live, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM t").fetchall()  # a reader in the middle of a transaction
    with pytest.raises(ReplayError, match="keeps the live read model open"):
        swap_file(live, shadow, timeout=0.5)
    assert rows(live, "SELECT v FROM t") == [("old",)] and shadow.exists()
    holder.execute("COMMIT")
    holder.close()
    swap_file(live, shadow, timeout=5)
    assert rows(live, "SELECT v FROM t") == [("new",)] and not shadow.exists()
    assert not Path(f"{live}-wal").exists() or Path(f"{live}-wal").stat().st_size == 0


def test_cli_swap(tmp_path: Path) -> None:
    gen = make_history(tmp_path / "data", 200)
    args = ["rebuild", APP, "-p", "sales", "--engine", "local", "--data", str(gen.data)]
    runner = CliRunner()
    bad = runner.invoke(main, [*args, "--swap", "--output", str(tmp_path / "x.sqlite")])
    assert bad.exit_code == 2 and "exclude each other" in bad.output
    done = runner.invoke(main, [*args, "--swap", "--verify", "--json"])
    assert done.exit_code == 0, done.output
    body = orjson.loads(done.stdout)
    assert body["handoff"]["members"] == [] and body["rebuild"]["engine"] == "local"
    live = readmodel_path(gen.data, "sales")
    assert set(rows(live, "SELECT topic, partition, offset FROM applied")) == expected_markers(
        gen.data
    )
    # a second rebuild verifies against the swapped-in model, which now stands at E
    again = runner.invoke(main, [*args, "--output", str(tmp_path / "y.sqlite"), "--verify"])
    assert again.exit_code == 0, again.output
    assert "DIFFERENT" not in again.stdout and "equal" in again.stdout


def test_a_pause_whose_requester_died_or_expired_is_lifted(tmp_path: Path) -> None:
    control = PauseControl(tmp_path, "sales")
    assert control.requested() is None
    token = control.request(expires_in=60)
    assert control.requested() == token
    body = orjson.loads(control.path.read_bytes())
    dead = subprocess.Popen(["true"])
    dead.wait()
    control.path.write_bytes(orjson.dumps({**body, "pid": dead.pid}))
    assert control.requested() is None  # the requester is gone: workers go on
    control.path.write_bytes(orjson.dumps({**body, "expires_ms": body["requested_ms"] - 1}))
    assert control.requested() is None  # lapsed
    control.ack("member-1", token)
    assert control.acked(token) == {"member-1"}
    control.resume()
    assert not control.path.exists() and control.acked(token) == set()
