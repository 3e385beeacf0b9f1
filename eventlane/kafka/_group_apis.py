"""The group APIs: membership (Join/Sync/Heartbeat/Leave), committed offsets, listing.

Invariant: a group's offsets are stored in ``__consumer_offsets`` through the file-based
coordination's offset store, so eventlane's own consumers and Kafka clients see one another's
commits; membership of Kafka clients is the listener's (:mod:`.groups`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.admin import (
    DeleteGroupsResponse,
    DescribeGroupsResponse,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse

from eventlane.consumer.admin import live_worker_members
from eventlane.consumer.coordination import coordination_for
from eventlane.consumer.coordinator import validate_group_id
from eventlane.consumer.membership import ClientGroup, GroupState
from eventlane.consumer.offsets import OffsetAndMetadata
from eventlane.errors import (
    ConfigError,
    FrameworkError,
)
from eventlane.kafka._base import NODE_ID, BrokerState, check_topic_name
from eventlane.kafka._produce import TRANSACTIONS_MESSAGE, TRANSACTIONS_REFUSED
from eventlane.kafka.codes import Errors, errno, error_for, group_error_for
from eventlane.log import TopicPartition

_MAX_PLACEHOLDERS = 100_000
"""Negative commits held in memory (see ``offset_commit``): a bound, oldest dropped first."""


class GroupApis(BrokerState):
    """The group APIs (the module docstring)."""

    _placeholders: dict[tuple[str, TopicPartition], int]
    """(group, partition) -> a negative committed offset (-1 latest, -2 earliest: a client's
    "no position, apply the reset policy"), answered by OffsetFetch until the group commits
    a real offset there; the store keeps its last real commit."""

    def _eventlane_live(self, group: str) -> bool:
        """Whether eventlane workers (its own coordinator) hold live members of ``group``."""
        try:
            return bool(live_worker_members(self.log, group))
        except FrameworkError:
            return False

    def _publish_group(self, group: str, snapshot: ClientGroup) -> None:
        """Write a group's membership into its group state, where ``eventlane groups``
        reads it (blocking)."""

        def change(state: GroupState) -> None:
            state.clients = snapshot

        coord = coordination_for(self.log).coordinator(group)
        try:
            coord.mutate(change)
        finally:
            coord.close()

    # -- groups ----------------------------------------------------------------------------
    async def join_group(self, request: Any) -> Any:
        client_id = request.header.client_id or ""
        result = await self.groups.join(request, client_id)
        Member = JoinGroupResponse.JoinGroupResponseMember
        return JoinGroupResponse(
            throttle_time_ms=0,
            error_code=result["error_code"],
            generation_id=result["generation_id"],
            protocol_type=result["protocol_type"],
            protocol_name=result["protocol_name"],
            leader=result["leader"],
            skip_assignment=False,
            member_id=result["member_id"],
            members=[
                Member(
                    member_id=m["member_id"],
                    group_instance_id=m["group_instance_id"],
                    metadata=m["metadata"],
                )
                for m in result["members"]
            ],
        )

    async def sync_group(self, request: Any) -> Any:
        code, assignment = await self.groups.sync(request)
        group = self.groups.describe(request.group_id)
        return SyncGroupResponse(
            throttle_time_ms=0,
            error_code=code,
            protocol_type=None if group is None else group.protocol_type,
            protocol_name=None if group is None else group.protocol,
            assignment=assignment,
        )

    async def heartbeat(self, request: Any) -> Any:
        return HeartbeatResponse(throttle_time_ms=0, error_code=self.groups.heartbeat(request))

    async def leave_group(self, request: Any) -> Any:
        members = getattr(request, "members", None)
        if members:
            wanted = [(m.member_id, m.group_instance_id) for m in members]
        else:
            wanted = [(request.member_id, None)]
        results = self.groups.leave(request.group_id, wanted)
        code = results[0][2] if results and not members else errno(Errors.NoError)
        return LeaveGroupResponse(
            throttle_time_ms=0,
            error_code=code,
            members=[
                LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=c)
                for m, i, c in results
            ],
        )

    async def offset_commit(self, request: Any) -> Any:
        """Kafka stores any committed offset; so does the listener. A negative one (-1, -2:
        a client's placeholder for "latest"/"earliest" after OFFSET_OUT_OF_RANGE) is held as
        a placeholder that OffsetFetch answers, so the client applies its reset policy; one
        below the low-water mark is stored, and the next fetch from it gets
        OFFSET_OUT_OF_RANGE, so the client resets as its policy says (Kafka's behaviour)."""
        TopicR = OffsetCommitResponse.OffsetCommitResponseTopic
        PartR = TopicR.OffsetCommitResponsePartition
        generation = request.generation_id_or_member_epoch
        group = request.group_id
        try:
            validate_group_id(group)
            code = self.groups.check_commit(group, generation, request.member_id or "")
        except ConfigError:
            code = errno(Errors.InvalidGroupIdError)
        wanted: dict[TopicPartition, OffsetAndMetadata] = {}
        placeholders: dict[TopicPartition, int] = {}
        errors: dict[TopicPartition, int] = {}
        for topic in request.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                if code:
                    errors[tp] = code
                    continue
                try:
                    exists = self.log.topic_exists(check_topic_name(topic.name))
                    if not exists or p.partition_index >= self.log.partition_count(topic.name):
                        errors[tp] = errno(Errors.UnknownTopicOrPartitionError)
                    elif p.committed_offset < 0:
                        placeholders[tp] = p.committed_offset
                    else:
                        meta = p.committed_metadata or ""
                        wanted[tp] = OffsetAndMetadata(p.committed_offset, meta)
                except Exception as exc:
                    errors[tp] = error_for(exc)
        if wanted:
            try:
                await asyncio.to_thread(
                    self.offsets.commit,
                    group,
                    wanted,
                    generation=generation,
                    member_id=request.member_id or "kafka-simple",
                )
            except Exception as exc:
                for tp in wanted:
                    errors[tp] = group_error_for(exc)
        for tp in wanted:
            if tp not in errors:
                self._placeholders.pop((group, tp), None)
        for tp, offset in placeholders.items():
            self._placeholders.pop((group, tp), None)
            self._placeholders[(group, tp)] = offset
        while len(self._placeholders) > _MAX_PLACEHOLDERS:  # the oldest go first
            del self._placeholders[next(iter(self._placeholders))]
        topics = []
        for topic in request.topics:
            parts = [
                PartR(
                    partition_index=p.partition_index,
                    error_code=errors.get(TopicPartition(topic.name, p.partition_index), 0),
                )
                for p in topic.partitions
            ]
            topics.append(TopicR(name=topic.name, partitions=parts))
        return OffsetCommitResponse(throttle_time_ms=0, topics=topics)

    async def offset_fetch(self, request: Any) -> Any:
        groups = getattr(request, "groups", None)
        if groups:
            Group = OffsetFetchResponse.OffsetFetchResponseGroup
            Topics = Group.OffsetFetchResponseTopics
            Parts = Topics.OffsetFetchResponsePartitions
            out = []
            for g in groups:
                code, found = await self._fetch_committed(g.group_id, g.topics)
                out.append(
                    Group(
                        group_id=g.group_id,
                        error_code=code,
                        topics=[
                            Topics(
                                name=name,
                                partitions=[
                                    Parts(
                                        partition_index=p,
                                        committed_offset=o,
                                        committed_leader_epoch=-1,
                                        metadata=m,
                                        error_code=code,
                                    )
                                    for p, o, m in parts
                                ],
                            )
                            for name, parts in found
                        ],
                    )
                )
            return OffsetFetchResponse(throttle_time_ms=0, groups=out)
        Topic = OffsetFetchResponse.OffsetFetchResponseTopic
        Part = Topic.OffsetFetchResponsePartition
        code, found = await self._fetch_committed(request.group_id, request.topics)
        return OffsetFetchResponse(
            throttle_time_ms=0,
            error_code=code,
            topics=[
                Topic(
                    name=name,
                    partitions=[
                        Part(
                            partition_index=p,
                            committed_offset=o,
                            committed_leader_epoch=-1,
                            metadata=m,
                            error_code=code,
                        )
                        for p, o, m in parts
                    ],
                )
                for name, parts in found
            ],
        )

    async def _fetch_committed(
        self, group: Any, topics: Any
    ) -> tuple[int, list[tuple[str, list[tuple[int, int, str]]]]]:
        """(error code, committed offsets by topic) of ``group``; on an error every asked
        partition is listed with offset -1."""
        try:
            validate_group_id(group)
            return 0, await asyncio.to_thread(self._committed, group, topics)
        except ConfigError:
            code = errno(Errors.InvalidGroupIdError)
        except Exception as exc:
            code = group_error_for(exc)
        asked = [(t.name, [(p, -1, "") for p in t.partition_indexes]) for t in topics or []]
        return code, asked

    def _committed(self, group: str, topics: Any) -> list[tuple[str, list[tuple[int, int, str]]]]:
        if not self.offsets.exists():
            committed: dict[TopicPartition, tuple[int, str]] = {}
        else:
            committed = {
                tp: (c.offset, c.metadata or "")
                for tp, c in self.offsets.group_offsets(group).items()
            }
        for (g, tp), offset in list(self._placeholders.items()):
            if g == group:
                committed[tp] = (offset, "")
        if topics is None:
            by_topic: dict[str, list[tuple[int, int, str]]] = {}
            for tp, (offset, meta) in sorted(committed.items()):
                by_topic.setdefault(tp.topic, []).append((tp.partition, offset, meta))
            return sorted(by_topic.items())
        out = []
        for t in topics:
            parts = []
            for p in t.partition_indexes:
                offset, meta = committed.get(TopicPartition(t.name, p), (-1, ""))
                parts.append((p, offset, meta))
            out.append((t.name, parts))
        return out

    async def list_groups(self, request: Any) -> Any:
        names = set(self.groups.groups)
        if self.offsets.exists():
            names |= await asyncio.to_thread(self.offsets.groups)
        listed = []
        for name in sorted(names):
            group = self.groups.describe(name)
            state = "Empty" if group is None else group.state
            if getattr(request, "states_filter", None) and state not in request.states_filter:
                continue
            listed.append(
                ListGroupsResponse.ListedGroup(
                    group_id=name, protocol_type="consumer", group_state=state, group_type="classic"
                )
            )
        return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=listed)

    async def describe_groups(self, request: Any) -> Any:
        Described = DescribeGroupsResponse.DescribedGroup
        Member = Described.DescribedGroupMember
        out = []
        for name in request.groups:
            group = self.groups.describe(name)
            members = [] if group is None else list(group.members.values())
            out.append(
                Described(
                    error_code=0,
                    error_message=None,
                    group_id=name,
                    group_state="Dead" if group is None else group.state,
                    protocol_type="" if group is None else (group.protocol_type or ""),
                    protocol_data="" if group is None else (group.protocol or ""),
                    members=[
                        Member(
                            member_id=m.member_id,
                            group_instance_id=m.instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=dict(m.protocols).get(group.protocol or "", b"")
                            if group
                            else b"",
                            member_assignment=m.assignment,
                        )
                        for m in members
                    ],
                )
            )
        return DescribeGroupsResponse(throttle_time_ms=0, groups=out)

    async def delete_groups(self, request: Any) -> Any:
        results = []
        for name in request.groups_names:
            group = self.groups.describe(name)
            code = errno(Errors.NoError)
            if group is not None and group.members:
                code = errno(Errors.NonEmptyGroupError)
            else:
                try:
                    await asyncio.to_thread(self.offsets.delete_group, name)
                    self.groups.groups.pop(name, None)
                    for key in [k for k in self._placeholders if k[0] == name]:
                        del self._placeholders[key]
                except Exception as exc:
                    code = group_error_for(exc)
            results.append(
                DeleteGroupsResponse.DeletableGroupResult(group_id=name, error_code=code)
            )
        return DeleteGroupsResponse(throttle_time_ms=0, results=results)

    async def find_coordinator(self, request: Any) -> Any:
        keys = list(getattr(request, "coordinator_keys", None) or [request.key])
        if request.key_type != 0:  # 1: a transaction coordinator, 2: a share group's
            code, message = TRANSACTIONS_REFUSED, TRANSACTIONS_MESSAGE
        else:
            code, message = errno(Errors.NoError), None
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            error_code=code,
            error_message=message,
            node_id=NODE_ID if code == 0 else -1,
            host=self.host if code == 0 else "",
            port=self.port if code == 0 else -1,
            coordinators=[
                FindCoordinatorResponse.Coordinator(
                    key=k,
                    node_id=NODE_ID if code == 0 else -1,
                    host=self.host if code == 0 else "",
                    port=self.port if code == 0 else -1,
                    error_code=code,
                    error_message=message,
                )
                for k in keys
            ],
        )
