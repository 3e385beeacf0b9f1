"""A read that began before retention deleted the segments it was about to read.

The reader takes the partition's state (low-water mark, segment layout), then lists the
segment files. Retention in another process (another ``LogStore``: its own objects, as a
process has) may move the low-water mark, publish a new layout and delete the segments in
between: the reader then finds its offset below every segment that is left. That is a
read of records retention removed, answered as such (``OffsetOutOfRangeError``, which a
key read or a consumer handles), never "offsets are missing: no segment holds them" (a
``CorruptRecordError``, which says the log lost data: seen once in
``tests/log/test_lock_pauses.py`` under random pauses). The pause is injected at the
engine's own fault point after the reader took its state (``partition.read``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from eventlane.errors import OffsetOutOfRangeError
from eventlane.log import LogStore
from eventlane.log.embedded import read as read_path


def test_a_read_paused_while_retention_deletes_its_segments_is_out_of_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    with LogStore(data) as writer:
        writer.create_topic("t", 1, {"segment_bytes": 300})
        for i in range(60):
            writer.append("t", 0, [(b"k", b"value-%03d" % i, (), None)])
        assert len(writer.partition("t", 0).segments()) > 4
    paused, go = threading.Event(), threading.Event()

    def pause(point: str) -> None:
        if point == "partition.read" and not paused.is_set():
            paused.set()
            assert go.wait(30)

    monkeypatch.setattr(read_path, "PAUSE", pause)
    outcome: list[Any] = []
    with LogStore(data) as reader, LogStore(data) as cleaner:

        def read() -> None:
            try:
                outcome.append(reader.read("t", 0, 0))
            except Exception as exc:  # (the outcome is the assertion)
                outcome.append(exc)

        thread = threading.Thread(target=read)
        thread.start()
        assert paused.wait(30)
        lwm = cleaner.delete_records("t", 0, 40)
        assert lwm > 0 and cleaner.partition("t", 0).segments()[0].base > 0
        go.set()
        thread.join(30)
    [got] = outcome
    assert isinstance(got, OffsetOutOfRangeError), repr(got)
