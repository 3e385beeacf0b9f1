"""The batch applier and the read model, in one process on real files: exactly-once effect,
fencing, dead letters, parking and its release, migrations, policies, read-your-writes."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest
from projection_kit import BOTH, Producer, fold_accounts, read_balances, read_markers

from eventlane.app import Runtime
from eventlane.codec import Envelope
from eventlane.consumer.free import Consumer
from eventlane.errors import InvalidPositionError, ProjectionError
from eventlane.log import Record, TopicPartition
from eventlane.projection import (
    BatchApplier,
    FencedError,
    ReadModel,
    Worker,
    list_dead_letters,
    migrate_all,
    open_readmodel,
    readmodel_path,
    retry_dead_letters,
)
from eventlane.projection.store import AnyReadModel, open_store
from tests.projection import bankapp

TP0 = TopicPartition("accounts", 0)


def _columns(readmodel: AnyReadModel, table: str) -> list[str]:
    return [d[0] for d in readmodel.conn.execute(f"SELECT * FROM {table} LIMIT 0").description]


def all_records(runtime: Runtime, topic: str = "accounts") -> list[Record]:
    consumer = Consumer(runtime.log, auto_offset_reset="earliest", max_poll_records=100_000)
    count = runtime.log.partition_count(topic)
    consumer.assign([TopicPartition(topic, p) for p in range(count)])
    total = sum(runtime.log.offsets(topic, p).hwm for p in range(count))
    out: list[Record] = []
    while len(out) < total:
        out.extend(consumer.poll(1.0))
    consumer.close()
    return out


def applier_for(runtime: Runtime, name: str) -> tuple[BatchApplier, AnyReadModel]:
    readmodel = open_readmodel(runtime, name)
    projector = runtime.app.projector(name)()
    projector.setup(readmodel.db)
    return BatchApplier(projector, runtime.codec, readmodel, app=runtime), readmodel


@BOTH
def test_batch_applied_exactly_once_under_redelivery(runtime: Runtime, data: Path) -> None:
    Producer(runtime).deposits(600)
    records = all_records(runtime)
    applier, readmodel = applier_for(runtime, "balances")
    for tp in {TopicPartition(r.topic, r.partition) for r in records}:
        readmodel.claim(tp, 1, 0)
    half = len(records) // 2
    first = applier.apply(records[:half], generation=1)
    assert first.applied == half
    # Redelivery: the whole stream again (the first half overlaps) and the second half again.
    again = applier.apply(records, generation=1)
    assert again.applied == len(records) - half
    assert applier.apply(records[half:], generation=1).applied == 0
    readmodel.close()
    assert read_balances(data) == fold_accounts(data).balances
    markers = read_markers(data)
    assert len(markers) == len(set(markers)) == len(records)


@BOTH
def test_older_generation_is_fenced_and_changes_nothing(runtime: Runtime) -> None:
    Producer(runtime).deposits(60)
    records = [r for r in all_records(runtime) if r.partition == 0]
    applier, readmodel = applier_for(runtime, "balances")
    assert readmodel.claim(TP0, 3, 0) == 0
    applier.apply(records[:5], generation=3)
    assert readmodel.claim(TP0, 7, 0) == 5  # a newer owner takes it over
    with pytest.raises(FencedError) as info:
        applier.apply(records[5:], generation=3)  # the zombie's late batch
    assert info.value.partition == 0
    assert readmodel.position(TP0) == 5
    with pytest.raises(FencedError):
        readmodel.claim(TP0, 4, 0)
    # The group state was lost (generations restarted): the current owner takes over.
    assert readmodel.claim(TP0, 1, 0, still_owned=lambda: True) == 5
    with pytest.raises(FencedError):
        readmodel.claim(TP0, 0, 0, still_owned=lambda: False)
    applier.apply(records[5:], generation=1)
    assert readmodel.position(TP0) == records[-1].offset + 1
    readmodel.close()


@BOTH
def test_positions_never_move_backwards(runtime: Runtime) -> None:
    Producer(runtime).deposits(60)
    records = [r for r in all_records(runtime) if r.partition == 0]
    applier, readmodel = applier_for(runtime, "balances")
    readmodel.claim(TP0, 1, 0)
    applier.apply(records, generation=1)
    end = readmodel.position(TP0)
    applier.apply(records[:3], generation=1)  # an old batch, redelivered
    assert readmodel.position(TP0) == end
    readmodel.close()


@BOTH
def test_poison_dead_lettered_in_the_batch_transaction(runtime: Runtime, data: Path) -> None:
    Producer(runtime).deposits(300, poison=lambda i: i % 37 == 5)
    records = all_records(runtime)
    # A record that is not even JSON, and one of an event type nobody registered.
    log = runtime.log
    bad = log.append("accounts", 1, [(b"acc-1", b"{not json", (("event-type", b"X"),), None)])
    unknown_value = orjson.dumps(
        {
            "type": "Nope",
            "version": 1,
            "aggregate_id": "acc-1",
            "aggregate_version": 99,
            "event_id": "6f1c8d8e-8a3c-4f5b-9a4e-0c1d2e3f4a5b",
            "timestamp": "2024-05-01T12:00:00+00:00",
            "correlation_id": None,
            "causation_id": None,
            "data": {},
        }
    )
    unknown = log.append("accounts", 1, [(b"acc-1", unknown_value, (), None)])
    records = all_records(runtime)
    applier, readmodel = applier_for(runtime, "balances")
    result = applier.apply(records, generation=0)
    fold = fold_accounts(data)
    assert result.dead_lettered == len(fold.poison) + 2
    letters = {(d.topic, d.partition, d.offset): d for d in list_dead_letters(readmodel)}
    assert set(letters) == fold.poison | {
        ("accounts", 1, bad.base_offset),
        ("accounts", 1, unknown.base_offset),
    }
    raw = {(r.topic, r.partition, r.offset): r for r in records}
    for coord, letter in letters.items():
        assert letter.value == raw[coord].value
        assert letter.status == "dead"
    poison = letters[min(fold.poison)]
    assert "ValueError: cannot apply poison deposit" in poison.error
    assert poison.attempts == bankapp.Balances.handler_attempts
    assert poison.headers == raw[min(fold.poison)].headers
    assert poison.event_type == "Deposited"
    assert letters[("accounts", 1, bad.base_offset)].attempts == 1  # decode errors: no retries
    assert "not valid JSON" in letters[("accounts", 1, bad.base_offset)].error
    assert "Nope" in letters[("accounts", 1, unknown.base_offset)].error
    # Positions passed every record, poison included, in the same transaction.
    for p in range(6):
        assert readmodel.position(TopicPartition("accounts", p)) == log.offsets("accounts", p).hwm
    readmodel.close()
    assert read_balances(data) == fold.balances


def test_unhandled_types_skipped_without_decoding(runtime: Runtime) -> None:
    producer = Producer(runtime)
    producer.deposits(20)
    applier, readmodel = applier_for(runtime, "invoicing")  # handles OrderPlaced only
    result = applier.apply(all_records(runtime), generation=0)
    assert result == (0, 20, 0)
    readmodel.close()


@BOTH
def test_parked_key_released_by_retry_keeps_order(
    runtime: Runtime, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # acc-3's deposit at i=3 is poison; everything later of acc-3 must wait behind it.
    producer = Producer(runtime)
    producer.deposits(100, accounts=10, poison=lambda i: i == 3)
    applier, readmodel = applier_for(runtime, "ledger")
    applier.apply(all_records(runtime), generation=0)
    letters = list_dead_letters(readmodel)
    assert [d.status for d in letters].count("dead") == 1
    assert {d.key for d in letters} == {b"acc-3"}
    assert len(letters) == 10  # the poison one, then 9 parked
    ledger = dict(readmodel.conn.execute("SELECT id, version FROM ledger"))
    assert "acc-3" not in ledger and ledger["acc-4"] == 10
    # While the key is parked, a new event of it is parked too.
    producer.deposits(10, accounts=10)
    new = [r for r in all_records(runtime) if r.key == b"acc-3"][-1]
    applier.apply([new], generation=0)
    assert list_dead_letters(readmodel)[-1].status == "parked"
    # Retrying a parked letter alone is refused while an earlier one of its key is open.
    other = open_store(runtime, "ledger")  # as `eventlane dlq retry` would
    projector = bankapp.Ledger()
    refused = retry_dead_letters(projector, runtime.codec, other, ids=[letters[1].id])
    assert not refused.succeeded and "earlier dead letter" in refused.failed[letters[1].id]
    # Before the fix the retry fails and keeps the key parked.
    still = retry_dead_letters(projector, runtime.codec, other)
    assert len(still.failed) == 11 and not still.succeeded
    monkeypatch.setenv("BANKAPP_FIXED", "1")
    report = retry_dead_letters(projector, runtime.codec, other)
    assert len(report.succeeded) == 11 and not report.failed
    other.close()
    # The live applier sees the release at its next batch: acc-3 flows again, in order.
    producer.deposits(10, accounts=10)
    latest = [r for r in all_records(runtime) if r.key == b"acc-3"][-1]
    assert applier.apply([latest], generation=0).applied == 1
    assert dict(readmodel.conn.execute("SELECT id, version FROM ledger"))["acc-3"] == 12
    readmodel.close()


@BOTH
def test_pending_migrations_refuse_start_until_migrated(runtime: Runtime, data: Path) -> None:
    # A new read model is created at the latest schema (of version 1 of the app).
    readmodel = open_readmodel(runtime, "balances")
    readmodel.claim(TP0, 0, 0)
    readmodel.close()
    with bankapp.app_v2.open(data) as v2:
        with pytest.raises(ProjectionError) as info:
            open_readmodel(v2, "balances")
        assert "m002_balances_owner" in str(info.value)
        assert "eventlane migrate" in str(info.value)
        with pytest.raises(ProjectionError):
            Worker(v2, "balances")
        assert v2.status("balances")["pending_migrations"] == ["m002_balances_owner"]
        applied = migrate_all(v2)
        assert applied["balances"] == ["bankapp.balances:m002_balances_owner"]
        assert migrate_all(v2)["balances"] == []
        readmodel = open_readmodel(v2, "balances")
        columns = _columns(readmodel, "balances")
        assert "owner" in columns
        readmodel.close()


@BOTH
def test_new_read_model_created_at_latest_schema(data: Path) -> None:
    with bankapp.app_v2.open(data) as v2:
        readmodel = open_readmodel(v2, "balances")
        columns = _columns(readmodel, "balances")
        readmodel.close()
    assert "owner" in columns


def test_policy_issues_once_per_triggering_event(runtime: Runtime, data: Path) -> None:
    orders = []
    for i in range(8):
        order = bankapp.Order(f"order-{i}")
        order.place(10 + i)
        orders += runtime.save(order)
    records = all_records(runtime, "orders")
    applier, readmodel = applier_for(runtime, "invoicing")
    applier.apply(records, generation=0)
    readmodel.close()
    # The read model is lost (positions too): every event is redelivered and handled again,
    # and still no second invoice is issued (the causation id is found in each stream).
    readmodel_path(data, "invoicing").unlink()
    applier, readmodel = applier_for(runtime, "invoicing")
    applier.apply(records, generation=0)
    readmodel.close()
    for i in range(8):
        stream = runtime.store.read("invoices", f"invoice-order-{i}")
        assert [type(e.event) for e in stream] == [bankapp.InvoiceIssued]
        trigger = next(r for r in records if r.key == f"order-{i}".encode())
        event_id = dict(trigger.headers)["event-id"].decode()  # type: ignore[union-attr]
        assert stream[0].causation_id == event_id
    # In a rebuild nothing is issued at all.
    replay = BatchApplier(
        bankapp.Invoicing(),
        runtime.codec,
        ReadModel(data / "rebuild.sqlite"),
        replaying=True,
        app=None,
    )
    replay.projector.setup(replay.readmodel.db)
    assert replay.apply(records, generation=0).applied == 8
    replay.readmodel.close()


def test_issue_without_app_fails_loudly(runtime: Runtime, data: Path) -> None:
    order = bankapp.Order("order-x")
    order.place(5)
    runtime.save(order)
    readmodel = ReadModel(readmodel_path(data, "invoicing"))
    projector = bankapp.Invoicing()
    projector.setup(readmodel.db)
    applier = BatchApplier(projector, runtime.codec, readmodel, app=None)
    applier.apply(all_records(runtime, "orders"), generation=0)
    (letter,) = list_dead_letters(readmodel)
    assert "ctx.issue() needs the application" in letter.error
    readmodel.close()


@BOTH
def test_read_your_writes(runtime: Runtime, data: Path) -> None:
    worker = Worker(runtime, "balances", session_timeout_ms=3000, poll_timeout=0.1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        for i in range(20):
            account = bankapp.Account(f"ryw-{i % 3}")
            try:
                account = runtime.load(bankapp.Account, f"ryw-{i % 3}")
            except LookupError:
                pass
            account.deposit(1)
            written = runtime.save(account)
            assert runtime.wait_for("balances", written, timeout=10)
            assert read_balances(data)[f"ryw-{i % 3}"][0] == account.balance
        far = {TopicPartition("accounts", 0): 10**9}  # past the high-water mark: never
        with pytest.raises(InvalidPositionError, match="beyond its high-water mark"):
            runtime.wait_for("balances", far, timeout=0.2)
    finally:
        worker.stopping.set()
        thread.join()


def test_envelope_correlation_flows_to_issued_commands(runtime: Runtime) -> None:
    trigger = Envelope(bankapp.OrderPlaced(3), "order-c", 1, correlation_id="corr-1")
    written = runtime.issue(
        bankapp.Invoice,
        "invoice-order-c",
        lambda inv: inv.issue("order-c", 3),
        caused_by=trigger,
    )
    assert len(written) == 1
    # Even a command that is not idempotent itself is not issued twice for one event.
    again = runtime.issue(
        bankapp.Invoice,
        "invoice-order-c",
        lambda inv: inv.record_that(bankapp.InvoiceIssued("order-c", 3)),
        caused_by=trigger,
    )
    assert again == []
    (env,) = runtime.store.read("invoices", "invoice-order-c")
    assert (env.correlation_id, env.causation_id) == ("corr-1", str(trigger.event_id))


def test_concurrent_deliveries_issue_once(runtime: Runtime) -> None:
    """A zombie and the new owner handling the same event at once: one command wins, the
    other conflicts, reloads, finds the causation id and does nothing."""
    trigger = Envelope(bankapp.OrderPlaced(3), "order-z", 1)
    barrier = threading.Barrier(4)
    results: list[int] = []

    def deliver() -> None:
        barrier.wait()
        written = runtime.issue(
            bankapp.Invoice,
            "invoice-order-z",
            lambda inv: inv.record_that(bankapp.InvoiceIssued("order-z", 3)),
            caused_by=trigger,
        )
        results.append(len(written))

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 0, 0, 1]
    assert len(runtime.store.read("invoices", "invoice-order-z")) == 1


@BOTH
def test_a_database_error_in_a_run_dead_letters_its_own_event(runtime: Runtime, data: Path) -> None:
    """A statement the database refuses (here the marker of a re-appended event: ``UNIQUE
    (event_id)``) fails its own event only: it is dead-lettered, every other event applied
    (on PostgreSQL the failed statement aborts the transaction until the savepoint's
    rollback; this is what a pipelined run would have to keep: see docs/projections.md,
    section 13, on pipeline mode)."""
    Producer(runtime).deposits(80, accounts=10)
    records = all_records(runtime)
    p = records[5].partition
    same = [r for r in records if r.partition == p]
    dup = same[len(same) // 2]
    runtime.log.append("accounts", p, [(dup.key, dup.value, tuple(dup.headers), None)])
    records = all_records(runtime)
    applier, readmodel = applier_for(runtime, "balances")
    try:
        result = applier.apply(records)
        letters = list_dead_letters(readmodel)
    finally:
        readmodel.close()
    hwm = runtime.log.offsets("accounts", p).hwm
    assert result.dead_lettered == 1
    assert [(d.topic, d.partition, d.offset) for d in letters] == [("accounts", p, hwm - 1)]
    assert "event_id" in letters[0].error or "UNIQUE" in letters[0].error.upper()
    fold = fold_accounts(data)
    assert set(read_markers(data)) == fold.events - {("accounts", p, hwm - 1)}
