"""A clean stop of ``eventlane serve --kafka`` (SIGTERM) while clients are connected: the
process exits 0 and its log carries no traceback and no error line, however many
connections are open and whatever they are waiting for."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import confluent_kafka

from tests.kafka.conftest import KafkaProcess, free_port

API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 7, 4) + b"test"


def test_sigterm_with_connected_clients_stops_without_a_traceback(tmp_path: Path) -> None:
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
            s.sendall(struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0)
            (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
            assert len(s.recv(size, socket.MSG_WAITALL)) == size
            sockets.append(s)
        half = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
        half.sendall(struct.pack(">i", 100) + b"\0" * 10)  # a request half sent
        sockets.append(half)
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
