"""``forget`` with a read model in PostgreSQL (issue 34): the oracle is a byte search of
the PostgreSQL cluster's data directory (heap files, indexes, WAL), with a positive control.

A ``roster`` projector copies members' names and e-mails (personal fields) into a table of
its PostgreSQL schema. Without an ``on_forget`` hook that deletes the subject's rows,
``forget`` reports the schema as not scrubbed (never "done"); with it, the rows are gone,
the tables are rewritten and the WAL that held them is retired: no byte of the subject's
plain text is left in the data directory, and the other members are intact.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from framework import App, EventContext, Projector, Runtime, forget, handles
from framework.projection import Worker, open_store
from framework.projection.postgres import schema_name
from framework.testing.postgres import PostgresServer
from tests.replay.erasure_app import Member, MemberJoined


class Roster(Projector):
    name = "roster"
    topics = ("members",)

    def setup(self, db: Any) -> None:
        db.execute("CREATE TABLE roster (id TEXT PRIMARY KEY, name TEXT, email TEXT)")

    @handles(MemberJoined)
    def joined(self, event: MemberJoined, ctx: EventContext) -> None:
        ctx.table("roster").insert(
            {"id": ctx.aggregate_id, "name": event.name, "email": event.email}
        )


def drop_rows(runtime: Runtime, subject: str) -> None:
    """The app's ``on_forget`` hook: the subject's rows leave the read model."""
    readmodel = open_store(runtime, "roster")
    try:
        with readmodel.transaction():
            readmodel.conn.execute("DELETE FROM roster WHERE id = ?", (subject,))
    finally:
        readmodel.close()


@pytest.fixture
def cluster() -> Iterator[PostgresServer]:
    """A cluster of its own (its data directory is searched byte by byte), with
    ``wal_recycle = off``, as docs/projections.md asks of a server that must forget."""
    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="eventlane-pg-")))
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_recycle = off")
        conn.execute("SELECT pg_reload_conf()")
    yield server
    server.stop()
    subprocess.run(["rm", "-rf", str(server.directory)], check=False)


def holds(server: PostgresServer, needle: str) -> list[str]:
    server.checkpoint()
    out = subprocess.run(
        ["grep", "-rlaF", needle, str(server.data)], capture_output=True, text=True, check=False
    ).stdout
    return out.split()


def run(app: App, data: Path) -> None:
    with app.open(data) as runtime:
        for i in range(40):
            runtime.execute(
                Member,
                f"m-{i}",
                lambda m, i=i: m.join(f"Person-{i:02d}-Qx", f"p{i}@ex.zz", "basic"),
                create=True,
            )
        worker = Worker(runtime, "roster", poll_timeout=0.2)
        try:
            while worker.run_once():
                pass
        finally:
            worker.close()


@pytest.mark.parametrize("hook", [False, True])
def test_forget_scrubs_a_postgresql_read_model_or_says_it_did_not(
    cluster: PostgresServer, tmp_path: Path, hook: bool
) -> None:
    app = App(
        "club",
        aggregates=[Member],
        projectors=[Roster],
        partitions=2,
        readmodels=cluster.url,
        on_forget=[drop_rows] if hook else [],
    )
    data = tmp_path / "data"
    run(app, data)
    assert holds(cluster, "Person-07-Qx")  # positive control: the plain text is there
    with app.open(data) as runtime:
        report = forget(runtime, "m-7")
    schema = schema_name("roster")
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        names = {r[0] for r in conn.execute(f"SELECT name FROM {schema}.roster")}
    if not hook:
        assert any("roster" in line and "still hold" in line for line in report.not_scrubbed)
        assert "Person-07-Qx" in names
        return
    assert not report.not_scrubbed, report.not_scrubbed
    assert any(schema in line for line in report.scrubbed)
    assert names == {f"Person-{i:02d}-Qx" for i in range(40) if i != 7}  # others intact
    assert holds(cluster, "Person-07-Qx") == []
    assert holds(cluster, "p7@ex.zz") == []
    assert holds(cluster, "Person-08-Qx")  # control: the others' bytes are still found
