"""Projector end to end: events/s of one worker, scaling to 2 workers, append → read-model
visibility latency, and catch-up from a cold start.

The projector (defined here, imported by the worker processes as ``bench_projector:app``):
one handler per ``Deposited`` event doing one upsert of the account's balance through
``ctx.conn``. Workers are real processes (``python -m eventlane.cli project worker``), each a
member of the projector's consumer group; events are 6 partitions of ~250-byte JSON
envelopes (10,000 accounts). Per round, with a fresh data directory each time:

* ``raw``        baseline: the least a projection must do, in this process: ``orjson.loads``
                 of each record value, then ``executemany`` of the upserts and a position
                 update per 2,000 events in one ``BEGIN IMMEDIATE`` transaction (WAL,
                 ``synchronous=FULL``), on the same records already in memory.
* ``loop``       context: the hand-written projector loop of brief section 4 in this process
                 (the framework's ``EventCodec.decode``, one ``execute`` per event, commit
                 per 2,000), on the same records: what the worker adds beyond it is the
                 framework's overhead (poll, dispatch, positions, fencing).
* ``one_worker`` one worker process, joined and idle at the end of the log; the clock
                 starts before ``--events`` events are appended and stops when the read
                 model's positions reach every partition's HWM (poll, decode, handler,
                 SQLite write + positions in one transaction per poll). Also per CPU
                 second: the events over the CPU time the worker used in that window
                 (``/proc/<pid>/stat``), against the loop's process time: the work each
                 does, whatever the machine's other jobs take from the wall clock.
* ``two_workers`` the same with two worker processes sharing the 6 partitions (one read
                 model file: SQLite admits one writer at a time; decoding happens before
                 the write lock is taken). Reported against ``one_worker``: the scaling.
* ``cold``       catch-up from a cold start: the events are in the log first; the clock runs
                 from spawning one worker process (interpreter start, join, claim) until it
                 has applied them all.
* ``latency``    one idle worker; 300 times: append one event (fsync), wait for it in the
                 read model with ``Runtime.wait_for`` (read-your-writes: woken by the
                 worker after its commit); p50/p99 in ms. Baseline ``floor``: the two
                 durable writes visibility needs, done in this process: the same append,
                 then one upsert + position committed in SQLite (``synchronous=FULL``).

    .venv/bin/python benchmarks/bench_projector.py [--quick] [--runs 5] [--events N] [--json]
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import orjson
from attrs import frozen
from sqlite_utils import Database

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _path in (str(ROOT), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from _harness import (  # noqa: E402
    Target,
    bench_from_args,
    parser,
    percentile,
    quiet_logs,
    scratch_dir,
)

from eventlane.app import App, Runtime  # noqa: E402
from eventlane.codec import Envelope  # noqa: E402
from eventlane.consumer.coordinator import GroupCoordinator  # noqa: E402
from eventlane.domain import Aggregate, DomainEvent, applies, event  # noqa: E402
from eventlane.log import LogStore, TopicPartition  # noqa: E402
from eventlane.log.partitioner import partition_for_key  # noqa: E402
from eventlane.projection import (  # noqa: E402
    EventContext,
    Projector,
    ReadModelView,
    handles,
    readmodel_path,
)

TOPIC = "bench.accounts"
PARTITIONS = 6
ACCOUNTS = 10_000
NAME = "bench_balances"
CHUNK = 2_000
UPSERT = (
    "INSERT INTO balances VALUES (?, ?) ON CONFLICT(id) DO UPDATE"
    " SET total = total + excluded.total"
)


@event("BenchDeposited")
@frozen
class Deposited(DomainEvent):
    amount: int
    memo: str = ""


class BenchAccount(Aggregate):
    topic: ClassVar[str] = TOPIC
    balance: int

    def init_state(self) -> None:
        self.balance = 0

    @applies(Deposited)
    def _deposited(self, e: Deposited) -> None:
        self.balance += e.amount


class BenchBalances(Projector):
    name = NAME
    topics = (TOPIC,)

    def setup(self, db: Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS balances (id TEXT PRIMARY KEY, total INTEGER NOT NULL)"
        )

    @handles(Deposited)
    def deposited(self, event: Deposited, ctx: EventContext) -> None:
        ctx.conn.execute(UPSERT, (ctx.envelope.aggregate_id, event.amount))


app = App("bench", aggregates=[BenchAccount], projectors=[BenchBalances], partitions=PARTITIONS)


# ---------------------------------------------------------------------------- helpers
Encoded = tuple[int, tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]


class Stream:
    """Pre-encoded events (encoding is not what is measured), appended in big batches."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.versions: dict[str, int] = {}
        self.count = 0

    def encode(self, n: int) -> list[Encoded]:
        out = []
        codec = self.runtime.codec
        for _ in range(n):
            i = self.count
            self.count += 1
            aid = f"acc-{i % ACCOUNTS}"
            version = self.versions.get(aid, 0) + 1
            self.versions[aid] = version
            key, value, headers = codec.encode(Envelope(Deposited(i % 100 + 1), aid, version))
            out.append((partition_for_key(key, PARTITIONS), (key, value, tuple(headers), None)))
        return out

    def append(self, encoded: list[Encoded]) -> None:
        by_partition: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]]
        by_partition = {}
        for p, record in encoded:
            by_partition.setdefault(p, []).append(record)
        for p, records in sorted(by_partition.items()):
            for start in range(0, len(records), 5_000):
                self.runtime.log.append(TOPIC, p, records[start : start + 5_000])


def spawn_worker(data: Path) -> subprocess.Popen[bytes]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    env["EVENTLANE_LOG_LEVEL"] = "error"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventlane.cli",
            "--data",
            str(data),
            "project",
            "worker",
            "bench_projector:app",
            NAME,
            "--max-poll-records",
            str(CHUNK),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(data: Path, procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    """Until every worker is a member owning its share and every partition is claimed."""
    share = PARTITIONS // len(procs)
    log = LogStore(data)
    deadline = time.monotonic() + timeout
    try:
        while True:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {proc.returncode}")
            coord = GroupCoordinator(log, NAME)
            members = coord.current().members
            coord.close()
            owned = {m.pid: len(m.owned) for m in members.values()}
            with ReadModelView(readmodel_path(data, NAME)) as view:
                claimed = len(view.positions())
            if (
                claimed == PARTITIONS
                and len(owned) == len(procs)
                and all(owned.get(p.pid, 0) >= share for p in procs)
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready: {owned}, {claimed} claimed")
            time.sleep(0.02)
    finally:
        log.close()


def wait_applied(data: Path, total: int, timeout: float = 600) -> float:
    """Poll the read model until its positions sum to ``total``; return the time then."""
    deadline = time.monotonic() + timeout
    with ReadModelView(readmodel_path(data, NAME)) as view:
        while True:
            if sum(view.positions().values()) >= total:
                return time.perf_counter()
            if time.monotonic() > deadline:
                raise RuntimeError("projection did not catch up")
            time.sleep(0.001)


def check(data: Path, stream: Stream) -> None:
    conn = sqlite3.connect(readmodel_path(data, NAME))
    total = conn.execute("SELECT sum(total) FROM balances").fetchone()[0]
    conn.close()
    expected = sum(i % 100 + 1 for i in range(stream.count))
    assert total == expected, f"read model total {total} != {expected}"


# ---------------------------------------------------------------------------- measures
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def measure_raw(values: list[tuple[bytes, int]], folder: Path) -> float:
    path = folder / "raw.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE balances (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
    conn.execute("CREATE TABLE positions (partition INTEGER PRIMARY KEY, next_offset INTEGER)")
    loads = orjson.loads
    t0 = time.perf_counter()
    for start in range(0, len(values), CHUNK):
        chunk = values[start : start + CHUNK]
        rows = []
        for value, _ in chunk:
            doc = loads(value)
            rows.append((doc["aggregate_id"], doc["data"]["amount"]))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(UPSERT, rows)
        conn.execute("INSERT OR REPLACE INTO positions VALUES (?, ?)", (chunk[-1][1], start))
        conn.execute("COMMIT")
    rate = len(values) / (time.perf_counter() - t0)
    conn.close()
    return rate


def measure_loop(
    records: list[tuple[bytes, bytes, Any]], codec: Any, folder: Path
) -> dict[str, float]:
    """The hand-written loop (brief section 4): the framework's codec decode (cattrs +
    orjson), one upsert per event, a position per chunk, commit per 2,000."""
    path = folder / "loop.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE balances (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
    conn.execute("CREATE TABLE positions (partition INTEGER PRIMARY KEY, next_offset INTEGER)")
    decode = codec.decode
    execute = conn.execute
    t0 = time.perf_counter()
    c0 = time.process_time()
    for start in range(0, len(records), CHUNK):
        execute("BEGIN IMMEDIATE")
        for key, value, headers in records[start : start + CHUNK]:
            env = decode(key, value, headers)
            execute(UPSERT, (env.aggregate_id, env.event.amount))
        execute("INSERT OR REPLACE INTO positions VALUES (?, ?)", (0, start))
        execute("COMMIT")
    rate = len(records) / (time.perf_counter() - t0)
    cpu_rate = len(records) / (time.process_time() - c0)
    conn.close()
    return {"rate": rate, "cpu": cpu_rate}


def measure_live(folder: Path, events: int, workers: int) -> dict[str, float]:
    """Events/s of the workers, wall (``rate``) and per CPU second the workers used in the
    same window (``cpu``: what the machine's other jobs do not change)."""
    data = folder / f"live{workers}"
    with app.open(data) as runtime:
        stream = Stream(runtime)
        encoded = stream.encode(events)
        procs = [spawn_worker(data) for _ in range(workers)]
        try:
            wait_ready(data, procs)
            c0 = sum(cpu_seconds(p.pid) for p in procs)
            t0 = time.perf_counter()
            stream.append(encoded)
            t1 = wait_applied(data, events)
            c1 = sum(cpu_seconds(p.pid) for p in procs)
        finally:
            stop(procs)
        check(data, stream)
    return {"rate": events / (t1 - t0), "cpu": events / max(c1 - c0, 1 / _TICK)}


def measure_cold(folder: Path, events: int) -> float:
    data = folder / "cold"
    with app.open(data) as runtime:
        stream = Stream(runtime)
        stream.append(stream.encode(events))
        t0 = time.perf_counter()
        proc = spawn_worker(data)
        try:
            while not readmodel_path(data, NAME).exists():
                time.sleep(0.005)
            t1 = wait_applied(data, events)
        finally:
            stop([proc])
        check(data, stream)
    return events / (t1 - t0)


def measure_latency(folder: Path, count: int) -> dict[str, float]:
    data = folder / "latency"
    with app.open(data) as runtime:
        stream = Stream(runtime)
        stream.append(stream.encode(PARTITIONS * 10))
        proc = spawn_worker(data)
        try:
            wait_ready(data, [proc])
            wait_applied(data, stream.count)
            samples = []
            for _ in range(count):
                ((p, record),) = stream.encode(1)
                t0 = time.perf_counter()
                result = runtime.log.append(TOPIC, p, [record])
                if not runtime.wait_for(NAME, {TopicPartition(TOPIC, p): result.base_offset + 1}):
                    raise RuntimeError("event not visible within 10 s")
                samples.append((time.perf_counter() - t0) * 1000)
        finally:
            stop([proc])
    return _percentiles(samples[20:])


def measure_floor(folder: Path, count: int) -> dict[str, float]:
    data = folder / "floor"
    with app.open(data) as runtime:
        stream = Stream(runtime)
        conn = sqlite3.connect(folder / "floor.sqlite", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE balances (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
        conn.execute("CREATE TABLE positions (partition INTEGER PRIMARY KEY, next INTEGER)")
        samples = []
        for _ in range(count):
            ((p, record),) = stream.encode(1)
            t0 = time.perf_counter()
            result = runtime.log.append(TOPIC, p, [record])
            doc = orjson.loads(record[1])
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(UPSERT, (doc["aggregate_id"], doc["data"]["amount"]))
            conn.execute("INSERT OR REPLACE INTO positions VALUES (?, ?)", (p, result.base_offset))
            conn.execute("COMMIT")
            samples.append((time.perf_counter() - t0) * 1000)
        conn.close()
    return _percentiles(samples[20:])


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50": percentile(ordered, 0.5), "p99": percentile(ordered, 0.99)}


# ---------------------------------------------------------------------------- main
def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None, help="events per throughput run")
    p.add_argument("--latency-events", type=int, default=None)
    p.add_argument(
        "--only",
        default="",
        metavar="A,B",
        help="run only these measures (e.g. raw,loop,one_worker); figures of the others are absent",
    )
    args = p.parse_args()
    events = args.events or (20_000 if args.quick else 200_000)
    pings = args.latency_events or (120 if args.quick else 320)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    bench.notes.append(
        f"{events} events per run on {PARTITIONS} partitions, {ACCOUNTS} accounts,"
        f" max_poll_records {CHUNK}; latency over {pings - 20} pings after 20 warm-up"
    )
    with scratch_dir(args.tmp, "projector") as folder:
        # The raw baseline reads the same kind of records, already in memory.
        prep = folder / "prep"
        with app.open(prep) as runtime:
            stream = Stream(runtime)
            encoded = stream.encode(events)
            values = [(rec[1], p) for p, rec in encoded]
            records = [(rec[0], rec[1], rec[2]) for _, rec in encoded]
            codec = runtime.codec

        def fresh(name: str) -> Path:
            path = folder / name
            if path.exists():
                shutil.rmtree(path)
            path.mkdir()
            return path

        measures = {
            "raw": lambda: measure_raw(values, fresh("r")),
            "loop": lambda: measure_loop(records, codec, fresh("h")),
            "one_worker": lambda: measure_live(fresh("w1"), events, 1),
            "two_workers": lambda: measure_live(fresh("w2"), events, 2),
            "cold": lambda: measure_cold(fresh("c"), events),
            "floor": lambda: measure_floor(fresh("f"), pings),
            "latency": lambda: measure_latency(fresh("l"), pings),
        }
        only = {name for name in args.only.split(",") if name}
        if only - set(measures):
            raise SystemExit(f"--only: unknown measures {sorted(only - set(measures))}")
        bench.rounds({k: v for k, v in measures.items() if not only or k in only})
    for figure, unit, key, baseline, target, note in _FIGURES:
        needed = {key.split(".")[0]} | ({baseline.split(".")[0]} if baseline else set())
        if not only or needed <= only:
            bench.add(figure, unit, key, baseline=baseline, target=target, note=note)
    bench.finish()


_FIGURES: list[tuple[str, str, str, str | None, Target | None, str]] = [
    ("raw decode + executemany (baseline)", "ev/s", "raw", None, None, "orjson + sqlite3"),
    (
        "hand-written decode + upsert loop",
        "ev/s",
        "loop.rate",
        "raw",
        None,
        "EventCodec.decode + execute per event, in process",
    ),
    ("one worker, end to end", "ev/s", "one_worker.rate", "raw", Target(">=", 50_000), ""),
    ("one worker vs the hand-written loop", "ev/s", "one_worker.rate", "loop.rate", None, ""),
    (
        "  per CPU second: one worker vs the loop",
        "ev/s",
        "one_worker.cpu",
        "loop.cpu",
        None,
        "worker's CPU in the window vs the loop's process time",
    ),
    ("two workers (scaling vs one)", "ev/s", "two_workers.rate", "one_worker.rate", None, ""),
    ("catch-up from a cold start", "ev/s", "cold", "raw", None, ""),
    ("floor: append + SQLite commit p50", "ms", "floor.p50", None, None, ""),
    ("floor: append + SQLite commit p99", "ms", "floor.p99", None, None, ""),
    ("append -> read model p50", "ms", "latency.p50", "floor.p50", None, ""),
    ("append -> read model p99", "ms", "latency.p99", "floor.p99", None, ""),
]
"""Every figure: name, unit, measure key, baseline key, target, note."""


if __name__ == "__main__":
    main()
