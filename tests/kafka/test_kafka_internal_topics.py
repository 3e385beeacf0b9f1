"""Internal topics are eventlane's (``__consumer_offsets``) or Kafka's (``__transaction_state``):
a Kafka client may not write, trim, create, delete or reconfigure them through the listener.
Every door answers Kafka's INVALID_TOPIC_EXCEPTION, and a forged offset commit leaves the
group's committed offsets (and the internal topic) exactly as they were."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as CTP
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

from eventlane.consumer.offsets import OFFSETS_TOPIC, OffsetStore
from eventlane.log import LogStore
from eventlane.log import TopicPartition as LogTP

INVALID_TOPIC = KafkaError.TOPIC_EXCEPTION  # 17, INVALID_TOPIC_EXCEPTION


def _committed(kafka, group: str) -> dict:
    log = LogStore(kafka.data)
    try:
        return {tp: c.offset for tp, c in OffsetStore(log).group_offsets(group).items()}
    finally:
        log.close()


def _offsets_hwms(kafka) -> list[int]:
    log = LogStore(kafka.data)
    try:
        return [
            log.offsets(OFFSETS_TOPIC, p).hwm for p in range(log.partition_count(OFFSETS_TOPIC))
        ]
    finally:
        log.close()


def test_a_forged_commit_through_produce_is_refused_and_offsets_are_unchanged(kafka) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    for i in range(10):
        producer.send("ledger", value=b"%d" % i)
    producer.flush(10)
    producer.close()
    member = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id="billing")
    member.assign([TopicPartition("ledger", 0)])  # a simple consumer: commits generation -1
    member.commit({TopicPartition("ledger", 0): OffsetAndMetadata(7, "", -1)})
    member.close()
    before = _committed(kafka, "billing")
    assert before == {LogTP("ledger", 0): 7}
    hwms = _offsets_hwms(kafka)

    log = LogStore(kafka.data)
    part = OffsetStore(log).partition_of("billing")
    log.close()
    key = orjson.dumps({"group": "billing", "topic": "ledger", "partition": 0})
    forged = orjson.dumps(
        {
            "offset": 1_000_000,
            "metadata": "",
            "generation": 99,
            "member_id": "spoof",
            "commit_ms": 0,
        }
    )
    # librdkafka does not filter internal topics itself: the listener must refuse
    p = Producer({"bootstrap.servers": kafka.bootstrap, "message.timeout.ms": 5000})
    reports: list = []
    for topic in (OFFSETS_TOPIC, "__transaction_state"):
        p.produce(
            topic,
            key=key,
            value=forged,
            partition=part if topic == OFFSETS_TOPIC else 0,
            on_delivery=lambda err, msg: reports.append(err),
        )
    assert p.flush(20) == 0
    assert len(reports) == 2
    assert reports[0] is not None and reports[0].code() == INVALID_TOPIC, reports
    assert reports[1] is not None, reports  # a Kafka internal name: refused (or unknown)

    assert _committed(kafka, "billing") == before
    assert _offsets_hwms(kafka) == hwms


def _refused(future: Any) -> int:
    """The error code of an admin future that must fail (the exception's traceback cycle
    stays in this frame, away from the test's client)."""
    with pytest.raises(KafkaException) as refused:
        future.result(20)
    return int(refused.value.args[0].code())


def test_every_admin_door_refuses_internal_topics(kafka) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    producer.send("doors", value=b"x").get(10)
    member = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id="doors-g")
    member.assign([TopicPartition("doors", 0)])
    member.commit({TopicPartition("doors", 0): OffsetAndMetadata(1, "", -1)})
    member.close()
    producer.close()
    hwms = _offsets_hwms(kafka)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})

    # DeleteRecords: the low-water mark of __consumer_offsets does not move
    futures = admin.delete_records([CTP(OFFSETS_TOPIC, p, -1) for p in range(len(hwms))])
    for future in futures.values():
        assert _refused(future) == INVALID_TOPIC
    # CreateTopics / DeleteTopics
    for name in (OFFSETS_TOPIC, "__transaction_state"):
        (future,) = admin.create_topics([NewTopic(name, 1, 1)]).values()
        assert _refused(future) == INVALID_TOPIC, name
        (future,) = admin.delete_topics([name]).values()
        assert _refused(future) == INVALID_TOPIC, name
    # AlterConfigs / IncrementalAlterConfigs are not advertised: refused by every client
    resource = ConfigResource("topic", OFFSETS_TOPIC, set_config={"cleanup.policy": "delete"})
    with pytest.warns(DeprecationWarning, match="alter_configs"):  # the legacy door, on purpose
        (future,) = admin.alter_configs([resource]).values()
    _refused(future)
    del admin  # destroyed now, not at some later GC: librdkafka reconnects until then

    log = LogStore(kafka.data)
    try:
        assert log.topic_exists(OFFSETS_TOPIC)
        assert log.topic_config(OFFSETS_TOPIC).cleanup_policy == "compact"
        assert all(log.offsets(OFFSETS_TOPIC, p).lwm == 0 for p in range(len(hwms)))
        assert not log.topic_exists("__transaction_state")
    finally:
        log.close()
    assert _offsets_hwms(kafka) == hwms
    assert _committed(kafka, "doors-g") == {LogTP("doors", 0): 1}
