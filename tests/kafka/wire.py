"""Raw Kafka requests for the listener tests: kafka-python's protocol classes encode what a
client would send, on a plain socket, so a test controls every field."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder


def recv_frame(sock: socket.socket) -> bytes | None:
    """One response frame's payload, or ``None`` when the listener closed the connection."""
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">i", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    return body


def encode(request: Any, version: int, correlation_id: int = 42) -> bytes:
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(request.encode(header=True, framed=True))


def raw_call(bootstrap: str, request: Any, response_cls: Any, version: int) -> Any:
    """One request on a fresh connection; its decoded response."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(encode(request, version))
        body = recv_frame(sock)
    assert body is not None, "the listener closed the connection instead of answering"
    return response_cls[version].decode(body, header=True)


def build(
    recs: list[tuple[bytes | None, bytes | None, list, int]],
    *,
    pid: int = -1,
    compression: int = 0,
    seq: int = -1,
) -> bytes:
    """A producer's record batch (magic 2), as kafka-python's producer frames it:
    ``(key, value, headers, timestamp)`` each; ``compression``: the codec's id."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
        batch_size=1 << 30,
    )
    for i, (key, value, headers, ts) in enumerate(recs):
        builder.append(i, ts, key, value, headers)
    return bytes(builder.build())
