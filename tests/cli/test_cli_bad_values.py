"""Bad values and internal topics through the real ``eventlane`` script (issue 17, #9 and
#10): a clear one-line error naming what is wrong, never a traceback, nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import eventlane

from eventlane.consumer.offsets import OFFSETS_TOPIC, OffsetAndMetadata, OffsetStore
from eventlane.errors import ConfigError, InvalidRecordError, InvalidTopicError
from eventlane.log import LogStore, Producer, ProducerRecord, TopicPartition

HUGE = "1" + "0" * 23  # 1e23 written out: beyond int64


def _error(result: object) -> str:
    stderr = result.stderr.decode()  # type: ignore[attr-defined]
    assert "Traceback" not in stderr, stderr
    return stderr


def test_huge_integer_config_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for key in ("retention.ms", "max.record.bytes"):
        created = eventlane("topics", "create", "t", "--config", f"{key}={HUGE}", data=data)
        assert created.returncode == 1
        assert f"config {key.replace('.', '_')} must be at most" in _error(created)
    log = LogStore(data)
    assert log.list_topics() == []
    log.create_topic("t")
    with pytest.raises(ConfigError, match="segment_ms must be at most"):
        log.alter_topic("t", config={"segment.ms": HUGE})
    log.close()
    altered = eventlane("topics", "alter", "t", "--config", f"retention.ms={HUGE}", data=data)
    assert altered.returncode == 1 and "must be at most" in _error(altered)
    result = eventlane("consume", "t", "--timeout", "nan", data=data, timeout=30)
    assert result.returncode == 2
    assert "not a finite number of seconds" in _error(result)


def test_a_three_tuple_record_is_a_clear_error(tmp_path: Path) -> None:
    log = LogStore(tmp_path / "data")
    log.create_topic("t")
    with pytest.raises(InvalidRecordError, match="record 1 is not a 4-tuple"):
        log.append("t", 0, [(b"k", b"v", (), None), (b"k", b"v", ())])  # type: ignore[list-item]
    with pytest.raises(InvalidRecordError, match="record 0 is not a 4-tuple"):
        Producer(log).send_batch("t", [(b"k", b"v", ())])  # type: ignore[list-item]
    assert log.offsets("t", 0).leo == 0
    log.close()


def test_internal_offsets_topic_keeps_its_policy_and_is_not_produced_to(tmp_path: Path) -> None:
    data = tmp_path / "data"
    created = eventlane("topics", "create", OFFSETS_TOPIC, data=data)
    assert created.returncode == 1 and "internal topic" in _error(created)
    log = LogStore(data)
    with pytest.raises(ConfigError, match=r"must keep cleanup\.policy=compact"):
        log.create_topic(OFFSETS_TOPIC, 2, {"cleanup_policy": "delete"})
    assert OFFSETS_TOPIC not in log.list_topics()
    offsets = OffsetStore(log)
    offsets.commit(
        "g", {TopicPartition("orders", 0): OffsetAndMetadata(5)}, generation=-1, member_id=""
    )
    with pytest.raises(InvalidTopicError, match="internal topic"):
        Producer(log).send_batch(OFFSETS_TOPIC, [ProducerRecord(b"k", b"forged")])
    with pytest.raises(InvalidTopicError, match="internal topic"):
        Producer(log).send(OFFSETS_TOPIC, b"forged", key=b"k")
    log.close()
    forged = eventlane("produce", OFFSETS_TOPIC, data=data, input=b"forged\n")
    assert forged.returncode == 1 and "internal topic" in _error(forged)
    altered = eventlane(
        "topics", "alter", OFFSETS_TOPIC, "--config", "cleanup.policy=delete", data=data
    )
    assert altered.returncode == 1 and "must keep cleanup.policy=compact" in _error(altered)
    check = LogStore(data)
    assert OffsetStore(check).committed("g", TopicPartition("orders", 0)).offset == 5  # type: ignore[union-attr]
    assert check.topic_config(OFFSETS_TOPIC).cleanup_policy == "compact"
    check.close()


def test_dot_names_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = eventlane("topics", "create", ".hidden", data=data)
    assert result.returncode == 2 and "is reserved" in _error(result)
    log = LogStore(data)
    for name in (".hidden", "..", ".", ".creating-x", ".deleted-0"):
        with pytest.raises(InvalidTopicError):
            log.create_topic(name)
    assert sorted(p.name for p in (data / "topics").iterdir()) == []
    log.close()
