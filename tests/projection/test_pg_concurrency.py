"""Concurrent writers of one PostgreSQL read model lose no update (issue 34).

Two appliers, each on its own connection (as two worker processes, or two hosts, have),
apply the batches of different partitions at the same time. Their handler is a
read-modify-write of one shared row (``get`` the running total, then ``upsert`` the sum),
the pattern that loses updates under PostgreSQL's default READ COMMITTED isolation when two
transactions interleave. Writers of one read model take turns through the schema's advisory
lock, so the total must equal a fold of the log (the sum of every event's amount), and every
partition's position must be its end.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from projection_kit import BOTH, Producer

from eventlane.app import App, Runtime
from eventlane.errors import ReadModelUnavailableError
from eventlane.log import Record, TopicPartition
from eventlane.projection import BatchApplier, EventContext, Projector, handles, open_readmodel
from eventlane.projection.postgres import PgReadModel
from tests.projection import bankapp
from tests.projection.test_projection_apply import all_records


class Shared(Projector):
    """One row written from every partition, by read-modify-write."""

    name = "shared"
    topics = ("accounts",)

    def setup(self, db: Any) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS total (id TEXT PRIMARY KEY, amount BIGINT)")

    def _add(self, ctx: EventContext, amount: int) -> None:
        table = ctx.table("total")
        row = table.get(id="all")
        current = 0 if row is None else int(row["amount"])
        table.upsert({"id": "all", "amount": current + amount}, key=("id",))

    @handles(bankapp.Deposited)
    def deposited(self, event: bankapp.Deposited, ctx: EventContext) -> None:
        self._add(ctx, event.amount)

    @handles(bankapp.Withdrawn)
    def withdrawn(self, event: bankapp.Withdrawn, ctx: EventContext) -> None:
        self._add(ctx, -event.amount)


shared_app = App(
    "bank",
    aggregates=[bankapp.Account, bankapp.Order, bankapp.Invoice],
    projectors=[Shared],
    partitions={"accounts": 6, "orders": 4, "invoices": 4},
)


def fold(records: list[Record], runtime: Runtime) -> int:
    total = 0
    for r in records:
        event = runtime.codec.decode(r.key, r.value, r.headers).event  # type: ignore[arg-type]
        total += event.amount if isinstance(event, bankapp.Deposited) else -event.amount
    return total


@BOTH
def test_two_writers_of_one_read_model_lose_no_update(data: Path) -> None:
    with shared_app.open(data) as runtime:
        Producer(runtime).deposits(1_200, accounts=40)
        records = all_records(runtime)
        expected = fold(records, runtime)
        halves = [
            [r for r in records if r.partition % 2 == 0],
            [r for r in records if r.partition % 2 == 1],
        ]
        readmodels = [open_readmodel(runtime, "shared") for _ in halves]
        appliers = [BatchApplier(Shared(), runtime.codec, rm) for rm in readmodels]
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def work(applier: BatchApplier, mine: list[Record]) -> None:
            try:
                start.wait()
                for i in range(0, len(mine), 25):
                    applier.apply(mine[i : i + 25], generation=0)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=work, args=(a, h))
            for a, h in zip(appliers, halves, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        total = readmodels[0].conn.execute("SELECT amount FROM total").fetchone()[0]
        ends = {
            TopicPartition("accounts", p): runtime.log.offsets("accounts", p).hwm for p in range(6)
        }
        assert readmodels[0].positions() == ends
        for rm in readmodels:
            rm.close()
    assert total == expected


def test_a_lost_connection_is_an_unknown_outcome_and_positions_tell(postgres_url: str) -> None:
    """The server ends the session (a restart, a failover): the next transaction raises
    ReadModelUnavailableError (indeterminate), and a fresh connection finds the positions
    of what was committed before."""
    path = Path("/nonexistent/readmodel.sqlite")
    readmodel = PgReadModel(postgres_url, "lost", path)
    tp = TopicPartition("accounts", 0)
    assert readmodel.claim(tp, 1, 0) == 0
    pid = readmodel.raw.info.backend_pid
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(ReadModelUnavailableError) as info:
        readmodel.claim(tp, 2, 0)
    assert info.value.indeterminate and not info.value.retriable
    assert "schema lost of postgresql://" in str(info.value)  # where, not a local file
    assert "file=" not in str(info.value)
    readmodel.close()
    again = PgReadModel(postgres_url, "lost", path)
    assert again.positions() == {tp: 0}
    assert again.claim(tp, 2, 0) == 0
    again.close()
