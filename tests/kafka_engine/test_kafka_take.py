"""KafkaLog's read step over consumed messages: the C ``take_messages`` against its
pure-Python reference, on real confluent-kafka ``Message`` objects (no broker needed).

For any batch (a stale prefix fetched for an earlier assignment, records with and without
keys, values and headers, the three timestamp types, events such as partition-EOF in between)
and any read state (next offset, stop, bytes already taken, ``max_bytes``, records already
taken), both must return the same (index, size, next offset) and append equal records of the
same type; and every record taken obeys the read's rules, checked here on their own: offsets
at or above the next offset and below ``stop``, ascending, none after the first event, the
byte budget kept. Records without headers are untracked from the cyclic GC (they hold atoms
only); records with headers stay tracked.
"""

from __future__ import annotations

import gc
import importlib
from typing import Any

from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlane.log.kafka.records import _KINDS, _py_take_messages, kafka_record
from eventlane.log.record import Record

native = importlib.import_module("eventlane.log._native")  # a missing build fails the test

headers = st.none() | st.lists(
    st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=2
)
events = st.sampled_from([KafkaError._PARTITION_EOF, KafkaError.OFFSET_OUT_OF_RANGE])


@st.composite
def batches(draw: Any) -> tuple[list[Message], int]:
    """Messages of one partition in offset order (gaps allowed), a few events among them;
    and the reader's next offset (somewhere in or around them)."""
    first = draw(st.integers(0, 50))
    msgs: list[Message] = []
    offset = first
    for _ in range(draw(st.integers(0, 14))):
        if draw(st.integers(0, 9)) == 0:
            msgs.append(
                Message(topic="ns.t", partition=0, offset=offset, error=KafkaError(draw(events)))
            )
            continue
        msgs.append(
            Message(
                topic="ns.t",
                partition=0,
                offset=offset,
                key=draw(st.none() | st.binary(max_size=4)),
                value=draw(st.none() | st.binary(max_size=9)),
                headers=draw(headers),
                timestamp=(draw(st.integers(0, 2)), draw(st.integers(0, 2**45))),
            )
        )
        offset += draw(st.integers(1, 3))
    return msgs, draw(st.integers(first - 2, offset + 1))


@settings(max_examples=150, deadline=None)
@given(
    batches(),
    st.integers(-1, 70),
    st.integers(0, 30),
    st.integers(1, 40),
    st.booleans(),
)
def test_take_messages_agrees_with_python_and_keeps_the_reads_rules(
    batch: tuple[list[Message], int], stop: int, size: int, max_bytes: int, started: bool
) -> None:
    msgs, nxt = batch
    before = (
        [kafka_record("t", 0, Message(topic="ns.t", partition=0, offset=0), 0)] if started else []
    )
    results = []
    for take in (_py_take_messages, native.take_messages):
        out = list(before)
        got = take(msgs, "t", 0, nxt, stop, size, max_bytes, _KINDS, out, Record)
        results.append((got, out))
    (py, py_out), (nat, nat_out) = results
    assert nat == py
    assert nat_out == py_out
    assert all(type(r) is Record for r in nat_out)

    i, new_size, new_nxt = nat
    taken = nat_out[len(before) :]
    used = msgs[:i]
    assert all(m.error() is None for m in used), "nothing taken past an event"
    offsets = [r.offset for r in taken]
    assert offsets == sorted(offsets) and all(o >= nxt for o in offsets)
    assert stop < 0 or all(o < stop for o in offsets)
    assert new_nxt == (offsets[-1] + 1 if taken else nxt)
    assert new_size == size + sum(len(r.value or b"") for r in taken)
    # each record was taken while what came before it held less than max_bytes (the first
    # record of a read always)
    held = size
    for n, r in enumerate(taken):
        assert held < max_bytes or (n == 0 and not before)
        held += len(r.value or b"")
    if i < len(msgs) and msgs[i].error() is None:  # left for the next read: why
        o = msgs[i].offset()
        assert o >= new_nxt and ((0 <= stop <= o) or held >= max_bytes)
    for r, m in zip(taken, [m for m in used if m.offset() >= nxt], strict=True):
        t, ms = m.timestamp()
        assert r == (
            "t",
            0,
            m.offset(),
            ms,
            _KINDS[t],
            m.key(),
            m.value(),
            tuple(m.headers() or ()),
        )
        assert gc.is_tracked(r) == bool(r.headers)
