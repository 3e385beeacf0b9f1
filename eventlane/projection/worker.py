"""One projector worker: a consumer-group member applying its partitions to the read model.

The loop: :meth:`Worker.poll` → :meth:`Worker.apply` (the records in one read-model
transaction, with their positions, see :mod:`.applier`) → wake read-your-writes waiters →
now and then commit the group offsets (for lag tools; the read model's positions are the
truth) → publish new dead letters to ``<group>.dlq``. Invariant: an owned partition whose
stored position is not the group's commit (as this worker knows it) is committed within
``group_commit_interval_s``, busy or idle; a revoke commits every owned partition.

On assignment a partition is *claimed* in the read model with the member's group generation
and the consumer seeks to the stored position (the partition's low-water mark the first
time), never to the group's committed offset, except for a policy (no tables) whose group
spans hosts: its positions are the group's fenced commits when they are further (its
effects are idempotent commands in the log, not rows in the local file). Across hosts, a
projection with tables is pinned to the host of its read model file
(``GroupCoordination.claim_home``): a worker elsewhere cannot start.

A worker whose generation was superseded for a partition (a paused zombie) is refused by
the read model: it drops the batch and seeks every partition of it that it still holds
back to the stored position, so nothing is skipped either.

SIGTERM / SIGINT: finish the current batch, commit, leave the group (the partitions move at
once), exit 0. The process entry point (what :class:`~eventlane.projection.runner.Runner`
starts) is the hidden command ``eventlane --data DATA project worker APP NAME``; its exit
status is 0 after a clean stop, :data:`EXIT_CANNOT_START` (2) when the worker cannot start
(bad ``APP``, unknown projector, pending migrations: an error line on stderr; restarting
would not help), 1 on any other failure, a log that did not answer while it started
included (a retriable error: the next worker may find it available). The read model can
also be handed over under a running worker (a rebuild's hand-off): see :mod:`.pause`.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from eventlane._stopflag import StopFlag
from eventlane.consumer.coordination import coordination_for
from eventlane.consumer.group import GroupConsumer
from eventlane.errors import CommitFailedError, FencedError, FrameworkError, ReadModelBusyError
from eventlane.log import Record, TopicPartition
from eventlane.metrics import M, batch_applied
from eventlane.observability import get_logger
from eventlane.projection.applier import BatchResult
from eventlane.projection.breaker import (
    PoisonRateError,
    clear_tripped,
    save_tripped,
)
from eventlane.projection.dead_letters import publish_dead_letters
from eventlane.projection.host import ProjectionHost
from eventlane.projection.lifeline import supervisor_gone, worker_client_id
from eventlane.projection.parallel import applier_for
from eventlane.projection.pause import PauseControl
from eventlane.projection.schema import open_readmodel, readmodel_file
from eventlane.projection.status import notify_applied
from eventlane.projection.store import readmodel_url
from eventlane.projection.waiting import describe as describe_wait
from eventlane.store import EVENT_TOPIC_CONFIG
from eventlane.tracing import batch_span

__all__ = ["EXIT_CANNOT_START", "Polled", "Worker"]

log = get_logger("eventlane.projection")

EXIT_CANNOT_START = 2
"""A worker process's exit status when it cannot start; a supervisor does not restart it."""
BUSY_PAUSE_MAX_S = 2.0
"""The longest pause before a batch the read model's database refused is applied again."""


class Polled(NamedTuple):
    """Records from one poll and the group generation they were polled under."""

    records: list[Record]
    generation: int


class Worker:
    """Runs one projector as a member of its consumer group (the projector's name, in the
    app's namespace: ``runtime.names.group(name)``)."""

    def __init__(
        self,
        runtime: ProjectionHost,
        name: str,
        *,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        max_poll_records: int = 2_000,
        poll_timeout: float = 0.5,
        group_commit_interval_s: float = 1.0,
        on_batch: Callable[[int], None] | None = None,
        wait_for_newer: bool = True,
    ) -> None:
        self.runtime = runtime
        self.wait_for_newer = wait_for_newer
        """Stop a partition at an event newer than the code (:mod:`.waiting`); False: dead-
        letter it (``--dead-letter-unknown``)."""
        self.name = name
        self.group = runtime.names.group(name)
        self.projector = runtime.app.projector(name)()
        groups = coordination_for(runtime.log)
        # Across hosts (a cluster's coordination): a read model file pins its projection's
        # workers to its host (checked before the file is opened); a policy (no tables of
        # its own) keeps its positions in the group's fenced commits, so a worker on any
        # host resumes where the last one was.
        self._positions_in_group = groups.spans_hosts and self.projector.migrations is None
        # A read model in PostgreSQL is reachable from every host: no pinning.
        pinned = self.projector.migrations is not None and readmodel_url(runtime, name) is None
        if groups.spans_hosts and pinned:
            path = readmodel_file(runtime, name).resolve()
            groups.claim_home(self.group, f"{socket.gethostname()}:{path}")
        self.readmodel = open_readmodel(runtime, name)
        self.applier = applier_for(self.projector, runtime.codec, self.readmodel, app=runtime)
        self.applier.wait_for_newer = wait_for_newer
        self.max_poll_records = max_poll_records
        self.poll_timeout = poll_timeout
        self.group_commit_interval_s = group_commit_interval_s
        self.on_batch = on_batch
        self.stopping = StopFlag()
        """Set to stop after the current batch (safe from a signal handler)."""
        self._stop_signal: int | None = None
        self.applied = 0
        """Records polled and applied (or skipped as already applied) by this worker."""
        self.fenced_batches = 0
        """Batches the read model refused because a newer generation owns a partition."""
        self.busy_batches = 0
        """Batches rolled back because the read model's database refused a statement for its
        own reasons (:class:`~eventlane.errors.ReadModelBusyError`), then applied again."""
        self._busy_streak = 0
        self._log = log.bind(projector=name, group=self.group, pid=os.getpid())
        self._next_group_commit = 0.0
        self._group_commits: dict[TopicPartition, int] = {}
        """The group's committed offset per partition as this worker knows it (its own
        commits, or read when assigned): an idle worker commits while a stored position
        differs from it, so no flag can claim "all committed" for a position never sent."""
        self._published = -1
        self._pause = PauseControl(runtime.log.local, runtime.names.local(name))
        self._readmodel_inode = _inode(self.readmodel.path)
        self._readmodel_open = True
        self.tripped: PoisonRateError | None = None
        """Set when the poison-rate breaker stopped this worker (see :mod:`.breaker`)."""
        clear_tripped(self.readmodel.path)  # a (re)started worker: new code, a new chance
        topics = runtime.names.projector_topics(type(self.projector))
        for declared, topic in zip(self.projector.topic_names, topics, strict=True):
            if not runtime.log.topic_exists(topic):
                runtime.log.create_topic(
                    topic, runtime.partitions_for(declared), EVENT_TOPIC_CONFIG, exist_ok=True
                )
        self.consumer = GroupConsumer(
            runtime.log,
            coordination=groups,
            group_id=self.group,
            topics=topics,
            client_id=worker_client_id(),
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(1, min(heartbeat_interval_ms, session_timeout_ms // 3)),
            enable_auto_commit=False,
            auto_offset_reset="error",
            on_assigned=self._assigned,
            on_revoked=self._revoked,
            on_lost=self._lost,
            max_poll_records=max_poll_records,
        )
        self._publish()

    # ------------------------------------------------------------------ rebalances
    def _assigned(self, partitions: list[TopicPartition]) -> None:
        generation = self.consumer.generation
        if M.on:
            M.rebalances.labels(self.group).inc()
        self.consumer.resume(*partitions)  # a wait starts again if the code is still old
        for tp in partitions:
            lwm = self.runtime.log.offsets(tp.topic, tp.partition).lwm
            # A policy across hosts: the group's fenced commit may be past this host's
            # positions (another host applied further); the file catches up to it, so a
            # later commit from this file can never move the group backwards.
            floor = self.consumer.committed(tp) if self._positions_in_group else None
            if floor is None:
                self._group_commits.pop(tp, None)  # unknown: the next interval commits
            else:
                self._group_commits[tp] = floor
            try:
                position = self.readmodel.claim(
                    tp,
                    generation,
                    lwm,
                    still_owned=functools.partial(self.consumer.owns, tp),
                    floor=floor,
                )
            except FencedError as exc:
                # Lost it again already (evicted while claiming); the next poll notices.
                # Seek to the stored position anyway, so no record can be skipped.
                self._log.warning(
                    "partition claimed by a newer generation",
                    topic=tp.topic,
                    partition=tp.partition,
                    generation=generation,
                )
                position = max(exc.offset if exc.offset is not None else lwm, floor or 0)
            self.consumer.seek(tp, position)
            self._log.info(
                "partition assigned",
                topic=tp.topic,
                partition=tp.partition,
                offset=position,
                generation=generation,
            )

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        # Every owned partition, not only the ones given up (still owned while this runs):
        # one commit marks the worker all committed, so a kept partition whose last records
        # were applied within the interval would, idle, never be committed at all.
        self._commit_group()

    def _lost(self, partitions: list[TopicPartition]) -> None:
        self._log.warning(
            "partitions lost (evicted); the read model fences any late batch",
            partitions=[f"{tp.topic}-{tp.partition}" for tp in partitions],
        )

    def _owned_positions(self) -> dict[TopicPartition, int]:
        positions = self.readmodel.positions()
        return {tp: positions[tp] for tp in self.consumer.assignment() if tp in positions}

    def _commit_group(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Commit the stored positions of every owned partition (one fenced batch;
        ``offsets``: those positions, already read by the caller)."""
        if offsets is None:
            offsets = self._owned_positions()
        self._next_group_commit = time.monotonic() + self.group_commit_interval_s
        if not offsets:
            return
        try:
            self.consumer.commit(offsets)
        except CommitFailedError as exc:  # the next interval commits what is still owned
            self._log.info("group commit refused (partition moved)", error=str(exc))
            return
        self._group_commits.update(offsets)

    # ------------------------------------------------------------------ the loop
    def poll(self) -> Polled:
        """Poll once (joining, rebalancing as needed)."""
        records = self.consumer.poll(self.poll_timeout, self.max_poll_records)
        return Polled(records, self.consumer.generation)

    def apply(self, polled: Polled) -> BatchResult | None:
        """Apply a polled batch exactly once; ``None`` when the read model refused it."""
        records, generation = polled
        if not records:
            # Idle: commit what the last batches applied, so group tools (``groups
            # describe``) show the same lag as ``project status`` within the interval.
            if time.monotonic() >= self._next_group_commit:
                # commit only while a stored position is not the group's commit (one read)
                offsets = self._owned_positions()
                if any(self._group_commits.get(tp) != o for tp, o in offsets.items()):
                    self._commit_group(offsets)
                else:
                    self._next_group_commit = time.monotonic() + self.group_commit_interval_s
            return BatchResult(0, 0, 0)
        started = time.perf_counter()
        try:
            with batch_span(self.name, records):
                result = self.applier.apply(records, generation)
        except FencedError as exc:
            self.fenced_batches += 1
            self._log.warning(
                "batch refused: partition owned by a newer generation",
                topic=exc.topic,
                partition=exc.partition,
                offset=exc.offset,
                generation=generation,
                records=len(records),
            )
            self._rewind({TopicPartition(r.topic, r.partition) for r in records})
            return None
        except ReadModelBusyError as exc:
            # Not poison: nothing of the batch was kept; apply it again after a pause (a
            # lock held by a migration or an index build, a deadlock, a cancel).
            self.busy_batches += 1
            self._busy_streak += 1
            pause = min(BUSY_PAUSE_MAX_S, 0.1 * 2**self._busy_streak)
            self._log.warning(
                "batch rolled back: the read model's database refused a statement; applying"
                " it again",
                topic=exc.topic,
                partition=exc.partition,
                offset=exc.offset,
                error=str(exc.__cause__ or exc),
                retry_in_s=round(pause, 2),
            )
            self._rewind({TopicPartition(r.topic, r.partition) for r in records})
            self.stopping.wait(pause)
            return None
        self._busy_streak = 0
        if self.applier.waiting:
            self._wait()
        self.applied += len(records)
        if M.on:
            batch_applied(
                self.name,
                self.group,
                (r.topic for r in records),
                result.applied,
                result.dead_lettered,
                time.perf_counter() - started,
            )
        notify_applied(self.runtime.log)
        if time.monotonic() >= self._next_group_commit:
            self._commit_group()
        if self.applier.dead_lettered_total != self._published:
            self._publish()
        if self.on_batch is not None:
            self.on_batch(len(records))
        return result

    def _wait(self) -> None:
        """Partitions stopped at an event newer than this code: fetch them no more (their
        stored position is at that event) until they are assigned again."""
        positions = self.readmodel.positions()
        held = self.consumer.assignment()
        for tp, wait in sorted(self.applier.waiting.items()):
            if tp not in held:
                continue
            self.consumer.seek(tp, positions.get(tp, wait.offset))
            self.consumer.pause(tp)
            self._log.warning(
                describe_wait(wait),
                topic=tp.topic,
                partition=tp.partition,
                offset=wait.offset,
            )

    def _rewind(self, partitions: set[TopicPartition]) -> None:
        held = self.consumer.assignment()
        positions = self.readmodel.positions()
        for tp in sorted(partitions & held):
            if tp in positions:
                self.consumer.seek(tp, positions[tp])

    def _publish(self) -> None:
        try:
            publish_dead_letters(self.runtime.log, self.group, self.readmodel)
        except FrameworkError as exc:  # the rows are safe; the next batch tries again
            self._log.warning("publishing dead letters failed", error=str(exc))
            return
        self._published = self.applier.dead_lettered_total

    def run_once(self) -> int:
        """Poll once and apply what came; return how many records were polled."""
        if self._pause.requested() is not None or self._readmodel_replaced():
            self._hand_off()
            return 0
        polled = self.poll()
        self.apply(polled)
        return len(polled.records)

    def run(self, *, until: Callable[[], bool] | None = None) -> None:
        """Loop until :attr:`stopping` is set (or ``until()`` is true), then leave."""
        try:
            while not self.stopping.is_set() and not (until is not None and until()):
                self.run_once()
                if supervisor_gone():  # where no parent-death signal exists (not Linux)
                    self._log.warning("the supervisor died: stopping")
                    self.stopping.set()
        except PoisonRateError as exc:
            self.tripped = exc
            save_tripped(self.readmodel.path, exc.record)
            self._log.error(str(exc), last_error=exc.record["error"])
        finally:
            if self._stop_signal is not None:
                self._log.info("stopping after the current batch", signal=self._stop_signal)
            self.close()

    def install_signal_handlers(self) -> None:
        def stop(signum: int, _frame: Any) -> None:
            # no lock, no logging here: a second signal may interrupt this handler (SIGTERM
            # from the supervisor and from the kernel's parent-death signal at once), or the
            # main thread may hold a lock this would take (eventlane._stopflag)
            self._stop_signal = signum
            self.stopping.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    # ------------------------------------------------------------------ hand-off
    def _readmodel_replaced(self) -> bool:
        if getattr(self.readmodel, "replaced", False):  # a PostgreSQL schema swapped
            return True
        return _inode(self.readmodel.path) != self._readmodel_inode

    def _hand_off(self) -> None:
        """Pause while a pause is requested (see :mod:`.pause`), then reopen the read model
        at its path and seek every owned partition to the position stored there."""
        token = self._pause.requested()
        member = self.consumer.member_id
        if token is not None:
            self._commit_group()
            self.readmodel.close()
            self._readmodel_open = False
            if member is not None:
                self._pause.ack(member, token)
            self._log.info("paused for a read-model hand-off", member=member)
            while not self.stopping.is_set() and self._pause.requested() == token:
                time.sleep(0.02)
            if self.stopping.is_set():
                return
        else:
            self.readmodel.close()
            self._readmodel_open = False
        self.readmodel = open_readmodel(self.runtime, self.name)
        self._readmodel_inode = _inode(self.readmodel.path)
        self._readmodel_open = True
        self.applier.close()
        self.applier = applier_for(
            self.projector, self.runtime.codec, self.readmodel, app=self.runtime
        )
        self.applier.wait_for_newer = self.wait_for_newer
        self._published = -1
        self._assigned(sorted(self.consumer.assignment()))
        if member is not None:
            self._pause.clear_ack(member)
        self._log.info("read model reopened after a hand-off", member=member)

    def close(self) -> None:
        self.applier.close()
        if not self._readmodel_open:  # stopped while paused: the file is not ours to touch
            self.consumer.close(autocommit=False)
            return
        try:
            self._commit_group()
        except Exception as exc:
            self._log.warning("final group commit failed", error=str(exc))
        self.consumer.close(autocommit=False)
        self.readmodel.close()


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return -1
