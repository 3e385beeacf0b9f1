"""Property: every supported field type survives encode → decode exactly."""

from __future__ import annotations

import math
import struct
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import attrs
import pytest
from codec_samples import (
    Color,
    Currency,
    Customer,
    Everything,
    Line,
    Money,
    Priority,
    sample_everything,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlane.codec import Envelope, EventCodec, EventRegistry
from eventlane.domain import DomainEvent, event

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Offsets to the second: fractions of a second are refused on encode (see converter.py).
fixed_offsets = st.integers(min_value=-(24 * 3600) + 1, max_value=24 * 3600 - 1).map(
    lambda s: timezone(timedelta(seconds=s))
)
zones = st.sampled_from(
    ["Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
).map(ZoneInfo)
aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.one_of(st.just(UTC), fixed_offsets, zones),
)
datetimes = st.one_of(aware_datetimes, st.datetimes())
decimals = st.decimals(allow_nan=False, allow_infinity=False)
ints64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
floats = st.floats(allow_nan=False, allow_infinity=False)
money = st.builds(Money, amount=decimals, currency=st.sampled_from(Currency))
lines = st.builds(Line, sku=st.text(), quantity=ints64, unit_price=decimals)

everything = st.builds(
    Everything,
    text=st.text(),
    number=ints64,
    ratio=floats,
    flag=st.booleans(),
    amount=decimals,
    at=datetimes,
    day=st.dates(),
    ident=st.uuids(),
    color=st.sampled_from(Color),
    priority=st.sampled_from(Priority),
    currency=st.sampled_from(Currency),
    blob=st.binary(),
    money=money,
    maybe_money=st.none() | money,
    maybe_int=st.none() | ints64,
    ints=st.lists(ints64).map(tuple),
    pair=st.tuples(st.text(), decimals),
    lines=st.lists(lines, max_size=5),
    tags=st.lists(st.text()),
    counts=st.dictionaries(st.text(), ints64),
    prices=st.dictionaries(st.text(), money, max_size=3),
)


@event("Flag")
@attrs.frozen
class Flag(DomainEvent):
    on: bool


def _make_codec() -> EventCodec:
    registry = EventRegistry()
    registry.register(Everything, Flag)
    return EventCodec(registry)


CODEC = _make_codec()  # built once: a codec generates its cattrs functions on first use


def assert_identical(a: Any, b: Any) -> None:
    """Equal, and equal in the ways == does not see: types, Decimal digits, tz offsets, -0.0."""
    assert type(a) is type(b), (a, b)
    if attrs.has(type(a)):
        for f in attrs.fields(type(a)):
            assert_identical(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_identical(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_identical(a[k], b[k])
    elif isinstance(a, Decimal):
        assert str(a) == str(b)
    elif isinstance(a, datetime):
        # A ZoneInfo datetime comes back with the equivalent fixed offset. In a DST fold or
        # gap PEP 495 makes such interzone == False, so compare the instant and the text.
        assert a.isoformat() == b.isoformat()
        assert a.utcoffset() == b.utcoffset()
        if a.tzinfo is None:
            assert a == b
        else:
            assert a.astimezone(UTC) == b.astimezone(UTC)
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b)
    else:
        assert a == b


@FAST
@given(
    value=everything,
    version=st.integers(min_value=1, max_value=2**31),
    aggregate_id=st.text(min_size=1),
)
def test_every_field_type_round_trips(value: Everything, version: int, aggregate_id: str) -> None:
    codec = CODEC
    envelope = Envelope(value, aggregate_id=aggregate_id, aggregate_version=version)
    key, raw, headers = codec.encode(envelope)
    decoded = codec.decode(key, raw, headers)
    assert attrs.evolve(decoded, event=value) == envelope
    assert_identical(decoded.event, value)
    # Decoding the same bytes again gives the same bytes back: the format is canonical.
    assert codec.encode(decoded).value == raw


@FAST
@given(
    timestamp=aware_datetimes,
    correlation_id=st.none() | st.text(),
    causation_id=st.none() | st.text(),
)
def test_envelope_fields_round_trip(
    timestamp: datetime, correlation_id: str | None, causation_id: str | None
) -> None:
    codec = CODEC
    envelope = Envelope(
        Flag(True),
        aggregate_id="a",
        aggregate_version=7,
        timestamp=timestamp,
        correlation_id=correlation_id,
        causation_id=causation_id,
    )
    assert envelope.timestamp.tzinfo is UTC
    assert envelope.timestamp == timestamp.astimezone(UTC)  # == is False in a DST gap (PEP 495)
    decoded = codec.decode(*codec.encode(envelope))
    assert decoded == envelope
    assert decoded.timestamp.isoformat() == envelope.timestamp.isoformat()


SINGLE_TYPES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (str, st.text()),
    (int, ints64),
    (float, floats),
    (bool, st.booleans()),
    (Decimal, decimals),
    (datetime, datetimes),
    (date, st.dates()),
    (Color, st.sampled_from(Color)),
    (Priority, st.sampled_from(Priority)),
    (Money, money),
    (tuple[int, ...], st.lists(ints64).map(tuple)),
    (tuple[Decimal, str], st.tuples(decimals, st.text())),
    (int | None, st.none() | ints64),
    (Customer | None, st.none() | st.builds(Customer, st.text(), st.none() | st.text())),
    (list[datetime], st.lists(datetimes, max_size=4)),
    (dict[str, Decimal], st.dictionaries(st.text(), decimals, max_size=4)),
    (dict[str, list[Line]], st.dictionaries(st.text(), st.lists(lines, max_size=2), max_size=3)),
]


@pytest.mark.parametrize(("field_type", "values"), SINGLE_TYPES, ids=lambda x: str(x)[:30])
def test_each_field_type_round_trips(field_type: Any, values: st.SearchStrategy[Any]) -> None:
    cls = attrs.make_class(
        "Single", {"value": attrs.field(type=field_type)}, bases=(DomainEvent,), frozen=True
    )
    cls = event("Single")(cls)
    registry = EventRegistry()
    registry.register(cls)
    codec = EventCodec(registry)

    @FAST
    @given(values)
    def check(value: Any) -> None:
        envelope = Envelope(cls(value), aggregate_id="x", aggregate_version=1)
        assert_identical(codec.decode(*codec.encode(envelope)).event, envelope.event)

    check()


def test_float_edge_values_are_exact() -> None:
    codec = CODEC
    for value in (0.1, -0.0, 5e-324, 1.7976931348623157e308, math.pi):
        env = Envelope(
            attrs.evolve(sample_everything(), ratio=value), aggregate_id="a", aggregate_version=1
        )
        decoded = codec.decode(*codec.encode(env)).event
        assert isinstance(decoded, Everything)
        assert struct.pack("<d", decoded.ratio) == struct.pack("<d", value)
