"""Personal fields: encrypted per subject on encode, decrypted on decode, erased by forgetting.

These tests use the codec alone (no log): the key store is in memory. The log-backed key
store, ``forget`` and the whole-app acceptance are in tests/privacy/.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import ClassVar

import orjson
import pytest
from attrs import frozen
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from eventlane.codec import Envelope, EventCodec, EventRegistry, SnapshotCodec
from eventlane.codec.keystore import LogKeyStore, MemoryKeyStore
from eventlane.codec.privacy import CIPHER_MARK
from eventlane.domain import Aggregate, DomainEvent, Snapshot, applies, event
from eventlane.domain.privacy import ERASED, personal, subject
from eventlane.errors import ConfigError, SerializationError, StaleSnapshotError
from eventlane.log.embedded.store import LogStore


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
    return rec.value, codec.decode(
        rec.key, rec.value, rec.headers, topic="t", partition=0, offset=7
    )


def test_personal_fields_never_reach_the_record_in_clear() -> None:
    codec = make_codec(MemoryKeyStore())
    env = Envelope(Registered("Ada Lovelace", Address("12 St James's Sq", "London")), "c-1", 1)
    value, back = roundtrip(codec, env)
    assert b"Ada" not in value and b"London" not in value and b"basic" in value
    data = orjson.loads(value)["data"]
    # one cipher object for all personal fields of the event; the others stay in clear
    assert set(data) == {"plan", CIPHER_MARK}
    # ["enc4", subject, key version, field names, topic, hex nonce + cipher text + tag]
    scheme, subject_id, version, names, topic, text = data[CIPHER_MARK]
    assert (scheme, subject_id, version, names, topic) == ("enc4", "c-1", 1, "name\0address", "")
    assert len(bytes.fromhex(text)) > 12 + 16
    assert back.event == env.event and back.erased == ()


def test_the_subject_field_chooses_the_key() -> None:
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    value, back = roundtrip(codec, Envelope(Referred("cust-9", "likes tea"), "order-1", 1))
    assert orjson.loads(value)["data"][CIPHER_MARK][1] == "cust-9"
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
    assert orjson.loads(new.value)["data"][CIPHER_MARK][2] == 2
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
    # after forget the upcaster gets the placeholder (a str it can upper-case), and the
    # decoded field is the declared placeholder again
    erased = codec.decode(stored.key, stored.value, topic="t", partition=0, offset=1)
    assert erased.event == Renamed(ERASED) and erased.erased == ("full_name",)


def test_tampering_and_wrong_keys_fail_with_coordinates_never_wrong_plain_text() -> None:
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    rec = codec.encode(Envelope(Registered("Ada", NOWHERE), "c-1", 1))
    doc = orjson.loads(rec.value)
    blob = bytearray(bytes.fromhex(doc["data"][CIPHER_MARK][-1]))
    blob[-1] ^= 1
    doc["data"][CIPHER_MARK][-1] = blob.hex()
    with pytest.raises(SerializationError, match="fail authentication") as info:
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=41)
    assert (info.value.topic, info.value.partition, info.value.offset) == ("customers", 2, 41)

    # the same cipher text under another subject's key (a moved or forged record)
    doc = orjson.loads(rec.value)
    keys.current("c-2")
    doc["data"][CIPHER_MARK][1] = "c-2"
    with pytest.raises(SerializationError, match="c-2"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=42)

    # another event's id bound into the associated data
    doc = orjson.loads(rec.value)
    doc["event_id"] = "00000000-0000-4000-8000-000000000000"
    with pytest.raises(SerializationError, match="fail authentication"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=43)

    # the field names are in clear but authenticated: swapping them fails, never swaps values
    doc = orjson.loads(rec.value)
    doc["data"][CIPHER_MARK][3] = "address\0name"
    with pytest.raises(SerializationError, match="fail authentication"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=44)

    # a malformed object (here: the key version as a string) names itself and its record
    doc = orjson.loads(rec.value)
    doc["data"][CIPHER_MARK][2] = "1"
    with pytest.raises(SerializationError, match="cipher object is malformed") as info:
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=45)
    assert info.value.offset == 45
    doc["data"][CIPHER_MARK] = ["enc3", "c-1", 1]  # too short
    with pytest.raises(SerializationError, match=r"not 5 \(enc3\) or 6 \(enc4\) items"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=46)
    doc["data"][CIPHER_MARK] = ["enc3", "c-1", 1, "name\0address", "not hex"]
    with pytest.raises(SerializationError, match="cipher object is malformed"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=47)
    doc["data"][CIPHER_MARK] = ["enc9", "c-1", 1, "name", "abcd"]
    with pytest.raises(SerializationError, match="unknown cipher scheme 'enc9'"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=47)
    # the plain text is authentic but not the object of the fields (a writer's bug)
    aead = AESGCM(keys.current("c-1")[1])
    nonce = b"\0" * 12
    aad = f"enc3\0c-1\0{doc['event_id']}\0name\0address".encode()
    body = aead.encrypt(nonce, b'["Ada", {"street": "", "city": ""}]', aad)
    doc["data"][CIPHER_MARK] = ["enc3", "c-1", 1, "name\0address", (nonce + body).hex()]
    with pytest.raises(SerializationError, match="not the values of name, address"):
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=2, offset=48)


def test_event_cipher_objects_written_as_enc2_still_read() -> None:
    """Events sealed before ``enc3`` hold an ``enc2`` object (the values as a JSON array, the
    names as a list): they decode, fail authentication when tampered, and read as erased
    once the subject is forgotten."""
    keys = MemoryKeyStore()
    codec = make_codec(keys)
    doc = orjson.loads(codec.encode(Envelope(Registered("x", NOWHERE, "gold"), "c-1", 1)).value)
    aead = AESGCM(keys.current("c-1")[1])
    nonce = b"\1" * 12
    body = aead.encrypt(
        nonce,
        orjson.dumps(["Ada", {"street": "a", "city": "b"}]),
        f"enc2\0c-1\0{doc['event_id']}\0name\0address".encode(),
    )
    doc["data"][CIPHER_MARK] = {
        CIPHER_MARK: "enc2",
        "s": "c-1",
        "k": 1,
        "f": ["name", "address"],
        "c": base64.b64encode(nonce + body).decode(),
    }
    env = codec.decode(None, orjson.dumps(doc))
    assert env.event == Registered("Ada", Address("a", "b"), "gold") and env.erased == ()
    doc["data"][CIPHER_MARK]["f"] = ["address", "name"]
    with pytest.raises(SerializationError, match="fail authentication") as info:
        codec.decode(None, orjson.dumps(doc), topic="customers", partition=0, offset=3)
    assert info.value.offset == 3
    doc["data"][CIPHER_MARK]["f"] = ["name", "address"]
    keys.forget("c-1")
    env = codec.decode(None, orjson.dumps(doc))
    assert env.event == Registered(ERASED, NOWHERE, "gold") and env.erased == ("name", "address")


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
    snap = Snapshot(
        aggregate_id="c-1", aggregate_version=4, snapshot_version=1, state={"name": "Ada Lovelace"}
    )
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


def test_a_key_forgotten_by_another_process_stops_decrypting_within_refresh_ms(
    tmp_path: Path,
) -> None:
    """Two key stores on one log stand for two processes. The reader's codec caches opened
    keys (no key lookup per event); the cache still follows the store, so a forget there is
    seen within ``refresh_ms``, and a new first key after it decrypts new data."""
    refresh_ms = 100
    with LogStore(tmp_path) as log_a, LogStore(tmp_path) as log_b:
        writer_keys = LogKeyStore(log_a, refresh_ms=refresh_ms)
        reader_keys = LogKeyStore(log_b, refresh_ms=refresh_ms)
        writer, reader = make_codec(writer_keys), make_codec(reader_keys)
        old = writer.encode(Envelope(Registered("Ada", NOWHERE), "c-1", 1))
        for _ in range(3):  # the reader opens c-1's key once and keeps it
            assert reader.decode(old.key, old.value).event.name == "Ada"
        assert writer_keys.forget("c-1")
        forgotten_at = time.monotonic()
        while reader.decode(old.key, old.value).erased != ("name", "address"):
            assert time.monotonic() - forgotten_at < refresh_ms / 1000 + 2.0  # slack: load
            time.sleep(0.005)
        # new data of the subject gets a new key version 1; the reader opens it, not the old
        new = writer.encode(Envelope(Registered("Ada L.", NOWHERE), "c-1", 2))
        deadline = time.monotonic() + refresh_ms / 1000 + 2.0
        while reader.decode(new.key, new.value).erased:  # its store has not seen the key yet
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert reader.decode(new.key, new.value).event.name == "Ada L."
        assert reader.decode(old.key, old.value).erased == ("name", "address")


class Holder(Aggregate):
    topic: ClassVar[str] = "holders"
    name: str

    def init_state(self) -> None:
        self.name = ""

    @applies
    def _registered(self, e: Registered) -> None:
        self.name = e.name


def test_enc4_binds_the_topic_and_the_aggregate_and_enc3_still_reads() -> None:
    """A cipher text copied unchanged into another aggregate's event (same subject, same
    event id) fails authentication; one bound to another topic is refused; ``enc3``
    objects (bound to subject, event id and names only) written before still decode."""
    keys = MemoryKeyStore()
    registry = EventRegistry()
    registry.register_aggregate(Holder)
    codec = EventCodec(registry, keys=keys)
    rec = codec.encode(Envelope(Registered("Ada", NOWHERE), "c-1", 1))
    doc = orjson.loads(rec.value)
    assert doc["data"][CIPHER_MARK][:5] == ["enc4", "c-1", 1, "name\0address", "holders"]
    assert codec.decode(None, rec.value).event.name == "Ada"
    moved = {**doc, "aggregate_id": "c-2"}  # copied into another aggregate's stream
    with pytest.raises(SerializationError, match="fail authentication"):
        codec.decode(None, orjson.dumps(moved), topic="holders", partition=0, offset=1)
    other = orjson.loads(rec.value)
    other["data"][CIPHER_MARK][4] = "elsewhere"  # claims another topic
    with pytest.raises(SerializationError, match="bound to topic 'elsewhere'"):
        codec.decode(None, orjson.dumps(other), topic="holders", partition=0, offset=2)
    # an enc3 object, as written before enc4
    aead = AESGCM(keys.current("c-1")[1])
    nonce = b"\2" * 12
    body = aead.encrypt(
        nonce,
        orjson.dumps({"name": "Grace", "address": {"street": "s", "city": "c"}}),
        f"enc3\0c-1\0{doc['event_id']}\0name\0address".encode(),
    )
    doc["data"][CIPHER_MARK] = ["enc3", "c-1", 1, "name\0address", (nonce + body).hex()]
    env = codec.decode(None, orjson.dumps(doc))
    assert env.event == Registered("Grace", Address("s", "c"))
    keys.forget("c-1")
    assert codec.decode(None, orjson.dumps(doc)).erased == ("name", "address")


def test_opened_keys_stay_bounded_however_many_subjects() -> None:
    """Issue 26 (memory): the cipher's AES-GCM objects (~2.6 KB of native memory each) were
    kept for up to 65,536 subjects; both of its caches now stay under _OPENED_KEYS."""
    codec = make_codec(MemoryKeyStore())
    for i in range(2548):
        env = Envelope(Registered(f"n{i}", Address("s", "c")), f"c-{i}", 1)
        assert roundtrip(codec, env)[1].event.name == f"n{i}"
    cipher = codec._cipher
    assert cipher is not None
    assert len(cipher._opened) <= 1024, len(cipher._opened)
    assert len(cipher._aeads) <= 1024, len(cipher._aeads)
