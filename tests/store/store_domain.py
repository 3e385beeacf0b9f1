"""The domain the store tests (and their child processes) use: events, aggregates, helpers.

* ``Account`` (topic ``accounts``): invariants (opened once, no overdraft, positive amounts);
* ``Counter`` (topic ``counters``): one ``Incremented`` per command, no snapshots;
* ``SnapCounter`` (topic ``snapcounters``): the same with a snapshot every 10 events;
* ``Batcher`` (topic ``batches``): ``record_save(save, size)`` records ``size`` ``Tick``
  events, each naming its save and its place in it, so a reader can tell whether a stored
  history is a whole number of saves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import orjson
from attrs import frozen

from eventlane.app import App, Runtime
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.errors import DomainError
from eventlane.log import Log, LogStore, Record


@event("AccountOpened")
@frozen
class Opened(DomainEvent):
    owner: str


@event("Deposited")
@frozen
class Deposited(DomainEvent):
    amount: int


@event("Withdrawn")
@frozen
class Withdrawn(DomainEvent):
    amount: int


@event("Incremented")
@frozen
class Incremented(DomainEvent):
    by: int
    writer: str = ""


@event("Tick")
@frozen
class Tick(DomainEvent):
    save: int
    index: int
    size: int


class InsufficientFunds(DomainError):
    """A withdrawal larger than the balance."""


class AccountClosed(DomainError):
    """A command on an account that was never opened (or is opened twice)."""


class Account(Aggregate):
    topic: ClassVar[str] = "accounts"
    owner: str
    balance: int

    def init_state(self) -> None:
        self.owner = ""
        self.balance = 0

    def open(self, owner: str) -> None:
        if self.owner:
            raise AccountClosed(f"account {self.id} is already open")
        self.record_that(Opened(owner))

    def deposit(self, amount: int) -> None:
        if not self.owner:
            raise AccountClosed(f"account {self.id} is not open")
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.record_that(Deposited(amount))

    def withdraw(self, amount: int) -> None:
        if amount > self.balance:
            raise InsufficientFunds(f"balance {self.balance} < {amount}")
        self.record_that(Withdrawn(amount))

    @applies(Opened)
    def _opened(self, e: Opened) -> None:
        self.owner = e.owner

    @applies(Deposited)
    def _deposited(self, e: Deposited) -> None:
        self.balance += e.amount

    @applies(Withdrawn)
    def _withdrawn(self, e: Withdrawn) -> None:
        self.balance -= e.amount


class Counter(Aggregate):
    topic: ClassVar[str] = "counters"
    value: int

    def init_state(self) -> None:
        self.value = 0

    def increment(self, by: int = 1, writer: str = "") -> None:
        self.record_that(Incremented(by, writer))

    @applies(Incremented)
    def _incremented(self, e: Incremented) -> None:
        self.value += e.by


class SnapCounter(Counter):
    topic: ClassVar[str] = "snapcounters"
    snapshot_every: ClassVar[int | None] = 10


class Batcher(Aggregate):
    topic: ClassVar[str] = "batches"
    saves: int
    ticks: int

    def init_state(self) -> None:
        self.saves = 0
        self.ticks = 0

    def record_save(self, save: int, size: int) -> None:
        for i in range(size):
            self.record_that(Tick(save, i, size))

    @applies(Tick)
    def _tick(self, e: Tick) -> None:
        if e.index == 0:
            self.saves += 1
        self.ticks += 1


AGGREGATES: list[type[Aggregate]] = [Account, Counter, SnapCounter, Batcher]


def make_app(data: Path | str | Log, partitions: int = 2, **options: Any) -> Runtime:
    """The application the tests use: every aggregate above, ``partitions`` per topic."""
    return App("store-tests", aggregates=AGGREGATES, partitions=partitions, **options).open(data)


def raw_records(log: Log, topic: str, partition: int) -> Iterator[Record]:
    """Every record of a partition from its low-water mark, straight from the log."""
    offset = log.offsets(topic, partition).lwm
    hwm = log.offsets(topic, partition).hwm
    cursor = None
    while offset < hwm:
        records, cursor = log.read(topic, partition, offset, cursor=cursor, upto=hwm)
        if not records:
            return
        yield from records
        offset = records[-1].offset + 1


def raw_streams(log: Log, topic: str) -> dict[str, list[dict[str, Any]]]:
    """Aggregate id → the JSON values of its records in offset order, read without the store
    (no index, no codec), with ``_offset`` and ``_partition`` added."""
    streams: dict[str, list[dict[str, Any]]] = {}
    for partition in range(log.partition_count(topic)):
        for record in raw_records(log, topic, partition):
            assert record.key is not None and record.value is not None
            doc = orjson.loads(record.value)
            doc["_offset"], doc["_partition"] = record.offset, partition
            assert doc["aggregate_id"] == record.key.decode()
            streams.setdefault(doc["aggregate_id"], []).append(doc)
    return streams


class CountingLog:
    """A real :class:`LogStore` that counts the records its ``read`` and ``read_key`` calls
    return (so a test can tell how much of a partition a load touched). Everything else is
    delegated."""

    def __init__(self, path: Path) -> None:
        self._inner = LogStore(path)
        self.path = self._inner.path
        self.reads = 0
        self.records_read = 0

    def read(self, *args: Any, **kwargs: Any) -> tuple[list[Record], Any]:
        records, cursor = self._inner.read(*args, **kwargs)
        self.reads += 1
        self.records_read += len(records)
        return records, cursor

    def read_key(self, *args: Any, **kwargs: Any) -> list[Record]:
        """Per-key reads happen inside the engine: count the records they return."""
        records: list[Record] = self._inner.read_key(*args, **kwargs)
        self.reads += 1
        self.records_read += len(records)
        return records

    def reset_counts(self) -> None:
        self.reads = self.records_read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
