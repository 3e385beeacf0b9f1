"""Group coordination on a JetStream cluster: membership and committed offsets in one
replicated KV bucket, changed only by compare-and-set (issue 13).

Keys of the bucket ``<ns>-groups`` (:class:`~eventlane.log.jetstream.kv.Kv`)::

    <g>.state                 the group state (GroupState JSON), its revision = version
    <g>.live.<token>          a member's last heartbeat (wall-clock ns of its host)
    <g>.off.<enc(topic)>.<p>  the committed offset of a partition (JSON)
    <g>.home                  where the group's read model lives (``host:path``), if pinned

where ``<g>`` is the group id encoded as one subject token (:func:`mapping.encode_name`:
group ids may contain ``.``), so ``*.state`` selects exactly the state keys.

Invariants:

* The state changes only by a compare-and-set on its revision: a process reads it from the
  leader, applies the change, and writes it back expecting that revision; if another process
  wrote in between, it re-reads and re-applies. So every member on every host agrees on one
  sequence of generations, with no lock and no shared file.
* A commit is an atomic batch of offset keys *fenced* by the state's revision: the server
  accepts it only if the state is still the one the commit's precondition (generation,
  ownership) was checked against. A zombie (an old generation, an evicted member) is
  rejected, as Kafka's coordinator rejects it.
* Every process follows the state keys through one ordered JetStream consumer (headers
  only), which delivers a write only once it is stored, with its revision. A handle's view
  is fresh iff its revision is at least the last one announced; otherwise it re-reads from
  the leader. (A core-NATS subscription would announce a write *before* the stream stores
  it: a re-read could then miss it and keep a stale view until the next change.) The
  heartbeat thread also re-reads the state every tick, so a lost announcement (a
  reconnect, a leader change) costs one tick, not a stuck rebalance.
* Heartbeats are wall-clock stamps (hosts are assumed NTP-synchronised; session timeouts are
  seconds). An evicted member's heartbeat key is deleted, so its next beat fails and it
  knows it was fenced.
* An outage of the bucket (its leader died, an election runs) stalls every member's
  heartbeats alike. A process whose own beats stalled for half a session evicts nobody for
  a whole session afterwards (Kafka's coordinator restarts every session timer when it
  fails over), so an election does not evict the whole group.
* A fenced write whose answer was lost (the leader died after storing it, or before) is
  validated and sent again: the same values under a fresh fence, so a repeat is harmless.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import orjson
from nats.js.api import DeliverPolicy

from eventlane.consumer.coordinator import GroupCoordinator, validate_group_id
from eventlane.consumer.membership import GroupState, Member
from eventlane.consumer.offsets import CommittedOffset, OffsetAndMetadata
from eventlane.errors import ConcurrencyError, ConfigError, OutcomeUnknownError
from eventlane.log.jetstream import mapping
from eventlane.log.jetstream.kv import Kv
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.record import TopicPartition
from eventlane.observability import get_logger

__all__ = ["KvCoordinator", "KvLiveness", "KvOffsets", "JetStreamCoordination", "group_key"]

log = get_logger("eventlane.consumer.group")
T = TypeVar("T")

FRESH_READS = 50  # leader reads (25 ms apart) to see an announced revision before giving up


def group_key(group: str, suffix: str) -> str:
    """The bucket key ``<enc(group)>.<suffix>``."""
    return f"{mapping.encode_name(group)}.{suffix}"


class KvLiveness:
    """Heartbeats in the bucket, with the interface the coordinator uses of ``LiveFile``
    (``slot`` is ignored; a member is its ``token``)."""

    def __init__(self, kv: Kv, group: str) -> None:
        self.kv = kv
        self.group = group
        self._revs: dict[int, int] = {}

    def _key(self, token: int) -> str:
        return group_key(self.group, f"live.{token}")

    def reset_if_new_boot(self) -> bool:
        return False

    def claim(self, slot: int, token: int, now_ns: int) -> None:
        self._revs[token] = self.kv.put(self._key(token), b"%d" % time.time_ns())

    def beat(self, slot: int, token: int, now_ns: int) -> bool:
        """Stamp the heartbeat; False if the member was evicted (its key deleted): then
        nothing is written, so an evicted member never looks alive again."""
        rev = self._revs.get(token)
        if rev is None:
            raw, rev = self.kv.get(self._key(token))
            if raw is None:
                return False
        try:
            self._revs[token] = self.kv.put(self._key(token), b"%d" % time.time_ns(), expect=rev)
        except ConcurrencyError:
            self._revs.pop(token, None)
            return False
        except OutcomeUnknownError:  # our stamp may or may not be there: the key says
            raw, current = self.kv.get(self._key(token))
            if raw is None:
                self._revs.pop(token, None)
                return False
            self._revs[token] = current
        return True

    def polled(self, slot: int, token: int, now_ns: int) -> None:
        """Poll times stay local (max.poll.interval is enforced by the member itself)."""

    def age_ns(self, slot: int, token: int, now_ns: int) -> int | None:
        raw, _ = self.kv.get(self._key(token))
        if raw is None:
            return None
        return max(time.time_ns() - int(raw), 0)

    def free(self, slot: int, token: int) -> None:
        self.kv.delete(self._key(token))
        self._revs.pop(token, None)

    def close(self) -> None:
        self._revs.clear()


class KvCoordinator(GroupCoordinator):
    """:class:`GroupCoordinator`'s protocol with its state in the bucket (compare-and-set
    instead of a file lock). Join, leave, release and eviction are the same code.

    The view (``current()``) is fresh iff its revision is at least the highest revision
    announced by the change feed (or seen by a read); ``version()`` is that highest
    revision, so a consumer re-syncs exactly when the state moved.
    """

    def __init__(
        self,
        log_: JetStreamLog,
        kv: Kv,
        group: str,
        *,
        wake: Callable[[], None] | None = None,
        changed: Callable[[str, int], None] | None = None,
        closed: Callable[[KvCoordinator], None] | None = None,
    ) -> None:
        self.changed = changed
        self.closed = closed
        self.log = log_
        self.group = validate_group_id(group)
        self.wake = wake
        self.kv = kv
        self.key = group_key(group, "state")
        self._live = KvLiveness(kv, group)  # type: ignore[assignment]
        self._mutex = threading.RLock()
        self._cache: GroupState | None = None
        self._cache_lock = threading.Lock()
        self._closed = False
        self._rev = -1  # revision of the cached view (-1: none yet)
        self._announced = 0  # highest revision known to exist
        self._last_beat = 0.0  # monotonic time of this process's last beat (0: none yet)
        self._joining = False
        self._healthy_since = -1e9  # beating without a gap since (a handle that never beat:
        # always; the CLI's handles judge members at once)

    def on_change(self, rev: int) -> None:
        """The state reached revision ``rev`` (called on the log's event loop thread)."""
        with self._cache_lock:
            if rev <= self._announced:
                return
            self._announced = rev
        if self.wake is not None:
            self.wake()

    def _read(self) -> tuple[GroupState, int]:
        raw, rev = self.kv.get(self.key)
        state = GroupState(self.group) if raw is None else GroupState.from_json(raw)
        return state, rev

    def install(self, state: GroupState, rev: int) -> None:
        """Make ``state`` (read at ``rev``) this process's view unless it has a newer one."""
        with self._cache_lock:
            if rev >= self._rev:
                self._rev = rev
                self._cache = state
            self._announced = max(self._announced, rev)

    def _fresh(self) -> GroupState | None:
        with self._cache_lock:
            if self._cache is not None and self._rev >= self._announced:
                return self._cache
            return None

    def current(self) -> GroupState:
        """The state at the highest announced revision (read from the leader if the view
        is older). The returned object is shared: treat it as read-only."""
        for _ in range(FRESH_READS):
            fresh = self._fresh()
            if fresh is not None:
                return fresh
            state, rev = self._read()
            self.install(state, rev)
            if self._fresh() is None:
                time.sleep(0.025)  # announced but not readable yet (a leader change)
        with self._cache_lock:
            assert self._cache is not None
            return self._cache

    def refresh(self) -> bool:
        """Re-read the state from the leader (the heartbeat's safety net against a lost
        announcement); True if it had moved."""
        state, rev = self._read()
        with self._cache_lock:
            moved = rev > self._announced
        self.install(state, rev)
        if moved and self.wake is not None:
            self.wake()
        return moved

    def version(self) -> int:
        with self._cache_lock:
            return max(self._rev, self._announced)

    @contextlib.contextmanager
    def locked(self) -> Iterator[GroupState]:
        yield self._read()[0]

    def mutate(self, change: Callable[[GroupState], T]) -> T:
        """Apply ``change`` by compare-and-set, re-reading and re-applying on a conflict."""
        with self._mutex:
            for _ in range(1000):
                state, rev = self._read()
                before = state.to_json()
                result = change(state)
                if state.to_json() == before:
                    self.install(state, rev)
                    return result
                state.version += 1
                state.updated_ms = time.time_ns() // 1_000_000
                try:
                    new_rev = self.kv.put(self.key, state.to_json(), expect=rev)
                except ConcurrencyError:
                    continue
                self.install(state, new_rev)
                if self.changed is not None:  # other handles in this process (no echo)
                    self.changed(self.group, new_rev)
                if self.wake is not None:
                    self.wake()
                return result
        raise ConcurrencyError(f"group {self.group!r}: state kept changing", expected=0, actual=0)

    def try_mutate(self, change: Callable[[GroupState], T]) -> tuple[bool, T | None]:
        return True, self.mutate(change)

    def beat(self, member: Member) -> bool:
        """Stamp ``member``'s heartbeat and re-read the state. A beat that comes more than
        half a session after this process's previous one ends an outage (a KV leader
        election, a frozen process): this process evicts nobody for a session from then on,
        as Kafka's coordinator restarts every session timer when it fails over; the other
        members' stamps were stuck behind the same outage."""
        alive = super().beat(member)
        now = time.monotonic()
        gap = now - self._last_beat
        if self._last_beat and gap > member.session_timeout_ms / 2000:
            log.info(
                "heartbeats resumed after a gap; no eviction for a session",
                group=self.group,
                gap_s=round(gap, 2),
            )
            self._healthy_since = now
        self._last_beat = now
        if alive:
            self.refresh()
        return alive

    def join(self, **kwargs: Any) -> Member:
        """Join without evicting anyone (the embedded coordinator evicts expired members
        first): a process that just joined cannot tell stale stamps from a bucket outage
        it did not see, and the members' heartbeat threads evict the dead soon enough."""
        self._joining = True
        try:
            member = super().join(**kwargs)
        finally:
            self._joining = False
        self._last_beat = time.monotonic()  # a join that waited out an outage is a beat
        return member

    def expired(self, state: GroupState, now_ns: int | None = None) -> list[str]:
        """Members whose stamp is older than their session timeout, judged only by a process
        whose own heartbeats are current (its last beat less than half a session ago: else
        the bucket, or this process, was stalled, and every stamp is as stale as its own)
        and have been for a whole session (see :meth:`beat`)."""
        if self._joining:
            return []
        now = time.monotonic()
        healthy_ms = (now - self._healthy_since) * 1000
        silent_ms = (now - self._last_beat) * 1000 if self._last_beat else 0.0
        return [
            mid
            for mid in super().expired(state, now_ns)
            if healthy_ms > state.members[mid].session_timeout_ms
            and silent_ms < state.members[mid].session_timeout_ms / 2
        ]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.closed is not None:
                self.closed(self)


class KvOffsets:
    """Committed offsets in the bucket, fenced by the group state's revision."""

    def __init__(self, kv: Kv, coordination: JetStreamCoordination) -> None:
        self.kv = kv
        self.coordination = coordination

    @staticmethod
    def _key(group: str, tp: TopicPartition) -> str:
        return group_key(group, f"off.{mapping.encode_name(tp.topic)}.{tp.partition}")

    def exists(self) -> bool:
        return True

    def committed(self, group: str, tp: TopicPartition) -> CommittedOffset | None:
        raw, rev = self.kv.get(self._key(group, tp))
        return None if raw is None else _committed(raw, rev)

    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        out = {}
        for key in self.kv.list(group_key(group, "off.")):
            _, _, enc, p = key.split(".")
            tp = TopicPartition(mapping.decode_name(enc), int(p))
            found = self.committed(group, tp)
            if found is not None:
                out[tp] = found
        return out

    def groups(self) -> set[str]:
        by_group: dict[str, list[str]] = {}
        for key in self.kv.list():
            if ".off." in key:
                by_group.setdefault(key.split(".")[0], []).append(key)
        # a deleted key stays listed (its delete marker): a group counts if one key is live
        return {
            mapping.decode_name(g)
            for g, keys in by_group.items()
            if any(self.kv.get(k)[0] is not None for k in keys)
        }

    def history(self, group: str) -> Iterator[tuple[int, TopicPartition, int | None]]:
        """Only the latest commit per partition is kept (a KV): yields those."""
        for tp, c in sorted(self.group_offsets(group).items()):
            yield c.log_offset, tp, c.offset

    def _fenced(
        self, group: str, precondition: Callable[[], None] | None, write: Callable[[int], T]
    ) -> T:
        """Check ``precondition`` against the state read from the leader, then ``write(rev)``
        fenced by that state's revision ``rev``; re-check if the state moved meanwhile. A
        write whose outcome is unknown (the leader died before answering) is checked and
        written again: the same values, fenced again, so a repeat is harmless."""
        deadline = time.monotonic() + self.kv.log.retry_s
        for _ in range(1000):
            rev = self.coordination.refresh(group)
            if precondition is not None:
                precondition()
            try:
                return write(rev)
            except ConcurrencyError:
                continue
            except OutcomeUnknownError:
                if time.monotonic() > deadline:
                    raise
                log.info("fenced write outcome unknown; writing again", group=group)
                time.sleep(0.2)
        raise ConcurrencyError(f"group {group!r}: state kept changing", expected=0, actual=0)

    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        generation: int,
        member_id: str,
        precondition: Callable[[], None] | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> int:
        """Write the offsets (one atomic batch) fenced by the revision of the state that
        ``precondition`` (ownership, generation) was checked against."""
        if not offsets:
            return self.coordination.refresh(group)
        stamp = now_ms() if now_ms is not None else time.time_ns() // 1_000_000
        values = {
            self._key(group, tp): orjson.dumps(
                {
                    "offset": om.offset,
                    "metadata": om.metadata,
                    "generation": generation,
                    "member_id": member_id,
                    "commit_ms": stamp,
                }
            )
            for tp, om in offsets.items()
        }
        fence = group_key(group, "state")
        return self._fenced(
            group, precondition, lambda rev: self.kv.put_many(values, fence=(fence, rev))
        )

    def delete_group(self, group: str, *, precondition: Callable[[], None] | None = None) -> int:
        """Delete every committed offset of ``group`` at once (delete markers in one atomic
        batch), fenced like a commit: ``precondition`` (no live member) is checked against
        the state whose revision the batch expects. Returns how many were deleted."""
        keys = [k for k in self.kv.list(group_key(group, "off.")) if self.kv.get(k)[0]]
        if not keys:
            if precondition is not None:
                precondition()
            return 0
        msgs = [(self.kv.subject(k), b"", {"KV-Operation": "DEL"}) for k in keys]
        state = self.kv.subject(group_key(group, "state"))
        js = self.kv.log

        def write(rev: int) -> int:
            fence = {
                "Nats-Expected-Last-Subject-Sequence": str(rev),
                "Nats-Expected-Last-Subject-Sequence-Subject": state,
            }
            # a refused fence is raised as ConcurrencyError (eventlane.log.jetstream.errors)
            batch = functools.partial(js.batch, msgs, fence)
            return js.run(js.retry(batch, what="kv delete", write=True), write=True)

        self._fenced(group, precondition, write)
        return len(keys)

    def barrier(self, group: str) -> None:
        """Commits are acknowledged only once ordered: nothing is in flight to wait for."""


def _committed(raw: bytes, rev: int) -> CommittedOffset:
    body = orjson.loads(raw)
    return CommittedOffset(
        int(body["offset"]),
        str(body.get("metadata", "")),
        int(body["generation"]),
        str(body["member_id"]),
        int(body["commit_ms"]),
        rev,
    )


class JetStreamCoordination:
    """The :class:`~eventlane.consumer.coordination.GroupCoordination` of a JetStream
    engine: one bucket ``<namespace>-groups`` for every group's state, heartbeats and
    offsets, and one change feed (an ordered consumer on ``*.state``) per process."""

    spans_hosts = True

    def __init__(self, log_: JetStreamLog) -> None:
        self.log = log_
        self.kv = Kv(log_, f"{log_.namespace}-groups")
        self._offsets = KvOffsets(self.kv, self)
        self._coordinators: dict[str, weakref.WeakSet[KvCoordinator]] = {}
        self._lock = threading.Lock()
        self._feed: Any = None

    def _follow(self) -> None:
        """Start the change feed (once): every stored state write, with its revision."""
        with self._lock:
            if self._feed is not None:
                return
            self._feed = True

        async def on_msg(msg: Any) -> None:
            token = str(msg.subject).split(".")[2]
            self._announce(mapping.decode_name(token), int(msg.metadata.sequence.stream))

        async def go() -> Any:
            return await self.log.js.subscribe(
                self.kv.subject("*.state"),
                stream=self.kv.stream,
                cb=on_msg,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
                headers_only=True,
                idle_heartbeat=2.0,
            )

        self._feed = self.log.run(self.log.retry(go, what="group change feed"))

    def _closed(self, coordinator: KvCoordinator) -> None:
        """A handle closed: stop the feed with the last one (no task left on the loop)."""
        with self._lock:
            self._coordinators.get(coordinator.group, weakref.WeakSet()).discard(coordinator)
            if any(self._coordinators.values()):
                return
        self.close()

    def close(self) -> None:
        """Stop the change feed (the bucket and the log stay open)."""
        with self._lock:
            feed, self._feed = self._feed, None
        if feed is not None and feed is not True:
            with contextlib.suppress(Exception):
                self.log.run(feed.unsubscribe())

    def _announce(self, group: str, rev: int) -> None:
        with self._lock:
            members = list(self._coordinators.get(group, ()))
        for coordinator in members:
            coordinator.on_change(rev)

    @property
    def offsets(self) -> KvOffsets:
        return self._offsets

    def coordinator(self, group: str, *, wake: Callable[[], None] | None = None) -> KvCoordinator:
        self._follow()
        coordinator = KvCoordinator(
            self.log, self.kv, group, wake=wake, changed=self._announce, closed=self._closed
        )
        with self._lock:
            self._coordinators.setdefault(group, weakref.WeakSet()).add(coordinator)
        return coordinator

    def refresh(self, group: str) -> int:
        """Read ``group``'s state from the leader into every local handle; its revision."""
        raw, rev = self.kv.get(group_key(group, "state"))
        state = GroupState(group) if raw is None else GroupState.from_json(raw)
        with self._lock:
            members = list(self._coordinators.get(group, ()))
        for coordinator in members:
            coordinator.install(state.copy(), rev)
        return rev

    def group_names(self) -> set[str]:
        return {
            mapping.decode_name(k[: -len(".state")])
            for k in self.kv.list()
            if k.endswith(".state") and self.kv.get(k)[0] is not None
        }

    def has_state(self, group: str) -> bool:
        return self.kv.get(group_key(group, "state"))[0] is not None

    def claim_home(self, group: str, home: str) -> None:
        """Pin ``group`` to ``home`` by compare-and-set of ``<g>.home`` (first claim wins)."""
        key = group_key(group, "home")
        for _ in range(100):
            raw, rev = self.kv.get(key)
            if raw is not None:
                if raw.decode() == home:
                    return
                raise ConfigError(
                    f"group {group!r} keeps its read model at {raw.decode()}; this worker"
                    f" would build a second, partial one at {home}. A projection whose read"
                    " model is a SQLite file runs its workers on the host that holds the file"
                    f" (policies and plain consumers may run anywhere); to move it, stop its"
                    f" workers and run `eventlane groups delete {group}` first"
                )
            try:
                self.kv.put(key, home.encode(), expect=rev)
            except ConcurrencyError:
                continue
            log.info("group pinned to a home", group=group, home=home)
            return
        raise ConcurrencyError(f"group {group!r}: home kept changing", expected=0, actual=0)

    def delete_state(self, group: str) -> None:
        self.kv.delete(group_key(group, "home"))
        self.kv.delete(group_key(group, "state"))
        for key in self.kv.list(group_key(group, "live.")):
            self.kv.delete(key)
