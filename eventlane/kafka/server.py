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

Invariants of the connection loop:

* every request that decodes at a supported version is answered (acks=0 produce excepted,
  as in Kafka): a failure inside a handler becomes a Kafka error code in the response, never
  a dropped connection. The connection is closed, as Kafka closes it, only for a frame it
  cannot take (a size outside ``[8, max_request_bytes]``, a body that does not decode, an
  API or version not advertised other than ApiVersions), an idle connection, a request
  whose bytes do not all arrive within ``request_timeout_s``, or one over
  ``max_connections``;
* the bytes of requests being received or served never exceed ``max_inflight_bytes`` in
  total: a frame's size is reserved before its body is read, and a connection whose frame
  does not fit waits (its bytes stay in the kernel's socket buffer) until others finish.
  A compressed Produce batch's records count too, chunk by chunk as they are decompressed
  (and at most ``max_request_bytes`` of them per request: more is MESSAGE_TOO_LARGE), so a
  small request that decompresses to gigabytes costs at most that bound;
* each refused or failed request logs one line, at most :data:`LOG_LINES_PER_S` a second
  (the rest are counted and reported in the next line);
* with metrics enabled (:mod:`._metrics`), every request read is counted once, a malformed
  or unsupported one too (INVALID_REQUEST, UNSUPPORTED_VERSION); disabled, each request
  costs one attribute test.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from eventlane.kafka._metrics import first_error, observe
from eventlane.kafka.codes import Errors, errno
from eventlane.kafka.groups import client_host
from eventlane.kafka.handlers import Broker
from eventlane.kafka.protocol import (
    REQUESTS,
    SUPPORTED,
    UnsupportedVersionError,
    connection_open,
    decode_request,
)
from eventlane.log import Log
from eventlane.metrics import M
from eventlane.observability import get_logger

__all__ = ["KafkaServer", "Limits", "serve"]

log = get_logger("eventlane.kafka")

_SIZE = struct.Struct(">i")
_CHUNK = 1 << 20
LOG_LINES_PER_S = 10


@dataclasses.dataclass(frozen=True)
class Limits:
    """The listener's resource bounds (Kafka's broker configs where one exists)."""

    max_request_bytes: int = 100 << 20
    """``socket.request.max.bytes``: a larger frame closes the connection."""
    max_inflight_bytes: int = 256 << 20
    """``queued.max.request.bytes``: the bytes of all requests being received or served."""
    idle_timeout_s: float = 600.0
    """``connections.max.idle.ms``: a connection with no request for this long is closed."""
    request_timeout_s: float = 30.0
    """A request whose bytes do not all arrive within this is dropped with its connection."""
    max_connections: int = 1000
    """``max.connections``: connections beyond it are closed as they are accepted."""

    def configs(self) -> dict[str, str]:
        """These limits under Kafka's broker config names (what DescribeConfigs reports)."""
        return {
            "socket.request.max.bytes": str(self.max_request_bytes),
            "queued.max.request.bytes": str(self.max_inflight_bytes),
            "connections.max.idle.ms": str(int(self.idle_timeout_s * 1000)),
            "max.connections": str(self.max_connections),
        }


class _Budget:
    """Bytes of requests in flight, shared by every connection (FIFO by wake-up order)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._changed = asyncio.Condition()

    async def acquire(self, size: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used + size <= self.total)
            self.used += size
        if M.on:
            M.kafka_inflight_bytes.set(self.used)

    async def release(self, size: int) -> None:
        async with self._changed:
            self.used -= size
            self._changed.notify_all()
        if M.on:
            M.kafka_inflight_bytes.set(self.used)


class _Limiter:
    """At most ``per_s`` log lines a second; the lines held back are counted."""

    def __init__(self, per_s: int) -> None:
        self.per_s = per_s
        self._window = 0.0
        self._count = 0
        self.suppressed = 0

    def warning(self, event: str, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._window, self._count = now, 0
        if self._count >= self.per_s:
            self.suppressed += 1
            return
        self._count += 1
        if self.suppressed:
            fields["suppressed_since_last"] = self.suppressed
            self.suppressed = 0
        log.warning(event, **fields)


class _CloseError(Exception):
    """Close this connection (the reason is logged by whoever raises it)."""


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
        limits: Limits | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._advertised = advertised
        self.limits = limits or Limits()
        if self.limits.max_inflight_bytes < self.limits.max_request_bytes:
            raise ValueError("max_inflight_bytes must be >= max_request_bytes")
        self.broker = Broker(
            log_,
            auto_create_topics=auto_create_topics,
            default_partitions=default_partitions,
        )
        self.broker.limits = self.limits.configs()
        self._server: asyncio.Server | None = None
        self._handlers: dict[int, Callable[[Any], Awaitable[Any]]] = self.broker.handlers()
        self._budget: _Budget | None = None
        self._connections = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.bad = _Limiter(LOG_LINES_PER_S)

    async def start(self) -> None:
        self._budget = _Budget(self.limits.max_inflight_bytes)
        # decompressed records count against the same cap, at most a request's worth each
        self.broker.budget = self._budget
        self.broker.max_decompressed_bytes = self.limits.max_request_bytes
        self.broker.memory_wait_s = self.limits.request_timeout_s
        self.broker.max_fetch_wait_s = self.limits.request_timeout_s
        self._server = await asyncio.start_server(self._accept, self.host, self.port, limit=_CHUNK)
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
        """Stop accepting, end every connection (whatever it waits for), and publish the
        groups without members."""
        if self._server is not None:
            self._server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()  # from Python 3.12 on: until connections end
        self.broker.groups.unpublish()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection's task, held here rather than by asyncio's stream protocol, whose
        callback (Python 3.11) logs a task cancelled by a clean stop as a crash."""
        task = asyncio.get_running_loop().create_task(self._connection(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._ended(done, writer))

    def _ended(self, task: asyncio.Task[None], writer: asyncio.StreamWriter) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error(
                "connection failed",
                peer=str(writer.get_extra_info("peername")),
                error=_one_line(exc),
            )
        writer.close()  # a task cancelled before its first step never reached its finally

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = writer.get_extra_info("peername")
        peer = str(address)
        if isinstance(address, tuple) and address:
            client_host.set(f"/{address[0]}")  # this connection's task only
        connection_open.set(lambda: not reader.at_eof() and not writer.is_closing())
        self._connections += 1
        if M.on:
            M.kafka_connections.set(self._connections)
        try:
            if self._connections > self.limits.max_connections:
                self.bad.warning(
                    "connection refused: too many connections",
                    peer=peer,
                    max_connections=self.limits.max_connections,
                )
                return
            while True:
                payload, size = await self._read_request(reader, peer)
                started = time.perf_counter() if M.on else 0.0
                try:
                    out, api_key, code = await self._respond(payload, peer)
                finally:
                    del payload
                    assert self._budget is not None
                    await self._budget.release(size)
                if out is not None:
                    writer.write(out)
                    await writer.drain()
                if M.on:
                    sent = 0 if out is None else len(out)
                    observe(api_key, code, size + 4, sent, time.perf_counter() - started)
        except (ConnectionError, asyncio.IncompleteReadError, _CloseError):
            return
        finally:
            self._connections -= 1
            if M.on:
                M.kafka_connections.set(self._connections)
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader, peer: str) -> tuple[bytes, int]:
        """The next request's bytes and the budget reserved for them (the caller releases)."""
        limits = self.limits
        try:
            async with asyncio.timeout(limits.idle_timeout_s):
                head = await reader.readexactly(4)
        except TimeoutError:
            log.info("idle connection closed", peer=peer, idle_s=limits.idle_timeout_s)
            raise _CloseError from None
        (size,) = _SIZE.unpack(head)
        if size < 8 or size > limits.max_request_bytes:
            self.bad.warning(
                "bad request size; closing",
                peer=peer,
                size=size,
                max_request_bytes=limits.max_request_bytes,
            )
            raise _CloseError
        # a large request's bytes must all arrive within the timeout from here (its wait for
        # room included); a small one's within the timeout from when there is room for it
        deadline = asyncio.get_running_loop().time() + limits.request_timeout_s
        assert self._budget is not None
        try:
            async with asyncio.timeout(limits.request_timeout_s):
                await self._budget.acquire(size)
        except TimeoutError:
            self.bad.warning("request dropped: in-flight memory cap", peer=peer, size=size)
            raise _CloseError from None
        try:
            if size <= _CHUNK:
                async with asyncio.timeout(limits.request_timeout_s):
                    payload = await reader.readexactly(size)
            else:
                async with asyncio.timeout_at(deadline):
                    payload = await self._read_large(reader, size)
        except TimeoutError:
            await self._budget.release(size)
            self.bad.warning(
                "request dropped: its bytes did not arrive in time",
                peer=peer,
                size=size,
                timeout_s=limits.request_timeout_s,
            )
            raise _CloseError from None
        except BaseException:
            await self._budget.release(size)
            raise
        return payload, size

    @staticmethod
    async def _read_large(reader: asyncio.StreamReader, size: int) -> bytes:
        # chunks, joined once complete: a partial frame holds only the bytes received
        chunks: list[bytes] = []
        remaining = size
        while remaining:
            chunk = await reader.read(min(remaining, _CHUNK))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", remaining)
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    async def _respond(self, payload: bytes, peer: str) -> _Answer:
        api_key, version, correlation_id = struct.unpack_from(">hhi", payload)
        try:
            request = decode_request(payload)
        except Exception as exc:
            # Kafka answers an ApiVersions request it cannot parse with version 0 and error 35,
            # listing what it supports; any other unsupported or malformed request closes the
            # connection.
            unsupported = isinstance(exc, UnsupportedVersionError)
            if unsupported and api_key == 18:
                code = errno(Errors.UnsupportedVersionError)
                return self.broker.api_versions_error(correlation_id), api_key, code
            if M.on:
                code = errno(
                    Errors.UnsupportedVersionError if unsupported else Errors.InvalidRequestError
                )
                observe(api_key, code, len(payload) + 4, 0, 0.0)
            self.bad.warning(
                "unsupported request; closing" if unsupported else "malformed request; closing",
                peer=peer,
                api_key=api_key,
                version=version,
                error=str(exc) if unsupported else _one_line(exc),
            )
            raise _CloseError from None
        handler = self._handlers[api_key]
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # a bug, not a client error: one line naming where, and an error answer
            self.bad.warning(
                "request failed",
                api_key=api_key,
                version=version,
                peer=peer,
                error=_one_line(exc),
            )
            if api_key == 0 and getattr(request, "acks", 1) == 0:
                if M.on:
                    observe(api_key, errno(Errors.UnknownError), len(payload) + 4, 0, 0.0)
                raise _CloseError from None  # acks=0 is never answered: Kafka closes instead
            response = error_response(api_key, errno(Errors.UnknownError))
        code = first_error(response) if M.on else 0
        if api_key == 0 and request.acks == 0:  # never answered
            return None, api_key, code
        response.API_VERSION = version
        response.with_header(correlation_id=correlation_id)
        try:
            out: bytes | bytearray = response.encode(header=True, framed=True)
        except Exception as exc:
            self.bad.warning(
                "response not encodable", api_key=api_key, version=version, error=_one_line(exc)
            )
            response = error_response(api_key, errno(Errors.UnknownError))
            response.API_VERSION = version
            response.with_header(correlation_id=correlation_id)
            out = response.encode(header=True, framed=True)
            code = errno(Errors.UnknownError)
        return out, api_key, code


_Answer = tuple[bytes | bytearray | None, int, int]
"""What one request gets: the response frame (``None``: nothing is sent, acks=0), and for
the metrics its API key and first error code (0 when metrics are off). A plain tuple: it is
built for every request, metrics or not."""


def error_response(api_key: int, code: int) -> Any:
    """A response of API ``api_key`` with every field defaulted and ``code`` as its
    top-level error code where the API has one (Kafka's answer to a request that failed as a
    whole)."""
    request_cls = REQUESTS[api_key]
    module = sys.modules[request_cls.__module__]
    response_cls = getattr(module, request_cls.__name__.replace("Request", "Response"))
    try:
        return response_cls(error_code=code)
    except Exception:
        return response_cls()


def _one_line(exc: BaseException) -> str:
    """``exc`` and where it was raised, on one line."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = "" if tb is None else f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
    return f"{type(exc).__name__}: {exc}{where}".replace("\n", " ")[:500]


_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
HEAP_BLOCK_BYTES = 32 << 20
"""Blocks up to this size come from malloc's heap in the listener's process, not from a fresh
mmap each (glibc's largest such threshold on 64-bit)."""
HEAP_KEPT_BYTES = 64 << 20
"""How much freed memory malloc keeps for reuse in the listener's process before it returns
any to the OS."""


def keep_freed_memory(
    block_bytes: int = HEAP_BLOCK_BYTES, kept_bytes: int = HEAP_KEPT_BYTES
) -> bool:
    """Make glibc's malloc serve blocks up to ``block_bytes`` from its heap and keep up to
    ``kept_bytes`` of freed memory for reuse. Process-wide: only the CLI's ``eventlane serve
    --kafka``, which owns its process, calls it (an application running :func:`serve` in
    its own process decides for itself). A produce request's megabyte of records is copied
    into several fresh buffers on its way in (asyncio's stream buffer, the frame,
    kafka-python's field, the stored batch): by default glibc returns freed megabytes to the
    OS (or maps them afresh) and faults their pages in again, ~0.25 ms a MiB (2,000-35,000
    page faults per 2M records produced by kcat in 1 MB batches; under 600 with this).
    ``False`` (nothing changed) where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, block_bytes)) and bool(
        mallopt(_M_TRIM_THRESHOLD, kept_bytes)
    )


def serve(
    log_: Log,
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    advertised: str | None = None,
    auto_create_topics: bool = True,
    ready: Callable[[KafkaServer], None] | None = None,
    limits: Limits | None = None,
) -> None:
    """Run a :class:`KafkaServer` until interrupted (the CLI's ``eventlane serve --kafka``)."""

    async def main() -> None:
        server = KafkaServer(
            log_,
            host,
            port,
            advertised=advertised,
            auto_create_topics=auto_create_topics,
            limits=limits,
        )
        await server.start()
        if ready is not None:
            ready(server)
        try:
            await server.serve_forever()
        finally:
            # a clean stop (SIGINT/SIGTERM): the groups' members are gone now, not after
            # their lease (blocking, as the loop is stopping)
            server.broker.groups.unpublish()

    asyncio.run(main())


__all__ += ["REQUESTS", "SUPPORTED"]
