"""The invoicing end-to-end test on the cluster (issue 13): the log, the event store and the
consumer groups on the shared 3-node cluster, the workers spread over two simulated hosts
(two local directories: host A holds the projections' read models and runs policy workers
too, host B runs policy workers only), three kill -9s and the rebalances they cause.

Exactly one InvoiceIssued per confirmed order, and every read model equals a fold of the
raw records (the folds of tests/invoicing/test_invoicing_e2e.py, which never use the
framework's codec or projectors)."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from eventlane.app import Runtime
from eventlane.consumer.coordination import coordination_for
from eventlane.log import Log, TopicPartition
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir
from eventlane.projection import Runner, open_readmodel
from example_apps.invoicing import app
from example_apps.invoicing.domain import Invoice, invoice_id_for
from example_apps.invoicing.workload import Workload, pay, payment_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "invoicing"))
from test_invoicing_e2e import APP, fold_balances, fold_invoices, fold_orders, raw_events

ROOT = Path(__file__).resolve().parents[2]
POLICY = "invoicing_policy"
PROJECTIONS = ("invoices", "customer_balances", "orders_by_status")


@pytest.fixture
def hosts(tmp_path: Path) -> dict[str, Path]:
    return {"a": tmp_path / "host-a", "b": tmp_path / "host-b"}


@pytest.fixture
def runtime(cluster: LocalCluster, namespace: str, hosts: dict[str, Path]) -> Iterator[Runtime]:
    local = LocalDir.at(hosts["a"])  # the command side runs on host A
    with JetStreamLog.from_url(cluster.url, namespace=namespace, local=local) as js:
        with app.open(cast(Log, js)) as rt:
            for name in PROJECTIONS:
                open_readmodel(rt, name, migrate=True).close()
            yield rt


def _lag(runtime: Runtime, name: str) -> int:
    """Records not yet applied: from host A's read model positions for a projection, from
    the group's committed offsets (on the cluster) for the policy."""
    positions: dict[TopicPartition, int] = {}
    if name == POLICY:
        offsets = coordination_for(runtime.log).offsets
        positions = {tp: c.offset for tp, c in offsets.group_offsets(POLICY).items()}
    else:
        with sqlite3.connect(runtime.log.local.readmodel(name), timeout=30) as db:
            rows = db.execute("SELECT topic, partition, next_offset FROM _eventlane_positions")
            positions = {TopicPartition(t, p): o for t, p, o in rows}
    total = 0
    for topic in app.projector(name).topic_names:
        for p in range(runtime.log.partition_count(topic)):
            marks = runtime.log.offsets(topic, p)
            total += marks.hwm - positions.get(TopicPartition(topic, p), marks.lwm)
    return total


def _rows(path: Path, sql: str) -> dict[str, tuple[Any, ...]]:
    with sqlite3.connect(path) as db:
        return {r[0]: tuple(r[1:]) for r in db.execute(sql)}


def test_invoicing_end_to_end_on_the_cluster_across_two_hosts(
    runtime: Runtime, cluster: LocalCluster, namespace: str, hosts: dict[str, Path]
) -> None:
    env = {
        **os.environ,
        "EVENTLANE_LOG": f"{cluster.url}?namespace={namespace}",
        "PYTHONPATH": str(ROOT),
    }

    def runner(name: str, host: str, workers: int) -> Runner:
        return Runner(
            APP,
            name,
            hosts[host],
            workers=workers,
            restart=True,
            session_timeout_ms=2000,
            env=env,
            log_path=hosts[host] / "workers.log",
        )

    runners = {(name, "a"): runner(name, "a", 2) for name in PROJECTIONS}
    runners |= {(POLICY, "a"): runner(POLICY, "a", 1), (POLICY, "b"): runner(POLICY, "b", 1)}
    names = (*PROJECTIONS, POLICY)

    def supervise() -> None:
        for r in runners.values():
            r.supervise_once()

    def caught_up(which: tuple[str, ...], timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while any(_lag(runtime, n) for n in which):
            assert time.monotonic() < deadline, {n: _lag(runtime, n) for n in which}
            supervise()
            time.sleep(0.2)

    for r in runners.values():
        r.start()
    try:
        commands = list(Workload(orders=40, seed=11).commands())
        kills = {  # kill -9 mid-run: a rebalance, then a replacement joins
            len(commands) // 3: (POLICY, "b"),
            len(commands) // 2: ("invoices", "a"),
            2 * len(commands) // 3: (POLICY, "a"),
        }
        for i, command in enumerate(commands):
            runtime.execute(
                command.cls, command.aggregate_id, command.action, create=command.create
            )
            if i in kills:
                os.kill(runners[kills[i]].procs[0].pid, signal.SIGKILL)
            if i % 20 == 0:
                supervise()
        caught_up((POLICY, "invoices"))
        open_invoices = _rows(
            runtime.log.local.readmodel("invoices"),
            "SELECT invoice_id, amount_cents FROM invoices WHERE status = 'open'",
        )
        for invoice_id, (amount,) in open_invoices.items():
            cents = payment_for(invoice_id, amount, 11)
            if cents:
                runtime.execute(Invoice, invoice_id, lambda inv, c=cents: pay(inv, c))
        caught_up(names)
        deadline = time.monotonic() + 60
        while sum(r.restarts for r in runners.values()) < 3:  # every killed worker replaced
            assert time.monotonic() < deadline
            supervise()
            time.sleep(0.1)
    finally:
        for r in runners.values():
            r.stop()

    orders = fold_orders(raw_events(runtime.log, "orders"))
    invoice_events = raw_events(runtime.log, "invoices")
    issued = Counter(e["aggregate_id"] for e in invoice_events if e["type"] == "InvoiceIssued")
    assert all(n == 1 for n in issued.values()), "an invoice was issued twice"
    confirmed = {
        e["aggregate_id"]
        for e in raw_events(runtime.log, "orders")
        if e["type"] == "OrderConfirmed"
    }
    invoices = fold_invoices(invoice_events)
    assert set(invoices) == {invoice_id_for(o) for o in confirmed}
    local = runtime.log.local
    assert (
        _rows(
            local.readmodel("invoices"),
            "SELECT invoice_id, order_id, customer_id, amount_cents, paid_cents, status"
            " FROM invoices",
        )
        == invoices
    )
    assert _rows(
        local.readmodel("customer_balances"),
        "SELECT customer_id, invoiced_cents, paid_cents, voided_cents, invoices"
        " FROM customer_balances",
    ) == fold_balances(invoices)
    assert (
        _rows(
            local.readmodel("orders_by_status"),
            "SELECT order_id, customer_id, status, total_cents, lines FROM orders",
        )
        == orders
    )
    for host in hosts.values():  # both hosts ran policy workers; no group state on disk
        with sqlite3.connect(host / "readmodels" / f"{POLICY}.sqlite") as db:
            assert db.execute("SELECT count(*) FROM _eventlane_positions").fetchone()[0] > 0
        assert not (host / "groups").exists()
    assert not (hosts["b"] / "readmodels" / "invoices.sqlite").exists()


@pytest.mark.soak
def test_the_cluster_demo_ends_with_invoices_equal_to_confirmed_orders(tmp_path: Path) -> None:
    """``eventlane demo invoicing --cluster`` (its own cluster, host B and a node killed)."""
    from example_apps.invoicing.cluster_demo import run_cluster_demo  # noqa: PLC0415

    summary = run_cluster_demo(tmp_path / "demo", orders=40, workers=1, spark=False)
    assert summary["invoices"] == summary["confirmed"] > 0
    assert set(summary["lag"].values()) == {0}
    # the scheduler group ran on the cluster: every order left open was cancelled by its
    # deadline, none of them invoiced
    deadline = summary["deadline"]
    assert deadline["open"] == 0 and deadline["invoiced_and_expired"] == 0
    assert deadline["deadline_cancelled"] > 0
    cluster = LocalCluster.load(tmp_path / "demo" / "cluster")
    assert all(n.pid == 0 for n in cluster.nodes)  # stopped at the end
