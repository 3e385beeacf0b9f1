"""A projection in PostgreSQL survives the loss of a host (issue 34): the bank app's
``balances`` projection on a 3-node JetStream cluster, its workers on two simulated hosts,
each in a network namespace of its own with its own local directory, the read model in a
PostgreSQL server on a third host, reachable from both (tests/jetstream/ns_hosts.py).

Scenario: workers on hosts A and B share the partitions; host A is cut off from every
other host (its port on the bridge goes down: packets dropped, its sockets stay open) while
events keep coming; host B's worker takes every partition after the session timeout and
applies them; host A comes back (its worker, a zombie with a batch in hand, is fenced by
the read model) and is killed with SIGKILL; host B owns every partition, the lag reaches 0.

Oracle (the child ``check``, tests/jetstream/pg_failover_procs.py): the balances equal a fold
of the raw records, and the ``applied`` marker table (one row per applied event, its
primary key refuses a second) holds every event's coordinates exactly once: no event
applied twice, none skipped; no dead letters.

Namespaces need root and ``ip``; elsewhere the test skips and says why, except in CI
(``CI=true``), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ns_hosts import Hosts, NamespaceCluster, require_namespaces

from eventlane.testing.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
PROCS = Path(__file__).parent / "pg_failover_procs.py"
APP = "tests.projection.bankapp:app"
A, B, DB = 0, 1, 2  # client hosts
SESSION_MS = 3000


@pytest.fixture
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_namespaces("the PostgreSQL failover test")
    tmp = tmp_path_factory.mktemp("pgfail")
    hosts = Hosts(3, clients=3)
    cluster = NamespaceCluster.on(hosts, tmp / "nats")
    server: PostgresServer | None = None
    try:
        hosts.create()
        cluster.start(timeout=60)
        server = PostgresServer.start(
            Path(tempfile.mkdtemp(prefix="eventlane-pg-")),  # the postgres user must reach it
            host=hosts.client_addr(DB),
            port=5432,
            prefix=tuple(hosts.run_in_client(DB)),
            trust="10.211.0.0/24",
        )
        yield {"hosts": hosts, "cluster": cluster, "pg": server, "tmp": tmp}
    finally:
        if server is not None:
            server.stop()  # by PID
            shutil.rmtree(server.directory, ignore_errors=True)
        cluster.stop()  # by PID
        hosts.remove()


def child(site: dict[str, Any], role: str, **args: Any) -> Any:
    base = {
        "url": site["cluster"].url,
        "namespace": site["namespace"],
        "readmodels": site["pg"].url,
        "local": str(site["tmp"] / "db-host"),
    }
    done = subprocess.run(
        [
            *site["hosts"].run_in_client(DB),
            sys.executable,
            str(PROCS),
            role,
            json.dumps(base | args),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"{role} failed: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_worker(site: dict[str, Any], host: int) -> subprocess.Popen[bytes]:
    data = site["tmp"] / f"host-{host}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "EVENTLANE_LOG": f"{site['cluster'].url}?namespace={site['namespace']}",
        "EVENTLANE_READMODELS": site["pg"].url,
        "EVENTLANE_LOG_LEVEL": "info",
    }
    cmd = [
        *site["hosts"].run_in_client(host),
        sys.executable,
        "-m",
        "eventlane.cli",
        "--data",
        str(data),
        "project",
        "worker",
        APP,
        "balances",
        "--session-timeout-ms",
        str(SESSION_MS),
        "--max-poll-records",
        "100",
    ]
    with (site["tmp"] / f"worker-{host}.log").open("ab") as sink:
        return subprocess.Popen(cmd, env=env, stdout=sink, stderr=sink, cwd=ROOT)


def until(site: dict[str, Any], what: str, timeout: float, **condition: Any) -> float:
    """Wait (polling in one child process) until ``condition`` holds; return the seconds."""
    done = child(site, "wait", timeout=timeout, **condition)
    if not done["ok"]:
        logs = "\n".join(
            p.read_text(errors="replace")[-3000:] for p in site["tmp"].glob("worker-*.log")
        )
        raise AssertionError(f"timed out waiting for {what}: {done['last']}\n{logs}")
    return float(done["seconds"])


def test_a_postgresql_projection_survives_the_loss_of_a_host(site: dict[str, Any]) -> None:
    site["namespace"] = "f" + uuid.uuid4().hex[:10]
    hosts: Hosts = site["hosts"]
    child(site, "produce", start=0, count=400)
    worker_a = start_worker(site, A)
    worker_b = start_worker(site, B)
    a, b = str(worker_a.pid), str(worker_b.pid)
    try:
        until(site, "both workers owning partitions", 120, until="owners", pids=[a, b])
        child(site, "produce", start=400, count=400)
        hosts.cut_client(A)
        cut_at = time.monotonic()
        child(site, "produce", start=800, count=400)  # while host A is gone
        until(site, "host B owning every partition", 90, until="owners", pids=[b])
        took = time.monotonic() - cut_at
        print(f"host B took every partition {took:.1f} s after the cut")
        child(site, "produce", start=1200, count=200)
        hosts.heal_client(A)  # the zombie comes back: whatever it had in hand is fenced
        time.sleep(SESSION_MS / 1000)
        worker_a.send_signal(signal.SIGKILL)
        worker_a.wait()
        child(site, "produce", start=1400, count=200)
        until(site, "host B owning every partition after the kill", 90, until="owners", pids=[b])
        until(site, "lag 0", 120, until="caught_up")
        assert worker_b.poll() is None, "host B's worker died"
        doc = child(site, "check")
        assert sum(doc["hwm"].values()) == 1600
        assert doc["balances"] == doc["fold"]
        markers = [tuple(m) for m in doc["markers"]]
        assert len(markers) == len(set(markers)), "an event was applied twice"
        assert set(markers) == {tuple(e) for e in doc["events"]}, "an event was skipped"
        assert doc["dead_letters"] == 0
        assert took < 60
    finally:
        for proc in (worker_a, worker_b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)  # by PID
                proc.wait()
