"""Durable appends: batched (figure 1) and single-record with and without group commit (2).

Records are 100-byte values with ~10-byte keys; topics use ``flush_policy="always"`` (the
default: one ``fdatasync`` per append call before the HWM moves). Each round runs, in order:

Figure 1, ``--records`` records per run (default 1M), ``--batch`` records per call:

* ``raw_prejoined``  baseline: the same bytes pre-joined, buffered write + fsync per MiB
* ``raw_framed``     baseline: per-record framing + CRC32C + fsync per MiB, plain loop
* ``append``         ``LogStore.append(topic, 0, batch)``, fsync per call
* ``send_batch``     ``Producer.send_batch(topic, batch)`` (keyed: murmur2 partitioner),
                     fsync per call

Figure 2, ``--sends`` records per run (default 2,000):

* ``raw_fsync``      baseline: ``os.write`` + ``os.fsync`` per record
* ``raw_fdatasync``  baseline: ``os.write`` + ``os.fdatasync`` per record (the call the log
                     makes; the ratios of figure 2 are against this one)
* ``send_sync``      ``producer.send(...).result()`` in a loop: one fsync per record
* ``send_threads``   ``--threads`` threads each doing ``send(...).result()`` in a loop: the
                     sender thread appends whatever queued meanwhile (group commit)
* ``send_async``     ``send()`` every record without waiting, then ``flush()``

Figure 1 also gives each subject's records per CPU second of this process
(``time.process_time``): the cost of the code itself, which the neighbours on a shared
machine move far less than the wall rate.

``fsync/rec`` is the number of ``append`` calls the producer made (one fdatasync each) per
record, counted by a thin pass-through wrapper around the store.

    .venv/bin/python benchmarks/bench_append.py [--quick] [--runs 7] [--json]
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from _harness import Bench, Target, bench_from_args, parser, quiet_logs, scratch_dir
from _raw import prejoined_blocks, write_framed, write_fsync_per_record, write_prejoined

from eventlane.log.embedded.store import LogStore
from eventlane.log.port import Log
from eventlane.log.producer import Producer
from eventlane.log.record import ProducerRecord

VALUE_SIZE = 100


class CountingLog:
    """Passes every call to the store; counts ``append`` calls (= fdatasyncs)."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.appends = 0

    def append(self, *args: Any, **kwargs: Any) -> Any:
        self.appends += 1
        return self.store.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def make_pool(
    count: int, batch: int, pool: int = 10, keys: int = 10_000
) -> list[list[tuple[bytes, bytes]]]:
    """``pool`` distinct batches of ``batch`` (key, value) records, cycled to make ``count``.

    Cycling a small pool keeps the benchmark's own heap small, as a producer's would be
    (it holds the batch it is sending, not the whole stream): a heap of millions of live
    tuples would make every collection of Python's cyclic GC slower for the subject only.
    """
    value = os.urandom(VALUE_SIZE)
    pool = max(1, min(pool, -(-count // batch)))
    return [
        [(b"key-%06d" % ((j * batch + i) % keys), value) for i in range(batch)] for j in range(pool)
    ]


def cycle_batches(
    pool: Sequence[Sequence[object]], count: int, batch: int
) -> list[tuple[int, int]]:
    """``(pool index, records to take)`` per call, adding up to ``count`` records."""
    calls = []
    for n, start in enumerate(range(0, count, batch)):
        calls.append((n % len(pool), min(batch, count - start)))
    return calls


class Topics:
    """Fresh single-partition topics in one store; each run writes a new one, then drops it."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        name = f"bench-{self.n}"
        self.store.create_topic(name, 1, {"flush_policy": "always"})
        return name

    def drop(self, name: str) -> None:
        self.store.delete_topic(name)


def figure1(bench: Bench, root: Path, count: int, batch: int) -> None:
    store = LogStore(root / "data")
    topics = Topics(store)
    n = count
    pool = make_pool(count, batch)
    calls = cycle_batches(pool, count, batch)
    blocks = prejoined_blocks(n, VALUE_SIZE)
    tuples = [[(k, v, (), None) for k, v in chunk] for chunk in pool]
    producer_records = [[ProducerRecord(k, v) for k, v in chunk] for chunk in pool]
    producer = Producer(store)
    raw_path = root / "raw.bin"

    def raw(write: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        write()
        rate = n / (time.perf_counter() - t0)
        raw_path.unlink()
        return rate

    def raw_prejoined() -> float:
        return raw(lambda: write_prejoined(raw_path, blocks))

    def raw_framed() -> float:
        return raw(
            lambda: write_framed(
                raw_path, itertools.chain.from_iterable(pool[j][:take] for j, take in calls)
            )
        )

    def append() -> Mapping[str, float]:
        topic = topics.fresh()
        t0, c0 = time.perf_counter(), time.process_time()
        for j, take in calls:
            store.append(topic, 0, tuples[j] if take == batch else tuples[j][:take])
        rate = {"wall": n / (time.perf_counter() - t0), "cpu": n / (time.process_time() - c0)}
        assert store.offsets(topic, 0).hwm == n
        topics.drop(topic)
        return rate

    def send_batch() -> Mapping[str, float]:
        topic = topics.fresh()
        t0, c0 = time.perf_counter(), time.process_time()
        for j, take in calls:
            producer.send_batch(
                topic, producer_records[j] if take == batch else producer_records[j][:take]
            )
        rate = {"wall": n / (time.perf_counter() - t0), "cpu": n / (time.process_time() - c0)}
        assert store.offsets(topic, 0).hwm == n
        topics.drop(topic)
        return rate

    bench.rounds(
        {
            "raw_prejoined": raw_prejoined,
            "raw_framed": raw_framed,
            "append": append,
            "send_batch": send_batch,
        },
        warmup=True,
    )
    store.close()
    target = Target(">=", 1_000_000)
    bench.add("1. baseline: pre-joined write + fsync/MiB", "rec/s", "raw_prejoined")
    bench.add("1. baseline: framing + CRC32C + fsync/MiB loop", "rec/s", "raw_framed")
    for series, label in (
        ("append", f"LogStore.append, {batch}/call"),
        ("send_batch", f"Producer.send_batch, {batch}/call"),
    ):
        bench.add(
            f"1. {label} vs pre-joined",
            "rec/s",
            f"{series}.wall",
            baseline="raw_prejoined",
            target=target,
        )
        bench.add(
            f"1. {label} vs framed loop",
            "rec/s",
            f"{series}.wall",
            baseline="raw_framed",
            target=target,
        )
    bench.add(
        "1. Producer.send_batch vs LogStore.append",
        "rec/s",
        "send_batch.wall",
        baseline="append.wall",
    )
    # records per CPU second of this process: what the code costs, whatever the neighbours
    # take of the two cores (the wall rates above move 2-3x with them)
    bench.add("1. LogStore.append, per CPU second", "rec/s", "append.cpu")
    bench.add(
        "1. Producer.send_batch, per CPU second",
        "rec/s",
        "send_batch.cpu",
        baseline="append.cpu",
        target=target,
    )


def figure2(bench: Bench, root: Path, sends: int, threads: int) -> None:
    store = LogStore(root / "data2")
    topics = Topics(store)
    key, value = b"key-000001", os.urandom(VALUE_SIZE)
    raw_path = root / "raw-per-record.bin"

    def raw_sync(datasync: bool) -> float:
        t0 = time.perf_counter()
        write_fsync_per_record(raw_path, key, value, sends, datasync=datasync)
        rate = sends / (time.perf_counter() - t0)
        raw_path.unlink()
        return rate

    def run(body: Callable[[Producer, str], None]) -> Mapping[str, float]:
        topic = topics.fresh()
        counting = CountingLog(store)
        producer = Producer(cast(Log, counting))
        producer.send(topic, value, key=key).result()  # start the sender thread
        counting.appends = 0
        t0 = time.perf_counter()
        body(producer, topic)
        rate = sends / (time.perf_counter() - t0)
        producer.close()
        assert store.offsets(topic, 0).hwm == sends + 1
        topics.drop(topic)
        return {"rate": rate, "fsyncs_per_record": counting.appends / sends}

    def send_sync() -> Mapping[str, float]:
        def body(producer: Producer, topic: str) -> None:
            for _ in range(sends):
                producer.send(topic, value, key=key).result()

        return run(body)

    def send_threads() -> Mapping[str, float]:
        def body(producer: Producer, topic: str) -> None:
            def worker(count: int) -> None:
                for _ in range(count):
                    producer.send(topic, value, key=key).result()

            shares = [sends // threads + (1 if i < sends % threads else 0) for i in range(threads)]
            workers = [threading.Thread(target=worker, args=(c,)) for c in shares]
            for w in workers:
                w.start()
            for w in workers:
                w.join()

        return run(body)

    def send_async() -> Mapping[str, float]:
        def body(producer: Producer, topic: str) -> None:
            futures = [producer.send(topic, value, key=key) for _ in range(sends)]
            producer.flush()
            assert all(f.done() for f in futures)

        return run(body)

    bench.rounds(
        {
            "raw_fsync": lambda: raw_sync(False),
            "raw_fdatasync": lambda: raw_sync(True),
            "send_sync": send_sync,
            "send_threads": send_threads,
            "send_async": send_async,
        },
        warmup=True,
    )
    store.close()
    bench.add("2. baseline: write + fsync per record", "rec/s", "raw_fsync")
    bench.add("2. baseline: write + fdatasync per record", "rec/s", "raw_fdatasync")
    bench.add(
        "2. send().result() loop (fsync per call)",
        "rec/s",
        "send_sync.rate",
        baseline="raw_fdatasync",
    )
    bench.add("2.   fsyncs per record", "fsync/rec", "send_sync.fsyncs_per_record")
    bench.add(
        f"2. group commit: {threads} threads send().result()",
        "rec/s",
        "send_threads.rate",
        baseline="raw_fdatasync",
    )
    bench.add("2.   fsyncs per record", "fsync/rec", "send_threads.fsyncs_per_record")
    bench.add(
        "2. group commit: send() x N then flush()",
        "rec/s",
        "send_async.rate",
        baseline="raw_fdatasync",
    )
    bench.add("2.   fsyncs per record", "fsync/rec", "send_async.fsyncs_per_record")


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=None, help="figure 1 records per run")
    p.add_argument("--batch", type=int, default=10_000, help="figure 1 records per call")
    p.add_argument("--sends", type=int, default=None, help="figure 2 records per run")
    p.add_argument("--threads", type=int, default=8, help="figure 2 sender threads")
    p.add_argument("--only", choices=("1", "2"), default=None, help="one figure only")
    args = p.parse_args(argv)
    records = args.records or (100_000 if args.quick else 1_000_000)
    sends = args.sends or (300 if args.quick else 2_000)
    quiet_logs()
    bench = bench_from_args(__file__, args, default_runs=7)
    bench.notes.append(
        f"figure 1: {records:,} records/run of {VALUE_SIZE} B values, "
        f"~10 B keys, {args.batch:,} per call; figure 2: {sends:,} sends/run"
    )
    with scratch_dir(args.tmp, "append") as root:
        if args.only in (None, "1"):
            figure1(bench, root, records, args.batch)
        if args.only in (None, "2"):
            figure2(bench, root, sends, args.threads)
    bench.finish()


if __name__ == "__main__":
    main()
