"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) for Kafka
clients, with committed offsets in eventlane's ``__consumer_offsets``.

Kafka clients assign partitions themselves: the group's leader receives every member's
subscription in its JoinGroup response and sends the assignment in its SyncGroup request;
the broker only keeps the membership, the generation, and the fencing. This module is
that broker side, one state machine per group (Kafka's states: Empty, PreparingRebalance,
CompletingRebalance, Stable), in the listener's process and event loop.

Invariants:

* every change of membership bumps the generation, and a JoinGroup round completes when
  every known member has rejoined or the rebalance timeout has passed (members that did
  not rejoin are removed);
* OffsetCommit, Heartbeat and SyncGroup from an unknown member or a stale generation are
  refused (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION), so a member that lost its partitions
  never overwrites a newer commit. As in Kafka, a commit of the current generation is
  accepted while the group prepares a rebalance (the eager protocol's commit before it
  gives its partitions up: nobody else owns them until the next generation's SyncGroup)
  and refused with REBALANCE_IN_PROGRESS once the new generation exists but is not synced
  (CompletingRebalance);
* a member silent for its session timeout is removed and the group rebalances;
* a JoinGroup v4+ without a member id (and without a static instance id) is answered
  MEMBER_ID_REQUIRED with a generated id and changes nothing (KIP-394): the member is added
  only when it joins again with that id, within its session timeout, so a client that
  leaves after its first JoinGroup never holds a place in a generation; session timeouts
  outside [:data:`MIN_SESSION_MS`, :data:`MAX_SESSION_MS`] get INVALID_SESSION_TIMEOUT;
* commits are records of ``__consumer_offsets`` (eventlane's :class:`OffsetStore`), so
  ``eventlane groups list/describe`` show the group's offsets and lag;
* every group's membership (state, generation, members with client id, host and decoded
  assignment) is published into the consumer layer's group state
  (:class:`~eventlane.consumer.membership.ClientGroup`) within :data:`PUBLISH_TICK_S` of a
  change and renewed every :data:`PUBLISH_EVERY_S` while the group has members, as a lease
  of :data:`PUBLISH_LEASE_MS`: ``eventlane groups`` shows the members while the listener
  serves them and none once it stopped (at once after a clean stop, within the lease after
  a kill).

Membership lives in memory: after a listener restart, clients rejoin (as after a Kafka
coordinator failover). A group of Kafka clients and one of eventlane workers must have
different names: the two coordinators do not share membership (eventlane's workers assign
on the coordinator's side, Kafka clients on the client's), so a Kafka client joining a
group that has live eventlane members is refused with INCONSISTENT_GROUP_PROTOCOL.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

from eventlane.consumer.coordinator import validate_group_id
from eventlane.consumer.membership import ClientGroup, ClientMember
from eventlane.errors import ConfigError
from eventlane.kafka.codes import Errors, errno
from eventlane.log.record import TopicPartition
from eventlane.observability import get_logger

log = get_logger("eventlane.kafka.groups")

INITIAL_REBALANCE_DELAY_S = 1.0
"""Kafka's group.initial.rebalance.delay.ms (3 s there): how long an empty group waits for
more members before its first generation, so members starting together share one."""


MIN_SESSION_MS = 6_000
"""Kafka's group.min.session.timeout.ms: a shorter session timeout is refused."""
MAX_SESSION_MS = 1_800_000
"""Kafka's group.max.session.timeout.ms: a longer session timeout is refused."""


PUBLISH_TICK_S = 0.2
"""How often the publisher looks for changed groups."""
PUBLISH_EVERY_S = 1.0
"""How often a group with members is republished (its lease renewed)."""
PUBLISH_LEASE_MS = 10_000
"""How long a published snapshot stays current without renewal (a killed listener's
members disappear from ``eventlane groups`` after this)."""

client_host: contextvars.ContextVar[str] = contextvars.ContextVar(
    "client_host", default="/127.0.0.1"
)
"""The connection's peer as Kafka shows a member's host (``/IP``); set per connection."""

Publish = Callable[[str, ClientGroup], None]
"""Writes one group's snapshot where ``eventlane groups`` reads it (blocking: a thread)."""


class Member:
    __slots__ = (
        "assignment",
        "client_host",
        "client_id",
        "instance_id",
        "join",
        "last_seen",
        "member_id",
        "protocols",
        "rebalance_s",
        "session_s",
        "sync",
    )

    def __init__(self, member_id: str, instance_id: str | None, client_id: str, host: str) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self.client_host = host
        self.protocols: list[tuple[str, bytes]] = []
        self.assignment = b""
        self.session_s = 10.0
        self.rebalance_s = 60.0
        self.last_seen = time.monotonic()
        self.join: asyncio.Future[dict[str, Any]] | None = None
        self.sync: asyncio.Future[tuple[int, bytes]] | None = None


class Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = "Empty"
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.joined: set[str] = set()
        self.pending: dict[str, float] = {}
        """Member ids handed out with MEMBER_ID_REQUIRED -> when they expire (monotonic)."""
        self.timer: asyncio.TimerHandle | None = None


class GroupCoordinator:
    """The group state machines of one listener.

    ``commit``/``committed``/``group_offsets``/``groups``/``delete`` reach eventlane's offset
    store (blocking calls: run in threads); ``eventlane_live`` says whether eventlane workers
    hold a group of that name.
    """

    def __init__(
        self,
        offsets: Any,
        *,
        eventlane_live: Callable[[str], bool] = lambda group: False,
        initial_delay_s: float = INITIAL_REBALANCE_DELAY_S,
        publish: Publish | None = None,
    ) -> None:
        self.offsets = offsets
        self.eventlane_live = eventlane_live
        self.initial_delay_s = initial_delay_s
        self.groups: dict[str, Group] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._publish = publish
        self._publisher: asyncio.Task[None] | None = None
        # group -> (what was last published, less its time; when): what needs writing
        self._published: dict[str, tuple[tuple[Any, ...], float]] = {}

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        if self._publish is not None and self._publisher is None:
            self._publisher = asyncio.get_running_loop().create_task(self._publish_loop())

    # -- membership --------------------------------------------------------------------
    async def join(self, req: Any, client_id: str) -> dict[str, Any]:
        self.start()
        if not req.group_id:
            return _join_error(errno(Errors.InvalidGroupIdError))
        if not MIN_SESSION_MS <= req.session_timeout_ms <= MAX_SESSION_MS:
            return _join_error(errno(Errors.InvalidSessionTimeoutError), req.member_id)
        names = {p.name for p in req.protocols or []}
        if not names or not req.protocol_type:
            # Kafka's answer to a member that names no protocol (nothing to agree on)
            return _join_error(errno(Errors.InconsistentGroupProtocolError))
        group = self.groups.setdefault(req.group_id, Group(req.group_id))
        if not group.members and await asyncio.to_thread(self.eventlane_live, req.group_id):
            return _join_error(errno(Errors.InconsistentGroupProtocolError))
        if (
            group.protocol_type is not None
            and group.members
            and req.protocol_type != group.protocol_type
        ):
            return _join_error(errno(Errors.InconsistentGroupProtocolError))
        others = [m for m in group.members.values() if m.member_id != req.member_id]
        if any(not names & {n for n, _ in m.protocols} for m in others):
            return _join_error(errno(Errors.InconsistentGroupProtocolError))
        instance = getattr(req, "group_instance_id", None)
        if not req.member_id and instance is None and (getattr(req, "API_VERSION", 0) or 0) >= 4:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            group.pending[member_id] = time.monotonic() + req.session_timeout_ms / 1000.0
            return _join_error(errno(Errors.MemberIdRequiredError), member_id)
        member = self._member_for(group, req, client_id, client_host.get())
        if member is None:
            return _join_error(errno(Errors.UnknownMemberIdError), req.member_id)
        member.protocols = [(p.name, bytes(p.metadata)) for p in req.protocols]
        member.session_s = req.session_timeout_ms / 1000.0
        rebalance_ms = getattr(req, "rebalance_timeout_ms", -1)
        member.rebalance_s = (rebalance_ms if rebalance_ms > 0 else req.session_timeout_ms) / 1000.0
        member.last_seen = time.monotonic()
        group.protocol_type = req.protocol_type
        loop = asyncio.get_running_loop()
        member.join = loop.create_future()
        group.joined.add(member.member_id)
        self._prepare_rebalance(
            group, "member joined" if req.member_id == "" else "member rejoined"
        )
        self._maybe_complete_join(group)
        try:
            return await member.join
        finally:
            member.join = None

    def _member_for(self, group: Group, req: Any, client_id: str, host: str) -> Member | None:
        instance = getattr(req, "group_instance_id", None)
        if req.member_id in group.pending:
            del group.pending[req.member_id]
            member = Member(req.member_id, instance, client_id, host)
            group.members[req.member_id] = member
            return member
        if req.member_id:
            return group.members.get(req.member_id)
        if instance is not None:
            for m in group.members.values():
                if m.instance_id == instance:
                    return m
        member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        member = Member(member_id, instance, client_id, host)
        group.members[member_id] = member
        return member

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state == "PreparingRebalance":
            return
        initial = group.state == "Empty"
        group.state = "PreparingRebalance"
        for m in group.members.values():
            if m.sync is not None and not m.sync.done():
                m.sync.set_result((errno(Errors.RebalanceInProgressError), b""))
        timeout = max((m.rebalance_s for m in group.members.values()), default=5.0)
        if initial:
            timeout = self.initial_delay_s
        loop = asyncio.get_running_loop()
        if group.timer is not None:
            group.timer.cancel()
        group.timer = loop.call_later(timeout, self._complete_join, group, True)
        log.info(
            "rebalance started", group=group.group_id, reason=reason, generation=group.generation
        )

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state != "PreparingRebalance":
            return
        if group.generation == 0 and group.timer is not None:
            return  # the initial delay: let more members arrive
        if set(group.members) <= group.joined:
            self._complete_join(group, False)

    def _complete_join(self, group: Group, timed_out: bool) -> None:
        if group.state != "PreparingRebalance":
            return
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        for member_id in [m for m in group.members if m not in group.joined]:
            log.info(
                "member removed: did not rejoin in time", group=group.group_id, member_id=member_id
            )
            del group.members[member_id]
        group.joined.clear()
        if not group.members:
            group.state, group.leader, group.protocol = "Empty", None, None
            group.generation += 1
            return
        group.generation += 1
        group.protocol = _choose_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = "CompletingRebalance"
        members = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id,
                "metadata": dict(m.protocols)[group.protocol],
            }
            for m in group.members.values()
        ]
        for m in group.members.values():
            if m.join is not None and not m.join.done():
                m.join.set_result(
                    {
                        "error_code": 0,
                        "generation_id": group.generation,
                        "protocol_type": group.protocol_type,
                        "protocol_name": group.protocol,
                        "leader": group.leader,
                        "member_id": m.member_id,
                        "members": members if m.member_id == group.leader else [],
                    }
                )
        log.info(
            "generation started",
            group=group.group_id,
            generation=group.generation,
            members=len(group.members),
            protocol=group.protocol,
            timed_out=timed_out,
        )

    async def sync(self, req: Any) -> tuple[int, bytes]:
        group = self.groups.get(req.group_id)
        member = None if group is None else group.members.get(req.member_id)
        if group is None or member is None:
            return errno(Errors.UnknownMemberIdError), b""
        if req.generation_id != group.generation:
            return errno(Errors.IllegalGenerationError), b""
        if group.state == "PreparingRebalance":
            return errno(Errors.RebalanceInProgressError), b""
        member.last_seen = time.monotonic()
        if member.member_id == group.leader and group.state == "CompletingRebalance":
            given = {a.member_id: bytes(a.assignment) for a in req.assignments}
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result((errno(Errors.NoError), m.assignment))
            group.state = "Stable"
            return errno(Errors.NoError), member.assignment
        if group.state == "Stable":
            return errno(Errors.NoError), member.assignment
        member.sync = asyncio.get_running_loop().create_future()
        try:
            return await member.sync
        finally:
            member.sync = None

    def heartbeat(self, req: Any) -> int:
        group = self.groups.get(req.group_id)
        member = None if group is None else group.members.get(req.member_id)
        if group is None or member is None:
            return errno(Errors.UnknownMemberIdError)
        if req.generation_id != group.generation:
            return errno(Errors.IllegalGenerationError)
        member.last_seen = time.monotonic()
        if group.state == "PreparingRebalance":
            return errno(Errors.RebalanceInProgressError)
        return errno(Errors.NoError)

    def leave(
        self, group_id: str, member_ids: list[tuple[str, str | None]]
    ) -> list[tuple[str, str | None, int]]:
        group = self.groups.get(group_id)
        out: list[tuple[str, str | None, int]] = []
        for member_id, instance in member_ids:
            member = None
            if group is not None:
                member = group.members.get(member_id) or next(
                    (
                        m
                        for m in group.members.values()
                        if instance is not None and m.instance_id == instance
                    ),
                    None,
                )
            if group is None or member is None:
                out.append((member_id, instance, errno(Errors.UnknownMemberIdError)))
                continue
            del group.members[member.member_id]
            group.joined.discard(member.member_id)
            out.append((member.member_id, instance, errno(Errors.NoError)))
            log.info("member left", group=group_id, member_id=member.member_id)
            self._after_removal(group, "member left")
        return out

    def _after_removal(self, group: Group, reason: str) -> None:
        if not group.members:
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            group.state, group.leader, group.protocol = "Empty", None, None
            group.generation += 1
            return
        self._prepare_rebalance(group, reason)
        self._maybe_complete_join(group)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member_id, expires in list(group.pending.items()):
                    if now > expires:  # never came back with its id
                        del group.pending[member_id]
                for m in list(group.members.values()):
                    waiting = m.join is not None or m.sync is not None
                    if not waiting and now - m.last_seen > m.session_s:
                        log.warning(
                            "member evicted: no heartbeat within the session timeout",
                            group=group.group_id,
                            member_id=m.member_id,
                            session_timeout_ms=int(m.session_s * 1000),
                        )
                        del group.members[m.member_id]
                        group.joined.discard(m.member_id)
                        self._after_removal(group, "member expired")

    # -- offsets -----------------------------------------------------------------------
    def check_commit(self, group_id: str, generation: int, member_id: str) -> int:
        """The error for an OffsetCommit, before anything is written (0: accept)."""
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:
            # a simple consumer (assign, no membership): only when no generation is live
            if group is not None and group.members:
                return errno(Errors.IllegalGenerationError)
            return errno(Errors.NoError)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return errno(Errors.UnknownMemberIdError)
        if generation != group.generation:
            return errno(Errors.IllegalGenerationError)
        if group.state == "CompletingRebalance":
            return errno(Errors.RebalanceInProgressError)
        member.last_seen = time.monotonic()
        return errno(Errors.NoError)

    def describe(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    # -- publication -------------------------------------------------------------------
    def _due(self, now: float) -> list[tuple[str, ClientGroup]]:
        """The snapshots to write now: groups that changed since their last publication,
        and groups with members whose lease needs renewing."""
        out = []
        for group in self.groups.values():
            key = _snapshot_key(group)
            last = self._published.get(group.group_id)
            if (
                last is not None
                and last[0] == key
                and (not group.members or now - last[1] < PUBLISH_EVERY_S)
            ):
                continue
            try:
                validate_group_id(group.group_id)
            except ConfigError:
                continue  # a name eventlane's groups cannot hold: Kafka's tools still show it
            self._published[group.group_id] = (key, now)
            out.append((group.group_id, _snapshot(group)))
        return out

    def _write(self, due: list[tuple[str, ClientGroup]]) -> None:
        assert self._publish is not None
        for group_id, snapshot in due:
            try:
                self._publish(group_id, snapshot)
            except Exception as exc:  # the next change or renewal tries again
                self._published.pop(group_id, None)
                log.warning("group membership not published", group=group_id, error=str(exc))

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_TICK_S)
            due = self._due(time.monotonic())
            if due:
                await asyncio.to_thread(self._write, due)

    def unpublish(self) -> None:
        """At a clean stop: publish every group without members (blocking)."""
        if self._publish is None:
            return
        for task in (self._publisher, self._reaper):
            if task is not None:
                task.cancel()
        for group in self.groups.values():
            group.members.clear()
            group.state = "Empty"
        self._write(self._due(time.monotonic()))


def _snapshot_key(group: Group) -> tuple[Any, ...]:
    return (
        group.state,
        group.generation,
        group.protocol,
        tuple((m.member_id, m.assignment) for m in group.members.values()),
    )


def _snapshot(group: Group) -> ClientGroup:
    return ClientGroup(
        state=group.state,
        generation=group.generation,
        protocol_type=group.protocol_type,
        protocol=group.protocol,
        leader=group.leader,
        published_ms=time.time_ns() // 1_000_000,
        lease_ms=PUBLISH_LEASE_MS,
        members={
            m.member_id: ClientMember(
                member_id=m.member_id,
                instance_id=m.instance_id,
                client_id=m.client_id,
                host=m.client_host,
                session_timeout_ms=int(m.session_s * 1000),
                assignment=_assigned(group.protocol_type, m.assignment),
            )
            for m in group.members.values()
        },
    )


def _assigned(protocol_type: str | None, assignment: bytes) -> list[TopicPartition]:
    """The partitions in a consumer-protocol assignment (none for other protocols or bytes
    that do not decode: the group's leader wrote them, the broker never reads them)."""
    if protocol_type != "consumer" or not assignment:
        return []
    try:
        decoded = ConsumerProtocolAssignment.decode(assignment)
        return sorted(
            {TopicPartition(t, int(p)) for t, ps in decoded.assigned_partitions for p in ps}
        )
    except Exception:
        return []


def _join_error(code: int, member_id: str = "") -> dict[str, Any]:
    return {
        "error_code": code,
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "member_id": member_id,
        "members": [],
    }


def _choose_protocol(group: Group) -> str:
    """The first protocol, in the leader's (or first member's) preference order, that every
    member supports (Kafka votes; with one client library per group the result is the same)."""
    members = list(group.members.values())
    common = set.intersection(*({n for n, _ in m.protocols} for m in members))
    first = group.members.get(group.leader or "") or members[0]
    for name, _ in first.protocols:
        if name in common:
            return name
    return first.protocols[0][0]
