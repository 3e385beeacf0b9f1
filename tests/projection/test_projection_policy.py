"""A policy that issues an invoice per order issues exactly one per order, whatever the
crashes (``kill -9``, including right after a command was issued and before the read-model
transaction committed) and rebalances (workers joining and leaving mid-run).

Counted on the log itself: the ``invoices`` topic must hold exactly one ``InvoiceIssued``
record per order, caused by that order's event.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import click
import orjson
from projection_kit import APP, Workers, child_env, connect, wait_caught_up

from eventlane.app import Runtime
from eventlane.cli.context import AppContext
from eventlane.cli.project import open_worker, project
from eventlane.codec import Envelope
from eventlane.consumer.free import Consumer
from eventlane.log import LogStore, TopicPartition
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import ReadModelView, readmodel_path
from eventlane.store.stream_cache import WORKER_EVENTS
from tests.projection import bankapp

ORDERS = 240


def place_orders(runtime: Runtime, first: int, count: int) -> None:
    batches: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]] = {}
    for i in range(first, first + count):
        env = Envelope(bankapp.OrderPlaced(10 + i), f"order-{i}", 1)
        key, value, headers = runtime.codec.encode(env)
        batches.setdefault(partition_for_key(key, 4), []).append((key, value, tuple(headers), None))
    for p, records in batches.items():
        runtime.log.append("orders", p, records)


def invoices_on_the_log(data: Path) -> tuple[Counter[str], dict[str, str]]:
    """Per invoice id: how many InvoiceIssued records; and each one's causation id."""
    log = LogStore(data)
    try:
        consumer = Consumer(log, auto_offset_reset="earliest", max_poll_records=10_000)
        consumer.assign([TopicPartition("invoices", p) for p in range(4)])
        total = sum(log.offsets("invoices", p).hwm for p in range(4))
        counts: Counter[str] = Counter()
        causes: dict[str, str] = {}
        seen = 0
        while seen < total:
            for r in consumer.poll(1.0):
                seen += 1
                doc = orjson.loads(r.value)  # type: ignore[arg-type]
                assert doc["type"] == "InvoiceIssued"
                counts[doc["aggregate_id"]] += 1
                causes[doc["aggregate_id"]] = doc["causation_id"]
        consumer.close()
        return counts, causes
    finally:
        log.close()


def order_event_ids(data: Path) -> dict[str, str]:
    log = LogStore(data)
    try:
        consumer = Consumer(log, auto_offset_reset="earliest", max_poll_records=10_000)
        consumer.assign([TopicPartition("orders", p) for p in range(4)])
        total = sum(log.offsets("orders", p).hwm for p in range(4))
        out: dict[str, str] = {}
        while len(out) < total:
            for r in consumer.poll(1.0):
                doc = orjson.loads(r.value)  # type: ignore[arg-type]
                out[doc["aggregate_id"]] = doc["event_id"]
        consumer.close()
        return out
    finally:
        log.close()


def test_one_invoice_per_order_under_crashes_and_rebalances(
    runtime: Runtime, data: Path, workers: Workers
) -> None:
    rng = random.Random(11)
    place_orders(runtime, 0, 100)
    # 1. A worker that kills itself (SIGKILL) right after issuing its 5th invoice command,
    #    before the batch's transaction commits: the command is on the log, the position not.
    crasher = workers.start(
        "invoicing", session_timeout_ms=600, env=child_env(BANKAPP_CRASH_AFTER_ISSUE="5")
    )
    assert crasher.wait(60) == -9
    counts, _ = invoices_on_the_log(data)
    assert sum(counts.values()) >= 5
    with ReadModelView(readmodel_path(data, "invoicing")) as view:
        assert sum(view.positions().values()) < sum(counts.values())  # issued, not recorded
    # 2. Random kill -9 while working (each round brings new orders).
    for n in range(4):
        place_orders(runtime, 100 + 20 * n, 20)
        proc = workers.start("invoicing", session_timeout_ms=600, max_poll_records=20)
        workers.wait_joined(proc, "invoicing")
        time.sleep(rng.uniform(0.05, 0.4))
        workers.kill9(proc)
    # 3. Rebalances: members join and leave while more orders arrive.
    a = workers.start("invoicing", session_timeout_ms=600, max_poll_records=20)
    b = workers.start("invoicing", session_timeout_ms=600, max_poll_records=20)
    workers.wait_joined(a, "invoicing")
    workers.wait_joined(b, "invoicing")
    place_orders(runtime, 180, ORDERS - 180)
    time.sleep(0.3)
    c = workers.start("invoicing", session_timeout_ms=600, max_poll_records=20)
    workers.wait_joined(c, "invoicing")
    time.sleep(0.3)
    assert workers.term(a) == 0
    time.sleep(0.5)
    workers.kill9(b)
    wait_caught_up(data, "invoicing", topic="orders", timeout=120)
    assert workers.term(c) == 0

    counts, causes = invoices_on_the_log(data)
    assert len(counts) == ORDERS
    assert set(counts.values()) == {1}, {k: v for k, v in counts.items() if v != 1}
    triggers = order_event_ids(data)
    for i in range(ORDERS):
        assert causes[f"invoice-order-{i}"] == triggers[f"order-{i}"]
    with connect(data, "invoicing") as conn:
        assert conn.execute("SELECT count(*) FROM invoiced").fetchone()[0] == ORDERS


WORKER_ORDERS = 1_300


def test_a_policy_worker_keeps_few_decoded_streams(runtime: Runtime, data: Path) -> None:
    """A policy worker issues commands on ever new aggregates (one invoice per order) and
    never loads them again: the decoded streams it keeps stay within the worker's bound
    (``eventlane project run``/``run`` workers), not the app's 20,000 events, which it would
    fill over the first ~20,000 orders (the 40-minute memory soak's +18 % RSS)."""
    place_orders(runtime, 0, WORKER_ORDERS)
    context = AppContext(data)
    with click.Context(project, obj=context), ExitStack() as stack:
        stack.callback(context.close)
        worker = open_worker(stack, APP, "invoicing", session_timeout_ms=3000)
        stack.callback(worker.close)
        deadline = time.monotonic() + 300
        while worker.applied < WORKER_ORDERS and time.monotonic() < deadline:
            worker.run_once()
        assert worker.applied == WORKER_ORDERS
        cache = worker.runtime.store.cache
        assert cache is not None
        assert 0 < len(cache) <= WORKER_EVENTS, (
            f"{len(cache)} streams held after {WORKER_ORDERS} orders"
        )
    counts, _ = invoices_on_the_log(data)
    assert len(counts) == WORKER_ORDERS and set(counts.values()) == {1}
