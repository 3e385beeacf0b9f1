"""The Kafka protocol's cost: confluent-kafka through ``eventlane serve --kafka`` against
eventlane's own producer and consumer on the same machine, in the same run.

100-byte values, ~10-byte keys, one partition. Each round runs, in order:

* ``own_produce``  baseline: eventlane's ``Producer.send_batch`` of the same records in
                   10k batches (durable: fsync per batch), into a fresh topic
* ``kafka_produce`` confluent-kafka ``Producer`` (acks=all, linger.ms=5, murmur2) through a
                   real listener process, until every delivery report arrived
* ``own_consume``  baseline: eventlane's free ``Consumer.poll`` of the topic end to end
* ``kafka_consume`` confluent-kafka ``Consumer`` (assign, from offset 0) of the same topic,
                   set up for throughput (:data:`CONSUMER_CONFIG`: 8 MiB partition fetches,
                   a deep prefetch queue, ``consume(10_000)`` batches)

* ``kcat_produce`` / ``kcat_consume``: the same records through ``kcat`` (librdkafka driven
                   from C, the library confluent-kafka wraps: a few hundred ns of client CPU
                   a record, against the Python client's 1-4 us), so that the rate measures
                   the server rather than the client: ``kcat -P -l FILE`` (acks=all,
                   linger.ms=5, keys split at a tab; the values are 100 printable bytes,
                   since kcat reads lines) into a fresh topic, then ``kcat -C -o beginning
                   -c N -e`` of it with :data:`CONSUMER_CONFIG`'s fetch and queue settings,
                   printing one byte a record (counted: every record must arrive). Skipped
                   (with a note) where ``kcat`` is not installed.

With ``--apache-kafka`` each round also runs the confluent-kafka and kcat figures against a
one-node Apache Kafka broker (KRaft, ``eventlane kafka up --nodes 1``'s set-up, the jars
under ``tools/kafka/lib``) started by the benchmark: the same client, the same records,
the same settings, so the listener/Kafka ratio compares two servers that one client uses.
(Kafka leaves flushing to the OS page cache; the listener's log fsyncs each produce.)

Beside each confluent-kafka rate: the listener's CPU per record (``listener_us``, from the
listener process's CPU times) and the client's own ceiling (``client_ceiling``: records per
second of the benchmark process's CPU, librdkafka's threads included): what the client could
do with a core to itself and a listener that cost nothing. On a 2-core machine the two
processes share the cores, so the rate is bounded by roughly ``1 / (listener_us +
client_us)``. For kcat, ``client_us`` is the kcat process's own CPU per record (its
``rusage``).

    .venv/bin/python benchmarks/bench_kafka.py [--quick] [--runs 5] [--json] [--apache-kafka]
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil
from _harness import Bench, Measure, bench_from_args, parser, quiet_logs, scratch_dir
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from eventlane.consumer.free import Consumer
from eventlane.log.embedded.store import LogStore
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.producer import Producer, ProducerRecord
from eventlane.log.record import TopicPartition

VALUE = os.urandom(100)

CONSUMER_CONFIG: dict[str, object] = {
    "group.id": "bench",
    "enable.auto.commit": False,
    "enable.partition.eof": False,
    # a backlog read: answer a fetch as soon as anything is there (waiting for more only
    # delays the last fetch), but let each fetch carry many batches
    "fetch.min.bytes": 1,
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 8 << 20,
    # prefetch: librdkafka's fetcher thread keeps this much queued ahead of the application
    "queued.min.messages": 1_000_000,
    "queued.max.messages.kbytes": 256 << 10,
}
"""The consumer's settings for throughput, the same against the listener and Apache Kafka;
records are taken with ``consume(num_messages=10_000)``, not one ``poll()`` each."""

KCAT = shutil.which("kcat")
"""librdkafka's command-line client (``kcat``, formerly kafkacat), if installed."""

KCAT_PRODUCER = ("linger.ms=5", "acks=all", "queue.buffering.max.messages=1000000")
"""kcat's producer settings: the confluent-kafka producer's (``-X``)."""
KCAT_CONSUMER = tuple(
    f"{k}={v}" for k, v in CONSUMER_CONFIG.items() if k.startswith(("fetch.", "max.", "queued."))
)
"""kcat's consumer settings: :data:`CONSUMER_CONFIG`'s fetch sizes and prefetch queue."""


def kcat(args: Sequence[str], stdout: int | None = None) -> tuple[bytes, float]:
    """Run kcat with ``args``; its standard output (``stdout=subprocess.PIPE``) and the CPU
    seconds it used (user + system, from the reaped child's ``rusage``). Raises on failure."""
    assert KCAT is not None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [KCAT, *args], stdout=stdout, stderr=subprocess.PIPE, timeout=300, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"kcat {' '.join(args)}: exit {done.returncode}: {done.stderr!r}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout or b"", cpu


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_listener(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from eventlane.cli import main; main()",
            "--data",
            str(data),
            "serve",
            "--kafka",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("listener did not start")


def figures(bench: Bench, root: Path, count: int, apache: bool) -> None:
    data = root / "data"
    store = LogStore(data)
    proc, bootstrap = start_listener(data)
    listener = psutil.Process(proc.pid)
    cluster = LocalKafkaCluster.create(root / "apache-kafka", nodes=1) if apache else None
    if cluster is not None:
        cluster.start()

    def cpu_s(server: psutil.Process | None) -> tuple[float, float]:
        if server is None:
            return time.process_time(), 0.0
        times = server.cpu_times()
        return time.process_time(), times.user + times.system

    def costs(
        rate: float, got: int, before: tuple[float, float], server: psutil.Process | None
    ) -> Mapping[str, float]:
        client, served = (b - a for a, b in zip(before, cpu_s(server), strict=True))
        return {
            "rate": rate,
            "client_ceiling": got / max(client, 1e-9),
            "server_us": served / max(got, 1) * 1e6,
        }

    keys = [b"key-%06d" % (i % 10_000) for i in range(count)]
    rounds = iter(range(1_000_000))
    topics: dict[str, str] = {}

    def new_topic(name: str, on_apache: bool = False) -> str:
        """A fresh one-partition topic for this round; ``topics[name]`` names it for the
        round's consumer."""
        topic = f"{name}-{next(rounds)}"
        if on_apache:
            assert cluster is not None
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            for done in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                done.result(60)
        else:
            store.create_topic(topic, 1)
        topics[name] = topic
        return topic

    def own_produce() -> float:
        topic = new_topic("own")
        producer = Producer(store)
        t0 = time.perf_counter()
        for start in range(0, count, 10_000):
            producer.send_batch(
                topic, [ProducerRecord(k, VALUE) for k in keys[start : start + 10_000]], partition=0
            )
        return count / (time.perf_counter() - t0)

    def ck_produce(server: str, topic: str, process: psutil.Process | None) -> Mapping[str, float]:
        acked = [0]
        errors: list[object] = []

        def delivered(err: object, msg: object) -> None:
            if err is None:
                acked[0] += 1
            elif not errors:
                errors.append(err)

        producer = CKProducer(
            {
                "bootstrap.servers": server,
                "acks": "all",
                "linger.ms": 5,
                "partitioner": "murmur2_random",
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        before = cpu_s(process)
        t0 = time.perf_counter()
        for k in keys:
            producer.produce(topic, key=k, value=VALUE, partition=0, on_delivery=delivered)
            producer.poll(0)
        producer.flush(120)
        rate = acked[0] / (time.perf_counter() - t0)
        assert acked[0] == count, (acked[0], count, errors)
        return costs(rate, acked[0], before, process)

    def kafka_produce() -> Mapping[str, float]:
        return ck_produce(bootstrap, new_topic("ck"), listener)

    def apache_produce() -> Mapping[str, float]:
        assert cluster is not None
        topic = new_topic("ak", on_apache=True)
        return ck_produce(cluster.bootstrap, topic, psutil.Process(cluster.nodes[0].pid))

    def own_consume() -> float:
        consumer = Consumer(store, auto_offset_reset="earliest", max_poll_records=500)
        consumer.assign([TopicPartition(topics["own"], 0)])
        consumer.seek_to_beginning()
        got = 0
        t0 = time.perf_counter()
        while got < count:
            got += len(consumer.poll(0.0))
        rate = got / (time.perf_counter() - t0)
        consumer.close()
        return rate

    def ck_consume(server: str, topic: str, process: psutil.Process | None) -> Mapping[str, float]:
        consumer = CKConsumer({"bootstrap.servers": server, **CONSUMER_CONFIG})
        consumer.assign([CKTopicPartition(topic, 0, 0)])
        got = 0
        before = cpu_s(process)
        t0 = time.perf_counter()
        while got < count:
            msgs = consumer.consume(10_000, 1.0)
            got += sum(1 for m in msgs if m.error() is None)
        rate = got / (time.perf_counter() - t0)
        result = costs(rate, got, before, process)
        consumer.close()
        return result

    def kafka_consume() -> Mapping[str, float]:
        return ck_consume(bootstrap, topics["ck"], listener)

    def apache_consume() -> Mapping[str, float]:
        assert cluster is not None
        return ck_consume(cluster.bootstrap, topics["ak"], psutil.Process(cluster.nodes[0].pid))

    lines = root / "kcat-records.txt"
    kcat_value = (b"v" * len(VALUE)).decode()
    lines.write_text("".join(f"{k.decode()}\t{kcat_value}\n" for k in keys))

    def kcat_produce(server: str, topic: str, process: psutil.Process) -> Mapping[str, float]:
        before = cpu_s(process)
        t0 = time.perf_counter()
        _, client = kcat(
            ["-P", "-b", server, "-t", topic, "-p", "0", "-K", "\t", "-q"]
            + [a for x in KCAT_PRODUCER for a in ("-X", x)]
            + ["-l", str(lines)]
        )
        rate = count / (time.perf_counter() - t0)
        return {**costs(rate, count, before, process), "client_us": client / count * 1e6}

    def kcat_consume(server: str, topic: str, process: psutil.Process) -> Mapping[str, float]:
        before = cpu_s(process)
        t0 = time.perf_counter()
        out, client = kcat(
            ["-C", "-b", server, "-t", topic, "-p", "0", "-o", "beginning", "-c", str(count)]
            + ["-e", "-q", "-f", "."]
            + [a for x in KCAT_CONSUMER for a in ("-X", x)],
            stdout=subprocess.PIPE,
        )
        rate = len(out) / (time.perf_counter() - t0)
        assert len(out) == count, (len(out), count)  # every produced record read back
        return {**costs(rate, count, before, process), "client_us": client / count * 1e6}

    def listener_kcat_produce() -> Mapping[str, float]:
        return kcat_produce(bootstrap, new_topic("kc"), listener)

    def listener_kcat_consume() -> Mapping[str, float]:
        return kcat_consume(bootstrap, topics["kc"], listener)

    def apache_kcat_produce() -> Mapping[str, float]:
        assert cluster is not None
        topic = new_topic("akc", on_apache=True)
        return kcat_produce(cluster.bootstrap, topic, psutil.Process(cluster.nodes[0].pid))

    def apache_kcat_consume() -> Mapping[str, float]:
        assert cluster is not None
        broker = psutil.Process(cluster.nodes[0].pid)
        return kcat_consume(cluster.bootstrap, topics["akc"], broker)

    steps: dict[str, Measure] = {
        "own_produce": own_produce,
        "kafka_produce": kafka_produce,
        "own_consume": own_consume,
        "kafka_consume": kafka_consume,
    }
    if KCAT is not None:
        steps.update(kcat_produce=listener_kcat_produce, kcat_consume=listener_kcat_consume)
    if cluster is not None:
        steps.update(apache_produce=apache_produce, apache_consume=apache_consume)
        if KCAT is not None:
            steps.update(
                apache_kcat_produce=apache_kcat_produce, apache_kcat_consume=apache_kcat_consume
            )
    try:
        bench.rounds(steps, warmup=False)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        store.close()
        if cluster is not None:
            cluster.stop()
    bench.add("eventlane Producer.send_batch (10k batches, fsync each)", "rec/s", "own_produce")
    bench.add(
        "confluent-kafka produce via serve --kafka (acks=all)",
        "rec/s",
        "kafka_produce.rate",
        baseline="own_produce",
    )
    bench.add(
        "  its client's ceiling (records / client CPU s)",
        "rec/s",
        "kafka_produce.client_ceiling",
        baseline="own_produce",
    )
    bench.add("  the listener's CPU per record", "us", "kafka_produce.server_us")
    bench.add("eventlane Consumer.poll", "rec/s", "own_consume")
    bench.add(
        "confluent-kafka consume via serve --kafka",
        "rec/s",
        "kafka_consume.rate",
        baseline="own_consume",
    )
    bench.add(
        "  its client's ceiling (records / client CPU s)",
        "rec/s",
        "kafka_consume.client_ceiling",
        baseline="own_consume",
    )
    bench.add("  the listener's CPU per record", "us", "kafka_consume.server_us")
    if KCAT is not None:
        for op, base, verb in (
            ("produce", "own_produce", "produce (acks=all)"),
            ("consume", "own_consume", "consume"),
        ):
            bench.add(f"kcat {verb} via serve --kafka", "rec/s", f"kcat_{op}.rate", baseline=base)
            bench.add(f"  the listener's CPU per record (kcat {op})", "us", f"kcat_{op}.server_us")
            bench.add(f"  kcat's own CPU per record ({op})", "us", f"kcat_{op}.client_us")
    else:
        bench.notes.append("kcat is not installed: its figures are left out")
    if cluster is None:
        return
    for op, verb in (("produce", "produce (acks=all)"), ("consume", "consume")):
        bench.add(
            f"confluent-kafka {verb} from Apache Kafka (1 node)", "rec/s", f"apache_{op}.rate"
        )
        bench.add(
            f"  the listener's {op} rate / Apache Kafka's",
            "rec/s",
            f"kafka_{op}.rate",
            baseline=f"apache_{op}.rate",
        )
        bench.add(f"  the broker's CPU per record ({op})", "us", f"apache_{op}.server_us")
    if KCAT is None:
        return
    for op, verb in (("produce", "produce (acks=all)"), ("consume", "consume")):
        bench.add(f"kcat {verb} from Apache Kafka (1 node)", "rec/s", f"apache_kcat_{op}.rate")
        bench.add(
            f"  the listener's kcat {op} rate / Apache Kafka's",
            "rec/s",
            f"kcat_{op}.rate",
            baseline=f"apache_kcat_{op}.rate",
        )
        bench.add(f"  the broker's CPU per record (kcat {op})", "us", f"apache_kcat_{op}.server_us")
        bench.add(f"  kcat's own CPU per record ({op}, Kafka)", "us", f"apache_kcat_{op}.client_us")


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=None, help="records per round")
    p.add_argument(
        "--apache-kafka",
        action="store_true",
        help="also measure the same client against a one-node Apache Kafka broker",
    )
    args = p.parse_args(argv)
    count = args.records or (20_000 if args.quick else 200_000)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    bench.notes.append(f"{count:,} records of 100 B values, ~10 B keys, one partition")
    with scratch_dir(args.tmp, "kafka") as root:
        figures(bench, root, count, args.apache_kafka)
    bench.finish()


if __name__ == "__main__":
    main()
