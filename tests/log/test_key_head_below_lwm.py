"""Found by the log model's soak (tests/log/test_log_stateful.py): after DeleteRecords moved
the low-water mark past a key's only record and the log was reopened, ``key_head`` names
that record's offset (below the LWM; ``read_key`` returns nothing) while a conditional
append expecting it is refused ("expected last offset 0, actual None"). A writer that reads
the head and appends expecting it is refused on every retry. The port's answer: records
below the low-water mark do not count, so ``key_head`` is ``None`` and an append expecting
``None`` succeeds (eventlane/log/port.py), in the process that moved the mark and after a
reopen alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlane.errors import ConcurrencyError
from eventlane.log import Expect, LogStore


def test_key_head_and_expect_agree_after_delete_records_and_reopen(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.create_topic("t", 1)
    store.append("t", 0, [(b"b", b"x", (), None)], expect=Expect(b"b", None))
    store.append("t", 0, [(None, b"y", (), None)] * 8)
    store.delete_records("t", 0, 5)
    store.close()
    store = LogStore(tmp_path)
    try:
        head = store.key_head("t", 0, b"b")
        try:
            store.append("t", 0, [(b"b", b"z", (), None)], expect=Expect(b"b", head))
        except ConcurrencyError as exc:
            pytest.fail(f"key_head said {head}, and an append expecting it was refused: {exc}")
        assert head is None
    finally:
        store.close()


def test_key_head_and_expect_agree_after_delete_records_in_the_same_process(
    tmp_path: Path,
) -> None:
    """The writer that appended the key (and so remembers its head as checked) sees the
    same answer as a fresh process once the low-water mark passes the key's records."""
    with LogStore(tmp_path) as store:
        store.create_topic("t", 1)
        store.append("t", 0, [(b"b", b"x", (), None)], expect=Expect(b"b", None))
        store.append("t", 0, [(b"c", b"y", (), None)], expect=Expect(b"c", None))
        store.delete_records("t", 0, 1)
        assert store.key_head("t", 0, b"b") is None
        assert store.key_head("t", 0, b"c") == 1
        with pytest.raises(ConcurrencyError):
            store.append("t", 0, [(b"b", b"z", (), None)], expect=Expect(b"b", 0))
        store.append("t", 0, [(b"b", b"z", (), None)], expect=Expect(b"b", None))
        assert store.key_head("t", 0, b"b") == 2
