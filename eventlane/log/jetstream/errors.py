"""What a nats-py error means for the caller: the one place that maps ``nats.errors.*`` and
``nats.js.errors.*`` to eventlane's errors (:mod:`eventlane.errors`).

Invariant: no nats-py exception leaves the JetStream adapter. Every one becomes

* :class:`~eventlane.errors.LogUnavailableError` (retriable) when nothing was written: no
  responders, no leader, a read or an admin request that timed out, a connection that was
  closed before the request left;
* :class:`~eventlane.errors.OutcomeUnknownError` (indeterminate) when a write was sent and no
  answer says what became of it: a timeout or a lost connection after the request left, a
  retried publish whose first copy is still being proposed ("duplicate message id is in
  process", 10158), a leader whose store closed under a committed entry (10077), any
  "unavailable" answer to a write (it may come from a stale replica while the leader
  stores the write);
* :class:`~eventlane.errors.ConcurrencyError` for a refused expected sequence, and the
  specific :mod:`eventlane.errors` classes for a missing stream or an oversized record;
* a plain :class:`~eventlane.errors.LogError` (permanent) for any other refusal by the
  server: a refusal means nothing was stored.
"""

from __future__ import annotations

import re

import nats.errors
import nats.js.errors

from eventlane.errors import (
    ConcurrencyError,
    FrameworkError,
    LogError,
    LogUnavailableError,
    OutcomeUnknownError,
    RecordTooLargeError,
    UnknownTopicError,
)

STREAM_NOT_FOUND = 10059
CLUSTER_NOT_AVAILABLE = 10008  # no leader / JetStream cluster not available
STORE_CLOSED = 10077  # the leader's store closed: an entry raft committed may still apply
IN_PROCESS = 10158  # "duplicate message id is in process": the first copy is being proposed
TOO_MANY_REQUESTS = 10167  # the leader's ingest queue is full: dropped before it was stored
NO_PEERS = 10005  # "no suitable peers for placement": a stream (or KV bucket) was not created

RETRY_CODES = frozenset({CLUSTER_NOT_AVAILABLE, STORE_CLOSED, IN_PROCESS, TOO_MANY_REQUESTS})
"""API error codes worth asking again (with the same message id for a publish)."""

NOTHING_SENT = (
    nats.errors.NoRespondersError,  # nobody subscribes to the subject: nothing received it
    nats.js.errors.NoStreamResponseError,
)
"""Transient errors that say the request reached nobody who could store it."""

TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)
"""Errors for which asking again (the same request) may succeed."""


def retry_api_error(exc: nats.js.errors.APIError) -> bool:
    """An API error worth asking again: no leader (503), leader changing, a full ingest
    queue, a publish still in process, a placement that failed because a peer is offline
    for now (seen just after a cluster starts, and under load: nothing was created). KV
    errors carry no code: not retried."""
    code = getattr(exc, "err_code", None)
    return getattr(exc, "code", None) == 503 or code in RETRY_CODES or _peer_offline(exc)


def _peer_offline(exc: nats.js.errors.APIError) -> bool:
    """A placement refused only because a peer is offline (other placement refusals, e.g.
    too few servers for the replicas or no matching tags, do not pass by waiting)."""
    text = getattr(exc, "description", None) or ""
    return getattr(exc, "err_code", None) == NO_PEERS and "peer offline" in text


def maybe_stored(exc: BaseException) -> bool:
    """Whether a write that failed with ``exc`` may nevertheless be stored.

    Only "no responders" proves nothing received it. A retriable API error does not: every
    replica of a stream receives a publish, and the answer that arrives first may be a
    stale ex-leader's ("not leader", "unavailable") while the real leader stores it (seen
    by the partition soak). A permanent refusal (a bad request) is a refusal."""
    if isinstance(exc, nats.js.errors.APIError):
        return retry_api_error(exc) and not _peer_offline(exc)
    return not isinstance(exc, NOTHING_SENT)


def translate(
    exc: BaseException,
    *,
    topic: str | None = None,
    partition: int | None = None,
    write: bool = False,
) -> FrameworkError:
    """The eventlane error for nats-py's ``exc``; ``write``: the failed request was a write
    (a timeout or a lost connection then leaves its outcome unknown)."""
    if isinstance(exc, FrameworkError):
        return exc
    if isinstance(exc, nats.js.errors.APIError):
        return _api(exc, topic, partition, write)
    if isinstance(exc, (*NOTHING_SENT, nats.errors.NoServersError)):
        return LogUnavailableError(
            f"JetStream: nobody answered ({exc!r}); nothing sent", topic=topic, partition=partition
        )
    if isinstance(exc, TRANSIENT):
        if write:
            return OutcomeUnknownError(
                f"JetStream: no answer to a write ({exc!r}); it may or may not be stored",
                topic=topic,
                partition=partition,
            )
        return LogUnavailableError(
            f"JetStream: no answer ({exc!r})", topic=topic, partition=partition
        )
    if isinstance(exc, nats.errors.Error):
        return LogError(f"JetStream client error: {exc!r}", topic=topic, partition=partition)
    return LogError(f"JetStream: unexpected {exc!r}", topic=topic, partition=partition)


def _api(
    exc: nats.js.errors.APIError, topic: str | None, partition: int | None, write: bool
) -> FrameworkError:
    text = getattr(exc, "description", None) or type(exc).__name__
    code = getattr(exc, "err_code", None)
    status = getattr(exc, "code", None)
    if text.startswith("wrong last sequence"):
        found = re.search(r"(\d+)\s*$", text)
        return ConcurrencyError(
            "JetStream refused an expected sequence",
            expected=None,
            actual=int(found.group(1)) - 1 if found else None,
            unit="last offset",
            topic=topic,
            partition=partition,
        )
    if write and maybe_stored(exc):
        return OutcomeUnknownError(
            f"JetStream: {text} ({code}); the write may or may not be stored",
            topic=topic,
            partition=partition,
        )
    if retry_api_error(exc):
        return LogUnavailableError(
            f"JetStream cluster unavailable: {text}", topic=topic, partition=partition
        )
    if code == STREAM_NOT_FOUND or status == 404:
        if topic is not None:
            return UnknownTopicError(f"topic {topic!r} has no stream: {text}", topic=topic)
        return LogError(f"JetStream: not found: {text}", topic=topic, partition=partition)
    if status == 413 or "maximum payload" in text:
        return RecordTooLargeError(
            f"rejected by the server: {text}", topic=topic, partition=partition
        )
    what = "the append" if write else "the request"
    return LogError(f"JetStream refused {what}: {text} ({code})", topic=topic, partition=partition)
