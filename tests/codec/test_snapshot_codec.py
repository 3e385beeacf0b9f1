"""SnapshotCodec: snapshot records round-trip; a stale schema is refused before reading."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import orjson
import pytest
from codec_samples import Currency, Money, Tally

from eventlane.codec import SnapshotCodec
from eventlane.errors import SerializationError, StaleSnapshotError

CODEC = SnapshotCodec()
WHERE = {"topic": "tallies.snapshots", "partition": 1, "offset": 5}


def tally() -> Tally:
    tally = Tally("t-1")
    tally.count("A", Money(Decimal("2.50"), Currency.EUR), datetime(2024, 1, 1, tzinfo=UTC))
    tally.count(
        "A",
        Money(Decimal("1E+1"), Currency.USD),
        datetime(2024, 1, 2, 9, tzinfo=timezone(timedelta(hours=-5))),
    )
    tally.count(
        "B", Money(Decimal("0.01"), Currency.USD), datetime(2024, 1, 3, 0, 0, 0, 7, tzinfo=UTC)
    )
    return tally


def test_layout() -> None:
    key, value, headers = CODEC.encode(Tally, tally().take_snapshot())
    assert key == b"t-1"
    assert headers == [("snapshot-version", b"2"), ("aggregate-version", b"3")]
    assert orjson.loads(value) == {
        "aggregate_id": "t-1",
        "aggregate_version": 3,
        "snapshot_version": 2,
        "state": {
            "counts": {"A": 2, "B": 1},
            "last": ["B", {"amount": "0.01", "currency": "USD"}],
            "seen_at": [
                "2024-01-01T00:00:00+00:00",
                "2024-01-02T09:00:00-05:00",
                "2024-01-03T00:00:00.000007+00:00",
            ],
            "currency": "USD",
        },
    }


def test_round_trip_restores_an_identical_aggregate() -> None:
    live = tally()
    snapshot = CODEC.decode(Tally, *CODEC.encode(Tally, live.take_snapshot()), **WHERE)
    assert snapshot == live.take_snapshot()
    restored = Tally.from_snapshot(snapshot)
    assert isinstance(restored.last, tuple)
    assert restored.currency is Currency.USD
    assert [d.isoformat() for d in restored.seen_at] == [d.isoformat() for d in live.seen_at]
    assert restored.version == 3


def test_stale_schema_version_is_refused_before_reading_state() -> None:
    key, value, _ = CODEC.encode(Tally, tally().take_snapshot())
    doc = orjson.loads(value)
    doc["snapshot_version"] = 1
    doc["state"] = {"something": "else entirely"}
    with pytest.raises(StaleSnapshotError, match="schema version 1, the class has 2") as info:
        CODEC.decode(Tally, key, orjson.dumps(doc), **WHERE)
    assert (info.value.offset, info.value.version) == (5, 1)


def test_bad_snapshot_records() -> None:
    key, value, _ = CODEC.encode(Tally, tally().take_snapshot())
    doc = orjson.loads(value)
    doc["state"]["counts"]["A"] = "2"
    with pytest.raises(
        SerializationError, match=r"expected an integer, got str @ state\.counts\['A'\]"
    ) as info:
        CODEC.decode(Tally, key, orjson.dumps(doc), **WHERE)
    assert info.value.topic == "tallies.snapshots"
    with pytest.raises(SerializationError, match="not valid JSON"):
        CODEC.decode(Tally, key, b"{", **WHERE)
    with pytest.raises(SerializationError, match="lacks"):
        CODEC.decode(Tally, key, b"{}", **WHERE)
    with pytest.raises(SerializationError, match="key"):
        CODEC.decode(Tally, b"t-2", value, **WHERE)
    with pytest.raises(SerializationError, match="header"):
        CODEC.decode(Tally, key, value, [("snapshot-version", b"7")], **WHERE)
