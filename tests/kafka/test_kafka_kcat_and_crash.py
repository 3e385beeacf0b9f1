"""kcat (Debian's package) against the listener, and a kill -9 of the listener during a
producer's run: every record the client saw acknowledged (acks=all) is in the log after a
restart (the oracle is the client's own delivery reports)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

from confluent_kafka import Producer

from eventlane.log import LogStore
from tests.kafka.conftest import KafkaProcess, free_port

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


def test_kcat_metadata_produce_and_consume(kafka) -> None:
    assert KCAT is not None, "kcat is missing: `make test` installs it (apt-get install kcat)"
    LogStore(kafka.data).create_topic("kcat", 3)
    meta = subprocess.run(
        [KCAT, "-b", kafka.bootstrap, "-L"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert 'topic "kcat" with 3 partitions' in meta
    lines = "".join(f"k{i}:v{i}\n" for i in range(30))
    subprocess.run(
        [KCAT, "-b", kafka.bootstrap, "-P", "-t", "kcat", "-K:"],
        input=lines,
        text=True,
        timeout=60,
        check=True,
    )
    out = subprocess.run(
        [KCAT, "-b", kafka.bootstrap, "-C", "-t", "kcat", "-e", "-f", "%k=%s\\n"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert sorted(out.split()) == sorted(f"k{i}=v{i}" for i in range(30))


def test_a_kill_of_the_listener_never_loses_an_acknowledged_record(tmp_path) -> None:
    server = KafkaProcess(tmp_path / "data", free_port())
    server.start()
    LogStore(server.data).create_topic("durable", 2)
    acked: list[bytes] = []
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(
            {
                "bootstrap.servers": server.bootstrap,
                "acks": "all",
                "partitioner": "murmur2_random",
                "linger.ms": 1,
                "message.timeout.ms": 30_000,
                "enable.idempotence": False,
            }
        )
        i = 0
        while not stop.is_set():
            value = f"r{i}".encode()
            producer.produce(
                "durable",
                key=value,
                value=value,
                on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None,
            )
            producer.poll(0)
            i += 1
            if i % 200 == 0:
                time.sleep(0.01)
        producer.flush(40)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(acked) < 2000 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = len(acked)
        server.kill()
        time.sleep(0.5)
        server.start()
        time.sleep(2)
    finally:
        stop.set()
        thread.join(60)
    server.stop()
    assert before > 0
    log = LogStore(server.data)
    stored = set()
    for p in range(2):
        records, _ = log.read("durable", p, 0, max_bytes=1 << 26)
        stored |= {r.value for r in records}
    log.close()
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    print(f"{len(acked)} acknowledged, {before} before the kill, all stored")
