"""Pausing a projector's live workers, so its read-model file can be replaced under them.

Files, beside the read model in ``<data>/readmodels/``::

    <name>.pause              present while a pause is requested: JSON {"token", "requested_ms",
                              "expires_ms", "pid", "host"}; written atomically (temp file +
                              rename)
    <name>.pause-acks/<member id>
                              the token, written by a worker once it is paused

Protocol (a hand-off, :mod:`eventlane.replay.handoff`, is the requester):

1. the requester writes ``<name>.pause`` with a fresh token;
2. each worker checks for the file before every poll (one ``stat``; the common case, no
   file, costs a failed ``stat``). Seeing it, the worker applies nothing more: it commits
   its group offsets, closes its read-model connection, and, if it is a member of the group,
   writes its ack. It keeps its group membership (the heartbeat thread runs) and polls
   nothing while paused; a worker that has not joined yet does not join;
3. the requester waits until every live member of the group has acked the token, then owns
   the file alone: it may replace it (an atomic rename);
4. the requester deletes ``<name>.pause``. Each worker reopens the read model at its path
   (the new file), claims again every partition it owns under its current generation,
   seeks each one to the position stored in the file, deletes its ack, and goes on.

A worker also reopens the file whenever the path's inode differs from the one it opened
(a replacement it did not pause for), so no worker can keep writing a replaced file.

A requester that dies cannot leave the workers paused for ever: a pause whose requester
process is gone (same host) or whose ``expires_ms`` has passed counts as lifted. Lifting a
pause early is safe: a worker writing the old file makes the swap refuse (the file is
open), and a file already swapped is reopened.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import time
from pathlib import Path

import orjson

from eventlane.log.files import write_atomic
from eventlane.log.local import LocalDir

__all__ = ["PauseControl"]


class PauseControl:
    """The pause files of projector ``name`` in the local directory ``local`` (a
    :class:`~eventlane.log.local.LocalDir`, or a data directory path)."""

    def __init__(self, local: LocalDir | Path, name: str) -> None:
        local = local if isinstance(local, LocalDir) else LocalDir(Path(local))
        self.path = local.pause(name)
        self.acks = local.pause_acks(name)

    # ------------------------------------------------------------------ worker side
    def requested(self) -> str | None:
        """The token of the pause in force, or ``None`` (no pause, or a stale one)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            body = orjson.loads(raw)
            token = str(body["token"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return "?"  # a pause file being replaced, or unreadable: still a pause
        if _stale(body):
            return None
        return token

    def ack(self, member_id: str, token: str) -> None:
        self.acks.mkdir(parents=True, exist_ok=True)
        write_atomic(self.acks / member_id, token.encode())

    def clear_ack(self, member_id: str) -> None:
        (self.acks / member_id).unlink(missing_ok=True)

    # ------------------------------------------------------------------ requester side
    def request(self, expires_in: float = 600.0) -> str:
        """Request a pause that lapses after ``expires_in`` seconds; return its token."""
        token = secrets.token_hex(8)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        now_ms = int(time.time() * 1000)
        body = {
            "token": token,
            "requested_ms": now_ms,
            "expires_ms": now_ms + int(expires_in * 1000),
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        write_atomic(self.path, orjson.dumps(body))
        return token

    def acked(self, token: str) -> set[str]:
        """Member ids that acked ``token``."""
        out: set[str] = set()
        try:
            entries = list(os.scandir(self.acks))
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name.endswith(".tmp"):
                continue
            try:
                with open(entry.path, "rb") as f:
                    if f.read().decode() == token:
                        out.add(entry.name)
            except OSError:
                continue
        return out

    def resume(self) -> None:
        """End the pause (workers reopen the read model and go on)."""
        self.path.unlink(missing_ok=True)
        shutil.rmtree(self.acks, ignore_errors=True)


def _stale(body: dict[str, object]) -> bool:
    """Whether a pause has lapsed or its requester (on this host) is gone."""
    expires = body.get("expires_ms")
    if isinstance(expires, int) and time.time() * 1000 > expires:
        return True
    pid = body.get("pid")
    if body.get("host") == socket.gethostname() and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False
