"""Spark replay from Kafka: the invoicing projections rebuilt by Spark tasks that read a real
3-broker Kafka cluster equal the local rebuild and the live read models (``--verify``).

The app cannot run on Kafka's core log yet (its event store needs per-key reads and
conditional appends: part 2), so its history is written where it runs (the embedded log),
its live read models are built there by real workers, and the log is moved to Kafka with
``eventlane migrate-log`` (event topics keep their offsets, so the live models' positions
mean the same on Kafka). Then ``eventlane --log kafka://... rebuild --engine spark
--verify`` replays from Kafka: every Spark task opens the cluster by its URL; the embedded
log's files are moved away first, so nothing else could be read.

One SparkSession for the run (``local[2,4]``, driver memory 512 MiB, as tests/replay).
"""

from __future__ import annotations

import shutil
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
from eventlane.log import LogStore, TopicPartition
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.kafka.migrate import migrate
from eventlane.projection import ReadModelView, Worker, open_readmodel
from eventlane.replay.session import spark_session
from example_apps.invoicing.app import app as invoicing
from example_apps.invoicing.workload import Workload

pytestmark = pytest.mark.spark

APP = "example_apps.invoicing.app:app"
ORDERS = 30
LIVE = ("invoicing_policy", "invoices", "customer_balances", "orders_by_status")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's SparkSession (tests/replay's settings; ``getOrCreate`` returns one
    session when several directories run, and stopping twice is harmless)."""
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


def run_live(runtime: Runtime, name: str, timeout: float = 90.0) -> dict[TopicPartition, int]:
    """A real worker of ``name`` until it stands at its topics' high-water marks now."""
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


def test_spark_rebuild_from_kafka_equals_local_and_live(
    kafka_cluster: LocalKafkaCluster, spark: Any, namespace: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with invoicing.open(data) as runtime:
        for name in invoicing.projectors:
            open_readmodel(runtime, name, migrate=True).close()
        workload = Workload(orders=ORDERS, seed=11)
        for c in workload.commands():
            runtime.execute(c.cls, c.aggregate_id, c.action, create=c.create)
        positions = {name: run_live(runtime, name) for name in LIVE}
    assert sum(positions["invoices"].values()) > 0  # the policy issued invoices
    url = f"{kafka_cluster.url}?namespace={namespace}"
    with LogStore(data) as emb, KafkaLog.from_url(url) as kafka:
        copies = migrate(emb, kafka)
    assert copies and not [c for c in copies if c.problems]
    shutil.move(data / "topics", tmp_path / "embedded-topics")  # Kafka is the only log now

    # eventlane --log URL --data DIR rebuild APP --projection P --engine spark --verify
    # (the session is the fixture's: the command's getOrCreate returns it)
    for name in ("invoices", "customer_balances"):
        command = ["--log", url, "--data", str(data), "rebuild", APP, "--projection", name]
        res = CliRunner().invoke(main, [*command, "--engine", "spark", "--verify", "--json"])
        assert res.exit_code == 0, res.output
        body = orjson.loads(res.stdout)
        assert body["rebuild"]["engine"] == "spark" and body["rebuild"]["records"] > 0
        end = {
            TopicPartition(e["topic"], e["partition"]): e["offset"] for e in body["rebuild"]["end"]
        }
        assert end == positions[name]  # offsets kept by migrate-log: the live positions hold
        assert body["rebuild"]["tasks"] >= len(end) > 1
        assert [(c["what"], c["ok"], c["skipped"]) for c in body["verify"]] == [
            ("local engine", True, None),
            ("live", True, None),
        ]
    swap = CliRunner().invoke(main, [*command, "--engine", "spark", "--swap"])
    assert swap.exit_code == 0, swap.output  # the app runs on Kafka (issue 35): --swap too
    assert not (data / "topics").exists()
