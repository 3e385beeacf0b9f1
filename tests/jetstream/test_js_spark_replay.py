"""Spark replay from a JetStream log: the invoicing projections rebuilt by Spark tasks that
open the log by its ``nats://`` URL equal the local rebuild and the live read models.

One SparkSession for the run (``local[2,4]``, driver memory 512 MiB, as tests/replay), the
shared 3-node cluster, the invoicing app's seeded workload. The local directory holds only
read models: no log file exists anywhere a Spark task could read (checked), so every record
a task replays came from the cluster.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from click.testing import CliRunner

from eventlane.app import Runtime
from eventlane.cli import main
from eventlane.engine import log_locator, open_log
from eventlane.log import TopicPartition
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.projection import ReadModelView, Worker, open_readmodel
from eventlane.replay.rebuild import rebuild
from eventlane.replay.session import spark_session
from eventlane.replay.verify import verify_rebuild
from example_apps.invoicing.app import app as invoicing
from example_apps.invoicing.workload import Workload

pytestmark = pytest.mark.spark

APP = "example_apps.invoicing.app:app"
ORDERS = 30
LIVE = ("invoicing_policy", "invoices", "customer_balances", "orders_by_status")
REBUILT = ("invoices", "orders_by_status")  # and customer_balances by the CLI


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's SparkSession (the same settings as tests/replay's; ``getOrCreate``
    returns one session when both directories run, and stopping twice is harmless)."""
    session = spark_session(
        "local[2,4]",
        {
            "spark.driver.memory": "512m",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
        },
        app_name="eventlane-tests",
    )
    yield session
    session.stop()


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as c:
        return [tuple(r) for r in c.execute(sql)]


def run_live(runtime: Runtime, name: str, timeout: float = 90.0) -> dict[TopicPartition, int]:
    """A real worker of ``name`` in this process until it stands at the high-water marks of
    its topics now; its read model's positions."""
    worker = Worker(runtime, name, session_timeout_ms=3000, poll_timeout=0.1)
    log = runtime.log
    ends = {
        TopicPartition(t, p): log.offsets(t, p).hwm
        for t in worker.projector.topic_names
        for p in range(log.partition_count(t))
    }
    deadline = time.monotonic() + timeout

    def done() -> bool:
        assert time.monotonic() < deadline, f"live worker of {name} did not catch up"
        pos = worker.readmodel.positions()
        return all(pos.get(tp, 0) >= end for tp, end in ends.items())

    worker.run(until=done)
    with ReadModelView(log.local.readmodel(name)) as view:
        return view.positions()


def test_spark_rebuild_from_jetstream_equals_local_and_live(
    cluster: LocalCluster, spark: Any, namespace: str, tmp_path: Path
) -> None:
    url = f"{cluster.url}?namespace={namespace}"
    local = tmp_path / "local"
    log = open_log(url, data_dir=local)
    try:
        assert log_locator(log) == f"{cluster.url}?namespace={namespace}&replicas=3"
        with invoicing.open(log) as runtime:
            for name in invoicing.projectors:
                open_readmodel(runtime, name, migrate=True).close()
            workload = Workload(orders=ORDERS, seed=11)
            for c in workload.commands():
                runtime.execute(c.cls, c.aggregate_id, c.action, create=c.create)
            positions = {name: run_live(runtime, name) for name in LIVE}
            assert sum(positions["invoices"].values()) > 0  # the policy issued invoices
            for name in REBUILT:
                result = rebuild(
                    runtime, name, engine="spark", spark=spark, output=tmp_path / f"{name}.sqlite"
                )
                assert result.tasks >= len(result.end) > 1
                assert dict(result.end) == positions[name]
                comparisons = verify_rebuild(runtime, result)
                assert [(c.what, c.skipped) for c in comparisons] == [
                    ("local engine", None),
                    ("live", None),
                ]
                assert all(c.ok for c in comparisons), [c.differences for c in comparisons]
                assert all(c.tables for c in comparisons)
            placed = rows(tmp_path / "orders_by_status.sqlite", "SELECT count(*) FROM orders")
            assert placed == [(workload.totals().orders,)]
    finally:
        log.close()
    assert not (local / "topics").exists()  # no log files: the tasks read the cluster

    # the CLI: eventlane --log URL rebuild APP --projection P --engine spark --verify
    res = CliRunner().invoke(
        main,
        [
            "--log",
            url,
            "--data",
            str(local),
            "rebuild",
            APP,
            "--projection",
            "customer_balances",
            "--engine",
            "spark",
            "--verify",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    body = orjson.loads(res.stdout)
    assert body["rebuild"]["engine"] == "spark" and body["rebuild"]["records"] > 0
    assert [(c["what"], c["ok"], c["skipped"]) for c in body["verify"]] == [
        ("local engine", True, None),
        ("live", True, None),
    ]
