"""Where the keys of personal data live: one keyring per subject (every key version), in a
:class:`KeyStore`. :class:`LogKeyStore` keeps them in a compacted topic of the log (one record
per subject, a tombstone once forgotten; written with conditional appends, so two processes
never fork a keyring), :class:`MemoryKeyStore` in memory (tests). The cipher that uses them
is :mod:`.privacy`.

Invariants: a forgotten subject's keyring is a tombstone and never comes back (a later
``key_for`` refuses); readers in other processes stop using a forgotten key within the
store's refresh interval; the key topic is compacted, so erasing history (roll and compact)
leaves only tombstones of forgotten subjects.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

from eventlane.errors import ConcurrencyError, OffsetOutOfRangeError, SerializationError
from eventlane.log import KeyedLog
from eventlane.log.partitioner import partition_for_key
from eventlane.log.port import maintained_log
from eventlane.observability import get_logger

if TYPE_CHECKING:
    pass

log = get_logger("eventlane.codec")


KEY_TOPIC_CONFIG: Mapping[str, object] = {
    "cleanup_policy": "compact",
    "retention_ms": -1,
    "min_compaction_lag_ms": 0,
}


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

    def holds(self, subject: str) -> bool:
        """Whether ``subject``'s newest key is in memory: :meth:`current` then reads or
        writes no record of its own (at most the store's periodic catch-up). An event
        loop makes the call in place then, else in a thread."""
        ...


class MemoryKeyStore:
    """A :class:`KeyStore` in a dict: for tests and tools that need no durability."""

    def __init__(self) -> None:
        self._rings: dict[str, Keyring] = {}
        self._destroyed: dict[str, Keyring] = {}  # the last ring of each forgotten subject
        self._lock = threading.Lock()
        self._forgotten = 0

    def holds(self, subject: str) -> bool:
        return True  # (in memory)

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

LOAD_AFTER_MISSES = 8
"""Misses after which a :class:`LogKeyStore` reads a key partition whole, once, if it fits
in half its free memory: a reader touching many subjects (a projector's rebuild) pays one
pass over the key topic instead of a ``read_key`` per subject (~1 ms each: an index
lookup, a scan of the batches from the nearest offset-index entry, and the files closed
after it), while a process touching a few subjects never reads more than their records."""


class LogKeyStore:
    """A :class:`KeyStore` on a compacted topic of any :class:`~eventlane.log.Log`.

    Record format: key = the subject id (UTF-8), value = ``{"keys": [<base64 key>, ...],
    "first": <version of the first key>}`` (JSON; ``first`` absent means 1), or ``null`` (a
    tombstone) once forgotten; compaction then leaves only the tombstone, so the key bytes
    are gone from the log (and, after ``delete.retention.ms``, the tombstone too: which is
    why new rings are numbered from the time in ms, see :class:`Keyring`). Writes are
    conditional on the subject's last record (:class:`~eventlane.log.types.Expect`), so two
    processes can never give one subject two different first keys.

    Memory is bounded: the store keeps what it knows of at most ``cache_subjects`` subjects
    (least recently used dropped first); a subject not in memory is read with the log's
    ``read_key`` (its last record: the topic is compacted, the key indexed). After
    :data:`LOAD_AFTER_MISSES` misses, a key partition whose records below the tail's position
    fit in half the free part of memory is read once, whole, and every subject in it kept (a
    subject it did not hold is still looked up with ``read_key``). Invariants:

    * a subject in memory is current up to this store's position in the topic: the store
      tails the topic (every partition, from where it was when it started, never from the
      beginning) at most every half ``refresh_ms`` and on every write, and applies each
      record of a subject in memory above the head it knows;
    * :meth:`changes` moves whenever a ring known here is destroyed or replaced, *and*
      whenever a subject leaves memory (dropped as least recently used, or after a refused
      write): a reader caching opened keys (:class:`FieldCipher`, for at most the other half
      of ``refresh_ms``) drops them then, so it never holds a key of a subject this store no
      longer watches, and a subject forgotten by another process stops decrypting here
      within ``refresh_ms``;
    * :meth:`caught_up` lets a caller that read the topic's high-water marks itself (an
      event loop, on the log's asyncio face) count as a catch-up when they show nothing
      new: the store is then as fresh as a catch-up begun when the marks were asked.
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
        self._misses = 0  # lookups that went to the log (see LOAD_AFTER_MISSES)
        self._loaded: set[int] = set()  # key partitions read whole (or found too big) once
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
        called = time.monotonic()
        if not force and called - self._checked < self._stale_s:
            return
        with self._lock:
            if not force and self._checked >= called:
                return  # caught up by another thread since this call: as fresh as asked
            now = time.monotonic()  # (what is read below is at least as new as this)
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
            if p not in self._loaded:
                self._misses += 1
                if self._misses >= LOAD_AFTER_MISSES and self._load(p):
                    known = self._known.get(subject)
                    if known is not None:
                        return known
            # not in memory: a record written since the tail's position, or none at all
            records = self.log.read_key(self.topic, p, key)
            self._release_files()
            if not records:
                return _UNKNOWN
            # Records above this one are at or above the position: the tail applies them.
            last = records[-1]
            known = _Known(self._parse(subject, last.value, last.offset, p), last.offset)
            self._keep(subject, known)
            return known

    def _load(self, p: int) -> bool:
        """Read key partition ``p`` below the tail's position in one pass (released once,
        at the end) and keep every subject it holds that is not in memory yet, if its
        records fit in half the free part of memory; ``False`` (nothing kept) if not. Tried
        once per partition. Records at or above the position are the tail's, as for a miss.
        A record that is not a key list is left for ``read_key`` to report if asked."""
        self._loaded.add(p)
        position = self._positions[p]
        offset = self.log.offsets(self.topic, p).lwm
        if position - offset > (self._capacity - len(self._known)) // 2:
            return False  # it would fill memory: later subjects would evict each other
        last: dict[bytes, tuple[bytes | None, int]] = {}
        cursor = None
        try:
            while offset < position:
                records, cursor = self.log.read(self.topic, p, offset, cursor=cursor, upto=position)
                if not records:
                    break
                for record in records:
                    if record.key is not None:
                        last[record.key] = (record.value, record.offset)
                offset = records[-1].offset + 1
        except OffsetOutOfRangeError:
            return False  # retention moved the low-water mark meanwhile: look up one by one
        finally:
            self._release_files()
        for key, (value, head) in last.items():
            subject = key.decode()
            if subject in self._known:
                continue  # current already: the tail follows it
            with contextlib.suppress(SerializationError):
                self._keep(subject, _Known(self._parse(subject, value, head, p), head))
        return True

    def changes(self) -> int:
        self._catch_up()
        return self._changes

    def holds(self, subject: str) -> bool:
        known = self._known.get(subject)
        return known is not None and known.ring is not None

    @property
    def due(self) -> bool:
        """Whether the next read of a key catches up with the topic first."""
        return monotonic() - self._checked >= self._stale_s

    @property
    def partitions(self) -> int:
        """The key topic's partitions as known here (0: the topic not seen yet)."""
        return self._partitions

    def caught_up(self, hwms: Sequence[int], asked: float) -> bool:
        """Count as a catch-up the key topic's high-water marks ``hwms`` (one a partition),
        read by the caller from the log, asked at monotonic time ``asked``: ``True`` when
        they hold nothing this store has not read (it is then as fresh as a catch-up begun
        at ``asked``); ``False`` when they do, or the store is busy (a catch-up, a write
        in another thread), and the caller catches up another way."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if len(hwms) != self._partitions or any(
                hwm > position for hwm, position in zip(hwms, self._positions, strict=True)
            ):
                return False
            self._checked = max(self._checked, asked)
            return True
        finally:
            self._lock.release()

    def catch_up(self) -> None:
        """Catch up with the key topic now (blocking: for a thread)."""
        self._catch_up(force=True)

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
        from eventlane.log.types import Expect  # noqa: PLC0415

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
