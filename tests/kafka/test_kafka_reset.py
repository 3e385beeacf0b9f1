"""A group that fell behind retention resumes, as with Kafka: a commit of -1/-2 (KafkaJS's
placeholders after OFFSET_OUT_OF_RANGE) or of an offset below the low-water mark is accepted,
and the next fetch applies the group's reset policy, so the group reads on from the LWM."""

from __future__ import annotations

import time

from confluent_kafka import Consumer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

from eventlane.log import LogStore
from tests.kafka.wire import raw_call


def _short_topic(kafka, name: str) -> int:
    """A topic whose retention dropped its first records; returns its low-water mark."""
    log = LogStore(kafka.data)
    log.create_topic(name, 1, {"segment_bytes": 1024, "retention_bytes": 2048})
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    for i in range(200):
        producer.send(name, key=b"k", value=b"%03d" % i + b"x" * 97)
    producer.flush(10)
    producer.close()
    log.cleanup(name)
    lwm = log.offsets(name, 0).lwm
    log.close()
    assert lwm > 10
    return lwm


def _commit(kafka, group: str, topic: str, offset: int) -> int:
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    req = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=[
            T(
                name=topic,
                partitions=[
                    T.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_metadata=""
                    )
                ],
            )
        ],
    )
    return (
        raw_call(kafka.bootstrap, req, OffsetCommitResponse, 8).topics[0].partitions[0].error_code
    )


def _fetch_committed(kafka, group: str, topic: str) -> int:
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    req = OffsetFetchRequest(group_id=group, topics=[T(name=topic, partition_indexes=[0])])
    resp = raw_call(kafka.bootstrap, req, OffsetFetchResponse, 7)
    return resp.topics[0].partitions[0].committed_offset


def test_placeholder_commits_are_accepted_and_the_group_resumes_from_the_lwm(kafka) -> None:
    lwm = _short_topic(kafka, "lagging")
    assert _commit(kafka, "kjs", "lagging", 5) == 0  # below the LWM: stored, as Kafka does
    assert _fetch_committed(kafka, "kjs", "lagging") == 5
    assert _commit(kafka, "kjs", "lagging", -1) == 0  # "latest" placeholder
    assert _fetch_committed(kafka, "kjs", "lagging") == -1
    assert _commit(kafka, "kjs", "lagging", -2) == 0  # "earliest" placeholder
    assert _fetch_committed(kafka, "kjs", "lagging") == -2

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "kjs",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["lagging"])
    got: list[int] = []
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.offset())
            consumer.commit(msg, asynchronous=False)
    consumer.close()
    assert got[:1] == [lwm], (got[:3], lwm)
    assert got == list(range(lwm, lwm + len(got)))
    assert _fetch_committed(kafka, "kjs", "lagging") == got[-1] + 1  # a real commit replaces it


def test_a_group_committed_below_the_lwm_resets_by_its_policy(kafka) -> None:
    lwm = _short_topic(kafka, "behind")
    assert _commit(kafka, "slow", "behind", 3) == 0
    consumer = KafkaConsumer(
        "behind",
        bootstrap_servers=kafka.bootstrap,
        group_id="slow",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got: list[int] = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got = [m.offset for ms in consumer.poll(500).values() for m in ms]
    consumer.close()
    assert got and got[0] == lwm

    # seek below the LWM with a reset policy: the fetch is out of range, the client resets
    seeker = KafkaConsumer(bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest")
    tp = TopicPartition("behind", 0)
    seeker.assign([tp])
    seeker.seek(tp, 1)
    got = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got = [m.offset for ms in seeker.poll(500).values() for m in ms]
    seeker.close()
    assert got and got[0] == lwm
