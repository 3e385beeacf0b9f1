"""Sequential reads with CRC verification (figure 3).

One partition of ``--records`` records (default 2M; 100-byte values, ~10-byte keys,
written 10k per append) is read end to end, page cache warm. Each round runs, in order:

* ``raw``         baseline: read the same segment files in 1 MiB chunks, check each batch's
                  CRC32C and parse every record into an ``(offset, key, value)`` tuple, in a
                  plain Python loop (:func:`_raw.read_parse`)
* ``store_read``  ``LogStore.read(topic, 0, offset, cursor=cursor)`` in a loop (1 MiB
                  fetches, CRC checked, ``Record`` objects)
* ``poll``        the free consumer: ``assign`` + ``seek_to_beginning`` then
                  ``poll(max_records=--max-records)`` until every record was returned

    .venv/bin/python benchmarks/bench_read.py [--quick] [--runs 5] [--json]
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from _harness import Bench, Target, bench_from_args, parser, quiet_logs, scratch_dir
from _raw import read_parse

from eventlane.consumer.free import Consumer
from eventlane.log.embedded.segment import list_segment_bases, log_path
from eventlane.log.embedded.store import LogStore
from eventlane.log.record import TopicPartition

VALUE_SIZE = 100
TOPIC = "reads"


def fill(store: LogStore, count: int, batch: int = 10_000) -> None:
    store.create_topic(TOPIC, 1, {"flush_policy": "always"})
    value = os.urandom(VALUE_SIZE)
    for start in range(0, count, batch):
        store.append(
            TOPIC,
            0,
            [
                (b"key-%06d" % (i % 10_000), value, (), None)
                for i in range(start, min(start + batch, count))
            ],
        )


def figure3(bench: Bench, root: Path, count: int, max_records: int) -> None:
    store = LogStore(root / "data")
    fill(store, count)
    part_dir = store.partition(TOPIC, 0).dir
    segments = [log_path(part_dir, b) for b in list_segment_bases(part_dir)]
    tp = TopicPartition(TOPIC, 0)

    def raw() -> float:
        t0 = time.perf_counter()
        got = read_parse(segments, verify_crc=True)
        rate = got / (time.perf_counter() - t0)
        assert got == count, (got, count)
        return rate

    def store_read() -> float:
        t0 = time.perf_counter()
        offset, cursor, got = 0, None, 0
        while True:
            records, cursor = store.read(TOPIC, 0, offset, cursor=cursor)
            if not records:
                break
            got += len(records)
            offset = records[-1].offset + 1
        rate = got / (time.perf_counter() - t0)
        assert got == count, (got, count)
        return rate

    def poll() -> float:
        consumer = Consumer(store, auto_offset_reset="earliest", max_poll_records=max_records)
        consumer.assign([tp])
        t0 = time.perf_counter()
        consumer.seek_to_beginning()
        got = 0
        while got < count:
            got += len(consumer.poll(0.0))
        rate = got / (time.perf_counter() - t0)
        consumer.close()
        assert got == count, (got, count)
        return rate

    bench.rounds({"raw": raw, "store_read": store_read, "poll": poll}, warmup=True)
    store.close()
    target = Target(">=", 1_000_000)
    bench.add("3. baseline: read + parse + CRC32C loop", "rec/s", "raw")
    bench.add(
        "3. LogStore.read loop (CRC checked)", "rec/s", "store_read", baseline="raw", target=target
    )
    bench.add(
        f"3. Consumer.poll loop, max_records={max_records}",
        "rec/s",
        "poll",
        baseline="raw",
        target=target,
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=None, help="records in the partition")
    p.add_argument(
        "--max-records",
        type=int,
        default=500,
        help="Consumer max_poll_records (Kafka's default is 500)",
    )
    args = p.parse_args(argv)
    count = args.records or (200_000 if args.quick else 2_000_000)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    bench.notes.append(
        f"{count:,} records of {VALUE_SIZE} B values, ~10 B keys, one partition, page cache warm"
    )
    with scratch_dir(args.tmp, "read") as root:
        figure3(bench, root, count, args.max_records)
    bench.finish()


if __name__ == "__main__":
    main()
