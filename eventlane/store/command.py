"""The command path: decide on an aggregate's stream, append conditionally, retry.

``execute``, ``issue`` and ``save`` are one loop (:func:`plan`), written *sans I/O*: a
generator that yields what it needs done (:mod:`eventlane.store.steps`: a
:class:`~eventlane.store.steps.LogCall` for each call of the log a decision's load, an
append or a read-back makes; a :class:`~eventlane.store.steps.Call` for other blocking work;
a :class:`~eventlane.store.steps.Pause` for a back-off) and gets the results sent back (or
exceptions thrown in). Two thin drivers perform the requests: :func:`drive` on the calling
thread (the sync :class:`~eventlane.Runtime`) and the async runtime's on an event loop
(:mod:`eventlane.app.aio`: the log's calls awaited on its asyncio face where it has one, the
rest in a thread pool); the decisions, version checks and retries exist once. Each attempt
*decides* (loads
the aggregate and runs the command on it; a save's decision is the aggregate it was given),
then appends the decision's events as one batch, conditionally on the stream's last record
the decision was made on (:meth:`EventStore.append`). What the append answers:

* stored: done;
* :class:`ConcurrencyError` (nothing written; the store dropped its cached stream, so the
  next decision reads the log): decide again (``execute``, ``issue``) or raise (``save``);
* :class:`LogUnavailableError` (nothing written): wait a growing, jittered pause
  (:func:`unavailable_pause`) and try again;
* :class:`OutcomeUnknownError` (maybe stored): never appended again blindly. The attempt
  becomes a *doubt*; before each later decision, and before giving up, the stream is read
  back from the log, uncached, and each doubt settled by its event ids
  (:meth:`EventStore.outcome`): its first event at its version means it was stored (the
  command is done and returns as if the append had answered); another event there means it
  never will be (its append was conditional on that version being free); nothing there means
  it may still land, so the next append is conditional on the same record (at most one of
  the two can be stored) and the doubt is settled again after it. A doubt can land between
  the look for it and the next decision: a decision made on a stream that already reaches a
  doubt's version is never appended; the doubts are settled again first (a JetStream stream
  leader cut off under load stored a command twice before this rule).

Invariants: a command's effect is stored at most once, and reported done only when stored
(its events read back or acknowledged); at most ``attempts`` appends; when attempts run out
(or the command fails) while a doubt is neither stored nor superseded, or the log cannot be
read to tell, the caller gets :class:`OutcomeUnknownError`, never a ConcurrencyError nor
success.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, TypeVar

from eventlane.codec import Envelope
from eventlane.domain import Aggregate
from eventlane.errors import (
    ConcurrencyError,
    FrameworkError,
    LogUnavailableError,
    OutcomeUnknownError,
)
from eventlane.log import RecordMetadata
from eventlane.metrics import M
from eventlane.observability import get_logger
from eventlane.store.event_store import UNKNOWN_OFFSET, EventStore, Outcome
from eventlane.store.steps import Call, LogCall, Pause, Step, drive
from eventlane.tracing import PARTITION, command_stored, save_span
from eventlane.tracing import attempt as trace_attempt

log = get_logger("eventlane.store")

A = TypeVar("A", bound=Aggregate)
R = TypeVar("R")


class _Attempt(NamedTuple):
    """A decision on its way to the log: the aggregate and the envelopes of its events."""

    aggregate: Aggregate
    envelopes: list[Envelope[Any]]


def envelopes_of(
    aggregate: Aggregate, correlation_id: str | None, causation_id: str | None
) -> list[Envelope[Any]]:
    """The aggregate's pending events as envelopes (versions after its committed one)."""
    base = aggregate.committed_version
    return [
        Envelope(
            event,
            aggregate.id,
            base + i,
            correlation_id=correlation_id,
            causation_id=causation_id,
        )
        for i, event in enumerate(aggregate.pending_events, start=1)
    ]


__all__ = ["Call", "LogCall", "Pause", "Step", "drive", "plan", "run"]


def run(
    store: EventStore,
    topic: str,
    aggregate_id: str,
    decide: Callable[[], Generator[Step, Any, A | None]],
    *,
    attempts: int,
    retry_conflicts: bool,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> tuple[A | None, list[RecordMetadata]]:
    """:func:`plan` driven on the calling thread (:func:`drive`)."""
    return drive(
        plan(
            store,
            topic,
            aggregate_id,
            decide,
            attempts=attempts,
            retry_conflicts=retry_conflicts,
            correlation_id=correlation_id,
            causation_id=causation_id,
        )
    )


def plan(
    store: EventStore,
    topic: str,
    aggregate_id: str,
    decide: Callable[[], Generator[Step, Any, A | None]],
    *,
    attempts: int,
    retry_conflicts: bool,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> Generator[Step, Any, tuple[A | None, list[RecordMetadata]]]:
    """Decide and append until stored, at most ``attempts`` times (see the module docstring).

    A generator of I/O requests (:mod:`eventlane.store.steps`): it does no I/O itself, so
    the same loop runs under the sync driver (:func:`drive`) and the async one
    (:mod:`eventlane.app.aio`). ``decide`` (a plan itself) returns the aggregate with its
    pending events (``None``: nothing to do; the same object again: append the same events
    again). Returns the aggregate whose events were stored, still pending (the caller marks
    them committed), and their records.

    Traced (:mod:`eventlane.tracing`): the command span counts the attempts and, once done,
    notes where the events were stored; each append is a ``save`` span."""
    aggregate, written = yield from _attempts(
        store,
        topic,
        aggregate_id,
        decide,
        attempts=attempts,
        retry_conflicts=retry_conflicts,
        correlation_id=correlation_id,
        causation_id=causation_id,
    )
    command_stored(written, None if aggregate is None else aggregate.version)
    return aggregate, written


def _attempts(
    store: EventStore,
    topic: str,
    aggregate_id: str,
    decide: Callable[[], Generator[Step, Any, A | None]],
    *,
    attempts: int,
    retry_conflicts: bool,
    correlation_id: str | None,
    causation_id: str | None,
) -> Generator[Step, Any, tuple[A | None, list[RecordMetadata]]]:
    doubts: list[_Attempt] = []
    current: _Attempt | None = None
    failure: FrameworkError | None = None
    for attempt in range(1, attempts + 1):
        appending = False
        pause = 0.0
        trace_attempt(attempt)
        try:
            if doubts:
                stored = yield from _settle(store, topic, aggregate_id, doubts)
                if stored is not None:
                    return stored  # type: ignore[return-value]
            aggregate = yield from decide()
            if aggregate is None or not aggregate.pending_events:
                # nothing to do (or, for ``issue``, done by its cause), unless an attempt
                # landed: then that attempt is the command's effect
                last = yield from _last_word(store, topic, aggregate_id, doubts)
                return last or (aggregate, [])  # type: ignore[return-value]
            if doubts and aggregate.committed_version >= _first_version(doubts):
                # The decision saw a record where a doubt would be, although the look for it
                # (just before) did not: it landed in between. Look again, never append on it.
                stored = yield from _settle(store, topic, aggregate_id, doubts)
                if stored is not None:
                    return stored  # type: ignore[return-value]
                if doubts and aggregate.committed_version >= _first_version(doubts):
                    raise LogUnavailableError(
                        f"aggregate {aggregate_id!r}: the log's reads disagree on its stream"
                        " (an append of unknown outcome may be landing); trying again",
                        topic=topic,
                    )
            if current is None or current.aggregate is not aggregate:
                current = _Attempt(aggregate, envelopes_of(aggregate, correlation_id, causation_id))
            appending = True
            written = yield from _append(store, topic, current)
            return aggregate, written
        except ConcurrencyError as exc:
            failure, pause = exc, conflict_pause(attempt) if attempt > 1 else 0.0
            if not retry_conflicts:
                break
        except LogUnavailableError as exc:
            failure, pause = exc, unavailable_pause(attempt)
        except OutcomeUnknownError as exc:
            if not appending or current is None:
                raise
            failure, pause = exc, 0.0
            if all(d is not current for d in doubts):
                doubts.append(current)
        except Exception:  # the command failed: done if an earlier attempt landed
            stored = yield from _last_word(store, topic, aggregate_id, doubts)
            if stored is not None:
                return stored  # type: ignore[return-value]
            raise
        log.debug(
            "command not stored; retrying",
            topic=topic,
            aggregate_id=aggregate_id,
            attempt=attempt,
            error=str(failure),
        )
        if M.on and attempt < attempts:
            M.retries.labels(topic, _reason(failure)).inc()
        if attempt < attempts and pause:
            yield Pause(pause)
    stored = yield from _last_word(store, topic, aggregate_id, doubts)
    if stored is not None:
        return stored  # type: ignore[return-value]
    assert failure is not None
    raise failure


def _reason(failure: FrameworkError | None) -> str:
    """A retry's reason (the ``reason`` label of ``eventlane_store_command_retries_total``)."""
    if isinstance(failure, OutcomeUnknownError):
        return "unknown"
    if isinstance(failure, LogUnavailableError):
        return "unavailable"
    return "conflict"


def _append(
    store: EventStore, topic: str, attempt: _Attempt
) -> Generator[Step, Any, list[RecordMetadata]]:
    aggregate = attempt.aggregate
    base = aggregate.committed_version
    known = aggregate._stored_offset
    envelopes = attempt.envelopes
    with save_span(type(aggregate).__name__, topic, base + len(envelopes)) as span:
        if span is not None:
            partition = yield from store.streams.partition_plan(topic, aggregate.id)
            span.set_attribute(PARTITION, str(partition))
        written = yield from store.append_plan(
            topic,
            aggregate.id,
            base,
            envelopes,
            expected_offset=UNKNOWN_OFFSET if base and known is None else known,
        )
        if span is not None and written:
            span.set_attribute("eventlane.offset", written[0].offset)
            span.set_attribute("eventlane.offset.last", written[-1].offset)
        return written


def _first_version(doubts: list[_Attempt]) -> int:
    """The lowest version an append of unknown outcome would have written."""
    return min(d.envelopes[0].aggregate_version for d in doubts)


def _settle(
    store: EventStore, topic: str, aggregate_id: str, doubts: list[_Attempt]
) -> Generator[Step, Any, tuple[Aggregate, list[RecordMetadata]] | None]:
    """The doubt that was stored, with its records; drops the doubts that never can be."""
    for doubt in list(doubts):
        outcome, written = yield from store.outcome_plan(topic, aggregate_id, doubt.envelopes)
        if outcome is Outcome.STORED:
            log.info(
                "append of unknown outcome was stored",
                topic=topic,
                aggregate_id=aggregate_id,
                offset=written[0].offset,
            )
            return doubt.aggregate, written
        if outcome is Outcome.SUPERSEDED:
            doubts.remove(doubt)
    return None


def _last_word(
    store: EventStore, topic: str, aggregate_id: str, doubts: list[_Attempt]
) -> Generator[Step, Any, tuple[Aggregate, list[RecordMetadata]] | None]:
    """Before the command ends without storing anything: the doubt found stored, if any;
    ``None`` when none is left that could still land; else (or when the log cannot be
    read to tell) :class:`OutcomeUnknownError`."""
    if not doubts:
        return None
    cause: Exception | None = None
    try:
        stored = yield from _settle(store, topic, aggregate_id, doubts)
    except LogUnavailableError as exc:
        stored, cause = None, exc
    if stored is not None or not doubts:
        return stored
    partition = yield from store.streams.partition_plan(topic, aggregate_id)
    raise OutcomeUnknownError(
        f"aggregate {aggregate_id!r}: an append may or may not be stored, and the log cannot"
        " tell yet; read the aggregate before deciding again",
        topic=topic,
        partition=partition,
    ) from cause


def conflict_pause(attempt: int) -> float:
    """Seconds to wait before retry ``attempt + 1`` of a command that lost a race: none
    after the first conflict (the common case: one other writer, retry at once), then a
    random pause up to 0.5 ms x 2^attempt, at most 50 ms ("full jitter"). Without it,
    writers that keep losing to each other on one hot aggregate retry in lock step and one
    can lose every one of its attempts (8 threads on one aggregate did, 20 times in a row)."""
    return random.uniform(0.0, min(0.05, 0.0005 * 2**attempt))


def unavailable_pause(attempt: int) -> float:
    """Seconds to wait before retry ``attempt + 1`` of a command the log could not take
    (:class:`LogUnavailableError`: a leader being elected, a replica cut off): a random
    pause up to 10 ms x 2^attempt, at most 1 s, so 20 attempts span about 15 s."""
    return random.uniform(0.0, min(1.0, 0.01 * 2**attempt))
