"""``/metrics`` (issue 31 item 2): a supervisor of real worker processes of the invoicing app
serves Prometheus metrics; a test scrapes them with prometheus_client's own parser and holds
them against what ``eventlane groups describe`` and ``project status`` say and against the
log itself; kill -9 of a worker leaves the endpoint answering, the dead worker's counts kept.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventlane.codec.envelope import HEADER_TYPE, HEADER_VERSION
from example_apps.invoicing import app
from example_apps.invoicing.workload import Workload

APP = "example_apps.invoicing:app"
PROJECTOR = "orders_by_status"
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(data: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "eventlane.cli", "--data", str(data), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return samples


def _sum(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


def _status(data: Path) -> dict:  # type: ignore[type-arg]
    [doc] = json.loads(_cli(data, "project", "status", APP, "-p", PROJECTOR, "--json"))[
        "projectors"
    ]
    return doc  # type: ignore[no-any-return]


def _until(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def test_metrics_of_a_supervised_projection(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = _free_port()
    with app.open(data) as runtime:  # topics exist before the workers join
        pass
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventlane.cli",
            "--data",
            str(data),
            "project",
            "run",
            APP,
            "-p",
            PROJECTOR,
            "--workers",
            "2",
            "--no-live",
            "--metrics-port",
            str(port),
            "--session-timeout-ms",
            "3000",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:

        def members() -> bool:
            doc = _status(data)
            return sum(1 for m in doc["members"] if m["alive"] and m["assignment"]) == 2

        _until(members, 120, "both workers to own partitions")
        with app.open(data) as runtime:
            for command in Workload(orders=60, seed=3).commands():
                runtime.execute(
                    command.cls, command.aggregate_id, command.action, create=command.create
                )
            topic = runtime.names.aggregate_topic(
                next(a for a in app.aggregates if a.topic == "orders")
            )
            # one record no code can decode: a dead letter, counted by status and instrument
            runtime.log.append(
                topic,
                0,
                [
                    (
                        b"o-bad",
                        b"{not json",
                        ((HEADER_TYPE, b"OrderConfirmed"), (HEADER_VERSION, b"1")),
                        None,
                    )
                ],
            )
            records = sum(
                runtime.log.offsets(topic, p).hwm for p in range(runtime.log.partition_count(topic))
            )

        def settled() -> dict | None:  # type: ignore[type-arg]
            doc = _status(data)
            return doc if doc["lag"] == 0 else None

        status = _until(settled, 180, "lag 0")
        group = status["group"]

        def group_committed() -> dict | None:  # type: ignore[type-arg]
            doc = json.loads(_cli(data, "groups", "describe", group, "--json"))
            return doc if all(r["lag"] == 0 for r in doc["offsets"]) else None

        described = _until(group_committed, 60, "the group's commits to catch up")
        samples = _scrape(port)

        # the state read at scrape time is what the CLI says
        assert _sum(samples, "eventlane_projection_lag", projector=PROJECTOR) == 0
        for row in described["offsets"]:
            labels = {"group": group, "topic": row["topic"], "partition": str(row["partition"])}
            assert _sum(samples, "eventlane_consumer_group_lag", **labels) == row["lag"]
            assert (
                _sum(samples, "eventlane_consumer_group_committed_offset", **labels)
                == row["committed"]
            )
        letters = status["dead_letters"]
        assert letters.get("dead", 0) == 1
        assert (
            _sum(samples, "eventlane_projection_dead_letters", projector=PROJECTOR, status="dead")
            == 1
        )
        assert _sum(samples, "eventlane_projection_breaker_open", projector=PROJECTOR) == 0
        assert _sum(samples, "eventlane_consumer_group_members", group=group) == 2
        # the workers' instruments, summed over both processes: every record once
        consumed = _sum(samples, "eventlane_consumer_records_total", group=group, topic=topic)
        assert consumed == records
        applied = _sum(samples, "eventlane_projection_events_applied_total", projector=PROJECTOR)
        assert 0 < applied <= records - 1
        assert _sum(samples, "eventlane_projection_dead_letters_total", projector=PROJECTOR) == 1
        assert _sum(samples, "eventlane_projection_batch_seconds_count", projector=PROJECTOR) > 0

        # every query of the shipped Grafana dashboard names a metric this endpoint exports
        # (but the command path's and JetStream's: tests/store/test_store_instruments.py and
        # tests/jetstream/test_js_instruments.py check those against their endpoints)
        dashboard = (ROOT / "docs" / "grafana" / "eventlane.json").read_text()
        elsewhere = re.compile(r"eventlane_(?:log_append|log_fsync|store_|jetstream_)")
        queried = {
            name
            for name in re.findall(r"eventlane_[a-z_]+", dashboard)
            if not elsewhere.match(name)
        }
        exported = set(samples)
        assert queried and queried <= exported, queried - exported

        # kill -9 of one worker: the endpoint keeps answering, its counts are kept
        pids = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-P", str(proc.pid)], check=False, capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(pids) == 2
        os.kill(pids[0], signal.SIGKILL)
        time.sleep(1.0)
        after = _scrape(port)
        assert _sum(after, "eventlane_consumer_records_total", group=group, topic=topic) == consumed
        assert _sum(after, "eventlane_projection_lag", projector=PROJECTOR) == 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode in (0, -signal.SIGTERM), (
        proc.stderr.read().decode() if proc.stderr else ""
    )


def test_metrics_port_without_the_extra_says_what_to_install(tmp_path: Path) -> None:
    """No prometheus_client: a clear error naming the extra, exit status 1 (simulated by
    hiding the module from the child's import system)."""
    code = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None\n"
        "from eventlane.cli import main\n"
        f"main(['--data', {str(tmp_path / 'd')!r}, 'project', 'run', {APP!r}, '-p', 'invoices',"
        " '--no-live', '--metrics-port', '0'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1
    assert "pip install 'eventlane[metrics]'" in done.stderr


@pytest.mark.parametrize("disabled", [True])
def test_instruments_are_off_until_enabled(disabled: bool) -> None:
    """``import eventlane`` and a worker without a metrics endpoint never import
    prometheus_client (the instruments are one attribute test when off)."""
    code = (
        "import sys\n"
        "import eventlane.projection.worker, eventlane.metrics as m\n"
        "print(m.M.on, 'prometheus_client' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.split() == ["False", "False"]
