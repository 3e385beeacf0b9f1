"""``eventlane forget`` with the read models on either engine (issue 34), one code path: the
personal projection is rebuilt without the subjects and swapped in under a live worker
process, the app's ``on_forget`` hook runs, the dead-letter history is kept with the
subjects' error text removed, and no file keeps the subjects' plain text.

Each case is drawn from a seed (members, which of them are poison and which are forgotten,
who changes plan, who joins after the forget). Oracles, independent of the projection
code: the model of what the test wrote (each member's name and e-mail, a forgotten one's
the placeholders), a fold of the log decoded by the app's codec, and a byte search (``grep
-F``) of every file under the data directory and, on PostgreSQL, of the test cluster's
whole directory (heap files, indexes, the statistics catalog, ``pg_wal``, the server log),
with positive controls before (the subjects' text is found) and after (the other members'
is still found). On PostgreSQL the table is ``ANALYZE``d first, as autovacuum does to a
table that grew: the planner's statistics then hold copies of its values.

The app is ``rosterapp``. On PostgreSQL each test runs its own cluster (its files are
searched) with ``wal_recycle = off``, as docs/projections.md asks of a server that must
forget; one test runs a server with the default ``wal_recycle = on`` and expects forget to
say the WAL may still hold the data (never "done").
"""

from __future__ import annotations

import os
import random
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from projection_kit import Workers, connect, view, wait_caught_up

from eventlane import App, EventContext, Projector, Runtime, forget, handles, rebuild
from eventlane.cli import main
from eventlane.domain.privacy import ERASED
from eventlane.projection import Worker
from eventlane.projection.postgres import derived_schema, schema_name, stage_schema
from eventlane.projection.store import ENV as READMODELS_ENV
from eventlane.replay.handoff import SCRUBBED_ERROR
from eventlane.testing.postgres import PostgresServer
from example_apps.invoicing.app import app as invoicing
from example_apps.invoicing.domain import Customer, Order
from example_apps.invoicing.events import Address, CustomerMoved, CustomerRegistered, OrderLine
from tests.projection.rosterapp import app
from tests.replay.erasure_app import Member, MemberJoined

APP = "tests.projection.rosterapp:app"
BOTH = pytest.mark.parametrize("engine", ["sqlite", "postgresql"], indirect=True)


def start_cluster(*, wal_recycle: bool) -> PostgresServer:
    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="eventlane-pg-")))
    if not wal_recycle:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_recycle = off")
            conn.execute("SELECT pg_reload_conf()")
    return server


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """A cluster of this test's own (``wal_recycle = off``); stopped by its PID."""
    server = start_cluster(wal_recycle=getattr(request, "param", False))
    yield server
    server.stop()
    subprocess.run(["rm", "-rf", str(server.directory)], check=False)


@pytest.fixture
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Overrides projection_kit's: on PostgreSQL the read models go to this test's own
    cluster (``cluster``), for this process and the workers it starts."""
    name = str(getattr(request, "param", "sqlite"))
    if name == "postgresql":
        server: PostgresServer = request.getfixturevalue("cluster")
        monkeypatch.setenv(READMODELS_ENV, server.url)
    else:
        monkeypatch.delenv(READMODELS_ENV, raising=False)
    yield name


@pytest.fixture
def searched(engine: str, data: Path, request: pytest.FixtureRequest) -> list[Path]:
    """The directories whose every byte is searched: the data directory and, on
    PostgreSQL, the cluster's directory (its data directory and server log)."""
    if engine == "postgresql":
        return [data, request.getfixturevalue("cluster").directory]
    return [data]


def person(i: int) -> tuple[str, str]:
    return f"Person-{i:02d}-Qx Zanzibar", f"p{i:02d}.zq@ex.zz"


@dataclass
class Case:
    """One drawn case: members ``0..joined-1`` join before the forget, ``joined..total-1``
    after it; ``poison`` ones are dead-lettered by ``roster`` (two before the forget, and
    the last one after it: its letter follows the carried ones); ``forgotten`` are
    forgotten; ``plans`` change plan (``plans`` read model)."""

    joined: int
    total: int
    poison: frozenset[str]
    forgotten: tuple[str, ...]
    plans: frozenset[str]

    @staticmethod
    def draw(seed: int) -> Case:
        rng = random.Random(seed)
        joined = rng.randint(8, 14)
        total = joined + rng.randint(1, 4)
        ids = [f"m-{i}" for i in range(joined)]
        return Case(
            joined,
            total,
            frozenset([*rng.sample(ids, 2), f"m-{total - 1}"]),
            tuple(rng.sample(ids, rng.randint(1, 3))),
            frozenset(rng.sample(ids, joined // 2)),
        )

    def join(self, runtime: Runtime, i: int) -> None:
        mid = f"m-{i}"
        name, email = person(i)
        plan = "poison" if mid in self.poison else "basic"
        runtime.execute(Member, mid, lambda m: m.join(name, email, plan), create=True)
        if mid in self.plans:
            runtime.execute(Member, mid, lambda m: m.change_plan("gold"))

    def kept_member(self) -> str:
        """The first member who joined before the forget and is not dead-lettered."""
        return next(f"m-{i}" for i in range(self.joined) if f"m-{i}" not in self.poison)

    def roster(self, upto: int, forgotten: tuple[str, ...]) -> dict[str, tuple[str, str]]:
        """The roster as the test wrote it: every member but the poison ones; a forgotten
        member's values are the placeholders."""
        out = {}
        for i in range(upto):
            mid = f"m-{i}"
            if mid not in self.poison:
                out[mid] = (ERASED, ERASED) if mid in forgotten else person(i)
        return out


def fold(runtime: Runtime) -> dict[str, tuple[str, str]]:
    """The roster as the log says it must be: every ``MemberJoined`` of the members topic,
    decoded by the app's codec (a forgotten subject's fields: the placeholders), but the
    poison ones."""
    out = {}
    log_ = runtime.log
    for p in range(log_.partition_count("members")):
        marks = log_.offsets("members", p)
        position = marks.lwm
        while position < marks.hwm:
            records, _ = log_.read("members", p, position, upto=marks.hwm)
            for r in records:
                env = runtime.codec.decode(r.key, r.value, r.headers)
                if isinstance(env.event, MemberJoined) and env.event.plan != "poison":
                    out[env.aggregate_id] = (env.event.name, env.event.email)
            position = records[-1].offset + 1
    return out


def table(data: Path, name: str, sql: str) -> dict[str, tuple[str, ...]]:
    with connect(data, name) as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(sql)}


def files_holding(roots: list[Path], needle: str) -> list[str]:
    """Every file under ``roots``, after a ``CHECKPOINT`` flushed the server's buffers,
    whose bytes contain ``needle``."""
    url = os.environ.get(READMODELS_ENV)
    if url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    found = subprocess.run(
        ["grep", "-rlaF", "--", needle, *map(str, roots)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode in (0, 1), found.stderr
    return found.stdout.split()


def dead_letters(data: Path) -> dict[str, tuple[str, str]]:
    with connect(data, "roster") as conn:
        rows = conn.execute("SELECT key, status, error FROM _eventlane_dead_letters").fetchall()
    return {bytes(k).decode(): (s, e) for k, s, e in rows}


def project(runtime: Runtime, name: str) -> None:
    """Apply everything in the log to projection ``name`` (one worker in this process)."""
    worker = Worker(runtime, name, poll_timeout=0.2)
    try:
        while worker.run_once():
            pass
    finally:
        worker.close()


SEEDS = [2, *(pytest.param(s, marks=pytest.mark.soak) for s in range(100, 110))]
"""Seed 2 (default suite) forgets a poison member (a dead letter) that changed plan too."""


@BOTH
@pytest.mark.parametrize("seed", SEEDS)
def test_forget_rebuilds_the_read_model_under_a_live_worker_and_no_file_keeps_the_subjects(
    engine: str, seed: int, data: Path, workers: Workers, searched: list[Path]
) -> None:
    case = Case.draw(seed)
    forgotten = case.forgotten
    with app.open(data) as runtime:
        for i in range(case.joined):
            case.join(runtime, i)
        project(runtime, "plans")
    proc = workers.start("roster", app=APP)
    workers.wait_joined(proc, "roster")
    wait_caught_up(data, "roster", topic="members")
    assert table(data, "roster", "SELECT id, name, email FROM roster") == case.roster(
        case.joined, ()
    )
    with app.open(data) as runtime:
        rebuild(runtime, "roster", engine="local")  # a rebuild output beside the live model
    letters = dead_letters(data)
    assert set(letters) == {m for m in case.poison if int(m[2:]) < case.joined}
    assert all(s == "dead" and "[redacted]" in e for s, e in letters.values()), letters
    if engine == "postgresql":
        with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
            live = schema_name("roster")
            # what autovacuum does to a table that grew: statistics
            conn.execute(f'ANALYZE "{live}".roster')
            # what a killed Spark rebuild's task and an interrupted --verify leave
            for left in (stage_schema(derived_schema(live, "rebuild"), 0, 0), f"{live}__verify"):
                conn.execute(f'CREATE SCHEMA "{left}"')
                conn.execute(f'CREATE TABLE "{left}".roster AS SELECT * FROM "{live}".roster')
    for mid in forgotten:  # positive control: the plain text is there before
        if mid not in case.poison:
            for needle in person(int(mid[2:])):
                found = files_holding(searched, needle)
                assert found, needle
                if engine == "postgresql":  # the table's file (base/) and the WAL
                    assert {"base", "pg_wal"} <= {Path(f).parent.parent.name for f in found} | {
                        Path(f).parent.name for f in found
                    }, found

    done = CliRunner().invoke(
        main, ["--data", str(data), "forget", APP, *forgotten, "--json"], catch_exceptions=False
    )
    assert done.exit_code == 0, done.output
    report = orjson.loads(done.stdout)
    assert report["ok"] and report["rebuilt"] == ["roster"], report
    assert sorted(report["keys_destroyed"]) == sorted(forgotten)

    with app.open(data) as runtime:  # the worker goes on after the swap
        for i in range(case.joined, case.total):
            case.join(runtime, i)
        wait_caught_up(data, "roster", topic="members", timeout=120)
        assert proc.poll() is None, workers.output()
        expected = case.roster(case.total, forgotten)
        assert fold(runtime) == expected
    assert table(data, "roster", "SELECT id, name, email FROM roster") == expected
    plans = table(data, "plans", "SELECT id, plan FROM plans")  # the on_forget hook ran
    assert plans == {m: ("gold",) for m in case.plans if m not in forgotten}
    letters = dead_letters(data)  # the history survives, the subjects' error text removed
    assert set(letters) == case.poison
    for mid, (status, error) in letters.items():
        assert status == "dead"
        assert error == SCRUBBED_ERROR if mid in forgotten else "[redacted]" in error
    with view(data, "roster") as v:  # every event once, nothing skipped
        assert sum(v.positions().values()) == case.total + len(case.plans)
    for mid in forgotten:
        for needle in person(int(mid[2:])):
            assert files_holding(searched, needle) == [], needle
    kept = [i for i in range(case.joined) if f"m-{i}" not in {*forgotten, *case.poison}]
    for i in kept:  # control: the others are still found
        assert files_holding(searched, person(i)[0]), i
    if engine == "postgresql":
        with psycopg.connect(os.environ[READMODELS_ENV], autocommit=True) as conn:
            schemas = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace")}
        assert schema_name("roster") in schemas
        assert not {s for s in schemas if s.startswith("roster__")}  # rebuild output dropped


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
@pytest.mark.parametrize("cluster", [True], indirect=True)  # the default wal_recycle = on
def test_forget_says_when_recycled_wal_segments_may_keep_the_subject(
    cluster: PostgresServer, engine: str, data: Path
) -> None:
    case = Case.draw(1)
    with app.open(data) as runtime:
        for i in range(case.joined):
            case.join(runtime, i)
        project(runtime, "roster")
        subject = case.kept_member()
        report = forget(runtime, subject)
    assert report.rebuilt == ("roster",)
    assert [line for line in report.not_scrubbed if "wal_recycle" in line], report
    assert table(data, "roster", "SELECT id, name, email FROM roster")[subject] == (
        ERASED,
        ERASED,
    )


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_reader_holding_the_swapped_out_schema_is_reported_then_the_next_run_finishes(
    engine: str, data: Path, searched: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console's open transaction on the live table keeps the swapped-out schema from
    being dropped (its lock): forget says so (exit 1, never a crash, never "done"); once the
    reader is gone, the next run (the journal's subjects) drops it and nothing is left."""
    monkeypatch.setattr("eventlane.projection.postgres.BUSY_TIMEOUT_S", 1.0)
    case = Case.draw(1)
    subject = case.kept_member()
    with app.open(data) as runtime:
        for i in range(case.joined):
            case.join(runtime, i)
        project(runtime, "roster")
        reader = psycopg.connect(os.environ[READMODELS_ENV])  # a transaction left open
        try:
            reader.execute(f'SELECT count(*) FROM "{schema_name("roster")}".roster').fetchone()
            report = forget(runtime, subject)
        finally:
            reader.close()
        assert report.rebuilt == ("roster",)
        assert [line for line in report.not_scrubbed if "roster__old" in line], report
        assert files_holding(searched, person(int(subject[2:]))[0])  # still in the old one
        again = forget(runtime, [])
    assert again.ok, again.not_scrubbed
    assert table(data, "roster", "SELECT id, name, email FROM roster") == case.roster(
        case.joined, (subject,)
    )
    for needle in person(int(subject[2:])):
        assert files_holding(searched, needle) == [], needle


class Directory(Projector):
    """Customers' names and cities (personal), through the portable table API."""

    name = "directory"
    topics = (Customer,)

    def setup(self, db: Any) -> None:
        db.execute("CREATE TABLE directory (customer_id TEXT PRIMARY KEY, name TEXT, city TEXT)")

    @handles
    def registered(self, e: CustomerRegistered, ctx: EventContext) -> None:
        ctx.table("directory").upsert(
            {"customer_id": ctx.aggregate_id, "name": e.name, "city": e.address.city},
            key=["customer_id"],
        )

    @handles
    def moved(self, e: CustomerMoved, ctx: EventContext) -> None:
        ctx.table("directory").update(
            {"customer_id": ctx.aggregate_id}, set={"city": e.address.city}
        )


shop = App(
    "invoicing",
    aggregates=invoicing.aggregates,
    projectors=[*invoicing.projectors.values(), Directory],
    registry=invoicing.registry,
    partitions=3,
    on_forget=invoicing.on_forget,
)


def customer(i: int) -> tuple[str, str, str]:
    """Name, street and city of customer ``i`` as registered (moved: every third)."""
    return f"Ada Quixotic-{i:02d} Lovelace", f"{i:02d} Zanzibar Crescent", "Oslo"


def rows_of(data: Path, models: dict[str, tuple[str, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for name, tables in models.items():
        with connect(data, name) as conn:
            for t in tables:
                out[t] = sorted(tuple(r) for r in conn.execute(f"SELECT * FROM {t}"))
    return out


@BOTH
def test_forgetting_an_invoicing_customer_leaves_no_byte_of_them_and_the_others_intact(
    engine: str, data: Path, searched: list[Path]
) -> None:
    """The acceptance line of issue 34 on the invoicing app: after forget of a customer no
    file (on PostgreSQL: the cluster's) holds their name or streets; the directory equals
    the model of what was written, and every other read model is unchanged."""
    customers, gone = 6, 3
    with shop.open(data) as rt:
        for i in range(customers):
            name, street, city = customer(i)
            c = Customer(f"cust-{i:04d}")
            c.register(name, Address(street, city, "NO"))
            if i % 3 == 0:
                c.move(Address(f"{i:02d} Moved Lane", "Graz", "AT"))
            rt.save(c)
            order = Order(f"order-{i:04d}")
            order.place(c.id, [OrderLine("sku-001", 2, 500)], Address(street, city, "NO"))
            order.confirm()
            rt.save(order)
        order_ = ["invoicing_policy", *(n for n in shop.projectors if n != "invoicing_policy")]
        for name in order_:
            Worker(rt, name, session_timeout_ms=3000).run(
                until=lambda n=name: rt.status(n)["lag"] == 0
            )
        others = {  # read model: its tables (no personal data)
            "invoices": ("invoices",),
            "customer_balances": ("customer_balances", "invoice_owners"),
            "orders_by_status": ("orders", "order_lines"),
        }
        before = rows_of(data, others)
        assert len(before["invoices"]) == customers and len(before["orders"]) == customers
        needles = (customer(gone)[0], customer(gone)[1])
        for needle in needles:  # positive control
            assert files_holding(searched, needle), needle
        report = forget(rt, f"cust-{gone:04d}")
        assert report.ok, report.not_scrubbed
        assert "directory" in report.rebuilt
    for needle in needles:
        assert files_holding(searched, needle) == [], needle
    assert files_holding(searched, customer(gone + 1)[0])  # control: the others are found
    expected = {
        f"cust-{i:04d}": (
            ERASED if i == gone else customer(i)[0],
            "" if i == gone else "Graz" if i % 3 == 0 else customer(i)[2],
        )
        for i in range(customers)
    }
    assert table(data, "directory", "SELECT customer_id, name, city FROM directory") == expected
    assert rows_of(data, others) == before
