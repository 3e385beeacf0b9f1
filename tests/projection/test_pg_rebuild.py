"""Rebuilds of a projection whose read model is in PostgreSQL (issue 34): into a schema
beside the live one, ``--verify`` against the live schema, ``--swap`` under live workers,
``--as-of``; each checked against a fold of the log (``projection_kit.fold_accounts``).

The hand-off's promise: no event applied twice or skipped across the swap. The bank app's
``applied`` table has one row per applied event under ``PRIMARY KEY (topic, partition,
offset)`` (a second apply raises in the handler and would surface as a dead letter), so
the markers equal the set of events and the balances equal the fold.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from projection_kit import (
    APP,
    Producer,
    Workers,
    expect_model,
    expect_workers_carry_on_after_swap,
    fold_accounts,
    wait_caught_up,
)

from eventlane.app import Runtime
from eventlane.cli import main
from eventlane.console import ConsoleData
from eventlane.console.web import create_app
from eventlane.consumer.free import Consumer
from eventlane.errors import ConfigError
from eventlane.log import Record, TopicPartition
from eventlane.projection import BatchApplier, open_readmodel
from eventlane.projection.postgres import schema_name
from eventlane.projection.store import ENV as READMODELS_ENV
from eventlane.replay.handoff import rebuild_and_swap
from eventlane.replay.rebuild import rebuild
from eventlane.replay.verify import verify_rebuild

PG = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)


def schema_oid(schema: str) -> int | None:
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return None if row is None else int(row[0])


def rows_of(schema: str, table: str) -> dict[str, tuple[int, int]]:
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        rows = conn.execute(f'SELECT id, total, events FROM "{schema}"."{table}"').fetchall()
    return {r[0]: (int(r[1]), int(r[2])) for r in rows}


def records_of(runtime: Runtime, topic: str) -> list[Record]:
    consumer = Consumer(runtime.log, auto_offset_reset="earliest", max_poll_records=100_000)
    count = runtime.log.partition_count(topic)
    consumer.assign([TopicPartition(topic, p) for p in range(count)])
    total = sum(runtime.log.offsets(topic, p).hwm for p in range(count))
    out: list[Record] = []
    while len(out) < total:
        out.extend(consumer.poll(1.0))
    consumer.close()
    return out


@PG
def test_swap_under_live_workers_has_no_gap_and_no_duplicate(
    engine: str, runtime: Runtime, data: Path, workers: Workers
) -> None:
    producer = Producer(runtime)
    producer.deposits(600)
    procs = [workers.start(), workers.start()]
    for proc in procs:
        workers.wait_joined(proc)
    live = schema_name("balances")
    before = schema_oid(live)
    verified: list[bool] = []

    def verify(result: object) -> None:
        verified.append(all(c.ok for c in verify_rebuild(runtime, result)))  # type: ignore[arg-type]
        producer.deposits(300)  # more events while the shadow catches up

    handoff = rebuild_and_swap(runtime, "balances", engine="local", before_swap=verify)
    assert verified == [True]
    assert handoff.rebuild.schema == f"{live}__shadow"
    assert schema_oid(live) not in (None, before)  # the shadow is live now
    assert schema_oid(f"{live}__shadow") is None and schema_oid(f"{live}__old") is None
    expect_workers_carry_on_after_swap(producer, data, procs, workers)


@PG
def test_rebuild_and_verify_write_a_schema_beside_the_live_one(
    engine: str, runtime: Runtime, data: Path, workers: Workers
) -> None:
    Producer(runtime).deposits(400)
    proc = workers.start()
    workers.wait_joined(proc)
    wait_caught_up(data, "balances")
    workers.term(proc)
    live = schema_name("balances")
    result = rebuild(runtime, "balances", engine="local")
    assert result.schema == f"{live}__rebuild"
    assert rows_of(result.schema, "balances") == fold_accounts(data).balances
    assert [c.ok for c in verify_rebuild(runtime, result)] == [True, True]
    # a live model that differs is caught
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        conn.execute(f'UPDATE "{live}".balances SET total = total + 1 WHERE id = %s', ("acc-3",))
    live_check = verify_rebuild(runtime, result)[1]
    assert not live_check.ok and [d.table for d in live_check.differences] == ["balances"]
    with pytest.raises(ConfigError, match="not a file"):
        rebuild(runtime, "balances", engine="local", output=data / "x.sqlite")


@PG
def test_as_of_rebuilds_the_past_read_model(engine: str, runtime: Runtime, data: Path) -> None:
    producer = Producer(runtime)
    producer.deposits(300)
    then = fold_accounts(data).balances
    time.sleep(0.05)
    moment = int(time.time() * 1000)
    time.sleep(0.05)
    producer.deposits(300)
    result = rebuild(runtime, "balances", engine="local", as_of=moment)
    assert result.schema is not None
    assert rows_of(result.schema, "balances") == then
    assert sum(result.end.values()) == 300


@PG
def test_cli_rebuild_verify_swap(engine: str, runtime: Runtime, data: Path) -> None:
    Producer(runtime).deposits(200)
    cli = CliRunner()
    args = ["--data", str(data), "rebuild", APP, "--projection", "balances", "--engine", "local"]
    done = cli.invoke(main, [*args, "--verify", "--swap", "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    doc = orjson.loads(done.stdout)
    assert doc["handoff"]["positions"] and doc["rebuild"]["schema"].endswith("__shadow")
    expect_model(data)
    # the same from a file: refused, nothing written
    refused = cli.invoke(main, [*args, "--output", str(data / "b.sqlite")])
    assert refused.exit_code != 0 and "not a file" in refused.output
    assert not (data / "b.sqlite").exists()


@PG
def test_project_remove_drops_the_schema(
    engine: str, runtime: Runtime, data: Path, workers: Workers
) -> None:
    """Found failing before the fix: the group went, the schema stayed (``assert 12345 is
    None``), so a projector started again under the name resumed from the old positions."""
    Producer(runtime).deposits(100)
    proc = workers.start()
    workers.wait_joined(proc)
    wait_caught_up(data, "balances")
    workers.term(proc)
    rebuild(runtime, "balances", engine="local")  # leaves balances__rebuild beside it
    live = schema_name("balances")
    stage = f"{live}__rebuild__p00002a1"  # a stage of a Spark build killed before it dropped it
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{stage}"')
    cli = CliRunner()
    dry = cli.invoke(main, ["--data", str(data), "project", "remove", "balances", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"schema {live}" in dry.output and schema_oid(live) is not None
    done = cli.invoke(main, ["--data", str(data), "project", "remove", "balances", "--json"])
    assert done.exit_code == 0, done.output
    assert schema_oid(live) is None
    assert schema_oid(f"{live}__rebuild") is None
    assert schema_oid(stage) is None
    assert orjson.loads(done.stdout)["dead_letters"] == 0


@PG
def test_console_projector_pages_read_the_schema(engine: str, runtime: Runtime, data: Path) -> None:
    """Found failing before the fix: the console read dead letters from the SQLite file
    path, which a PostgreSQL projection never has (``assert [] == [...]``)."""
    Producer(runtime).deposits(60, poison=lambda i: i in (7, 21))
    readmodel = open_readmodel(runtime, "balances")
    try:
        projector = runtime.app.projector("balances")()
        applier = BatchApplier(projector, runtime.codec, readmodel, app=runtime)
        applier.apply(list(records_of(runtime, "accounts")))
    finally:
        readmodel.close()
    fold = fold_accounts(data)
    console = ConsoleData(runtime.log, APP)
    try:
        letters = console.dead_letters("balances", "open")
        assert {(d["topic"], d["partition"], d["offset"]) for d in letters} == fold.poison
        assert console.dead_letter("balances", letters[0]["id"])["status"] == "dead"
        page = console.projector("balances")
        assert page["status"] == "error"  # open dead letters
        assert page["readmodel_tables"] == {"applied": 58, "balances": len(fold.balances)}
        with warnings.catch_warnings():  # starlette prefers httpx2; httpx is installed
            warnings.simplefilter("ignore")
            from starlette.testclient import TestClient  # noqa: PLC0415
        client = TestClient(create_app(console, datasette=False), base_url="http://localhost")
        html = client.get("/projectors/balances")
        assert html.status_code == 200, html.text
        assert "PostgreSQL schema balances" in html.text and "applied <b>58</b>" in html.text
        assert "cannot apply poison" in html.text
    finally:
        console.runtime.close()  # type: ignore[union-attr]  # the log is the fixture's


@PG
def test_verify_checks_the_postgresql_read_models(
    engine: str, runtime: Runtime, data: Path
) -> None:
    Producer(runtime).deposits(80)
    readmodel = open_readmodel(runtime, "balances")
    try:
        projector = runtime.app.projector("balances")()
        BatchApplier(projector, runtime.codec, readmodel).apply(records_of(runtime, "accounts"))
    finally:
        readmodel.close()
    cli = CliRunner()
    ok = cli.invoke(main, ["--data", str(data), "verify", "--json"])
    assert ok.exit_code == 0, ok.output
    [check] = orjson.loads(ok.stdout)["readmodels"]
    assert check["schema"] == "balances" and check["problems"] == []
    assert check["positions"] == runtime.log.partition_count("accounts")
    # a read model ahead of its log (a log restored from an older backup) is reported
    with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
        conn.execute(
            "UPDATE balances._eventlane_positions SET next_offset = next_offset + 5"
            " WHERE partition = 1"
        )
    bad = cli.invoke(main, ["--data", str(data), "verify"])
    assert bad.exit_code == 1, bad.output
    assert "READ MODEL schema=balances: position of accounts/1" in bad.output
    assert "past the log's high-water mark" in bad.output
