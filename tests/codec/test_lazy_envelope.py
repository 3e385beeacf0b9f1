"""The projection's lazy decode (issue 36) against the eager one as its model.

``EventCodec.decode(..., lazy=True)`` returns a :class:`LazyEnvelope` whose ``event_id`` is
parsed when first read. For any record it must give what the eager decode gives (equal,
same hash, every field the same) or raise the same error: only the time of the UUID parse
moves, never a check.
"""

from __future__ import annotations

import pickle
from typing import Any
from uuid import UUID

import attrs
import pytest
from codec_samples import golden
from hypothesis import given, settings
from hypothesis import strategies as st
from test_event_codec import CODEC, WHERE, current_value

from eventlane.codec import Envelope
from eventlane.codec.envelope import LazyEnvelope
from eventlane.errors import FrameworkError


def both(value: bytes, key: bytes | None = None) -> tuple[Any, Any]:
    """What the eager and the lazy decode make of ``value``: an envelope or the error."""
    out = []
    for lazy in (False, True):
        try:
            out.append(CODEC.decode(key, value, (), **WHERE, lazy=lazy))
        except FrameworkError as exc:
            out.append((type(exc), str(exc)))
    return out[0], out[1]


def test_lazy_envelope_equals_the_eager_one() -> None:
    eager, lazy = both(golden("order_placed.v3.json"))
    assert type(lazy) is LazyEnvelope and isinstance(lazy, Envelope)
    assert lazy == eager and eager == lazy and not lazy != eager
    assert hash(lazy) == hash(eager)
    assert {eager: 1}[lazy] == 1
    for f in attrs.fields(Envelope):
        assert getattr(lazy, f.name) == getattr(eager, f.name), f.name
    assert type(lazy.event_id) is UUID
    assert attrs.evolve(lazy, aggregate_version=9) == attrs.evolve(eager, aggregate_version=9)
    assert pickle.loads(pickle.dumps(lazy)) == eager


def test_event_id_is_parsed_only_when_read() -> None:
    _, lazy = both(golden("order_placed.v3.json"))
    member = Envelope.__dict__["event_id"]
    with pytest.raises(AttributeError):
        member.__get__(lazy)  # not parsed yet
    parsed = lazy.event_id
    assert member.__get__(lazy) is parsed is lazy.event_id


EVENT_IDS = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),  # not canonical: parsed eagerly
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    st.text(max_size=40),
)
TIMESTAMPS = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.just("2024-05-01T12:30:45"),
    st.text(max_size=30),
)


@settings(max_examples=300, deadline=None)
@given(
    event_id=EVENT_IDS,
    timestamp=TIMESTAMPS,
    aggregate_id=st.sampled_from(["order-1", "", "x"]),
    version=st.integers(-1, 3),
)
def test_lazy_decode_is_the_eager_decode(
    event_id: str, timestamp: str, aggregate_id: str, version: int
) -> None:
    value = current_value(
        event_id=event_id,
        timestamp=timestamp,
        aggregate_id=aggregate_id,
        aggregate_version=version,
    )
    eager, lazy = both(value)
    assert lazy == eager
    if isinstance(eager, Envelope):
        assert lazy.event_id == eager.event_id and lazy.timestamp == eager.timestamp
