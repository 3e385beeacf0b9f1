"""Golden records: bytes written by every past version read back as today's class, and
today's encoding is byte-for-byte the checked-in current-version file."""

from __future__ import annotations

from pathlib import Path

import pytest
from codec_samples import EXPECTED_ORDER as EXPECTED
from codec_samples import GOLDEN, OrderPlaced, golden, order_registry

from eventlane import App
from eventlane.codec import EventCodec


@pytest.mark.parametrize(
    ("file", "stored_type", "stored_version"),
    [
        ("order_created.v1.json", b"OrderCreated", b"1"),
        ("order_placed.v2.json", b"OrderPlaced", b"2"),
        ("order_placed.v3.json", b"OrderPlaced", b"3"),
    ],
)
def test_every_stored_version_reads_as_the_current_class(
    file: str, stored_type: bytes, stored_version: bytes
) -> None:
    codec = EventCodec(order_registry())
    headers = [
        ("event-type", stored_type),
        ("event-version", stored_version),
        ("event-id", b"0d3f6c2e-5b1a-4c8e-9f7d-2a6b4e8c1f30"),
        ("correlation-id", b"req-42"),
    ]
    decoded = codec.decode(b"order-7", golden(file), headers, topic="orders", partition=0, offset=9)
    assert decoded == EXPECTED
    assert (decoded.type_name, decoded.schema_version) == ("OrderPlaced", 3)
    # The value alone (what Spark sees) decodes to the same envelope.
    assert codec.decode(None, golden(file)) == EXPECTED


def test_encoding_today_is_exactly_the_current_golden_file() -> None:
    key, value, headers = EventCodec(order_registry()).encode(EXPECTED)
    assert key == b"order-7"
    assert value == golden("order_placed.v3.json")
    assert headers == [
        ("event-type", b"OrderPlaced"),
        ("event-version", b"3"),
        ("event-id", b"0d3f6c2e-5b1a-4c8e-9f7d-2a6b4e8c1f30"),
        ("correlation-id", b"req-42"),
    ]


def test_golden_files_cover_every_version_up_to_the_current_one() -> None:
    versions = sorted(int(p.name.split(".v")[1].split(".")[0]) for p in GOLDEN.glob("order_*.json"))
    assert versions == list(range(1, OrderPlaced.event_version + 1))


def test_an_app_gives_its_codec_without_a_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``App.codec()``: what a runtime decodes with, for golden-file tests of an app's events;
    nothing is opened or created."""
    monkeypatch.chdir(tmp_path)
    codec = App("orders", registry=order_registry(), events=[OrderPlaced]).codec()
    assert codec.decode(None, golden("order_created.v1.json")) == EXPECTED
    assert codec.encode(EXPECTED) == EventCodec(order_registry()).encode(EXPECTED)
    assert list(tmp_path.iterdir()) == []
