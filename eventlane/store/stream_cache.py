"""Recently used event streams, kept decoded, so that loading an aggregate again reads and
decodes only what was appended since (Axon's caching repository, the aggregate cache of
``eventsourcing`` with fast-forward).

An entry is one stream's envelopes ``1..n`` and the log offset of each. The event store
uses an entry only once the engine confirms that the stream's last readable record is
still at the entry's last offset (``key_head``: one key-index lookup), and otherwise reads
the records after it and adds them. Invariants:

* A load through the cache returns what a fresh read of the stream would return at the
  moment of its ``key_head``, in any process: every record appended by anyone is seen. A
  command's load skips the ``key_head`` (``checked=False``): it saves conditionally, and a
  conflict (or an append of unknown outcome) drops the entry, so its retry reads the log.
* The store adds what it appends itself when the entry was current at the append (the
  engine's conditional append proved it): the envelopes it encoded, not decoded again,
  as a caching repository keeps the aggregate it saved.
* Streams whose events declare personal fields are never held: a forgotten subject's
  plain text must not outlive its key. All entries go when the event registry changes
  (upcasters or types added: the same records may decode differently).
* Bounded by the number of events held, least recently used first out; thread-safe.
* A stale entry cannot cause a wrong write: a save is a conditional append, checked by the
  engine against the log whatever the load returned.

Not detected: a topic deleted and created again *by another process* in which the stream's
last record lands at the same offset as before (the cache then serves the old stream until
the stream moves), and records removed below the low-water mark (``delete_records``: the
cache still holds them). Open a new runtime after either, or build the app with
``cache_events=0``.

A process's bound is the app's ``cache_events`` unless it opens with another
(``app.open(..., cache_events=N)``); the workers of ``eventlane project run`` and
``eventlane run`` keep :data:`WORKER_EVENTS` (``--cache-events``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

from eventlane.codec import Envelope
from eventlane.domain.privacy import personal_fields

DEFAULT_EVENTS = 20_000
"""Events an event store keeps decoded by default: 0.4-0.8 KB each for a small event (an
invoicing ``Invoice`` event with its envelope: ~0.75 KB), so 8-15 MB once full. A process
that works on ever new aggregates (the invoicing policy) fills it over its first ~20,000
cached events and levels off there."""

WORKER_EVENTS = 1_000
"""Events a worker process of ``eventlane project run`` / ``eventlane run`` keeps decoded
(``--cache-events``): a policy mostly issues commands on aggregates it creates and never
loads again (an invoice per order), so the app's default would only fill with streams
nobody reads (~0.75 KB an event: +15 MB over a worker's first ~20,000 commands); the few
aggregates it does work on repeatedly stay, least recently used out."""


class CachedStream(NamedTuple):
    """A stream's envelopes ``1..n`` and the offset of each record."""

    envelopes: tuple[Envelope[Any], ...]
    offsets: tuple[int, ...]
    generation: int
    """The event registry's generation the envelopes were decoded under."""


class StreamCache:
    """Streams by ``(topic, aggregate_id)``, least recently used first out."""

    def __init__(self, max_events: int = DEFAULT_EVENTS) -> None:
        self.max_events = max_events
        self._entries: OrderedDict[tuple[str, str], CachedStream] = OrderedDict()
        self._events = 0
        self._lock = threading.Lock()
        self._plain: dict[type, bool] = {}  # event class -> declares no personal field

    def get(self, topic: str, aggregate_id: str, generation: int) -> CachedStream | None:
        with self._lock:
            entry = self._entries.get((topic, aggregate_id))
            if entry is None:
                return None
            if entry.generation != generation:
                self._clear_locked()
                return None
            self._entries.move_to_end((topic, aggregate_id))
            return entry

    def put(
        self,
        topic: str,
        aggregate_id: str,
        envelopes: Sequence[Envelope[Any]],
        offsets: Sequence[int],
        generation: int,
    ) -> None:
        """Hold the stream ``envelopes`` (versions ``1..n``) at ``offsets``, unless it has
        personal fields or is too long to be worth it."""
        self.extend(topic, aggregate_id, 0, None, envelopes, offsets, generation)

    def extend(
        self,
        topic: str,
        aggregate_id: str,
        version: int,
        offset: int | None,
        envelopes: Sequence[Envelope[Any]],
        offsets: Sequence[int],
        generation: int,
    ) -> CachedStream | None:
        """Records ``envelopes`` at ``offsets`` follow the stream's record ``version`` at
        ``offset`` (appended by the store, or read since): the stream with them, held if it
        may be; ``None`` (and the stream forgotten) when the entry was not exactly that
        stream. A new stream (``version`` 0) starts an entry."""
        before: tuple[tuple[Envelope[Any], ...], tuple[int, ...]] = ((), ())
        if version:
            old = self.get(topic, aggregate_id, generation)
            if old is None or len(old.envelopes) != version or old.offsets[-1] != offset:
                self.drop(topic, aggregate_id)
                return None
            before = (old.envelopes, old.offsets)
        entry = CachedStream(before[0] + tuple(envelopes), before[1] + tuple(offsets), generation)
        if self._plain_events(envelopes):
            self._store(topic, aggregate_id, entry)
        else:
            self.drop(topic, aggregate_id)
        return entry

    def _plain_events(self, envelopes: Sequence[Envelope[Any]]) -> bool:
        """Whether no envelope's event declares a personal field (or had one erased)."""
        plain = self._plain
        for env in envelopes:
            cls = type(env.event)
            ok = plain.get(cls)
            if ok is None:
                ok = plain[cls] = not personal_fields(cls)
            if not ok or env.erased:
                return False
        return True

    def _store(self, topic: str, aggregate_id: str, entry: CachedStream) -> None:
        with self._lock:
            key = (topic, aggregate_id)
            old = self._entries.pop(key, None)
            if old is not None:
                self._events -= len(old.envelopes)
            if len(entry.envelopes) > self.max_events // 4:
                return  # a stream this long is better served by snapshots
            self._entries[key] = entry
            self._events += len(entry.envelopes)
            while self._events > self.max_events:
                _, gone = self._entries.popitem(last=False)
                self._events -= len(gone.envelopes)

    def drop(self, topic: str, aggregate_id: str) -> None:
        with self._lock:
            old = self._entries.pop((topic, aggregate_id), None)
            if old is not None:
                self._events -= len(old.envelopes)

    def clear(self) -> None:
        with self._lock:
            self._clear_locked()

    def _clear_locked(self) -> None:
        self._entries.clear()
        self._events = 0

    def __len__(self) -> int:
        return len(self._entries)
