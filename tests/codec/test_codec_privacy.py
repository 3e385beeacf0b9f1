"""Personal fields: encrypted per subject on encode, decrypted on decode, erased by forgetting.

These tests use the codec alone (no log): the key store is in memory. The log-backed key
store, ``forget`` and the whole-app acceptance are in tests/privacy/.
"""

from __future__ import annotations

import base64
from typing import ClassVar

import orjson
import pytest
from attrs import frozen

from framework.codec import Envelope, EventCodec, EventRegistry, SnapshotCodec
from framework.codec.privacy import CIPHER_MARK, MemoryKeyStore
from framework.domain import Aggregate, DomainEvent, Snapshot, event
from framework.domain.privacy import ERASED, personal, subject
from framework.errors import ConfigError, SerializationError, StaleSnapshotError


@frozen
class Address:
    street: str
    city: str


NOWHERE = Address("", "")


@event("Registered")
@frozen
class Registered(DomainEvent):
    name: str = personal()
    address: Address = personal(erased=NOWHERE)
    plan: str = "basic"


@event("Referred")
@frozen
class Referred(DomainEvent):
    referrer_id: str = subject()
    referrer_note: str = personal(erased="")


@event("Renamed", version=2)
@frozen
class Renamed(DomainEvent):
    full_name: str = personal()


class Customer(Aggregate):
    topic: ClassVar[str] = "customers"
    snapshot_every: ClassVar[int | None] = 2
    snapshot_subject: ClassVar[str | None] = "id"
    name: str

    def init_state(self) -> None:
        self.name = ""


def make_codec(keys: MemoryKeyStore | None = None) -> EventCodec:
    registry = EventRegistry()
    registry.register(Registered, Referred, Renamed)

    @registry.upcaster("Renamed", 1)
    def v1_to_v2(data: dict) -> dict:  # sees plain text: decryption runs before upcasting
        return {"full_name": data["name"].upper()}

    return EventCodec(registry, keys=keys)


def roundtrip(codec: EventCodec, env: Envelope) -> tuple[bytes, Envelope]:
    rec = codec.encode(env)
    return rec.value, codec.decode(rec.key, rec.value, rec.headers, topic="t", partition=0, offset=7)


def test_personal_fields_never_reach_the_record_in_clear() -> None:
    codec = make_codec(MemoryKeyStore())
    env = Envelope(Registered("Ada Lovelace", Address("12 St James's Sq", "London")), "c-1", 1)
    value, back = roundtrip(codec, env)
    assert b"Ada" not in value and b"London" not in value and b"basic" in value
    data = orjson.loads(value)["data"]
    # one cipher object for all personal fields of the event; the others stay in clear
    assert set(data) == {"plan", CIPHER_MARK}
    sealed = data[CIPHER_MARK]
    assert sealed[CIPHER_MARK] == "enc2" and sealed["s"] == "c-1" and sealed["k"] == 1
    assert sealed["f"] == ["name", "address"]
    assert back.event == env.event and back.erased == ()


def test_the_subject_field_chooses_the_key() -> None:
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    value, back = roundtrip(codec, Envelope(Referred("cust-9", "likes tea"), "order-1", 1))
    assert orjson.loads(value)["data"][CIPHER_MARK]["s"] == "cust-9"
    assert back.event.referrer_note == "likes tea"
    keys.forget("order-1")  # the aggregate's subject is not the event's subject
    assert roundtrip(codec, Envelope(Referred("cust-9", "x"), "order-1", 1))[1].erased == ()


def test_a_forgotten_subject_reads_as_the_declared_placeholders() -> None:
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    rec = codec.encode(Envelope(Registered("Ada", Address("a", "b"), "gold"), "c-1", 1))
    other = codec.encode(Envelope(Registered("Bob", Address("c", "d")), "c-2", 1))
    assert keys.forget("c-1")
    env = codec.decode(rec.key, rec.value, rec.headers)
    assert env.event == Registered(ERASED, NOWHERE, "gold")
    assert env.erased == ("name", "address")
    assert codec.decode(other.key, other.value).event.name == "Bob"


def test_rotation_keeps_old_cipher_texts_readable() -> None:
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    old = codec.encode(Envelope(Registered("Ada", NOWHERE), "c-1", 1))
    assert keys.rotate("c-1") == 2
    new = codec.encode(Envelope(Registered("Ada L.", NOWHERE), "c-1", 2))
    assert orjson.loads(new.value)["data"][CIPHER_MARK]["k"] == 2
    assert codec.decode(old.key, old.value).event.name == "Ada"
    assert codec.decode(new.key, new.value).event.name == "Ada L."


def test_upcasters_see_decrypted_values() -> None:
    keys = MemoryKeyStore()

    @event("Renamed", version=1)
    @frozen
    class RenamedV1(DomainEvent):  # what an older app version wrote
        name: str = personal()

    old_registry = EventRegistry()
    old_registry.register(RenamedV1)
    stored = EventCodec(old_registry, keys=keys).encode(Envelope(RenamedV1("ada"), "c-1", 1))
    codec = make_codec(keys)
    assert codec.decode(stored.key, stored.value).event == Renamed("ADA")
    keys.forget("c-1")
    with pytest.raises(SerializationError):
        # the upcaster cannot upper-case an erased value: it gets a marker, not a str
        codec.decode(stored.key, stored.value, topic="t", partition=0, offset=1)


def test_tampering_and_wrong_keys_fail_with_coordinates_never_wrong_plain_text() -> None:
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    rec = codec.encode(Envelope(Registered("Ada", NOWHERE), "c-1", 1))
    doc = orjson.loads(rec.value)
    blob = bytearray(base64.b64decode(doc["data"][CIPHER_MARK]["c"]))
    blob[-1] ^= 1
    doc["data"][CIPHER_MARK]["c"] = base64.b64encode(bytes(blob)).decode()
    with pytest.raises(SerializationError, match="fail authentication") as info:
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=41)
    assert (info.value.topic, info.value.partition, info.value.offset) == ("customers", 2, 41)

    # the same cipher text under another subject's key (a moved or forged record)
    doc = orjson.loads(rec.value)
    keys.current("c-2")
    doc["data"][CIPHER_MARK]["s"] = "c-2"
    with pytest.raises(SerializationError, match="c-2"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=42)

    # another event's id bound into the associated data
    doc = orjson.loads(rec.value)
    doc["event_id"] = "00000000-0000-4000-8000-000000000000"
    with pytest.raises(SerializationError, match="fail authentication"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=43)

    # the field names are in clear but authenticated: swapping them fails, never swaps values
    doc = orjson.loads(rec.value)
    doc["data"][CIPHER_MARK]["f"] = ["address", "name"]
    with pytest.raises(SerializationError, match="fail authentication"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=44)

    # a malformed object (here: the key version as a string) names itself and its record
    doc = orjson.loads(rec.value)
    doc["data"][CIPHER_MARK]["k"] = "1"
    with pytest.raises(SerializationError, match="cipher object is malformed") as info:
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=45)
    assert info.value.offset == 45


def test_per_field_cipher_objects_written_before_enc2_still_read() -> None:
    """Events written by the first release sealed each personal field alone (``enc1``):
    they decode, and read as erased once the subject is forgotten."""
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    cipher = codec._cipher
    assert cipher is not None
    event_id = "6a1c2c1e-4f7b-4d7e-9c55-3f2b5f1d8e01"
    data = {
        "name": cipher.seal_value("c-1", "Ada", "name", event_id),
        "address": cipher.seal_value("c-1", {"street": "a", "city": "b"}, "address", event_id),
        "plan": "gold",
    }
    doc = orjson.loads(codec.encode(Envelope(Registered("x", NOWHERE), "c-1", 1)).value)
    doc["event_id"], doc["data"] = event_id, data
    env = codec.decode(None, orjson.dumps(doc))
    assert env.event == Registered("Ada", Address("a", "b"), "gold")
    keys.forget("c-1")
    env = codec.decode(None, orjson.dumps(doc))
    assert env.event == Registered(ERASED, NOWHERE, "gold") and env.erased == ("name", "address")


def test_without_a_key_store_personal_events_fail_clearly() -> None:
    with pytest.raises(SerializationError, match="no key store"):
        make_codec().encode(Envelope(Registered("Ada", NOWHERE), "c-1", 1))
    rec = make_codec(MemoryKeyStore()).encode(Envelope(Registered("Ada", NOWHERE), "c-1", 1))
    with pytest.raises(SerializationError, match="encrypted personal fields") as info:
        make_codec().decode(rec.key, rec.value, topic="t", partition=1, offset=5)
    assert info.value.offset == 5


def test_declaration_errors() -> None:
    with pytest.raises(ConfigError, match="cannot also be personal"):

        @event("Bad")
        @frozen
        class Bad(DomainEvent):
            who: str = subject(metadata={"eventlane.personal": ERASED})

        codec = make_codec(MemoryKeyStore())
        codec.registry.register(Bad)
        codec.encode(Envelope(Bad("x"), "a", 1))


def test_snapshots_of_aggregates_with_a_subject_are_sealed_and_erased() -> None:
    keys = MemoryKeyStore()
    codec = SnapshotCodec(keys=keys)
    snap = Snapshot(aggregate_id="c-1", aggregate_version=4, snapshot_version=1,
                    state={"name": "Ada Lovelace"})
    rec = codec.encode(Customer, snap)
    assert b"Ada" not in rec.value
    assert codec.decode(Customer, rec.key, rec.value, rec.headers).state == {"name": "Ada Lovelace"}
    # bound to the aggregate version: a sealed state replayed into another version fails
    doc = orjson.loads(rec.value)
    doc["aggregate_version"] = 6
    with pytest.raises(SerializationError, match="fails authentication"):
        codec.decode(Customer, rec.key, orjson.dumps(doc), topic="s", partition=0, offset=1)
    keys.forget("c-1")
    with pytest.raises(StaleSnapshotError, match="forgotten"):
        codec.decode(Customer, rec.key, rec.value, rec.headers)
    with pytest.raises(StaleSnapshotError, match="no key store"):
        SnapshotCodec().decode(Customer, rec.key, rec.value, rec.headers)
