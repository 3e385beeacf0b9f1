"""What ``forget`` costs with the personal read model in PostgreSQL, against SQLite (issue 34;
report-only).

``--rows`` members (default 50,000; ``--quick`` 2,000) join (``MemberJoined``: a name and an
e-mail, personal, each member its own subject) and the ``roster`` projection of
``tests/projection/rosterapp.py`` is caught up (one row per member), once into a SQLite
file, once into a schema of a temporary PostgreSQL cluster on loopback
(``eventlane.testing.postgres``; fsync off, ``wal_recycle = off`` as forget asks). Then,
alternating over ``--runs`` rounds, ``eventlane.forget`` of one more member on each engine:
its key destroyed, the read model rebuilt from the log without it and swapped in (the
whole of the scrub: the rebuild replays every row), and on PostgreSQL
:func:`~eventlane.projection.postgres.erase_dropped` (``VACUUM FULL`` of the statistics
catalogs, two WAL switches and checkpoints), timed on its own as well. Reported: seconds
per forget on each engine (and their ratio), and the seconds of ``erase_dropped``.

    python benchmarks/bench_pg_forget.py [--rows N] [--runs N] [--json]
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._harness import bench_from_args, parser, quiet_logs, scratch_dir  # noqa: E402
from benchmarks.bench_pg_readmodel import postgres  # noqa: E402
from eventlane import App, forget  # noqa: E402
from eventlane.codec import Envelope  # noqa: E402
from eventlane.codec.keystore import LogKeyStore  # noqa: E402
from eventlane.log.partitioner import partition_for_key  # noqa: E402
from eventlane.projection import Worker  # noqa: E402
from tests.projection.rosterapp import Plans, Roster  # noqa: E402
from tests.replay.erasure_app import Member, MemberJoined  # noqa: E402


def club(readmodels: str | None) -> App:
    return App(
        "club",
        aggregates=[Member],
        projectors=[Roster, Plans],
        partitions=2,
        keys=lambda log: LogKeyStore(log, "club.keys", refresh_ms=10),
        readmodels=readmodels,
    )


def produce(runtime: Any, rows: int) -> None:
    """``rows`` members join (encoded through the codec: a key per member)."""
    partitions = runtime.log.partition_count("members")
    pending: dict[int, list[Any]] = {}
    for i in range(rows):
        event = MemberJoined(f"Person-{i:06d} Zanzibar", f"p{i:06d}@ex.zz", "basic")
        key, value, headers = runtime.codec.encode(Envelope(event, f"m-{i}", 1))
        p = partition_for_key(key, partitions)
        pending.setdefault(p, []).append((key, value, tuple(headers), None))
        if len(pending[p]) >= 2000:
            runtime.log.append("members", p, pending.pop(p))
    for p, records in pending.items():
        runtime.log.append("members", p, records)


def catch_up(runtime: Any) -> None:
    worker = Worker(runtime, "roster", poll_timeout=0.2, max_poll_records=2000)
    try:
        while worker.run_once():
            pass
    finally:
        worker.close()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=None)
    args = p.parse_args()
    rows = args.rows or (2_000 if args.quick else 50_000)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    erase_seconds: list[float] = []
    forget_module = importlib.import_module("eventlane.replay.forget")
    real_erase = forget_module.erase_dropped

    def timed_erase(url: str) -> list[str]:
        t0 = time.perf_counter()
        problems = real_erase(url)
        erase_seconds.append(time.perf_counter() - t0)
        return problems

    forget_module.erase_dropped = timed_erase
    with scratch_dir(args.tmp, "pgforget") as folder, postgres() as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_recycle = off")
            conn.execute("SELECT pg_reload_conf()")
        runtimes = {
            "sqlite": club(None).open(folder / "sqlite"),
            "postgresql": club(server.url).open(folder / "postgresql"),
        }
        try:
            for runtime in runtimes.values():
                produce(runtime, rows)
                catch_up(runtime)
            bench.notes.append(
                f"{rows} members, one roster row each; PostgreSQL 15 on loopback (fsync off,"
                " wal_recycle off), SQLite WAL synchronous=FULL; one subject forgotten a run"
            )
            subjects = iter(range(rows))

            def measure(engine: str) -> float:
                subject = f"m-{next(subjects)}"
                t0 = time.perf_counter()
                report = forget(runtimes[engine], subject)
                seconds = time.perf_counter() - t0
                if not report.ok or report.rebuilt != ("roster",):
                    raise SystemExit(f"forget on {engine} incomplete: {report.not_scrubbed}")
                print(f"  {engine}: forget {subject} {seconds:.2f} s", file=sys.stderr)
                return seconds

            bench.rounds(
                {"sqlite": lambda: measure("sqlite"), "postgresql": lambda: measure("postgresql")}
            )
        finally:
            for runtime in runtimes.values():
                runtime.close()
    bench.series["erase"] = erase_seconds
    bench.add("forget, SQLite read model", "s", "sqlite", note="rebuild + swap of all rows")
    bench.add("forget, PostgreSQL read model", "s", "postgresql", baseline="sqlite")
    bench.add("  of which erase_dropped", "s", "erase", note="VACUUM FULL statistics, WAL")
    bench.finish()


if __name__ == "__main__":
    main()
