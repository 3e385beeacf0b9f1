"""``eventlane/codec/_seal.c`` (one C call opening an ``enc4`` cipher object) against
:meth:`FieldCipher.open`, the Python path it must equal.

The model: ``cryptography``'s AES-GCM and the associated data as docs/privacy.md and
privacy.py document them build each cipher object, from generated subjects, ids, topics,
field names, values and nonces; then a generated change is made to it (a flipped bit,
upper-case or odd-length or non-hex text, a wrong scheme, key version, topic, aggregate or
key, a plain text that is not a JSON object, an unknown key version, ...). Two
:class:`FieldCipher` objects over one real :class:`LogKeyStore` open it: one with the C
call first (falling back to :meth:`FieldCipher.open` when it declines, as the codec does),
one with the Python path alone; the C call runs with each engine it has (libsodium's
precomputed AES-256-GCM state, an OpenSSL EVP context). The outcomes (the opened data, the fields left sealed, or
the error's text and coordinates) must be equal, and an unchanged object must be opened by
the C call itself, not by the fallback.
"""

from __future__ import annotations

import binascii
import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlane.codec import Envelope, EventCodec, EventRegistry, _seal, privacy  # type: ignore[attr-defined]
from eventlane.codec.keystore import LogKeyStore
from eventlane.codec.privacy import CIPHER_MARK, FieldCipher, Sealed
from eventlane.errors import SerializationError
from eventlane.log.embedded.store import LogStore
from eventlane.log.partitioner import partition_for_key
from tests.codec.test_codec_privacy import Address, Customer, Registered

TOPIC = "members"
CHANGES = (
    "none",
    "flip",  # one bit of the nonce, cipher text or tag
    "upper",  # upper-case hex (unhexlify reads it)
    "odd",
    "not hex",
    "not ascii",
    "short",  # fewer bytes than a nonce and a tag
    "scheme",
    "version type",
    "subject type",
    "topic",  # bound to a topic the reader does not record the class in
    "items",  # 5 or 7 items
    "aggregate",  # sealed for another aggregate
    "unknown version",  # a key version the store never had: the fields are erased
    "wrong key",
    "list",  # the plain text is a JSON array
    "not json",
)

names = st.lists(
    st.text(
        st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=6,
    ),
    min_size=1,
    max_size=3,
    unique=True,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
texts = st.text(max_size=16)
# a few subjects (each new one is a key record written to the log), of varied characters
SUBJECTS = st.sampled_from(["m-1", "ü", "名前", "😀 x", "a\0b", "x" * 1200])  # 1200: > 1 KiB


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogKeyStore]:
    """A real key store; opened keys stay fresh for 10 minutes, so the C call is used."""
    with LogStore(tmp_path_factory.mktemp("keys")) as log:
        yield LogKeyStore(log, refresh_ms=600_000)


ENGINES = ("sodium", "openssl") if _seal.SODIUM else ("openssl",)


def test_the_extension_is_built() -> None:
    assert privacy._Opener is not None, "eventlane.codec._seal is not built"


def test_libsodium_opens_where_the_cpu_has_aes_gcm() -> None:
    """make installs libsodium-dev; only a CPU without AES-NI/PCLMULQDQ leaves OpenSSL."""
    flags = Path("/proc/cpuinfo").read_text().split()
    if "aes" in flags and "pclmulqdq" in flags:
        assert _seal.SODIUM, "eventlane.codec._seal is built without libsodium"
    assert _seal.Opener().engine == ("sodium" if _seal.SODIUM else "openssl")
    assert _seal.Opener(engine="openssl").engine == "openssl"


def cipher_with(keys: LogKeyStore, engine: str) -> FieldCipher:
    """A FieldCipher whose C call opens with ``engine``."""
    saved = privacy._Opener
    privacy._Opener = functools.partial(_seal.Opener, engine=engine)
    try:
        return FieldCipher(keys)
    finally:
        privacy._Opener = saved


def outcome(
    cipher: FieldCipher, data: dict[str, Any], case: dict[str, Any], native: bool
) -> tuple[Any, ...]:
    """What opening ``data`` gives: ("opened", data, erased, by C) or ("error", ...)."""
    by_c = False
    try:
        if native:  # as the codec calls it: again once open_key has opened a new key
            assert cipher.open4 is not None
            args = (data, case["event_id"], case["aggregate_id"], case["topics"])
            by_c = cipher.open4(*args) or (cipher.open_key(data) and cipher.open4(*args))
        erased = (
            ()
            if by_c
            else cipher.open(
                data, case["event_id"], "t", 1, 7, case["aggregate_id"], case["topics"]
            )
        )
    except SerializationError as exc:
        return ("error", str(exc), exc.topic, exc.partition, exc.offset)
    shown = {k: ("sealed", v.subject) if isinstance(v, Sealed) else v for k, v in data.items()}
    return ("opened", shown, erased, by_c)


def sealed_object(case: dict[str, Any], version: int, key: bytes, change: str) -> list[Any]:
    subject, fields = case["subject"], "\0".join(case["names"])
    aad_parts = [case["topic"], case["aggregate_id"], subject, case["event_id"], fields]
    if change == "aggregate":
        aad_parts[1] += "x"
    aad = "\0".join(["enc4", *aad_parts]).encode()
    plain = orjson.dumps(case["values"])
    if change == "list":
        plain = orjson.dumps(list(case["values"].values()))
    elif change == "not json":
        plain = b"{not json"
    if change == "wrong key":
        key = bytes(b ^ 1 for b in key)
    blob = case["nonce"] + AESGCM(key).encrypt(case["nonce"], plain, aad)
    if change == "flip":
        i = case["at"] % len(blob)
        blob = blob[:i] + bytes([blob[i] ^ (1 << case["at"] % 8)]) + blob[i + 1 :]
    elif change == "short":
        blob = blob[: case["at"] % 28]
    text = blob.hex()
    if change == "upper":
        text = text.upper()
    elif change == "odd":
        text = text[:-1]
    elif change == "not hex":
        text = text[:4] + "g" + text[5:]
    elif change == "not ascii":
        text = text[:4] + "é" + text[5:]
    sealed: list[Any] = ["enc4", subject, version, fields, case["topic"], text]
    if change == "scheme":
        sealed[0] = "enc3" if case["at"] % 2 else "enc5"
    elif change == "version type":
        sealed[2] = [True, float(version), str(version)][case["at"] % 3]
    elif change == "subject type":
        sealed[1] = 5
    elif change == "topic":
        sealed[4] = "elsewhere"
    elif change == "items":
        sealed = sealed[:5] if case["at"] % 2 else [*sealed, 0]
    elif change == "unknown version":
        sealed[2] = version + 1_000
    return sealed


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=200, deadline=None)
@given(
    subject=SUBJECTS,
    event_id=texts,
    aggregate_id=texts,
    names=names,
    data=st.data(),
    nonce=st.binary(min_size=12, max_size=12),
    reader_topics=st.sampled_from([frozenset(), frozenset({TOPIC}), frozenset({TOPIC, "b"})]),
    change=st.sampled_from(CHANGES),
    at=st.integers(0, 10_000),
)
def test_open4_equals_the_python_path(
    keys: LogKeyStore,
    engine: str,
    subject: str,
    event_id: str,
    aggregate_id: str,
    names: list[str],
    data: st.DataObject,
    nonce: bytes,
    reader_topics: frozenset[str],
    change: str,
    at: int,
) -> None:
    values = {n: data.draw(json_values) for n in names}
    case = {
        "subject": subject,
        "event_id": event_id,
        "aggregate_id": aggregate_id,
        "names": names,
        "values": values,
        "nonce": nonce,
        "topic": TOPIC,
        "topics": reader_topics,
        "at": at,
    }
    version, key = keys.current(subject)
    native, python = cipher_with(keys, engine), FieldCipher(keys)
    assert native._native.engine == engine
    # the first object of a subject opens its key (open_key), then the C call opens it
    valid = {"plan": "x", CIPHER_MARK: sealed_object(case, version, key, "none")}
    for _ in range(2):
        first = outcome(native, copy.deepcopy(valid), case, native=True)
        assert first[:3] == outcome(python, copy.deepcopy(valid), case, native=False)[:3]
        assert first[3], "an object the C call should open went to the Python path"
    if simple(values):  # what seal writes, parsed by the C call itself, not orjson.loads
        before = native._native.simple
        outcome(native, copy.deepcopy(valid), case, native=True)
        assert native._native.simple == before + 1, "the C call left simple values to orjson"

    changed = {"plan": "x", CIPHER_MARK: sealed_object(case, version, key, change)}
    got = outcome(native, copy.deepcopy(changed), case, native=True)
    want = outcome(python, copy.deepcopy(changed), case, native=False)
    assert got[:3] == want[:3]
    if change in ("none", "upper"):
        assert got[0] == "opened" and got[3], got


def simple(values: dict[str, Any]) -> bool:
    """Whether the C call parses these values itself (the rest go to ``orjson.loads``):
    names and strings orjson writes without an escape, integers of at most 18 digits,
    booleans and null, 32 names at most."""

    def plain(v: object) -> bool:
        if v is None or type(v) is bool:
            return True
        if type(v) is int:
            return abs(v) < 10**18
        return type(v) is str and b"\\" not in orjson.dumps(v)

    return len(values) <= 32 and all(plain(k) and plain(v) for k, v in values.items())


TOKENS = (  # JSON values written by hand: forms orjson.dumps never writes, and edge cases
    *(b"0", b"-0", b"-1", b"01", b"-01", b"1.0", b"1e2", b"2E3", b"-", b"1-", b"+1", b"0x1"),
    *(b"123456789012345678", b"-123456789012345678", b"1234567890123456789"),
    *(b"9223372036854775808", b"12345678901234567890123", b"18446744073709551616"),
    *(b'"\\u0041"', b'"a\\"b"', b'"\x01"', b'"\x1f"', b'"\x7f"', b'"\xc3\xa9"', b'"\xff"'),
    *(b'"\xed\xa0\x80"', b'"\xf0\x9f\x98\x80"', b'"\xc3"', b'"', b'""', b'"a'),
    *(b"true", b"false", b"null", b"tru", b"nul", b"True", b"[]", b"{}", b"[1,{}]"),
)


def hand_written(names: list[str], tokens: list[bytes], form: int) -> bytes:
    """A plain text of ``names`` with raw value ``tokens``, in one of several layouts."""
    pairs = [orjson.dumps(n) + b":" + t for n, t in zip(names, tokens, strict=True)]
    if form == 1:  # reordered
        pairs.reverse()
    elif form == 2:  # an extra name
        pairs.append(b'"extra":1')
    elif form == 3:  # a name missing
        pairs = pairs[1:]
    elif form == 4:  # a name twice
        pairs.append(pairs[0][: pairs[0].index(b":") + 1] + b"7")
    text = b"{" + b",".join(pairs) + b"}"
    if form == 5:
        text = text.replace(b":", b" : ")
    elif form == 6:
        text += b" "
    elif form == 7:
        text = text[:-1]
    elif form == 8:
        text += b"x"
    return text


@settings(max_examples=300, deadline=None)
@given(
    names=names,
    data=st.data(),
    form=st.integers(0, 8),
    nonce=st.binary(min_size=12, max_size=12),
)
def test_open4_reads_plain_texts_as_orjson_does(
    keys: LogKeyStore, names: list[str], data: st.DataObject, form: int, nonce: bytes
) -> None:
    """Authentic plain texts that seal never writes (hand-written values, whitespace,
    reordered, extra, missing or repeated names, cut or trailing bytes, invalid UTF-8):
    the C call's own parse of the values gives what orjson.loads and the Python path give,
    or leaves the object to them."""
    tokens = [data.draw(st.sampled_from(TOKENS)) for _ in names]
    case = {"subject": "m-1", "event_id": "e", "aggregate_id": "a", "topics": frozenset()}
    version, key = keys.current("m-1")
    fields = "\0".join(names)
    aad = "\0".join(["enc4", TOPIC, "a", "m-1", "e", fields]).encode()
    plain = hand_written(names, tokens, form)
    text = (nonce + AESGCM(key).encrypt(nonce, plain, aad)).hex()
    sealed = {"plan": "x", CIPHER_MARK: ["enc4", "m-1", version, fields, TOPIC, text]}
    native, python = cipher_with(keys, _seal.Opener().engine), FieldCipher(keys)
    outcome(native, copy.deepcopy(sealed), case, native=True)  # opens the key
    got = outcome(native, copy.deepcopy(sealed), case, native=True)
    assert got[:3] == outcome(python, copy.deepcopy(sealed), case, native=False)[:3]


def test_unhex_reads_each_ascii_character_as_unhexlify_does() -> None:
    """Every ASCII character at every place of a text of two sixteen-character blocks and
    a tail, in both cases of the digits around it: open4's hex decoding agrees with
    binascii.unhexlify on each."""
    for base in ("0123456789abcdef" * 2 + "a0", "FEDCBA9876543210" * 2 + "F9"):
        for at in range(len(base)):
            for code in range(128):
                text = base[:at] + chr(code) + base[at + 1 :]
                assert _seal.unhex(text) == unhexlify_or_none(text), text


# the hex alphabet's edges and neighbours (unhexlify reads 0-9, a-f, A-F and nothing else)
HEX_EDGES = "/09:@AFG`afg \x00\x7f"


def unhexlify_or_none(text: str) -> bytes | None:
    try:
        return binascii.unhexlify(text)
    except (binascii.Error, ValueError):
        return None


@settings(max_examples=500, deadline=None)
@given(
    blob=st.binary(max_size=80),
    upper=st.lists(st.booleans(), min_size=1, max_size=64),
    replace=st.lists(
        st.tuples(
            st.integers(0, 10_000),
            st.sampled_from(HEX_EDGES) | st.characters(max_codepoint=127),
        )
    ),
)
def test_unhex_equals_unhexlify(
    blob: bytes, upper: list[bool], replace: list[tuple[int, str]]
) -> None:
    """open4's hex decoding (sixteen characters at a time, the rest one pair at a time)
    against binascii.unhexlify over every ASCII character at any place, either case, every
    length around the blocks' edges."""
    text = "".join(c.upper() if upper[i % len(upper)] else c for i, c in enumerate(blob.hex()))
    for at, char in replace:
        if text:
            text = text[: at % len(text)] + char + text[at % len(text) + 1 :]
    assert _seal.unhex(text) == unhexlify_or_none(text), text
    if not replace:
        assert _seal.unhex(text) == blob


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(0, 70),
    nonce=st.binary(min_size=12, max_size=12),
    upper=st.lists(st.booleans(), min_size=1, max_size=64),
    replace=st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.sampled_from(HEX_EDGES))),
)
def test_open4_reads_hex_as_unhexlify_does(
    keys: LogKeyStore,
    size: int,
    nonce: bytes,
    upper: list[bool],
    replace: tuple[int, str] | None,
) -> None:
    """The C call's hex decoding (sixteen characters at a time, then one byte at a time for
    the rest) against unhexlify's, through the Python path: blobs of every length around the
    blocks' edges, each character's case chosen, and one character anywhere replaced by a
    neighbour of the alphabet. An object the C call declines is the Python path's, so only
    an opened object may differ: it must not."""
    case = {"subject": "m-1", "event_id": "e", "aggregate_id": "a", "topics": frozenset()}
    version, key = keys.current("m-1")
    aad = "\0".join(["enc4", TOPIC, "a", "m-1", "e", "n"]).encode()
    plain = orjson.dumps({"n": "x" * size})
    written = (nonce + AESGCM(key).encrypt(nonce, plain, aad)).hex()
    text = "".join(c.upper() if upper[i % len(upper)] else c for i, c in enumerate(written))
    if replace is not None:
        at, char = replace[0] % len(text), replace[1]
        text = text[:at] + char + text[at + 1 :]
    sealed = {"plan": "x", CIPHER_MARK: ["enc4", "m-1", version, "n", TOPIC, text]}
    native, python = cipher_with(keys, _seal.Opener().engine), FieldCipher(keys)
    outcome(native, copy.deepcopy(sealed), case, native=True)  # opens the key
    got = outcome(native, copy.deepcopy(sealed), case, native=True)
    want = outcome(python, copy.deepcopy(sealed), case, native=False)
    assert got[:3] == want[:3]
    if text.lower() == written:  # the same bytes: the C call opens it
        assert got[0] == "opened" and got[3], got


@pytest.mark.parametrize("topics", [frozenset(), frozenset({"elsewhere"})])
@pytest.mark.parametrize(
    ("record", "error"),
    [(b"[1]", "not a key list"), (b'{"keys":["AAAAAAAAAAAAAA=="]}', "key must be")],
)
def test_a_bad_key_record_fails_as_in_the_python_path(
    keys: LogKeyStore, topics: frozenset[str], record: bytes, error: str
) -> None:
    """open_key leaves the store's errors (a record that is not a key list, a key of 10
    bytes) to FieldCipher.open, which raises them in its own order: after the topic check
    (bound elsewhere: that error), else the key's."""
    keys.current("m-1")  # the key topic exists
    subject = f"bad-{len(topics)}-{len(record)}"
    key = subject.encode()
    keys.log.append(keys.topic, partition_for_key(key, keys.partitions), [(key, record, (), None)])
    text = (b"\0" * 12 + AESGCM(b"k" * 32).encrypt(b"\0" * 12, b'{"n":1}', b"")).hex()
    sealed = {"plan": "x", CIPHER_MARK: ["enc4", subject, 1, "n", TOPIC, text]}
    case = {"event_id": "e", "aggregate_id": "a", "topics": topics}
    native, python = cipher_with(keys, _seal.Opener().engine), FieldCipher(keys)
    got = outcome(native, copy.deepcopy(sealed), case, native=True)
    assert got == outcome(python, copy.deepcopy(sealed), case, native=False)
    assert got[0] == "error" and (error in got[1]) == (not topics), got


def test_the_codec_decodes_through_the_c_call(tmp_path: Path) -> None:
    """EventCodec.decode opens a sealed event by the C call, its subject's first event too
    (FieldCipher.open_key opens the key, then the C call is made again; the Python path
    made to fail shows it is not used), and gives what the Python path gives."""
    registry = EventRegistry()
    registry.register(Registered)
    registry.register_aggregate(Customer)
    with LogStore(tmp_path) as log:
        keys = LogKeyStore(log, refresh_ms=600_000)
        codec = EventCodec(registry, keys=keys)
        records = [
            codec.encode(
                Envelope(Registered(f"Ada {i}", Address("a", str(i)), "gold"), "c-1", i + 1)
            )
            for i in range(5)
        ]
        reader = EventCodec(registry, keys=LogKeyStore(log, refresh_ms=600_000))
        cipher = reader._cipher
        assert cipher is not None

        def refuse(*args: object) -> tuple[str, ...]:
            raise AssertionError("the Python path opened an event the C call should open")

        # the subject's key is not open in this reader: its first event opens it (open_key)
        python_open, cipher.open = cipher.open, refuse  # type: ignore[method-assign]
        fast = [reader.decode(*r) for r in records]
        cipher.open, cipher.open4 = python_open, None  # type: ignore[method-assign]
        assert fast == [reader.decode(*r) for r in records]
        assert fast == [codec.decode(*r) for r in records]
        assert fast[3].event == Registered("Ada 3", Address("a", "3"), "gold")
