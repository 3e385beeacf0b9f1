"""The invoicing-shaped application of ``bench_rebuild.py``, and a fast history generator.

Importable by Spark's Python workers as ``rebuild_app:app`` (the benchmark directory is on
the driver's ``sys.path``; the local-mode session passes it on to the workers).

History: invoices (aggregate id ``inv-N``) on ``invoices`` (``--partitions`` partitions),
each ``InvoiceCreated`` (customer, currency), then a few ``LineAdded`` (sku, qty, price), then
``InvoicePaid`` for most. Customers are shared by invoices of every partition, so the
``customers`` table is written from several partitions and merges by ``sum``/``max``.

Read model ``invoices``:

* ``invoices(id PK, customer, currency, lines, total, paid, status, updated)`` per invoice;
* ``customers(customer PK, invoices, billed, paid, last_ms)``: merge rule
  ``invoices=sum, billed=sum, paid=sum, last_ms=max``.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from attrs import frozen
from sqlite_utils import Database

from framework.codec import Envelope
from framework.domain import DomainEvent, event
from framework.log import Log, ProducerRecord, Producer
from framework.projection import App, EventContext, Projector, handles

TOPIC = "invoices"


@event("InvoiceCreated")
@frozen
class InvoiceCreated(DomainEvent):
    customer: str
    currency: str


@event("LineAdded")
@frozen
class LineAdded(DomainEvent):
    sku: str
    qty: int
    price: int


@event("InvoicePaid")
@frozen
class InvoicePaid(DomainEvent):
    amount: int


class Invoices(Projector):
    name = "invoices"
    topics = (TOPIC,)
    merge_rules: ClassVar = {"customers": "invoices=sum, billed=sum, paid=sum, last_ms=max"}

    def setup(self, db: Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS invoices (id TEXT PRIMARY KEY, customer TEXT,"
            " currency TEXT, lines INT, total INT, paid INT, status TEXT, updated INT)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS customers (customer TEXT PRIMARY KEY, invoices INT,"
            " billed INT, paid INT, last_ms INT)"
        )

    @handles(InvoiceCreated)
    def created(self, e: InvoiceCreated, ctx: EventContext) -> None:
        ms = int(ctx.envelope.timestamp.timestamp() * 1000)
        ctx.db.execute(
            "INSERT INTO invoices VALUES (?, ?, ?, 0, 0, 0, 'open', ?)",
            (ctx.aggregate_id, e.customer, e.currency, ms),
        )
        ctx.db.execute(
            "INSERT INTO customers VALUES (?, 1, 0, 0, ?) ON CONFLICT(customer) DO UPDATE"
            " SET invoices = invoices + 1, last_ms = max(last_ms, excluded.last_ms)",
            (e.customer, ms),
        )

    @handles(LineAdded)
    def line(self, e: LineAdded, ctx: EventContext) -> None:
        amount = e.qty * e.price
        ctx.db.execute(
            "UPDATE invoices SET lines = lines + 1, total = total + ? WHERE id = ?",
            (amount, ctx.aggregate_id),
        )
        ctx.db.execute(
            "UPDATE customers SET billed = billed + ? WHERE customer ="
            " (SELECT customer FROM invoices WHERE id = ?)",
            (amount, ctx.aggregate_id),
        )

    @handles(InvoicePaid)
    def paid(self, e: InvoicePaid, ctx: EventContext) -> None:
        ctx.db.execute(
            "UPDATE invoices SET paid = paid + ?, status = 'paid' WHERE id = ?",
            (e.amount, ctx.aggregate_id),
        )
        ctx.db.execute(
            "UPDATE customers SET paid = paid + ? WHERE customer ="
            " (SELECT customer FROM invoices WHERE id = ?)",
            (e.amount, ctx.aggregate_id),
        )


app = App("invoicing", events=[InvoiceCreated, LineAdded, InvoicePaid], projectors=[Invoices])


def generate(log: Log, events: int, *, partitions: int = 8, seed: int = 7) -> int:
    """Append about ``events`` invoice events to ``log`` (topic ``invoices``); return how
    many were appended. Deterministic for a seed (ids and timestamps included)."""
    from framework.codec import EventCodec, EventRegistry

    rnd = random.Random(seed)
    registry = EventRegistry()
    registry.register(InvoiceCreated, LineAdded, InvoicePaid)
    codec = EventCodec(registry)
    log.create_topic(TOPIC, partitions, {"retention_ms": -1}, exist_ok=True)
    producer = Producer(log)
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    customers = [f"cust-{i}" for i in range(max(10, events // 200))]
    written = 0
    n = 0
    chunk: list[ProducerRecord] = []
    while written < events:
        n += 1
        agg = f"inv-{n}"
        stream: list[DomainEvent] = [InvoiceCreated(rnd.choice(customers), "EUR")]
        total = 0
        for _ in range(rnd.randint(1, 6)):
            qty, price = rnd.randint(1, 5), rnd.randint(100, 9_999)
            total += qty * price
            stream.append(LineAdded(f"sku-{rnd.randint(1, 500)}", qty, price))
        if rnd.random() < 0.8:
            stream.append(InvoicePaid(total))
        for version, ev in enumerate(stream, 1):
            env = Envelope(
                ev,
                agg,
                version,
                event_id=uuid.UUID(int=rnd.getrandbits(128)),
                timestamp=t0 + timedelta(milliseconds=n * 10 + version),
            )
            key, value, headers = codec.encode(env)
            chunk.append(ProducerRecord(key, value, tuple(headers)))
        written += len(stream)
        if len(chunk) >= 20_000:
            producer.send_batch(TOPIC, chunk)
            chunk = []
    if chunk:
        producer.send_batch(TOPIC, chunk)
    return written
