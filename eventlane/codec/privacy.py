"""Crypto-shredding: personal fields encrypted per subject, erased by destroying the key.

Fields declared with :func:`eventlane.domain.privacy.personal` never reach the log in clear.
:class:`FieldCipher` takes them out of the event's JSON ``data`` and puts one cipher object
for all of them under the reserved key ``"$eventlane"``, a JSON array (``enc4``)::

    {"plan": "gold",
     "$eventlane": ["enc4", <subject id>, <key version>, "name\u0000address", <topic>,
                    <hex nonce + cipher text + tag>]}

The cipher text is AES-256-GCM (``cryptography``'s AESGCM) of the JSON object of the
fields (``{"name": ..., "address": ...}``) under the subject's key, with a 96-bit random
nonce first, and the associated data ``enc4 \0 topic \0 aggregate id \0 subject \0 event
id \0 field names`` (names joined by NUL, as stored): a cipher text moved to another event,
aggregate, topic or subject, or a renamed/reordered field list, fails authentication
instead of decrypting there. The topic is the logical one (the aggregates' ``topic`` that
record the class, from the registry; no engine or namespace prefix), stored in clear; a
codec whose registry knows those aggregates also refuses an object naming another topic.
One cipher object per event means one key lookup, one decryption and one JSON parse per
event, whatever the number of personal fields. The object is self-describing, so decoding
needs no class declaration of the *stored* version (upcasters see plain values, or, once
the subject is forgotten, placeholders: :meth:`FieldCipher.erase`); subject ids, key
versions, field names and topics stay in clear. An array rather than an object, the names
as one string and hex rather than base64, because this is parsed for every event read.

Reading ``enc4`` has a C twin, ``eventlane/codec/_seal.c`` (optional: built when OpenSSL's
headers are there), which :class:`~eventlane.codec.event_codec.EventCodec` calls first
(:attr:`FieldCipher.open4`): for an object whose key this cipher has opened and whose cache
is fresh, it does what :meth:`FieldCipher.open` does in one call, with libsodium's
precomputed AES-256-GCM state per key (when built with libsodium's headers and the CPU has
AES-NI) or else an OpenSSL context per key; for anything else it changes nothing, and
:meth:`FieldCipher.open`, the reference, decides (so every error and every forgotten key is
the Python path's). A key not open yet (a subject's first event, the first after each
refresh) is opened by :meth:`FieldCipher.open_key`, the same lookup :meth:`FieldCipher.open`
makes, and the C call is then made again.

Older forms still decode: ``enc3`` (the same array without the topic, associated data
``enc3 \0 subject \0 event id \0 names``), ``enc2`` (the same content as an object,
``{"$eventlane": "enc2", "s": ..., "k": ..., "f": [names], "c": ...}``, the plain text a
JSON array of the values in the order of ``f``, associated data ``enc2 \0 subject \0 event
id \0 names``), and the per-value form ``enc1`` (``{"$eventlane": "enc1", "s": ..., "k":
..., "c": ...}``, associated data ``enc1 \0 subject \0 field name \0 bound id``), which
sealed snapshot states still use.

Keys live in a :class:`KeyStore`: :class:`LogKeyStore` keeps them in a compacted topic
(one record per subject, its value every key version; a tombstone once forgotten), and
:class:`MemoryKeyStore` in memory (tests). On read:

* key present: the fields decrypt; a cipher text that fails authentication, or a key of
  the wrong length, raises :class:`~eventlane.errors.SerializationError` with the
  record's coordinates, never wrong plain text;
* key forgotten (or never known here): the fields become the class's declared ``erased``
  values, and the decoded envelope lists them in ``erased``.
"""

from __future__ import annotations

import base64
import binascii
import os
from binascii import unhexlify
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from time import monotonic
from typing import TYPE_CHECKING, Any

import orjson

from eventlane.domain.privacy import ERASED, PersonalField, personal_fields, subject_field
from eventlane.errors import ConfigError, SerializationError
from eventlane.observability import get_logger

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventlane.codec.keystore import KeyStore

__all__ = [
    "CIPHER_MARK",
    "FieldCipher",
    "Sealed",
    "redact",
]

log = get_logger("eventlane.codec")

CIPHER_MARK = "$eventlane"
_SCHEME = "enc1"  # one value (snapshot states; events before enc2)
_EVENT_SCHEME = "enc4"  # all personal fields of one event, bound to topic and aggregate
_ENC3 = "enc3"  # the same without topic and aggregate id (read only)
_OBJECT_SCHEME = "enc2"  # the same as an object (read only)
_NO_KEY: tuple[object, object, Any] = (None, None, None)
_NONCE = 12
_OPENED_KEYS = 1024
"""AES-GCM objects a :class:`FieldCipher` keeps per cache (by key bytes; by subject and
version): ~2.6 KB of native memory each, so both caches are emptied when this full."""
_NUL = "\0"


@cache
def _aead() -> type[AESGCM]:
    """``cryptography``'s AES-GCM, imported on first use (it costs ~20 ms to import)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

    return AESGCM


def _load_seal() -> Any:
    """``eventlane.codec._seal.Opener`` (``None``: the extension is not built)."""
    try:
        from eventlane.codec import _seal  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:  # built without a C compiler or OpenSSL's headers: Python alone
        return None
    return _seal.Opener


_Opener = _load_seal()


@cache
def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag  # noqa: PLC0415

    return InvalidTag


class Sealed:
    """A personal field that could not be opened (its subject's key is forgotten)."""

    __slots__ = ("subject",)

    def __init__(self, subject: str) -> None:
        self.subject = subject


class _Plan:
    """What to encrypt in one event class: its personal fields and its subject field."""

    __slots__ = ("fields", "joined", "names", "subject")

    def __init__(self, fields: tuple[PersonalField, ...], subject: str | None) -> None:
        self.fields = fields
        self.names = tuple(f.name for f in fields)
        self.joined = _NUL.join(self.names)  # as stored in the cipher object
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
        self._opened: dict[tuple[str, int], Any] = {}  # (subject, version) -> AESGCM
        # the same keys in C (eventlane/codec/_seal.c), when it is built: see open4
        self._native = None if _Opener is None else _Opener()
        self.open4: Callable[[dict[str, Any], str, str, frozenset[str]], bool] | None = (
            None if self._native is None else self._native.open4
        )
        """``open4(data, event_id, aggregate_id, topics)``: :meth:`open` of an ``enc4``
        object whose key is opened and fresh here, in one C call; ``True`` when opened,
        ``False`` when it changed nothing (then call :meth:`open`, which opens it or raises
        the error). ``None`` without the C extension. The codec calls it first."""
        self._cache_seconds = float(getattr(keys, "refresh_seconds", 0.0)) / 2
        self._fresh_until = 0.0  # monotonic time until which _opened needs no check
        self._last: tuple[object, object, Any] = _NO_KEY  # (subject, version, AESGCM)
        self._changes = keys.changes()

    def _aead_for(self, key: bytes) -> Any:
        aead = self._aeads.get(key)
        if aead is None:
            if len(self._aeads) >= _OPENED_KEYS:
                self._aeads.clear()
            aead = self._aeads[key] = _aead()(key)
        return aead

    def plan(self, cls: type) -> _Plan:
        found = self._plans.get(cls)
        if found is None:
            found = self._plans[cls] = _Plan(personal_fields(cls), subject_field(cls))
        return found

    def seals_from_memory(self, event: object, aggregate_id: str) -> bool:
        """Whether :meth:`seal` of ``event`` asks the key store for no record of its own
        (no personal field, or its subject's key in memory: see ``KeyStore.holds``)."""
        plan = self.plan(type(event))
        if not plan.fields:
            return True
        subject = aggregate_id if plan.subject is None else getattr(event, plan.subject, None)
        return isinstance(subject, str) and self.keys.holds(subject)

    def subject_of(self, cls: type, data: Mapping[str, Any], aggregate_id: str) -> str:
        name = self.plan(cls).subject
        if name is None:
            return aggregate_id
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{cls.__qualname__}.{name} is the subject field but holds {value!r}")
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
        self, cls: type, data: dict[str, Any], aggregate_id: str, event_id: str, topic: str = ""
    ) -> dict[str, Any]:
        """``data`` without the personal fields of ``cls``, and with one ``enc4`` cipher
        object of all of them under ``"$eventlane"``, bound to the logical ``topic`` and
        ``aggregate_id`` as well as the subject, the event id and the field names."""
        plan = self.plan(cls)
        if not plan.fields:
            return data
        subject = self.subject_of(cls, data, aggregate_id)
        version, key = self.keys.current(subject)
        names = plan.names
        nonce = os.urandom(_NONCE)
        body = self._aead_for(key).encrypt(
            nonce,
            orjson.dumps({n: data[n] for n in names}),
            _aad4(topic, aggregate_id, subject, event_id, plan.joined),
        )
        sealed = {k: v for k, v in data.items() if k not in names}
        sealed[CIPHER_MARK] = [
            _EVENT_SCHEME,
            subject,
            version,
            plan.joined,
            topic,
            (nonce + body).hex(),
        ]
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

        Raises :class:`~eventlane.errors.SerializationError` (with the coordinates) for a
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
            raise _unauthentic(subject, [name], exc, topic, partition, offset) from None
        return orjson.loads(plain)

    def open(
        self,
        data: dict[str, Any],
        event_id: str,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        aggregate_id: str = "",
        topics: frozenset[str] = frozenset(),
    ) -> tuple[str, ...]:
        """Decrypt ``data``'s cipher object(s) in place (the codec passes the dict it has just
        parsed) and return the names of the fields whose key is forgotten (left as
        :class:`Sealed` markers for :meth:`erase` to fill in). Nothing is changed when
        opening fails. This runs
        once per event read: see docs/performance.md (issue 16) before adding work to it
        (``topic``/``partition``/``offset`` are positional there: keywords cost a little).
        """
        sealed = data.get(CIPHER_MARK)
        if type(sealed) is not list:
            if sealed is None:
                return self._open_values(data, event_id, topic, partition, offset)
            return self._open_object(data, sealed, event_id, topic, partition, offset)
        try:
            if len(sealed) == 6:  # enc4: bound to the topic and the aggregate too
                scheme, subject, version, fields, bound, text = sealed
                if scheme != _EVENT_SCHEME or type(fields) is not str or type(bound) is not str:
                    raise ValueError
                if topics and bound not in topics:
                    raise _moved(bound, topics, topic, partition, offset)
                aad = _aad4(bound, aggregate_id, subject, event_id, fields)
            else:
                scheme, subject, version, fields, text = sealed
                if scheme != _ENC3 or type(fields) is not str:
                    raise ValueError
                aad = f"{_ENC3}\0{subject}\0{event_id}\0{fields}".encode()
            blob = unhexlify(text)  # hex, not base64: half the cost to decode
            # the subject's opened key, cached (see _opener, which checks the types of the
            # subject and version before it caches a key for them); the last one used is
            # kept apart: a stream's events (an aggregate's load) share one subject
            if monotonic() >= self._fresh_until:
                aead = None
            elif subject == self._last[0] and version == self._last[1]:
                aead = self._last[2]
            else:
                aead = self._opened.get((subject, version))
            if aead is None:
                aead = self._opener(subject, version)
                if aead is None:
                    return _erased(data, subject, fields.split(_NUL))
                self._last = (subject, version, aead)
        except SerializationError:
            raise
        except (TypeError, ValueError, binascii.Error) as exc:
            raise _malformed(sealed, exc, topic, partition, offset) from None
        try:
            values = orjson.loads(aead.decrypt(blob[:12], blob[12:], aad))  # 12: _NONCE
        except (_invalid_tag(), ValueError) as exc:
            raise _unauthentic(subject, fields.split(_NUL), exc, topic, partition, offset) from None
        if type(values) is not dict:
            raise _not_fields(values, fields.split(_NUL), topic, partition, offset)
        del data[CIPHER_MARK]
        data.update(values)
        return ()

    def open_key(self, data: dict[str, Any]) -> bool:
        """Open the key of ``data``'s ``enc4`` cipher object for :attr:`open4` when it is
        not open (or not fresh) here: ``True`` when it is now, so the codec calls
        :attr:`open4` again (the first event of each subject, and the first after each
        refresh, is then opened by the C call too, not decrypted a second way); ``False``
        for anything else: no C call, not an ``enc4`` array of a str subject and an int
        version, the key open already, forgotten or unknown, or any error opening it (a key
        record that is not a key list, a key of the wrong length, a read error), which
        :meth:`open` raises in its own order. It is the call :meth:`open` makes for the
        key (:meth:`_opener`), so nothing else changes: every outcome stays the one
        :attr:`open4` or :meth:`open` gives."""
        sealed = data.get(CIPHER_MARK)
        if self._native is None or type(sealed) is not list or len(sealed) != 6:
            return False
        scheme, subject, version = sealed[0], sealed[1], sealed[2]
        if scheme != _EVENT_SCHEME or type(subject) is not str or type(version) is not int:
            return False
        if monotonic() < self._fresh_until and (subject, version) in self._opened:
            return False  # open4 declined with the key open: open decides
        try:
            return self._opener(subject, version) is not None
        except Exception:  # a bad key record or key, a read error: open raises it, in order
            return False

    def _open_object(
        self,
        data: dict[str, Any],
        sealed: object,
        event_id: str,
        topic: str | None,
        partition: int | None,
        offset: int | None,
    ) -> tuple[str, ...]:
        """:meth:`open` for an ``enc2`` cipher object (written before ``enc3``)."""
        try:
            if type(sealed) is not dict or sealed.get(CIPHER_MARK) != _OBJECT_SCHEME:
                raise ValueError
            subject, version, names = sealed["s"], sealed["k"], sealed["f"]
            if type(subject) is not str or type(version) is not int or type(names) is not list:
                raise ValueError
            aad = f"{_OBJECT_SCHEME}\0{subject}\0{event_id}\0{_NUL.join(names)}".encode()
            blob = binascii.a2b_base64(sealed["c"])
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise _malformed(sealed, exc, topic, partition, offset) from None
        aead = self._opener(subject, version)
        if aead is None:
            return _erased(data, subject, names)
        try:
            values = orjson.loads(aead.decrypt(blob[:_NONCE], blob[_NONCE:], aad))
        except (_invalid_tag(), ValueError) as exc:
            raise _unauthentic(subject, names, exc, topic, partition, offset) from None
        if type(values) is not list or len(values) != len(names):
            raise _not_fields(values, names, topic, partition, offset)
        del data[CIPHER_MARK]
        data.update(zip(names, values, strict=True))
        return ()

    def _opener(self, subject: str, version: int) -> Any:
        """The AES-GCM object of key ``version`` of ``subject``, or ``None`` when the key is
        forgotten (or unknown here).

        Opened keys are cached until the store's :meth:`KeyStore.changes` moves, which is
        asked at most every half of the store's ``refresh_seconds`` (on every call for a
        store without one, such as :class:`MemoryKeyStore`); the store catches up with other
        processes at most every other half, so a subject forgotten anywhere stops
        decrypting here within ``refresh_seconds``. Forgotten keys are never cached.
        """
        if type(subject) is not str or type(version) is not int:
            raise ValueError
        now = monotonic()
        if now >= self._fresh_until:
            changes = self.keys.changes()
            if changes != self._changes or len(self._opened) >= _OPENED_KEYS:
                self._opened.clear()
                self._last = _NO_KEY
                self._changes = changes
                if self._native is not None:
                    self._native.clear()
            self._fresh_until = now + self._cache_seconds
            if self._native is not None:
                self._native.fresh_until = self._fresh_until
        aead = self._opened.get((subject, version))
        if aead is None:
            key = self.keys.get(subject, version)
            if key is None:
                return None
            aead = self._opened[(subject, version)] = self._aead_for(key)
            if self._native is not None:
                self._native.add(subject, version, key)
        return aead

    def _open_values(
        self,
        data: dict[str, Any],
        event_id: str,
        topic: str | None,
        partition: int | None,
        offset: int | None,
    ) -> tuple[str, ...]:
        """Events written before ``enc2``: one ``enc1`` cipher object per field."""
        opened: dict[str, Any] | None = None  # applied once every field has opened
        erased: list[str] = []
        for name, value in data.items():
            if type(value) is not dict or CIPHER_MARK not in value:
                continue
            if opened is None:
                opened = {}
            plain = self.open_value(
                value, name, event_id, topic=topic, partition=partition, offset=offset
            )
            if plain is None:
                opened[name] = Sealed(str(value.get("s")))
                erased.append(name)
            else:
                opened[name] = plain
        if opened is not None:
            data.update(opened)
        return tuple(erased)

    def placeholders(
        self, cls: type, data: dict[str, Any], erased: Sequence[str]
    ) -> dict[str, Any]:
        """``data`` (upcast from a version whose fields ``erased`` were erased) with every
        personal field of ``cls`` set to its declared ``erased`` value: one event's
        personal fields share one subject's key, so all of them are erased together,
        whatever an upcaster renamed or derived them from."""
        fields = [f for f in self.plan(cls).fields if f.name in data]
        if not fields:
            return data
        return {**data, **{f.name: self._unstructure(f.erased) for f in fields}}

    def plain_values(
        self, value: bytes | None, topics: frozenset[str] = frozenset()
    ) -> tuple[str, ...]:
        """The personal plain text inside a stored event record ``value``: every string (and
        its words of three or more characters) in its decrypted personal fields, longest
        first; ``()`` when it holds none, or its key is gone. For error paths only (it
        parses and decrypts the record again): dead letters, breaker records and log lines
        are redacted with it, so they never hold a personal value (see docs/privacy.md)."""
        try:
            doc = orjson.loads(value or b"null")
            data, event_id, aggregate_id = doc["data"], doc["event_id"], doc["aggregate_id"]
            if type(data) is not dict or type(event_id) is not str:
                return ()
            personal = data.get(CIPHER_MARK)
            if personal is None and not any(
                type(v) is dict and CIPHER_MARK in v for v in data.values()
            ):
                return ()
            before = set(data) - {CIPHER_MARK}
            opened = dict(data)
            self.open(opened, event_id, None, None, None, aggregate_id, topics)
        except Exception:  # malformed, unauthentic: nothing of it can be plain text
            return ()
        found: set[str] = set()
        _strings([v for k, v in opened.items() if k not in before or type(data[k]) is dict], found)
        return tuple(sorted(found, key=len, reverse=True))

    def erase(self, cls: type, data: dict[str, Any]) -> dict[str, Any]:
        """Replace :class:`Sealed` markers left by :meth:`open` with placeholders, before
        any upcaster runs: the declared ``erased`` value of the current class's personal
        field of that name, or :data:`~eventlane.domain.privacy.ERASED` (``"[erased]"``)
        for a field the current class no longer has (an upcaster renames or drops it). A
        field the current class has but does not declare personal is a ConfigError."""
        declared = {f.name: f.erased for f in self.plan(cls).fields}
        names = _field_names(cls)
        out = dict(data)
        for name, value in data.items():
            if isinstance(value, Sealed):
                if name in declared:
                    out[name] = self._unstructure(declared[name])
                elif name in names:
                    raise ConfigError(
                        f"{cls.__qualname__}.{name} was stored encrypted but is not declared "
                        "personal: declare it with personal(erased=...)"
                    )
                else:
                    out[name] = ERASED
        return out


@cache
def _field_names(cls: type) -> frozenset[str]:
    import attrs  # noqa: PLC0415

    return frozenset(a.name for a in attrs.fields(cls)) if attrs.has(cls) else frozenset()


def _strings(value: Any, found: set[str]) -> None:
    """Collect the strings in a JSON value (and their words of 3+ characters)."""
    if isinstance(value, str):
        if len(value) >= 3:
            found.add(value)
            found.update(w for w in value.split() if len(w) >= 3)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, found)
    elif isinstance(value, list | tuple):
        for v in value:
            _strings(v, found)


def redact(text: str, values: Sequence[str]) -> str:
    """``text`` with each of ``values`` (longest first) replaced by ``[redacted]``."""
    for v in values:
        if v in text:
            text = text.replace(v, "[redacted]")
    return text


def _aad4(topic: str, aggregate_id: str, subject: str, event_id: str, fields: str) -> bytes:
    return f"{_EVENT_SCHEME}\0{topic}\0{aggregate_id}\0{subject}\0{event_id}\0{fields}".encode()


def _moved(
    bound: str,
    topics: frozenset[str],
    topic: str | None,
    partition: int | None,
    offset: int | None,
) -> SerializationError:
    return SerializationError(
        f"the event's cipher object is bound to topic {bound!r}, but its class is recorded in"
        f" {', '.join(sorted(topics))}: a cipher text moved from another topic",
        topic=topic,
        partition=partition,
        offset=offset,
    )


def _aad(subject: str, field: str, event_id: str) -> bytes:
    return f"{_SCHEME}\0{subject}\0{field}\0{event_id}".encode()


def _erased(data: dict[str, Any], subject: str, names: Sequence[str]) -> tuple[str, ...]:
    """Put a :class:`Sealed` marker in ``data`` for each of ``names`` (the key is gone)."""
    del data[CIPHER_MARK]
    for name in names:
        data[name] = Sealed(subject)
    return tuple(names)


def _unauthentic(
    subject: str,
    names: Sequence[str],
    exc: Exception,
    topic: str | None,
    partition: int | None,
    offset: int | None,
) -> SerializationError:
    """The error for a cipher text of ``names`` that fails authentication."""
    what = "field {} of subject {!r} fails" if len(names) == 1 else "fields {} of subject {!r} fail"
    return SerializationError(
        f"personal {what.format(', '.join(names), subject)} authentication"
        f" (tampered cipher text or wrong key): {type(exc).__name__}",
        topic=topic,
        partition=partition,
        offset=offset,
    )


def _not_fields(
    values: object,
    names: Sequence[str],
    topic: str | None,
    partition: int | None,
    offset: int | None,
) -> SerializationError:
    return SerializationError(
        f"the event's cipher object holds {values!r}, not the values of {', '.join(names)}",
        topic=topic,
        partition=partition,
        offset=offset,
    )


def _malformed(
    sealed: object, exc: Exception, topic: str | None, partition: int | None, offset: int | None
) -> SerializationError:
    """The error for an event's cipher object that is neither ``enc3`` nor ``enc2``."""
    if type(sealed) is list:
        scheme = sealed[0] if sealed else None
    else:
        scheme = sealed.get(CIPHER_MARK) if isinstance(sealed, dict) else type(sealed).__name__
    if scheme not in (_EVENT_SCHEME, _ENC3, _OBJECT_SCHEME):
        why = f"unknown cipher scheme {scheme!r}"
    elif isinstance(exc, KeyError):
        why = f"no {exc} entry"
    elif type(exc) is ValueError and str(exc).startswith(("not enough", "too many")):
        why = f"not 5 (enc3) or 6 (enc4) items ({exc})"
    elif type(exc) is ValueError and not str(exc):
        why = "subject, key version or field names of the wrong type"
    else:
        why = str(exc)
    return SerializationError(
        f"the event's cipher object is malformed: {why}",
        topic=topic,
        partition=partition,
        offset=offset,
    )
