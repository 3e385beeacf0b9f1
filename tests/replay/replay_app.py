"""The application of the replay tests, and a generator of awkward histories for it.

Importable by Spark's Python workers and worker processes as
``tests.replay.replay_app:app`` (the repository root is on ``PYTHONPATH``).

Topics (created by :func:`generate`):

* ``orders`` (4 partitions): ``OrderPlaced`` (schema version 2; some records are stored at
  version 1 and upcast on read), ``OrderShipped``, and ``Noise`` (no projector handles it).
  Retention is applied after the first part of the history: the low-water marks move.
* ``payments`` (3 partitions): ``PaymentReceived``; a negative amount is a poison event
  (the handler raises: dead-lettered, in every engine alike).
* ``customers`` (2 partitions, compacted): ``CustomerRenamed``, many per customer; after
  compaction only the last ones are left (offset gaps).

Projectors:

* ``sales``: ``orders``, ``customer_stats`` (written from every topic and partition: merge
  rule per column), ``daily`` (``sum``), ``totals`` (one row seeded by ``setup`` with 100,
  ``sum``), and the marker table ``applied`` (``PRIMARY KEY (topic, partition, offset)``,
  ``UNIQUE (event_id)``: an event applied twice would raise).
* ``flaky_sales``: ``sales`` whose handlers fail the first attempt of some Spark tasks
  (a raised ``BaseException`` on ``orders/0``, a killed Python worker on ``payments/1``).
* ``order_status``: per-order state only (``state_per_key = True``).
* ``norule``: a per-customer counter without a merge rule (a parallel rebuild must refuse).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import orjson
from attrs import frozen
from sqlite_utils import Database

from eventlane.app import App
from eventlane.codec import EventCodec, EventRegistry
from eventlane.codec.envelope import Envelope
from eventlane.domain import DomainEvent, event
from eventlane.log import Log, LogStore, TopicPartition
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import EventContext, Projector, handles


@event("OrderPlaced", version=2)
@frozen
class OrderPlaced(DomainEvent):
    customer: str
    amount: int
    currency: str


@event("OrderShipped")
@frozen
class OrderShipped(DomainEvent):
    carrier: str


@event("PaymentReceived")
@frozen
class PaymentReceived(DomainEvent):
    order_id: str
    customer: str
    amount: int


@event("CustomerRenamed")
@frozen
class CustomerRenamed(DomainEvent):
    name: str


@event("Noise")
@frozen
class Noise(DomainEvent):
    n: int


registry = EventRegistry()


@registry.upcaster("OrderPlaced", 1)
def _order_placed_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had ``total`` and no currency."""
    return {"customer": data["customer"], "amount": data["total"], "currency": "EUR"}


class InjectedFailureError(BaseException):
    """Not an Exception: the applier does not catch it, so the Spark task fails."""


def _day(ctx: EventContext) -> str:
    return ctx.envelope.timestamp.date().isoformat()


def _ms(ctx: EventContext) -> int:
    return int(ctx.envelope.timestamp.timestamp() * 1000)


class Sales(Projector):
    name = "sales"
    topics = ("orders", "payments", "customers")
    merge_rules: ClassVar[dict[str, str]] = {
        "customer_stats": "orders=sum, spent=sum, paid=sum, name=first-non-null, last_ms=max",
        "daily": "sum",
        "totals": "sum",
    }

    def setup(self, db: Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT, amount INT,"
            " currency TEXT, status TEXT, placed_ms INT)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS customer_stats (customer TEXT PRIMARY KEY, orders INT,"
            " spent INT, paid INT, name TEXT, last_ms INT)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS daily (day TEXT PRIMARY KEY, orders INT, amount INT)"
        )
        db.execute("CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY, events INT)")
        db.execute("INSERT OR IGNORE INTO totals VALUES (1, 100)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS applied (topic TEXT NOT NULL, partition INT NOT NULL,"
            " offset INT NOT NULL, event_id TEXT NOT NULL UNIQUE,"
            " PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID"
        )

    def fault(self, ctx: EventContext) -> None:
        """Fault injection point (a no-op here)."""

    def _mark(self, ctx: EventContext) -> None:
        self.fault(ctx)
        ctx.conn.execute(
            "INSERT INTO applied VALUES (?, ?, ?, ?)",
            (ctx.topic, ctx.partition, ctx.offset, ctx.event_id),
        )
        ctx.conn.execute("UPDATE totals SET events = events + 1 WHERE id = 1")

    @handles(OrderPlaced)
    def placed(self, e: OrderPlaced, ctx: EventContext) -> None:
        self._mark(ctx)
        ms = _ms(ctx)
        ctx.conn.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?, 'placed', ?)",
            (ctx.aggregate_id, e.customer, e.amount, e.currency, ms),
        )
        ctx.conn.execute(
            "INSERT INTO customer_stats VALUES (?, 1, ?, 0, NULL, ?) ON CONFLICT(customer) DO"
            " UPDATE SET orders = orders + 1, spent = spent + excluded.spent,"
            " last_ms = max(coalesce(last_ms, 0), excluded.last_ms)",
            (e.customer, e.amount, ms),
        )
        ctx.conn.execute(
            "INSERT INTO daily VALUES (?, 1, ?) ON CONFLICT(day) DO UPDATE SET"
            " orders = orders + 1, amount = amount + excluded.amount",
            (_day(ctx), e.amount),
        )

    @handles(OrderShipped)
    def shipped(self, e: OrderShipped, ctx: EventContext) -> None:
        self._mark(ctx)
        ctx.conn.execute(
            "UPDATE orders SET status = 'shipped by ' || ? WHERE id = ?",
            (e.carrier, ctx.aggregate_id),
        )

    @handles(PaymentReceived)
    def paid(self, e: PaymentReceived, ctx: EventContext) -> None:
        self._mark(ctx)
        if e.amount < 0:
            raise ValueError(f"negative payment {e.amount} for {e.order_id}")
        ctx.conn.execute(
            "INSERT INTO customer_stats VALUES (?, 0, 0, ?, NULL, NULL) ON CONFLICT(customer)"
            " DO UPDATE SET paid = paid + excluded.paid",
            (e.customer, e.amount),
        )

    @handles(CustomerRenamed)
    def renamed(self, e: CustomerRenamed, ctx: EventContext) -> None:
        self._mark(ctx)
        ctx.conn.execute(
            "INSERT INTO customer_stats VALUES (?, 0, 0, 0, ?, NULL) ON CONFLICT(customer)"
            " DO UPDATE SET name = excluded.name",
            (ctx.aggregate_id, e.name),
        )


FAULT_AFTER = 40
"""``flaky_sales`` fails the first attempt of a task this many offsets into its range."""


class FlakySales(Sales):
    name = "flaky_sales"

    def __init__(self) -> None:
        self.first: dict[tuple[str, int], int] = {}

    def fault(self, ctx: EventContext) -> None:
        from pyspark import TaskContext  # noqa: PLC0415 - only Spark tasks get here

        task = TaskContext.get()
        if task is None or task.attemptNumber() > 0:
            return
        first = self.first.setdefault((ctx.topic, ctx.partition), ctx.offset)
        if (ctx.topic, ctx.partition) == ("orders", 0) and ctx.offset - first >= FAULT_AFTER:
            raise InjectedFailureError(f"injected failure at orders/0 offset {ctx.offset}")
        if (ctx.topic, ctx.partition) == ("payments", 1) and ctx.offset - first >= FAULT_AFTER:
            os._exit(17)  # the Python worker dies mid-task


class CrashingSales(Sales):
    """``sales`` whose Python worker dies on ``payments/1`` in every attempt of a Spark task:
    the job fails after its retries."""

    name = "crashing_sales"

    def __init__(self) -> None:
        self.first: dict[tuple[str, int], int] = {}

    def fault(self, ctx: EventContext) -> None:
        from pyspark import TaskContext  # noqa: PLC0415 - only Spark tasks get here

        if TaskContext.get() is None:
            return
        first = self.first.setdefault((ctx.topic, ctx.partition), ctx.offset)
        if (ctx.topic, ctx.partition) == ("payments", 1) and ctx.offset - first >= FAULT_AFTER:
            os._exit(17)  # the Python worker dies mid-task, every time


SLOW_S = 0.005
"""``slow_sales`` sleeps this long an event in a Spark task."""


class SlowSales(Sales):
    """``sales``, but each event of a Spark task takes :data:`SLOW_S` longer: a job that
    runs long enough for a test to lose the cluster's worker under it."""

    name = "slow_sales"

    def fault(self, ctx: EventContext) -> None:
        from pyspark import TaskContext  # noqa: PLC0415 - only Spark tasks get here

        if TaskContext.get() is not None:
            time.sleep(SLOW_S)


class OrderStatus(Projector):
    name = "order_status"
    topics = ("orders",)
    state_per_key: ClassVar[bool] = True

    def setup(self, db: Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS order_status (id TEXT PRIMARY KEY, status TEXT,"
            " version INT, amount INT)"
        )

    @handles(OrderPlaced)
    def placed(self, e: OrderPlaced, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT INTO order_status VALUES (?, 'placed', ?, ?)",
            (ctx.aggregate_id, ctx.aggregate_version, e.amount),
        )

    @handles(OrderShipped)
    def shipped(self, e: OrderShipped, ctx: EventContext) -> None:
        ctx.conn.execute(
            "UPDATE order_status SET status = 'shipped', version = ? WHERE id = ?",
            (ctx.aggregate_version, ctx.aggregate_id),
        )


class NoRule(Projector):
    name = "norule"
    topics = ("orders",)

    def setup(self, db: Database) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS per_customer (customer TEXT PRIMARY KEY, n INT)")

    @handles(OrderPlaced)
    def placed(self, e: OrderPlaced, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT INTO per_customer VALUES (?, 1) ON CONFLICT(customer) DO UPDATE SET n = n + 1",
            (e.customer,),
        )


app = App(
    "replaytest",
    events=[OrderPlaced, OrderShipped, PaymentReceived, CustomerRenamed, Noise],
    projectors=[Sales, FlakySales, CrashingSales, SlowSales, OrderStatus, NoRule],
    registry=registry,
    partitions={"orders": 4, "payments": 3, "customers": 2},
)


# ---------------------------------------------------------------------------- history
T0 = datetime(2020, 3, 1, tzinfo=UTC)


class History:
    """Appends deterministic events to a log, the way an event store would lay them out."""

    def __init__(self, log: Log, seed: int = 5) -> None:
        self.log = log
        self.rnd = random.Random(seed)
        reg = EventRegistry()
        reg.register(OrderPlaced, OrderShipped, PaymentReceived, CustomerRenamed, Noise)
        self.codec = EventCodec(reg)
        self.versions: dict[str, int] = {}
        self.orders = 0
        self.clock = T0
        self.customers = [f"cust-{i:03d}" for i in range(40)]

    def create_topics(self) -> None:
        small = {"segment_bytes": 8192, "retention_ms": -1}
        self.log.create_topic("orders", 4, small, exist_ok=True)
        self.log.create_topic("payments", 3, small, exist_ok=True)
        self.log.create_topic(
            "customers",
            2,
            {**small, "cleanup_policy": "compact", "min_compaction_lag_ms": 0},
            exist_ok=True,
        )

    def _record(
        self, event: DomainEvent, agg: str, *, v1: bool = False
    ) -> tuple[bytes, bytes, tuple[tuple[str, bytes], ...], int]:
        version = self.versions.get(agg, 0) + 1
        self.versions[agg] = version
        self.clock += timedelta(minutes=self.rnd.randint(1, 90))
        env = Envelope(
            event,
            agg,
            version,
            event_id=uuid.UUID(int=self.rnd.getrandbits(128)),
            timestamp=self.clock,
        )
        key, value, headers = self.codec.encode(env)
        if v1:  # the record as version 1 of OrderPlaced was written
            doc = orjson.loads(value)
            assert isinstance(event, OrderPlaced)
            doc["version"] = 1
            doc["data"] = {"customer": event.customer, "total": event.amount}
            value = orjson.dumps(doc)
            headers = [(n, b"1" if n == "event-version" else v) for n, v in headers]
        return key, value, tuple(headers), int(self.clock.timestamp() * 1000)

    def _append(self, topic: str, records: list[Any]) -> None:
        parts = self.log.partition_count(topic)
        by_part: dict[int, list[Any]] = {}
        for rec in records:
            by_part.setdefault(partition_for_key(rec[0], parts), []).append(rec)
        for p, recs in sorted(by_part.items()):
            for i in range(0, len(recs), 500):
                self.log.append(topic, p, recs[i : i + 500])

    def add(self, orders: int, *, v1_share: float = 0.0, poison_every: int = 0) -> int:
        """Append ``orders`` orders with their shipments, payments, renames and noise."""
        order_recs, pay_recs, cust_recs = [], [], []
        n = 0
        for _ in range(orders):
            self.orders += 1
            oid = f"order-{self.orders:06d}"
            cust = self.rnd.choice(self.customers)
            amount = self.rnd.randint(1, 500)
            v1 = self.rnd.random() < v1_share
            order_recs.append(self._record(OrderPlaced(cust, amount, "EUR"), oid, v1=v1))
            if self.rnd.random() < 0.6:
                order_recs.append(self._record(OrderShipped(self.rnd.choice("ab")), oid))
            if self.rnd.random() < 0.1:
                order_recs.append(self._record(Noise(self.orders), oid))
            if self.rnd.random() < 0.7:
                pay = amount
                if poison_every and self.orders % poison_every == 0:
                    pay = -1
                pay_recs.append(self._record(PaymentReceived(oid, cust, pay), f"pay-{oid}"))
            if self.rnd.random() < 0.3:
                who = self.rnd.choice(self.customers)
                cust_recs.append(self._record(CustomerRenamed(f"{who} #{self.orders}"), who))
        self._append("orders", order_recs)
        self._append("payments", pay_recs)
        self._append("customers", cust_recs)
        n += len(order_recs) + len(pay_recs) + len(cust_recs)
        return n


def generate(log: Log, *, orders: int = 1500, seed: int = 5) -> dict[str, Any]:
    """An awkward history: v1 records, poison payments, retention that moved the LWM of
    ``orders``, a compacted ``customers`` topic. Returns facts the tests check."""
    history = History(log, seed)
    history.create_topics()
    old = history.add(orders // 3, v1_share=0.5, poison_every=97)
    # the oldest orders expire: everything written so far is years old by now
    log.alter_topic("orders", config={"retention_ms": 365 * 86_400_000})
    log.cleanup("orders")
    log.alter_topic("orders", config={"retention_ms": -1})
    history.clock = datetime.now(UTC) - timedelta(days=30)
    new = history.add(orders - orders // 3, v1_share=0.2, poison_every=97)
    log.compact("customers")
    lwms = {
        TopicPartition(t, p): log.offsets(t, p).lwm
        for t in ("orders", "payments", "customers")
        for p in range(log.partition_count(t))
    }
    return {"appended": old + new, "lwms": lwms}


def produce_main(data: str, stop_file: str, first_order: int) -> None:
    """A producer process: appends a few orders (with payments, renames) every 20 ms until
    ``stop_file`` exists; writes how many records it appended into ``stop_file + ".done"``."""
    log = LogStore(data)
    history = History(log, seed=first_order)
    history.orders = first_order
    history.clock = datetime.now(UTC)
    total = 0
    stop = Path(stop_file)
    while not stop.exists():
        total += history.add(3)
        time.sleep(0.02)
    Path(stop_file + ".done").write_text(str(total))
    log.close()


if __name__ == "__main__":
    import sys

    produce_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
