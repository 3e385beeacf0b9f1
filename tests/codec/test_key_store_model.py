"""The log key store against a model: two stores on one log (two processes), each keeping
at most a few subjects in memory, driven by a seeded random sequence of ``current``,
``rotate``, ``forget``, key reads and event decodes through each store's caching
:class:`~eventlane.codec.privacy.FieldCipher`. Every answer is compared with a dict of
subjects (their live key versions, the versions destroyed); memory never holds more
subjects than the bound, whatever the number of subjects, and a subject forgotten by the
other store never decrypts from a key left in a cache."""

from __future__ import annotations

import random
from pathlib import Path

from eventlane.codec import Envelope, EventCodec, EventRegistry
from eventlane.codec.keystore import LogKeyStore
from eventlane.log.embedded.store import LogStore
from tests.codec.test_codec_privacy import NOWHERE, Registered

CACHE = 6
SUBJECTS = 40
STEPS = 1500


class Subject:
    """The model of one subject: its live key versions (and bytes), the versions destroyed."""

    def __init__(self) -> None:
        self.live: dict[int, bytes] = {}
        self.destroyed: set[int] = set()
        self.events: list[tuple[bytes, str, bool]] = []  # (record value, name, key live)


def codec_on(keys: LogKeyStore) -> EventCodec:
    registry = EventRegistry()
    registry.register(Registered)
    return EventCodec(registry, keys=keys)


def test_two_bounded_key_stores_agree_with_a_model(tmp_path: Path) -> None:
    rnd = random.Random(2611)
    model = {f"s{i}": Subject() for i in range(SUBJECTS)}
    counts = dict.fromkeys(("current", "rotate", "forget", "get", "seal", "open"), 0)
    with LogStore(tmp_path) as log_a, LogStore(tmp_path) as log_b:
        # refresh_ms=0: each store catches up on every call, so answers are deterministic
        stores = [LogKeyStore(log, refresh_ms=0, cache_subjects=CACHE) for log in (log_a, log_b)]
        codecs = [codec_on(store) for store in stores]
        for step in range(STEPS):
            i = rnd.randrange(2)
            store, codec = stores[i], codecs[i]
            name = rnd.choice(list(model)[: 8 + step * SUBJECTS // STEPS])  # new ones come
            m = model[name]
            roll = rnd.random()
            if roll < 0.15:
                version, key = store.current(name)
                if m.live:
                    assert (version, key) == max(m.live.items()), (step, name)
                else:  # a new ring, numbered above every version the subject had
                    assert version > max(m.destroyed, default=0), (step, name)
                    m.live = {version: key}
                counts["current"] += 1
            elif roll < 0.22:
                version = store.rotate(name)
                assert version > max([*m.live, *m.destroyed], default=0), (step, name)
                key = store.get(name, version)
                assert key is not None
                m.live[version] = key
                counts["rotate"] += 1
            elif roll < 0.3:
                assert store.forget(name) == bool(m.live), (step, name)
                m.destroyed |= set(m.live)
                for n, (value, who, _) in enumerate(m.events):
                    m.events[n] = (value, who, False)
                m.live = {}
                counts["forget"] += 1
            elif roll < 0.5:
                versions = [*m.live, *m.destroyed]
                if versions:
                    version = rnd.choice(versions)
                    assert store.get(name, version) == m.live.get(version), (step, name)
                    counts["get"] += 1
            elif roll < 0.62:
                person = f"P{step}-{name}"
                record = codec.encode(Envelope(Registered(person, NOWHERE), name, 1))
                version, _ = store.current(name)
                m.live.setdefault(version, store.get(name, version) or b"")
                m.events.append((record.value, person, True))
                counts["seal"] += 1
            elif m.events:
                value, person, live = rnd.choice(m.events)
                decoded = codec.decode(None, value)
                if live:
                    assert decoded.event.name == person and not decoded.erased, (step, name)
                else:
                    assert decoded.erased == ("name", "address"), (step, name, person)
                counts["open"] += 1
            for s in stores:
                assert s.cached_subjects <= CACHE, step
    assert min(counts.values()) > 40, counts


def test_a_subject_that_left_memory_stops_decrypting_once_another_process_forgets_it(
    tmp_path: Path,
) -> None:
    """The reader's codec keeps an opened key; its store then drops the subject (least
    recently used) and so no longer follows its record; the writer forgets it. The reader's
    next decode is erased: a store's dropping a subject empties its readers' key caches."""
    with LogStore(tmp_path) as log_a, LogStore(tmp_path) as log_b:
        writer = LogKeyStore(log_a, refresh_ms=0, cache_subjects=2)
        reader = LogKeyStore(log_b, refresh_ms=0, cache_subjects=2)
        write, read = codec_on(writer), codec_on(reader)
        record = write.encode(Envelope(Registered("Ada", NOWHERE), "s0", 1))
        assert read.decode(None, record.value).event.name == "Ada"  # s0's key opened
        for other in ("s1", "s2"):
            writer.current(other)
            assert reader.get(other, writer.current(other)[0]) is not None
        assert reader.cached_subjects == 2  # s0 left the reader's memory
        assert writer.forget("s0")
        assert read.decode(None, record.value).erased == ("name", "address")


def test_a_key_another_process_creates_is_seen_at_once(tmp_path: Path) -> None:
    """A store that found no key for a subject does not answer "erased" from memory once
    another process has created one, however long its refresh interval."""
    with LogStore(tmp_path) as log_a, LogStore(tmp_path) as log_b:
        writer = LogKeyStore(log_a)
        reader = LogKeyStore(log_b, refresh_ms=600_000, cache_subjects=4)
        writer.current("other")  # the key topic exists
        assert reader.get("s0", 1) is None and reader.state("s0") == "unknown"
        version, key = writer.current("s0")
        assert reader.get("s0", version) == key
        assert reader.cached_subjects == 1
