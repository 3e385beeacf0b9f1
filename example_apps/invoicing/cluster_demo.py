"""The invoicing demo on a replicated cluster (``eventlane demo invoicing --cluster`` or
``--kafka``).

It starts (or restarts) a local 3-node NATS JetStream cluster with its data under
``<data>/cluster`` (``eventlane cluster up`` does the same by hand), or with ``--kafka`` a
local 3-broker Apache Kafka cluster under ``<data>/kafka`` (or reuses the one ``eventlane
kafka up --dir DIR`` started: ``--kafka-dir DIR``), and puts the log, the event store, the
consumer groups and their offsets on it. Two *simulated hosts* are two
local directories, ``<data>/host-a`` and ``<data>/host-b``, each with its own worker
processes; they share nothing but the cluster:

* host A runs the command side and the projections (their SQLite read models live there:
  a projection's workers stay on the host of its file) and invoicing-policy workers;
* host B runs invoicing-policy workers only (a policy may run anywhere);
* each host runs a member of the scheduler group (``eventlane schedules run``): the orders'
  deadlines (5 s here) fire on the cluster, on host A while host B is down.

Midway it kills every worker of host B with SIGKILL (the host dies) and SIGKILLs the
nats-server (or Kafka broker) leading ``orders-0``; later it restarts both. It ends with the
same summary as the embedded demo: invoices = confirmed orders, lag 0, the orders cancelled by their
deadline (none of them invoiced), the rebuild identical to the live read model.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

from rich.console import Console
from rich.live import Live
from rich.table import Table

from eventlane import Runtime
from eventlane.consumer.coordination import coordination_for
from eventlane.log import Log, TopicPartition
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir
from eventlane.log.port import KeyedLog
from eventlane.projection import Runner, open_readmodel
from example_apps.invoicing.app import app
from example_apps.invoicing.demo import (
    APP_SPEC,
    CONFIRM_WITHIN_S,
    SCHEDULER,
    _count_events,
    _lag,
    _next_run,
    _print_summary,
    _record_run,
    ask_one,
    deadline_outcome,
    pay_open_invoices,
)
from example_apps.invoicing.domain import InvoicingError
from example_apps.invoicing.projections import CONFIRM_WITHIN_ENV
from example_apps.invoicing.workload import Workload

NAMESPACE = "invoicing"
POLICY = "invoicing_policy"


class _Cluster(Protocol):
    """What the demo does to its engine's cluster: open the log for a host, name the node
    leading a partition, kill -9 a node and restart it, stop the nodes it started."""

    engine: str
    url: str

    def open(self, local: LocalDir) -> KeyedLog: ...

    def leader(self, log: Log, topic: str, partition: int) -> str: ...

    def kill(self, node: str) -> None: ...

    def restart(self, node: str) -> None: ...

    def stop(self) -> None: ...


class _JetStream:
    """A local 3-node NATS JetStream cluster under ``<data>/cluster``."""

    engine = "nats-server"

    def __init__(self, data: Path, namespace: str) -> None:
        self.namespace = namespace
        where = data / "cluster"
        if (where / "cluster.json").exists():
            cluster = LocalCluster.load(where)
            for node in cluster.nodes:
                if not node.pid or not Path(f"/proc/{node.pid}").exists():
                    cluster.start_node(node.name, wait=False)
            cluster.wait_ready()
        else:
            cluster = LocalCluster.create(where, nodes=3)
            cluster.start()
        self.cluster = cluster
        self.url = f"{cluster.url}?namespace={namespace}"

    def open(self, local: LocalDir) -> KeyedLog:
        js = JetStreamLog.from_url(self.cluster.url, namespace=self.namespace, local=local)
        return cast(KeyedLog, js)  # a KeyedLog (typed by the port's Protocol)

    def leader(self, log: Log, topic: str, partition: int) -> str:
        return str(log.placement(topic, partition)[1])  # type: ignore[attr-defined]

    def kill(self, node: str) -> None:
        self.cluster.kill(node, signal.SIGKILL)

    def restart(self, node: str) -> None:
        self.cluster.start_node(node)

    def stop(self) -> None:
        self.cluster.stop()


class _Kafka:
    """A local 3-broker Apache Kafka cluster (KRaft) in ``where``: the one ``eventlane kafka
    up --dir`` started there (left running at the end, its dead brokers restarted first),
    else a new one (stopped at the end)."""

    engine = "Kafka broker"

    def __init__(self, where: Path, namespace: str) -> None:
        from eventlane.log.kafka.cluster import LocalKafkaCluster  # noqa: PLC0415 (an extra)

        self.namespace = namespace
        self.owned = not (where / "cluster.json").exists()
        if self.owned:
            cluster = LocalKafkaCluster.create(where, 3)
            cluster.start()
        else:
            cluster = LocalKafkaCluster.load(where)
            for node in cluster.nodes:
                if not node.pid or not Path(f"/proc/{node.pid}").exists():
                    cluster.start_node(node.node_id, wait=False)
            cluster.wait_ready()
        self.cluster = cluster
        self.url = f"{cluster.url}?namespace={namespace}"

    def open(self, local: LocalDir) -> KeyedLog:
        from eventlane.log.kafka.log import KafkaLog  # noqa: PLC0415 (an extra)

        log = KafkaLog(self.cluster.bootstrap, namespace=self.namespace, local=local)
        return cast(KeyedLog, log)

    def leader(self, log: Log, topic: str, partition: int) -> str:
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415 (an extra)

        name = f"{self.namespace}.{topic}"
        admin = AdminClient({"bootstrap.servers": self.cluster.bootstrap})
        meta = admin.list_topics(name, timeout=30)
        return str(meta.topics[name].partitions[partition].leader)

    def kill(self, node: str) -> None:
        self.cluster.kill(int(node), signal.SIGKILL)

    def restart(self, node: str) -> None:
        self.cluster.start_node(int(node))

    def stop(self) -> None:
        if self.owned:
            self.cluster.stop()


def _policy_lag(runtime: Runtime) -> int:
    """The policy's lag from its group's committed offsets (its positions, on the cluster)."""
    offsets = coordination_for(runtime.log).offsets
    total = 0
    for topic in app.projector(POLICY).topic_names:
        for p in range(runtime.log.partition_count(topic)):
            marks = runtime.log.offsets(topic, p)
            entry = offsets.committed(POLICY, TopicPartition(topic, p))
            total += marks.hwm - (marks.lwm if entry is None else max(entry.offset, marks.lwm))
    return total


def _lags(runtime: Runtime, names: tuple[str, ...]) -> dict[str, int]:
    return {n: _policy_lag(runtime) if n == POLICY else _lag(runtime, n) for n in names}


def run_cluster_demo(
    data: Path,
    *,
    orders: int = 1000,
    workers: int = 2,
    seed: int = 7,
    spark: bool = True,
    console: Console | None = None,
    rebuild: Callable[..., Any] | None = None,
    kafka: Path | None = None,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    """Run the cluster demo; return the summary figures (also printed as a table). With
    ``kafka`` (a directory): on a local Kafka cluster there instead of JetStream.
    ``namespace``: the app's topics are ``<namespace>.<topic>`` on the cluster."""
    console = console or Console()
    data.mkdir(parents=True, exist_ok=True)
    run = _next_run(data)
    summary: dict[str, Any] = {"run": run}
    hosts = {"host-a": data / "host-a", "host-b": data / "host-b"}
    cluster: _Cluster = _JetStream(data, namespace) if kafka is None else _Kafka(kafka, namespace)
    url = cluster.url
    env = {**os.environ, "EVENTLANE_LOG": url, CONFIRM_WITHIN_ENV: str(CONFIRM_WITHIN_S)}
    console.print(f"[bold]eventlane invoicing demo on a cluster[/] — run {run}; log at {url}")
    try:
        log = cluster.open(LocalDir.at(hosts["host-a"]))
        with contextlib.closing(log), app.open(log) as runtime:
            for name in app.projectors:
                open_readmodel(runtime, name, migrate=True).close()
            runners: dict[tuple[str, str], Runner] = {}
            for name in app.projectors:
                on = ("host-a", "host-b") if name == POLICY else ("host-a",)
                for host in on:
                    runners[host, name] = Runner(
                        APP_SPEC,
                        name,
                        hosts[host],
                        workers=workers,
                        restart=True,
                        session_timeout_ms=3000,
                        env=env,
                        log_path=hosts[host] / "workers.log",
                    )
            for host in ("host-a", "host-b"):  # the scheduler group: one member per host
                runners[host, SCHEDULER] = Runner(
                    APP_SPEC,
                    SCHEDULER,
                    hosts[host],
                    workers=1,
                    restart=True,
                    env=env,
                    log_path=hosts[host] / "workers.log",
                    argv=("schedules", "run", APP_SPEC, "--session-timeout-ms", "3000"),
                )
            for runner in runners.values():
                runner.start()
            for (host, name), runner in runners.items():
                console.print(f"{host}: {runner.workers} worker process(es) of {name}")
            down: set[str] = set()

            def supervise() -> None:
                for (host, _), runner in runners.items():
                    if host not in down:
                        runner.supervise_once()

            try:
                workload = Workload(orders=orders, seed=seed, run=run)
                commands = list(workload.commands())
                started = time.perf_counter()
                killed_node = None
                refused = 0
                for i, command in enumerate(commands):
                    try:
                        runtime.execute(
                            command.cls,
                            command.aggregate_id,
                            command.action,
                            create=command.create,
                        )
                    except InvoicingError:  # its deadline came first (a stalled machine)
                        refused += 1
                    if i == len(commands) // 3:
                        down.add("host-b")
                        for (host, _), runner in runners.items():
                            if host == "host-b":
                                for w in runner.procs:
                                    os.kill(w.pid, signal.SIGKILL)
                        console.print(
                            "[red]host-b dies[/]: kill -9 of all its workers; host-a's"
                            " policy workers take its partitions"
                        )
                    if i == len(commands) // 2:
                        killed_node = cluster.leader(runtime.log, "orders", 0)
                        cluster.kill(killed_node)
                        summary["killed_node"] = killed_node
                        console.print(
                            f"[red]kill -9 {cluster.engine} {killed_node}[/] (leader of"
                            " orders-0): a new leader is elected; appends and groups go on"
                        )
                    if i == 2 * len(commands) // 3:
                        if killed_node is not None:
                            cluster.restart(killed_node)
                        down.discard("host-b")
                        console.print(
                            f"{cluster.engine} {killed_node} restarted (it catches up);"
                            " host-b is back: its workers restart and rejoin"
                        )
                    if i % 200 == 0:
                        supervise()
                summary["commands_per_s"] = len(commands) / (time.perf_counter() - started)
                _wait(runtime, supervise, console, (POLICY, "invoices"))
                invoices_db = runtime.log.local.readmodel("invoices")
                paid = pay_open_invoices(runtime, invoices_db, run, seed)
                console.print(f"recorded {paid} payments")
                caught_up_from = time.perf_counter()
                _wait(runtime, supervise, console, tuple(app.projectors))
                summary["catch_up_s"] = time.perf_counter() - caught_up_from
                summary["deadline"] = _wait_for_deadlines(
                    runtime, supervise, console, f"r{run}-", CONFIRM_WITHIN_S
                )
                summary["deadline"]["refused"] = refused
                summary["confirm_within_s"] = CONFIRM_WITHIN_S
                summary["restarts"] = sum(r.restarts for r in runners.values())
                ask_one(runtime, invoices_db, console)
            finally:
                for runner in runners.values():
                    runner.stop()
            counts = _count_events(runtime.log)
            with contextlib.closing(sqlite3.connect(runtime.log.local.readmodel("invoices"))) as db:
                invoices = db.execute("SELECT count(*) FROM invoices").fetchone()[0]
            summary.update(counts, invoices=invoices, lag=_lags(runtime, tuple(app.projectors)))
            if spark and rebuild is not None:
                summary["rebuild"] = rebuild(runtime, "invoices", console)
            _record_run(data, run)
    finally:
        cluster.stop()
    _print_summary(console, summary)
    return summary


def _wait_for_deadlines(
    runtime: Runtime,
    supervise: Callable[[], None],
    console: Console,
    prefix: str,
    within_s: float,
    timeout: float = 120.0,
) -> dict[str, int]:
    """Wait until every order of this run left open has been cancelled by its deadline
    (the scheduler group fired it), and the projectors have caught up with that."""
    deadline = time.monotonic() + within_s + timeout
    with console.status(f"waiting for the deadlines of unconfirmed orders ({within_s:g} s)"):
        while (outcome := deadline_outcome(runtime.log, prefix))["open"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"orders still open after their deadline: {outcome}")
            supervise()
            time.sleep(0.2)
    _wait(runtime, supervise, console, tuple(app.projectors))
    return deadline_outcome(runtime.log, prefix)


def _wait(
    runtime: Runtime,
    supervise: Callable[[], None],
    console: Console,
    names: tuple[str, ...],
    timeout: float = 300.0,
) -> None:
    deadline = time.monotonic() + timeout
    with Live(console=console, transient=True) as live:
        while True:
            lags = _lags(runtime, names)
            table = Table("projector", "lag", title="waiting for the projectors")
            for name, lag in lags.items():
                table.add_row(name, str(lag))
            live.update(table)
            if all(lag == 0 for lag in lags.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"projectors still lagging after {timeout} s: {lags}")
            supervise()
            time.sleep(0.2)
