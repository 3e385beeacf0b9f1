"""Projectors and policies across simulated hosts on the cluster (issue 13).

A simulated host is a separate local directory (``--data``) with its own worker processes;
hosts share nothing but the cluster (the log, the group state and the offsets). The
invoicing policy's workers on two hosts share the ``orders`` partitions and stay
exactly-once in effect (one InvoiceIssued per confirmed order) through a kill -9; a
projection whose read model is a SQLite file refuses to start a worker on a second host.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventlane.app import Runtime
from eventlane.consumer.coordination import coordination_for
from eventlane.consumer.jetstream import JetStreamCoordination, group_key
from eventlane.log import Log, TopicPartition
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir
from eventlane.projection import Runner, Worker
from example_apps.invoicing import app
from example_apps.invoicing.domain import invoice_id_for
from example_apps.invoicing.workload import Workload

APP = "example_apps.invoicing:app"
ROOT = Path(__file__).resolve().parents[2]


def _raw(log: Log, topic: str) -> list[dict[str, Any]]:
    out = []
    for p in range(log.partition_count(topic)):
        marks = log.offsets(topic, p)
        offset = marks.lwm
        while offset < marks.hwm:
            records, _ = log.read(topic, p, offset)
            if not records:
                break
            out.extend(orjson.loads(r.value or b"null") for r in records)
            offset = records[-1].offset + 1
    return out


@pytest.fixture
def url(cluster: LocalCluster, namespace: str) -> str:
    return f"{cluster.url}?namespace={namespace}"


@pytest.fixture
def runtime(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[Runtime]:
    local = LocalDir.at(tmp_path / "commands")
    with JetStreamLog.from_url(cluster.url, namespace=namespace, local=local) as js:
        with app.open(js) as rt:
            yield rt


def _env(url: str) -> dict[str, str]:
    # info: the workers' logs say every assignment, revocation and refused commit, so a
    # failure here can be read from the assertion message alone
    return {
        **os.environ,
        "EVENTLANE_LOG": url,
        "PYTHONPATH": str(ROOT),
        "EVENTLANE_LOG_LEVEL": "info",
    }


def _group_report(runtime: Runtime, hosts: list[Path], log_name: str) -> str:
    """Where the policy's group stands (committed vs HWM per partition, members and what
    they own) and the tail of every host's worker log: the message of a failed wait."""
    coordination = coordination_for(runtime.log)
    coord = coordination.coordinator("invoicing_policy")
    state = coord.current()
    coord.close()
    lines = [f"generation {state.generation}"]
    for m in state.members.values():
        lines.append(
            f"member pid={m.pid} joined={m.joined_generation} synced={m.synced_generation} "
            f"owned={[tp.partition for tp in sorted(m.owned)]} "
            f"target={[tp.partition for tp in sorted(m.target)]}"
        )
    for p in range(runtime.log.partition_count("orders")):
        entry = coordination.offsets.committed("invoicing_policy", TopicPartition("orders", p))
        hwm = runtime.log.offsets("orders", p).hwm
        lines.append(f"orders/{p}: committed {entry.offset if entry else None} hwm {hwm}")
    for host in hosts:
        path = host / log_name
        tail = path.read_text()[-3000:] if path.exists() else "(no log)"
        lines.append(f"--- {path}:\n{tail}")
    for m in state.members.values():  # what each live member's threads are doing now
        lines.append(f"--- threads of member pid={m.pid}:\n{_stacks(m.pid)}")
    return "\n".join(lines)


def _stacks(pid: int) -> str:
    """The Python stacks of every thread of ``pid`` (py-spy, a dev dependency), so that a
    stalled member names what it waits on (a policy stalled once under the full suite's
    load, owning its partitions for two minutes without a commit, and did not again in 23
    runs alone)."""
    spy = _py_spy()
    if spy is None:
        return "(py-spy not installed)"
    try:
        done = subprocess.run(
            [str(spy), "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError) as exc:
        return f"(py-spy gave no stacks: {exc})"
    return (done.stdout + done.stderr)[-6000:]


def _py_spy() -> Path | None:
    """py-spy's binary, found through its package's files: not next to ``sys.executable``
    in a virtual environment layered over another (a worktree's over main's)."""
    try:
        dist = importlib.metadata.distribution("py-spy")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == "py-spy":
            path = Path(str(dist.locate_file(file))).resolve()
            if path.exists():
                return path
    return None


def _host(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def test_a_read_model_projection_refuses_a_worker_on_another_host(
    runtime: Runtime, url: str, tmp_path: Path
) -> None:
    host_a, host_b = _host(tmp_path, "host-a"), _host(tmp_path, "host-b")
    runner = Runner(APP, "invoices", host_a, env=_env(url), log_path=host_a / "workers.log")
    runner.start()
    try:
        coordination = coordination_for(runtime.log)
        assert isinstance(coordination, JetStreamCoordination)
        deadline = time.monotonic() + 60
        while coordination.kv.get(group_key("invoices", "home"))[0] is None:
            assert time.monotonic() < deadline, (host_a / "workers.log").read_text()
            assert runner.supervise_once() == []
            time.sleep(0.1)
        home = coordination.kv.get(group_key("invoices", "home"))[0]
        assert home is not None and str(host_a / "readmodels") in home.decode()
        worker = ["project", "worker", APP, "invoices"]
        other = subprocess.run(
            [sys.executable, "-m", "eventlane.cli", "--data", str(host_b), *worker],
            check=False,
            env=_env(url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert other.returncode == 2, other.stderr  # cannot start: not restarted by a runner
        assert "keeps its read model at" in other.stderr and str(host_a) in other.stderr
        assert "runs its workers on the host that holds the file" in other.stderr
        assert not (host_b / "readmodels" / "invoices.sqlite").exists()
        again = Runner(APP, "invoices", host_a, env=_env(url))  # the home host: fine
        again.start()
        time.sleep(3)
        assert again.supervise_once() == [] and runner.supervise_once() == []
        again.stop()
    finally:
        runner.stop()


def test_the_policy_stays_exactly_once_across_hosts_through_a_kill9(
    runtime: Runtime, url: str, tmp_path: Path
) -> None:
    hosts = [_host(tmp_path, "host-a"), _host(tmp_path, "host-b")]
    runners = [
        Runner(
            APP,
            "invoicing_policy",
            host,
            restart=True,
            session_timeout_ms=2000,
            env=_env(url),
            log_path=host / "workers.log",
        )
        for host in hosts
    ]
    for r in runners:
        r.start()
    try:
        coordination = coordination_for(runtime.log)
        deadline = time.monotonic() + 90
        while True:  # both hosts' workers are members and share the partitions
            coord = coordination.coordinator("invoicing_policy")
            state = coord.current()
            coord.close()
            owners = {m.pid: len(m.owned) for m in state.members.values()}
            if all(owners.get(r.procs[0].pid, 0) > 0 for r in runners):
                break
            assert time.monotonic() < deadline, owners
            for r in runners:
                assert r.supervise_once() == []
            time.sleep(0.2)
        commands = list(Workload(orders=60, seed=13).commands())
        for i, command in enumerate(commands):
            runtime.execute(
                command.cls, command.aggregate_id, command.action, create=command.create
            )
            if i == len(commands) // 2:  # kill -9 host A's worker mid-run
                os.kill(runners[0].procs[0].pid, signal.SIGKILL)
            if i % 20 == 0:
                for r in runners:
                    r.supervise_once()
        confirmed = {
            e["aggregate_id"] for e in _raw(runtime.log, "orders") if e["type"] == "OrderConfirmed"
        }
        assert confirmed
        offsets = coordination_for(runtime.log).offsets
        tps = [TopicPartition("orders", p) for p in range(runtime.log.partition_count("orders"))]

        def caught_up() -> bool:
            for tp in tps:
                entry = offsets.committed("invoicing_policy", tp)
                if entry is None or entry.offset != runtime.log.offsets(tp.topic, tp.partition).hwm:
                    return False
            return True

        deadline = time.monotonic() + 120
        while not caught_up():
            assert time.monotonic() < deadline, "the policy's group never caught up\n" + (
                _group_report(runtime, hosts, "workers.log")
            )
            for r in runners:
                r.supervise_once()
            time.sleep(0.2)
        assert runners[0].restarts >= 1 or runners[0].crashes
    finally:
        for r in runners:
            r.stop()
    invoice_events = _raw(runtime.log, "invoices")
    issued = Counter(e["aggregate_id"] for e in invoice_events if e["type"] == "InvoiceIssued")
    assert [i for i, n in issued.items() if n > 1] == [], "an invoice was issued twice"
    assert set(issued) == {invoice_id_for(o) for o in confirmed}
    # Both hosts applied partitions (positions in their own local files); nothing of the
    # group lives on either host's disk.
    for host in hosts:
        with sqlite3.connect(host / "readmodels" / "invoicing_policy.sqlite") as db:
            rows = db.execute("SELECT count(*) FROM _eventlane_positions").fetchone()
        assert rows[0] > 0, (host / "workers.log").read_text()[-2000:]
        assert not (host / "groups").exists()


def test_a_policy_back_on_a_host_with_older_positions_never_commits_backwards(
    runtime: Runtime, url: str, tmp_path: Path
) -> None:
    """Host A applies some orders and stops; host B carries on; A comes back alone with
    its local positions behind the group's commits. A resumes from the commits and, idle,
    must not commit its older local positions (the group's lag would reappear and stay)."""
    host_a, host_b = _host(tmp_path, "host-a"), _host(tmp_path, "host-b")
    offsets = coordination_for(runtime.log).offsets
    tps = [TopicPartition("orders", p) for p in range(runtime.log.partition_count("orders"))]
    workload = list(Workload(orders=30, seed=5).commands())

    def commits() -> dict[TopicPartition, int]:
        got = {tp: offsets.committed("invoicing_policy", tp) for tp in tps}
        return {tp: e.offset for tp, e in got.items() if e is not None}

    def hwms() -> dict[TopicPartition, int]:
        return {tp: runtime.log.offsets(tp.topic, tp.partition).hwm for tp in tps}

    def run_until_caught_up(host: Path, commands: list[Any]) -> None:
        runner = Runner(APP, "invoicing_policy", host, env=_env(url), log_path=host / "w.log")
        runner.start()
        try:
            for command in commands:
                runtime.execute(
                    command.cls, command.aggregate_id, command.action, create=command.create
                )
            deadline = time.monotonic() + 90
            while commits() != hwms():
                assert time.monotonic() < deadline, (commits(), hwms())
                assert runner.supervise_once() == [], (host / "w.log").read_text()[-2000:]
                time.sleep(0.2)
        finally:
            runner.stop()

    half = len(workload) // 2
    run_until_caught_up(host_a, workload[:half])
    run_until_caught_up(host_b, workload[half:])
    reached = commits()
    runner = Runner(APP, "invoicing_policy", host_a, env=_env(url), log_path=host_a / "w2.log")
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while True:  # A owns the partitions again, idle past its group-commit interval
            coord = coordination_for(runtime.log).coordinator("invoicing_policy")
            state = coord.current()
            coord.close()
            if sum(len(m.owned) for m in state.members.values()) == len(tps):
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(3)
        assert runner.supervise_once() == []
    finally:
        runner.stop()
    assert commits() == reached == hwms()


class _PolicyGroup:
    """The invoicing policy's group on ``orders`` as the tests below read it: the group's
    commits and the partitions' HWMs, per partition; ``execute`` runs workload commands."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime, self.log = runtime, runtime.log
        self.tps = [TopicPartition("orders", p) for p in range(self.log.partition_count("orders"))]
        self._offsets = coordination_for(self.log).offsets

    def commits(self) -> dict[TopicPartition, int | None]:
        got = {tp: self._offsets.committed("invoicing_policy", tp) for tp in self.tps}
        return {tp: None if e is None else e.offset for tp, e in got.items()}

    def hwms(self) -> dict[TopicPartition, int]:
        return {tp: self.log.offsets(tp.topic, tp.partition).hwm for tp in self.tps}

    def execute(self, chunk: list[Any]) -> None:
        for c in chunk:
            self.runtime.execute(c.cls, c.aggregate_id, c.action, create=c.create)


def test_a_revoke_commits_the_partitions_the_policy_keeps(
    runtime: Runtime, url: str, tmp_path: Path
) -> None:
    """A revoke must not leave the kept partitions' applied positions uncommitted.

    Seen twice under the full suite's load (the kill -9 test above): a member applied its
    last records, then gave up other partitions to a member that (re)joined before its
    group-commit interval came round; the revoke committed only the partitions it gave up
    and marked the worker "all committed", so, idle, it never committed the ones it kept:
    it owned them for minutes with the group's offsets where it had been assigned them.

    Here the interval is a minute and this worker is driven in this process, so the window
    (records applied, not yet committed, then a revoke) is certain; the joining member is a
    worker process on a second host."""
    worker = Worker(
        runtime,
        "invoicing_policy",
        session_timeout_ms=3000,
        poll_timeout=0.1,
        group_commit_interval_s=60.0,
    )
    group = _PolicyGroup(runtime)
    tps, commits, hwms, execute = group.tps, group.commits, group.hwms, group.execute
    commands = list(Workload(orders=20, seed=7).commands())

    def turn(until: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, f"{what}: commits {commits()} hwms {hwms()}"
            worker.run_once()

    other: Runner | None = None
    try:
        turn(lambda: len(worker.consumer.assignment()) == len(tps), "the worker owns all")
        execute(commands[:5])  # a first commit (claimed positions or a batch) starts the interval
        turn(lambda: None not in commits().values(), "a first commit")
        execute(commands[5:])  # applied within the interval: not committed yet
        turn(lambda: worker.readmodel.positions() == hwms(), "the worker applied all")
        assert commits() != hwms()  # the window is open: applied, not committed
        host_b = _host(tmp_path, "host-b")
        other = Runner(
            APP,
            "invoicing_policy",
            host_b,
            session_timeout_ms=3000,
            env=_env(url),
            log_path=host_b / "workers.log",
        )
        other.start()
        turn(lambda: len(worker.consumer.assignment()) < len(tps), "a revoke", timeout=90)
        kept = sorted(worker.consumer.assignment())
        assert kept
        # far inside the minute's interval: what committed it can only be the revoke
        turn(
            lambda: all(commits()[tp] == hwms()[tp] for tp in kept),
            f"the kept partitions {[tp.partition for tp in kept]} committed",
            timeout=10,
        )
        assert other.supervise_once() == []
    finally:
        worker.stopping.set()
        worker.close()
        if other is not None:
            other.stop()


_POLICY_WORKER = """
import sys
from pathlib import Path
from example_apps.invoicing import app
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir
from eventlane.projection import Worker
url, namespace, host = sys.argv[1:]
local = LocalDir.at(Path(host))
with JetStreamLog.from_url(url, namespace=namespace, local=local) as js, app.open(js) as rt:
    Worker(rt, "invoicing_policy", session_timeout_ms=2000, group_commit_interval_s=60.0).run()
"""


def _positions(host: Path) -> dict[TopicPartition, int]:
    path = host / "readmodels" / "invoicing_policy.sqlite"
    if not path.exists():
        return {}
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT topic, partition, next_offset FROM _eventlane_positions")
        return {TopicPartition(t, p): o for t, p, o in rows}


def test_a_restarted_policy_commits_what_its_killed_predecessor_applied(
    runtime: Runtime, cluster: LocalCluster, namespace: str, url: str, tmp_path: Path
) -> None:
    """A worker killed after applying records it had not committed yet (its interval a
    minute here), restarted on the same host: it resumes from its file's positions, ahead of
    the group's commits, and with nothing new to apply must still commit them (else the
    group shows that lag, idle, for ever: the same stall as above)."""
    host = _host(tmp_path, "host-a")
    group = _PolicyGroup(runtime)
    commits, hwms, execute = group.commits, group.hwms, group.execute
    commands = list(Workload(orders=20, seed=11).commands())

    def wait(until: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, f"{what}: commits {commits()} hwms {hwms()}"
            time.sleep(0.1)

    first = subprocess.Popen(
        [sys.executable, "-c", _POLICY_WORKER, cluster.url, namespace, str(host)],
        env=_env(url),
        stderr=(host / "first.log").open("w"),
    )
    runner: Runner | None = None
    try:
        execute(commands[:5])
        wait(lambda: None not in commits().values(), "a first commit")  # the interval starts
        execute(commands[5:])
        wait(lambda: _positions(host) == hwms(), "the first worker applied all")
        assert commits() != hwms()  # applied, not committed: then kill -9
        first.kill()
        first.wait(10)
        runner = Runner(
            APP,
            "invoicing_policy",
            host,
            session_timeout_ms=2000,
            env=_env(url),
            log_path=host / "workers.log",
        )
        runner.start()
        wait(lambda: commits() == hwms(), "the restarted worker committed", timeout=45)
        assert runner.supervise_once() == []
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        if runner is not None:
            runner.stop()
