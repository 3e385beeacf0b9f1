"""The group consumer: members of a named group share the partitions of their topics.

Shaped like kafka-python's ``KafkaConsumer`` with a ``group_id``. Each partition of the
subscribed topics is owned by at most one live member of the group at a time; members beyond
the partition count stay idle; when members join, leave or die the partitions are rebalanced
(see :mod:`.membership` for the protocol and :mod:`.coordinator` for the shared files).

What the application sees:

* ``poll()`` joins the group on first use, runs the rebalance listener (``on_revoked`` before
  a partition is given up, ``on_assigned`` once one is received, ``on_lost`` when this
  member was evicted and its partitions already moved), and returns records of owned
  partitions only. All callbacks run inside ``poll()`` (or ``close()``), in the caller's
  thread, so a callback never races the application's processing.
* Positions start from the group's committed offset, else per ``auto_offset_reset``. A
  listener may instead ``seek`` to a position stored elsewhere (e.g. next to a read model)
  from ``on_assigned``.
* ``commit()`` stores the positions (the offset of the next record to read) in
  ``__consumer_offsets``; a commit by a member that is no longer in the group, for a
  partition it does not own, or from before it (re)gained the partition raises
  :class:`~eventlane.errors.CommitFailedError` (fencing: a paused zombie can never overwrite
  the progress of the partition's new owner).
* A background heartbeat thread keeps the membership alive every ``heartbeat_interval_ms``
  (at most ``session_timeout_ms / 10``), evicts members whose heartbeats stopped for their
  ``session_timeout_ms``, notices topics that gained partitions, and leaves the group if the
  application has not called ``poll()`` for ``max_poll_interval_ms``.

Not thread-safe (one consumer per thread), except :meth:`GroupConsumer.owns`, and the
``generation`` / ``member_id`` properties.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from eventlane.consumer.assignors import get_assignor
from eventlane.consumer.coordination import (
    Coordinator,
    FileCoordination,
    GroupCoordination,
    OffsetStorage,
    coordination_for,
    native_consumer,
)
from eventlane.consumer.coordinator import validate_group_id
from eventlane.consumer.free import OFFSET_RESETS, Consumer
from eventlane.consumer.listener import CallbackListener, Partitions, RebalanceListener
from eventlane.consumer.membership import Member, needs_release, to_release, validate_commit
from eventlane.consumer.offsets import CommittedOffset, OffsetAndMetadata, OffsetStore
from eventlane.errors import CommitFailedError, ConfigError, ConsumerError
from eventlane.log.port import Log
from eventlane.log.record import Record, TopicPartition
from eventlane.observability import get_logger

__all__ = ["GroupConsumer", "RebalanceListener"]

log = get_logger("eventlane.consumer.group")

CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], Exception | None], None]


def _positive_ms(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer (milliseconds), got {value!r}")
    return value


class GroupConsumer:
    """A member of consumer group ``group_id`` subscribed to ``topics``.

    Typical use (``docs/consumer-groups.md`` has runnable examples)::

        consumer = GroupConsumer(store, group_id="billing", topics=["orders"],
                                 enable_auto_commit=False, auto_offset_reset="earliest")
        while running:
            for record in consumer.poll(timeout=1.0):
                handle(record)
            consumer.commit()  # at-least-once: commit after processing
        consumer.close()       # leave: the partitions move to the others at once

    ``coordination`` is the engine's group coordination (``open_engine(...).groups``);
    by default the one that goes with ``log_`` (:func:`~.coordination.coordination_for`).

    On a log whose broker runs groups itself (Kafka) the instance is that engine's member
    class (:func:`~.coordination.native_consumer`: :class:`~.kafka.KafkaGroupConsumer`),
    with this interface and contract.
    """

    def __new__(cls, log_: Log, **kwargs: Any) -> GroupConsumer:
        if cls is GroupConsumer:
            native = native_consumer(log_)
            if native is not None and issubclass(native, GroupConsumer):
                return super().__new__(native)
        return super().__new__(cls)

    def __init__(
        self,
        log_: Log,
        *,
        group_id: str,
        topics: Iterable[str] = (),
        group_instance_id: str | None = None,
        client_id: str = "eventlane",
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        auto_offset_reset: str = "latest",
        assignor: str = "cooperative-sticky",
        listener: RebalanceListener | None = None,
        on_assigned: Callable[[Partitions], None] | None = None,
        on_revoked: Callable[[Partitions], None] | None = None,
        on_lost: Callable[[Partitions], None] | None = None,
        max_poll_records: int = 500,
        fetch_max_bytes: int = 1 << 20,
        offset_store: OffsetStore | None = None,
        coordination: GroupCoordination | None = None,
    ) -> None:
        self.group_id = validate_group_id(group_id)
        if group_instance_id is not None:
            validate_group_id(group_instance_id, "group instance id")
        self.session_timeout_ms = _positive_ms("session_timeout_ms", session_timeout_ms)
        self.heartbeat_interval_ms = _positive_ms("heartbeat_interval_ms", heartbeat_interval_ms)
        self.max_poll_interval_ms = _positive_ms("max_poll_interval_ms", max_poll_interval_ms)
        self.auto_commit_interval_ms = _positive_ms(
            "auto_commit_interval_ms", auto_commit_interval_ms
        )
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ConfigError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be lower than"
                f" session_timeout_ms ({session_timeout_ms})"
            )
        if auto_offset_reset not in OFFSET_RESETS:
            raise ConfigError(
                f"auto_offset_reset must be one of {', '.join(OFFSET_RESETS)},"
                f" got {auto_offset_reset!r}"
            )
        get_assignor(assignor)
        if listener is not None and (on_assigned or on_revoked or on_lost):
            raise ConfigError("pass either listener= or on_assigned/on_revoked/on_lost, not both")
        self.log = log_
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.enable_auto_commit = enable_auto_commit
        self.assignor = assignor
        self._listener = listener or CallbackListener(on_assigned, on_revoked, on_lost)
        self._topics: tuple[str, ...] = tuple(sorted(set(topics)))
        self._fetcher = Consumer(
            log_,
            auto_offset_reset=auto_offset_reset,
            max_poll_records=max_poll_records,
            fetch_max_bytes=fetch_max_bytes,
        )
        if coordination is None:
            coordination = (
                coordination_for(log_)
                if offset_store is None
                else FileCoordination(log_, offset_store)
            )
        elif offset_store is not None:
            raise ConfigError("pass coordination= or offset_store=, not both")
        self._offsets: OffsetStorage = coordination.offsets
        self._coord: Coordinator = coordination.coordinator(self.group_id, wake=log_.wake)
        self._member: Member | None = None
        self._owned: set[TopicPartition] = set()
        self._unpositioned: set[TopicPartition] = set()
        self._generation = -1
        self._seen_version = -1
        self._fenced: str | None = None
        self._closed = False
        self._last_committed: dict[TopicPartition, int] = {}
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000
        self._last_poll_ns = time.monotonic_ns()
        self._tick_s = min(heartbeat_interval_ms, session_timeout_ms / 10, 1000) / 1000
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._log = log.bind(group=self.group_id)

    # ------------------------------------------------------------------ properties
    @property
    def member_id(self) -> str | None:
        """This member's id in the current membership (a new one after every rejoin)."""
        member = self._member
        return None if member is None else member.member_id

    @property
    def generation(self) -> int:
        """The group generation this member last synchronised with (-1 before joining).

        Generations only grow, and a partition's next owner always holds it under a higher
        generation than its previous owner did: store it with output as a fencing token.
        """
        return self._generation

    def subscription(self) -> set[str]:
        return set(self._topics)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns (as of its last ``poll``)."""
        return set(self._owned)

    def owns(self, tp: TopicPartition | tuple[str, int]) -> bool:
        """Whether this member still owns ``tp`` right now. Cheap (one memory read) unless
        the group changed since the last check. Safe from any thread."""
        tp = TopicPartition(*tp)
        member = self._member
        if member is None or tp not in self._owned:
            return False
        if self._coord.version() == self._seen_version:
            return True
        me = self._coord.current().members.get(member.member_id)
        return me is not None and tp in me.owned

    # ------------------------------------------------------------------ subscription
    def subscribe(self, topics: Iterable[str], listener: RebalanceListener | None = None) -> None:
        """Subscribe to ``topics`` (replacing the previous subscription). A member whose
        subscription changes leaves and rejoins at its next ``poll``."""
        self._check_open()
        wanted = tuple(sorted(set(topics)))
        if listener is not None:
            self._listener = listener
        if wanted != self._topics and self._member is not None:
            self._leave("subscription changed")
        self._topics = wanted

    def unsubscribe(self) -> None:
        self._check_open()
        if self._member is not None:
            self._leave("unsubscribe")
        self._topics = ()

    # ------------------------------------------------------------------ polling
    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> list[Record]:
        """Records from owned partitions, waiting up to ``timeout`` seconds for some.

        Joins the group on first use and runs the rebalance listener as needed. Returns as
        soon as records are available, else an empty list once ``timeout`` has passed; a
        rebalance wakes it (through the data directory's futex) but does not end the wait.
        """
        self._check_open()
        if not self._topics:
            raise ConfigError("poll() before subscribe(): no topics to consume")
        self._touch()
        deadline = time.monotonic() + timeout
        try:
            self._maybe_auto_commit()
            while True:
                seen = self.log.wait_seq()
                self._sync()
                self._position_new()
                records = self._fetcher.poll(0.0, max_records) if self._owned else []
                if records:
                    return records
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return records
                self.log.wait(seen, min(remaining, self._tick_s))
        finally:
            self._touch()

    def _touch(self) -> None:
        self._last_poll_ns = time.monotonic_ns()
        member = self._member
        if member is not None:
            self._coord.polled(member)

    def _join(self) -> None:
        member = self._coord.join(
            topics=self._topics,
            assignor=self.assignor,
            session_timeout_ms=self.session_timeout_ms,
            instance_id=self.group_instance_id,
            client_id=self.client_id,
        )
        self._member = member
        self._seen_version = -1
        self._log = log.bind(group=self.group_id, member_id=member.member_id)
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(
                target=self._heartbeat_loop,
                name=f"eventlane-heartbeat-{self.group_id}",
                daemon=True,
            )
            self._heartbeat.start()

    def _sync(self) -> None:
        """Bring local ownership in line with the group state, running the listener."""
        if self._fenced is not None:
            raise ConsumerError(self._fenced)
        if self._member is None:
            self._join()
        error: Exception | None = None
        while True:
            member = self._member
            assert member is not None
            version = self._coord.version()
            if version == self._seen_version:
                break
            state = self._coord.current()
            self._seen_version = version
            me = state.members.get(member.member_id)
            if me is None:
                other = (
                    state.member_by_instance(self.group_instance_id)
                    if self.group_instance_id is not None
                    else None
                )
                error = self._lose_all() or error
                self._member = None
                if other is not None:
                    self._fenced = (
                        f"group {self.group_id!r} instance id {self.group_instance_id!r} was"
                        f" taken over by member {other.member_id}; member {member.member_id}"
                        " is fenced and cannot rejoin"
                    )
                    self._log.error(
                        "fenced by a newer instance with the same instance id",
                        instance_id=self.group_instance_id,
                    )
                    raise ConsumerError(self._fenced)
                self._log.warning(
                    "no longer a member (evicted or left); rejoining", generation=state.generation
                )
                self._join()
                continue
            self._generation = state.generation
            if needs_release(state, me.member_id):
                giving_up = to_release(state, me.member_id)
                mine = sorted(giving_up & self._owned)
                if mine:
                    if self.enable_auto_commit:
                        self._auto_commit(mine)
                    error = self._call(self._listener.on_partitions_revoked, mine) or error
                    self._log.info(
                        "partitions revoked",
                        generation=state.generation,
                        partitions=[f"{tp.topic}-{tp.partition}" for tp in mine],
                    )
                self._owned -= giving_up
                self._unpositioned -= giving_up
                self._fetcher.assign(sorted(self._owned))
                self._drain_async()
                self._coord.release(me.member_id, giving_up)
                continue
            new = sorted(set(me.owned) - self._owned)
            gone = sorted(self._owned - set(me.owned))
            if gone:  # taken without a release: only possible after an admin change
                self._owned -= set(gone)
                self._fetcher.assign(sorted(self._owned))
                error = self._call(self._listener.on_partitions_lost, gone) or error
            if new:
                self._owned |= set(new)
                self._unpositioned |= set(new)
                self._fetcher.assign(sorted(self._owned))
                self._log.info(
                    "partitions assigned",
                    generation=state.generation,
                    partitions=[f"{tp.topic}-{tp.partition}" for tp in new],
                )
                error = self._call(self._listener.on_partitions_assigned, new) or error
        if error is not None:
            raise error

    def _lose_all(self) -> Exception | None:
        lost = sorted(self._owned)
        self._owned.clear()
        self._unpositioned.clear()
        self._fetcher.assign([])
        self._drain_async(quiet=True)
        if not lost:
            return None
        self._log.warning(
            "partitions lost", partitions=[f"{tp.topic}-{tp.partition}" for tp in lost]
        )
        return self._call(self._listener.on_partitions_lost, lost)

    def _call(
        self, callback: Callable[[Partitions], None], partitions: Partitions
    ) -> Exception | None:
        try:
            callback(partitions)
        except Exception as exc:
            self._log.exception("rebalance listener failed", callback=callback.__name__)
            return exc
        return None

    def _position_new(self) -> None:
        """Give newly owned partitions their committed offsets (unless a listener seeked)."""
        if not self._unpositioned:
            return
        self._offsets.barrier(self.group_id)  # see every commit of the previous owner
        for tp in sorted(self._unpositioned):
            entry = self._offsets.committed(self.group_id, tp)
            if entry is not None:
                self._fetcher.seek(tp, entry.offset)
                self._last_committed[tp] = entry.offset
        self._unpositioned.clear()

    # ------------------------------------------------------------------ positions
    def _check_owned(self, tp: TopicPartition | tuple[str, int]) -> TopicPartition:
        tp = TopicPartition(*tp)
        if tp not in self._owned:
            raise ConfigError(
                f"partition is not assigned to this member of group {self.group_id!r}",
                topic=tp.topic,
                partition=tp.partition,
            )
        return tp

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Read ``tp`` from ``offset`` next (e.g. a position stored with a read model)."""
        tp = self._check_owned(tp)
        self._fetcher.seek(tp, offset)
        self._unpositioned.discard(tp)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching owned ``partitions`` (they stay owned) until :meth:`resume`, or
        until they are revoked (a partition assigned again starts unpaused)."""
        for tp in partitions:
            self._fetcher.pause(self._check_owned(tp))

    def resume(self, *partitions: TopicPartition) -> None:
        self._fetcher.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return self._fetcher.paused()

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(sorted(self._owned)):
            self._check_owned(tp)
            self._fetcher.seek_to_beginning(TopicPartition(*tp))
            self._unpositioned.discard(TopicPartition(*tp))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(sorted(self._owned)):
            self._check_owned(tp)
            self._fetcher.seek_to_end(TopicPartition(*tp))
            self._unpositioned.discard(TopicPartition(*tp))

    def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` returns for owned partition ``tp``."""
        tp = self._check_owned(tp)
        if tp in self._unpositioned:
            self._position_new()
        return self._fetcher.position(tp)

    def committed(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """The group's committed offset for ``tp`` (any partition), or ``None``."""
        entry = self.committed_entry(tp)
        return None if entry is None else entry.offset

    def committed_entry(self, tp: TopicPartition | tuple[str, int]) -> CommittedOffset | None:
        """The group's latest commit for ``tp`` with its metadata, generation and member."""
        return self._offsets.committed(self.group_id, TopicPartition(*tp))

    # ------------------------------------------------------------------ commits
    def _current_positions(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        out = {}
        for tp in sorted(self._owned if partitions is None else partitions):
            if tp in self._owned and tp not in self._unpositioned:
                out[tp] = OffsetAndMetadata(self._fetcher.position(tp))
        return out

    def _normalize(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        if offsets is None:
            return self._current_positions()
        out = {}
        for tp, value in offsets.items():
            om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
            out[TopicPartition(*tp)] = om
        return out

    def _commit_now(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        member: Member | None,
        generation: int,
    ) -> None:
        if not offsets:
            return
        if member is None:
            first = min(offsets)
            raise CommitFailedError(
                f"commit rejected: not a member of group {self.group_id!r} (not joined yet,"
                " evicted, or closed)",
                topic=first.topic,
                partition=first.partition,
            )

        def check() -> None:
            validate_commit(
                self._coord.current(), member.member_id, self.group_instance_id, generation, offsets
            )

        self._offsets.commit(
            self.group_id,
            offsets,
            generation=generation,
            member_id=member.member_id,
            precondition=check,
        )
        for tp, om in offsets.items():
            self._last_committed[tp] = om.offset

    def commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
    ) -> None:
        """Commit ``offsets`` (default: the current positions of all owned partitions) and
        return once durable. Raises :class:`~eventlane.errors.CommitFailedError` if this
        member may not commit them (see :func:`~.membership.validate_commit`)."""
        self._check_open()
        self._commit_now(self._normalize(offsets), self._member, self._generation)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        callback: CommitCallback | None = None,
    ) -> Future[None]:
        """Commit in the background; commits complete in call order. ``callback(offsets,
        error_or_None)`` runs in the background thread. The returned future fails with the
        same errors as :meth:`commit`."""
        self._check_open()
        normalized = self._normalize(offsets)
        member, generation = self._member, self._generation

        def run() -> None:
            error: Exception | None = None
            try:
                self._commit_now(normalized, member, generation)
            except Exception as exc:
                error = exc
            if callback is not None:
                try:
                    callback(normalized, error)
                except Exception:
                    self._log.exception("commit callback failed")
            if error is not None:
                raise error

        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="eventlane-commit")
        future = self._executor.submit(run)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def _drain_async(self, quiet: bool = False) -> None:
        """Wait for every async commit issued so far (their errors go to their futures)."""
        for future in self._pending:
            try:
                future.result()
            except Exception as exc:
                if not quiet:
                    self._log.warning("async commit failed", error=str(exc))
        self._pending = []

    def _auto_commit(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        changed = {
            tp: om
            for tp, om in self._current_positions(partitions).items()
            if self._last_committed.get(tp) != om.offset
        }
        try:
            self._commit_now(changed, self._member, self._generation)
        except CommitFailedError as exc:
            self._log.warning("auto-commit rejected", error=str(exc))

    def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit or self._member is None:
            return
        now = time.monotonic()
        if now >= self._next_auto_commit:
            self._next_auto_commit = now + self.auto_commit_interval_ms / 1000
            self._auto_commit()

    # ------------------------------------------------------------------ heartbeat thread
    def _heartbeat_loop(self) -> None:
        max_poll_ns = self.max_poll_interval_ms * 1_000_000
        while not self._stop.wait(self._tick_s):
            member = self._member
            if member is None:
                continue
            try:
                if not self._coord.beat(member):
                    continue  # our slot was freed: evicted; poll() will rejoin
                if time.monotonic_ns() - self._last_poll_ns > max_poll_ns:
                    if member.member_id in self._coord.current().members:
                        self._log.warning(
                            "poll() not called within max_poll_interval_ms; leaving the group"
                            " so that its partitions move (the next poll() rejoins)",
                            max_poll_interval_ms=self.max_poll_interval_ms,
                        )
                        self._coord.leave(
                            member.member_id, reason="max_poll_interval_ms", blocking=False
                        )
                    continue
                # Never block here: a frozen process holding the group lock must not stop
                # this member's heartbeats (it would be evicted when the lock frees).
                self._coord.evict_expired(blocking=False)
                self._coord.refresh_partitions(blocking=False)
            except Exception:
                self._log.exception("heartbeat thread error (will retry)")

    # ------------------------------------------------------------------ leaving
    def _leave(self, reason: str) -> None:
        member = self._member
        if member is None:
            return
        still = member.member_id in self._coord.current().members
        if still and self._owned:
            owned = sorted(self._owned)
            if self.enable_auto_commit:
                self._auto_commit(owned)
            error = self._call(self._listener.on_partitions_revoked, owned)
            if error is not None:
                self._log.warning("on_revoked failed while leaving", error=str(error))
        elif self._owned:
            self._lose_all()
        self._owned.clear()
        self._unpositioned.clear()
        self._fetcher.assign([])
        self._drain_async()
        if still and (self.group_instance_id is None or reason != "close"):
            self._coord.leave(member.member_id, reason=reason)
        self._member = None
        self._seen_version = -1

    def close(self, autocommit: bool = True) -> None:
        """Leave the group: commit (if auto-commit is on and ``autocommit``), run
        ``on_revoked``, and hand the partitions to the other members at once.

        A static member (``group_instance_id``) does not leave: its partitions wait for it
        for ``session_timeout_ms`` so that a restart keeps them (as in Kafka).
        """
        if self._closed:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        try:
            if self._fenced is None:
                if not autocommit:
                    self.enable_auto_commit = False
                self._leave("close")
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._fetcher.close()
            self._coord.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerError(f"the consumer of group {self.group_id!r} is closed")

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
