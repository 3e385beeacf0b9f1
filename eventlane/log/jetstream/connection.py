"""One nats-py connection of a JetStream log, and the retry rule every request follows.

Invariants: the connection, its JetStream context and the topic registry's KV bucket belong
to one event loop (the :class:`~eventlane.log.jetstream.bridge.Bridge`'s); they are used only
by coroutines running on it. Transient cluster errors (no leader during an election,
timeouts, reconnects) are retried for up to ``retry_s`` seconds (:meth:`Connection.retry`);
when time is up a write that may have been stored is
:class:`~eventlane.errors.OutcomeUnknownError` and anything else
:class:`~eventlane.errors.LogUnavailableError` (nothing written). A refusal is never retried.
Failure detection is client side: a PING every :data:`PING_INTERVAL_S`, the connection
declared stale after :data:`MAX_OUTSTANDING_PINGS` unanswered ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from eventlane.errors import LogUnavailableError, OutcomeUnknownError, UnknownTopicError
from eventlane.log.jetstream import errors as e
from eventlane.log.jetstream import mapping as m
from eventlane.log.jetstream.headers import HeaderClient
from eventlane.log.remote import parse_log_url
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

T = TypeVar("T")

PING_INTERVAL_S = 1.0
"""Client-side failure detection: a PING every second, and the connection is declared stale
(and re-made to another server) after :data:`MAX_OUTSTANDING_PINGS` go unanswered, so a
server cut off from this client costs about 3 s, not nats-py's default two minutes."""

MAX_OUTSTANDING_PINGS = 2

NO_STREAM = (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)


def parse_url(url: str) -> dict[str, Any]:
    """``nats://h1:p1,h2:p2?namespace=ns&replicas=3`` -> keyword arguments of the log.

    >>> parse_url("nats://127.0.0.1:4222,127.0.0.1:4223?replicas=1")["servers"]
    ['nats://127.0.0.1:4222', 'nats://127.0.0.1:4223']
    """
    hosts, options = parse_log_url(url, "nats", {"namespace": str, "replicas": int})
    return {"servers": [f"nats://{h}" for h in hosts], **options}


class Connection:
    """The client side of a JetStream log: ``nc`` (nats-py's connection), ``js`` (its
    JetStream context), ``kv`` (the topic registry ``<ns>-topics``), made by :meth:`connect`
    on the loop that will run every coroutine using them (module docstring).

    ``on_gone(topic)`` is told when the registry says a topic is gone (its cached metadata
    must go too); ``on_wake`` receives the namespace's wake messages."""

    nc: Any
    js: Any
    kv: KeyValue

    def __init__(
        self,
        namespace: str,
        *,
        replicas: int,
        timeout: float,
        retry_s: float,
        on_gone: Callable[[str], None] = lambda _topic: None,
    ) -> None:
        self.namespace = namespace
        self.replicas = replicas
        self.timeout = timeout
        self.attempt_s = min(timeout, 2.0)
        """How long one single-record publish or direct get waits for its answer before it
        is asked again (the publish with the same ``Nats-Msg-Id``)."""
        self.retry_s = retry_s
        self.on_gone = on_gone

    async def connect(self, servers: list[str], on_wake: Callable[[Any], Awaitable[None]]) -> None:
        self.nc = HeaderClient()
        await self.nc.connect(
            servers=servers,
            connect_timeout=self.attempt_s,  # a server cut off is passed over quickly
            ping_interval=PING_INTERVAL_S,  # (annotated int; it sleeps that long)
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            allow_reconnect=True,
            no_echo=True,  # our own wake messages are counted locally
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnect,
            reconnected_cb=self._on_reconnect,
        )
        self.js = self.nc.jetstream(timeout=self.timeout)
        await self.nc.subscribe(m.wake_subject(self.namespace), cb=on_wake)
        bucket = f"{self.namespace}-topics"
        self.kv = await self.retry(
            lambda: self.js.create_key_value(bucket=bucket, history=1, replicas=self.replicas)
        )

    async def _on_error(self, exc: Exception) -> None:
        log.info("jetstream connection error", error=repr(exc))

    async def _on_disconnect(self) -> None:
        log.info("jetstream disconnected; reconnecting")

    async def _on_reconnect(self) -> None:
        log.info("jetstream reconnected", server=str(self.nc.connected_url))

    async def retry(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        what: str = "request",
        topic: str | None = None,
        partition: int | None = None,
        write: bool = False,
        sent: bool = False,
    ) -> T:
        """Run ``op``, retrying transient cluster errors for up to ``retry_s`` seconds.

        With ``topic``, "no responders" (no stream takes the subject) is first checked against
        the topic registry: a deleted topic raises :class:`UnknownTopicError` at once.
        When the time is up: :class:`OutcomeUnknownError` if ``write`` and any attempt may
        have been stored (``sent``: an attempt before this call may have been; a write is
        retried only when a repeat is harmless, e.g. under the same ``Nats-Msg-Id``), else
        :class:`LogUnavailableError`. A refusal is raised as nats-py's ``APIError``, which
        the caller (or the bridge) translates.
        """
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        maybe = sent
        while True:
            try:
                async with asyncio.timeout(3 * self.timeout):  # no extra task, unlike wait_for
                    return await op()
            except e.TRANSIENT as exc:
                err: Exception = exc
                if topic is not None and isinstance(exc, NO_STREAM):
                    await self.raise_if_gone(topic)
            except nats.js.errors.APIError as exc:
                if not e.retry_api_error(exc):
                    raise
                err = exc
            maybe = maybe or (write and e.maybe_stored(err))
            if time.monotonic() > deadline:
                detail = str(err) or repr(err)
                if maybe:
                    raise OutcomeUnknownError(
                        f"JetStream {what}: no answer for {self.retry_s}s ({detail}); it may or"
                        " may not be stored",
                        topic=topic,
                        partition=partition,
                    ) from err
                raise LogUnavailableError(
                    f"JetStream {what} failed for {self.retry_s}s: {detail}",
                    topic=topic,
                    partition=partition,
                ) from err
            log.debug("jetstream retry", what=what, error=repr(err))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def raise_if_gone(self, topic: str) -> None:
        """Raise :class:`UnknownTopicError` if the registry says ``topic`` is gone; a
        registry that cannot answer now (its leader is being elected too) says nothing, and
        the caller's retries go on."""
        try:
            await self.kv.get(topic)
        except nats.js.errors.KeyNotFoundError:
            self.on_gone(topic)
            raise UnknownTopicError(f"topic {topic!r} does not exist", topic=topic) from None
        except e.TRANSIENT:
            return
        except nats.js.errors.APIError as exc:
            if not e.retry_api_error(exc):
                raise
