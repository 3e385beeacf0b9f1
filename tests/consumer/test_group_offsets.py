"""The ``__consumer_offsets`` store: placement, record format, replay, compaction, deletion."""

from __future__ import annotations

import time

import orjson

from eventlane.consumer.offsets import (
    OFFSETS_TOPIC,
    OffsetAndMetadata,
    OffsetStore,
    partition_for_group,
)
from eventlane.log import LogStore, TopicPartition

TP = TopicPartition("orders", 3)


def commit(store: OffsetStore, group: str, offset: int, tp: TopicPartition = TP) -> None:
    store.commit(group, {tp: OffsetAndMetadata(offset)}, generation=1, member_id="m")


def test_created_on_demand_compacted_and_placed_by_group_like_kafka(store: LogStore) -> None:
    offsets = OffsetStore(store)
    assert not store.topic_exists(OFFSETS_TOPIC)
    commit(offsets, "billing", 42)
    config = store.topic_config(OFFSETS_TOPIC)
    assert config.cleanup_policy == "compact" and config.flush_policy == "always"
    count = store.partition_count(OFFSETS_TOPIC)
    assert count == 8
    where = partition_for_group("billing", count)
    records, _ = store.read(OFFSETS_TOPIC, where, 0)
    assert [orjson.loads(r.key) for r in records] == [
        {"group": "billing", "topic": "orders", "partition": 3}
    ]
    value = orjson.loads(records[0].value)
    assert value["offset"] == 42 and value["generation"] == 1 and value["member_id"] == "m"
    for p in range(count):  # nothing anywhere else
        assert p == where or store.offsets(OFFSETS_TOPIC, p).hwm == 0


def test_readers_in_other_stores_see_commits_incrementally(store: LogStore, data_dir) -> None:
    writer = OffsetStore(store)
    other_log = LogStore(data_dir)
    reader = OffsetStore(other_log)
    assert reader.committed("g", TP) is None
    for n in range(1, 50):
        commit(writer, "g", n)
        assert reader.committed("g", TP).offset == n
    commit(writer, "h", 7)  # groups are independent
    assert reader.committed("g", TP).offset == 49 and reader.committed("h", TP).offset == 7
    assert reader.groups() == {"g", "h"}
    other_log.close()


def test_replay_after_compaction_gives_the_latest_commits(store: LogStore, data_dir) -> None:
    # A user-made offsets topic with tiny segments, so compaction has something to clean.
    store.create_topic(
        OFFSETS_TOPIC,
        2,
        {"cleanup_policy": "compact", "segment_bytes": 1024, "min_compaction_lag_ms": 0},
    )
    offsets = OffsetStore(store)
    tps = [TopicPartition("orders", p) for p in range(4)]
    for n in range(200):
        commit(offsets, "g", n, tps[n % 4])
    store.compact(OFFSETS_TOPIC)
    part = partition_for_group("g", 2)
    left, _ = store.read(
        OFFSETS_TOPIC, part, store.offsets(OFFSETS_TOPIC, part).lwm, max_bytes=1 << 20
    )
    assert len(left) < 200  # compaction removed superseded commits
    fresh_log = LogStore(data_dir)
    fresh = OffsetStore(fresh_log)
    assert {tp: fresh.committed("g", tp).offset for tp in tps} == {
        tps[0]: 196,
        tps[1]: 197,
        tps[2]: 198,
        tps[3]: 199,
    }
    assert fresh.delete_group("g") == 4
    assert OffsetStore(fresh_log).group_offsets("g") == {}
    assert fresh.groups() == set()
    fresh_log.close()


def test_history_lists_commits_in_log_order(store: LogStore) -> None:
    offsets = OffsetStore(store)
    for n in (1, 5, 3):
        commit(offsets, "g", n)
    commit(offsets, "other", 9)
    assert [(tp, o) for _, tp, o in offsets.history("g")] == [(TP, 1), (TP, 5), (TP, 3)]


def test_the_store_compacts_its_partition_in_the_background(store: LogStore) -> None:
    store.create_topic(
        OFFSETS_TOPIC,
        1,
        {"cleanup_policy": "compact", "segment_bytes": 1024, "min_compaction_lag_ms": 0},
    )
    offsets = OffsetStore(store, compact_every=50)
    for n in range(1, 200):
        commit(offsets, "g", n)
    deadline = time.monotonic() + 30  # the log compacts in its own background thread
    while True:
        marks = store.offsets(OFFSETS_TOPIC, 0)
        left, _ = store.read(OFFSETS_TOPIC, 0, marks.lwm, max_bytes=1 << 20)
        if len(left) < 150 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(left) < 150
    assert OffsetStore(store).committed("g", TP).offset == 199
