"""Found by the log model's soak (tests/log/test_log_stateful.py, at 66,852 steps; fixed in
9361a26): on a compacted topic, once compaction removed a key's last record (a tombstone
kept past ``delete_retention_ms``, with the record it deleted), ``key_head`` still named
the tombstone's offset, from the latest-mode key index that had indexed it, while
``read_key`` returned nothing and an append expecting that offset was refused. The port's
answer: no record, no head (eventlane/log/port.py); all three agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlane.errors import ConcurrencyError
from eventlane.log import Expect, LogStore

CONFIG = {
    "cleanup_policy": "compact",
    "min_compaction_lag_ms": 0,
    "delete_retention_ms": 1_000,
    "segment_bytes": 200,  # a few records per segment: the tombstone's is closed, cleanable
    "segment_ms": 10**15,
}


def test_key_head_names_no_record_that_compaction_removed(tmp_path: Path) -> None:
    now = [1_700_000_000_000]
    with LogStore(tmp_path, clock=lambda: now[0]) as store:
        store.create_topic("c", 1, CONFIG)
        # conditional appends: the appender indexes them (the index names offset 1)
        store.append("c", 0, [(b"gone", b"v1", (), None)], expect=Expect(b"gone", None))
        tombstone = [(b"gone", None, (), None)]
        store.append("c", 0, tombstone, expect=Expect(b"gone", 0))  # offset 1
        for i in range(12):  # other keys, rolling segments past the tombstone's
            store.append("c", 0, [(b"k%d" % (i % 3), b"x" * 20, (), None)])
        assert store.keys.index("c", 0).head_entry(b"gone") == (2, 1)
        assert store.key_head("c", 0, b"gone") == 1  # the tombstone, still in the log
        store.compact("c")  # the first pass sees the tombstone: kept delete_retention_ms
        assert [r.offset for r in store.read_key("c", 0, b"gone")] == [1]
        now[0] += 2_000
        store.compact("c")  # past delete_retention_ms: the tombstone goes
        assert store.read("c", 0, 0)[0][0].offset > 1, "compaction kept offsets 0-1"
        assert store.keys.index("c", 0).head_entry(b"gone") == (2, 1)  # still named
        head = store.key_head("c", 0, b"gone")  # before any read_key repairs the index
        records = store.read_key("c", 0, b"gone")
        assert (head, records) == (None, []), f"key_head {head}, read_key {records}"
        with pytest.raises(ConcurrencyError):
            store.append("c", 0, [(b"gone", b"v2", (), None)], expect=Expect(b"gone", 1))
        appended = store.append("c", 0, [(b"gone", b"v2", (), None)], expect=Expect(b"gone", None))
        assert store.key_head("c", 0, b"gone") == appended.base_offset
