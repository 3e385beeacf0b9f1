"""Crypto-shredding: personal fields encrypted per subject, erased by destroying the key.

Fields declared with :func:`framework.domain.privacy.personal` never reach the log in clear.
:class:`FieldCipher` takes them out of the event's JSON ``data`` and puts one cipher object
for all of them under the reserved key ``"$eventlane"``::

    {"plan": "gold",
     "$eventlane": {"$eventlane": "enc2", "s": <subject id>, "k": <key version>,
                    "f": ["name", "address"], "c": <base64 nonce + cipher text + tag>}}

``c`` is AES-256-GCM (``cryptography``'s AESGCM) of the JSON array of the fields' values, in
the order of ``f``, under the subject's key, with a 96-bit random nonce first, and the
associated data ``enc2 \\0 subject \\0 event id \\0 field names (\\0-separated)``: a cipher text
moved to another event or subject, or a renamed/reordered field list, fails authentication
instead of decrypting there. One cipher object per event means one key lookup, one
decryption and one JSON parse per event, whatever the number of personal fields. The object
is self-describing, so decoding needs no class declaration of the *stored* version
(upcasters then see plain values); subject ids, key versions and field names stay in clear.

Single values (sealed snapshot states, and events written by eventlane before ``enc2``) use
the per-value form ``{"$eventlane": "enc1", "s": ..., "k": ..., "c": ...}`` with the
associated data ``enc1 \\0 subject \\0 field name \\0 bound id``; decoding reads both.

Keys live in a :class:`KeyStore`: :class:`LogKeyStore` keeps them in a compacted topic
(one record per subject, its value every key version; a tombstone once forgotten), and
:class:`MemoryKeyStore` in memory (tests). On read:

* key present: the fields decrypt; a cipher text that fails authentication, or a key of
  the wrong length, raises :class:`~framework.errors.SerializationError` with the
  record's coordinates, never wrong plain text;
* key forgotten (or never known here): the fields become the class's declared ``erased``
  values, and the decoded envelope lists them in ``erased``.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
import time
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import structlog

from framework.domain.privacy import PersonalField, personal_fields, subject_field
from framework.errors import ConcurrencyError, ConfigError, SerializationError
from framework.log import Log
from framework.log.partitioner import partition_for_key

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "CIPHER_MARK",
    "FieldCipher",
    "KeyStore",
    "LogKeyStore",
    "MemoryKeyStore",
    "Sealed",
]

log = structlog.get_logger("eventlane.codec")

CIPHER_MARK = "$eventlane"
_SCHEME = "enc1"  # one value (snapshot states; events before enc2)
_EVENT_SCHEME = "enc2"  # all personal fields of one event
_NONCE = 12
_NUL = "\0"
KEY_TOPIC_CONFIG: Mapping[str, object] = {
    "cleanup_policy": "compact",
    "retention_ms": -1,
    "min_compaction_lag_ms": 0,
}


@cache
def _aead() -> type[AESGCM]:
    """``cryptography``'s AES-GCM, imported on first use (it costs ~20 ms to import)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

    return AESGCM


@cache
def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag  # noqa: PLC0415

    return InvalidTag


def new_key() -> bytes:
    """32 random bytes: a fresh AES-256 key."""
    return os.urandom(32)


class KeyStore(Protocol):
    """Where subjects' data keys live. Keys are 32 random bytes, numbered from 1."""

    def current(self, subject: str) -> tuple[int, bytes]:
        """The subject's newest key (version, bytes), created on first use."""
        ...

    def get(self, subject: str, version: int) -> bytes | None:
        """Key ``version`` of ``subject``; ``None`` once forgotten (or never created)."""
        ...

    def rotate(self, subject: str) -> int:
        """Add a new key version (used for new writes; old versions still decrypt)."""
        ...

    def forget(self, subject: str) -> bool:
        """Destroy every key of ``subject``; ``False`` if it had none."""
        ...


class MemoryKeyStore:
    """A :class:`KeyStore` in a dict: for tests and tools that need no durability."""

    def __init__(self) -> None:
        self._keys: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()

    def current(self, subject: str) -> tuple[int, bytes]:
        with self._lock:
            keys = self._keys.setdefault(subject, [])
            if not keys:
                keys.append(new_key())
            return len(keys), keys[-1]

    def get(self, subject: str, version: int) -> bytes | None:
        keys = self._keys.get(subject)
        return keys[version - 1] if keys and 1 <= version <= len(keys) else None

    def rotate(self, subject: str) -> int:
        with self._lock:
            keys = self._keys.setdefault(subject, [])
            keys.append(new_key())
            return len(keys)

    def forget(self, subject: str) -> bool:
        with self._lock:
            return self._keys.pop(subject, None) is not None


class LogKeyStore:
    """A :class:`KeyStore` on a compacted topic of any :class:`~framework.log.Log`.

    Record format: key = the subject id (UTF-8), value = ``{"keys": [<base64 key v1>, ...]}``
    (JSON), or ``null`` (a tombstone) once forgotten; compaction then leaves only the
    tombstone, so the key bytes are gone from the log. Writes are conditional on the
    subject's last record (:class:`~framework.log.types.Expect`), so two processes can
    never give one subject two different first keys.

    The store caches what it read and catches up with the topic at most every
    ``refresh_ms`` (and on every miss): a subject forgotten by another process stops
    decrypting here within ``refresh_ms``.
    """

    def __init__(
        self,
        log_: Log,
        topic: str = "__eventlane_keys",
        *,
        partitions: int = 1,
        refresh_ms: int = 50,
    ) -> None:
        self.log = log_
        self.topic = topic
        self._create_partitions = partitions
        self._partitions = 0  # known once the topic exists (created on the first key)
        self._refresh_s = refresh_ms / 1000.0
        self._positions: list[int] = []
        self._keys: dict[str, list[bytes] | None] = {}
        self._heads: dict[str, int] = {}  # subject -> offset of its last record
        self._checked = 0.0
        self._lock = threading.RLock()

    def _ensure_topic(self) -> None:
        """Create the key topic on the first key written (reads of a missing topic see no
        keys, so opening an app that only looks never creates it)."""
        if not self._partitions:
            self.log.create_topic(
                self.topic, self._create_partitions, KEY_TOPIC_CONFIG, exist_ok=True
            )
            self._catch_up(force=True)

    @property
    def refresh_seconds(self) -> float:
        """How stale this store's cache may be: it catches up at most this often."""
        return self._refresh_s

    # -- reading ---------------------------------------------------------------------------
    def _catch_up(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self._refresh_s:
            return
        with self._lock:
            if not self._partitions:
                if not self.log.topic_exists(self.topic):
                    self._checked = now
                    return
                self._partitions = self.log.partition_count(self.topic)
                self._positions = [0] * self._partitions
            for p in range(self._partitions):
                offsets = self.log.offsets(self.topic, p)
                position = max(self._positions[p], offsets.lwm)
                while position < offsets.hwm:
                    records, _ = self.log.read(self.topic, p, position, upto=offsets.hwm)
                    if not records:
                        break
                    for record in records:
                        self._apply(record.key, record.value, record.offset, p)
                    position = records[-1].offset + 1
                self._positions[p] = position
            self._checked = now

    def _apply(self, key: bytes | None, value: bytes | None, offset: int, partition: int) -> None:
        if key is None:
            return
        subject = key.decode()
        self._heads[subject] = offset
        if value is None:
            self._keys[subject] = None
            return
        try:
            doc = orjson.loads(value)
            keys = [binascii.a2b_base64(k) for k in doc["keys"]]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SerializationError(
                f"key record of subject {subject!r} is not a key list: {exc}",
                topic=self.topic,
                partition=partition,
                offset=offset,
            ) from None
        self._keys[subject] = keys

    def _lookup(self, subject: str) -> list[bytes] | None:
        self._catch_up()
        if subject not in self._keys:
            self._catch_up(force=True)
        return self._keys.get(subject)

    def get(self, subject: str, version: int) -> bytes | None:
        keys = self._keys.get(subject)  # None: forgotten or not seen yet (_lookup tells)
        if keys is None or time.monotonic() - self._checked >= self._refresh_s:
            keys = self._lookup(subject)
        return keys[version - 1] if keys and 0 < version <= len(keys) else None

    # -- writing ---------------------------------------------------------------------------
    def _write(self, subject: str, keys: list[bytes] | None) -> None:
        """Append the subject's new key list (or a tombstone), conditional on its head."""
        from framework.log.types import Expect  # noqa: PLC0415

        self._ensure_topic()
        key = subject.encode()
        partition = partition_for_key(key, self._partitions)
        value = None if keys is None else orjson.dumps(
            {"keys": [base64.b64encode(k).decode() for k in keys]}
        )
        result = self.log.append(
            self.topic,
            partition,
            [(key, value, (), None)],
            expect=Expect(key, self._heads.get(subject)),
        )
        self._heads[subject] = result.last_offset
        self._keys[subject] = keys

    def _update(self, subject: str, change: Any) -> Any:
        for _ in range(20):
            with self._lock:
                self._catch_up(force=True)
                try:
                    return change(self._keys.get(subject))
                except ConcurrencyError:
                    continue  # another process wrote this subject: read it, decide again
        raise ConcurrencyError(
            f"key of subject {subject!r} keeps changing", expected=0, actual=0, topic=self.topic
        )

    def current(self, subject: str) -> tuple[int, bytes]:
        keys = self._keys.get(subject)
        if keys:
            return len(keys), keys[-1]

        def create(existing: list[bytes] | None) -> tuple[int, bytes]:
            if existing:
                return len(existing), existing[-1]
            if existing is None and subject in self._keys:
                # Forgotten: new data of this subject gets a new key (and history stays
                # erased). Kafka-style: the tombstone is followed by a new record.
                log.info("new key for a forgotten subject", subject=subject, topic=self.topic)
            keys = [new_key()]
            self._write(subject, keys)
            return 1, keys[0]

        result: tuple[int, bytes] = self._update(subject, create)
        return result

    def rotate(self, subject: str) -> int:
        def add(existing: list[bytes] | None) -> int:
            keys = [*(existing or []), new_key()]
            self._write(subject, keys)
            return len(keys)

        result: int = self._update(subject, add)
        return result

    def forget(self, subject: str) -> bool:
        def drop(existing: list[bytes] | None) -> bool:
            if existing is None:
                return False
            self._write(subject, None)
            return True

        forgotten: bool = self._update(subject, drop)
        return forgotten

    def erase_history(self) -> None:
        """Make forgotten keys unrecoverable from the log: close the active segments and
        compact the key topic, so only tombstones remain of forgotten subjects."""
        self._catch_up(force=True)
        for p in range(self._partitions):
            self.log.roll(self.topic, p)
        if self._partitions:
            self.log.compact(self.topic)


class Sealed:
    """A personal field that could not be opened (its subject's key is forgotten)."""

    __slots__ = ("subject",)

    def __init__(self, subject: str) -> None:
        self.subject = subject


class _Plan:
    """What to encrypt in one event class: its personal fields and its subject field."""

    __slots__ = ("fields", "names", "subject")

    def __init__(self, fields: tuple[PersonalField, ...], subject: str | None) -> None:
        self.fields = fields
        self.names = tuple(f.name for f in fields)
        self.subject = subject


class FieldCipher:
    """Seals the personal fields of an event's unstructured data, and opens them again.

    ``unstructure`` turns a declared ``erased`` value into its JSON form (the codec's
    converter), so erased fields structure like any other value.
    """

    def __init__(self, keys: KeyStore, unstructure: Any = None) -> None:
        self.keys = keys
        self._unstructure = unstructure or (lambda value: value)
        self._plans: dict[type, _Plan] = {}
        self._aeads: dict[bytes, Any] = {}  # key bytes -> AESGCM (its set-up costs ~µs)

    def _aead_for(self, key: bytes) -> Any:
        aead = self._aeads.get(key)
        if aead is None:
            if len(self._aeads) >= 4096:
                self._aeads.clear()
            aead = self._aeads[key] = _aead()(key)
        return aead

    def plan(self, cls: type) -> _Plan:
        found = self._plans.get(cls)
        if found is None:
            found = self._plans[cls] = _Plan(personal_fields(cls), subject_field(cls))
        return found

    def subject_of(self, cls: type, data: Mapping[str, Any], aggregate_id: str) -> str:
        name = self.plan(cls).subject
        if name is None:
            return aggregate_id
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"{cls.__qualname__}.{name} is the subject field but holds {value!r}"
            )
        return value

    def seal_value(self, subject: str, value: Any, name: str, bound_to: str) -> dict[str, Any]:
        """The cipher object of one JSON ``value`` of ``subject``, bound to ``name`` (a field)
        and ``bound_to`` (an event id)."""
        version, key = self.keys.current(subject)
        nonce = os.urandom(_NONCE)
        aad = _aad(subject, name, bound_to)
        body = self._aead_for(key).encrypt(nonce, orjson.dumps(value), aad)
        return {
            CIPHER_MARK: _SCHEME,
            "s": subject,
            "k": version,
            "c": base64.b64encode(nonce + body).decode(),
        }

    def seal(
        self, cls: type, data: dict[str, Any], aggregate_id: str, event_id: str
    ) -> dict[str, Any]:
        """``data`` without the personal fields of ``cls``, and with one ``enc2`` cipher
        object of all of them under ``"$eventlane"``."""
        plan = self.plan(cls)
        if not plan.fields:
            return data
        subject = self.subject_of(cls, data, aggregate_id)
        version, key = self.keys.current(subject)
        names = plan.names
        nonce = os.urandom(_NONCE)
        body = self._aead_for(key).encrypt(
            nonce, orjson.dumps([data[n] for n in names]), _event_aad(subject, event_id, names)
        )
        sealed = {k: v for k, v in data.items() if k not in names}
        sealed[CIPHER_MARK] = {
            CIPHER_MARK: _EVENT_SCHEME,
            "s": subject,
            "k": version,
            "f": list(names),
            "c": base64.b64encode(nonce + body).decode(),
        }
        return sealed

    def open_value(
        self,
        sealed: dict[str, Any],
        name: str,
        bound_to: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Any:
        """The JSON value inside one cipher object, or ``None`` when its key is forgotten.

        Raises :class:`~framework.errors.SerializationError` (with the coordinates) for a
        malformed object or one that fails authentication: never wrong plain text.
        """
        try:
            subject, version, blob = sealed["s"], sealed["k"], base64.b64decode(sealed["c"])
            if sealed[CIPHER_MARK] != _SCHEME or type(version) is not int:
                raise ValueError(f"unknown cipher scheme {sealed[CIPHER_MARK]!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise SerializationError(
                f"field {name!r} holds a malformed cipher object: {exc}",
                topic=topic,
                partition=partition,
                offset=offset,
            ) from None
        key = self.keys.get(subject, version)
        if key is None:
            return None
        aad = _aad(subject, name, bound_to)
        try:
            plain = self._aead_for(key).decrypt(blob[:_NONCE], blob[_NONCE:], aad)
        except (_invalid_tag(), ValueError) as exc:
            what = f"personal field {name!r} of subject {subject!r} fails"
            raise _unauthentic(what, exc, topic, partition, offset) from None
        return orjson.loads(plain)

    def open(
        self,
        data: dict[str, Any],
        event_id: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """``data`` with its cipher object(s) decrypted, and the names of the fields whose key
        is forgotten (left as :class:`Sealed` markers for :meth:`erase` to fill in).

        ``data`` is changed in place when it holds an ``enc2`` object (the codec passes the
        dict it has just parsed); nothing is changed when opening fails. This runs once per
        event read: see docs/performance.md (issue 16) before adding work to it.
        """
        sealed = data.get(CIPHER_MARK)
        if sealed is None:
            return self._open_values(data, event_id, topic, partition, offset)
        try:
            if type(sealed) is not dict or sealed.get(CIPHER_MARK) != _EVENT_SCHEME:
                raise ValueError(f"unknown cipher scheme {_scheme_of(sealed)!r}")
            subject, version, names = sealed["s"], sealed["k"], sealed["f"]
            if type(subject) is not str or type(version) is not int or type(names) is not list:
                raise ValueError("subject, key version or field list of the wrong type")
            # _event_aad, inlined (hot path); TypeError unless the names are strings
            aad = f"{_EVENT_SCHEME}\0{subject}\0{event_id}\0{_NUL.join(names)}".encode()
            blob = binascii.a2b_base64(sealed["c"])
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise SerializationError(
                f"the event's cipher object is malformed: {exc}",
                topic=topic,
                partition=partition,
                offset=offset,
            ) from None
        key = self.keys.get(subject, version)
        if key is None:
            del data[CIPHER_MARK]
            for name in names:
                data[name] = Sealed(subject)
            return data, tuple(names)
        aead = self._aeads.get(key)
        if aead is None:
            aead = self._aead_for(key)
        try:
            plain = aead.decrypt(blob[:_NONCE], blob[_NONCE:], aad)
        except (_invalid_tag(), ValueError) as exc:
            what = f"personal fields {', '.join(names)} of subject {subject!r} fail"
            raise _unauthentic(what, exc, topic, partition, offset) from None
        values = orjson.loads(plain)
        if type(values) is not list or len(values) != len(names):
            raise SerializationError(
                f"the event's cipher object holds {values!r}, not one value per field of "
                f"{names}",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        del data[CIPHER_MARK]
        for i, name in enumerate(names):  # not update(zip(...)): that costs ~3x here
            data[name] = values[i]
        return data, ()

    def _open_values(
        self,
        data: dict[str, Any],
        event_id: str,
        topic: str | None,
        partition: int | None,
        offset: int | None,
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Events written before ``enc2``: one ``enc1`` cipher object per field."""
        opened: dict[str, Any] | None = None
        erased: list[str] = []
        for name, value in data.items():
            if type(value) is not dict or CIPHER_MARK not in value:
                continue
            if opened is None:
                opened = dict(data)
            plain = self.open_value(
                value, name, event_id, topic=topic, partition=partition, offset=offset
            )
            if plain is None:
                opened[name] = Sealed(str(value.get("s")))
                erased.append(name)
            else:
                opened[name] = plain
        return (data if opened is None else opened), tuple(erased)

    def erase(self, cls: type, data: dict[str, Any]) -> dict[str, Any]:
        """Replace :class:`Sealed` markers left by :meth:`open` (after upcasting) with the
        declared ``erased`` values of ``cls``'s personal fields."""
        declared = {f.name: f.erased for f in self.plan(cls).fields}
        out = dict(data)
        for name, value in data.items():
            if isinstance(value, Sealed):
                if name not in declared:
                    raise ConfigError(
                        f"{cls.__qualname__}.{name} was stored encrypted but is not declared "
                        "personal: declare it with personal(erased=...)"
                    )
                out[name] = self._unstructure(declared[name])
        return out


def _aad(subject: str, field: str, event_id: str) -> bytes:
    return f"{_SCHEME}\0{subject}\0{field}\0{event_id}".encode()


def _event_aad(subject: str, event_id: str, names: Sequence[str]) -> bytes:
    return f"{_EVENT_SCHEME}\0{subject}\0{event_id}\0{_NUL.join(names)}".encode()


def _unauthentic(
    what: str, exc: Exception, topic: str | None, partition: int | None, offset: int | None
) -> SerializationError:
    """The error for a cipher text that fails authentication: ``what`` fails it."""
    return SerializationError(
        f"{what} authentication (tampered cipher text or wrong key): {type(exc).__name__}",
        topic=topic,
        partition=partition,
        offset=offset,
    )


def _scheme_of(sealed: object) -> object:
    return sealed.get(CIPHER_MARK) if isinstance(sealed, dict) else type(sealed).__name__
