"""The listener's group coordinator accepts a commit of the current generation while the
group prepares a rebalance, as Kafka does (the eager protocol commits before it gives its
partitions up), and refuses one once the next generation exists but is not synced.

Refusing the first made members that commit synchronously (tests/kafka/members.py) fail
their commits whenever another member joined; on a loaded machine the mixed-group test lost
members that way.
"""

from __future__ import annotations

import asyncio

from kafka.protocol.consumer import JoinGroupRequest, SyncGroupRequest

from eventlane.kafka.codes import Errors, errno
from eventlane.kafka.groups import GroupCoordinator

PROTOCOL = JoinGroupRequest.JoinGroupRequestProtocol


def _join(member_id: str = "") -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id="g",
        session_timeout_ms=30_000,
        rebalance_timeout_ms=30_000,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[PROTOCOL(name="range", metadata=b"")],
        reason=None,
    )


def _sync(generation: int, member_id: str, leader: bool) -> SyncGroupRequest:
    Assignment = SyncGroupRequest.SyncGroupRequestAssignment
    return SyncGroupRequest(
        group_id="g",
        generation_id=generation,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments=[Assignment(member_id=member_id, assignment=b"")] if leader else [],
    )


def test_commits_during_a_rebalance_follow_kafka() -> None:
    async def scenario() -> list[int]:
        coordinator = GroupCoordinator(None, initial_delay_s=0.05)
        first = await coordinator.join(_join(), "a")
        a, generation = first["member_id"], first["generation_id"]
        assert (await coordinator.sync(_sync(generation, a, leader=True)))[0] == 0
        codes = [coordinator.check_commit("g", generation, a)]  # Stable
        joining = asyncio.ensure_future(coordinator.join(_join(), "b"))
        await asyncio.sleep(0.05)
        assert coordinator.describe("g").state == "PreparingRebalance"  # type: ignore[union-attr]
        codes.append(coordinator.check_commit("g", generation, a))  # a has not rejoined yet
        rejoined = await coordinator.join(_join(a), "a")
        await joining
        assert coordinator.describe("g").state == "CompletingRebalance"  # type: ignore[union-attr]
        codes.append(coordinator.check_commit("g", rejoined["generation_id"], a))  # not synced
        codes.append(coordinator.check_commit("g", generation, a))  # the old generation
        return codes

    assert asyncio.run(scenario()) == [
        errno(Errors.NoError),
        errno(Errors.NoError),
        errno(Errors.RebalanceInProgressError),
        errno(Errors.IllegalGenerationError),
    ]
