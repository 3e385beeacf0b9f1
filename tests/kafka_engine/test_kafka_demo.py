"""``eventlane demo invoicing --kafka`` (issue 35, item 3): the whole invoicing demo on the
3-broker cluster, its workers on two simulated hosts; midway every worker of host B is
killed -9 and so is the broker leading ``orders-0``, both restarted later. It must end with
one invoice per confirmed order, lag 0 and every open order cancelled by its deadline,
none of them invoiced.

The demo's own summary folds the events through the log; the oracle here reads the raw
``orders`` and ``invoices`` partitions with confluent-kafka and applies its own copy of the
log-order rule (:mod:`kafka_oracle`): exactly one visible ``InvoiceIssued`` per visible
``OrderConfirmed``, and none for any other order."""

from __future__ import annotations

import io
import sys
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient
from rich.console import Console

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.processes import alive
from example_apps.invoicing.cluster_demo import run_cluster_demo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_oracle import judged_partition


def _visible_events(bootstrap: str, topic: str) -> list[dict[str, object]]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    out = []
    for p in sorted(meta.topics[topic].partitions):
        for r in judged_partition(bootstrap, topic, p):
            if r.visible and r.value:
                out.append(orjson.loads(r.value))
    return out


@pytest.mark.soak  # a broker's kill and restart, 5 s deadlines, the oracle: 3-4 min here
@pytest.mark.parametrize(
    ("orders", "workers"), [(24, 1), (300, 2)], ids=["24-orders", "300-orders"]
)
def test_the_demo_on_kafka_survives_broker_and_worker_kills(
    kafka_cluster: LocalKafkaCluster, tmp_path: Path, orders: int, workers: int
) -> None:
    namespace = f"demo{uuid.uuid4().hex[:8]}"
    out = io.StringIO()
    try:
        summary = run_cluster_demo(
            tmp_path / "demo",
            orders=orders,
            workers=workers,
            spark=False,
            kafka=kafka_cluster.directory,
            namespace=namespace,
            console=Console(file=out, width=120),
        )
    finally:
        # the demo killed and restarted a broker through its own copy of the cluster's
        # description: the session's copy learns the new PID (its teardown stops it)
        fresh = LocalKafkaCluster.load(kafka_cluster.directory)
        for mine, now in zip(kafka_cluster.nodes, fresh.nodes, strict=True):
            mine.pid = now.pid
    text = out.getvalue()
    assert "host-b dies" in text and f"kill -9 Kafka broker {summary['killed_node']}" in text
    assert summary["restarts"] >= 1  # host B's workers replaced after their kill -9
    assert all(n.pid and alive(n.pid) for n in kafka_cluster.nodes)  # the broker restarted
    assert summary["invoices"] == summary["confirmed"] > 0
    assert set(summary["lag"].values()) == {0}
    deadline = summary["deadline"]
    assert deadline["open"] == 0 and deadline["invoiced_and_expired"] == 0
    assert deadline["deadline_cancelled"] > 0

    bootstrap = kafka_cluster.bootstrap
    orders_events = _visible_events(bootstrap, f"{namespace}.orders")
    confirmed = {e["aggregate_id"] for e in orders_events if e["type"] == "OrderConfirmed"}
    invoiced = Counter(
        e["data"]["order_id"]  # type: ignore[index]
        for e in _visible_events(bootstrap, f"{namespace}.invoices")
        if e["type"] == "InvoiceIssued"
    )
    assert len(confirmed) == summary["confirmed"]
    assert invoiced == Counter(dict.fromkeys(confirmed, 1))
