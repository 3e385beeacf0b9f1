"""The GroupConsumer API tests of tests/consumer/test_group_consumer.py, re-run with the log
and the group coordination on the cluster (issue 13): commits and their fencing,
auto-commit, listeners, the eager assignor, topics gaining partitions, max.poll.interval,
static membership. ``GroupConsumer`` picks the KV coordination by itself
(``coordination_for``), as an application on ``--log nats://`` does.

Left out: ``test_a_frozen_lock_holder_does_not_stop_other_members_heartbeats`` (it freezes
the embedded coordinator's file lock; the KV coordinator takes no lock, and its frozen
members are covered by tests/jetstream/test_js_group_processes.py) and the configuration
test, which never reaches a log.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlane.consumer.coordination import coordination_for
from eventlane.consumer.group import GroupConsumer
from eventlane.consumer.jetstream import JetStreamCoordination
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumer"))
from test_group_consumer import (  # the embedded engine's tests, collected here again
    test_auto_commit_on_interval_and_on_close,
    test_auto_offset_reset_policies,
    test_blocked_poll_notices_a_join_and_hands_over_promptly,
    test_commit_async_completes_in_order_and_reports_through_callback,
    test_commit_of_an_unowned_partition_is_rejected_with_coordinates,
    test_commit_stores_next_offset_and_a_new_member_resumes_there,
    test_duplicate_live_static_instance_fences_the_older,
    test_eager_assignor_revokes_everything_then_assigns,
    test_groups_are_independent,
    test_max_poll_interval_leaves_the_group_and_poll_rejoins,
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
    "test_commit_stores_next_offset_and_a_new_member_resumes_there",
    "test_duplicate_live_static_instance_fences_the_older",
    "test_eager_assignor_revokes_everything_then_assigns",
    "test_groups_are_independent",
    "test_max_poll_interval_leaves_the_group_and_poll_rejoins",
    "test_on_assigned_can_seek_to_positions_stored_elsewhere",
    "test_poll_without_subscription_and_after_close",
    "test_static_member_restart_keeps_its_partitions",
    "test_topic_gaining_partitions_triggers_a_rebalance",
]


@pytest.fixture
def log(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[JetStreamLog]:
    local = LocalDir.at(tmp_path / "local")
    with JetStreamLog.from_url(cluster.url, namespace=namespace, local=local) as js:
        assert isinstance(coordination_for(js), JetStreamCoordination)
        yield js
    assert not (tmp_path / "local" / "groups").exists()  # nothing of the groups on disk


@pytest.fixture
def consumers() -> Iterator[list[GroupConsumer]]:
    made: list[GroupConsumer] = []
    yield made
    for c in made:
        c.close()
