"""A handler that catches a failed statement and goes on: fine on SQLite, impossible on
PostgreSQL (a failed statement aborts the transaction). The dead letter says so, naming
the table and the way out (adversarial review, 2026-11-29: it said only
``InFailedSqlTransaction``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from projection_kit import Producer
from test_projection_apply import all_records

from eventlane import App, EventContext, Projector, handles
from eventlane.app import Runtime
from eventlane.projection import BatchApplier, list_dead_letters, open_readmodel
from tests.projection import bankapp


class Counts(Projector):
    name = "counts"
    topics = ("accounts",)
    handler_attempts = 1

    def setup(self, db: object) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS counts (id TEXT PRIMARY KEY, n BIGINT)")  # type: ignore[attr-defined]

    @handles(bankapp.Deposited)
    def deposited(self, event: bankapp.Deposited, ctx: EventContext) -> None:
        counts = ctx.table("counts")
        try:
            counts.insert({"id": ctx.aggregate_id, "n": 1})
        except Exception:  # an existing key: count it instead (works on SQLite only)
            counts.update({"id": ctx.aggregate_id}, add={"n": 1})


APP = App("bank", aggregates=[bankapp.Account], projectors=[Counts], partitions={"accounts": 1})


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"], indirect=True)
def test_catch_and_continue_is_explained_on_postgresql(engine: str, data: Path) -> None:
    runtime: Runtime
    with APP.open(data) as runtime:
        Producer(runtime).deposits(6, accounts=2)
        readmodel = open_readmodel(runtime, "counts")
        try:
            with readmodel.transaction():
                Counts().setup(readmodel.db)
            result = BatchApplier(Counts(), runtime.codec, readmodel).apply(all_records(runtime))
            letters = list_dead_letters(readmodel)
        finally:
            readmodel.close()
    if engine == "sqlite":
        assert result.dead_lettered == 0 and letters == [] and result.applied >= 4
    else:  # the first deposit of each account passes; each later one is explained
        assert result.applied == 2 and result.dead_lettered == len(letters) >= 2
        for letter in letters:
            assert "PostgreSQL aborts the transaction at a failed statement" in letter.error
            assert "'counts'" in letter.error and "upsert" in letter.error
