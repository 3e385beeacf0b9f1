"""Key reads after retention: rows of records below the low-water mark are not damage.

Found by the lock-pauses test (issue 26): after a key-index rebuild and a retention pass,
``read_key`` raised ``SerializationError`` ("the key index names an offset with no record")
and ``check_keys`` reported every row below the new low-water mark.
"""

from __future__ import annotations

from pathlib import Path

from eventlane.log import LogStore


def test_read_key_and_check_after_rebuild_and_retention(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        log.create_topic("t", 1, {"segment_bytes": 4096, "flush_policy": "os"})
        model: dict[bytes, list[int]] = {}  # the reference: each key's offsets
        for i in range(60):
            key = b"k%d" % (i % 5)
            model.setdefault(key, []).append(
                log.append("t", 0, [(key, b"x" * 50, (), None)]).base_offset
            )
        for lwm in (25, 30):  # the second pass after a rebuild: the index keeps older rows
            assert log.delete_records("t", 0, lwm) == lwm
            for key, offsets in model.items():
                got = [r.offset for r in log.read_key("t", 0, key)]
                assert got == [o for o in offsets if o >= lwm]
            assert [r.problems for r in log.check_keys(["t"])] == [()]
            log.rebuild_keys("t", 0)
