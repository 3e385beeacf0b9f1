"""A handler statement the read model's database refuses for its own reasons is not poison
(adversarial review, 2026-11-29): a lock another session holds past ``lock_timeout`` (a
DBA's ``LOCK TABLE``, ``ALTER TABLE``, ``CREATE INDEX``), a deadlock, a cancel, a full disk.
The batch is rolled back whole (:class:`ReadModelBusyError`, retriable), nothing is
dead-lettered, and a worker applies it again once the database lets it. The oracle is the
fold of the log (``projection_kit.fold_accounts``).

Seen failing before the fix: the locked table's events were retried at once and
dead-lettered (``LockNotAvailable``), and the partition moved on without them.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import psycopg
import pytest
from projection_kit import Producer, fold_accounts, read_balances
from test_projection_apply import all_records, applier_for

import eventlane.projection.postgres as pg
from eventlane.app import Runtime
from eventlane.errors import ReadModelBusyError
from eventlane.log import TopicPartition
from eventlane.projection import ReadModel, Worker, list_dead_letters
from eventlane.projection.store import ENV as READMODELS_ENV

PG = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)


@pytest.fixture
def short_lock_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg, "BUSY_TIMEOUT_S", 0.5)  # lock_timeout of the read model's sessions


def lock_table(table: str) -> psycopg.Connection:
    """Another session (a DBA's) holding ``table`` of the balances schema in SHARE mode."""
    dba = psycopg.connect(os.environ[READMODELS_ENV])
    dba.execute(f'LOCK TABLE "balances"."{table}" IN SHARE MODE')
    return dba


@PG
def test_a_lock_timeout_rolls_the_batch_back_and_dead_letters_nothing(
    engine: str, runtime: Runtime, data: Path, short_lock_timeout: None
) -> None:
    Producer(runtime).deposits(40, accounts=5)
    records = all_records(runtime)
    applier, readmodel = applier_for(runtime, "balances")
    try:
        assert applier.apply(records[:10]).applied == 10
        before = readmodel.positions()
        dba = lock_table("balances")
        try:
            with pytest.raises(ReadModelBusyError) as refused:
                applier.apply(records[10:])
        finally:
            dba.close()
        error = refused.value
        assert error.retriable and not error.indeterminate
        assert error.topic == "accounts" and error.offset is not None
        assert "LockNotAvailable" in str(error) and "nothing dead-lettered" in str(error)
        assert "schema balances of postgresql://" in str(error)  # where, not a local file
        assert list_dead_letters(readmodel) == []
        assert readmodel.positions() == before  # nothing of the batch was kept
        assert applier.apply(records[10:]).applied == 30  # the lock is gone: all of it
        assert list_dead_letters(readmodel) == []
    finally:
        readmodel.close()
    assert read_balances(data) == fold_accounts(data).balances


@PG
def test_a_worker_applies_a_refused_batch_again_once_the_lock_is_gone(
    engine: str, runtime: Runtime, data: Path, short_lock_timeout: None
) -> None:
    Producer(runtime).deposits(60, accounts=6)
    worker = Worker(runtime, "balances", poll_timeout=0.05, session_timeout_ms=30_000)
    try:
        dba = lock_table("balances")
        try:
            deadline = time.monotonic() + 60
            while worker.busy_batches < 2:  # refused, paused, refused again
                assert time.monotonic() < deadline, "the worker never met the lock"
                worker.run_once()
        finally:
            dba.close()
        ends = {
            TopicPartition("accounts", p): runtime.log.offsets("accounts", p).hwm
            for p in range(runtime.log.partition_count("accounts"))
        }
        deadline = time.monotonic() + 60
        while {tp: o for tp, o in worker.readmodel.positions().items() if tp in ends} != ends:
            assert time.monotonic() < deadline, "the worker did not catch up after the lock"
            worker.run_once()
        assert list_dead_letters(worker.readmodel) == []
    finally:
        worker.close()
    assert read_balances(data) == fold_accounts(data).balances


def test_sqlite_busy_is_the_databases_doing_a_bad_statement_is_the_handlers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rm.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as busy:
        other.execute("SELECT * FROM t")
    with pytest.raises(sqlite3.OperationalError) as bad:
        sqlite3.connect(":memory:").execute("SELECT * FROM no_such_table")
    holder.rollback()
    assert ReadModel.transient(busy.value)
    try:
        raise ValueError("the handler wrapped it") from busy.value
    except ValueError as wrapped:
        assert ReadModel.transient(wrapped)
    assert not ReadModel.transient(bad.value)
    assert not ReadModel.transient(ValueError("a handler bug"))
