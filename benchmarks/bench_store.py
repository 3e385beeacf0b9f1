"""The event store: aggregate load from a big topic, save throughput, codec speed.

Figures (median of ``--runs`` >= 5 rounds, each with its same-run baseline):

* **load**: ``Runtime.load`` of one aggregate with 100 events from a topic of
  ``--records`` records (default 10M, ``--quick`` 200k), page cache warm. Target < 5 ms.
  Baseline: what a store without a key index must do, a full scan of the partition for
  that key (read every record from the low-water mark, keep the aggregate's, decode them,
  rebuild the aggregate). The ratio is the speed-up.
* **save, single events**: ``Runtime.save`` of one event per call (fsync per save),
  events/s. Baseline: ``LogStore.append`` of the same pre-encoded record per call.
* **save, batches of 100**: ``Runtime.save`` of 100 events per call. Baseline: an
  atomic ``LogStore.append`` of the same 100 pre-encoded records.
* **codec**: ``EventCodec.encode``/``decode`` per event vs ``orjson.dumps``/``loads`` of the
  same JSON documents as plain dicts.

The big topic is built once and cached in ``--tmp`` (default /tmp) under
``eventlane-bench-store-<records>x<partitions>``: the bulk records are appended with
``LogStore.append`` in large batches (realistic event JSON from the store's own envelope
format, about 300 bytes with headers, ``--keys`` aggregates), and the target aggregate's
100 events are saved through the store, one event per save, spread evenly across the bulk
(so every one of them lies in a different place of the partition). ``--rebuild`` discards
the cache.

    .venv/bin/python benchmarks/bench_store.py [--quick] [--records N] [--runs 7] [--json]
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import orjson
from _harness import Bench, Target, bench_from_args, parser, quiet_logs, scratch_dir
from attrs import frozen

from eventlane.app import App, Runtime
from eventlane.codec import Envelope
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.log import LogStore
from eventlane.log.types import Cursor

TOPIC = "bench-accounts"
TARGET = "bench-target"
TARGET_EVENTS = 100
BULK_CALL = 20_000  # records per LogStore.append call while building (split in ~1 MiB batches)


@event("Deposited")
@frozen
class Deposited(DomainEvent):
    amount: Decimal
    memo: str


class BenchAccount(Aggregate):
    topic: ClassVar[str] = TOPIC
    balance: Decimal
    deposits: int

    def init_state(self) -> None:
        self.balance = Decimal(0)
        self.deposits = 0

    def deposit(self, amount: Decimal, memo: str) -> None:
        self.record_that(Deposited(amount, memo))

    @applies(Deposited)
    def _deposited(self, e: Deposited) -> None:
        self.balance += e.amount
        self.deposits += 1


def open_app(data: Path, partitions: int) -> Runtime:
    return App("bench", aggregates=[BenchAccount], partitions=partitions).open(data)


# ---------------------------------------------------------------------------------- build
_VALUE = (
    b'{"type":"Deposited","version":1,"aggregate_id":"%s","aggregate_version":%d,'
    b'"event_id":"00000000-0000-4000-8000-%012x","timestamp":"2024-05-01T12:00:00.000000+00:00",'
    b'"correlation_id":null,"causation_id":null,"data":{"amount":"%d.50","memo":"bulk"}}'
)


def bulk_records(start: int, count: int, keys: int, versions: list[int]) -> list[Any]:
    """``count`` store-format records of aggregates ``acct-<n>`` (a scrambled key order),
    with per-aggregate versions continuing from ``versions``."""
    out = []
    for i in range(start, start + count):
        k = (i * 7_919) % keys
        versions[k] += 1
        key = b"acct-%07d" % k
        value = _VALUE % (key, versions[k], i, i % 1000)
        headers = (
            ("event-type", b"Deposited"),
            ("event-version", b"1"),
            ("event-id", b"00000000-0000-4000-8000-%012x" % i),
        )
        out.append((key, value, headers, None))
    return out


def build(data: Path, records: int, partitions: int, keys: int) -> None:
    """Bulk records plus the target's 100 single-event saves spread among them."""
    print(f"building {records:,} records in {data} (cached for the next runs)...", flush=True)
    t0 = time.perf_counter()
    versions = [0] * keys
    bulk = records - TARGET_EVENTS
    gap = max(1, bulk // TARGET_EVENTS)
    with open_app(data, partitions) as app:
        target = BenchAccount(TARGET)
        written = 0
        for n in range(TARGET_EVENTS):
            goal = min(bulk, (n + 1) * gap) if n < TARGET_EVENTS - 1 else bulk
            while written < goal:
                chunk = min(BULK_CALL, goal - written)
                batch = bulk_records(written, chunk, keys, versions)
                by_partition: dict[int, list[Any]] = {}
                for record in batch:
                    p = app.store.partition_of(TOPIC, record[0].decode())
                    by_partition.setdefault(p, []).append(record)
                for p, rows in by_partition.items():
                    app.log.append(TOPIC, p, rows)
                written += chunk
            target.deposit(Decimal("10.25"), f"target deposit {n}")
            app.save(target)  # indexes the bulk appended since the previous save
            if n % 10 == 9:
                print(
                    f"  {written + n + 1:,} records, {time.perf_counter() - t0:.0f} s", flush=True
                )
        for p in range(partitions):  # index the tail of partitions the target is not in
            index = app.log.keys.index(TOPIC, p)  # type: ignore[attr-defined]
            index.catch_up(app.log.offsets(TOPIC, p).hwm)
    (data / "bench-complete").write_text(f"{records} {partitions} {keys}\n")
    print(f"built in {time.perf_counter() - t0:.0f} s", flush=True)


def cached_data(tmp: str, records: int, partitions: int, keys: int, rebuild: bool) -> Path:
    data = Path(tmp) / f"eventlane-bench-store-{records}x{partitions}"
    marker = data / "bench-complete"
    if (
        rebuild
        or not marker.exists()
        or marker.read_text().split() != [str(records), str(partitions), str(keys)]
    ):
        shutil.rmtree(data, ignore_errors=True)
        build(data, records, partitions, keys)
    return data


# ---------------------------------------------------------------------------------- load
def scan_load(log: LogStore, app: Runtime, partition: int) -> BenchAccount:
    """Baseline: the aggregate from a full scan of its partition (no index)."""
    key = TARGET.encode()
    marks = log.offsets(TOPIC, partition)
    offset, cursor = marks.lwm, None
    mine = []
    c: Cursor | None = cursor
    while offset < marks.hwm:
        batch, c = log.read(TOPIC, partition, offset, max_bytes=4 << 20, cursor=c)
        if not batch:
            break
        mine.extend(r for r in batch if r.key == key)
        offset = batch[-1].offset + 1
    decode = app.codec.decode
    events = [decode(r.key, r.value, r.headers).event for r in mine]  # type: ignore[arg-type]
    return BenchAccount.rehydrate(TARGET, events)


def figure_load(bench: Bench, data: Path, partitions: int, scan_runs: int) -> None:
    with open_app(data, partitions) as app:
        t0 = time.perf_counter()
        first = app.load(BenchAccount, TARGET)  # opens the partition and checks its index
        bench.notes.append(
            f"first load after opening (partition + key index open, index checks, cold "
            f"caches): {(time.perf_counter() - t0) * 1e3:.0f} ms"
        )
        assert first.deposits == TARGET_EVENTS and first.version == TARGET_EVENTS
        partition = app.store.partition_of(TOPIC, TARGET)
        marks = app.log.offsets(TOPIC, partition)
        bench.notes.append(
            f"partition {partition} of {TOPIC}: {marks.hwm - marks.lwm:,} records; the target's "
            f"events are {TARGET_EVENTS} single-event batches spread across it"
        )

        def load() -> float:
            t = time.perf_counter()
            account = app.load(BenchAccount, TARGET)
            ms = (time.perf_counter() - t) * 1e3
            assert account.version == TARGET_EVENTS
            return ms

        def scan() -> float:
            t = time.perf_counter()
            account = scan_load(app.log, app, partition)  # type: ignore[arg-type]
            ms = (time.perf_counter() - t) * 1e3
            assert account.version == TARGET_EVENTS
            return ms

        for _ in range(5):  # warm the page cache and the caches of the index and codec
            load()
        # Many load samples per round (cheap), one scan per round (expensive).
        for i in range(bench.runs):
            for _ in range(max(1, scan_runs // bench.runs)):
                bench.record("scan_ms", scan())
            bench.record("load_ms", statistics.median(load() for _ in range(21)))
            print(f"  load round {i + 1}/{bench.runs} done", flush=True)
        speedups = [
            s / ld for s, ld in zip(bench.series["scan_ms"], bench.series["load_ms"], strict=False)
        ]
        bench.series["load_speedup"] = speedups
    bench.add(
        "load: 100-event aggregate, indexed",
        "ms",
        "load_ms",
        target=Target("<", 5.0),
        note="median of 21 loads per round",
    )
    bench.add("load: full-partition scan (baseline)", "ms", "scan_ms")
    bench.add("load speed-up vs scan", "x", "load_speedup", target=Target(">=", 10.0))


# ---------------------------------------------------------------------------------- saves
def figure_saves(bench: Bench, tmp: str, saves: int, batches: int) -> None:
    with scratch_dir(tmp, "store-saves") as root, open_app(root / "data", 1) as app:
        log = app.log
        log.create_topic("raw", 1, {"retention_ms": -1})
        template = Envelope(Deposited(Decimal("10.25"), "a realistic memo"), "raw-1", 1)
        key, value, headers = app.codec.encode(template)
        raw_record = (key, value, tuple(headers), None)
        counter = [0]

        def fresh(prefix: str) -> BenchAccount:
            counter[0] += 1
            return BenchAccount(f"{prefix}-{counter[0]}")

        def single_raw() -> float:
            t = time.perf_counter()
            for _ in range(saves):
                log.append("raw", 0, [raw_record])
            return saves / (time.perf_counter() - t)

        def single_store() -> float:
            account = fresh("single")
            t = time.perf_counter()
            for _ in range(saves):
                account.deposit(Decimal("10.25"), "a realistic memo")
                app.save(account)
            return saves / (time.perf_counter() - t)

        def batch_raw() -> float:
            t = time.perf_counter()
            for _ in range(batches):
                log.append("raw", 0, [raw_record] * 100, atomic=True)
            return batches * 100 / (time.perf_counter() - t)

        def batch_store() -> float:
            account = fresh("batch")
            t = time.perf_counter()
            for _ in range(batches):
                for _ in range(100):
                    account.deposit(Decimal("10.25"), "a realistic memo")
                app.save(account)
            return batches * 100 / (time.perf_counter() - t)

        bench.rounds(
            {
                "save1_raw": single_raw,
                "save1": single_store,
                "save100_raw": batch_raw,
                "save100": batch_store,
            },
            warmup=True,
        )
    bench.add(
        "save, 1 event per save",
        "ev/s",
        "save1",
        baseline="save1_raw",
        note="baseline: LogStore.append of one pre-encoded record (fsync each)",
    )
    bench.add(
        "save, 100 events per save",
        "ev/s",
        "save100",
        baseline="save100_raw",
        note="baseline: atomic LogStore.append of 100 pre-encoded records",
    )


# ---------------------------------------------------------------------------------- codec
def figure_codec(bench: Bench, count: int) -> None:
    with scratch_dir("/tmp", "store-codec") as root, open_app(root / "data", 1) as app:
        codec = app.codec
    envelopes = [
        Envelope(
            Deposited(Decimal(f"{i}.25"), f"memo number {i}"),
            f"acct-{i % 1000:07d}",
            i + 1,
            correlation_id=f"req-{i}",
        )
        for i in range(count)
    ]
    records = [codec.encode(e) for e in envelopes]
    docs = [orjson.loads(r.value) for r in records]
    values = [r.value for r in records]

    def per_event_us(fn: Any, items: Sequence[Any]) -> float:
        t = time.perf_counter()
        for item in items:
            fn(item)
        return (time.perf_counter() - t) / len(items) * 1e6

    decode = codec.decode

    bench.rounds(
        {
            "orjson_dumps_us": lambda: per_event_us(orjson.dumps, docs),
            "encode_us": lambda: per_event_us(codec.encode, envelopes),
            "orjson_loads_us": lambda: per_event_us(orjson.loads, values),
            "decode_us": lambda: per_event_us(lambda r: decode(r.key, r.value, r.headers), records),
        },
        warmup=True,
    )
    bench.add(
        "codec encode per event",
        "us",
        "encode_us",
        baseline="orjson_dumps_us",
        note="baseline: orjson.dumps of the same document as a plain dict",
    )
    bench.add(
        "codec decode per event",
        "us",
        "decode_us",
        baseline="orjson_loads_us",
        note="baseline: orjson.loads of the same bytes",
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0] if __doc__ else "bench_store")
    p.add_argument(
        "--records",
        type=int,
        default=None,
        help="records in the big topic (default 10M; --quick 200k)",
    )
    p.add_argument("--partitions", type=int, default=1, help="partitions of the big topic")
    p.add_argument("--keys", type=int, default=None, help="bulk aggregates (default records / 10)")
    p.add_argument("--scan-runs", type=int, default=5, help="full-scan baseline runs")
    p.add_argument("--rebuild", action="store_true", help="rebuild the cached big topic")
    p.add_argument("--only", choices=["load", "saves", "codec"], default=None)
    args = p.parse_args()
    records = args.records or (200_000 if args.quick else 10_000_000)
    keys = args.keys or max(1, records // 10)
    bench = bench_from_args(__file__, args, default_runs=7)
    quiet_logs()
    if args.only in (None, "load"):
        data = cached_data(args.tmp, records, args.partitions, keys, args.rebuild)
        figure_load(bench, data, args.partitions, max(args.scan_runs, bench.runs))
    if args.only in (None, "saves"):
        figure_saves(
            bench, args.tmp, saves=100 if args.quick else 1000, batches=10 if args.quick else 100
        )
    if args.only in (None, "codec"):
        figure_codec(bench, 5_000 if args.quick else 50_000)
    bench.finish()


if __name__ == "__main__":
    main()
