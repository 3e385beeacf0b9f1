"""Crypto-shredding: personal fields encrypted per subject, erased by destroying the key.

Fields declared with :func:`framework.domain.privacy.personal` never reach the log in clear.
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
  the wrong length, raises :class:`~framework.errors.SerializationError` with the
  record's coordinates, never wrong plain text;
* key forgotten (or never known here): the fields become the class's declared ``erased``
  values, and the decoded envelope lists them in ``erased``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import threading
import time
from binascii import unhexlify
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import cache
from time import monotonic
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

from framework.domain.privacy import ERASED, PersonalField, personal_fields, subject_field
from framework.errors import ConcurrencyError, ConfigError, SerializationError
from framework.log import KeyedLog
from framework.log.partitioner import partition_for_key
from framework.log.port import maintained_log
from framework.observability import get_logger

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "CIPHER_MARK",
    "FieldCipher",
    "KeyStore",
    "LogKeyStore",
    "MemoryKeyStore",
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


class Keyring(NamedTuple):
    """The keys of one subject: ``keys[0]`` is version ``first``, the last is the newest.

    A new ring's first version is above every version the subject may have had before (one
    past the last version known, and with ``stamped`` at least the time in ms, for a store
    that may no longer know it), so data sealed under a destroyed key reads as erased, never
    as a cipher text that fails under a new key of the same number.
    """

    first: int
    keys: tuple[bytes, ...]

    def get(self, version: int) -> bytes | None:
        i = version - self.first
        return self.keys[i] if 0 <= i < len(self.keys) else None

    @property
    def newest(self) -> tuple[int, bytes]:
        return self.first + len(self.keys) - 1, self.keys[-1]

    def rotated(self) -> Keyring:
        return Keyring(self.first, (*self.keys, new_key()))

    @staticmethod
    def new(after: Keyring | None = None, *, stamped: bool = False) -> Keyring:
        """A ring of one fresh key, numbered above ``after`` (the subject's destroyed ring,
        if known) and, ``stamped``, at least the wall-clock time in ms."""
        first = 1 if after is None else after.first + len(after.keys)
        if stamped:
            first = max(first, time.time_ns() // 1_000_000)
        return Keyring(first, (new_key(),))


class KeyStore(Protocol):
    """Where subjects' data keys live. Keys are 32 random bytes, numbered from 1
    (see :class:`Keyring`)."""

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

    def changes(self) -> int:
        """A count that moves whenever a key known here may have been destroyed (here or,
        once the store has caught up, by another process): readers that cache opened keys
        drop them when it moves."""
        ...


class MemoryKeyStore:
    """A :class:`KeyStore` in a dict: for tests and tools that need no durability."""

    def __init__(self) -> None:
        self._rings: dict[str, Keyring] = {}
        self._destroyed: dict[str, Keyring] = {}  # the last ring of each forgotten subject
        self._lock = threading.Lock()
        self._forgotten = 0

    def current(self, subject: str) -> tuple[int, bytes]:
        with self._lock:
            ring = self._rings.get(subject)
            if ring is None:
                ring = self._rings[subject] = Keyring.new(self._destroyed.get(subject))
            return ring.newest

    def get(self, subject: str, version: int) -> bytes | None:
        ring = self._rings.get(subject)
        return None if ring is None else ring.get(version)

    def rotate(self, subject: str) -> int:
        with self._lock:
            ring = self._rings.get(subject)
            ring = Keyring.new(self._destroyed.get(subject)) if ring is None else ring.rotated()
            self._rings[subject] = ring
            return ring.newest[0]

    def forget(self, subject: str) -> bool:
        with self._lock:
            self._forgotten += 1
            ring = self._rings.pop(subject, None)
            if ring is not None:
                self._destroyed[subject] = ring
            return ring is not None

    def changes(self) -> int:
        return self._forgotten


class _Known(NamedTuple):
    """What a :class:`LogKeyStore` knows of one subject: its ring (``None``: forgotten, or
    no record), the offset of its last record (``None``: no record) and the last ring of it
    seen destroyed (numbers a new ring above it)."""

    ring: Keyring | None
    head: int | None
    destroyed: Keyring | None = None


_UNKNOWN = _Known(None, None)
KEY_CACHE_SUBJECTS = 4096
"""Subjects a :class:`LogKeyStore` keeps in memory (~400 bytes each), the least recently
used dropped first; a miss reads the subject's last key record (``read_key``)."""


class LogKeyStore:
    """A :class:`KeyStore` on a compacted topic of any :class:`~framework.log.Log`.

    Record format: key = the subject id (UTF-8), value = ``{"keys": [<base64 key>, ...],
    "first": <version of the first key>}`` (JSON; ``first`` absent means 1), or ``null`` (a
    tombstone) once forgotten; compaction then leaves only the tombstone, so the key bytes
    are gone from the log (and, after ``delete.retention.ms``, the tombstone too: which is
    why new rings are numbered from the time in ms, see :class:`Keyring`). Writes are
    conditional on the subject's last record (:class:`~framework.log.types.Expect`), so two
    processes can never give one subject two different first keys.

    Memory is bounded: the store keeps what it knows of at most ``cache_subjects`` subjects
    (least recently used dropped first); a subject not in memory is read with the log's
    ``read_key`` (its last record: the topic is compacted, the key indexed). Invariants:

    * a subject in memory is current up to this store's position in the topic: the store
      tails the topic (every partition, from where it was when it started, never from the
      beginning) at most every half ``refresh_ms`` and on every write, and applies each
      record of a subject in memory above the head it knows;
    * :meth:`changes` moves whenever a ring known here is destroyed or replaced, *and*
      whenever a subject leaves memory (dropped as least recently used, or after a refused
      write): a reader caching opened keys (:class:`FieldCipher`, for at most the other half
      of ``refresh_ms``) drops them then, so it never holds a key of a subject this store no
      longer watches, and a subject forgotten by another process stops decrypting here
      within ``refresh_ms``.
    """

    def __init__(
        self,
        log_: KeyedLog,
        topic: str = "__eventlane_keys",
        *,
        partitions: int = 1,
        refresh_ms: int = 50,
        cache_subjects: int = KEY_CACHE_SUBJECTS,
    ) -> None:
        self.log = log_
        self.topic = topic
        self._create_partitions = partitions
        self._partitions = 0  # known once the topic exists (created on the first key)
        self._refresh_s = refresh_ms / 1000.0
        self._stale_s = self._refresh_s / 2  # catch-up interval; readers cache the other half
        self._capacity = max(1, cache_subjects)
        self._positions: list[int] = []
        self._known: OrderedDict[str, _Known] = OrderedDict()  # least recently used first
        self._changes = 0  # rings destroyed or replaced, subjects dropped: see changes()
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

    @property
    def cached_subjects(self) -> int:
        """How many subjects this store keeps in memory now (at most ``cache_subjects``)."""
        return len(self._known)

    # -- reading ---------------------------------------------------------------------------
    def _catch_up(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self._stale_s:
            return
        with self._lock:
            if not self._partitions:
                if not self.log.topic_exists(self.topic):
                    self._checked = now
                    return
                # Nothing is in memory yet (see _lookup), so nothing before now needs reading.
                self._partitions = self.log.partition_count(self.topic)
                self._positions = [
                    self.log.offsets(self.topic, p).hwm for p in range(self._partitions)
                ]
                self._checked = now
                return
            read = False
            for p in range(self._partitions):
                offsets = self.log.offsets(self.topic, p)
                position = max(self._positions[p], offsets.lwm)
                while position < offsets.hwm:
                    records, _ = self.log.read(self.topic, p, position, upto=offsets.hwm)
                    if not records:
                        break
                    read = True
                    for record in records:
                        if record.key is not None:
                            known = self._known.get(record.key.decode())
                            if known is not None and (
                                known.head is None or record.offset > known.head
                            ):
                                self._apply(record.key.decode(), record.value, record.offset, p)
                    position = records[-1].offset + 1
                self._positions[p] = position
            if read:
                self._release_files()
            self._checked = now

    def _release_files(self) -> None:
        """Close the key topic's segment files this process opened to read it: a segment
        that compaction deletes after a forget must not stay readable through
        ``/proc/PID/fd`` while this process lives. Logs without local files (JetStream,
        Kafka) have nothing to close."""
        partition = getattr(self.log, "partition", None)
        if not callable(partition):
            return
        for p in range(self._partitions):
            release = getattr(partition(self.topic, p), "release_fds", None)
            if callable(release):
                release()

    def _parse(
        self, subject: str, value: bytes | None, offset: int, partition: int
    ) -> Keyring | None:
        if value is None:
            return None
        try:
            doc = orjson.loads(value)
            keys = tuple(binascii.a2b_base64(k) for k in doc["keys"])
            first = doc.get("first", 1)
            if not keys or type(first) is not int or first < 1:
                raise ValueError("no keys, or a first version that is not a positive integer")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SerializationError(
                f"key record of subject {subject!r} is not a key list: {exc}",
                topic=self.topic,
                partition=partition,
                offset=offset,
            ) from None
        return Keyring(first, keys)

    def _apply(self, subject: str, value: bytes | None, offset: int, partition: int) -> None:
        self._set(subject, self._parse(subject, value, offset, partition), offset)

    def _set(self, subject: str, ring: Keyring | None, head: int) -> None:
        """Record ``subject``'s ring as of its record at ``head`` (the subject in memory)."""
        old = self._known.get(subject, _UNKNOWN)
        destroyed = old.destroyed
        if old.ring is not None and (
            ring is None
            or ring.first != old.ring.first
            or ring.keys[: len(old.ring.keys)] != old.ring.keys
        ):
            self._changes += 1  # destroyed (or replaced: a forget, then a new first key)
            destroyed = old.ring
        self._keep(subject, _Known(ring, head, destroyed))

    def _keep(self, subject: str, known: _Known) -> None:
        """Hold ``known`` in memory, the least recently used subjects dropped to make room
        (each moves :meth:`changes`)."""
        if subject not in self._known:
            while len(self._known) >= self._capacity:
                self._known.popitem(last=False)
                self._changes += 1
        self._known[subject] = known

    def _drop(self, subject: str) -> None:
        """Take ``subject`` out of memory (readers' opened keys of it go too: changes())."""
        if self._known.pop(subject, None) is not None:
            self._changes += 1

    def _lookup(self, subject: str) -> _Known:
        """What is known of ``subject``: from memory (the most recently used now), else
        read from the log (its last record) and kept, the least recently used dropped. A
        subject with no record is not kept (asked again, it is read again): a key another
        process creates is seen at once, never answered "erased" from memory."""
        known = self._known.get(subject)
        if known is not None:
            with contextlib.suppress(KeyError):  # dropped by another thread meanwhile
                self._known.move_to_end(subject)
            return known
        with self._lock:
            known = self._known.get(subject)
            if known is not None:
                return known
            # the tail's position, which the subject's record is read against
            self._catch_up(force=not self._partitions)
            if not self._partitions:
                return _UNKNOWN  # no key topic: no keys
            key = subject.encode()
            p = partition_for_key(key, self._partitions)
            records = self.log.read_key(self.topic, p, key)
            self._release_files()
            if not records:
                return _UNKNOWN
            # Records above this one are at or above the position: the tail applies them.
            last = records[-1]
            known = _Known(self._parse(subject, last.value, last.offset, p), last.offset)
            self._keep(subject, known)
            return known

    def changes(self) -> int:
        self._catch_up()
        return self._changes

    def get(self, subject: str, version: int) -> bytes | None:
        if monotonic() - self._checked >= self._stale_s:
            self._catch_up()
        ring = self._lookup(subject).ring
        return None if ring is None else ring.get(version)

    def ring(self, subject: str) -> Keyring | None:
        """The subject's key ring as the log has it now (``None``: forgotten or unknown)."""
        self._catch_up(force=True)
        return self._lookup(subject).ring

    # -- writing ---------------------------------------------------------------------------
    def _write(self, subject: str, ring: Keyring | None) -> None:
        """Append the subject's new key ring (or a tombstone), conditional on its head."""
        from framework.log.types import Expect  # noqa: PLC0415

        self._ensure_topic()
        known = self._lookup(subject)
        key = subject.encode()
        partition = partition_for_key(key, self._partitions)
        value = None
        if ring is not None:
            doc: dict[str, Any] = {"keys": [base64.b64encode(k).decode() for k in ring.keys]}
            if ring.first != 1:
                doc["first"] = ring.first
            value = orjson.dumps(doc)
        try:
            result = self.log.append(
                self.topic, partition, [(key, value, (), None)], expect=Expect(key, known.head)
            )
        except ConcurrencyError:
            self._drop(subject)  # read it again from the log
            raise
        self._set(subject, ring, result.last_offset)

    def _update(self, subject: str, change: Any) -> Any:
        for _ in range(20):
            with self._lock:
                self._catch_up(force=True)
                try:
                    return change(self._lookup(subject))
                except ConcurrencyError:
                    continue  # another process wrote this subject: read it, decide again
        raise ConcurrencyError(
            f"key of subject {subject!r} keeps changing", expected=0, actual=0, topic=self.topic
        )

    @staticmethod
    def _new_ring(known: _Known) -> Keyring:
        """A first ring: numbered from the time in ms, because a subject forgotten long ago
        leaves no trace here once its tombstone is compacted away (or it left memory),
        while its events still name their old key versions."""
        return Keyring.new(known.destroyed, stamped=True)

    def current(self, subject: str) -> tuple[int, bytes]:
        if monotonic() - self._checked >= self._stale_s:
            self._catch_up()
        ring = self._lookup(subject).ring
        if ring is not None:
            return ring.newest

        def create(known: _Known) -> tuple[int, bytes]:
            if known.ring is not None:
                return known.ring.newest
            if known.head is not None:  # a tombstone was seen
                # New data of a forgotten subject gets a new key (history stays erased).
                # Kafka-style: the tombstone is followed by a new record.
                log.info("new key for a forgotten subject", subject=subject, topic=self.topic)
            ring = self._new_ring(known)
            self._write(subject, ring)
            return ring.newest

        result: tuple[int, bytes] = self._update(subject, create)
        return result

    def rotate(self, subject: str) -> int:
        def add(known: _Known) -> int:
            ring = self._new_ring(known) if known.ring is None else known.ring.rotated()
            self._write(subject, ring)
            return ring.newest[0]

        result: int = self._update(subject, add)
        return result

    def forget(self, subject: str) -> bool:
        def drop(known: _Known) -> bool:
            if known.ring is None:
                return False
            self._write(subject, None)
            return True

        forgotten: bool = self._update(subject, drop)
        return forgotten

    def state(self, subject: str) -> str:
        """``"live"`` (the subject has a key), ``"forgotten"`` (its key record is a
        tombstone) or ``"unknown"`` (no key record here: never written, or its tombstone
        compacted away)."""
        self._catch_up(force=True)
        known = self._lookup(subject)
        if known.head is None:
            return "unknown"
        return "forgotten" if known.ring is None else "live"

    def erase_history(self) -> None:
        """Make forgotten keys unrecoverable from the log: close the active segments and
        compact the key topic, so only tombstones remain of forgotten subjects."""
        self._catch_up(force=True)
        maintained = maintained_log(self.log, "erasing forgotten keys (compaction)")
        for p in range(self._partitions):
            maintained.roll(self.topic, p)
        if self._partitions:
            maintained.compact(self.topic)
            self._release_files()


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
            self._fresh_until = now + self._cache_seconds
        aead = self._opened.get((subject, version))
        if aead is None:
            key = self.keys.get(subject, version)
            if key is None:
                return None
            aead = self._opened[(subject, version)] = self._aead_for(key)
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
        field of that name, or :data:`~framework.domain.privacy.ERASED` (``"[erased]"``)
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
