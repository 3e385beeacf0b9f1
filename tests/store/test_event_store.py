"""Saving and loading aggregates: versions, history, not-found, conflicts in one process,
envelopes, and clear errors (with coordinates) for bad records read through the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from store_domain import (
    Account,
    AccountClosed,
    Counter,
    InsufficientFunds,
    Opened,
    Withdrawn,
    make_app,
    raw_records,
    raw_streams,
)

from eventlane.app import Runtime
from eventlane.codec import Envelope
from eventlane.errors import (
    AggregateNotFoundError,
    ConcurrencyError,
    SerializationError,
    UnknownEventTypeError,
)


@pytest.fixture
def app(tmp_path: Path) -> Any:
    with make_app(tmp_path / "data") as application:
        yield application


def opened_account(app: Runtime, aggregate_id: str = "acc-1") -> Account:
    account = Account(aggregate_id)
    account.open("ada")
    account.deposit(100)
    account.withdraw(30)
    app.save(account)
    return account


def test_save_then_load_rebuilds_state_and_version(app: Runtime) -> None:
    account = opened_account(app)
    assert (account.version, account.committed_version, account.pending_events) == (3, 3, ())
    loaded = app.load(Account, "acc-1")
    assert (loaded.owner, loaded.balance, loaded.version) == ("ada", 70, 3)
    loaded.deposit(5)
    app.save(loaded)
    assert app.load(Account, "acc-1").balance == 75
    assert app.store.current_version("accounts", "acc-1") == 4


def test_load_at_a_version_gives_the_state_then(app: Runtime) -> None:
    opened_account(app)
    balances = {1: 0, 2: 100, 3: 70}
    for version, balance in balances.items():
        account = app.load(Account, "acc-1", version=version)
        assert (account.version, account.balance) == (version, balance)
    with pytest.raises(AggregateNotFoundError, match="has 3 events, not 4"):
        app.load(Account, "acc-1", version=4)
    with pytest.raises(AggregateNotFoundError):
        app.load(Account, "acc-1", version=0)


def test_missing_aggregate_is_not_found(app: Runtime) -> None:
    opened_account(app)
    with pytest.raises(AggregateNotFoundError) as info:
        app.load(Account, "nobody")
    assert info.value.topic == "accounts"
    assert isinstance(info.value, LookupError)
    with pytest.raises(AggregateNotFoundError):
        app.execute(Account, "nobody", lambda a: a.deposit(1))


def test_each_save_is_one_batch_and_histories_stay_in_one_partition(app: Runtime) -> None:
    for i in range(20):
        opened_account(app, f"acc-{i}")
    streams = raw_streams(app.log, "accounts")
    assert sorted(streams) == sorted(f"acc-{i}" for i in range(20))
    for aggregate_id, stream in streams.items():
        assert [doc["aggregate_version"] for doc in stream] == [1, 2, 3]
        assert {doc["_partition"] for doc in stream} == {
            app.store.partition_of("accounts", aggregate_id)
        }
        offsets = [doc["_offset"] for doc in stream]
        assert offsets == list(range(offsets[0], offsets[0] + 3))  # one batch, adjacent
    assert len({doc["_partition"] for s in streams.values() for doc in s}) == 2


def test_stale_save_raises_concurrency_error_and_writes_nothing(app: Runtime) -> None:
    opened_account(app)
    first = app.load(Account, "acc-1")
    second = app.load(Account, "acc-1")
    first.deposit(1)
    app.save(first)
    second.withdraw(10)
    second.withdraw(10)
    before = app.log.offsets("accounts", app.store.partition_of("accounts", "acc-1"))
    with pytest.raises(ConcurrencyError) as info:
        app.save(second)
    assert (info.value.expected, info.value.actual) == (3, 4)
    assert info.value.partition == app.store.partition_of("accounts", "acc-1")
    assert "expected version 3, actual 4" in str(info.value)
    after = app.log.offsets("accounts", app.store.partition_of("accounts", "acc-1"))
    assert after == before
    assert second.pending_events == (Withdrawn(10), Withdrawn(10))  # kept for the caller
    # Creating an aggregate that exists is a conflict too (expected version 0).
    twin = Account("acc-1")
    twin.open("bob")
    with pytest.raises(ConcurrencyError) as info:
        app.save(twin)
    assert (info.value.expected, info.value.actual) == (0, 4)


def test_execute_retries_a_command_after_a_conflict(app: Runtime) -> None:
    opened_account(app)
    calls: list[int] = []

    def deposit_with_interference(account: Account) -> None:
        calls.append(account.version)
        if len(calls) == 1:  # someone else saves between our load and our save
            other = app.load(Account, "acc-1")
            other.deposit(1)
            app.save(other)
        account.deposit(10)

    result = app.execute(Account, "acc-1", deposit_with_interference)
    assert calls == [3, 4]
    assert (result.version, result.balance) == (5, 81)
    assert app.load(Account, "acc-1").balance == 81
    with pytest.raises(InsufficientFunds):  # a rejected command is not retried
        app.execute(Account, "acc-1", lambda a: a.withdraw(1000))
    created = app.execute(Account, "acc-new", lambda a: a.open("cy"), create=True)
    assert created.version == 1


def test_execute_gives_up_after_its_attempts(app: Runtime) -> None:
    opened_account(app)

    def always_interfered(account: Account) -> None:
        other = app.load(Account, "acc-1")
        other.deposit(1)
        app.save(other)
        account.deposit(10)

    with pytest.raises(ConcurrencyError):
        app.execute(Account, "acc-1", always_interfered, attempts=3)
    assert app.load(Account, "acc-1").balance == 73


def test_envelope_carries_correlation_and_causation(app: Runtime) -> None:
    account = Account("acc-1")
    account.open("ada")
    written = app.save(account, correlation_id="corr-1", causation_id="cause-1")
    assert [(m.topic, m.offset) for m in written] == [("accounts", 0)]
    (envelope,) = app.store.read("accounts", "acc-1")
    assert envelope.event == Opened("ada")
    assert (envelope.aggregate_id, envelope.aggregate_version) == ("acc-1", 1)
    assert (envelope.correlation_id, envelope.causation_id) == ("corr-1", "cause-1")
    assert envelope.type_name == "AccountOpened"


def test_append_refuses_envelopes_that_do_not_continue_the_stream(app: Runtime) -> None:
    with pytest.raises(SerializationError, match="does not continue"):
        app.store.append("accounts", "acc-1", 0, [Envelope(Opened("x"), "acc-1", 2)])
    with pytest.raises(SerializationError, match="does not continue"):
        app.store.append("accounts", "acc-1", 0, [Envelope(Opened("x"), "acc-2", 1)])
    assert app.store.append("accounts", "acc-1", 0, []) == []


def test_domain_invariants_hold_before_anything_is_saved(app: Runtime) -> None:
    account = Account("acc-1")
    with pytest.raises(AccountClosed):
        account.deposit(5)
    assert account.pending_events == ()
    assert app.save(account) == []
    with pytest.raises(AggregateNotFoundError):
        app.load(Account, "acc-1")


def test_reopened_application_sees_everything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with make_app(data) as app:
        opened_account(app)
        counter = Counter("c")
        for _ in range(250):
            counter.increment()
        app.save(counter)
    with make_app(data) as app:
        assert app.load(Account, "acc-1").balance == 70
        assert app.load(Counter, "c").value == 250
        assert app.load(Counter, "c", version=17).value == 17


# ---------------------------------------------------------------------------- bad records
def append_raw(
    app: Runtime, aggregate_id: str, value: bytes, headers: tuple[tuple[str, bytes], ...] = ()
) -> tuple[int, int]:
    """Append a record for ``aggregate_id`` bypassing the store (as a buggy or foreign
    writer would); return its partition and offset."""
    partition = app.store.partition_of("accounts", aggregate_id)
    result = app.log.append("accounts", partition, [(aggregate_id.encode(), value, headers, None)])
    return partition, result.base_offset


def next_event(app: Runtime, aggregate_id: str, **changes: Any) -> bytes:
    """The JSON of a valid next event of the stream, with ``changes`` applied."""
    version = app.store.current_version("accounts", aggregate_id)
    doc: dict[str, Any] = {
        "type": "Deposited",
        "version": 1,
        "aggregate_id": aggregate_id,
        "aggregate_version": version + 1,
        "event_id": "6f1c1d1e-0000-4000-8000-000000000001",
        "timestamp": "2024-05-01T12:00:00+00:00",
        "correlation_id": None,
        "causation_id": None,
        "data": {"amount": 5},
    }
    doc.update(changes)
    return orjson.dumps(doc)


def test_a_valid_foreign_record_is_read_like_the_store_own(app: Runtime) -> None:
    opened_account(app)
    append_raw(app, "acc-1", next_event(app, "acc-1"))
    assert app.load(Account, "acc-1").balance == 75


@pytest.mark.parametrize(
    ("kind", "error", "words"),
    [
        ("unknown type", UnknownEventTypeError, "unknown event type 'AccountFrozen'"),
        ("malformed JSON", SerializationError, "not valid JSON"),
        ("wrong field type", SerializationError, "expected an integer, got str @ data.amount"),
        ("missing field", SerializationError, "required field missing @ data.amount"),
        ("bad envelope", SerializationError, "aggregate_version must be an integer"),
    ],
)
def test_bad_records_fail_loudly_with_coordinates(
    app: Runtime, kind: str, error: type[Exception], words: str
) -> None:
    opened_account(app)
    value = {  # the record after version 3
        "unknown type": next_event(app, "acc-1", type="AccountFrozen"),
        "malformed JSON": b'{"type": "Deposited", "version": 1, "aggregate_id": "acc-1", ',
        "wrong field type": next_event(app, "acc-1", data={"amount": "5"}),
        "missing field": next_event(app, "acc-1", data={}),
        "bad envelope": next_event(app, "acc-1", aggregate_version="4"),
    }[kind]
    partition, offset = append_raw(app, "acc-1", value)
    with pytest.raises(error) as info:
        app.load(Account, "acc-1")
    assert words in str(info.value)
    assert (info.value.topic, info.value.partition, info.value.offset) == (  # type: ignore[attr-defined]
        "accounts",
        partition,
        offset,
    )
    assert f"topic=accounts, partition={partition}, offset={offset}" in str(info.value)
    # Loading the history before the bad record still works; nothing stored was lost.
    assert app.load(Account, "acc-1", version=3).balance == 70
    stored = [r for r in raw_records(app.log, "accounts", partition) if r.key == b"acc-1"]
    assert len(stored) == 4


def test_a_record_with_a_wrong_version_fails_loudly(app: Runtime) -> None:
    """A foreign record claiming version 9 right after version 3: the stream is broken and
    the store says where, instead of returning a history with a hole."""
    opened_account(app)
    partition, offset = append_raw(app, "acc-1", next_event(app, "acc-1", aggregate_version=9))
    with pytest.raises(SerializationError, match="expected version 4, found version 9") as info:
        app.load(Account, "acc-1")
    assert (info.value.partition, info.value.offset) == (partition, offset)
    # A save on top of it is refused too: the stream's last record disagrees with its count.
    account = app.load(Account, "acc-1", version=3)
    account.deposit(1)
    with pytest.raises(SerializationError, match="inconsistent"):
        app.save(account)
