"""JoinGroup as Kafka answers it (KIP-394, the group coordinator's session bounds): from v4 a
member with no id gets MEMBER_ID_REQUIRED and a generated id, and joins only when it comes
back with it, so a client that leaves after its first JoinGroup never becomes a member that
holds partitions; session timeouts outside group.min.session.timeout.ms (6 s) ..
group.max.session.timeout.ms (30 min) get INVALID_SESSION_TIMEOUT."""

from __future__ import annotations

import socket
import time
from typing import Any

from confluent_kafka import Consumer, Producer
from kafka.protocol.consumer import JoinGroupRequest, JoinGroupResponse
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from eventlane.log import LogStore
from tests.kafka.wire import encode, raw_call, recv_frame

MEMBER_ID_REQUIRED, INVALID_SESSION_TIMEOUT = 79, 26


def _join(group: str, topic: str, session_ms: int = 30_000, member_id: str = "") -> Any:
    metadata = ConsumerProtocolSubscription(version=0, topics=[topic], user_data=b"").encode()
    return JoinGroupRequest(
        group_id=group,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=session_ms,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=metadata)],
        reason=None,
    )


def test_a_client_that_left_after_its_first_join_holds_no_partitions(kafka) -> None:
    topic, group = "ghosted", "ghost-g"
    log = LogStore(kafka.data)
    log.create_topic(topic, 2)
    log.close()
    assigned: list[list[int]] = []
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "heartbeat.interval.ms": 500,
        }
    )
    try:
        consumer.subscribe(
            [topic], on_assign=lambda c, ps: assigned.append(sorted(p.partition for p in ps))
        )
        deadline = time.monotonic() + 30
        while assigned[-1:] != [[0, 1]] and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert assigned[-1:] == [[0, 1]]

        # a client sends its first JoinGroup (v5, no member id) and goes away
        host, port = kafka.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(encode(_join(group, topic), 5))
            sock.settimeout(1)
            try:
                recv_frame(sock)
            except TimeoutError:
                pass  # a join waiting for the rebalance: the client leaves anyway

        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        for i in range(20):
            producer.produce(topic, value=b"%d" % i, partition=i % 2)
        assert producer.flush(10) == 0
        got: list[bytes] = []
        deadline = time.monotonic() + 15  # half the departed client's session timeout
        while len(got) < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        assert len(got) == 20, f"{len(got)} of 20 records; assignments {assigned}"
    finally:
        consumer.close()


def test_join_v4_without_a_member_id_gets_one_and_joins_with_it(kafka) -> None:
    first = raw_call(kafka.bootstrap, _join("two-step", "t"), JoinGroupResponse, 5)
    assert first.error_code == MEMBER_ID_REQUIRED
    assert first.member_id
    second = raw_call(
        kafka.bootstrap, _join("two-step", "t", member_id=first.member_id), JoinGroupResponse, 5
    )
    assert (second.error_code, second.member_id, second.leader) == (0, *[first.member_id] * 2)
    # before v4 the first JoinGroup joins at once, as in Kafka
    old = raw_call(kafka.bootstrap, _join("one-step", "t"), JoinGroupResponse, 3)
    assert old.error_code == 0 and old.member_id


def test_session_timeouts_outside_the_brokers_bounds_are_refused(kafka) -> None:
    for session_ms in (5_999, 1_800_001):
        answer = raw_call(kafka.bootstrap, _join("bounds", "t", session_ms), JoinGroupResponse, 5)
        assert answer.error_code == INVALID_SESSION_TIMEOUT, session_ms
