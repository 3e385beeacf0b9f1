"""The relay process: it writes the conditional appends other processes hand it
(:mod:`.relay` says when and why; this module is the process).

``python -m eventlane.log.embedded.relay_server <data>`` takes ``<data>/relay.lock`` (or
exits at once: another relay serves), listens on ``<data>/relay.sock`` and serves from one
thread: it reads every request that arrived, writes each partition's appends together
(:meth:`~eventlane.log.embedded.store.LogStore.append_group_direct`: one hold of the lock,
one fsync, each append checked against its ``Expect`` and keeping its own outcome), then
answers them. It appends nothing of its own, and writes every key-index row at once (its
clients read them from the file).

Invariants: an answer says what the append did (offsets once durable, or the error it
raised); a request is answered at most once and only after it was read whole; a request
read is answered unless the relay dies (its clients then settle it: :mod:`.relay`). It
exits (unlinking its socket first, so no new client connects, then answering what it read)
once fewer than three client processes (:data:`~.relay.WRITERS_MIN`) sent a request in
:data:`IDLE_S` seconds, when the data
directory is gone or replaced, or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import contextlib
import fcntl
import marshal
import os
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from eventlane._stopflag import StopFlag
from eventlane.log.embedded.relay import (
    LEN,
    LOCK_NAME,
    MAX_FRAME,
    SOCKET_NAME,
    WRITERS_MIN,
    Item,
    answer,
    socket_address,
)
from eventlane.log.embedded.store import LogStore
from eventlane.log.types import Expect
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

IDLE_S = 5.0
"""The relay exits once fewer than :data:`~.relay.WRITERS_MIN` processes sent it a request
for this long."""
_PEERCRED = struct.Struct("3i")
_TICK_S = 0.5
_READ_BYTES = 1 << 20


class RelayServer:
    """The relay's loop over one data directory (module docstring)."""

    def __init__(self, root: Path, listener: socket.socket) -> None:
        self.root = root
        self.store = LogStore(root)
        self.store.keys.shared = True  # its clients read the rows from the file
        self._listener = listener
        self._sel = selectors.DefaultSelector()
        self._buffers: dict[socket.socket, bytearray] = {}
        # what a read takes in, allocated once (a fresh 1 MiB bytes a read is an mmap, a
        # shrinking mremap and a munmap: a third of the relay's system time)
        self._scratch = bytearray(_READ_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._peers: dict[socket.socket, int] = {}
        self._seen: dict[int, float] = {}  # client pid -> when it last asked
        self._uid = os.getuid()
        self._identity = _identity(root)
        self.stopping = StopFlag()  # set from a signal handler: it must take no lock

    def serve(self) -> None:
        sel = self._sel
        sel.register(self._listener, selectors.EVENT_READ)
        started = checked = time.monotonic()
        try:
            while not self.stopping.is_set():
                work: list[tuple[socket.socket, list[Any]]] = []
                for key, _ in sel.select(timeout=_TICK_S):
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    if sock is self._listener:
                        self._accept()
                    else:
                        work.extend(self._requests(sock))
                if work:
                    self._serve(work)
                now = time.monotonic()
                if now - checked >= _TICK_S:
                    checked = now
                    if now - started >= IDLE_S and self._idle(now):
                        log.info("fewer than three processes use the relay: exiting")
                        break
                    if _identity(self.root) != self._identity:
                        log.warning("the data directory is gone: the relay exits")
                        break
            self._finish()
        finally:
            self._close()

    def _idle(self, now: float) -> bool:
        active = [pid for pid, at in self._seen.items() if now - at < IDLE_S]
        return len(active) < WRITERS_MIN

    def _finish(self) -> None:
        """Stop taking clients, answer every request already sent, then stop."""
        with contextlib.suppress(OSError):  # ours: this process holds relay.lock
            os.unlink(self.root / SOCKET_NAME)
        self._sel.unregister(self._listener)
        while True:
            work: list[tuple[socket.socket, list[Any]]] = []
            for key, _ in self._sel.select(timeout=0.05):
                work.extend(self._requests(key.fileobj))  # type: ignore[arg-type]
            if not work:
                return
            self._serve(work)

    def _close(self) -> None:
        for sock in list(self._buffers):
            with contextlib.suppress(OSError):
                sock.close()
        self._listener.close()
        self._sel.close()
        self.store.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            pid, uid, _ = _PEERCRED.unpack(creds)
            if uid != self._uid:  # the socket file's permissions should have said no
                conn.close()
                continue
            conn.setblocking(False)
            self._buffers[conn] = bytearray()
            self._peers[conn] = pid
            self._sel.register(conn, selectors.EVENT_READ)

    def _requests(self, conn: socket.socket) -> list[tuple[socket.socket, list[Any]]]:
        buffer = self._buffers[conn]
        try:
            got = conn.recv_into(self._scratch)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            got = 0
        if not got:
            self._drop(conn)
            return []
        buffer += self._scratch_view[:got]
        found = []
        while len(buffer) >= LEN.size:
            (size,) = LEN.unpack_from(buffer)
            if size > MAX_FRAME:
                log.warning("the relay dropped a client: a request too large", size=size)
                self._drop(conn)
                return []
            if len(buffer) < LEN.size + size:
                break
            payload = bytes(buffer[LEN.size : LEN.size + size])
            del buffer[: LEN.size + size]
            try:
                found.append((conn, _items(marshal.loads(payload))))
            except (EOFError, ValueError, TypeError) as exc:
                log.warning("the relay dropped a client: a malformed request", error=str(exc))
                self._drop(conn)
                return []
        if found:
            self._seen[self._peers[conn]] = time.monotonic()
        return found

    def _drop(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn)
        self._buffers.pop(conn, None)
        self._peers.pop(conn, None)
        conn.close()

    def _serve(self, work: list[tuple[socket.socket, list[Any]]]) -> None:
        """Write what ``work`` asks, a partition's appends together under one fsync, and
        answer each request once its appends are durable."""
        by_partition: dict[tuple[str, int], list[tuple[int, int, Item]]] = {}
        for w, (_, items) in enumerate(work):
            for i, (topic, partition, records, key, last) in enumerate(items):
                by_partition.setdefault((topic, partition), []).append(
                    (w, i, (records, Expect(key, last)))
                )
        answers: list[list[Any]] = [[None] * len(items) for _, items in work]
        for (topic, partition), entries in by_partition.items():
            try:
                outcomes = self.store.append_group_direct(
                    topic, partition, [entry[2] for entry in entries]
                )
            except Exception as exc:  # the partition itself failed (unknown, deleted...)
                outcomes = [exc] * len(entries)
            for (w, i, _), result in zip(entries, outcomes, strict=True):
                answers[w][i] = answer(result)
        for (conn, _), reply in zip(work, answers, strict=True):
            body = marshal.dumps(reply)
            try:
                conn.sendall(LEN.pack(len(body)) + body)
            except OSError:  # its client is gone: it settles what it sent (.relay)
                self._drop(conn)


def _items(payload: Any) -> list[Any]:
    if not isinstance(payload, list):
        raise TypeError("a request is a list")
    for item in payload:
        if not (
            isinstance(item, tuple)
            and len(item) == 5
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and isinstance(item[2], list)
            and isinstance(item[3], bytes)
        ):
            raise TypeError("an item is (topic, partition, records, key, last_offset)")
    return payload


def _identity(root: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(root)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _listen(root: Path) -> socket.socket:
    path, _ = socket_address(root)  # its directory's descriptor lives as long as we do
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead relay's: we hold the lock now
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    listener.setblocking(False)
    return listener


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    lock_fd = -1
    if len(args) == 3 and args[1] == "--lock-fd" and args[2].isdigit():
        lock_fd = int(args[2])  # relay.lock, flock()ed by the process that started us
    elif len(args) != 1:
        print(
            "usage: python -m eventlane.log.embedded.relay_server <data-dir> [--lock-fd N]",
            file=sys.stderr,
        )
        return 2
    import logging  # noqa: PLC0415 - the relay's own process: its reports go to stderr

    logging.basicConfig(level=logging.INFO, format="%(asctime)s relay %(process)d %(message)s")
    root = Path(args[0])
    os.environ["EVENTLANE_RELAY"] = "off"  # the relay itself writes directly
    if lock_fd < 0:
        lock_fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # another relay serves this directory
    server = RelayServer(root, _listen(root))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stopping.set())
    log.info("serving", data=str(root))
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
