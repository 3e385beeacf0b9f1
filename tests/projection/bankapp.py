"""The test application of the projection tests: accounts, orders and invoices.

Importable by worker processes as ``tests.projection.bankapp:app`` (with the repository root
on ``PYTHONPATH``; the tests set it). Behaviour switches come from the environment, so a
test can change them for the processes it starts:

* ``BANKAPP_FIXED=1``: the "code fix": poison deposits (``memo == "poison"``) apply instead
  of raising. Without it a poison deposit always raises in the handler.
* ``BANKAPP_CRASH_AFTER_ISSUE=N``: the invoicing policy kills its own process with SIGKILL
  right after issuing its N-th invoice command, before the read-model transaction commits
  (the worst moment for a policy: the command is on the log, the position is not).
* ``BANKAPP_STOP_IN_HANDLER=<path>``: the first ``balances`` handler call of the process
  writes ``<path>`` and SIGSTOPs its own process: frozen inside the read-model transaction,
  holding SQLite's write lock.
* ``BANKAPP_SELF_STOP=<path>``: :func:`zombie_main` (the frozen-worker test) writes the
  offsets of the batch in hand to ``<path>`` and SIGSTOPs itself between ``poll`` and the
  read-model transaction.

Read models (tables written by the projectors):

* ``balances``: ``balances(id PK, total, events)`` and the per-event marker table
  ``applied(topic, partition, offset, event_id)`` with ``PRIMARY KEY (topic, partition,
  offset)`` and ``UNIQUE (event_id)``: applying one event twice raises inside the handler,
  so a duplicate can never be hidden (it would surface as a dead letter).
* ``ledger`` (``park_after_dead_letter``): ``ledger(id PK, version, total)``; the handler
  requires each account's events in aggregate-version order (it raises otherwise), so a
  parked key that was released out of order would show.
Every handler writes through the portable table API (``ctx.table``) and the migrations'
DDL is portable, so the app runs on both read-model engines (``$EVENTLANE_READMODELS``).

* ``invoicing``: a policy: per ``OrderPlaced`` it issues ``Invoice.issue`` to the invoice
  ``invoice-<order id>`` through ``ctx.issue`` and records ``invoiced(order_id PK)``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import ClassVar

from attrs import frozen
from sqlite_utils import Database, Migrations

from eventlane.app import App
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.observability import configure_logging
from eventlane.projection import EventContext, Projector, Worker, handles


def fixed() -> bool:
    return os.environ.get("BANKAPP_FIXED") == "1"


# ---------------------------------------------------------------------------- events
@event("Deposited")
@frozen
class Deposited(DomainEvent):
    amount: int
    memo: str = ""


@event("Withdrawn")
@frozen
class Withdrawn(DomainEvent):
    amount: int


@event("OrderPlaced")
@frozen
class OrderPlaced(DomainEvent):
    amount: int


@event("InvoiceIssued")
@frozen
class InvoiceIssued(DomainEvent):
    order_id: str
    amount: int


# ---------------------------------------------------------------------------- aggregates
class Account(Aggregate):
    topic: ClassVar[str] = "accounts"
    balance: int

    def init_state(self) -> None:
        self.balance = 0

    def deposit(self, amount: int, memo: str = "") -> None:
        self.record_that(Deposited(amount, memo))

    def withdraw(self, amount: int) -> None:
        self.record_that(Withdrawn(amount))

    @applies(Deposited)
    def _deposited(self, e: Deposited) -> None:
        self.balance += e.amount

    @applies(Withdrawn)
    def _withdrawn(self, e: Withdrawn) -> None:
        self.balance -= e.amount


class Order(Aggregate):
    topic: ClassVar[str] = "orders"
    amount: int

    def init_state(self) -> None:
        self.amount = 0

    def place(self, amount: int) -> None:
        self.record_that(OrderPlaced(amount))

    @applies(OrderPlaced)
    def _placed(self, e: OrderPlaced) -> None:
        self.amount = e.amount


class Invoice(Aggregate):
    """One invoice per order; ``issue`` is a no-op once issued (the idempotent command)."""

    topic: ClassVar[str] = "invoices"
    order_id: str

    def init_state(self) -> None:
        self.order_id = ""

    def issue(self, order_id: str, amount: int) -> None:
        if self.order_id:
            return
        self.record_that(InvoiceIssued(order_id, amount))

    @applies(InvoiceIssued)
    def _issued(self, e: InvoiceIssued) -> None:
        self.order_id = e.order_id


# ---------------------------------------------------------------------------- projectors
_stopped_in_handler: list[bool] = []
balances_migrations = Migrations("bankapp.balances")


@balances_migrations()
def m001_tables(db: Database) -> None:
    # portable DDL: runs on SQLite and PostgreSQL (the tests run both engines)
    db.execute("CREATE TABLE balances (id TEXT PRIMARY KEY, total BIGINT NOT NULL, events INT)")
    db.execute(
        "CREATE TABLE applied (topic TEXT NOT NULL, partition INTEGER NOT NULL,"
        ' "offset" BIGINT NOT NULL, event_id TEXT NOT NULL UNIQUE,'
        ' PRIMARY KEY (topic, partition, "offset"))'
    )


class Balances(Projector):
    name = "balances"
    topics = ("accounts",)
    migrations = balances_migrations

    def _mark(self, ctx: EventContext) -> None:
        stop_flag = os.environ.get("BANKAPP_STOP_IN_HANDLER")
        if stop_flag and not _stopped_in_handler:
            _stopped_in_handler.append(True)
            Path(stop_flag).write_text(json.dumps([ctx.partition, ctx.offset]))
            os.kill(os.getpid(), signal.SIGSTOP)
        ctx.table("applied").insert(
            {
                "topic": ctx.topic,
                "partition": ctx.partition,
                "offset": ctx.offset,
                "event_id": str(ctx.envelope.event_id),
            }
        )

    def _add(self, ctx: EventContext, amount: int) -> None:
        ctx.table("balances").upsert(
            {"id": ctx.aggregate_id, "total": amount, "events": 1},
            key=("id",),
            add=("total", "events"),
        )

    @handles(Deposited)
    def deposited(self, event: Deposited, ctx: EventContext) -> None:
        self._mark(ctx)
        if event.memo == "poison" and not fixed():
            raise ValueError(f"cannot apply poison deposit of {event.amount}")
        self._add(ctx, event.amount)

    @handles(Withdrawn)
    def withdrawn(self, event: Withdrawn, ctx: EventContext) -> None:
        self._mark(ctx)
        self._add(ctx, -event.amount)


class Ledger(Projector):
    """Per-key order matters here: a poison event parks the later events of its account."""

    name = "ledger"
    topics = ("accounts",)
    park_after_dead_letter = True
    handler_attempts = 2

    def setup(self, db: Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS ledger (id TEXT PRIMARY KEY, version INT, total INT)"
        )

    def _apply(self, ctx: EventContext, amount: int) -> None:
        ledger = ctx.table("ledger")
        found = ledger.get(id=ctx.aggregate_id)
        last = 0 if found is None else found["version"]
        if ctx.aggregate_version != last + 1:
            raise AssertionError(
                f"{ctx.aggregate_id}: version {ctx.aggregate_version} after {last}: out of order"
            )
        ledger.upsert(
            {"id": ctx.aggregate_id, "version": ctx.aggregate_version, "total": amount},
            key=("id",),
            add=("total",),
        )

    @handles(Deposited)
    def deposited(self, event: Deposited, ctx: EventContext) -> None:
        if event.memo == "poison" and not fixed():
            raise ValueError(f"cannot apply poison deposit of {event.amount}")
        self._apply(ctx, event.amount)

    @handles(Withdrawn)
    def withdrawn(self, event: Withdrawn, ctx: EventContext) -> None:
        self._apply(ctx, -event.amount)


_issued_here = [0]  # invoice commands issued by this process


class Invoicing(Projector):
    """A policy (process manager): one invoice per order, whatever the redeliveries."""

    name = "invoicing"
    topics = ("orders",)

    def setup(self, db: Database) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS invoiced (order_id TEXT PRIMARY KEY, amount INT)")

    @handles(OrderPlaced)
    def placed(self, event: OrderPlaced, ctx: EventContext) -> None:
        order_id = ctx.aggregate_id
        ctx.issue(Invoice, f"invoice-{order_id}", lambda inv: inv.issue(order_id, event.amount))
        _issued_here[0] += 1
        crash_after = int(os.environ.get("BANKAPP_CRASH_AFTER_ISSUE", "0") or 0)
        if crash_after and _issued_here[0] >= crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.table("invoiced").insert({"order_id": order_id, "amount": event.amount})


app = App(
    "bank",
    aggregates=[Account, Order, Invoice],
    projectors=[Balances, Ledger, Invoicing],
    partitions={"accounts": 6, "orders": 4, "invoices": 4},
)

# ---------------------------------------------------------------------------- version 2
# The next release of the app: the balances read model gains a column (one more migration
# in the same set). Its workers refuse to start on a version-1 read model until migrated.
balances_migrations_v2 = Migrations("bankapp.balances")
balances_migrations_v2()(m001_tables)


@balances_migrations_v2()
def m002_balances_owner(db: Database) -> None:
    db.execute("ALTER TABLE balances ADD COLUMN owner TEXT")


class BalancesV2(Balances):
    migrations = balances_migrations_v2


app_v2 = App(
    "bank",
    aggregates=[Account, Order, Invoice],
    projectors=[BalancesV2, Ledger, Invoicing],
    partitions={"accounts": 6, "orders": 4, "invoices": 4},
)


# ---------------------------------------------------------------------------- zombie worker
def zombie_main(data: str, name: str, session_timeout_ms: int) -> None:
    """A worker that freezes itself (SIGSTOP) once, holding a polled batch, before applying.

    Writes ``[[partition, first, last], ...]`` of the batch in hand to ``$BANKAPP_SELF_STOP``
    just before stopping; after SIGCONT it tries to apply that batch like any worker.
    """
    configure_logging()
    flag = Path(os.environ["BANKAPP_SELF_STOP"])
    with app.open(Path(data)) as runtime:
        worker = Worker(runtime, name, session_timeout_ms=session_timeout_ms, max_poll_records=50)
        worker.install_signal_handlers()
        stopped = False
        try:
            while not worker.stopping.is_set():
                polled = worker.poll()
                if polled.records and not stopped:
                    stopped = True
                    spans: dict[int, list[int]] = {}
                    for r in polled.records:
                        spans.setdefault(r.partition, []).append(r.offset)
                    body = [[p, min(o), max(o)] for p, o in sorted(spans.items())]
                    flag.write_text(json.dumps({"generation": polled.generation, "spans": body}))
                    os.kill(os.getpid(), signal.SIGSTOP)
                    result = worker.apply(polled)
                    sys.stderr.write(
                        f"ZOMBIE-RESULT {'refused' if result is None else 'applied'}\n"
                    )
                    sys.stderr.flush()
                    continue
                worker.apply(polled)
        finally:
            worker.close()


if __name__ == "__main__":
    zombie_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
