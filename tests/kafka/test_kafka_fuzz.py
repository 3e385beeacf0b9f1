"""The protocol fuzzer (tests/kafka/fuzz.py) against a real listener, with a normal
kafka-python client producing and reading back at the same time: no well-framed request
unanswered, no record stored from a rejected produce, no failure of the normal client.
A short seeded run by default; ``pytest -m soak`` runs 100,000 requests."""

from __future__ import annotations

import os
import threading
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.producer import ProduceRequest
from kafka.record.default_records import DefaultRecordBatchBuilder

from eventlane.log import LogStore
from tests.kafka.fuzz import TOPICS, Fuzzer
from tests.kafka.wire import encode


class NormalClient(threading.Thread):
    """Produces one record at a time (acks=all, waited for) until stopped; then reads back."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.sent: list[bytes] = []
        self.failures: list[str] = []

    def run(self) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", retries=5)
        i = 0
        while not self.stop.is_set():
            value = b"normal-%d" % i
            try:
                producer.send("normal-client", value=value, partition=0).get(15)
                self.sent.append(value)
            except Exception as exc:
                self.failures.append(repr(exc))
            i += 1
            time.sleep(0.02)
        producer.close()

    def read_back(self) -> list[bytes]:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, auto_offset_reset="earliest")
        tp = TopicPartition("normal-client", 0)
        consumer.assign([tp])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < len(self.sent) and time.monotonic() < deadline:
            got += [m.value for ms in consumer.poll(500).values() for m in ms]
        consumer.close()
        return got


def _fuzz(kafka, seed: int, count: int, seconds: float) -> None:
    log = LogStore(kafka.data)
    for name in TOPICS:
        log.create_topic(name, 3, exist_ok=True)
    log.create_topic("normal-client", 1, exist_ok=True)
    log.close()
    normal = NormalClient(kafka.bootstrap)
    normal.start()
    fuzzer = Fuzzer(kafka.bootstrap, kafka.data, seed)
    start = time.monotonic()
    try:
        stats = fuzzer.run(count, seconds)
    finally:
        fuzzer.close()
        normal.stop.set()
        normal.join(60)
    elapsed = time.monotonic() - start
    print(
        f"fuzz seed {seed}: {stats.sent} requests in {elapsed:.0f} s ({stats.well_framed}"
        f" well-framed, {stats.answered} answered, {stats.acks0} acks=0,"
        f" {stats.closed_on_malformed} closed on malformed, {stats.abandoned_waits} long polls"
        f" abandoned, {stats.produce_rejections} produce partitions rejected);"
        f" normal client: {len(normal.sent)} sent, {len(normal.failures)} failures;"
        f" {len(stats.by_version)} (API, version) pairs;"
        f" APIs {dict(sorted(stats.by_api.items()))}"
    )
    assert stats.failures == [], stats.failures[:10]
    assert normal.failures == [], normal.failures[:5]
    assert normal.read_back() == normal.sent
    assert stats.sent >= min(count, 200)
    assert set(stats.by_version) == set(fuzzer.pairs)  # every advertised API and version
    log_text = kafka.stderr.read_text()
    assert "Traceback" not in log_text


def test_a_short_seeded_fuzz_run(kafka) -> None:
    _fuzz(kafka, seed=20261127, count=1000, seconds=150)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_fuzz_soak(kafka) -> None:
    # EVENTLANE_FUZZ_SOAK_S: the time bound of the run (default 3200 s); _SEED, _COUNT: the
    # seed and the number of requests (7 and 100,000); a failure names its request's number,
    # which `python -m tests.kafka.fuzz --seed S --count N` replays
    env = os.environ.get
    _fuzz(
        kafka,
        seed=int(env("EVENTLANE_FUZZ_SEED", "7")),
        count=int(env("EVENTLANE_FUZZ_COUNT", "100000")),
        seconds=float(env("EVENTLANE_FUZZ_SOAK_S", "3200")),
    )


def test_the_oracle_fences_acks0_produces(kafka) -> None:
    """The soak once blamed a rejected produce for records that an acks=0 produce, sent just
    before on a connection the fuzzer had dropped, stored while the rejected one was checked
    (replayed outside the fuzzer: 101 of 300 such pairs moved the mark during the check).
    After the fuzzer's fence the acks=0 produce is always served, its records counted."""
    log = LogStore(kafka.data)
    log.create_topic("fenced", 1, exist_ok=True)
    fuzzer = Fuzzer(kafka.bootstrap, kafka.data, seed=1)
    Topic = ProduceRequest.TopicProduceData
    try:
        for i in range(50):
            builder = DefaultRecordBatchBuilder(2, i % 2, False, -1, -1, -1, 1 << 20)
            for j in range(4):
                builder.append(j, timestamp=None, key=None, value=b"x" * 100, headers=[])
            request = ProduceRequest(
                transactional_id=None,
                acks=0,
                timeout_ms=1000,
                topic_data=[
                    Topic(
                        name="fenced",
                        partition_data=[Topic.PartitionProduceData(0, builder.build())],
                    )
                ],
            )
            fuzzer.correlation += 1
            sock = fuzzer._connect()
            sock.sendall(encode(request, 7, fuzzer.correlation))
            fuzzer._fence(sock, i)
            fuzzer._drop()
            assert log.offsets("fenced", 0).hwm == 4 * (i + 1)
        assert fuzzer.stats.failures == []
    finally:
        fuzzer.close()
        log.close()
