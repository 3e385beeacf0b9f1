"""Hostile and malformed input: a clear error, and nothing created, changed or lost.

Topic names follow Kafka's rule (``[a-zA-Z0-9._-]{1,249}``, not ``.``/``..``) so no name can
reach outside the data directory; every entry point that takes a name checks it. Records
over ``max_record_bytes``, keyless records on a compacted topic and malformed record tuples
are refused as a whole (nothing of the append is stored). Offsets, partitions and config
values of the wrong type or range get :class:`ConfigError` / :class:`UnknownPartitionError`
/ :class:`OffsetOutOfRangeError`, never a bare ``TypeError`` from deep inside.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventlane.consumer import Consumer
from eventlane.errors import (
    ConfigError,
    InvalidRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from eventlane.log import LogStore, Producer, ProducerRecord, TopicPartition


def _tree(root: Path) -> set[str]:
    """Every path under ``root`` (files and directories), relative."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Paths and contents (``None`` for directories and the mutable state/notify maps)."""
    snap: dict[str, bytes | None] = {}
    for rel in _tree(root):
        path = root / rel
        volatile = path.name in ("state", ".notify", "lock", "cleaner.lock")
        snap[rel] = None if path.is_dir() or volatile else path.read_bytes()
    return snap


HOSTILE_NAMES: list[Any] = [
    "",
    ".",
    "..",
    "../x",
    "../../etc",
    "/abs",
    "/tmp/evil",
    "a/b",
    "a\\b",
    "x" * 250,
    "nul\x00byte",
    "ünïcode",
    "emoji-\U0001f600",
    "space name",
    "tab\tname",
    "new\nline",
    "dollar$",
    "star*",
    "~home",
    None,
    123,
    b"bytes",
    ["list"],
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_hostile_topic_name_is_refused_everywhere(
    store: LogStore, tmp_path: Path, name: Any
) -> None:
    before = _tree(tmp_path)
    calls: list[Callable[[], object]] = [
        lambda: store.create_topic(name, 1),
        lambda: store.create_topic(name, 1, exist_ok=True),
        lambda: store.topic_exists(name),
        lambda: store.describe_topic(name),
        lambda: store.partition_count(name),
        lambda: store.topic_config(name),
        lambda: store.alter_topic(name, partitions=2),
        lambda: store.delete_topic(name),
        lambda: store.append(name, 0, [(b"k", b"v", (), None)]),
        lambda: store.read(name, 0, 0),
        lambda: store.offsets(name, 0),
        lambda: store.offset_for_time(name, 0, 0),
        lambda: store.compact(name),
        lambda: store.cleanup(name),
        lambda: Producer(store).send_batch(name, [ProducerRecord(b"k", b"v")]),
    ]
    if name is not None:  # verify(None) means "every topic"
        calls.append(lambda: store.verify(name))
    for call in calls:
        with pytest.raises(InvalidTopicError):
            call()
    assert _tree(tmp_path) == before, "a refused name created something"
    assert store.list_topics() == []


def test_longest_legal_name_and_legal_characters(store: LogStore) -> None:
    for name in ("x" * 249, "a.b_c-D9", "a..", "-", "_"):
        store.create_topic(name, 1)
        store.append(name, 0, [(b"k", b"v", (), None)])
        assert store.read(name, 0, 0)[0][0].value == b"v"
    assert (store.topics_root / ("x" * 249)).is_dir()
    # A leading '.' is reserved for the topics directory's own entries (issue 17 #10), so
    # every topic directory is listed (and verified): none is hidden.
    for name in ("...", "..a", ".hidden"):
        with pytest.raises(InvalidTopicError, match="is reserved"):
            store.create_topic(name, 1)
    assert sorted(p.name for p in store.topics_root.iterdir()) == sorted(store.list_topics())


def test_symlinked_topic_cannot_escape(store: LogStore, tmp_path: Path) -> None:
    """A topic directory replaced by a symlink to outside the data directory is refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.topics_root / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidTopicError):
        store.create_topic("evil", 1)
    assert list(outside.iterdir()) == []


# ------------------------------------------------------------------------------ records


def test_oversized_record_refused_and_nothing_appended(store: LogStore) -> None:
    store.create_topic("t", 1, {"max_record_bytes": 1000})
    store.append("t", 0, [(b"k", b"ok", (), None)])
    before = store.offsets("t", 0)
    for bad in [
        (b"k", b"v" * 1000, (), None),
        (b"k" * 1000, b"v", (), None),
        (b"k", b"v", (("h", b"x" * 1000),), None),
    ]:
        batch = [(b"a", b"fine", (), None), (b"b", b"fine", (), None), bad]
        with pytest.raises(RecordTooLargeError) as info:
            store.append("t", 0, batch)
        assert (info.value.topic, info.value.partition) == ("t", 0)
        assert "max_record_bytes" in str(info.value)
        assert store.offsets("t", 0) == before
    assert [r.value for r in store.read("t", 0, 0)[0]] == [b"ok"]
    assert store.verify() == []


def test_oversized_record_through_the_producer(store: LogStore) -> None:
    store.create_topic("t", 2, {"max_record_bytes": 500})
    producer = Producer(store)
    with pytest.raises(RecordTooLargeError):
        producer.send_batch("t", [ProducerRecord(b"k", b"x" * 600)])
    future = producer.send("t", b"x" * 600, key=b"k")
    with pytest.raises(RecordTooLargeError):
        future.result(timeout=10)
    producer.close()
    assert [store.offsets("t", p).leo for p in range(2)] == [0, 0]


def test_keyless_record_on_compacted_topic(store: LogStore) -> None:
    for policy in ("compact", "compact,delete"):
        store.create_topic(policy.replace(",", "-"), 1, {"cleanup_policy": policy})
        topic = policy.replace(",", "-")
        with pytest.raises(InvalidRecordError) as info:
            store.append(topic, 0, [(b"k", b"v", (), None), (None, b"v", (), None)])
        assert "key" in str(info.value)
        assert store.offsets(topic, 0).leo == 0
        with pytest.raises(InvalidRecordError):
            Producer(store).send_batch(topic, [ProducerRecord(None, b"v")])
        assert store.offsets(topic, 0).leo == 0


@pytest.mark.parametrize(
    "record",
    [
        ("key", b"v", (), None),
        (b"k", "value", (), None),
        (b"k", b"v", (("h", "text"),), None),
        (b"k", b"v", ((1, b"x"),), None),
        (b"k", b"v", (), "yesterday"),
        (b"k", b"v", (), 2**70),
        (b"k",),
        "not a tuple",
        None,
    ],
    ids=repr,
)
def test_malformed_record_refused_and_nothing_appended(store: LogStore, record: Any) -> None:
    store.create_topic("t", 1)
    store.append("t", 0, [(b"k", b"before", (), None)])
    with pytest.raises(InvalidRecordError) as info:
        store.append("t", 0, [(b"k", b"fine", (), None), record])
    assert info.value.topic == "t"
    assert store.offsets("t", 0) == (0, 1, 1)
    assert store.verify() == []
    assert store.append("t", 0, [(b"k", b"after", (), None)]).base_offset == 1


@pytest.mark.parametrize(
    "record",
    [
        ProducerRecord("key", b"v"),
        ProducerRecord(b"k", "v"),  # type: ignore[arg-type]
        ProducerRecord(b"k", b"v", (("h", "x"),)),  # type: ignore[arg-type]
        ProducerRecord(b"k", b"v", (), -1),
        ProducerRecord(b"k", b"v", (), "now"),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_producer_refuses_malformed_records(store: LogStore, record: ProducerRecord) -> None:
    store.create_topic("t", 1)
    producer = Producer(store)
    with pytest.raises(InvalidRecordError):
        producer.send_batch("t", [record])
    with pytest.raises(InvalidRecordError):
        producer.send(
            "t", record.value, key=record.key, headers=record.headers, timestamp=record.timestamp
        ).result(timeout=10)
    producer.close()
    assert store.offsets("t", 0).leo == 0


# ------------------------------------------------------------------------------ offsets, partitions


@pytest.mark.parametrize("offset", [-1, -100, 4, 10**12])
def test_read_out_of_range(store: LogStore, offset: int) -> None:
    store.create_topic("t", 1)
    store.append("t", 0, [(None, b"v", (), None)] * 3)
    with pytest.raises(OffsetOutOfRangeError) as info:
        store.read("t", 0, offset)
    assert (info.value.offset, info.value.lwm, info.value.leo) == (offset, 0, 3)


@pytest.mark.parametrize("offset", ["0", 1.5, None, True, b"0", [0]], ids=repr)
def test_read_garbage_offset(store: LogStore, offset: Any) -> None:
    store.create_topic("t", 1)
    with pytest.raises(ConfigError):
        store.read("t", 0, offset)


@pytest.mark.parametrize(
    "kwargs", [{"max_bytes": "1"}, {"max_bytes": None}, {"upto": "5"}, {"upto": 1.5}], ids=repr
)
def test_read_garbage_limits(store: LogStore, kwargs: dict[str, Any]) -> None:
    store.create_topic("t", 1)
    with pytest.raises(ConfigError):
        store.read("t", 0, 0, **kwargs)


@pytest.mark.parametrize("max_bytes", [0, -1, 1])
def test_tiny_max_bytes_still_makes_progress(store: LogStore, max_bytes: int) -> None:
    store.create_topic("t", 1)
    store.append("t", 0, [(None, b"v", (), None)] * 3)
    records, _ = store.read("t", 0, 1, max_bytes=max_bytes)
    assert [r.offset for r in records] == [1, 2]  # at least the batch holding offset 1


@pytest.mark.parametrize("partition", [-1, 3, 10**9, True, False, 1.0, "0", None], ids=repr)
def test_bad_partition_numbers(store: LogStore, partition: Any) -> None:
    store.create_topic("t", 3)
    store.offsets("t", 1)  # opened partitions must not be reachable by 1.0 or True either
    store.offsets("t", 0)
    for call in (
        lambda: store.append("t", partition, [(None, b"v", (), None)]),
        lambda: store.read("t", partition, 0),
        lambda: store.offsets("t", partition),
        lambda: store.offset_for_time("t", partition, 0),
    ):
        with pytest.raises(UnknownPartitionError):
            call()
    assert [store.offsets("t", p).leo for p in range(3)] == [0, 0, 0]
    if partition is not None:  # None means "let the producer choose"
        with pytest.raises((InvalidRecordError, UnknownPartitionError)):
            Producer(store).send_batch("t", [ProducerRecord(None, b"v")], partition=partition)
    assert sorted(p.name for p in (store.topics_root / "t").iterdir() if p.is_dir()) == [
        "0",
        "1",
        "2",
    ]


def test_offset_for_time_garbage(store: LogStore) -> None:
    store.create_topic("t", 1)
    for ts in ("now", 1.5, None):
        with pytest.raises(ConfigError):
            store.offset_for_time("t", 0, ts)  # type: ignore[arg-type]


def test_consumer_bad_arguments(store: LogStore) -> None:
    store.create_topic("t", 2)
    with pytest.raises(ConfigError):
        Consumer(store, auto_offset_reset="sometimes")
    with pytest.raises(ConfigError):
        Consumer(store, max_poll_records=0)
    consumer = Consumer(store)
    with pytest.raises(ConfigError):
        consumer.assign([TopicPartition("t", 2)])
    with pytest.raises(InvalidTopicError):
        consumer.assign([TopicPartition("../t", 0)])
    consumer.assign([TopicPartition("t", 0)])
    for bad in (-1, "0", 1.5, None, True):
        with pytest.raises(ConfigError):
            consumer.seek(TopicPartition("t", 0), bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        consumer.seek(TopicPartition("t", 1), 0)  # not assigned
    with pytest.raises(ConfigError):
        consumer.position(TopicPartition("t", 1))


# ------------------------------------------------------------------------------ config

BAD_CONFIGS: list[Any] = [
    {"retention.hours": 1},
    {"no_such_key": 1},
    {1: 2},
    {"segment_bytes": 0},
    {"segment_bytes": -5},
    {"segment_bytes": "abc"},
    {"segment_bytes": 1.5},
    {"segment_bytes": 2**32},
    {"segment_bytes": True},
    {"retention_ms": -2},
    {"retention_ms": None},
    {"retention_bytes": 0},
    {"min_compaction_lag_ms": -1},
    {"delete_retention_ms": "soon"},
    {"max_record_bytes": 0},
    {"index_interval_bytes": 0},
    {"cleanup_policy": "nuke"},
    {"cleanup_policy": "delete,compact,delete"},
    {"timestamp_type": "Now"},
    {"flush_policy": "never"},
    "retention_ms=1",
    ["retention_ms", 1],
]


@pytest.mark.parametrize("config", BAD_CONFIGS, ids=repr)
def test_bad_config_creates_nothing(store: LogStore, config: Any) -> None:
    before = _snapshot(store.path)
    with pytest.raises(ConfigError):
        store.create_topic("t", 1, config)
    assert store.list_topics() == []
    assert not store.topic_exists("t")
    assert _snapshot(store.path) == before, "a refused create left files behind"


@pytest.mark.parametrize("partitions", [0, -1, 10_001, "3", 1.5, None, True], ids=repr)
def test_bad_partition_count_creates_nothing(store: LogStore, partitions: Any) -> None:
    before = _snapshot(store.path)
    with pytest.raises(ConfigError):
        store.create_topic("t", partitions)
    assert _snapshot(store.path) == before


@pytest.mark.parametrize(
    "change",
    [
        {"config": {"retention.hours": 1}},
        {"config": {"segment_bytes": -1}},
        {"partitions": 1},
        {"partitions": 0},
        {"partitions": "9"},
        {"partitions": 10_001},
    ],
    ids=repr,
)
def test_bad_alter_changes_nothing(store: LogStore, change: dict[str, Any]) -> None:
    store.create_topic("t", 2, {"retention_ms": 1000})
    store.append("t", 1, [(None, b"v", (), None)])
    before = _snapshot(store.path)
    with pytest.raises(ConfigError):
        store.alter_topic("t", **change)
    assert store.partition_count("t") == 2
    assert store.topic_config("t").retention_ms == 1000
    assert _snapshot(store.path) == before
    assert store.read("t", 1, 0)[0][0].value == b"v"
