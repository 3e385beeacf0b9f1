"""Spark reading a Kafka topic: eventlane's data source (each task reads its offset range
through confluent-kafka, ``KafkaLog``) against Spark's own Kafka source (``format("kafka")``,
the JVM's kafka-clients), same session, same topic, same run.

The bench starts its own 3-broker cluster (``--cluster DIR`` reuses one started by
``eventlane kafka up --dir DIR``), writes ``--records`` records (100-byte values, keys of 10
bytes) to a topic of 4 partitions, then per round, interleaved, runs the same job through
each source: read every record from the low-water marks and aggregate count, total value
bytes, and ``sum(xxhash64(partition, offset, key, value))``. Both sources must give the same
three numbers (checked every round: a rebuild from either would see the same records); the
table gives each source's records/s (session start excluded) and their ratio.

Spark's source needs ``make spark-kafka-jars`` (tools/spark-kafka/lib: the connector for
Spark 4.2.0, the newest on Maven Central, beside the installed pyspark).

    .venv/bin/python benchmarks/bench_kafka_spark.py [--quick] [--runs 5] [--records N]
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from _harness import Target, bench_from_args, parser, quiet_logs, scratch_dir
from confluent_kafka import Producer

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.replay.session import spark_session

JARS = Path(__file__).resolve().parent.parent / "tools" / "spark-kafka" / "lib"
PARTITIONS = 4


def fill(bootstrap: str, kname: str, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "enable.idempotence": True}
    )
    for i in range(count):
        producer.produce(kname, b"v" * 100, b"key-%06d" % (i % 50_000), partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def job(frame: Any) -> tuple[int, int, int]:
    from pyspark.sql import functions as F  # noqa: PLC0415, N812

    row = frame.agg(
        F.count("*"),
        F.sum(F.length("value")),
        F.sum(F.xxhash64("partition", "offset", "key", "value").cast("decimal(38,0)")),
    ).collect()[0]
    return int(row[0]), int(row[1]), int(row[2])


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--cluster", help="reuse the cluster `eventlane kafka up --dir DIR` started")
    p.add_argument("--records", type=int, default=None)
    args = p.parse_args()
    bench = bench_from_args(__file__, args)
    quiet_logs()
    count = args.records or (20_000 if args.quick else 200_000)
    jars = sorted(str(j) for j in JARS.glob("*.jar"))
    if not jars:
        raise SystemExit(f"no jars in {JARS}: run `make spark-kafka-jars`")
    with (
        scratch_dir(args.tmp, "kafka-spark") as tmp,
        LocalKafkaCluster.running(args.cluster, tmp) as cluster,
    ):
        namespace = f"bench{uuid.uuid4().hex[:6]}"
        with KafkaLog(cluster.bootstrap, namespace=namespace) as log:
            log.create_topic("events", PARTITIONS)
        kname = f"{namespace}.events"
        fill(cluster.bootstrap, kname, count)
        spark = spark_session(
            "local[2]",
            {"spark.jars": ",".join(jars), "spark.driver.memory": "1g"},
            app_name="bench-kafka-spark",
        )
        url = f"{cluster.url}?namespace={namespace}"

        def ours() -> Any:
            return spark.read.format("eventlane").option("log", url).option(
                "topic", "events"
            ).load()  # fmt: skip

        def theirs() -> Any:
            return (
                spark.read.format("kafka")
                .option("kafka.bootstrap.servers", cluster.bootstrap)
                .option("subscribe", kname)
                .option("startingOffsets", "earliest")
                .option("endingOffsets", "latest")
                .load()
            )

        answers: dict[str, set[tuple[int, int, int]]] = {"ours": set(), "theirs": set()}

        def timed(name: str, frame: Any) -> float:
            t0 = time.perf_counter()
            answers[name].add(job(frame()))
            return count / (time.perf_counter() - t0)

        try:
            bench.rounds(
                {
                    "ours": lambda: timed("ours", ours),
                    "theirs": lambda: timed("theirs", theirs),
                },
                warmup=True,
            )
        finally:
            spark.stop()
    assert answers["ours"] == answers["theirs"] and len(answers["ours"]) == 1, answers
    assert next(iter(answers["ours"]))[0] == count
    bench.series["ratio"] = [
        a / b for a, b in zip(bench.series["ours"], bench.series["theirs"], strict=True)
    ]
    bench.add("eventlane data source (confluent-kafka)", "records/s", "ours", baseline="theirs")
    bench.add("Spark's Kafka source (kafka-clients)", "records/s", "theirs")
    bench.add("ratio eventlane/Spark's", "x", "ratio", target=Target(">=", 1.0))
    bench.notes.append(
        f"{count} records of 100 bytes in {PARTITIONS} partitions; local[2]; the same"
        " count, bytes and xxhash64 sum from both sources in every round; 3 KRaft brokers"
        " on 127.0.0.1 of the same shared 2-core machine"
    )
    bench.finish()


if __name__ == "__main__":
    main()
