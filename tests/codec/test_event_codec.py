"""EventCodec: record layout, and a clear SerializationError (with coordinates) for every
kind of bad input; nothing raw from orjson or cattrs escapes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import orjson
import pytest
from attrs import evolve
from codec_samples import EXPECTED_ORDER as EXPECTED
from codec_samples import (
    Currency,
    Customer,
    Everything,
    Line,
    OrderPlaced,
    golden,
    order_registry,
    sample_everything,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlane.codec import (
    EncodedRecord,
    Envelope,
    EventCodec,
    EventRegistry,
    event_type_from_headers,
)
from eventlane.errors import SerializationError, UnknownEventTypeError, UpcastError

CODEC = EventCodec(order_registry())
WHERE = {"topic": "orders", "partition": 2, "offset": 77}
ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def current_value(**changes: Any) -> bytes:
    doc = orjson.loads(golden("order_placed.v3.json"))
    for path, new in changes.items():
        target = doc
        *parents, last = path.split("__")
        for parent in parents:
            target = target[int(parent)] if isinstance(target, list) else target[parent]
        if new is ...:
            del target[last]
        else:
            target[last] = new
    return orjson.dumps(doc)


def decode_error(
    value: bytes | None, key: bytes | None = None, headers: Any = ()
) -> SerializationError:
    with pytest.raises(SerializationError) as info:
        CODEC.decode(key, value, headers, **WHERE)
    error = info.value
    assert (error.topic, error.partition, error.offset) == ("orders", 2, 77)
    assert "topic=orders, partition=2, offset=77" in str(error)
    return error


def test_record_layout() -> None:
    record = CODEC.encode(EXPECTED)
    assert isinstance(record, EncodedRecord)
    doc = orjson.loads(record.value)
    assert list(doc) == [
        "type",
        "version",
        "aggregate_id",
        "aggregate_version",
        "event_id",
        "timestamp",
        "correlation_id",
        "causation_id",
        "data",
    ]
    assert event_type_from_headers(record.headers) == ("OrderPlaced", 3)


def test_optional_headers_appear_only_when_set() -> None:
    bare = Envelope(EXPECTED.event, aggregate_id="order-7", aggregate_version=2)
    assert [name for name, _ in CODEC.encode(bare).headers] == [
        "event-type",
        "event-version",
        "event-id",
    ]
    both = Envelope(
        EXPECTED.event,
        aggregate_id="order-7",
        aggregate_version=2,
        correlation_id="c",
        causation_id="d",
    )
    assert CODEC.encode(both).headers[3:] == [("correlation-id", b"c"), ("causation-id", b"d")]


def test_envelope_invariants() -> None:
    with pytest.raises(ValueError, match="aggregate_version must be >= 1"):
        Envelope(EXPECTED.event, aggregate_id="a", aggregate_version=0)
    with pytest.raises(ValueError, match="aggregate_id"):
        Envelope(EXPECTED.event, aggregate_id="", aggregate_version=1)
    with pytest.raises(ValueError, match="timezone-aware"):
        Envelope(
            EXPECTED.event, aggregate_id="a", aggregate_version=1, timestamp=datetime(2024, 1, 1)
        )
    paris = datetime(2024, 1, 1, 13, tzinfo=timezone(timedelta(hours=1)))
    envelope = Envelope(EXPECTED.event, aggregate_id="a", aggregate_version=1, timestamp=paris)
    assert envelope.timestamp.isoformat() == "2024-01-01T12:00:00+00:00"
    assert (envelope.type_name, envelope.schema_version) == ("OrderPlaced", 3)
    assert isinstance(envelope.event_id, UUID)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (None, "tombstone"),
        (b"[1, 2]", "JSON list, expected an object"),
        (b'{"type": "OrderPlaced"}', 'lacks a string "type" and an integer "version"'),
        (
            b'{"type": "OrderPlaced", "version": "3"}',
            'lacks a string "type" and an integer "version"',
        ),
    ],
)
def test_malformed_values(value: bytes | None, message: str) -> None:
    assert message in str(decode_error(value))


def test_missing_envelope_field() -> None:
    error = decode_error(current_value(event_id=...))
    assert "lacks the envelope field 'event_id'" in str(error)
    assert (error.type_name, error.version) == ("OrderPlaced", 3)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"aggregate_version": "1"}, "aggregate_version must be an integer, got str"),
        ({"data": []}, "data must be an object, got list"),
        ({"causation_id": 5}, "causation_id must be a string or null, got int"),
        ({"event_id": "not-a-uuid"}, "bad envelope field"),
        ({"timestamp": "yesterday"}, "bad envelope field"),
        ({"timestamp": "2024-05-01T12:30:45"}, "timezone-aware"),
        ({"aggregate_version": 0}, "aggregate_version must be >= 1"),
    ],
)
def test_bad_envelope_fields(changes: dict[str, Any], message: str) -> None:
    error = decode_error(current_value(**changes))
    assert message in str(error)
    assert "type=OrderPlaced, version=3" in str(error)


def test_wrong_field_types_are_listed_with_paths() -> None:
    error = decode_error(
        current_value(data__lines__0__quantity="2", data__currency="GBP", data__customer__name=1)
    )
    text = str(error)
    assert "cannot decode OrderPlaced into OrderPlaced" in text
    assert "expected an integer, got str @ data.lines[0].quantity" in text
    assert "@ data.currency" in text
    assert "expected a string, got int @ data.customer.name" in text
    assert (error.type_name, error.version) == ("OrderPlaced", 3)


def test_missing_field() -> None:
    error = decode_error(current_value(data__coupon=...))
    assert "required field missing @ data.coupon" in str(error)


def test_wrong_field_type_after_upcasting_names_the_stored_version() -> None:
    doc = orjson.loads(golden("order_created.v1.json"))
    doc["data"]["lines"][0]["qty"] = 2.5
    error = decode_error(orjson.dumps(doc))
    assert "(upcast from version 1)" in str(error)
    assert "expected an integer, got float @ data.lines[0].quantity" in str(error)


def test_unknown_type_names_type_version_and_coordinates() -> None:
    error = decode_error(current_value(type="OrderTeleported", version=9))
    assert isinstance(error, UnknownEventTypeError)
    assert "type=OrderTeleported, version=9, topic=orders, partition=2, offset=77" in str(error)


def test_version_newer_than_the_code() -> None:
    error = decode_error(current_value(version=4))
    assert isinstance(error, UnknownEventTypeError)
    assert "newer than the registered class" in str(error)


def test_failing_upcaster_is_an_upcast_error_with_coordinates() -> None:
    registry = order_registry()
    registry.register(Everything)
    codec = EventCodec(EventRegistry())
    codec.registry.register(OrderPlaced)
    codec.registry.add_upcaster("OrderPlaced", 2, lambda data: data["missing"])
    codec.registry.add_upcaster("OrderPlaced", 1, lambda data: [data])  # returns a list
    with pytest.raises(
        UpcastError, match=r"from version 2 to 3 .* failed: KeyError\('missing'\)"
    ) as info:
        codec.decode(None, golden("order_placed.v2.json"), **WHERE)
    assert (info.value.offset, info.value.version) == (77, 2)
    codec.registry.add_alias("OrderCreated", "OrderPlaced")
    with pytest.raises(UpcastError, match="from version 1 returned list, expected a dict"):
        codec.decode(None, golden("order_created.v1.json"), **WHERE)


def test_key_and_headers_must_agree_with_the_value() -> None:
    value = golden("order_placed.v3.json")
    assert "differs from the value's aggregate_id" in str(decode_error(value, key=b"order-8"))
    error = decode_error(value, headers=[("event-type", b"OrderShipped")])
    assert "event-type=b'OrderShipped' disagrees" in str(error)
    error = decode_error(value, headers=[("event-version", b"2")])
    assert "event-version=b'2' disagrees" in str(error)
    # Unrelated headers are fine.
    assert CODEC.decode(b"order-7", value, [("trace", b"x")]) == EXPECTED


def test_encode_errors() -> None:
    with pytest.raises(UnknownEventTypeError, match="not registered"):
        EventCodec(EventRegistry()).encode(EXPECTED)
    lying = Envelope(
        EXPECTED.event,
        aggregate_id="a",
        aggregate_version=1,
        type_name="OrderPlaced",
        schema_version=2,
    )
    with pytest.raises(SerializationError, match="envelope says 'OrderPlaced' version 2"):
        CODEC.encode(lying)
    too_big = evolve(EXPECTED.event, lines=(Line("A", 2**64, EXPECTED.event.lines[0].unit_price),))
    with pytest.raises(SerializationError, match="cannot encode OrderPlaced") as info:
        CODEC.encode(evolve(EXPECTED, event=too_big))
    assert (info.value.type_name, info.value.version) == ("OrderPlaced", 3)


def test_non_finite_float_and_sub_second_offset_are_refused() -> None:
    registry = EventRegistry()
    registry.register(Everything)
    everything = EventCodec(registry)
    for change in (
        {"ratio": float("nan")},
        {"ratio": float("inf")},
        {"at": datetime(2024, 1, 1, tzinfo=timezone(timedelta(microseconds=5)))},
    ):
        envelope = Envelope(
            evolve(sample_everything(), **change), aggregate_id="a", aggregate_version=1
        )
        with pytest.raises(SerializationError, match="cannot encode Everything"):
            everything.encode(envelope)


def test_decoded_event_is_the_current_class() -> None:
    event = CODEC.decode(None, golden("order_created.v1.json")).event
    assert isinstance(event, OrderPlaced)
    assert event.customer == Customer("Ada", None)
    assert event.currency is Currency.EUR


@settings(deadline=None, max_examples=300)
@given(
    st.one_of(
        st.binary(),
        st.recursive(
            st.none() | st.booleans() | ints64 | st.floats(allow_nan=False) | st.text(),
            lambda children: st.lists(children) | st.dictionaries(st.text(), children),
            max_leaves=20,
        ).map(orjson.dumps),
        st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(["OrderPlaced", "OrderCreated", "X"]) | ints64,
                "version": st.integers(0, 4) | st.text(),
                "aggregate_id": st.text() | ints64,
                "aggregate_version": st.integers(-1, 3) | st.text(),
                "event_id": st.uuids().map(str) | st.text(),
                "timestamp": st.datetimes().map(str) | st.text(),
                "correlation_id": st.none() | st.text() | ints64,
                "causation_id": st.none() | st.text(),
                "data": st.dictionaries(st.text(), ints64 | st.text()) | ints64,
            },
        ).map(orjson.dumps),
    )
)
def test_garbage_raises_only_serialization_errors(value: bytes) -> None:
    try:
        CODEC.decode(None, value, **WHERE)
    except SerializationError as error:
        assert error.offset == 77
