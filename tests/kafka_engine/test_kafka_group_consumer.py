"""The GroupConsumer API tests of tests/consumer/test_group_consumer.py, re-run on Kafka's
group coordinator (issue 33, item 3): ``GroupConsumer`` on a ``kafka://`` log is a member of
the group on the brokers (librdkafka), as an application on ``--log kafka://`` is. The
development cluster accepts sessions from 1 s (``group.min.session.timeout.ms``), so the
embedded tests' 2 s sessions run unchanged.

Left out, with what stands for them:

* ``test_commit_stores_next_offset_and_a_new_member_resumes_there``: Kafka's offset commit
  keeps the offset and its metadata, not the committing member and generation
  (``committed_entry`` reads them as "" and -1); the commit, metadata and resume are covered
  by tests/kafka_engine/test_kafka_engine_groups.py.
* ``test_max_poll_interval_leaves_the_group_and_poll_rejoins``: librdkafka requires
  ``max.poll.interval.ms >= session.timeout.ms`` (a ConfigError here); it leaves the group
  when poll stops, as the embedded member does.
* ``test_eager_assignor_revokes_everything_then_assigns``: its last check polls once with
  a zero timeout, and Kafka answers a join asynchronously; re-written below with a wait.
* ``test_bad_configuration_is_refused`` never reaches a log; ``test_a_frozen_lock_holder_...``
  freezes the embedded coordinator's file lock (Kafka's coordinator takes none).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlane.consumer.group import GroupConsumer
from eventlane.consumer.kafka import KafkaGroupConsumer
from eventlane.errors import ConfigError
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.local import LocalDir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumer"))
from test_group_consumer import (  # the embedded engine's tests, collected here again
    Polling,
    drain,
    eventually,
    fill,
    make,
    test_auto_commit_on_interval_and_on_close,
    test_auto_offset_reset_policies,
    test_blocked_poll_notices_a_join_and_hands_over_promptly,
    test_commit_async_completes_in_order_and_reports_through_callback,
    test_commit_of_an_unowned_partition_is_rejected_with_coordinates,
    test_duplicate_live_static_instance_fences_the_older,
    test_groups_are_independent,
    test_on_assigned_can_seek_to_positions_stored_elsewhere,
    test_poll_without_subscription_and_after_close,
    test_static_member_restart_keeps_its_partitions,
    test_topic_gaining_partitions_triggers_a_rebalance,
)

__all__ = [
    "test_auto_commit_on_interval_and_on_close",
    "test_auto_offset_reset_policies",
    "test_blocked_poll_notices_a_join_and_hands_over_promptly",
    "test_commit_async_completes_in_order_and_reports_through_callback",
    "test_commit_of_an_unowned_partition_is_rejected_with_coordinates",
    "test_duplicate_live_static_instance_fences_the_older",
    "test_groups_are_independent",
    "test_on_assigned_can_seek_to_positions_stored_elsewhere",
    "test_poll_without_subscription_and_after_close",
    "test_static_member_restart_keeps_its_partitions",
    "test_topic_gaining_partitions_triggers_a_rebalance",
]


@pytest.fixture
def log(kafka_cluster: LocalKafkaCluster, namespace: str, tmp_path: Path) -> Iterator[KafkaLog]:
    local = LocalDir.at(tmp_path / "local")
    with KafkaLog.from_url(f"{kafka_cluster.url}?namespace={namespace}", local=local) as kafka:
        probe = GroupConsumer(kafka, group_id="probe")
        probe.close()
        assert type(probe) is KafkaGroupConsumer
        yield kafka
    assert not (tmp_path / "local" / "groups").exists()  # nothing of the groups on disk


@pytest.fixture
def consumers() -> Iterator[list[GroupConsumer]]:
    made: list[GroupConsumer] = []
    yield made
    for c in made:
        c.close()


def test_eager_assignor_revokes_everything_then_assigns_on_kafka(
    log: KafkaLog, consumers: list[GroupConsumer]
) -> None:
    """``range`` (eager) on Kafka: a join revokes every partition, then assigns; a member
    with another assignor is refused by the coordinator (INCONSISTENT_GROUP_PROTOCOL)."""
    fill(log, 4, 1)
    events: list[tuple[str, int]] = []
    a = make(
        log,
        consumers,
        assignor="range",
        on_revoked=lambda tps: events.append(("revoked", len(tps))),
        on_assigned=lambda tps: events.append(("assigned", len(tps))),
    )
    drain(a, 4)
    pa = Polling(a)
    b = make(log, consumers, assignor="range")
    pb = Polling(b)
    eventually(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    pa.stop(), pb.stop()
    assert events == [("assigned", 4), ("revoked", 4), ("assigned", 2)]
    other = make(log, consumers, assignor="roundrobin")
    with pytest.raises(ConfigError, match="assignor"):
        eventually(lambda: False, timeout=30, step=lambda: other.poll(0.2))
