"""Malformed and unusual requests get a Kafka error code, on a connection that stays usable,
one log line each (no traceback), and store nothing: illegal topic names, record batches in
an old format, a lying or unknown compressed batch, a null group id; and transactions are
refused at once with a message that names them."""

from __future__ import annotations

import contextlib
import socket
import struct
import time

import crc32c
import pytest
from confluent_kafka import KafkaException, Producer
from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from eventlane.log import LogStore
from tests.kafka.wire import encode, recv_frame

INVALID_TOPIC, CORRUPT, UNSUPPORTED_FORMAT, INVALID_GROUP_ID, UNSUPPORTED_CODEC = 17, 2, 43, 24, 76


class Conn:
    """One connection, many requests: each must be answered on it."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.correlation = 0

    def call(self, request, response_cls, version: int):
        self.correlation += 1
        self.sock.sendall(encode(request, version, self.correlation))
        body = recv_frame(self.sock)
        assert body is not None, f"connection closed after {type(request).__name__}"
        response = response_cls[version].decode(body, header=True)
        assert response.header.correlation_id == self.correlation
        return response

    def close(self) -> None:
        self.sock.close()


def _batch(compression: int = 0, n: int = 3) -> bytes:
    builder = DefaultRecordBatchBuilder(2, compression, False, -1, -1, -1, 1 << 20)
    for i in range(n):
        builder.append(i, timestamp=None, key=b"k", value=b"v%d" % i + b"x" * 200, headers=[])
    return bytes(builder.build())


def _recrc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def _produce(topic: str, records: bytes) -> ProduceRequest:
    T = ProduceRequest.TopicProduceData
    return ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])
        ],
    )


def _produce_code(conn: Conn, topic: str, records: bytes) -> int:
    resp = conn.call(_produce(topic, records), ProduceResponse, 8)
    return resp.responses[0].partition_responses[0].error_code


def test_bad_requests_get_error_codes_on_a_connection_that_stays_usable(kafka) -> None:
    log = LogStore(kafka.data)
    log.create_topic("bad", 1)
    log_lines_before = kafka.stderr.read_text().count("\n")
    conn = Conn(kafka.bootstrap)
    try:
        # illegal topic names in Metadata (auto-creation on)
        names = ["../../x", "t" * 300, ".hidden", "a/b", ""]
        T = MetadataRequest.MetadataRequestTopic
        resp = conn.call(
            MetadataRequest(topics=[T(name=n) for n in names], allow_auto_topic_creation=True),
            MetadataResponse,
            8,
        )
        assert [t.error_code for t in resp.topics] == [INVALID_TOPIC] * len(names)
        assert conn.call(_produce("../x", _batch()), ProduceResponse, 8)  # answered
        assert _produce_code(conn, "../x", _batch()) == INVALID_TOPIC

        # old message formats: not advertised below Produce v3 / Fetch v4, refused in a batch
        versions = conn.call(ApiVersionsRequest(), ApiVersionsResponse, 3)
        ranges = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert ranges[0][0] == 3 and ranges[1][0] == 4
        legacy = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
        legacy.append(0, timestamp=None, key=b"k", value=b"v")
        assert _produce_code(conn, "bad", bytes(legacy.build())) == UNSUPPORTED_FORMAT

        # a gzip batch whose record count lies (CRC recomputed: only the count is wrong)
        for lie in (2, 4, 1000):
            lying = bytearray(_batch(compression=1))
            struct.pack_into(">i", lying, 57, lie)
            assert _produce_code(conn, "bad", _recrc(lying)) == CORRUPT, lie
        # an unknown codec (attributes bits 0-2 = 5), and a batch cut short
        unknown = bytearray(_batch())
        struct.pack_into(">h", unknown, 21, 5)
        assert _produce_code(conn, "bad", _recrc(unknown)) == UNSUPPORTED_CODEC
        assert _produce_code(conn, "bad", _batch(compression=1)[:-7]) == CORRUPT
        assert _produce_code(conn, "bad", b"\x00" * 70) == CORRUPT

        # OffsetFetch with a null group id (v7 has a top-level error code)
        TF = OffsetFetchRequest.OffsetFetchRequestTopic
        resp = conn.call(
            OffsetFetchRequest(group_id=None, topics=[TF(name="bad", partition_indexes=[0])]),
            OffsetFetchResponse,
            7,
        )
        assert resp.error_code == INVALID_GROUP_ID

        # and the connection still serves a good produce
        assert _produce_code(conn, "bad", _batch(compression=1)) == 0
    finally:
        conn.close()
    assert log.offsets("bad", 0).hwm == 3  # only the good batch
    assert all(not t.startswith(".") and "/" not in t for t in log.list_topics())
    log.close()
    time.sleep(0.5)
    lines = kafka.stderr.read_text().splitlines()[log_lines_before:]
    assert not [line for line in lines if "Traceback" in line], lines
    bad = [line for line in lines if "warning" in line]
    assert len(bad) <= 15, bad  # at most one line per bad request


def test_transactions_are_refused_at_once_naming_transactions(kafka) -> None:
    start = time.monotonic()
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "tx-fast"})
    try:
        with pytest.raises(KafkaException) as refused:
            producer.init_transactions(20)
        elapsed = time.monotonic() - start
        message = str(refused.value).lower()
        del refused  # its traceback holds this frame: a cycle that kept the producer alive
    finally:
        with contextlib.suppress(KafkaException):  # it aborts the (refused) transaction
            producer.close()
        del producer  # destroyed now: librdkafka reconnected to the stopped listener until GC
    assert elapsed < 5, elapsed  # Kafka's clients give up on the first answer
    assert "transaction" in message

    start = time.monotonic()
    kp = KafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id="tx-kp")
    try:
        with pytest.raises(KafkaError):
            kp.init_transactions()
    finally:
        kp.close(timeout=5)
    assert time.monotonic() - start < 10
    log = LogStore(kafka.data)
    assert not log.topic_exists("__transaction_state")
    log.close()
