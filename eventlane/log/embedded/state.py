"""Shared, memory-mapped state: a partition's offsets, and the data directory's wake-up word.

Every process that opens a partition maps the same ``state`` file, so appends made by one
process are seen by readers in others without a system call. File format of
``<partition dir>/state`` (128 bytes, little-endian)::

     0  uint32  seq                 seqlock: odd while a writer updates the fields below
     4  uint32  magic               0x314C5345 ("ESL1")
     8  int64   lwm                 low-water mark (log start offset)
    16  int64   hwm                 high-water mark: records below it are durable and readable
    24  int64   leo                 log end offset: the next offset to assign
    32  int64   active_base         base offset of the active (last) segment
    40  int64   active_size         bytes of complete batches in the active segment
    48  int64   layout              bumped whenever the segment list changes (roll, retention,
                                    compaction swap, truncation): readers reload their file list;
                                    odd while the lock holder creates or renames segment files
                                    (a roll, a compaction swap): readers wait, and a lock holder
                                    that finds it odd knows the changer died and recovers
    56  int64   active_max_ts       largest timestamp in the active segment (-1: none)
    64  int64   last_index_pos      file position of the active segment's last index entry
    72  int64   active_created_ms   when the active segment was created (segment_ms roll)
    80  uint64  boot                hash of the boot id that wrote the state (unclean reboot check)
    88  int64   epoch               bumped when records written but not yet durable are thrown
                                    away (a failed fsync): an appender waiting for its records
                                    to become durable learns they are gone
    96  int64   synced_size         bytes of the active segment known durable, when hwm < leo
                                    (when hwm == leo: active_size)
   112  uint64  contended_ms        a hint, outside the seqlock: when (CLOCK_MONOTONIC, ms) an
                                    appender last found the append lock taken. While appenders
                                    queue, the lock holder fsyncs after letting go of the lock
                                    (group commit); alone, it fsyncs holding it (fewer steps)
   120  uint32  deleted             1 once the topic is being deleted: set (under the append lock)
                                    before the topic directory is renamed away, so a process that
                                    still has this incarnation mapped refuses to append to it or
                                    read it (outside the seqlock; never cleared)

Writers update fields only while holding the partition's append lock, inside a seqlock
(``seq`` odd → even); readers retry until they see the same even ``seq`` before and after.
A writer killed inside the seqlock leaves ``seq`` odd: the next lock holder rebuilds the state
(recovery), and a reader that waits too long takes the lock to make that happen, *if it is
free*. A reader never waits for the append lock: it may itself hold a lock the writer takes
after its update (the key index's, in an append hook), and the writer, descheduled inside
:meth:`PartitionState.write`, is alive and will finish (issue 26: two processes hung forever
when a reader did wait). See :mod:`.partition` for the engine's lock order.
The state is a cache of what the segment files say: it is never fsynced, and after a reboot
(``boot`` differs) or if it is missing, recovery rebuilds it from the files.

``<data>/.notify`` holds one uint32 that every append increments; waiting readers sleep on it
with a Linux futex (a shared-mapping futex works across processes) and are woken by the
appender, so a consumer at the high-water mark neither spins nor sleeps past an append. On
systems without futexes the wait degrades to short sleeps.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from eventlane._host import BOOT as BOOT  # noqa: PLC0414 (re-exported)
from eventlane._locks import READ_ONLY_ERRNOS, open_rw_or_read_only
from eventlane._pauses import PAUSE

if TYPE_CHECKING:
    import ctypes

STATE_SIZE = 128
MAGIC = 0x314C5345
_SEQ = struct.Struct("<I")
_FIELDS = struct.Struct("<qqqqqqqqqQqq")
_FIELDS_AT = 8
_MAGIC_AT = 4
_DELETED_AT = 120
_CONTENDED_AT = 112
_U64 = struct.Struct("<Q")


class Snapshot(NamedTuple):
    """A consistent copy of a partition's state fields."""

    lwm: int
    hwm: int
    leo: int
    active_base: int
    active_size: int
    layout: int
    active_max_ts: int
    last_index_pos: int
    active_created_ms: int
    boot: int
    epoch: int = 0
    synced_size: int = 0

    @property
    def durable_size(self) -> int:
        """Bytes of the active segment below the high-water mark (known durable)."""
        return self.active_size if self.hwm == self.leo else self.synced_size


class PartitionState:
    """The mapped ``state`` file of one partition (see the module docstring for the format)."""

    STUCK_S = 0.02
    """How long :meth:`read` waits on an odd ``seq`` before calling ``on_stuck``."""

    def __init__(
        self,
        path: Path,
        on_stuck: Callable[[], None] | None = None,
        on_remap: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.on_remap = on_remap
        """Called when the file is mapped again after :meth:`release` (descriptor budget)."""
        self.on_stuck = on_stuck
        """Called when a writer seems to have died mid-update (``seq`` stays odd, every
        :data:`STUCK_S`): it repairs what a dead writer left if the append lock is free,
        and must never wait for that lock (a live writer is only descheduled, and the
        reader may hold a lock that writer needs next: the module docstring's lock order)."""
        self._identity: tuple[int, int] | None = None
        self._gone = False
        self.read_only = False
        """The data directory cannot be written (a read-only mount): look, never write."""
        self._map: mmap.mmap | None = None
        self._open(create=True)

    def _open(self, *, create: bool = False) -> mmap.mmap:
        """Map the file (again, after :meth:`release`). A file that was replaced or removed
        meanwhile belongs to another incarnation of the partition: this one is then gone
        (:attr:`deleted`) and reads a private blank instead of the new incarnation's state."""
        try:
            fd, self.read_only = open_rw_or_read_only(
                self.path, os.O_RDWR | (os.O_CREAT if create else 0)
            )
        except FileNotFoundError:
            if create:
                raise
            return self._blank()
        try:
            st = os.fstat(fd)
            if self._identity is not None and (st.st_dev, st.st_ino) != self._identity:
                return self._blank()
            if st.st_size < STATE_SIZE and not self.read_only:
                os.ftruncate(fd, STATE_SIZE)
            self._identity = (st.st_dev, st.st_ino)
            # mmap keeps a duplicate of the descriptor while mapped: release() gives it back
            access = mmap.ACCESS_READ if self.read_only else mmap.ACCESS_DEFAULT
            self._map = mmap.mmap(fd, STATE_SIZE, access=access)
        finally:
            os.close(fd)
        if not create and self.on_remap is not None:
            self.on_remap()
        return self._map

    def _blank(self) -> mmap.mmap:
        self._gone = True
        self._map = mmap.mmap(-1, STATE_SIZE)
        _SEQ.pack_into(self._map, _DELETED_AT, 1)
        return self._map

    def release(self) -> None:
        """Unmap the file, giving its descriptor back (idle partitions, see
        :class:`~eventlane.log.embedded.partition.Partition`); it is mapped again on next use. A
        mapping still in use by a reader stays valid until that reader lets go of it."""
        m, self._map = self._map, None
        if m is not None:
            with contextlib.suppress(BufferError):
                m.close()

    @property
    def _m(self) -> mmap.mmap:
        return self._map or self._open()

    @property
    def deleted(self) -> bool:
        """Whether the topic of this state was deleted (this incarnation is gone)."""
        try:
            (word,) = _SEQ.unpack_from(self._map or self._open(), _DELETED_AT)
        except ValueError:  # released by another thread meanwhile: map it again
            (word,) = _SEQ.unpack_from(self._m, _DELETED_AT)
        return bool(word) or self._gone

    def mark_contended(self) -> None:
        """Note that an appender found the append lock taken (a hint: no lock needed)."""
        now = time.monotonic_ns() // 1_000_000
        with contextlib.suppress(ValueError, TypeError):  # released meanwhile, or read-only
            _U64.pack_into(self._map or self._open(), _CONTENDED_AT, now)

    def contended_within(self, ms: int) -> bool:
        """Whether an appender found the append lock taken in the last ``ms``."""
        try:
            (when,) = _U64.unpack_from(self._map or self._open(), _CONTENDED_AT)
        except ValueError:
            return True
        return bool(time.monotonic_ns() // 1_000_000 - when < ms)

    def mark_deleted(self) -> None:
        """Mark this incarnation deleted (caller holds the partition's append lock)."""
        _SEQ.pack_into(self._m, _DELETED_AT, 1)

    def has_magic(self) -> bool:
        """Whether the file was ever written by a writer (on any boot)."""
        (magic,) = _SEQ.unpack_from(self._m, _MAGIC_AT)
        return bool(magic == MAGIC)

    @property
    def torn(self) -> bool:
        """Whether ``seq`` is odd. Under the append lock this means the last writer died in
        the middle of :meth:`write`: the fields may be half old, half new."""
        (seq,) = _SEQ.unpack_from(self._m, 0)
        return bool(seq & 1)

    @property
    def initialized(self) -> bool:
        """Whether the file holds a state written on this boot."""
        (magic,) = _SEQ.unpack_from(self._m, _MAGIC_AT)
        return magic == MAGIC and self.read().boot == BOOT

    def read(self) -> Snapshot:
        m = self._map or self._open()
        unpack_seq = _SEQ.unpack_from
        odd_since = 0.0
        nap = 0.0
        while True:
            try:
                (before,) = unpack_seq(m, 0)
            except ValueError:  # released by another thread meanwhile: map it again
                m = self._map or self._open()
                continue
            if before & 1:
                now = time.monotonic()
                if not odd_since:
                    odd_since = now
                elif now - odd_since > self.STUCK_S and self.on_stuck is not None:
                    self.on_stuck()  # never waits for the append lock (lock order)
                    odd_since = now
                    nap = 0.0005  # a writer descheduled this long: stop spinning
                time.sleep(nap)
                continue
            fields = _FIELDS.unpack_from(m, _FIELDS_AT)
            (after,) = unpack_seq(m, 0)
            if before == after:
                return Snapshot(*fields)

    def read_unchecked(self) -> Snapshot:
        """The fields as they are, even if :attr:`torn` (for recovery, under the lock)."""
        return Snapshot(*_FIELDS.unpack_from(self._m, _FIELDS_AT))

    def hwm(self) -> int:
        return self.read().hwm

    def write(self, snapshot: Snapshot) -> None:
        """Publish ``snapshot``. Caller holds the partition's append lock."""
        m = self._m
        (seq,) = _SEQ.unpack_from(m, 0)
        _SEQ.pack_into(m, 0, (seq + 1) & 0xFFFFFFFF | 1)
        if PAUSE is not None:  # fault injection (tests): descheduled mid-update
            PAUSE("state.write")
        _FIELDS.pack_into(m, _FIELDS_AT, *snapshot)
        _SEQ.pack_into(m, _MAGIC_AT, MAGIC)
        _SEQ.pack_into(m, 0, (seq + 2) & 0xFFFFFFFE)

    def close(self) -> None:
        self.release()


_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    os.uname().machine.lower()
)
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WORD = struct.Struct("=I")  # the wake-up word: native order, as the futex reads it


class _Futex(NamedTuple):
    """libc's ``syscall`` and the ``ctypes`` module that calls it."""

    syscall: Any
    ctypes: Any


@functools.cache
def _futex() -> _Futex | None:
    """The futex system call, loaded on first use (``None`` where there is none).

    Loaded lazily: ``ctypes`` costs every command that opens a log a few milliseconds of
    start-up, and only appending and waiting use the futex."""
    return _load_syscall()


def _load_syscall() -> _Futex | None:
    if _SYS_FUTEX is None or not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415 - only appending and waiting need it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = libc.syscall
    fn.restype = ctypes.c_long
    return _Futex(fn, ctypes)


class Notifier:
    """The data directory's wake-up word (``<data>/.notify``): bump after append, wait for it.

    On a data directory this process cannot write (a read-only mount), the word is a private
    copy that never changes: :meth:`wait` sleeps its timeout (nothing can append there)."""

    def __init__(self, path: Path) -> None:
        try:
            fd, read_only = open_rw_or_read_only(path)
        except OSError as exc:  # a read-only directory without the file
            if exc.errno not in READ_ONLY_ERRNOS:
                raise
            fd, read_only = -1, True
        try:
            if read_only:
                self._map = mmap.mmap(-1, 64)  # a word of our own: nothing can append here
            else:
                if os.fstat(fd).st_size < 64:
                    os.ftruncate(fd, 64)
                self._map = mmap.mmap(fd, 64)
        finally:
            if fd >= 0:
                os.close(fd)
        self._word: ctypes.c_uint32 | None = None  # made by the first futex call
        self._addr = 0

    def _address(self, futex: _Futex) -> Any:
        """The word's address for the futex (a ``c_void_p``), made on first use."""
        if self._word is None:
            self._word = futex.ctypes.c_uint32.from_buffer(self._map, 0)
            self._addr = futex.ctypes.addressof(self._word)
        return futex.ctypes.c_void_p(self._addr)

    def value(self) -> int:
        return int(_WORD.unpack_from(self._map, 0)[0])

    def bump(self) -> None:
        """Signal that something was appended; wakes every waiter in every process."""
        _WORD.pack_into(self._map, 0, (self.value() + 1) & 0xFFFFFFFF)
        futex = _futex()
        if futex is not None:
            futex.syscall(_SYS_FUTEX, self._address(futex), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until the word differs from ``seen`` or ``timeout`` seconds pass.

        May return early (spurious wake-ups); callers re-check what they wait for.
        """
        if timeout <= 0:
            return
        futex = _futex()
        if futex is None:
            deadline = time.monotonic() + timeout
            while self.value() == seen and time.monotonic() < deadline:
                time.sleep(min(0.001, timeout))
            return
        ctypes_ = futex.ctypes
        ts = (ctypes_.c_long * 2)(int(timeout), int((timeout % 1) * 1e9))  # struct timespec
        futex.syscall(
            _SYS_FUTEX,
            self._address(futex),
            _FUTEX_WAIT,
            ctypes_.c_uint32(seen),
            ctypes_.byref(ts),
            None,
            0,
        )

    def close(self) -> None:
        self._word = None
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
