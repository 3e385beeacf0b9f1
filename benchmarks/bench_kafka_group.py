"""Group consume per member on a real Kafka cluster: eventlane's ``GroupConsumer`` on a
``KafkaLog`` vs a raw confluent-kafka ``Consumer`` in a group, same run (issue 33's bar:
>= 0.8x).

Both sides are the only member of a fresh group on the same 4-partition topic (100-byte
values, ``--records`` in all), start from the earliest offset, and read every record of
every partition: the raw side ``subscribe`` + ``consume(500)`` into the (offset, timestamp,
key, value, headers) tuples a caller keeps of each message; eventlane's side ``poll()``
into ``Record``\\ s, ``max_poll_records=500``, auto commit off on both. The clock starts when
the member's partitions are assigned (the join, the same ~3 s group start on both, is left
out) and stops at the last record. The two sides alternate which goes first each round.

The ``ratio`` row is the per-round eventlane/raw ratio of records/s; the ``CPU`` rows are
the calling thread's CPU per record (``time.thread_time``; librdkafka's own threads, alike
on both sides, are not in it).

    .venv/bin/python benchmarks/bench_kafka_group.py [--cluster DIR] [--runs 5] [--quick]
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from _harness import Target, bench_from_args, parser, quiet_logs, scratch_dir
from confluent_kafka import Consumer

from eventlane.consumer.group import GroupConsumer
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.types import RecordTuple

VALUE = b"v" * 100
PARTITIONS = 4


def raw_side(bootstrap: str, topic: str, count: int) -> tuple[float, float]:
    """records/s and caller CPU us/record of a raw confluent-kafka group member."""
    assigned: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
        }
    )
    try:
        consumer.subscribe([topic], on_assign=lambda _c, _p: assigned.append(time.perf_counter()))
        out: list[tuple[Any, ...]] = []
        c0 = 0.0
        while len(out) < count:
            messages = consumer.consume(num_messages=500, timeout=1.0)
            if assigned and not c0:
                c0 = time.thread_time()
            for m in messages:
                if m.error() is None:
                    out.append((m.offset(), m.timestamp(), m.key(), m.value(), m.headers()))
        t1, c1 = time.perf_counter(), time.thread_time()
    finally:
        consumer.close()
    return count / (t1 - assigned[0]), 1e6 * (c1 - c0) / count


def eventlane_side(log: KafkaLog, topic: str, count: int) -> tuple[float, float]:
    """records/s and caller CPU us/record of a ``GroupConsumer`` member on ``log``."""
    assigned: list[float] = []
    member = GroupConsumer(
        log,
        group_id=f"evl-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_records=500,
        on_assigned=lambda _tps: assigned.append(time.perf_counter()),
    )
    try:
        got = 0
        c0 = 0.0
        while got < count:
            records = member.poll(1.0)
            if assigned and not c0:
                c0 = time.thread_time()
            got += len(records)
        t1, c1 = time.perf_counter(), time.thread_time()
    finally:
        member.close()
    assert got == count, (got, count)
    return count / (t1 - assigned[0]), 1e6 * (c1 - c0) / count


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--cluster", help="reuse the cluster `eventlane kafka up --dir DIR` started")
    p.add_argument("--records", type=int, default=None, help="records in the topic (80,000)")
    args = p.parse_args()
    bench = bench_from_args(__file__, args)
    quiet_logs()
    count = args.records or (8_000 if args.quick else 80_000)
    with (
        scratch_dir(args.tmp, "kafka-group") as tmp,
        LocalKafkaCluster.running(args.cluster, tmp) as cluster,
        KafkaLog(cluster.bootstrap, namespace=f"bench{uuid.uuid4().hex[:6]}") as kl,
    ):
        kl.create_topic("g", PARTITIONS)
        batch: list[RecordTuple] = [(None, VALUE, (), None)] * 500
        for i in range(count // 500):
            kl.append("g", i % PARTITIONS, batch)
        full = f"{kl.namespace}.g"
        flip = [False]

        def measure() -> dict[str, float]:
            sides = {
                "raw": lambda: raw_side(cluster.bootstrap, full, count),
                "evl": lambda: eventlane_side(kl, "g", count),
            }
            order = ["evl", "raw"] if flip[0] else ["raw", "evl"]
            flip[0] = not flip[0]
            out: dict[str, float] = {}
            for name in order:
                rate, cpu = sides[name]()
                out[name], out[f"{name}.cpu"] = rate, cpu
            out["ratio"] = out["evl"] / out["raw"]
            out["cpu.ratio"] = out["raw.cpu"] / out["evl.cpu"]
            return out

        bench.rounds({"group": measure}, warmup=True)
    bench.add(
        "group member, eventlane GroupConsumer", "records/s", "group.evl", baseline="group.raw"
    )
    bench.add("group member, raw confluent-kafka", "records/s", "group.raw")
    bench.add("eventlane / raw, per round", "x", "group.ratio", target=Target(">=", 0.8))
    bench.add("eventlane caller CPU", "us/record", "group.evl.cpu")
    bench.add("raw caller CPU", "us/record", "group.raw.cpu")
    bench.add("CPU ratio raw/eventlane, per round", "x", "group.cpu.ratio")
    bench.notes.append(
        f"{count} records of 100 B on {PARTITIONS} partitions, one member per group, from the"
        " earliest offset; 3 KRaft brokers (combined nodes) on 127.0.0.1 of one shared 2-core"
        " machine, replication 3"
    )
    bench.finish()


if __name__ == "__main__":
    main()
