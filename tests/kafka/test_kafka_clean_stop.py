"""A clean stop of ``eventlane serve --kafka`` (SIGTERM) while clients are connected: the
process exits 0 and its log carries no traceback and no error line, however many
connections are open and whatever they are waiting for, and whichever thread the signal
lands in."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import confluent_kafka
import pytest

from eventlane.kafka import KafkaServer
from eventlane.log import LogStore
from tests.kafka.conftest import KafkaProcess, free_port

API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
REQUEST = struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0


def ask(s: socket.socket) -> None:
    s.sendall(REQUEST)
    (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
    assert len(s.recv(size, socket.MSG_WAITALL)) == size


def keep_asking(s: socket.socket, asked: list[int]) -> None:
    """Requests back to back until the listener goes away: at the stop, some connection's
    next request has just arrived (where Python 3.11's ``asyncio.wait_for`` lost the
    cancellation and the connection's task served on, holding the stop)."""
    with contextlib.suppress(OSError, struct.error):
        while True:
            ask(s)
            asked[0] += 1


@pytest.mark.parametrize("attempt", range(3))  # a race: each stop finds it about half the time
def test_sigterm_with_connected_clients_stops_without_a_traceback(
    tmp_path: Path, attempt: int
) -> None:
    listener = KafkaProcess(tmp_path / "data", free_port())
    listener.start()
    sockets: list[socket.socket] = []
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": listener.bootstrap,
            "group.id": "stopping",
            "client.id": "stop",
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe(["stop-topic"])
        consumer.poll(1.0)  # connected, its group joined or joining
        for _ in range(4):  # idle connections, each answered once, waiting for the next
            s = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
            ask(s)
            sockets.append(s)
        half = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
        half.sendall(struct.pack(">i", 100) + b"\0" * 10)  # a request half sent
        sockets.append(half)
        asked = [0]
        for _ in range(4):  # busy connections
            s = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
            sockets.append(s)
            threading.Thread(target=keep_asking, args=(s, asked), daemon=True).start()
        deadline = time.monotonic() + 60
        while asked[0] < 200:  # the busy connections are being served
            assert time.monotonic() < deadline, f"{asked[0]} requests answered in 60 s"
            time.sleep(0.01)
        assert listener.proc is not None
        listener.proc.terminate()
        assert listener.proc.wait(30) == 0
    finally:
        consumer.close()
        for s in sockets:
            s.close()
        listener.kill()
    said = listener.stderr.read_text()
    bad = [line for line in said.splitlines() if "Traceback" in line or "[error" in line]
    assert not bad, said[-4000:]


def test_sigterm_handed_to_another_thread_still_stops_an_idle_listener(tmp_path: Path) -> None:
    """The kernel may give a process's signal to any of its threads that does not block it;
    Python's handler then only flags it, and an idle loop waiting in epoll must be woken.
    Here the main thread blocks SIGTERM, so a sleeping thread started first receives it."""
    port = free_port()
    code = (
        "import signal, threading, time;"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start();"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM]);"
        "from eventlane.cli import main; main()"
    )
    err = tmp_path / "listener.log"
    with open(err, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                "--data",
                str(tmp_path / "data"),
                "serve",
                "--kafka",
                f"127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 30
        while "kafka listener on" not in err.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        proc.terminate()
        assert proc.wait(20) == 0, err.read_text()  # before the fix: never (no timer pending)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "Traceback" not in err.read_text()


def test_an_embedded_server_closes_with_clients_connected(tmp_path: Path) -> None:
    """``KafkaServer.close()`` in the application's own loop ends its connections, an idle
    one and one with half a request, instead of waiting for them."""

    async def ended(reader: asyncio.StreamReader) -> bool:
        try:
            return await reader.read() == b""  # no answer, end of stream
        except ConnectionResetError:  # bytes it never read: the kernel resets instead
            return True

    async def main() -> tuple[bool, bool, float]:
        with LogStore(tmp_path / "data") as log_:
            server = KafkaServer(log_, "127.0.0.1", 0)
            await server.start()
            idle_r, idle_w = await asyncio.open_connection("127.0.0.1", server.port)
            idle_w.write(REQUEST)
            (size,) = struct.unpack(">i", await idle_r.readexactly(4))
            await idle_r.readexactly(size)
            half_r, half_w = await asyncio.open_connection("127.0.0.1", server.port)
            half_w.write(struct.pack(">i", 100) + b"\0" * 10)
            await half_w.drain()
            started = time.monotonic()
            async with asyncio.timeout(10):
                await server.close()
                ends = (await ended(idle_r), await ended(half_r))
            took = time.monotonic() - started
            idle_w.close()
            half_w.close()
            return ends[0], ends[1], took

    idle, half, took = asyncio.run(main())
    assert idle and half, "both connections end, with no answer"
    assert took < 5, took
