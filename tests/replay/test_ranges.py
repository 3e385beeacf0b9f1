"""Offset ranges: planning pins the ends; reading returns exactly ``[start, end)``."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlane.errors import ConfigError, OffsetOutOfRangeError
from eventlane.log import LogStore, TopicPartition
from eventlane.replay.ranges import OffsetRange, end_vector, plan_ranges, read_range, split_range


def offsets(log: LogStore, rng: OffsetRange) -> list[int]:
    return [r.offset for batch in read_range(log, rng) for r in batch]


def test_a_range_ending_inside_a_batch_stops_at_its_end(tmp_path: Path) -> None:
    log = LogStore(tmp_path)
    log.create_topic("t", 1)
    log.append("t", 0, [(b"k", b"v", (), None)] * 100)  # one batch of offsets 0..99
    whole = OffsetRange("t", 0, 0, 100)
    parts = split_range(whole, 30)
    assert [offsets(log, r) for r in parts] == [
        list(range(30)),
        list(range(30, 60)),
        list(range(60, 90)),
        list(range(90, 100)),
    ]
    log.close()


def test_plan_pins_the_high_water_marks_and_checks_bounds(tmp_path: Path) -> None:
    log = LogStore(tmp_path)
    log.create_topic("t", 2)
    log.append("t", 0, [(b"k", b"v", (), None)] * 5)
    ends = end_vector(log, ["t", "missing"])
    assert ends == {TopicPartition("t", 0): 5, TopicPartition("t", 1): 0}
    log.append("t", 0, [(b"k", b"v", (), None)] * 5)
    assert plan_ranges(log, ["t"], end=ends) == [
        OffsetRange("t", 0, 0, 5),
        OffsetRange("t", 1, 0, 0),
    ]
    assert offsets(log, plan_ranges(log, ["t"], end=ends)[0]) == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigError, match="above the high-water mark"):
        plan_ranges(log, ["t"], end={TopicPartition("t", 0): 11})
    with pytest.raises(ConfigError, match="below the low-water mark"):
        plan_ranges(log, ["t"], start={TopicPartition("t", 0): -1})
    log.close()


def test_reading_below_the_low_water_mark_fails_loudly(tmp_path: Path) -> None:
    log = LogStore(tmp_path)
    log.create_topic("t", 1, {"segment_bytes": 1024, "retention_bytes": 2048})
    for _ in range(40):
        log.append("t", 0, [(b"k", b"x" * 100, (), None)])
    planned = plan_ranges(log, ["t"])[0]
    log.cleanup("t")
    assert log.offsets("t", 0).lwm > planned.start
    with pytest.raises(OffsetOutOfRangeError):
        offsets(log, planned)
    log.close()
