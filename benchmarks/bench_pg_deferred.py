"""What deferring handler writes would buy on a PostgreSQL read model (issue 34; report-only).

A design measurement for the next piece of issue 34, not a figure of the framework: three
hand-written psycopg loops apply the ``customer_balances`` statements of the invoicing app
(the statements and batches of ``bench_pg_readmodel.py``'s baseline), differing only in
when the handlers' writes reach the server:

* ``now``: one round trip per statement (what ``ctx.table`` does today);
* ``flush``: writes held in a list and sent in one pipeline before any read of the batch
  (``invoice_owners`` lookups) and at the batch's end: the simplest read-your-writes rule;
* ``through``: the same, but a lookup by key of a row inserted earlier in the batch is
  answered from the pending inserts, so a batch's writes go in one pipeline.

Each round runs the three on fresh schemas of one temporary PostgreSQL cluster
(``eventlane.testing.postgres``), interleaved; the rows of every run must be equal.
Reported: events/s, round trips per event, and each variant over ``now`` (paired).

    python benchmarks/bench_pg_deferred.py [--quick] [--events N] [--batch N] [--json]
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._harness import bench_from_args, parser, quiet_logs, scratch_dir  # noqa: E402
from benchmarks.bench_pg_readmodel import (  # noqa: E402
    ADD,
    OWNER,
    OWNER_IN,
    batches,
    begin_batch,
    connect,
    postgres,
    produce,
    rows,
)
from eventlane.projection.postgres import lock_key  # noqa: E402
from example_apps.invoicing import app  # noqa: E402

MODES = ("now", "flush", "through")


class _Loop:
    """One variant's writes and reads, counting round trips."""

    def __init__(self, conn: Any, mode: str) -> None:
        self.conn = conn
        self.mode = mode
        self.trips = 0
        self.pending: list[tuple[str, tuple[Any, ...]]] = []
        self.owners: dict[str, tuple[Any, ...]] = {}

    def write(self, sql: str, params: tuple[Any, ...]) -> None:
        if self.mode == "now":
            self.trips += 1
            self.conn.execute(sql, params)
        else:
            self.pending.append((sql, params))

    def flush(self) -> None:
        if self.pending:
            self.trips += 1
            with self.conn.pipeline():
                for sql, params in self.pending:
                    self.conn.execute(sql, params)
            self.pending.clear()

    def owner(self, invoice: str) -> Any:
        if self.mode == "through" and invoice in self.owners:
            return self.owners[invoice]
        self.flush()
        self.trips += 1
        return self.conn.execute(OWNER, (invoice,)).fetchone()


def variant(url: str, runtime: Any, records: list[Any], size: int, path: Path, mode: str) -> Any:
    schema = f"{mode}_{uuid.uuid4().hex[:12]}"
    conn = connect(url, schema, path)
    codec, key, loop = runtime.codec, lock_key(schema), _Loop(conn, mode)
    t0 = time.perf_counter()
    for batch in batches(records, size):
        loop.trips += 2 + 2 * begin_batch(conn, key, batch)
        loop.owners.clear()
        for r in batch:
            env = codec.decode(r.key, r.value, r.headers, topic=r.topic, partition=r.partition)
            event, aid = env.event, env.aggregate_id
            kind = type(event).__name__
            if kind == "InvoiceIssued":
                loop.write(OWNER_IN, (aid, event.customer_id, event.amount_cents))
                loop.owners[aid] = (aid, event.customer_id, event.amount_cents)
                loop.write(ADD, (event.customer_id, event.amount_cents, 0, 0, 1))
            elif kind == "PaymentRecorded":
                found = loop.owner(aid)
                loop.write(ADD, (found[1], 0, event.amount_cents, 0, 0))
            elif kind == "InvoiceVoided":
                found = loop.owner(aid)
                loop.write(ADD, (found[1], 0, 0, found[2], 0))
        loop.flush()
        conn.execute("COMMIT")
        loop.trips += 1
    seconds = time.perf_counter() - t0
    conn.close()
    return {"rate": len(records) / seconds, "trips": loop.trips / len(records)}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None)
    p.add_argument("--batch", type=int, default=500)
    args = p.parse_args()
    events = args.events or (1_500 if args.quick else 5_000)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    with (
        scratch_dir(args.tmp, "pgdef") as folder,
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
                m: (lambda m=m: variant(server.url, runtime, records, args.batch, path, m))
                for m in MODES
            }
        )
        every = [r for m in MODES for r in rows(server.url, f"{m}_")]
        assert all(r == every[0] for r in every), "the variants' rows differ"
    for m in MODES:
        bench.add(f"{m}: events/s", "ev/s", f"{m}.rate")
        bench.add(f"{m}: round trips per event", "n", f"{m}.trips")
    for m in MODES[1:]:
        bench.add(f"{m} / now (paired)", "x", bench.paired(f"{m}.rate", "now.rate"))
    bench.finish()


if __name__ == "__main__":
    main()
