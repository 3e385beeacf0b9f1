"""The invoicing projector into PostgreSQL against a hand-written psycopg loop (issue 34).

Subject: the ``customer_balances`` projector of the invoicing app applying the ``invoices``
topic into a PostgreSQL read model through the worker's own applier (``BatchApplier`` on a
``PgReadModel``: decode, dispatch, ``ctx.table`` statements, fencing and positions), in
batches of ``--batch`` records, in process. Baseline: a hand-written loop doing the same
work with psycopg directly: decode each record with the app's codec, run the same statements
(insert the owner row, upsert the balance, look the owner up for payments and voids), and
per batch ``BEGIN``, lock, read and write the partition's position, ``COMMIT``. Both start on
a fresh schema of one temporary PostgreSQL cluster (``eventlane.testing.postgres``), rounds
interleaved. Figure of record: subject/baseline (issue 34 asks >= 0.8x). Each run checks that
both produced the same rows.

    python benchmarks/bench_pg_readmodel.py [--quick] [--events N] [--batch N] [--json]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    Target,
    bench_from_args,
    parser,
    quiet_logs,
    scratch_dir,
)
from eventlane.consumer.free import Consumer  # noqa: E402
from eventlane.log import Record, TopicPartition  # noqa: E402
from eventlane.projection import BatchApplier  # noqa: E402
from eventlane.projection.postgres import PgReadModel, lock_key  # noqa: E402
from eventlane.projection.schema import apply_migrations  # noqa: E402
from eventlane.testing.postgres import PostgresServer  # noqa: E402
from example_apps.invoicing import app  # noqa: E402
from example_apps.invoicing.domain import Invoice  # noqa: E402

NAME = "customer_balances"


def produce(runtime: Any, events: int) -> list[Record]:
    """Invoices with payments and some voids, about ``events`` events; all read back."""
    n = 0
    i = 0
    while n < events:
        invoice = Invoice.rehydrate(f"inv-{i}", [])
        invoice.issue(f"o-{i}", f"c-{i % 500}", 1000 + i % 97)
        invoice.record_payment(300)
        if i % 7 == 0:
            invoice.void("duplicate")
        n += len(invoice.pending_events)
        runtime.save(invoice)
        i += 1
    consumer = Consumer(runtime.log, auto_offset_reset="earliest", max_poll_records=100_000)
    count = runtime.log.partition_count("invoices")
    consumer.assign([TopicPartition("invoices", p) for p in range(count)])
    total = sum(runtime.log.offsets("invoices", p).hwm for p in range(count))
    out: list[Record] = []
    while len(out) < total:
        out.extend(consumer.poll(1.0))
    consumer.close()
    return out


@contextmanager
def postgres() -> Iterator[PostgresServer]:
    """A temporary PostgreSQL cluster, stopped and removed however the benchmark ends."""
    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="eventlane-pg-")))
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)


def batches(records: list[Record], size: int) -> list[list[Record]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


def subject(url: str, runtime: Any, records: list[Record], size: int, path: Path) -> float:
    schema = f"s_{uuid.uuid4().hex[:12]}"
    readmodel = PgReadModel(url, schema, path)
    cls = app.projector(NAME)
    apply_migrations(cls.migrations, readmodel)
    applier = BatchApplier(cls(), runtime.codec, readmodel, app=None)
    t0 = time.perf_counter()
    for batch in batches(records, size):
        applier.apply(batch, generation=0)
    seconds = time.perf_counter() - t0
    readmodel.close()
    return len(records) / seconds


ADD = (
    'INSERT INTO "customer_balances" ("customer_id", "invoiced_cents", "paid_cents",'
    ' "voided_cents", "invoices") VALUES (%s, %s, %s, %s, %s) ON CONFLICT ("customer_id")'
    ' DO UPDATE SET "invoiced_cents" = "customer_balances"."invoiced_cents" +'
    ' excluded."invoiced_cents", "paid_cents" = "customer_balances"."paid_cents" +'
    ' excluded."paid_cents", "voided_cents" = "customer_balances"."voided_cents" +'
    ' excluded."voided_cents", "invoices" = "customer_balances"."invoices" +'
    ' excluded."invoices"'
)
OWNER_IN = (
    'INSERT INTO "invoice_owners" ("invoice_id", "customer_id", "amount_cents") VALUES (%s, %s, %s)'
)
OWNER = 'SELECT * FROM "invoice_owners" WHERE "invoice_id" = %s LIMIT 1'
"""The statements ``ctx.table`` sends for the ``customer_balances`` projector."""


def begin_batch(conn: Any, key: int, batch: list[Record]) -> int:
    """A batch's framework statements, as the projector sends them: the transaction, the
    projection's lock, each partition's position read and written. Returns the number of
    partitions (two round trips each, besides the two of the start)."""
    conn.execute("BEGIN")
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
    partitions = {(r.topic, r.partition) for r in batch}
    for tp in partitions:
        row = conn.execute(
            "SELECT next_offset FROM _eventlane_positions WHERE topic=%s AND partition=%s",
            tp,
        ).fetchone()
        last = max(r.offset for r in batch if (r.topic, r.partition) == tp) + 1
        if row is None:
            conn.execute("INSERT INTO _eventlane_positions VALUES (%s, %s, %s, 0)", (*tp, last))
        else:
            conn.execute(
                "UPDATE _eventlane_positions SET next_offset=%s WHERE topic=%s AND partition=%s",
                (last, *tp),
            )
    return len(partitions)


def connect(url: str, schema: str, path: Path) -> Any:
    """A psycopg connection to a fresh schema with the projector's tables (created untimed)."""
    setup = PgReadModel(url, schema, path)
    apply_migrations(app.projector(NAME).migrations, setup)
    setup.close()
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


def baseline(url: str, runtime: Any, records: list[Record], size: int, path: Path) -> float:
    schema = f"b_{uuid.uuid4().hex[:12]}"
    conn = connect(url, schema, path)
    codec, key = runtime.codec, lock_key(schema)
    t0 = time.perf_counter()
    for batch in batches(records, size):
        begin_batch(conn, key, batch)
        for r in batch:
            env = codec.decode(r.key, r.value, r.headers, topic=r.topic, partition=r.partition)
            event, aid = env.event, env.aggregate_id
            kind = type(event).__name__
            if kind == "InvoiceIssued":
                conn.execute(OWNER_IN, (aid, event.customer_id, event.amount_cents))
                conn.execute(ADD, (event.customer_id, event.amount_cents, 0, 0, 1))
            elif kind == "PaymentRecorded":
                found = conn.execute(OWNER, (aid,)).fetchone()
                conn.execute(ADD, (found[1], 0, event.amount_cents, 0, 0))
            elif kind == "InvoiceVoided":
                found = conn.execute(OWNER, (aid,)).fetchone()
                conn.execute(ADD, (found[1], 0, 0, found[2], 0))
        conn.execute("COMMIT")
    seconds = time.perf_counter() - t0
    conn.close()
    return len(records) / seconds


def rows(url: str, prefix: str) -> list[list[Any]]:
    """The balances of every schema named ``prefix*`` (each run's must be equal)."""
    with psycopg.connect(url, autocommit=True) as conn:
        schemas = [
            r[0]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (prefix + "%",)
            )
        ]
        return [
            conn.execute(f'SELECT * FROM "{s}".customer_balances ORDER BY 1').fetchall()
            for s in schemas
        ]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None)
    p.add_argument("--batch", type=int, default=500)
    args = p.parse_args()
    events = args.events or (1_500 if args.quick else 10_000)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    with (
        scratch_dir(args.tmp, "pg") as folder,
        postgres() as server,
        app.open(folder / "log") as runtime,
    ):
        records = produce(runtime, events)
        bench.notes.append(
            f"{len(records)} events of the invoices topic, batches of {args.batch};"
            " PostgreSQL 15 on loopback (fsync off), one connection each"
        )
        path = folder / "readmodels" / "customer_balances.sqlite"
        bench.rounds(
            {
                "baseline": lambda: baseline(server.url, runtime, records, args.batch, path),
                "subject": lambda: subject(server.url, runtime, records, args.batch, path),
            }
        )
        every = rows(server.url, "s_") + rows(server.url, "b_")
        assert all(r == every[0] for r in every), "subject and baseline rows differ"
    bench.add("hand-written psycopg loop", "ev/s", "baseline", note="same statements, batches")
    bench.add(
        "customer_balances projector into PostgreSQL",
        "ev/s",
        "subject",
        baseline="baseline",
        note="BatchApplier + PgReadModel + ctx.table",
    )
    bench.add(
        "projector / hand-written loop (paired)",
        "x",
        bench.paired("subject", "baseline"),
        target=Target(">=", 0.8),
    )
    bench.finish()


if __name__ == "__main__":
    main()
