"""The Kafka wire-protocol listener: one asyncio server, one broker (node id 0).

Framing (Kafka's): every request and response is an int32 size, then that many bytes. A
request starts with its header (api key, api version, correlation id, client id; tagged
fields from the API's first flexible version); the response repeats the correlation id.
Requests of one connection are answered in order, as Kafka does.

Bodies are decoded and encoded by kafka-python's protocol classes (generated from Kafka's
message schemas), at the version the client chose among those :data:`SUPPORTED` lists
(ApiVersions first). Log I/O runs in worker threads, so a fetch waiting for records never
blocks other connections.

Guarantees are the log's: an acknowledged produce (acks=1 or -1; both mean "durable per the
topic's flush policy" on one node) is in the log; a fetch never returns records at or
above the high-water mark.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from framework.kafka.handlers import Broker
from framework.kafka.protocol import REQUESTS, SUPPORTED, UnsupportedVersionError, decode_request
from framework.log import Log
from framework.observability import get_logger

__all__ = ["KafkaServer", "serve"]

log = get_logger("eventlane.kafka")

_SIZE = struct.Struct(">i")
MAX_REQUEST_BYTES = 100 << 20
"""Kafka's socket.request.max.bytes default; a larger frame closes the connection."""


class KafkaServer:
    """Serves the Kafka protocol for ``log`` on ``host:port`` (``port=0``: any free port).

    ``advertised`` is the ``host:port`` clients are told to connect to (default: where it
    listens).
    """

    def __init__(
        self,
        log_: Log,
        host: str = "127.0.0.1",
        port: int = 9092,
        *,
        advertised: str | None = None,
        auto_create_topics: bool = True,
        default_partitions: int = 1,
    ) -> None:
        self.host = host
        self.port = port
        self._advertised = advertised
        self.broker = Broker(
            log_,
            auto_create_topics=auto_create_topics,
            default_partitions=default_partitions,
        )
        self._server: asyncio.Server | None = None
        self._handlers: dict[int, Callable[[Any], Awaitable[Any]]] = self.broker.handlers()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        sock = self._server.sockets[0].getsockname()
        self.port = sock[1]
        adv_host, _, adv_port = (self._advertised or f"{self.host}:{self.port}").rpartition(":")
        self.broker.advertise(adv_host, int(adv_port))
        log.info(
            "kafka listener started",
            host=self.host,
            port=self.port,
            advertised=f"{adv_host}:{adv_port}",
        )

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            while True:
                try:
                    head = await reader.readexactly(4)
                except asyncio.IncompleteReadError:
                    return
                (size,) = _SIZE.unpack(head)
                if size < 8 or size > MAX_REQUEST_BYTES:
                    log.warning("bad request size; closing", peer=str(peer), size=size)
                    return
                payload = await reader.readexactly(size)
                response = await self._respond(payload, peer)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _respond(self, payload: bytes, peer: object) -> bytes | None:
        api_key, version, correlation_id = struct.unpack_from(">hhi", payload)
        try:
            request = decode_request(payload)
        except UnsupportedVersionError as exc:
            # Kafka answers an ApiVersions request it cannot parse with version 0 and error 35,
            # listing what it supports; any other unsupported request closes the connection.
            if api_key == 18:
                return self.broker.api_versions_error(correlation_id)
            log.warning(
                "unsupported request",
                peer=str(peer),
                api_key=api_key,
                version=version,
                error=str(exc),
            )
            raise ConnectionError(str(exc)) from None
        handler = self._handlers[api_key]
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug, not a client error: log it with the request and drop the connection
            # (the client retries on a new one), never the listener.
            log.exception("request failed", api_key=api_key, version=version, peer=str(peer))
            raise ConnectionError("request failed") from None
        if response is None:  # acks=0
            return None
        response.API_VERSION = version
        response.with_header(correlation_id=correlation_id)
        out: bytes = response.encode(header=True, framed=True)
        return bytes(out)


def serve(
    log_: Log,
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    advertised: str | None = None,
    auto_create_topics: bool = True,
    ready: Callable[[KafkaServer], None] | None = None,
) -> None:
    """Run a :class:`KafkaServer` until interrupted (the CLI's ``eventlane serve --kafka``)."""

    async def main() -> None:
        server = KafkaServer(
            log_, host, port, advertised=advertised, auto_create_topics=auto_create_topics
        )
        await server.start()
        if ready is not None:
            ready(server)
        await server.serve_forever()

    asyncio.run(main())


__all__ += ["REQUESTS", "SUPPORTED"]
