"""The embedded engine's per-key caches stay bounded however many keys a process writes.

Issue 26 (a 16-minute invoicing run: the command process 145 -> 291 MiB, linearly): every
key index of a process remembered the last entry of every key it had seen (up to 65,536
per partition), and the key state the heads it had checked. Both are now bounded for the
whole process (:data:`eventlane.log.embedded.key_index.CACHED_KEYS` shared by the open indexes,
:data:`eventlane.log.embedded.keys.CHECKED_HEADS`), least recently used out. The bounds are set low
here so that a few thousand keys exceed them; the code path is the production one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlane.errors import ConcurrencyError
from eventlane.log import Expect, LogStore
from eventlane.log.embedded import key_index as key_index_module
from eventlane.log.embedded import keys as keys_module

PARTITIONS = 4
KEYS = 4000


def test_per_key_caches_stay_bounded_and_keep_what_is_hot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_index_module, "CACHED_KEYS", 2048)
    monkeypatch.setattr(key_index_module, "MIN_CACHED_KEYS", 128, raising=False)
    monkeypatch.setattr(keys_module, "CHECKED_HEADS", 1024, raising=False)
    with LogStore(tmp_path) as log:
        log.create_topic("t", PARTITIONS, {"flush_policy": "os"})  # no fsync: fast
        hot = b"hot"
        hot_head: int | None = None
        model: dict[bytes, int] = {}  # the reference: each key's last offset
        for i in range(KEYS):
            key = b"key-%06d" % i
            r = log.append("t", i % PARTITIONS, [(key, b"v", (), None)], expect=Expect(key, None))
            model[key] = r.base_offset
            if i % 10 == 0:  # one key written again and again stays cached
                r = log.append("t", 0, [(hot, b"h", (), None)], expect=Expect(hot, hot_head))
                hot_head = r.base_offset
        indexes = [log.keys.index("t", p) for p in range(PARTITIONS)]
        cached = sum(len(index._heads) for index in indexes)
        bound = max(2048, 128 * len(indexes))
        assert cached <= bound, f"{cached} key heads cached, bound {bound}"
        checked = len(log.keys._checked)
        assert checked <= 1024, f"{checked} checked heads remembered, bound 1024"
        assert hot in indexes[0]._heads  # least recently used out: the hot key stays
        # behaviour unchanged: every key's head is right, cached or not
        for key, offset in list(model.items())[:: KEYS // 100]:
            p = int(key[4:]) % PARTITIONS
            assert log.key_head("t", p, key) == offset
            with pytest.raises(ConcurrencyError):  # a stale expectation is still refused
                log.append("t", p, [(key, b"x", (), None)], expect=Expect(key, None))
            r = log.append("t", p, [(key, b"y", (), None)], expect=Expect(key, offset))
            assert log.read_key("t", p, key)[-1].offset == r.base_offset
