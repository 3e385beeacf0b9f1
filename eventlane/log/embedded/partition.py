"""One partition: an ordered, append-only sequence of records stored as segment files.

Directory layout (``<data>/topics/<topic>/<partition>/``)::

    00000000000000000000.log / .index / .timeindex    segments (see :mod:`.segment`)
    state              shared offsets of the partition, memory-mapped (see :mod:`.state`)
    lock               flock()ed by whoever appends, rolls, truncates or swaps segments
    sync.lock          flock()ed by whoever makes written records durable (group commit)
    cleaner.lock       flock()ed by the one process compacting this partition
    log-start-offset   the low-water mark, written (fsync + rename) before segments are deleted
    recovery-point     every segment below this offset was fsynced when it was rolled
    cleaner-journal    present only while a compaction swap is being applied

Invariants:

* Offsets strictly increase through the segments; segments never overlap once a compaction
  swap is complete (a reader that sees a moment of overlap reads the older copy of the same
  records, so nothing is missed).
* ``lwm <= hwm <= leo``. With ``flush_policy="always"`` the high-water mark moves only after
  the batch is fsynced; readers never return records at or above it.
* Group commit across threads and processes: while appenders queue for ``lock`` (they leave a
  hint in the state: ``contended_ms``), an appender writes its batch under ``lock`` (the LEO
  moves, the HWM does not) and lets go of it; then, under ``sync.lock``, the first
  appender not yet covered fsyncs the active segment once for every batch written so far
  and publishes the HWM (under ``lock`` again: taken while still holding ``sync.lock`` only
  if it is free at once; else ``sync.lock`` is let go first, so that the appender writing
  meanwhile can fsync without waiting for this publication, and a later sync may publish
  past it first). Appenders that wrote meanwhile find the HWM
  past their batch and return without an fsync of their own. Nobody is told an offset
  before the HWM covers it. Records between the HWM and the LEO are *in flight*: readers do
  not see them, the next appender writes after them (and its conditional check counts them:
  if they are lost, so is everything written after them). A failed fsync throws every
  in-flight record away (the tail is cut back to the durable size, ``epoch`` is bumped) and
  their appenders, in any process, get an error instead of an acknowledgement. An appender
  that had the lock to itself fsyncs holding it and publishes the HWM at once (that covers
  anything in flight in the active segment too; a roll fsyncs the segment it closes).
* Only the holder of ``lock`` writes the active segment, its indexes, or the state. Bytes past
  ``state.active_size`` belong to an append that was never acknowledged (its writer died): the
  next writer truncates them.

Lock order (threads and processes alike). A lock is taken only while holding none below it
in this list; every path that takes two is named:

1. a consumer group's ``groups/<g>/lock`` (:mod:`eventlane.consumer.coordinator`), then the
   append lock of ``__consumer_offsets`` (``groups`` admin commands commit under it; a
   member's commit holds no group lock: its precondition reads the state without it);
2. ``cleaner.lock`` (:meth:`Partition.maintenance_lock`: compaction, retention), then ``lock``
   for the segment swap or the low-water mark;
3. ``sync.lock`` (:meth:`Partition._await_durable`: one fsync for everything written), then
   ``lock`` to publish the HWM, without waiting for it (busy: ``sync.lock`` is let go before
   waiting for ``lock``); never the other way: an appender lets go of ``lock`` before it
   waits for durability;
4. ``lock``, the append lock;
5. the key index's locks (:mod:`.key_index`: its object's ``RLock``, then the
   ``<p>.keyindex.lock`` flock), taken under ``lock`` by a conditional append's version
   check and by the append hook that indexes the records, which wait for the flock at most
   briefly and otherwise go without it (a reader's catch-up may hold it: *Busy lock* in
   :mod:`.key_index`); on their own by readers and the index's catch-up and flusher;
6. the process's in-memory locks below these (the reader cache's ``_r_lock``, the combine
   queue's ``_combine_lock``, the descriptor budget's): held only for a few statements,
   taking nothing else except the descriptor budget's non-blocking releases.

Opening objects takes locks too: :class:`~eventlane.log.embedded.store.LogStore` opens a partition
under its ``_lock`` (an open that must repair takes ``lock``), and
:class:`~eventlane.log.embedded.keys.KeyIndexes` opens a key index under its ``_lock`` (the open
takes the index's locks and may open the partition). Neither is taken under ``lock``: an
appender finds its partition and key index already open (a conditional append opens the
index before it takes ``lock``). The key index asks for its partition's epoch under its own
lock: :meth:`~eventlane.log.embedded.store.LogStore.epoch` never opens a partition.

Readers and consumers never hold a lock an appender waits for, so a reader descheduled,
stopped (SIGSTOP) or slow never stops a producer (issue 26: a consumer frozen while it
opened a partition held ``lock``; a producer waited 14 minutes). Opening a healthy partition
(state written on this boot, nothing left half done) waits for no lock: only one that needs
recovery takes ``lock`` (:meth:`Partition._healthy`); what a dead appender left past the
state, or wrote but never made durable, is tidied at the open only if ``lock`` is free then.
A reader that finds the state's seqlock odd or the layout odd for too long (its writer
descheduled, or dead) takes ``lock`` only if it is free *and* the change is still half done
(then its writer died), repairing it (:meth:`Partition._wait_for_writer`), and otherwise
waits on, never for ``lock``: a reader may hold a key index's lock, which the live writer
needs next (issue 26: two processes hung forever when a reader waited). So a reader holds
``lock`` only to finish what a dead writer left. The key index touches its partition before
taking its own lock.
``tests/log/test_lock_pauses.py`` runs every path above across processes with random
pauses inside the critical sections (:mod:`eventlane._pauses`) and fails on any stall;
``tests/consumer/test_stopped_consumer.py`` stops a consumer process at its first lock of
the topic, and in the middle of a read, and a producer must append meanwhile.

The read path (records from an offset, the reader's cursor and segment cache, time lookups)
is :mod:`.read`, a mixin of :class:`Partition`. What stays here (over 700 lines) is one
concept: the partition's writes under its lock order (append, group commit, durability and
its failure, rolls, segment swaps for the cleaner and retention, recovery on open).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from time import perf_counter
from typing import NamedTuple

from eventlane._locks import FileLock, open_rw_or_read_only
from eventlane._pauses import PAUSE
from eventlane.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OutcomeUnknownError,
    PartitionReadOnlyError,
    ReadOnlyDataError,
    RecordTooLargeError,
    UnknownTopicError,
)
from eventlane.log.config import TopicConfig
from eventlane.log.embedded.batch import (
    encode_batch,
)
from eventlane.log.embedded.check import verify_files
from eventlane.log.embedded.fds import FDS, next_use
from eventlane.log.embedded.read import (
    MAX_BATCH_BYTES,
    _ReadPath,
)
from eventlane.log.embedded.recovery import (
    COMPACTED,
    JOURNAL,
    LOG_START,
    RECOVERY_POINT,
    apply_swap_group,
    finish_interrupted_swap,
    recover,
    remove_swap_journal,
    write_swap_journal,
)
from eventlane.log.embedded.segment import (
    LOG_SUFFIX,
    OFFSET_ENTRY,
    TIME_ENTRY,
    OffsetIndex,
    Segment,
    TimeIndex,
    index_path,
    list_segment_bases,
    log_path,
    scan_batches,
    segment_stem,
    timeindex_path,
)
from eventlane.log.embedded.state import BOOT, Notifier, PartitionState, Snapshot
from eventlane.log.files import fsync_dir, write_atomic
from eventlane.log.record import RECORD_OVERHEAD, Header
from eventlane.log.types import (  # re-exported: older imports name them here
    AppendHook as AppendHook,  # noqa: PLC0414
)
from eventlane.log.types import AppendResult as AppendResult  # noqa: PLC0414 (re-exported)
from eventlane.log.types import Clock, FramedBatch, FramedRecords, wall_clock_ms
from eventlane.log.types import Precondition as Precondition  # noqa: PLC0414 (re-exported)
from eventlane.log.types import RecordTuple as RecordTuple  # noqa: PLC0414 (re-exported)
from eventlane.metrics import M, Tally, add_append, fsynced, tally
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

CONTENDED_MS = 200
"""An appender that found the append lock taken this recently makes the holder fsync after
letting go of it (group commit across threads and processes); else it fsyncs holding it."""
_IOV_MAX = 512  # buffers per pwritev call (Linux allows 1024)


GroupedAppend = tuple[Sequence[RecordTuple], Precondition | None, AppendHook | None]
"""One append of :meth:`Partition.append_group`: records, precondition, hook."""


class SegmentInfo(NamedTuple):
    base: int
    size: int


class _Append:
    """One caller's append while it waits in (or is written by) a group; see
    :meth:`Partition.append`."""

    __slots__ = (
        "batches",
        "count",
        "end",
        "epoch",
        "error",
        "keys",
        "nbytes",
        "on_appended",
        "pending",
        "precondition",
        "refused",
    )

    def __init__(
        self,
        batches: list[Sequence[RecordTuple]] | list[FramedBatch],
        count: int,
        precondition: Precondition | None,
        on_appended: AppendHook | None,
    ) -> None:
        self.batches = batches
        self.count = count
        self.precondition = precondition
        self.on_appended = on_appended
        self.keys: frozenset[bytes] = frozenset()
        self.pending: AppendResult | None = None
        """The offsets, once written (returned once durable)."""
        self.end = 0
        """The LEO after the write that holds this append: durable once the HWM reaches it."""
        self.epoch = 0
        self.nbytes = 0
        """Bytes of its batches, once written."""
        self.refused = False
        """Its precondition refused it (``end``/``epoch``: the log it was checked against)."""
        self.error: Exception | None = None

    def result(self) -> AppendResult:
        assert self.pending is not None
        return self.pending


class Partition(_ReadPath):
    """A partition opened by this process; safe for use from several threads and processes."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        config: TopicConfig,
        notifier: Notifier,
        clock: Clock = wall_clock_ms,
        *,
        skip_lost_offsets: bool = False,
    ) -> None:
        """Open (and recover if needed) the partition in ``directory``.

        ``skip_lost_offsets=True`` is the explicit repair of a partition that refused to open
        with :class:`~eventlane.errors.DataLossError`: it recovers now and keeps the lost
        offsets taken (see :func:`eventlane.log.embedded.recovery.recover`).
        """
        self.dir = directory
        self._dir_str = os.fspath(directory)
        self.topic = topic
        self._tally: Tally | None = None  # this topic's metrics tally, once metrics are on
        self.partition = partition
        self.config = config
        self.notifier = notifier
        self.clock = clock
        try:  # never creates the directory: a deleted topic's must not come back
            self.state = PartitionState(
                directory / "state",
                on_stuck=self._wait_for_writer,
                on_remap=lambda: FDS.opened(self),
            )
        except FileNotFoundError:
            raise self._deleted_error() from None
        self._append_lock = FileLock(directory / "lock")
        self.on_met: Callable[[], None] | None = None
        """Called when an append finds another process holding the append lock (the
        store's relay counts these: :mod:`.relay`)."""
        self._sync_lock = FileLock(directory / "sync.lock")
        self._maintenance = FileLock(directory / "cleaner.lock")
        self._log = log.bind(topic=topic, partition=partition)
        # Writer cache (valid while holding the lock and layout matches).
        self._w_layout = -1
        self._w_fd = -1
        self._w_base = -1
        self._w_index_fd = -1
        self._w_time_fd = -1
        # Reader cache.
        self._r_layout = -1
        self._r_bases: list[int] = []
        self._r_fds: dict[int, int] = {}
        self._r_indexes: dict[int, OffsetIndex] = {}
        self._r_contiguous = True
        """Whether every batch starts where the previous one ended (never compacted)."""
        self._r_lock = threading.Lock()
        self.last_used = next_use()
        """When this partition was last locked or read (an ever-increasing counter)."""
        self._combine_lock = threading.Lock()
        self._waiting: list[_Append] = []
        """Appends of this process waiting to be written as one group (``combine=True``)."""
        self._failed: OSError | None = None
        """Set when an fsync failed: appends are refused until the partition is reopened."""
        self._skip_lost = skip_lost_offsets
        if not skip_lost_offsets and self._healthy():
            # nothing to recover: opened without waiting for the append lock (module docstring)
            FDS.opened(self)  # the state's mapping holds a descriptor
            self._tidy_if_free()
            return
        with self.locked() as opened:
            if skip_lost_offsets and self._skip_lost:  # not recovered by locked() itself
                self._recover_locked()
        self._skip_lost = False
        snap = self.state.read() if opened.hwm < opened.leo else opened
        if snap.hwm < snap.leo and not self.state.read_only:
            # records of an appender that died between its write and its fsync: make them
            # durable now, as recovery does for the complete batches it finds (a failed fsync
            # here leaves the partition read-only in this process, readable as it was)
            with contextlib.suppress(PartitionReadOnlyError):
                self._await_durable(snap.leo, snap.epoch)
                self.notifier.bump()

    def _healthy(self) -> bool:
        """Whether the partition needs no repair to be read (written on this boot, no change
        left half done, the active segment as long as the state says): then it is opened
        without the append lock, which a reader stopped while opening would otherwise hold
        (issue 26: a consumer frozen by SIGSTOP there stopped a producer for 14 minutes).
        Bytes past the state's ``active_size`` and records written but not yet durable are
        left to :meth:`_tidy_if_free`, else to the next appender."""
        if self.state.deleted:
            raise self._deleted_error()
        if self.state.torn or not self.state.has_magic():
            return False
        snap = self.state.read()
        if snap.boot != BOOT or snap.layout & 1:
            return False
        try:
            size = os.stat(log_path(self.dir, snap.active_base)).st_size
        except FileNotFoundError:
            return False
        return size >= snap.active_size

    def _tidy_if_free(self) -> None:
        """Finish what an appender that died left, where nobody holds the locks it takes:
        bytes past the state's ``active_size`` are truncated under the append lock
        (:meth:`_sync_locked`), and records written but not yet durable are fsynced under
        ``sync.lock`` and published (their appender died between its write and its fsync,
        or is about to fsync them: one fsync covers them either way). A lock taken means an
        appender at work, which does it. Never waits for a lock (an open by a reader must
        not: module docstring)."""
        if self.state.read_only:
            return
        snap = self.state.read()
        if self._tail_past(snap):
            with self._append_lock.hold(blocking=False) as held:
                if held:
                    self.last_used = next_use()
                    snap = self._sync_locked()
        if snap.hwm < snap.leo:
            with contextlib.suppress(PartitionReadOnlyError):
                self._await_durable(snap.leo, snap.epoch, wait=False)
                self.notifier.bump()

    def _tail_past(self, snap: Snapshot) -> bool:
        """Whether the active segment holds bytes past the state's ``active_size``."""
        try:
            return os.stat(log_path(self.dir, snap.active_base)).st_size > snap.active_size
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------------ locking and sync
    @contextlib.contextmanager
    def locked(self) -> Iterator[Snapshot]:
        """Hold the append lock (threads and processes) with the state made consistent."""
        lock = self._append_lock
        if not lock.acquire(blocking=False):
            self.state.mark_contended()  # the holder shares its fsync with us (group commit)
            if not lock.held and self.on_met is not None:  # not a thread of ours: a process
                self.on_met()
            lock.acquire()
        try:
            self.last_used = next_use()
            yield self._sync_locked()
        finally:
            lock.release()

    @contextlib.contextmanager
    def maintenance_lock(self) -> Iterator[None]:
        """Hold the maintenance lock (``cleaner.lock``): one compaction or retention pass
        at a time, in any process. Lock order: maintenance lock, then the append lock."""
        try:
            with self._maintenance:
                yield
        finally:
            self._maintenance.release_fd()  # rarely used: no descriptor kept for it

    def _deleted_error(self) -> UnknownTopicError:
        return UnknownTopicError(
            f"topic {self.topic!r} was deleted after this process opened it (it may have been"
            " re-created since: that is another topic); nothing was appended or read",
            topic=self.topic,
            partition=self.partition,
        )

    def _check_writable(self, what: str) -> None:
        if self.state.read_only:
            raise ReadOnlyDataError(
                f"cannot {what}: the data directory is read-only",
                topic=self.topic,
                partition=self.partition,
                path=self.dir,
            )

    def _wait_for_writer(self) -> None:
        """A reader saw a change in progress for too long (an odd ``seq`` or layout): repair
        it if its writer died, else let the reader wait on. Never waits for the append lock
        (lock order, module docstring): the caller may hold a lock a live writer needs next
        (the key index's), and that writer may just be descheduled mid-change.

        The append lock free means nobody is changing anything: a change left half done is
        a dead writer's, and taking the lock repairs it (:meth:`_sync_locked`). The lock
        taken means a live writer (a ``flock`` dies with its process) that will finish; a
        dead writer's change left behind while another holds the lock is repaired by that
        holder's next :meth:`locked` (or by ours, once it lets go)."""
        if not self._change_in_progress():
            return  # finished meanwhile: nothing to repair, no lock taken
        lock = self._append_lock
        if lock.acquire(blocking=False):
            try:
                self.last_used = next_use()
                self._sync_locked()
            finally:
                lock.release()
        else:
            time.sleep(0.001)

    def _change_in_progress(self) -> bool:
        """Whether the state or the segment layout is in the middle of a change now."""
        return self.state.torn or bool(self.state.read_unchecked().layout & 1)

    def _sync_locked(self) -> Snapshot:
        if self.state.deleted:
            raise self._deleted_error()
        if self.state.torn:  # seq left odd under the lock: a writer died inside write()
            self._log.warning("state update interrupted; recovering")
            return self._recover_locked()
        snap = self.state.read()
        if snap.boot != BOOT or not self.state.has_magic():  # not written on this boot
            return self._recover_locked()
        if snap.layout & 1:
            # Only the lock holder makes the layout odd (a roll creating files, a compaction
            # swap renaming them) and it makes it even again before unlocking: it died midway.
            self._log.warning("segment layout change interrupted; recovering", layout=snap.layout)
            return self._recover_locked()
        if snap.layout != self._w_layout:
            self._open_writer(snap)
        size = os.fstat(self._w_fd).st_size
        if size != snap.active_size:
            if size < snap.active_size:
                self._log.warning(
                    "active segment shorter than its state; recovering",
                    size=size,
                    expected=snap.active_size,
                )
                return self._recover_locked()
            self._truncate_tail_locked(snap, size)
        return snap

    def _open_writer(self, snap: Snapshot) -> None:
        self._close_writer()
        FDS.opened(self)
        base = snap.active_base
        flags = os.O_RDWR | os.O_CREAT
        self._w_fd, _ = open_rw_or_read_only(log_path(self.dir, base), flags)
        self._w_index_fd, _ = open_rw_or_read_only(index_path(self.dir, base), flags | os.O_APPEND)
        self._w_time_fd, _ = open_rw_or_read_only(
            timeindex_path(self.dir, base), flags | os.O_APPEND
        )
        self._w_base = base
        self._w_layout = snap.layout

    def _close_writer(self) -> None:
        for fd in (self._w_fd, self._w_index_fd, self._w_time_fd):
            if fd >= 0:
                os.close(fd)
        self._w_fd = self._w_index_fd = self._w_time_fd = -1
        self._w_layout = -1

    def _truncate_tail_locked(self, snap: Snapshot, size: int) -> None:
        """Drop bytes an appender wrote but never acknowledged (it died mid-append)."""
        if self.state.read_only:
            return  # not ours to fix on a read-only mount: readers stop at the HWM anyway
        self._log.warning(
            "truncating unacknowledged tail",
            file=str(log_path(self.dir, snap.active_base)),
            position=snap.active_size,
            bytes=size - snap.active_size,
        )
        Segment(self.dir, snap.active_base).truncate_to(self._w_fd, snap.active_size)

    # ------------------------------------------------------------------ recovery
    def _recover_locked(self) -> Snapshot:
        """Rebuild the state from the files after an unclean stop (:mod:`.recovery`)."""
        if self.state.read_only:
            raise ReadOnlyDataError(
                "the data directory is read-only, and this partition must be recovered first"
                " (its writer stopped uncleanly, or it was last written before a reboot):"
                " open it once with write access (e.g. `eventlane verify`), then read it here",
                topic=self.topic,
                partition=self.partition,
                path=self.dir,
            )
        self._close_writer()
        previous = self.state.read_unchecked() if self.state.has_magic() else None
        snap = recover(
            self.dir,
            topic=self.topic,
            partition=self.partition,
            config=self.config,
            previous=previous,
            maintenance=self._maintenance,
            clock=self.clock,
            logger=self._log,
            skip_lost=self._skip_lost,
        )
        self._skip_lost = False
        self.state.write(snap)
        self._open_writer(snap)
        return snap

    # ------------------------------------------------------------------ segment list
    # The only writers of the segment list and of the odd/even layout counter: a roll
    # (:meth:`_roll_locked`), a compaction swap (:meth:`replace_segments`), retention
    # (:meth:`delete_segments_below`) and recovery.
    def _bump_layout(self, snap: Snapshot, step: int) -> Snapshot:
        bumped = snap._replace(layout=snap.layout + step)
        self.state.write(bumped)
        return bumped

    def finish_interrupted_swap(self) -> None:
        """Apply the journal of a compaction that died after writing it, before cleaning again.

        The caller holds the maintenance lock, so no live cleaner owns the journal. Left in
        place, it would be replayed by a later recovery over the next run's own ``.cleaned``
        files (named by the same group bases, but covering other groups): overlapping
        segments.
        """
        if not (self.dir / JOURNAL).exists():
            return
        with self.locked() as snap:  # an odd layout is recovered here, journal replayed
            if not (self.dir / JOURNAL).exists():
                return
            self._bump_layout(snap, 1)
            try:
                finish_interrupted_swap(self.dir)
            finally:
                self._bump_layout(self.state.read(), 1)

    def replace_segments(self, groups: Sequence[Sequence[int]]) -> None:
        """Swap compacted segments in: each group ``[B, B2, ...]`` of consecutive closed
        segments is replaced by the staged ``B.*.cleaned`` files (already fsynced).

        Crash-safe: a journal naming every replacement is written durably, the layout is made
        odd (readers pause opening files), the files are renamed and the replaced segments
        unlinked, the layout is made even again, and the journal is removed. Recovery
        replays a journal left behind. The caller holds :meth:`maintenance_lock`.
        """
        self._check_writable("replace segments")
        if not (self.dir / COMPACTED).exists():  # from now on gaps between batches are legal
            write_atomic(self.dir / COMPACTED, b"")
        write_swap_journal(self.dir, groups)
        with self.locked() as snap:
            self._bump_layout(snap, 1)
            try:
                if PAUSE is not None:  # fault injection: descheduled with the layout odd
                    PAUSE("partition.swap")
                for group in groups:
                    apply_swap_group(self.dir, group[0], group)
                fsync_dir(self.dir)
            finally:
                self._bump_layout(self.state.read(), 1)
        remove_swap_journal(self.dir)

    def delete_segments_below(self, new_lwm: int) -> list[int]:
        """Advance the low-water mark to ``new_lwm`` (a segment base, at most the active
        one) and delete the segments wholly below it; return their bases.

        The new mark is written durably (``log-start-offset``) and published (layout + 2:
        readers reload their file lists) before any file is unlinked, so a crash in between
        leaves segments recovery deletes. The caller holds :meth:`maintenance_lock`.
        """
        self._check_writable("delete segments below")
        with self.locked() as snap:
            write_atomic(self.dir / LOG_START, str(new_lwm).encode())
            self.state.write(snap._replace(lwm=max(snap.lwm, new_lwm), layout=snap.layout + 2))
        bases = list_segment_bases(self.dir)
        doomed = [b for b, nxt in itertools.pairwise(bases) if nxt <= new_lwm]
        for base in doomed:
            Segment(self.dir, base).delete()
        return doomed

    # ------------------------------------------------------------------ append
    def append(
        self,
        records: Sequence[RecordTuple],
        *,
        precondition: Precondition | None = None,
        on_appended: AppendHook | None = None,
        atomic: bool = False,
        combine: bool = False,
    ) -> AppendResult:
        """Append ``records`` in order and return their offsets once they are durable.

        The records are framed into batches of at most ~1 MiB, written with one ``write``
        and (``flush_policy="always"``) one fsync, then published by moving the HWM. With
        ``atomic=True`` they must fit one batch, which a crash can never split.
        ``precondition(leo)`` runs under the append lock before anything is written, and
        ``on_appended(result)`` under the same lock once the records are published.

        Appends of every thread and process share fsyncs (group commit: the module
        docstring); a refused append waits until the records it was checked against are
        durable before it raises, so its caller can read what changed.

        ``combine=True`` (with ``atomic=True``) also writes them together, for conditional appends:
        appends of this process waiting for the lock are written by whichever holds it, one
        batch each, under one fsync, as long as their record keys are disjoint (an append
        whose keys meet one of the group's waits for the next group). Each keeps its own
        outcome: its precondition runs with the log end offset the group started at, so it
        must depend only on the history of its own records' keys (the event store's
        per-stream version check does); one that fails raises alone, the others are written.
        """
        if not M.on:
            return self._append(records, precondition, on_appended, atomic, combine).result()
        started = perf_counter()
        request = self._append(records, precondition, on_appended, atomic, combine)
        seconds = perf_counter() - started
        add_append(self._tally or self._new_tally(), request.count, request.nbytes, seconds)
        return request.result()

    def append_framed(self, records: FramedRecords) -> AppendResult | None:
        """:meth:`append` (not atomic, no precondition, no hook) of records that frame
        themselves (a Kafka producer's batch, transcoded in one C pass: no tuple per
        record), cut into the same batches as the same records' tuples would be and
        written the same way; ``None`` (nothing written) where :meth:`append` would refuse
        a record (:meth:`FramedRecords.cut`): append ``records.records()`` for its error."""
        cfg = self.config
        batches = records.cut(RECORD_OVERHEAD, MAX_BATCH_BYTES, cfg.max_record_bytes, cfg.compact)
        if batches is None:
            return None
        if not batches:
            raise InvalidRecordError(
                "nothing to append", topic=self.topic, partition=self.partition
            )
        self._check_writable("append")
        started = perf_counter() if M.on else 0.0
        request = self._write_alone(_Append(batches, len(records), None, None))
        if M.on:
            seconds = perf_counter() - started
            add_append(self._tally or self._new_tally(), request.count, request.nbytes, seconds)
        return request.result()

    def count_appended(self, records: int, nbytes: int, seconds: float) -> None:
        """Count an append another process wrote for this one (the relay: :mod:`.relay`)
        in this process's metrics, as if written here."""
        add_append(self._tally or self._new_tally(), records, nbytes, seconds)

    def _new_tally(self) -> Tally:
        self._tally = tally(self.topic)
        return self._tally

    def _append(
        self,
        records: Sequence[RecordTuple],
        precondition: Precondition | None,
        on_appended: AppendHook | None,
        atomic: bool,
        combine: bool,
    ) -> _Append:
        """:meth:`append`'s work; the request, its result in ``pending``."""
        request = self._request(records, precondition, on_appended, atomic)
        if not (combine and atomic):
            return self._write_alone(request)
        self._write_combined([request])
        if request.error is not None:
            self._settle(request)
            raise request.error
        assert request.pending is not None
        self._await_durable(request.end, request.epoch)
        self.notifier.bump()  # the HWM moved (here, or under the lock): wake readers
        return request

    def _write_alone(self, request: _Append) -> _Append:
        """Write ``request`` by itself under the lock and wait until it is durable."""
        try:
            with self.locked() as snap:
                self._write_locked(snap, [request], raise_errors=True)
        except Exception:
            self._settle(request)
            raise
        assert request.pending is not None
        self._await_durable(request.end, request.epoch)
        self.notifier.bump()  # the HWM moved (here, or under the lock): wake readers
        return request

    def append_group(self, appends: Sequence[GroupedAppend]) -> list[AppendResult | Exception]:
        """Several atomic appends of one caller, ``(records, precondition, on_appended)``
        each, written as :meth:`append` with ``atomic=True, combine=True`` writes one, and
        each one's outcome (its offsets, or the exception :meth:`append` would raise) once
        every written one is durable: the groups are written under one hold of the lock
        and made durable by one fsync (an asyncio face hands a partition's waiting appends
        over together: :mod:`eventlane.log.embedded.aio`)."""
        outcomes: list[AppendResult | Exception | None] = [None] * len(appends)
        requests: list[tuple[int, _Append]] = []
        for i, (records, precondition, on_appended) in enumerate(appends):
            try:
                requests.append((i, self._request(records, precondition, on_appended, True)))
            except Exception as exc:
                outcomes[i] = exc
        started = perf_counter() if M.on else 0.0
        if requests:
            self._write_combined([r for _, r in requests])
        written = [r for _, r in requests if r.error is None]
        for request in sorted(written, key=lambda r: -r.end):  # the furthest first: one fsync
            try:
                self._await_durable(request.end, request.epoch)
            except Exception as exc:  # a failed fsync: thrown away, not acknowledged
                request.error = exc
        for i, request in requests:
            if request.error is None:
                outcomes[i] = request.result()
                continue
            if request.refused:
                self._settle(request)
            outcomes[i] = request.error
        if written:
            self.notifier.bump()  # the HWM moved: wake readers
        if M.on:
            seconds = perf_counter() - started
            counts = self._tally or self._new_tally()
            for request in written:
                if request.error is None:
                    add_append(counts, request.count, request.nbytes, seconds)
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def _request(
        self,
        records: Sequence[RecordTuple],
        precondition: Precondition | None,
        on_appended: AppendHook | None,
        atomic: bool,
    ) -> _Append:
        """An append's request, its records checked and framed (not yet written)."""
        if not records:
            raise InvalidRecordError(
                "nothing to append", topic=self.topic, partition=self.partition
            )
        self._check_writable("append")
        batches = self._split(records)
        if atomic and len(batches) > 1:
            raise RecordTooLargeError(
                f"an atomic append of {len(records)} records exceeds one batch "
                f"({MAX_BATCH_BYTES} bytes)",
                topic=self.topic,
                partition=self.partition,
            )
        return _Append(batches, len(records), precondition, on_appended)

    def _write_combined(self, requests: list[_Append]) -> None:
        """Write ``requests`` (atomic, of one caller) in groups with this process's other
        waiting appends (``combine=True``: :meth:`append`), under one hold of the lock;
        each one's ``pending`` or ``error`` set, none yet durable."""
        for request in requests:
            request.keys = frozenset(
                r[0]
                for b in request.batches
                if not isinstance(b, FramedBatch)  # (never: append_framed does not combine)
                for r in b
                if r[0] is not None
            )
        with self._combine_lock:
            self._waiting.extend(requests)
        try:
            with self.locked() as first:
                snap = first
                while any(r.pending is None and r.error is None for r in requests):
                    self._write_locked(snap, self._next_group(), raise_errors=False)
                    if any(r.pending is None and r.error is None for r in requests):
                        snap = self._sync_locked()  # the rest wait for the next group
        except Exception as exc:
            # the lock (or the state under it) failed us: ours still waiting were not written;
            # one another holder took and has not settled yet may be (outcome unknown)
            with self._combine_lock:
                waiting = {id(r) for r in self._waiting}
                self._waiting = [r for r in self._waiting if r not in requests]
            for request in requests:
                if request.pending is None and request.error is None:
                    request.error = exc if id(request) in waiting else self._unknown_error(exc)

    def _unknown_error(self, exc: Exception) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            f"this append was handed to another thread's write, then {exc}: it may have been"
            " written; read the key before deciding again",
            topic=self.topic,
            partition=self.partition,
        )

    def _next_group(self) -> list[_Append]:
        """The waiting appends with pairwise disjoint keys, oldest first."""
        group: list[_Append] = []
        rest: list[_Append] = []
        keys: set[bytes] = set()
        with self._combine_lock:
            for request in self._waiting:
                if keys.isdisjoint(request.keys):
                    group.append(request)
                    keys |= request.keys
                else:
                    rest.append(request)
            self._waiting = rest
        return group

    def _write_locked(self, snap: Snapshot, requests: list[_Append], *, raise_errors: bool) -> None:
        """Write ``requests`` after ``snap``'s end under one fsync (see :meth:`append`); set
        each one's result or error. ``raise_errors``: raise a single append's error instead."""
        cfg = self.config
        try:
            if self._failed is not None:
                raise self._read_only_error()
            now = self.clock()
            leo = snap.leo
            size = snap.active_size
            max_ts = snap.active_max_ts
            last_index_pos = snap.last_index_pos
            active_base = snap.active_base
            created = snap.active_created_ms
            layout = snap.layout
            hwm, synced = snap.hwm, snap.durable_size
            pending: list[bytes] = []
            pending_start = size
            index_entries: list[bytes] = []
            time_entries: list[bytes] = []
            ts_type = 1 if cfg.log_append_time else 0
            written: list[_Append] = []
            for request in requests:
                if request.precondition is not None:
                    try:
                        request.precondition(snap.leo)
                    except Exception as exc:
                        request.refused = True
                        request.end, request.epoch = snap.leo, snap.epoch
                        if raise_errors:
                            raise
                        request.error = exc
                        continue
                timestamps: list[int] = []
                base = leo
                for chunk in request.batches:
                    if not isinstance(chunk, FramedBatch):  # (append_framed's: no tuples)
                        # resolved timestamps as a column of ints: no tuple per record (a
                        # tracked object each, which the cyclic GC would walk)
                        stamps = [now if (ts_type or r[3] is None) else r[3] for r in chunk]
                    try:
                        if isinstance(chunk, FramedBatch):
                            raw, stamps = chunk.frame(leo, ts_type, now)
                        else:
                            raw = encode_batch(
                                leo, chunk, timestamp_type=ts_type, timestamps=stamps
                            )
                    except (TypeError, ValueError, OverflowError, struct.error) as exc:
                        error = InvalidRecordError(
                            f"cannot encode record: {exc}",
                            topic=self.topic,
                            partition=self.partition,
                            offset=leo,
                        )
                        if raise_errors or len(request.batches) > 1:
                            raise error from None
                        request.error = error
                        break
                    if size > 0 and (
                        size + len(raw) > cfg.segment_bytes or now - created >= cfg.segment_ms
                    ):
                        self._write_pending(pending_start, pending, index_entries, time_entries)
                        pending, index_entries, time_entries = [], [], []
                        layout = self._roll_locked(leo, now).layout  # fsyncs what went before
                        active_base, size, max_ts, last_index_pos, created = leo, 0, -1, 0, now
                        hwm, synced = leo, 0
                        pending_start = 0
                    if size == 0 or size - last_index_pos >= cfg.index_interval_bytes:
                        index_entries.append(OFFSET_ENTRY.pack(leo - active_base, size))
                        time_entries.append(TIME_ENTRY.pack(max_ts, leo - active_base))
                        last_index_pos = size
                    pending.append(raw)
                    size += len(raw)
                    request.nbytes += len(raw)
                    max_ts = max(max_ts, *stamps)
                    timestamps.extend(stamps)
                    leo += len(chunk)
                if request.error is None:
                    request.pending = AppendResult(base, leo - 1, timestamps)
                    written.append(request)
            if not written:
                return
            self._write_pending(pending_start, pending, index_entries, time_entries)
            if PAUSE is not None:  # fault injection (tests): written, not yet published
                PAUSE("partition.append.written")
            if cfg.flush_policy != "always":  # durable by the policy's own schedule
                hwm, synced = leo, size
            elif not self.state.contended_within(CONTENDED_MS):
                # alone: fsync holding the lock (the HWM then covers anything in flight too)
                if M.on:
                    started = time.perf_counter()
                    self._durable(os.fdatasync, self._w_fd)
                    fsynced(self.topic, time.perf_counter() - started, leo - hwm)
                else:
                    self._durable(os.fdatasync, self._w_fd)
                hwm, synced = leo, size
            self.state.write(
                Snapshot(
                    lwm=snap.lwm,
                    hwm=hwm,
                    leo=leo,
                    active_base=active_base,
                    active_size=size,
                    layout=layout,
                    active_max_ts=max_ts,
                    last_index_pos=last_index_pos,
                    active_created_ms=created,
                    boot=snap.boot,
                    epoch=snap.epoch,
                    synced_size=synced,
                )
            )
        except Exception as exc:
            for request in requests:
                request.pending = None
            if raise_errors:
                raise
            for request in requests:  # nothing of the group was acknowledged
                if request.error is None:
                    request.error = exc
            return
        hooks: list[tuple[AppendHook, AppendResult]] = []
        for request in written:  # written, in flight until _await_durable
            request.end, request.epoch = leo, snap.epoch
            if request.on_appended is not None and request.pending is not None:
                hooks.append((request.on_appended, request.pending))
        if hooks:
            if PAUSE is not None:  # fault injection: published, before the key index
                PAUSE("partition.append.hooks")
            self._run_hooks(hooks)

    def _run_hooks(self, hooks: list[tuple[AppendHook, AppendResult]]) -> None:
        """Call the appended requests' hooks (under the lock). Hooks of one group with the
        same ``group`` attribute run as one ``together`` call (the key index: one
        transaction for the group). A failing hook is logged; the appends stand."""
        group = getattr(hooks[0][0], "group", None)
        joint = (
            group is not None
            and len(hooks) > 1
            and all(getattr(hook, "group", None) is group for hook, _ in hooks[1:])
        )
        for batch in [hooks] if joint else [[h] for h in hooks]:
            try:
                if len(batch) > 1:
                    batch[0][0].together(batch)  # type: ignore[attr-defined]
                else:
                    batch[0][0](batch[0][1])
            except Exception:
                self._log.exception(
                    "append hook failed (the append itself goes on)",
                    offset=batch[0][1].base_offset,
                )

    def _settle(self, request: _Append) -> None:
        """Before a refused append raises: wait until the records it was checked against
        are durable, so that the caller, reading what changed, sees them (they may be in
        flight: written by another appender, not yet fsynced)."""
        if request.refused:
            with contextlib.suppress(PartitionReadOnlyError):
                self._await_durable(request.end, request.epoch)

    def _await_durable(self, end: int, epoch: int, *, wait: bool = True) -> None:
        """Return once every offset below ``end`` is durable (the HWM reached it), syncing
        if nobody else has: group commit across threads and processes (module docstring).
        ``wait=False``: sync only if ``sync.lock`` and then ``lock`` are free, else return
        at once (an open tidying after a dead appender, :meth:`_tidy_if_free`).

        Raises :class:`~eventlane.errors.PartitionReadOnlyError` if the records were thrown
        away because an fsync failed (here or in another process).
        """
        snap = self.state.read()
        if snap.hwm >= end and snap.epoch == epoch:
            return
        with self._sync_lock.hold(blocking=wait) as syncing:
            if not syncing:
                return
            snap = self.state.read()
            if snap.epoch != epoch:
                raise self._lost_error(end)
            if snap.hwm >= end:
                return
            # one fdatasync makes every batch written so far durable, others' included
            target, base, size = snap.leo, snap.active_base, snap.active_size
            try:
                fd = os.open(f"{self._dir_str}/{segment_stem(base)}{LOG_SUFFIX}", os.O_RDONLY)
            except FileNotFoundError:  # rolled and compacted away meanwhile: fsynced then
                fd = -1
            if fd >= 0:
                started = time.perf_counter() if M.on else 0.0
                try:
                    os.fdatasync(fd)
                except OSError as exc:
                    self._sync_failed(exc, epoch)
                    raise self._read_only_error() from exc
                finally:
                    os.close(fd)
                if M.on:  # its records: counted when published, below
                    fsynced(self.topic, time.perf_counter() - started, 0)
            if PAUSE is not None:  # fault injection: synced, HWM not yet published
                PAUSE("partition.synced")
            with self._append_lock.hold(blocking=False) as held:
                if held:  # free: published before the next appender may sync
                    self._publish(target, size, epoch, end)
                    return
        # The append lock is busy (an appender writing): wait for it with sync.lock let go,
        # so that appender's fsync need not wait for this publication (two processes took
        # turns at sync.lock, each holding it ~100 us longer for the other's write). The
        # records are durable already; a later fsync may publish past them first.
        with self._append_lock.hold(blocking=wait) as held:
            if held:  # (else durable now; the next appender's sync publishes it)
                self._publish(target, size, epoch, end)

    def _publish(self, target: int, size: int, epoch: int, end: int) -> None:
        """Move the HWM to ``target`` (``size`` bytes of the active segment durable) after an
        fsync made the records below it durable, unless it is there already. Hold the append
        lock. Raises the lost error when a failed fsync threw in-flight records away since
        (the epoch moved): they are not acknowledged."""
        now = self.state.read()
        if now.layout & 1 or self.state.torn:  # a changer died: recover first
            now = self._sync_locked()
        if now.epoch != epoch:
            raise self._lost_error(end)
        published = target - now.hwm  # else a roll (which fsyncs) or a later sync covered it
        if published > 0:
            self.state.write(now._replace(hwm=target, synced_size=size))
        if M.on and published > 0:  # the records this fsync made durable
            fsynced(self.topic, None, published)

    def _sync_failed(self, exc: OSError, epoch: int) -> None:
        """An fsync outside the append lock failed: throw every in-flight record away (see
        :meth:`_durable`) unless someone already did, and refuse appends here."""
        self._failed = exc
        with self.locked() as snap:
            if snap.epoch == epoch:
                self._discard_in_flight_locked(snap, exc)

    def _discard_in_flight_locked(self, snap: Snapshot, exc: OSError) -> None:
        """Cut the active segment back to its durable size, the LEO back to the HWM, bump
        the epoch (waiting appenders learn their records are gone) and leave the layout odd
        (the next lock holder in any process recovers from the files). Hold the lock."""
        self._log.error(
            "fsync failed: partition is read-only until reopened",
            error=str(exc),
            file=str(log_path(self.dir, snap.active_base)),
            hwm=snap.hwm,
            in_flight=snap.leo - snap.hwm,
        )
        with contextlib.suppress(OSError):
            Segment(self.dir, snap.active_base).truncate_to(self._w_fd, snap.durable_size)
        self.state.write(
            snap._replace(
                leo=snap.hwm,
                active_size=snap.durable_size,
                epoch=snap.epoch + 1,
                layout=snap.layout | 1,
            )
        )
        self._close_writer()

    def _lost_error(self, end: int) -> PartitionReadOnlyError:
        return PartitionReadOnlyError(
            "an fsync of this partition failed (in this or another process) while this"
            f" append waited for its own: its records (below offset {end}) may have been"
            " thrown away, so it is not acknowledged (like a producer's timeout: they may"
            " also be there)",
            topic=self.topic,
            partition=self.partition,
            path=self.dir,
        )

    def _durable(self, sync: Callable[[int], None], fd: int) -> None:
        """``sync(fd)``; if it fails, the partition goes read-only (the fsyncgate rule).

        After a failed fsync the kernel may have dropped the dirty pages and marked them
        clean, so a retry can succeed without the data being on disk: nothing written since
        the last acknowledged append is ever acknowledged. The unacknowledged bytes (every
        in-flight record, in any process) are cut off (:meth:`_discard_in_flight_locked`)
        and this object refuses appends until it is reopened. Caller holds the append lock.
        """
        try:
            sync(fd)
        except OSError as exc:
            self._failed = exc
            self._discard_in_flight_locked(self.state.read(), exc)
            raise self._read_only_error() from exc

    def _read_only_error(self) -> PartitionReadOnlyError:
        return PartitionReadOnlyError(
            f"an fsync of this partition failed ({self._failed}): nothing written since the"
            " last acknowledged append is acknowledged, and appends are refused until the"
            " partition is reopened (which recovers it from its files)",
            topic=self.topic,
            partition=self.partition,
            path=self.dir,
        )

    def _split(self, records: Sequence[RecordTuple]) -> list[Sequence[RecordTuple]]:
        """Cut ``records`` into batches of at most ``MAX_BATCH_BYTES`` (estimated sizes).

        The fast path sizes every record in one comprehension and finds the cuts by bisect;
        anything unusual (a malformed record, one over ``max_record_bytes``, a keyless record
        for a compacted topic) goes through :meth:`_split_checked`, which names the record.
        """
        try:
            sizes = [
                RECORD_OVERHEAD
                + (0 if k is None else len(k))
                + (0 if v is None else len(v))
                + (_headers_size(h) if h else 0)
                for k, v, h, _ in records
            ]
        except (TypeError, ValueError):
            return self._split_checked(records)
        if max(sizes) > self.config.max_record_bytes or (
            self.config.compact and any(r[0] is None for r in records)
        ):
            return self._split_checked(records)
        if sum(sizes) <= MAX_BATCH_BYTES:
            return [records]
        cumulative = list(itertools.accumulate(sizes))
        batches: list[Sequence[RecordTuple]] = []
        start, before, count = 0, 0, len(records)
        while start < count:
            end = max(bisect.bisect_right(cumulative, before + MAX_BATCH_BYTES, start), start + 1)
            batches.append(records[start:end])
            before = cumulative[end - 1]
            start = end
        return batches

    def _split_checked(self, records: Sequence[RecordTuple]) -> list[Sequence[RecordTuple]]:
        limit = self.config.max_record_bytes
        compact = self.config.compact
        batches = []
        start = 0
        acc = 0
        for i, r in enumerate(records):
            try:
                key, value, headers = r[0], r[1], r[2]
                size = (
                    RECORD_OVERHEAD
                    + (len(key) if key is not None else 0)
                    + (len(value) if value is not None else 0)
                )
                if headers:
                    size += _headers_size(headers)
            except (TypeError, ValueError, IndexError) as exc:
                raise InvalidRecordError(
                    f"record {i} is not (key: bytes|None, value: bytes|None, headers, "
                    f"timestamp): {exc}",
                    topic=self.topic,
                    partition=self.partition,
                ) from None
            if size > limit:
                raise RecordTooLargeError(
                    f"record {i} is {size} bytes; max_record_bytes is {limit}",
                    topic=self.topic,
                    partition=self.partition,
                )
            if compact and key is None:
                raise InvalidRecordError(
                    f"record {i} has no key; a compacted topic needs a key on every record",
                    topic=self.topic,
                    partition=self.partition,
                )
            if acc + size > MAX_BATCH_BYTES and i > start:
                batches.append(records[start:i])
                start, acc = i, 0
            acc += size
        batches.append(records[start:])
        return batches

    def _write_pending(
        self,
        start: int,
        pending: list[bytes],
        index_entries: list[bytes],
        time_entries: list[bytes],
    ) -> None:
        if not pending:
            return
        # One vectored write of the batches as they are: joining them first would copy
        # every appended byte once more.
        buffers: list[bytes | memoryview] = list(pending)
        pos = start
        while buffers:
            written = os.pwritev(self._w_fd, buffers[:_IOV_MAX], pos)
            pos += written
            done = 0
            while done < len(buffers) and written >= len(buffers[done]):
                written -= len(buffers[done])
                done += 1
            del buffers[:done]
            if written:
                buffers[0] = memoryview(buffers[0])[written:]
        if index_entries:
            os.write(self._w_index_fd, b"".join(index_entries))
            os.write(self._w_time_fd, b"".join(time_entries))

    def _roll_locked(self, new_base: int, now: int) -> Snapshot:
        """Close the active segment durably, start a new one at ``new_base`` (the LEO: every
        record before it is now fsynced), publish it and return the published state."""
        if M.on:
            started, hwm = time.perf_counter(), self.state.read().hwm
            self._durable(os.fsync, self._w_fd)
            fsynced(self.topic, time.perf_counter() - started, new_base - hwm)
        else:
            self._durable(os.fsync, self._w_fd)
        os.fsync(self._w_index_fd)
        os.fsync(self._w_time_fd)
        # An odd layout until the caller publishes the new active segment (layout + 2): if we
        # die in between, the next lock holder finds a segment file the state does not know
        # and recovers (see _sync_locked) instead of appending behind it.
        current = self.state.read()
        self.state.write(current._replace(layout=current.layout | 1))
        if PAUSE is not None:  # fault injection: descheduled with the layout odd
            PAUSE("partition.roll")
        Segment(self.dir, new_base).create()
        fsync_dir(self.dir)
        write_atomic(self.dir / RECOVERY_POINT, str(new_base).encode())
        published = current._replace(
            leo=new_base,
            hwm=new_base,
            active_base=new_base,
            active_size=0,
            layout=(current.layout | 1) + 1,
            active_max_ts=-1,
            last_index_pos=0,
            active_created_ms=now,
        )
        self.state.write(published)
        self._open_writer(published)
        self._log.debug("segment rolled", base=new_base)
        return published

    def roll(self) -> None:
        """Roll the active segment now if it holds any record (used by retention and tests)."""
        self._check_writable("roll a segment")
        with self.locked() as snap:
            if snap.active_size == 0:
                return
            self._roll_locked(snap.leo, self.clock())

    # ------------------------------------------------------------------ read
    def offsets(self) -> Snapshot:
        return self.state.read()

    # ------------------------------------------------------------------ inspection
    def segments(self) -> list[SegmentInfo]:
        """The segments now on disk, oldest first, with their sizes in bytes."""
        infos = []
        for base in list_segment_bases(self.dir):
            with contextlib.suppress(FileNotFoundError):
                infos.append(SegmentInfo(base, log_path(self.dir, base).stat().st_size))
        return infos

    def segment_max_timestamp(self, base: int, end: int) -> int:
        """Largest record timestamp of a closed segment (-1 if empty), from its last batches."""
        path = log_path(self.dir, base)
        index = OffsetIndex(index_path(self.dir, base))
        times = TimeIndex(timeindex_path(self.dir, base))
        start = index.positions[-1] if len(index.positions) else 0
        best = times.timestamps[-1] if times.timestamps else -1
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for ref in scan_batches(
                fd, path, start, size, topic=self.topic, partition=self.partition, verify_crc=False
            ):
                if ref.header.base_offset >= end:
                    break
                best = max(best, ref.header.max_timestamp)
        finally:
            os.close(fd)
        return best

    def contiguous(self) -> bool:
        """Whether every batch must start where the previous one ended: true unless the
        partition was ever compacted (the cleaner drops batches it empties, leaving gaps)."""
        return not self.config.compact and not (self.dir / COMPACTED).exists()

    def verify(self) -> list[CorruptRecordError]:
        """Check every batch of every segment and every index entry; return the problems
        (see :func:`eventlane.log.embedded.check.verify_files`)."""
        return verify_files(
            self.dir,
            self.state.read(),
            strict=self.contiguous(),
            topic=self.topic,
            partition=self.partition,
        )

    def release_fds(self) -> bool:
        """Close every descriptor this partition keeps between calls, unless a thread of
        this process is using it (then ``False``). They are reopened on next use."""
        if not self._append_lock.mutex.acquire(blocking=False):
            return False
        try:
            if self._append_lock.held or not self._r_lock.acquire(blocking=False):
                return False
            try:
                self._close_writer()
                for fd in self._r_fds.values():
                    os.close(fd)
                self._r_fds.clear()
                self._r_indexes.clear()
                self._r_layout = -1
                self._append_lock.release_fd()
                self._maintenance.release_fd()
                self.state.release()
            finally:
                self._r_lock.release()
        finally:
            self._append_lock.mutex.release()
        return True

    def mark_deleted(self) -> None:
        """Mark this incarnation deleted in every process that has it open (the topic is
        about to be renamed away): their appends and reads fail from now on."""
        with self._append_lock:
            self.state.mark_deleted()

    def close(self) -> None:
        with self._append_lock.mutex:
            self._close_writer()
            with self._r_lock:
                for fd in self._r_fds.values():
                    os.close(fd)
                self._r_fds.clear()
            self._append_lock.close()
            self._maintenance.close()
            self.state.close()
        FDS.forget(self)


def _headers_size(headers: Sequence[Header]) -> int:
    """An upper bound of the bytes ``headers`` take in a record (4 bytes per name char)."""
    return sum(8 + len(n) * 4 + (len(v) if v is not None else 0) for n, v in headers)
