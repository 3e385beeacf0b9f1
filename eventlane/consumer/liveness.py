"""The ``live`` file of a group: a change counter and one heartbeat slot per member.

Memory-mapped by every process that works with the group, so a heartbeat is one memory
write and noticing a group change is one memory read. Format (little-endian; a 64-byte
header, then :data:`MAX_MEMBERS` slots of 32 bytes)::

    header  0  uint32  magic      0x31474C45 ("ELG1")
            8  uint64  version    bumped after every replacement of state.json
           16  uint64  boot       boot hash of the machine boot that initialised the slots
    slot    0  uint64  token      random id of the member using the slot (0: free)
            8  int64   beat_ns    CLOCK_MONOTONIC of the member's last heartbeat
           16  int64   poll_ns    CLOCK_MONOTONIC of the member's last poll() (diagnostics)
           24  uint32  pid

Every field is an aligned 8- or 4-byte word written with one store, so a reader never sees
half of one. ``version`` is written only under the group lock; a slot's ``token`` only by
the member claiming it (under the lock) or by whoever frees it (under the lock); ``beat_ns``
only by the member whose token is in the slot.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from pathlib import Path

from eventlane._host import BOOT

__all__ = ["LIVE_SIZE", "MAX_MEMBERS", "LiveFile"]

MAX_MEMBERS = 1024
MAGIC = 0x31474C45
HEADER_SIZE = 64
SLOT_SIZE = 32
LIVE_SIZE = HEADER_SIZE + MAX_MEMBERS * SLOT_SIZE


class _Header(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("version", ctypes.c_uint64),
        ("boot", ctypes.c_uint64),
    ]


class _Slot(ctypes.Structure):
    _fields_ = [
        ("token", ctypes.c_uint64),
        ("beat_ns", ctypes.c_int64),
        ("poll_ns", ctypes.c_int64),
        ("pid", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
    ]


class LiveFile:
    """The mapped ``live`` file (see the module docstring). Word stores are single 8-byte
    aligned writes, so a reader never sees half of one."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < LIVE_SIZE:
                os.ftruncate(fd, LIVE_SIZE)
            self._map = mmap.mmap(fd, LIVE_SIZE)
        finally:
            os.close(fd)
        self.header = _Header.from_buffer(self._map, 0)
        self.slots = (_Slot * MAX_MEMBERS).from_buffer(self._map, HEADER_SIZE)

    @property
    def version(self) -> int:
        return int(self.header.version)

    def reset_if_new_boot(self) -> bool:
        """Under the lock: forget every slot written on an earlier boot. True if it did."""
        if self.header.magic == MAGIC and self.header.boot == BOOT:
            return False
        ctypes.memset(ctypes.addressof(self.slots), 0, ctypes.sizeof(self.slots))
        self.header.boot = BOOT
        self.header.magic = MAGIC
        return True

    def claim(self, slot: int, token: int, now_ns: int) -> None:
        s = self.slots[slot]
        s.token = 0
        s.beat_ns = now_ns
        s.poll_ns = now_ns
        s.pid = os.getpid()
        s.token = token

    def beat(self, slot: int, token: int, now_ns: int) -> bool:
        """Store a heartbeat if the slot is still ours; False if it was taken from us."""
        s = self.slots[slot]
        if s.token != token:
            return False
        s.beat_ns = now_ns
        return True

    def polled(self, slot: int, token: int, now_ns: int) -> None:
        s = self.slots[slot]
        if s.token == token:
            s.poll_ns = now_ns

    def age_ns(self, slot: int, token: int, now_ns: int) -> int | None:
        """Nanoseconds since the slot's last heartbeat, or ``None`` if it is not ``token``'s
        or was written on an earlier boot of the machine (its member is certainly gone)."""
        s = self.slots[slot]
        if s.token != token or self.header.boot != BOOT:
            return None
        return now_ns - int(s.beat_ns)

    def free(self, slot: int, token: int) -> None:
        s = self.slots[slot]
        if s.token == token:
            s.token = 0

    def close(self) -> None:
        del self.header, self.slots
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
