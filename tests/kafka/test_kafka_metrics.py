"""The listener's Prometheus metrics (issue 31): a real ``eventlane serve --kafka
--metrics-port`` process, a real kafka-python producer and raw frames; the scrape, parsed
by prometheus_client's own parser, counts exactly what the clients did: N produce requests
answered NONE, one UNKNOWN_TOPIC_OR_PARTITION, one malformed Metadata frame, their bytes and
latencies, the connections open and the bytes of a partial request in flight."""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
from collections.abc import Callable

from kafka import KafkaProducer
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from prometheus_client.parser import text_string_to_metric_families

from eventlane.log import LogStore
from tests.kafka.conftest import KafkaProcess, free_port
from tests.kafka.wire import encode, raw_call, recv_frame

N = 25


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _until(metrics_port: int, check: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + 15
    while True:
        samples = _scrape(metrics_port)
        if check(samples) or time.monotonic() > deadline:
            assert check(samples), what
            return samples
        time.sleep(0.1)


def test_metrics_count_what_the_clients_did(tmp_path) -> None:
    metrics_port = free_port()
    kafka = KafkaProcess(tmp_path / "data", free_port(), "--metrics-port", str(metrics_port))
    kafka.start()
    try:
        log = LogStore(kafka.data)
        log.create_topic("metered", 1)
        log.close()
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=0)
        for i in range(N):  # one Produce request each: the next is sent once this is answered
            producer.send("metered", value=b"%d" % i).get(10)
        producer.close()

        Topic = ProduceRequest.TopicProduceData
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
        builder.append(0, timestamp=None, key=None, value=b"lost", headers=[])
        records = bytes(builder.build())
        missing = ProduceRequest(
            transactional_id=None,
            acks=1,
            timeout_ms=1000,
            topic_data=[
                Topic(name="metered", partition_data=[Topic.PartitionProduceData(7, records)])
            ],
        )
        answer = raw_call(kafka.bootstrap, missing, ProduceResponse, 7)
        assert answer.responses[0].partition_responses[0].error_code == 3

        host, port = kafka.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            frame = encode(MetadataRequest(topics=None, allow_auto_topic_creation=False), 1)
            cut = frame[4:-2]  # a Metadata v1 body two bytes short: malformed
            sock.sendall(struct.pack(">i", len(cut)) + cut)
            assert recv_frame(sock) is None  # closed, as Kafka closes it

        samples = _until(
            metrics_port,
            lambda s: (
                _value(s, "eventlane_kafka_requests_total", api="Produce", error="NONE") >= N
                and _value(s, "eventlane_kafka_connections") == 0
            ),
            "every request counted and every connection closed",
        )
        requests = {
            labels: value
            for (name, labels), value in samples.items()
            if name == "eventlane_kafka_requests_total"
        }
        produce = {dict(k)["error"]: v for k, v in requests.items() if dict(k)["api"] == "Produce"}
        assert produce == {"NONE": N, "UNKNOWN_TOPIC_OR_PARTITION": 1}
        assert (
            _value(
                samples, "eventlane_kafka_requests_total", api="Metadata", error="INVALID_REQUEST"
            )
            == 1
        )
        assert _value(samples, "eventlane_kafka_request_seconds_count", api="Produce") == N + 1
        assert _value(samples, "eventlane_kafka_request_seconds_sum", api="Produce") > 0
        received = _value(samples, "eventlane_kafka_received_bytes_total", api="Produce")
        sent = _value(samples, "eventlane_kafka_sent_bytes_total", api="Produce")
        assert received > N * 60 and sent > N * 40, (received, sent)  # batches, answers
        assert _value(samples, "eventlane_kafka_inflight_bytes") == 0

        # three open connections and one partial 1 MiB request: seen at the next scrape
        socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
        try:
            for sock in socks:
                sock.sendall(encode(ApiVersionsRequest(), 0))
                assert recv_frame(sock) is not None
            socks[0].sendall(struct.pack(">i", 1 << 20) + b"\0" * 100)
            _until(
                metrics_port,
                lambda s: (
                    _value(s, "eventlane_kafka_connections") == 3
                    and _value(s, "eventlane_kafka_inflight_bytes") == 1 << 20
                ),
                "3 connections, 1 MiB in flight",
            )
        finally:
            for sock in socks:
                sock.close()
        _until(
            metrics_port,
            lambda s: (
                _value(s, "eventlane_kafka_connections") == 0
                and _value(s, "eventlane_kafka_inflight_bytes") == 0
            ),
            "connections closed, nothing in flight",
        )
    finally:
        kafka.stop()
