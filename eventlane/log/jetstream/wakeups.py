"""Wake-ups: tailing readers in every process learn of appends without polling the streams.

Every append of an eventlane process is followed by an empty message on the namespace's wake
subject (:func:`~eventlane.log.jetstream.mapping.wake_subject`); every log object subscribes
to it and counts what it receives, and its own appends, in a sequence number that
:meth:`Wakeups.wait` sleeps on (a ``threading.Condition``: callable from any thread).

The wake message of an append is *owed* rather than sent at once: it goes out in the same
socket write as this process's next request (:meth:`Wakeups.pay_now`, awaited before a
publish), when a thread takes the loop over (:meth:`Wakeups.on_drive`), or after
:data:`~eventlane.log.jetstream.bridge.IDLE_HANDBACK_S` when the bridge's own thread keeps
the loop for concurrent callers and nothing else took it; a write of its own per append cost
as much as a second round trip on a loaded machine.

Invariants: the wake sequence (:class:`~eventlane.log.remote.WakeSequence`) only grows.
``owed`` and ``_timer`` are touched only on the loop or by the thread holding it (the
bridge's driver), never elsewhere. At most one wake message is owed; one is never lost: a
close pays it before the connection goes.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors

from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.bridge import IDLE_HANDBACK_S, Bridge
from eventlane.log.jetstream.connection import Connection
from eventlane.log.remote import WakeSequence


class Wakeups:
    """The wake sequence and the owed wake message of one log (module docstring)."""

    def __init__(self, conn: Connection, bridge: Bridge | None) -> None:
        self.conn = conn
        self.bridge = bridge  # None: the asyncio face (its loop is the caller's)
        self.subject = m.wake_subject(conn.namespace)
        self.sequence = WakeSequence()
        self.owed = False  # an append's wake message not sent yet
        self._timer: asyncio.TimerHandle | None = None  # pays it if nothing follows (see owe)
        self._task: asyncio.Task[None] | None = None  # the last wake message sent by pay

    # ------------------------------------------------------------------ the sequence
    def bump(self) -> None:
        """Count a wake-up (an append of this process, or a wake message received)."""
        self.sequence.bump()

    async def on_message(self, _msg: object) -> None:
        self.bump()

    def wait_seq(self) -> int:
        return self.sequence.current()

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until a wake-up after ``seen`` (or ``timeout`` seconds)."""
        self.sequence.wait(seen, timeout)

    def wake(self) -> None:
        """Wake every waiter of this namespace, in every process (callable from any thread,
        the loop's own included)."""
        self.bump()
        publish = self.conn.nc.publish(self.subject, b"")
        assert self.bridge is not None, "the asyncio face sends with send()"
        if self.bridge.on_loop():
            self.bridge.loop.create_task(publish)
        else:
            self.bridge.run(publish)

    # ------------------------------------------------------------------ the owed message
    def owe(self) -> None:
        """An append was acknowledged: its wake message is owed (on the loop). A caller
        running the loop stops it after its call, and the bridge's thread pays the wake when
        it takes the loop over; the bridge's own thread, which keeps running it for
        concurrent callers, sends it after :data:`IDLE_HANDBACK_S` if no request took it."""
        self.owed = True
        if self._timer is None and (self.bridge is None or self.bridge.own_thread()):
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(IDLE_HANDBACK_S, self._pay_late)

    def _pay_late(self) -> None:
        self._timer = None
        self.pay()

    def pay(self) -> None:
        """Queue the owed wake message (on the loop, before the call about to run)."""
        if self.owed:
            self.owed = False
            self._task = asyncio.get_running_loop().create_task(self.send())

    def on_drive(self) -> None:
        """The bridge's hook: a thread takes the loop over (it holds it now)."""
        if self.owed:
            assert self.bridge is not None
            self.bridge.loop.call_soon(self.pay)

    async def pay_now(self) -> None:
        """Send the owed wake message, if any (awaited before a request: same write)."""
        if self.owed:
            self.owed = False
            await self.send()

    async def send(self) -> None:
        with contextlib.suppress(nats.errors.Error):  # closed or reconnecting: best effort
            await self.conn.nc.publish(self.subject, b"")
