# ruff: noqa: F811 (the projection tests' fixtures, imported by name, are parameters here)
"""Spark rebuilds of read models in PostgreSQL (issue 34 item 4): tasks write stage schemas,
the driver merges them inside the server; ``--verify``, ``--swap`` under live workers and
``--as-of`` as for the local engine (tests/projection/test_pg_rebuild.py), each checked
against an independent fold of the log's raw JSON and against the local engine.

The session's SparkSession (``conftest.spark``) and a fresh database of the session's
PostgreSQL server per test (the projection tests' ``engine`` fixture, parametrised to
``postgresql``). Bank app (``tests.projection.bankapp``): ``balances`` has one row per
account (one partition each) and one marker row per applied event, so a duplicate or a
gap across the swap shows. Invoicing app: ``customer_balances`` is written from every
partition and merges by its rule ``sum``, so the merge inside PostgreSQL is exercised.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from eventlane.app import Runtime
from eventlane.codec import Envelope
from eventlane.log import LogStore, Producer, ProducerRecord
from eventlane.projection.postgres import schema_name
from eventlane.projection.store import ENV as READMODELS_ENV
from eventlane.replay.handoff import rebuild_and_swap
from eventlane.replay.rebuild import rebuild
from eventlane.replay.verify import verify_rebuild, verify_replay
from example_apps.invoicing.app import app as invoicing
from example_apps.invoicing.events import InvoiceIssued, InvoiceVoided, PaymentRecorded
from tests.projection.projection_kit import Producer as Deposits
from tests.projection.projection_kit import (  # noqa: F401 (data, engine, runtime, workers: fixtures)
    Workers,
    data,
    engine,
    expect_model,
    expect_workers_carry_on_after_swap,
    fold_accounts,
    runtime,
    workers,
)
from tests.replay import flaky_bank

pytestmark = [pytest.mark.spark, pytest.mark.parametrize("engine", ["postgresql"], indirect=True)]


def schemas() -> list[str]:
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%'"
            " AND nspname NOT IN ('public', 'information_schema') ORDER BY 1"
        ).fetchall()
    return [str(r[0]) for r in rows]


def rows_of(schema: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        return sorted(tuple(r) for r in conn.execute(sql).fetchall())


def balances_of(schema: str) -> dict[str, tuple[int, int]]:
    return {r[0]: (int(r[1]), int(r[2])) for r in rows_of(schema, "SELECT * FROM balances")}


def test_spark_into_a_schema_equals_local_and_the_fold(
    engine: str, runtime: Runtime, data: Path, spark: Any
) -> None:
    Deposits(runtime).deposits(500, poison=lambda i: i in (7, 300))
    result = rebuild(runtime, "balances", engine="spark", spark=spark)
    live = schema_name("balances")
    assert result.schema == f"{live}__rebuild"
    assert result.tasks == result.merge.partials == runtime.log.partition_count("accounts")  # type: ignore[union-attr]
    fold = fold_accounts(data)
    assert balances_of(result.schema) == fold.balances
    letters = {(d.topic, d.partition, d.offset) for d in result.dead_letters}
    assert letters == fold.poison
    markers = rows_of(result.schema, 'SELECT topic, partition, "offset" FROM applied')
    assert set(markers) == fold.events - fold.poison and len(markers) == len(set(markers))
    engine_check, live_check = verify_rebuild(runtime, result)
    assert engine_check.skipped is None and engine_check.ok  # every table, letters included
    assert {d.table for d in engine_check.tables} >= {"balances", "applied"}
    assert live_check.skipped == "there is no live read model"
    assert schemas() == [f"{live}__rebuild"]  # the stages and the scratch schema are gone
    # a stage left by a build killed before it could drop it goes with the next build
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{live}__rebuild__p00001a0"')
    again = rebuild(runtime, "balances", engine="spark", spark=spark)
    assert balances_of(again.schema or "") == fold.balances
    assert schemas() == [f"{live}__rebuild"]


def test_a_task_whose_python_worker_died_is_retried_into_a_fresh_stage(
    engine: str, data: Path, spark: Any
) -> None:
    """The first attempt of accounts/1's task dies mid-task (its stage ``...__p00001a0``
    half written, its session gone); the retry writes ``...__p00001a1`` from scratch and
    only that one is merged; both are dropped at the end."""
    with flaky_bank.app.open(data) as rt:
        Deposits(rt).deposits(600)
        result = rebuild(rt, "flaky_balances", engine="spark", spark=spark)
    assert result.retried_tasks >= 1
    assert balances_of(result.schema or "") == fold_accounts(data).balances
    markers = rows_of(result.schema or "", 'SELECT topic, partition, "offset" FROM applied')
    assert len(markers) == len(set(markers)) and set(markers) == fold_accounts(data).events
    assert schemas() == ["flaky_balances__rebuild"]


def test_swap_under_live_workers_has_no_gap_and_no_duplicate(
    engine: str, runtime: Runtime, data: Path, workers: Workers, spark: Any
) -> None:
    producer = Deposits(runtime)
    producer.deposits(600)
    procs = [workers.start(), workers.start()]
    for proc in procs:
        workers.wait_joined(proc)
    live = schema_name("balances")
    verified: list[list[bool]] = []

    def verify(result: object) -> None:
        verified.append([c.ok for c in verify_rebuild(runtime, result)])  # type: ignore[arg-type]
        producer.deposits(300)  # more events while the shadow catches up

    handoff = rebuild_and_swap(runtime, "balances", engine="spark", spark=spark, before_swap=verify)
    assert verified == [[True, True]]
    assert handoff.rebuild.engine == "spark" and handoff.rebuild.schema == f"{live}__shadow"
    assert schemas() == [live]  # shadow, old, stages and scratch: gone
    expect_workers_carry_on_after_swap(producer, data, procs, workers)


def test_as_of_rebuilds_the_past_read_model(
    engine: str, runtime: Runtime, data: Path, spark: Any
) -> None:
    producer = Deposits(runtime)
    producer.deposits(300)
    then = fold_accounts(data).balances
    time.sleep(0.05)
    moment = int(time.time() * 1000)
    time.sleep(0.05)
    producer.deposits(300)
    result = rebuild(runtime, "balances", engine="spark", spark=spark, as_of=moment)
    assert result.schema is not None and balances_of(result.schema) == then
    assert sum(result.end.values()) == 300


# ---------------------------------------------------------------------------- invoicing
def invoice_history(data: Path, invoices: int = 400, customers: int = 25) -> None:
    """Invoices of a few customers spread over the 4 partitions of ``invoices``: each
    issued, then most paid, some voided."""
    log = LogStore(data)
    log.create_topic("invoices", 4, {"retention_ms": -1}, exist_ok=True)
    rnd = random.Random(5)
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    try:
        with invoicing.open(log, create_topics=False) as rt:
            batch = []
            for n in range(invoices):
                amount = rnd.randint(100, 10_000)
                customer = f"customer-{rnd.randrange(customers)}"
                stream: list[Any] = [InvoiceIssued(f"order-{n}", customer, amount)]
                roll = rnd.random()
                if roll < 0.6:
                    stream.append(PaymentRecorded(amount if rnd.random() < 0.7 else amount // 3))
                elif roll < 0.8:
                    stream.append(InvoiceVoided("changed mind"))
                for version, event in enumerate(stream, 1):
                    env = Envelope(
                        event,
                        f"invoice-{n:05d}",
                        version,
                        event_id=uuid.UUID(int=rnd.getrandbits(128)),
                        timestamp=t0 + timedelta(seconds=n, milliseconds=version),
                    )
                    key, value, headers = rt.codec.encode(env)
                    batch.append(ProducerRecord(key, value, tuple(headers)))
            Producer(log).send_batch("invoices", batch)
    finally:
        log.close()


def fold_customers(data: Path) -> list[tuple[str, int, int, int, int]]:
    """``customer_balances`` from the log's raw JSON: (customer, invoiced, paid, voided,
    invoices)."""
    log = LogStore(data)
    owners: dict[str, tuple[str, int]] = {}
    sums: dict[str, list[int]] = {}
    try:
        for p in range(log.partition_count("invoices")):
            offset, hwm = 0, log.offsets("invoices", p).hwm
            while offset < hwm:
                records, _ = log.read("invoices", p, offset, upto=hwm)
                for r in records:
                    doc = orjson.loads(r.value or b"null")
                    inv, d = doc["aggregate_id"], doc["data"]
                    if doc["type"] == "InvoiceIssued":
                        owners[inv] = (d["customer_id"], d["amount_cents"])
                        row = sums.setdefault(d["customer_id"], [0, 0, 0, 0])
                        row[0] += d["amount_cents"]
                        row[3] += 1
                    elif doc["type"] == "PaymentRecorded":
                        sums[owners[inv][0]][1] += d["amount_cents"]
                    elif doc["type"] == "InvoiceVoided":
                        sums[owners[inv][0]][2] += owners[inv][1]
                offset = records[-1].offset + 1
    finally:
        log.close()
    return sorted((c, *v) for c, v in sums.items())  # type: ignore[misc]


def test_rows_of_many_partitions_merge_by_rule_in_the_server(
    engine: str, data: Path, spark: Any
) -> None:
    invoice_history(data)
    result = rebuild(invoicing, "customer_balances", engine="spark", spark=spark, data=data)
    assert result.merge is not None and result.merge.partials == 4
    customers = rows_of(
        result.schema or "",
        "SELECT customer_id, invoiced_cents, paid_cents, voided_cents, invoices"
        " FROM customer_balances",
    )
    assert customers == fold_customers(data)
    log = LogStore(data)
    try:
        engine_check, _live = verify_replay(invoicing, log, result)
    finally:
        log.close()
    assert engine_check.skipped is None and engine_check.ok
