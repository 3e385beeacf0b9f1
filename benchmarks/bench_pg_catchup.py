"""Catch-up of the invoicing ``customer_balances`` projection: PostgreSQL against SQLite
(issue 34; report-only).

``--events`` events of the ``invoices`` topic (default 1,000,000: per invoice an
``InvoiceIssued``, a ``PaymentRecorded`` and, one in seven, an ``InvoiceVoided``) are
appended to an embedded log, then applied from offset 0 the way a worker catches up: read in
polls of ``--batch`` records (a worker's ``max_poll_records``), each poll one
``BatchApplier.apply`` transaction with its positions. Once into a fresh SQLite read-model
file, once into a fresh schema of a temporary PostgreSQL cluster on loopback
(``eventlane.testing.postgres``; fsync off), alternating over ``--runs`` rounds. Reported per
engine: events/s and the CPU split of the catch-up's wall time: this process (decode,
handlers, framework), the database server's processes (PostgreSQL; zero for SQLite, which
runs inside this process), and the rest (waiting: round trips, other processes).

    python benchmarks/bench_pg_catchup.py [--events N] [--batch N] [--runs N] [--json]
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._harness import bench_from_args, parser, quiet_logs, scratch_dir  # noqa: E402
from benchmarks.bench_pg_readmodel import postgres  # noqa: E402
from eventlane.codec import Envelope  # noqa: E402
from eventlane.consumer.free import Consumer  # noqa: E402
from eventlane.log import TopicPartition  # noqa: E402
from eventlane.log.partitioner import partition_for_key  # noqa: E402
from eventlane.projection import BatchApplier, ReadModel  # noqa: E402
from eventlane.projection.postgres import PgReadModel  # noqa: E402
from eventlane.projection.schema import apply_migrations  # noqa: E402
from example_apps.invoicing import app  # noqa: E402
from example_apps.invoicing.events import (  # noqa: E402
    InvoiceIssued,
    InvoiceVoided,
    PaymentRecorded,
)

NAME = "customer_balances"


def produce(runtime: Any, events: int) -> int:
    """Append about ``events`` encoded invoice events (raw batches, no command path)."""
    topic = "invoices"
    partitions = runtime.log.partition_count(topic)
    pending: dict[int, list[Any]] = {}
    n = i = 0

    def flush(p: int) -> None:
        runtime.log.append(topic, p, pending.pop(p))

    while n < events:
        aid = f"inv-{i}"
        stream: list[Any] = [
            InvoiceIssued(f"o-{i}", f"c-{i % 5000}", 1000 + i % 97),
            PaymentRecorded(300),
        ]
        if i % 7 == 0:
            stream.append(InvoiceVoided("duplicate"))
        for version, event in enumerate(stream, 1):
            key, value, headers = runtime.codec.encode(Envelope(event, aid, version))
            p = partition_for_key(key, partitions)
            pending.setdefault(p, []).append((key, value, tuple(headers), None))
            if len(pending[p]) >= 2000:
                flush(p)
        n += len(stream)
        i += 1
    for p in list(pending):
        flush(p)
    return n


def server_cpu(pid: int) -> float:
    """CPU seconds of the postmaster and its children (backends, writers)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def catch_up(runtime: Any, readmodel: Any, batch: int, server_pid: int | None) -> dict[str, float]:
    cls = app.projector(NAME)
    apply_migrations(cls.migrations, readmodel)
    applier = BatchApplier(cls(), runtime.codec, readmodel, app=None)
    consumer = Consumer(runtime.log, auto_offset_reset="earliest", max_poll_records=batch)
    count = runtime.log.partition_count("invoices")
    consumer.assign([TopicPartition("invoices", p) for p in range(count)])
    total = sum(runtime.log.offsets("invoices", p).hwm for p in range(count))
    done = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    srv0 = server_cpu(server_pid) if server_pid else 0.0
    while done < total:
        records = consumer.poll(1.0, batch)
        if records:
            applier.apply(records)
            done += len(records)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    srv = (server_cpu(server_pid) - srv0) if server_pid else 0.0
    consumer.close()
    readmodel.close()
    figures = {"rate": done / wall, "wall": wall, "client": cpu / wall, "server": srv / wall}
    print(
        f"  {type(readmodel).__name__}: {done} events in {wall:.1f} s, {figures['rate']:,.0f}"
        f" ev/s, this process {100 * figures['client']:.0f} %, server"
        f" {100 * figures['server']:.0f} % of wall, load {psutil.getloadavg()[0]:.1f}",
        file=sys.stderr,
        flush=True,
    )
    return figures


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None)
    p.add_argument("--batch", type=int, default=2000)
    args = p.parse_args()
    events = args.events or (20_000 if args.quick else 1_000_000)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    figures: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
    with (
        scratch_dir(args.tmp, "pgcatchup") as folder,
        postgres() as server,
        app.open(folder / "log") as runtime,
    ):
        n = produce(runtime, events)
        bench.notes.append(
            f"{n} events of the invoices topic, polls of {args.batch}; PostgreSQL 15 on"
            " loopback (fsync off), SQLite WAL synchronous=FULL"
        )

        def sqlite() -> float:
            path = folder / "readmodels" / f"cb-{uuid.uuid4().hex[:8]}.sqlite"
            done = catch_up(runtime, ReadModel(path), args.batch, None)
            figures["sqlite"].append(done)
            return done["rate"]

        def postgresql() -> float:
            schema = f"cb_{uuid.uuid4().hex[:8]}"
            path = folder / "readmodels" / "cb.sqlite"
            readmodel = PgReadModel(server.url, schema, path)
            done = catch_up(runtime, readmodel, args.batch, server.pid)
            figures["postgresql"].append(done)
            return done["rate"]

        bench.rounds({"sqlite": sqlite, "postgresql": postgresql})
    bench.add("catch-up into SQLite", "ev/s", "sqlite", note="BatchApplier, polls of --batch")
    bench.add("catch-up into PostgreSQL", "ev/s", "postgresql", baseline="sqlite")
    for engine, runs in figures.items():
        for part in ("client", "server"):
            name = f"cpu.{engine}.{part}"
            bench.series[name] = [100 * r[part] for r in runs]
            where = "this process" if part == "client" else "the server's processes"
            bench.add(f"{engine}: CPU of {where}, % of wall", "%", name)
    bench.finish()


if __name__ == "__main__":
    main()
