"""Immediate hand-over on a known death (issue 32 item 2) on the JetStream cluster: the
runner's leave on the dead worker's behalf goes through the KV coordinator's
compare-and-set; the scenario is tests/projection/handover_kit.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from eventlane.app import Runtime
from eventlane.consumer.coordination import coordination_for
from eventlane.log import Log
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "projection"))
from handover_kit import APP, fold, kill_one_of_two, lag, read_model  # noqa: E402
from projection_kit import Producer, child_env  # noqa: E402

from tests.projection import bankapp  # noqa: E402


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return tmp_path / "host-a"


@pytest.fixture
def js_runtime(cluster: LocalCluster, namespace: str, host: Path) -> Iterator[Runtime]:
    with JetStreamLog.from_url(cluster.url, namespace=namespace, local=LocalDir.at(host)) as js:
        with bankapp.app.open(cast(Log, js)) as rt:
            yield rt


def test_kill9_of_one_worker_of_two_moves_its_partitions_at_once_on_jetstream(
    js_runtime: Runtime, cluster: LocalCluster, namespace: str, host: Path, tmp_path: Path
) -> None:
    producer = Producer(js_runtime)
    env = child_env(EVENTLANE_LOG=f"{cluster.url}?namespace={namespace}")
    figures = kill_one_of_two(js_runtime, host, env, producer.deposits, tmp_path / "workers.log")
    print("hand-over on JetStream:", figures["handover_s"], "s", file=sys.stderr)
    assert figures["handover_s"] < 2.0, figures  # the session timeout is 20 s
    assert [pid for pid, _ in figures["handed_over"]] == [figures["victim"]]
    assert figures["fold_equal"], figures
    assert figures["applied_once"], figures
    assert os.path.exists(host / "readmodels")


def test_eventlane_run_with_a_nats_log_hands_over_at_once(
    js_runtime: Runtime, cluster: LocalCluster, namespace: str, host: Path, tmp_path: Path
) -> None:
    """``eventlane run --log nats://...`` (item 1 on JetStream): kill -9 of one of its two
    workers; the other owns every partition within 2 s; SIGTERM stops it cleanly."""
    producer = Producer(js_runtime)
    producer.deposits(2_000)
    url = f"{cluster.url}?namespace={namespace}"
    cli = "from eventlane.cli import main; main(prog_name='eventlane')"
    args = ["run", APP, "--only", "balances", "-w", "2", "--session-timeout-ms", "20000"]
    proc = subprocess.Popen(
        [sys.executable, "-c", cli, *args, "--data", str(host), "--log", url],
        env=child_env(EVENTLANE_LOG_LEVEL="warning"),
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "run.log").open("wb"),
    )
    coord = coordination_for(js_runtime.log).coordinator(js_runtime.names.group("balances"))
    every = 6  # the accounts topic's partitions

    def owners() -> dict[int, int]:
        with coord.locked() as state:
            return {m.pid: len(m.owned) for m in state.members.values()}

    def wait(cond: object, what: str, timeout: float = 120.0) -> float:
        t0 = time.monotonic()
        while not cond():  # type: ignore[operator]
            assert time.monotonic() - t0 < timeout, f"timed out: {what}"
            time.sleep(0.02)
        return time.monotonic() - t0

    try:
        wait(lambda: len(owners()) == 2 and all(owners().values()), "two members")
        victim = min(owners())
        os.kill(victim, signal.SIGKILL)
        moved = wait(
            lambda: victim not in (o := owners()) and sum(o.values()) == every,
            "the survivor owning every partition",
            timeout=30,
        )
        print(f"eventlane run on JetStream: hand-over {moved:.3f} s", file=sys.stderr)
        assert moved < 2.0
        producer.deposits(500)
        wait(lambda: lag(js_runtime, host) == 0, "lag 0", timeout=180)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        coord.close()
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    balances, coords = fold(js_runtime.log)
    got, applied = read_model(host)
    assert got == balances
    assert sorted(applied) == sorted(coords)
