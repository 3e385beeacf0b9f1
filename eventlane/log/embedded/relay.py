"""The relay: one process writes the conditional appends of every process on a data directory.

Several processes appending to one partition take turns at its append lock (a ``flock``):
each turn is a hand-off between processes (a sleep, a wake-up, a context switch), and each
process's key index learns the others' appends from the files. Eight writer processes did
fewer commands than one (issue 36). So once processes meet at a partition's lock, they hand
their conditional appends (``append(expect=...)``, ``atomic=True``: the command path) to one
*relay* process, which writes what arrived together: a partition's appends under one hold of
its lock and one fsync, checked against one key index (:mod:`.relay_server`).

::

    <data>/relay.lock               flock()ed by the relay process for as long as it serves
    <data>/relay.sock               its Unix socket (the data directory's permissions guard it)
    <data>/relay.log                what the relay process reports (warnings and errors)
    <data>/relay.writers/<pid>.<n>.lock   one per store making conditional appends, flock()ed

This module is the clients' side (:class:`Relay`, one per
:class:`~eventlane.log.embedded.store.LogStore`) and the wire both sides speak.

* **When**: one or two processes append directly, as ever (two take turns at the lock
  faster than through a relay). A store registers at its first conditional append; one
  that counts :data:`WRITERS_MIN` live registered processes (itself included) starts the
  relay (``python -m eventlane.log.embedded.relay_server <data>``, in its own session): it
  takes ``relay.lock`` first and hands it to the child, so one starts at a time. Every
  store without a connection looks for the relay every :data:`LOOK_S` (and at once when an
  append found another process at a partition's lock), and appends through it while
  connected. The relay exits once fewer than :data:`WRITERS_MIN` processes used it for
  :data:`~eventlane.log.embedded.relay_server.IDLE_S` seconds (the rest append directly
  again), when the data directory is gone, or on SIGTERM. ``EVENTLANE_RELAY=off`` (or a
  store with its own clock) never uses it.
* **Wire**: a request is a 4-byte length and a ``marshal``-ed list of conditional appends
  ``(topic, partition, records, key, last_offset)``; the answer, one outcome each: the
  offsets and timestamps, or the error the append raised there (its class and fields). A
  connection carries one request at a time (each thread of a client keeps its own); the
  relay serves only peers of its own user (``SO_PEERCRED``).
* **What a relay failure means** (the invariant everything rests on): an ``Expect`` is a
  value, so at most one append conditional on it can ever be written. A request that never
  left (no relay, the connection refused, the send failed) is appended directly, as without
  a relay. A request that left but got no answer (the relay died, exited, or did not answer
  within :data:`ANSWER_S`: stopped, descheduled) may still be written by the relay; it is
  appended directly with the same ``Expect``: if that succeeds, the relay's copy never can
  be (its check fails); if that is refused, either the relay wrote it or another append
  took the slot: :class:`~eventlane.errors.OutcomeUnknownError`, which the command path
  settles by reading the stream (:mod:`eventlane.store.command`). Nothing is acknowledged
  twice, nothing refused was stored. A client that gave up waiting appends directly for
  :data:`SUSPECT_S` before it asks again.
* A forked child never uses its parent's connections: it starts over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import marshal
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eventlane import errors as _errors
from eventlane.errors import ConcurrencyError, FrameworkError, OutcomeUnknownError
from eventlane.log.types import AppendResult, Expect, RecordTuple
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

LOCK_NAME = "relay.lock"
SOCKET_NAME = "relay.sock"
LOG_NAME = "relay.log"
WRITERS = "relay.writers"
_SERIALS = itertools.count()
ANSWER_S = 5.0
"""How long a client waits for the relay's answer before appending directly itself."""
SUSPECT_S = 10.0
"""How long a client that gave up waiting for the relay appends directly."""
WRITERS_MIN = 3
"""Processes making conditional appends on a data directory from which the relay serves
them (two alone write faster directly, each taking the lock in turn: docs/performance.md)."""
LOOK_S = 0.1
"""How often a store that has no relay connection looks for one (a connect attempt)."""
SPAWN_EVERY_S = 0.5
"""A store tries to start the relay at most this often (``relay.lock`` lets one start)."""
MAX_FRAME = 64 << 20
_ANSWER_READ = 1 << 16
LEN = struct.Struct(">I")

Outcome = AppendResult | Exception
Item = tuple[Sequence[RecordTuple], Expect]
Direct = Callable[[str, int, Sequence[Item]], list[Outcome]]
"""The store's own (unrelayed) conditional group append: a client's fallback."""
Relayed = Callable[[str, int, Sequence[Item], list[Outcome], float], None]
"""Told what the relay wrote for this process (its metrics count it)."""


def enabled() -> bool:
    """Whether this process may use a relay (``EVENTLANE_RELAY=off`` says no)."""
    return os.environ.get("EVENTLANE_RELAY", "").lower() not in {"off", "0", "no", "false"}


class _NotSentError(Exception):
    """The request never left this process (or left incomplete): nothing can be written."""


class Relay:
    """A data directory's relay as one client process sees it (module docstring)."""

    def __init__(self, root: Path, direct: Direct, relayed: Relayed) -> None:
        self._root = root
        self._direct = direct
        self._count = relayed
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._local = threading.local()
        self._dir_fd = -1
        self._look_at = 0.0
        self._suspect_until = 0.0
        self._counted_at = 0.0
        self._others = 0  # live registered processes besides this one, at the last count
        self._spawned_at = -SPAWN_EVERY_S
        self._child: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._registered = False
        self._writer_fd = -1
        self._writer_name = ""
        self.relayed = 0
        """Appends the relay answered for this process (a count, for tests and metrics)."""
        self.looked = 0
        """Times this process looked for the relay (connection attempts: for tests)."""

    def _register(self) -> None:
        """At this store's first conditional append: say so in ``<data>/relay.writers/``
        (a file per store, ``flock()``ed while it is open) and start the relay if that makes
        :data:`WRITERS_MIN` live processes (module docstring)."""
        self._registered = True
        folder = self._root / WRITERS
        name = f"{os.getpid()}.{next(_SERIALS)}.lock"  # a process may open several stores
        try:
            folder.mkdir(exist_ok=True)
            fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a read-only data directory: no relay
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self._writer_fd, self._writer_name = fd, name
        self._count_writers(time.monotonic())

    def _count_writers(self, now: float) -> None:
        """Start the relay if :data:`WRITERS_MIN` live processes registered (this one too)."""
        if self._writer_fd < 0:
            return
        others = self._others = _other_writers(self._root / WRITERS, os.getpid())
        if others + 1 >= WRITERS_MIN:
            self._start(now)

    def met(self) -> None:
        """An append found another process holding a partition's append lock."""
        if self._others + 1 >= WRITERS_MIN:  # the relay may serve already: look at the
            self._look_at = 0.0  # next append (with fewer, at the next look, as ever)

    # ------------------------------------------------------------------ appends
    def append_group(self, topic: str, partition: int, items: Sequence[Item]) -> list[Outcome]:
        """Each item's outcome: written by the relay, or directly where it cannot be."""
        if not self._relayed():
            return self._direct(topic, partition, items)
        try:
            frame = request(topic, partition, items)
        except ValueError:  # a record marshal cannot carry (a bytearray value, say)
            return self._direct(topic, partition, items)
        started = time.perf_counter()
        try:
            answer = self._ask(frame)
        except _NotSentError:
            return self._direct(topic, partition, items)
        except OSError as exc:
            return self._orphaned(topic, partition, items, exc)
        try:
            outcomes = [outcome(a) for a in answer]
        except (TypeError, ValueError, IndexError) as exc:
            return self._orphaned(topic, partition, items, exc)
        if len(outcomes) != len(items):
            return self._orphaned(topic, partition, items, ValueError("an answer of another size"))
        self.relayed += len(outcomes)
        self._count(topic, partition, items, outcomes, time.perf_counter() - started)
        return outcomes

    def _relayed(self) -> bool:
        """Whether this append goes through the relay (connected now), else directly."""
        if os.getpid() != self._pid:
            self._after_fork()
        if self._closed:
            return False
        if not self._registered:
            self._register()
        if time.monotonic() < self._suspect_until:
            return False  # it did not answer lately: maybe stopped (module docstring)
        conn: socket.socket | None = getattr(self._local, "conn", None)
        if conn is not None:
            if _open(conn):
                return True
            self._drop(conn)  # the relay exited (or died): look again now
        now = time.monotonic()
        if now < self._look_at:
            return False
        self._look_at = now + LOOK_S
        if self._connect() is not None:
            return True
        if now - self._counted_at >= LOOK_S:
            self._counted_at = now
            self._count_writers(now)
        return False

    def _connect(self) -> socket.socket | None:
        self.looked += 1
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(ANSWER_S)
            conn.connect(self._socket_path())
        except OSError:
            conn.close()
            return None
        self._local.conn = conn
        with self._mutex:
            self._conns.add(conn)
        return conn

    def _ask(self, frame: bytes) -> Any:
        conn: socket.socket = self._local.conn
        try:
            conn.sendall(frame)
        except OSError as exc:
            self._drop(conn)
            raise _NotSentError from exc
        try:
            return marshal.loads(_answer_body(conn))
        except (OSError, EOFError, ValueError, TypeError) as exc:
            self._drop(conn)
            if isinstance(exc, TimeoutError):
                self._suspect_until = time.monotonic() + SUSPECT_S
            if isinstance(exc, OSError):
                raise
            raise OSError(errno.EPROTO, str(exc)) from exc

    def _orphaned(
        self, topic: str, partition: int, items: Sequence[Item], exc: BaseException
    ) -> list[Outcome]:
        """Items sent without an answer: appended directly with the same ``Expect`` (at most
        one copy of each can be written: module docstring)."""
        log.warning("no answer from the relay: appending directly", topic=topic, error=str(exc))
        return [
            OutcomeUnknownError(
                f"the relay did not answer ({exc}) and the same conditional append, made"
                f" directly, was refused ({o.message}): the relay may have written it;"
                " read the key before deciding again",
                topic=topic,
                partition=partition,
            )
            if isinstance(o, ConcurrencyError)
            else o
            for o in self._direct(topic, partition, items)
        ]

    def _drop(self, conn: socket.socket) -> None:
        self._look_at = self._counted_at = 0.0
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._mutex:
            self._conns.discard(conn)
        conn.close()

    # ------------------------------------------------------------------ the process
    def _start(self, now: float) -> None:
        """Start the relay process unless one serves (or starts) already: whoever takes
        ``relay.lock`` starts it and hands it the lock."""
        with self._mutex:
            if self._closed or now - self._spawned_at < SPAWN_EVERY_S:
                return
            self._spawned_at = now
            if self._child is not None:
                self._child.poll()  # reaped once it exited
            self._child = spawn(self._root)

    def _socket_path(self) -> str:
        with self._mutex:
            address, self._dir_fd = socket_address(self._root, self._dir_fd)
            return address

    def _after_fork(self) -> None:
        """In a forked child: never touch the parent's connections."""
        self._pid = os.getpid()
        self._local = threading.local()
        self._conns = set()
        self._mutex = threading.Lock()
        self._child = None
        if self._writer_fd >= 0:  # the parent's registration (and its flock): not ours
            with contextlib.suppress(OSError):
                os.close(self._writer_fd)
        self._writer_fd = -1
        self._registered = False

    def close(self) -> None:
        """Drop this process's connections (the relay serves on for the others)."""
        if os.getpid() != self._pid:
            self._after_fork()
        with self._mutex:
            self._closed = True
            conns, self._conns = self._conns, set()
            child, self._child = self._child, None
            dir_fd, self._dir_fd = self._dir_fd, -1
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()
        if child is not None:
            child.poll()  # reaped if it exited; else it serves on, detached
        if dir_fd >= 0:
            os.close(dir_fd)
        if self._writer_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self._root / WRITERS / self._writer_name)
            os.close(self._writer_fd)
            self._writer_fd = -1


def socket_address(root: Path, dir_fd: int = -1) -> tuple[str, int]:
    """The address of ``root``'s relay socket, and the descriptor of ``root`` it uses (a
    Unix socket's path holds at most 107 bytes: a deeper directory is reached through a
    descriptor of it, opened once: ``dir_fd`` if already open, else ``-1`` when unused)."""
    path = str(root / SOCKET_NAME)
    if len(path.encode()) < 100:
        return path, dir_fd
    if dir_fd < 0:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}", dir_fd


def _other_writers(folder: Path, pid: int) -> int:
    """Live processes other than ``pid`` registered in ``folder`` (a file whose lock is
    free is a dead process's, or a closed store's: removed)."""
    alive: set[str] = set()
    for name in os.listdir(folder):
        owner = name.split(".", 1)[0]
        if owner == str(pid) or owner in alive:
            continue
        try:
            fd = os.open(folder / name, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            alive.add(owner)
        else:
            with contextlib.suppress(OSError):
                os.unlink(folder / name)
        finally:
            os.close(fd)
    return len(alive)


def spawn(root: Path) -> subprocess.Popen[bytes] | None:
    """Start ``python -m eventlane.log.embedded.relay_server root`` in its own session,
    reporting to ``root/relay.log``, if ``relay.lock`` is free: the child inherits the lock
    (so no other process starts one meanwhile); ``None`` if another relay serves or starts,
    or this interpreter cannot start one."""
    if not sys.executable or "python" not in Path(sys.executable).name:
        return None  # embedded in another program (uwsgi, say): no interpreter to start
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only data directory
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # a relay serves, or is starting
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        )
        command = [sys.executable, "-m", "eventlane.log.embedded.relay_server", str(root)]
        try:
            with open(root / LOG_NAME, "ab") as report:
                return subprocess.Popen(
                    [*command, "--lock-fd", str(fd)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=report,
                    start_new_session=True,
                    pass_fds=(fd,),
                    env=env,
                )
        except OSError as exc:
            fcntl.flock(fd, fcntl.LOCK_UN)
            log.warning("cannot start the relay", error=str(exc))
            return None
    finally:
        os.close(fd)  # the child's copy keeps the lock (one open file, one flock)


# ---------------------------------------------------------------------- the wire
def request(topic: str, partition: int, items: Sequence[Item]) -> bytes:
    """The frame asking for ``items`` (conditional appends to one partition)."""
    body = marshal.dumps(
        [
            (
                topic,
                partition,
                [(r[0], r[1], tuple((h[0], h[1]) for h in r[2]), r[3]) for r in records],
                expect.key,
                expect.last_offset,
            )
            for records, expect in items
        ]
    )
    return LEN.pack(len(body)) + body


def answer(outcome: Outcome) -> tuple[Any, ...]:
    """One append's outcome as the wire carries it."""
    if isinstance(outcome, AppendResult):
        return ("ok", outcome.base_offset, outcome.last_offset, list(outcome.timestamps))
    fields = {k: v for k, v in vars(outcome).items() if _plain(v)}
    return ("error", type(outcome).__module__, type(outcome).__qualname__, str(outcome), fields)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, bytes))


def outcome(wire: Any) -> Outcome:
    """:func:`answer`'s inverse: the offsets, or the error raised in the relay (an error of
    a class outside :mod:`eventlane.errors` and ``OSError`` becomes
    :class:`~eventlane.errors.OutcomeUnknownError`)."""
    if wire[0] == "ok":
        return AppendResult(wire[1], wire[2], list(wire[3]))
    _, module, name, message, fields = wire
    cls = getattr(_errors, name, None) if module == _errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, FrameworkError):
        error = cls.__new__(cls)
        Exception.__init__(error, message)
        error.__dict__.update(fields)
        return error
    if name == "OSError" and isinstance(fields.get("errno"), int):
        return OSError(fields["errno"], fields.get("strerror") or message)
    return OutcomeUnknownError(
        f"the relay's append failed with {module}.{name}: {message}",
        topic=fields.get("topic") if isinstance(fields.get("topic"), str) else None,
        partition=fields.get("partition") if isinstance(fields.get("partition"), int) else None,
    )


def _answer_body(conn: socket.socket) -> bytes:
    """An answer's body: usually one read (a connection carries one request at a time, so
    nothing follows the answer)."""
    data = conn.recv(_ANSWER_READ)
    if len(data) < LEN.size:
        data += recv_exactly(conn, LEN.size - len(data))
    (size,) = LEN.unpack_from(data)
    if size > MAX_FRAME:
        raise ValueError(f"an answer of {size} bytes")
    if len(data) < LEN.size + size:
        data += recv_exactly(conn, LEN.size + size - len(data))
    return data[LEN.size :]


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = conn.recv(size)
        if not chunk:
            raise EOFError("the relay closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _open(conn: socket.socket) -> bool:
    """Whether the relay's end is still open: between requests nothing is readable unless
    the relay closed it."""
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    return not poller.poll(0)
