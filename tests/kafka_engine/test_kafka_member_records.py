"""A Kafka group member's record step (``eventlane.consumer.kafka.member_records``) against
a one-message-at-a-time model of the member's rules, on real confluent-kafka ``Message``
objects (no broker needed).

For any batch ``consume`` can hand back (runs of several topics' partitions interleaved,
offsets ascending within a partition, gaps, events such as partition-EOF anywhere), any
owned and paused partitions and any positions: the same records in the same order, the
same positions afterwards, and the same events reported in the same places. The model is
the member's loop as it was before runs were taken in one pass.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlane.consumer.kafka import member_records
from eventlane.log.kafka.records import kafka_record
from eventlane.log.record import Record, TopicPartition

PREFIX = "ns."
PARTITIONS = [TopicPartition(t, p) for t in ("a", "b") for p in range(3)]


def model(
    messages: list[Message],
    owned: set[TopicPartition],
    paused: set[TopicPartition],
    positions: dict[TopicPartition, int],
    events: list[tuple[int, Any]],
) -> list[Record]:
    out: list[Record] = []
    for m in messages:
        err = m.error()
        if err is not None:
            events.append((len(out), err.code()))
            continue
        tp = TopicPartition((m.topic() or "")[len(PREFIX) :], m.partition() or 0)
        offset = m.offset() or 0
        if tp not in owned or tp in paused:
            continue
        if offset < positions.get(tp, -1):
            continue
        out.append(kafka_record(tp.topic, tp.partition, m, offset))
        positions[tp] = offset + 1
    return out


@st.composite
def batches(draw: Any) -> list[Message]:
    """Runs of partitions' messages, offsets ascending per partition, events between."""
    nxt = {tp: draw(st.integers(0, 20)) for tp in PARTITIONS}
    msgs: list[Message] = []
    for _ in range(draw(st.integers(0, 8))):
        tp = draw(st.sampled_from(PARTITIONS))
        for _ in range(draw(st.integers(1, 6))):
            if draw(st.integers(0, 7)) == 0:
                code = draw(st.sampled_from([KafkaError._PARTITION_EOF, KafkaError._MSG_TIMED_OUT]))
                msgs.append(
                    Message(
                        topic=PREFIX + tp.topic,
                        partition=tp.partition,
                        offset=nxt[tp],
                        error=KafkaError(code),
                    )
                )
                continue
            msgs.append(
                Message(
                    topic=PREFIX + tp.topic,
                    partition=tp.partition,
                    offset=nxt[tp],
                    key=draw(st.none() | st.binary(max_size=3)),
                    value=draw(st.none() | st.binary(max_size=5)),
                    headers=draw(st.none() | st.just([("h", b"1")])),
                    timestamp=(draw(st.integers(0, 2)), draw(st.integers(0, 2**40))),
                )
            )
            nxt[tp] += draw(st.integers(1, 3))
    return msgs


@settings(max_examples=300, deadline=None)
@given(
    batches(),
    st.sets(st.sampled_from(PARTITIONS)),
    st.sets(st.sampled_from(PARTITIONS), max_size=2),
    st.dictionaries(st.sampled_from(PARTITIONS), st.integers(-1, 30)),
)
def test_member_records_equal_the_one_message_at_a_time_model(
    messages: list[Message],
    owned: set[TopicPartition],
    paused: set[TopicPartition],
    positions: dict[TopicPartition, int],
) -> None:
    expected_events: list[tuple[int, Any]] = []
    expected_positions = dict(positions)
    expected = model(messages, owned, paused, expected_positions, expected_events)

    got_events: list[tuple[int, Any]] = []
    out_so_far: list[int] = []

    def on_event(m: Message, err: KafkaError) -> None:
        # where the event falls among the records: the records taken before it
        got_events.append((out_so_far[0] if out_so_far else 0, err.code()))

    # where each event falls among the records: the batch is cut at its events and the
    # pieces stepped one after another (positions carried), each event reported between
    got_positions = dict(positions)
    got: list[Record] = []
    start = 0
    for i, m in enumerate([*messages, None]):
        if m is None or m.error() is not None:
            got += member_records(messages[start:i], PREFIX, owned, paused, got_positions, on_event)
            if m is not None:
                out_so_far[:] = [len(got)]
                on_event(m, m.error())
            start = i + 1
    assert got == expected
    assert all(type(r) is Record for r in got)
    assert got_positions == expected_positions
    assert got_events == expected_events

    # and in one call over the whole batch: the same records, positions and events
    whole_events: list[Any] = []
    whole_positions = dict(positions)
    whole = member_records(
        messages, PREFIX, owned, paused, whole_positions, lambda m, e: whole_events.append(e.code())
    )
    assert whole == expected
    assert whole_positions == expected_positions
    assert whole_events == [code for _, code in expected_events]


def test_an_event_raised_by_the_handler_stops_the_step_where_it_is() -> None:
    """``on_event`` raising (a fatal error, an offset out of range) ends the poll: records
    of the run before the event were taken, their positions moved, nothing after."""
    tp = TopicPartition("a", 0)
    messages = [
        Message(topic="ns.a", partition=0, offset=0, value=b"x", timestamp=(1, 5)),
        Message(topic="ns.a", partition=0, offset=1, error=KafkaError(KafkaError._MSG_TIMED_OUT)),
        Message(topic="ns.a", partition=0, offset=1, value=b"y", timestamp=(1, 6)),
    ]
    positions: dict[TopicPartition, int] = {}

    def boom(m: Message, err: KafkaError) -> None:
        raise RuntimeError("fatal")

    try:
        member_records(messages, PREFIX, {tp}, set(), positions, boom)
    except RuntimeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("the event was not reported")
    assert positions == {tp: 1}
