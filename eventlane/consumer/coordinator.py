"""The group coordinator: a group's shared state in the data directory, changed under a lock.

There is no broker: every member process (and the ``groups`` CLI) runs this code against the
same files. Layout of ``<data>/groups/<group>/``::

    lock        flock()ed while the state is read-modified-written (one writer at a time)
    state.json  the group state (:class:`~eventlane.consumer.membership.GroupState`), replaced
                atomically: written to ``state.json.tmp``, then renamed over
    live        memory-mapped: the version word and heartbeat slots (:mod:`.liveness`)

Invariants and rules:

* Only the holder of ``lock`` writes ``state.json`` or ``version``; it writes the file, then
  bumps ``version``, then wakes every waiting consumer through the data directory's notifier.
  Readers compare one mmap'd word with the version they last loaded (no system call), and
  re-read ``state.json`` only when it moved. Under the lock the file is authoritative.
* A member's heartbeat thread stores ``beat_ns`` every tick; a member whose ``beat_ns`` is
  older than its ``session_timeout_ms`` (or whose slot no longer carries its token) is
  evicted by whichever process notices first, under the lock. ``CLOCK_MONOTONIC`` is one
  clock for every process of the machine; after a reboot (``boot`` differs) every member of
  the previous boot is dropped.
* The state is not fsynced: membership does not outlive the processes it describes. Committed
  offsets live in ``__consumer_offsets`` (:mod:`.offsets`), which is durable.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import orjson

from eventlane._locks import FileLock
from eventlane.consumer.assignors import get_assignor
from eventlane.consumer.liveness import MAX_MEMBERS, LiveFile
from eventlane.consumer.membership import (
    GroupState,
    Member,
    add_member,
    release,
    remove_members,
    take_over,
    update_partitions,
)
from eventlane.errors import ConfigError, UnknownTopicError
from eventlane.log.port import Log
from eventlane.log.record import TopicPartition
from eventlane.observability import get_logger

__all__ = ["MAX_MEMBERS", "GroupCoordinator", "groups_root", "validate_group_id"]

log = get_logger("eventlane.consumer.group")

T = TypeVar("T")

MAX_GROUP_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_group_id(group: object, what: str = "group id") -> str:
    """Return ``group`` if it is a legal group id (the topic-name rule), else raise.

    Group ids name directories, so they follow Kafka's topic rule: 1 to 249 characters from
    ``[a-zA-Z0-9._-]``, not ``.`` or ``..``.

    >>> validate_group_id("projector.orders")
    'projector.orders'
    >>> validate_group_id("../x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    eventlane.errors.ConfigError: group id '../x' is illegal: only ASCII letters, digits, ...
    """
    if not isinstance(group, str) or not group:
        raise ConfigError(f"{what} must be a non-empty string, got {group!r}")
    if group in (".", "..") or len(group) > MAX_GROUP_LENGTH or not _LEGAL.fullmatch(group):
        shown = group[:60].encode("unicode_escape").decode("ascii")
        raise ConfigError(
            f"{what} {shown!r} is illegal: only ASCII letters, digits, '.', '_' and '-' are"
            " allowed" + (f" (at most {MAX_GROUP_LENGTH})" if len(group) > MAX_GROUP_LENGTH else "")
        )
    return group


def groups_root(log_: Log) -> Path:
    """Where the file-based coordination keeps group state: the log's local directory."""
    return log_.local.groups()


def _partition_counts(log_: Log, topics: set[str]) -> dict[str, int]:
    counts = {}
    for topic in sorted(topics):
        try:
            counts[topic] = log_.partition_count(topic)
        except UnknownTopicError:
            counts[topic] = 0
    return counts


class GroupCoordinator:
    """One process's handle on a group's shared files. Thread-safe.

    ``wake`` is called after every state change (the data directory's notifier ``bump``), so
    consumers blocked in ``poll`` notice a rebalance at once.
    """

    def __init__(self, log_: Log, group: str, *, wake: Callable[[], None] | None = None) -> None:
        self.log = log_
        self.group = validate_group_id(group)
        self.dir = groups_root(log_) / group
        self.dir.mkdir(parents=True, exist_ok=True)
        self.wake = wake
        self._live = LiveFile(self.dir / "live")
        self._mutex = threading.RLock()
        self._cache: GroupState | None = None
        self._cache_seen = -1
        self._cache_lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ files
    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    @contextlib.contextmanager
    def _flock(self, blocking: bool = True) -> Iterator[bool]:
        """Hold the group's file lock; yields False (not held) if ``blocking`` is False and
        another process holds it."""
        # follow_replacement: the group was deleted while we waited? take the new lock
        lock = FileLock(self.dir / "lock", follow_replacement=True)
        try:
            with lock.hold(blocking=blocking) as held:
                yield held
        finally:
            lock.close()  # one descriptor per use, as before

    def _read_file(self) -> GroupState:
        try:
            data = self.state_path.read_bytes()
        except FileNotFoundError:
            return GroupState(self.group, version=self._live.version)
        try:
            return GroupState.from_json(data)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning(
                "unreadable group state; starting from an empty group",
                group=self.group,
                path=str(self.state_path),
                error=str(exc),
            )
            return GroupState(self.group, version=self._live.version)

    def _write(self, state: GroupState) -> None:
        state.version = max(state.version, self._live.version) + 1
        state.updated_ms = time.time_ns() // 1_000_000
        tmp = self.dir / "state.json.tmp"
        tmp.write_bytes(state.to_json())
        tmp.replace(self.state_path)
        self._live.header.version = state.version
        with self._cache_lock:
            self._cache, self._cache_seen = state.copy(), state.version
        if self.wake is not None:
            self.wake()

    def current(self) -> GroupState:
        """The latest state this process knows; re-read only if the version word moved.

        The returned object is shared: treat it as read-only.
        """
        seen = self._live.version
        with self._cache_lock:
            if self._cache is not None and seen == self._cache_seen:
                return self._cache
        state = self._read_file()
        with self._cache_lock:
            self._cache, self._cache_seen = state, seen
        return state

    def version(self) -> int:
        """The version word: changes whenever the state changes (one memory read)."""
        return self._live.version

    @contextlib.contextmanager
    def locked(self) -> Iterator[GroupState]:
        """Hold the group lock and get the authoritative state; changes are not written."""
        with self._mutex, self._flock():
            yield self._read_file()

    def mutate(self, change: Callable[[GroupState], T]) -> T:
        """Run ``change`` on the authoritative state under the group lock; write it back
        (and wake every member) if it changed anything."""
        with self._mutex, self._flock():
            return self._apply(change)

    def try_mutate(self, change: Callable[[GroupState], T]) -> tuple[bool, T | None]:
        """:meth:`mutate` if the lock is free now, else ``(False, None)`` at once. For the
        heartbeat thread, which must keep beating even if a lock holder is frozen."""
        if not self._mutex.acquire(blocking=False):
            return False, None
        try:
            with self._flock(blocking=False) as held:
                if not held:
                    return False, None
                return True, self._apply(change)
        finally:
            self._mutex.release()

    def _apply(self, change: Callable[[GroupState], T]) -> T:
        state = self._read_file()
        before = state.to_json()
        if self._live.reset_if_new_boot() and state.members:
            log.warning(
                "members of a previous boot dropped",
                group=self.group,
                members=sorted(state.members),
            )
            remove_members(state, list(state.members))
        result = change(state)
        if state.to_json() != before:
            self._write(state)
        return result

    # ------------------------------------------------------------------ liveness
    def expired(self, state: GroupState, now_ns: int | None = None) -> list[str]:
        """Members whose heartbeat is older than their session timeout (or lost its slot)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        out = []
        for mid, m in state.members.items():
            age = self._live.age_ns(m.slot, m.token, now)
            if age is None or age > m.session_timeout_ms * 1_000_000:
                out.append(mid)
        return out

    def alive(self, state: GroupState) -> list[str]:
        expired = set(self.expired(state))
        return [mid for mid in state.members if mid not in expired]

    def evict_expired(self, *, blocking: bool = True) -> list[str]:
        """Evict every member whose session expired (checked again under the lock)."""

        def change(state: GroupState) -> list[str]:
            dead = self.expired(state)
            for mid in dead:
                m = state.members[mid]
                age = self._live.age_ns(m.slot, m.token, time.monotonic_ns())
                log.warning(
                    "member evicted: no heartbeat within the session timeout",
                    group=self.group,
                    member_id=mid,
                    instance_id=m.instance_id,
                    pid=m.pid,
                    session_timeout_ms=m.session_timeout_ms,
                    silent_ms=None if age is None else age // 1_000_000,
                    partitions=len(m.owned),
                    generation=state.generation + 1,
                )
                self._live.free(m.slot, m.token)
            remove_members(state, dead)
            return dead

        if not self.expired(self.current()):
            return []
        if blocking:
            return self.mutate(change)
        return self.try_mutate(change)[1] or []

    def beat(self, member: Member) -> bool:
        return self._live.beat(member.slot, member.token, time.monotonic_ns())

    def polled(self, member: Member) -> None:
        self._live.polled(member.slot, member.token, time.monotonic_ns())

    # ------------------------------------------------------------------ membership
    def join(
        self,
        *,
        topics: tuple[str, ...],
        assignor: str,
        session_timeout_ms: int,
        instance_id: str | None = None,
        client_id: str = "eventlane",
    ) -> Member:
        """Join the group (evicting expired members first); returns the new member.

        With ``instance_id`` (static membership) an existing member with that instance id is
        replaced and its partitions kept, whether it is dead or alive (the old one is fenced).
        """
        get_assignor(assignor)
        if instance_id is not None:
            validate_group_id(instance_id, "group instance id")
        prefix = instance_id or client_id

        def change(state: GroupState) -> Member:
            now = time.monotonic_ns()
            dead = [
                mid
                for mid in self.expired(state, now)
                if instance_id is None or state.members[mid].instance_id != instance_id
            ]
            if dead:
                log.warning(
                    "members evicted on join: session expired", group=self.group, members=dead
                )
                for mid in dead:
                    self._live.free(state.members[mid].slot, state.members[mid].token)
                remove_members(state, dead)
            if state.members and state.assignor != assignor:
                raise ConfigError(
                    f"group {self.group!r} uses assignor {state.assignor!r}; this member asks"
                    f" for {assignor!r} (all members of a group must use the same one)"
                )
            used = {m.slot for m in state.members.values()}
            slot = next((i for i in range(MAX_MEMBERS) if i not in used), None)
            if slot is None:
                raise ConfigError(f"group {self.group!r} is full ({MAX_MEMBERS} members)")
            member = Member(
                member_id=f"{prefix}-{uuid.uuid4()}",
                instance_id=instance_id,
                client_id=client_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                slot=slot,
                token=secrets.randbits(63) + 1,
                session_timeout_ms=session_timeout_ms,
                topics=tuple(sorted(set(topics))),
            )
            self._live.claim(slot, member.token, now)
            counts = _partition_counts(self.log, state.topics() | set(topics))
            old = state.member_by_instance(instance_id) if instance_id is not None else None
            if (
                old is not None
                and set(old.topics) == set(member.topics)
                and all(state.partitions.get(t, 0) == counts[t] for t in counts)
            ):
                log.info(
                    "static member rejoined; it keeps its partitions",
                    group=self.group,
                    instance_id=instance_id,
                    old_member_id=old.member_id,
                    member_id=member.member_id,
                )
                self._live.free(old.slot, old.token)
                take_over(state, old.member_id, member)
            else:
                if old is not None:
                    self._live.free(old.slot, old.token)
                    remove_members(state, [old.member_id])
                state.partitions.update(counts)
                add_member(state, member, assignor)
            log.info(
                "member joined",
                group=self.group,
                member_id=member.member_id,
                instance_id=instance_id,
                generation=state.generation,
                members=len(state.members),
                assignor=state.assignor,
            )
            return member

        return self.mutate(change)

    def leave(
        self,
        member_id: str,
        reason: str = "close",
        *,
        blocking: bool = True,
        joined_generation: int | None = None,
    ) -> bool:
        """Remove a member now (graceful leave): its partitions move at once.

        With ``joined_generation`` (a supervisor leaving for its dead worker) the member is
        removed only if it is still the incarnation that joined at that generation, so a
        leave on someone's behalf can never remove another member; False otherwise.
        """

        def change(state: GroupState) -> bool:
            m = state.members.get(member_id)
            if m is None or joined_generation not in (None, m.joined_generation):
                return False
            self._live.free(m.slot, m.token)
            remove_members(state, [member_id])
            log.info(
                "member left",
                group=self.group,
                member_id=member_id,
                reason=reason,
                generation=state.generation,
            )
            return True

        if blocking:
            return self.mutate(change)
        return bool(self.try_mutate(change)[1])

    def release(self, member_id: str, partitions: set[TopicPartition]) -> bool:
        """The member stopped consuming ``partitions``: hand them to their new owners.
        False if the member is no longer in the group (then nothing is changed)."""

        def change(state: GroupState) -> bool:
            if member_id not in state.members:
                return False
            release(state, member_id, partitions)
            log.info(
                "partitions released",
                group=self.group,
                member_id=member_id,
                partitions=[f"{tp.topic}-{tp.partition}" for tp in sorted(partitions)],
                generation=state.generation,
            )
            return True

        return self.mutate(change)

    def refresh_partitions(self, *, blocking: bool = True) -> bool:
        """Rebalance if a subscribed topic gained (or lost) partitions. Cheap when not."""
        state = self.current()
        counts = _partition_counts(self.log, state.topics())
        if all(state.partitions.get(t, 0) == n for t, n in counts.items()):
            return False

        def change(state: GroupState) -> bool:
            fresh = _partition_counts(self.log, state.topics())
            changed = update_partitions(state, fresh)
            if changed:
                log.info(
                    "subscribed topics changed partition count; rebalancing",
                    group=self.group,
                    partitions=fresh,
                    generation=state.generation,
                )
            return changed

        if blocking:
            return self.mutate(change)
        return bool(self.try_mutate(change)[1])

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._live.close()
