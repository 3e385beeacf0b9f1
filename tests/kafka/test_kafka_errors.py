"""Error paths through real clients: offset out of range (after the low-water mark moved),
a record larger than the topic's max.message.bytes, a stale generation's commit, an unknown
member, and transactions refused (never half-done)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, Producer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import MessageSizeTooLargeError, OffsetOutOfRangeError
from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from eventlane.log import LogStore
from tests.kafka.wire import raw_call


def test_offset_out_of_range_after_the_low_water_mark_moved(kafka) -> None:
    log = LogStore(kafka.data)
    log.create_topic("short", 1, {"segment_bytes": 1024, "retention_bytes": 2048})
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    for i in range(200):
        producer.send("short", key=b"k", value=b"x" * 100)
    producer.flush(10)
    producer.close()
    log.cleanup("short")
    lwm = log.offsets("short", 0).lwm
    assert lwm > 0
    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap, auto_offset_reset="none", enable_auto_commit=False
    )
    tp = TopicPartition("short", 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    with pytest.raises(OffsetOutOfRangeError):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            consumer.poll(500)
    consumer.seek(tp, lwm)  # resolved by seeking to the low-water mark, as auto.offset.reset would
    got = []
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        got = [m.offset for ms in consumer.poll(500).values() for m in ms]
    assert got and got[0] == lwm
    consumer.close()
    log.close()


def test_a_record_larger_than_max_message_bytes_is_refused_and_nothing_is_stored(kafka) -> None:
    log = LogStore(kafka.data)
    log.create_topic("small", 1, {"max.record.bytes": 1000})
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, retries=0)
    with pytest.raises(MessageSizeTooLargeError):
        producer.send("small", value=b"x" * 5000).get(10)
    producer.send("small", value=b"ok").get(10)
    producer.close()
    assert log.offsets("small", 0).hwm == 1
    log.close()


def test_commits_from_a_stale_generation_or_an_unknown_member_are_refused(kafka) -> None:
    LogStore(kafka.data).create_topic("fenced", 2)
    member = KafkaConsumer(
        "fenced",
        bootstrap_servers=kafka.bootstrap,
        group_id="fenced-g",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
    )
    deadline = time.monotonic() + 30
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(200)
    generation = member._coordinator._generation  # the live generation and member id
    gen_id, member_id = generation.generation_id, generation.member_id
    assert gen_id >= 1 and member_id

    def commit(generation_id: int, mid: str) -> int:
        T = OffsetCommitRequest.OffsetCommitRequestTopic
        req = OffsetCommitRequest(
            group_id="fenced-g",
            generation_id_or_member_epoch=generation_id,
            member_id=mid,
            topics=[
                T(
                    name="fenced",
                    partitions=[
                        T.OffsetCommitRequestPartition(
                            partition_index=0, committed_offset=0, committed_metadata=""
                        )
                    ],
                )
            ],
        )
        resp = raw_call(kafka.bootstrap, req, OffsetCommitResponse, 8)
        return resp.topics[0].partitions[0].error_code

    assert commit(gen_id - 1, member_id) == 22  # ILLEGAL_GENERATION
    assert commit(gen_id, "not-a-member") == 25  # UNKNOWN_MEMBER_ID
    assert commit(gen_id, member_id) == 0
    member.close()


def test_transactions_are_refused_not_half_done(kafka) -> None:
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "transactional.id": "tx-1",
            "transaction.timeout.ms": 5000,
        }
    )
    with pytest.raises(KafkaException):
        producer.init_transactions(10)


def test_delete_records_advances_the_low_water_mark(kafka) -> None:
    from confluent_kafka import TopicPartition as CTP  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    log = LogStore(kafka.data)
    log.create_topic("trim", 1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    for i in range(20):
        producer.send("trim", key=b"k", value=b"%d" % i)
    producer.flush(10)
    producer.close()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    futures = admin.delete_records([CTP("trim", 0, 12)])
    deleted = next(iter(futures.values())).result(20)
    assert deleted.low_watermark == 12
    assert log.offsets("trim", 0).lwm == 12
    log.close()


def _batch(producer_id: int, sequence: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, 0, sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def _produce_raw(kafka, topic: str, records: bytes) -> tuple[int, int]:
    Topic = ProduceRequest.TopicProduceData
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=10000,
        topic_data=[Topic(name=topic, partition_data=[Topic.PartitionProduceData(0, records)])],
    )
    response = raw_call(kafka.bootstrap, request, ProduceResponse, 7)
    part = response.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def test_a_partition_with_other_than_one_batch_is_refused_and_nothing_is_stored(kafka) -> None:
    """Kafka's rule since Produce v3: a partition's records are exactly one batch, else
    INVALID_RECORD and nothing stored. The listener took several and appended them one by
    one, so a sequence gap in the second was answered OUT_OF_ORDER_SEQUENCE_NUMBER with the
    first one stored: an error answer for records in the log."""
    log = LogStore(kafka.data)
    log.create_topic("two-batches", 1)
    pid = 9_000_001
    first, gapped = _batch(pid, 0, [b"a", b"b", b"c"]), _batch(pid, 10, [b"d"])
    assert _produce_raw(kafka, "two-batches", first + gapped)[0] == 87  # INVALID_RECORD
    assert log.offsets("two-batches", 0).hwm == 0
    assert _produce_raw(kafka, "two-batches", first + _batch(pid, 3, [b"d"]))[0] == 87
    assert _produce_raw(kafka, "two-batches", b"")[0] == 87
    assert log.offsets("two-batches", 0).hwm == 0
    # one batch per request, as clients send them: stored, a retry answered with its offset
    assert _produce_raw(kafka, "two-batches", first) == (0, 0)
    assert _produce_raw(kafka, "two-batches", _batch(pid, 3, [b"d"])) == (0, 3)
    assert _produce_raw(kafka, "two-batches", first) == (0, 0)
    records, _ = log.read("two-batches", 0, 0)
    assert [r.value for r in records] == [b"a", b"b", b"c", b"d"]
    log.close()
