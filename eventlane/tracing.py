"""OpenTelemetry traces: one order's trace from the command through its events, the policy,
the commands it issues and every projection.

eventlane uses the OpenTelemetry *API* only; the application chooses the SDK and exporters
(as with any instrumented library). Spans:

* ``command <Aggregate>`` around ``execute``/``issue``/``save`` (sync and async faces):
  aggregate type, topic, and once stored the partition, first offset and version;
* ``handle <EventType>`` around each projector or policy handler, *a child of the span that
  appended the event*: the W3C ``traceparent`` of the current span travels in every event
  record's headers (written by the codec), so a handler's span, and a command it issues,
  join the trace of the request that caused the event;
* ``batch <projector>`` around a worker's batch (one transaction), with a link to each
  traced record it applied (at most :data:`MAX_LINKS`): one batch serves many traces.

Cost: while no SDK is set up (the API not even loaded, or loaded with no tracer provider
set), no span is started and every hook is a dictionary lookup and a type check
(:func:`tracer`). Nothing personal goes into a span: types, topics, partitions, offsets and
versions only, never event fields or error messages with values.

Entry points (the CLI and the workers it starts) set up an SDK themselves only when asked by
the environment: ``EVENTLANE_TRACES_FILE=PATH`` exports each process's spans as JSON lines to
``PATH.<pid>`` (:func:`configure_from_env`, what the tests merge across processes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

__all__ = [
    "MAX_LINKS",
    "TRACEPARENT",
    "attempt",
    "batch_span",
    "command_span",
    "command_stored",
    "configure_from_env",
    "decide_span",
    "handler_span",
    "inject",
    "load_span",
    "loaded",
    "loaded_from",
    "save_span",
    "stored",
    "tracer",
]

TRACEPARENT = "traceparent"
"""The W3C trace-context header carried by event records."""
MAX_LINKS = 32
"""Links a batch span keeps to the traces of the records it applied."""
TRACES_FILE_ENV = "EVENTLANE_TRACES_FILE"


_cached: tuple[Any, Any] = (None, None)
"""``(provider, eventlane's tracer from it)``."""
_asked = False
"""Whether the API was asked for its provider once (it then reads the environment's
``OTEL_PYTHON_TRACER_PROVIDER``): from then on the API's global says whether one is set."""


def tracer() -> Any:
    """eventlane's tracer, or ``None`` while no SDK is set up: the OpenTelemetry API not
    loaded (one dictionary lookup), or loaded with no tracer provider set or a no-op one
    (nothing would be recorded: no span is started at all).

    The API's ``get_tracer_provider()`` reads the environment on every call while no
    provider is set (~5 us); it is asked once, and after that the API's module global
    (``set_tracer_provider`` assigns it) is read: ``None`` means still no provider."""
    global _cached, _asked  # noqa: PLW0603 - the provider is process-wide
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = getattr(trace, "_TRACER_PROVIDER", trace)  # (the module: an API without it)
    if provider is None:
        if _asked:
            return None
        provider = trace.get_tracer_provider()
        _asked = True
    elif provider is trace:
        provider = trace.get_tracer_provider()
    if provider is _cached[0]:
        return _cached[1]
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        _cached = (provider, None)  # the same object until an SDK's provider is set
        return None
    _cached = (provider, provider.get_tracer("eventlane"))
    return _cached[1]


def inject() -> bytes | None:
    """The ``traceparent`` of the current span, for a record's headers (``None``: none)."""
    if tracer() is None:
        return None
    trace = sys.modules["opentelemetry.trace"]
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}".encode()


def _context_of(headers: Sequence[tuple[str, bytes | None]]) -> Any:
    """The span context a record's ``traceparent`` names, as a parent context (or None)."""
    global _propagator  # noqa: PLW0603 - made once, on first use
    for name, value in headers:
        if name == TRACEPARENT and value:
            if _propagator is None:
                from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
                    TraceContextTextMapPropagator,
                )

                _propagator = TraceContextTextMapPropagator()
            return _propagator.extract({TRACEPARENT: value.decode()})
    return None


_propagator: Any = None


_NONE: AbstractContextManager[None] = nullcontext()
"""What every span hook returns while no SDK is set up: no span object, nothing to build."""
PARTITION = "messaging.destination.partition.id"
_command: ContextVar[Any] = ContextVar("eventlane_command_span", default=None)
"""The ``command`` span of the command path running in this context (``None``: none)."""
_load: ContextVar[Any] = ContextVar("eventlane_load_span", default=None)
"""The ``load`` span of the aggregate being loaded in this context (``None``: none)."""


@contextmanager
def _span(t: Any, name: str, attributes: dict[str, Any], **options: Any) -> Iterator[Any]:
    """A current span that, on an exception, records only its type (``error.type`` and an
    error status): an exception's message may carry an aggregate id or a field's value."""
    with t.start_as_current_span(
        name,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
        **options,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


@contextmanager
def command_span(kind: str, aggregate: str, topic: str) -> Iterator[Any]:
    """``command <Aggregate>``: ``kind`` is execute, issue or save. The command path notes
    its attempts (:func:`attempt`) and where it stored (:func:`command_stored`) on it."""
    t = tracer()
    if t is None:
        yield None
        return
    with _span(
        t,
        f"command {aggregate}",
        {
            "eventlane.command": kind,
            "eventlane.aggregate.type": aggregate,
            "messaging.destination.name": topic,
        },
    ) as span:
        token = _command.set(span)
        try:
            yield span
        finally:
            _command.reset(token)


def attempt(number: int) -> None:
    """The command path starts attempt ``number``: ``eventlane.command.attempts``."""
    span = _command.get()
    if span is not None:
        span.set_attribute("eventlane.command.attempts", number)


def command_stored(written: Sequence[Any], version: int | None) -> None:
    """The command path is done: where its events were stored (none: only the version)."""
    span = _command.get()
    if span is None:
        return
    if written:
        first = written[0]
        stored(span, first.topic, first.partition, first.offset, version)
    elif version is not None:
        span.set_attribute("eventlane.aggregate.version", version)


def load_span(aggregate: str, topic: str) -> AbstractContextManager[Any]:
    """``load <Aggregate>``, a child of the command span (none without one: like
    :func:`decide_span` and :func:`save_span`, a context-variable lookup): the version loaded
    (:func:`loaded`) and where from (``eventlane.load.source``: ``log`` unless the stream
    module notes ``cache`` or ``snapshot``, :func:`loaded_from`)."""
    t = tracer() if _command.get() is not None else None
    if t is None:
        return _NONE
    return _load_span(t, aggregate, topic)


@contextmanager
def _load_span(t: Any, aggregate: str, topic: str) -> Iterator[Any]:
    with _span(
        t,
        f"load {aggregate}",
        {
            "eventlane.aggregate.type": aggregate,
            "messaging.destination.name": topic,
            "eventlane.load.source": "log",
        },
    ) as span:
        token = _load.set(span)
        try:
            yield span
        finally:
            _load.reset(token)


def loaded_from(source: str) -> None:
    """The aggregate being loaded comes from ``source`` (``cache``, ``snapshot``)."""
    span = _load.get()
    if span is not None:
        span.set_attribute("eventlane.load.source", source)


def loaded(span: Any, version: int | None) -> None:
    """The load span's version (``None``: nothing to decide on, a policy's command issued
    already)."""
    if span is None:
        return
    if version is None:
        span.set_attribute("eventlane.load.source", "issued")
    else:
        span.set_attribute("eventlane.aggregate.version", version)
        if version == 0:
            span.set_attribute("eventlane.load.source", "new")


def decide_span(aggregate: str) -> AbstractContextManager[Any]:
    """``decide <Aggregate>``: the application's command function on the loaded aggregate."""
    t = tracer() if _command.get() is not None else None
    if t is None:
        return _NONE
    return _span(t, f"decide {aggregate}", {"eventlane.aggregate.type": aggregate})


def save_span(aggregate: str, topic: str, version: int) -> AbstractContextManager[Any]:
    """``save <Aggregate>``: one conditional append of a decision's events, ``version`` the
    aggregate's version once they are stored; :func:`stored` adds where they went."""
    t = tracer() if _command.get() is not None else None
    if t is None:
        return _NONE
    return _span(
        t,
        f"save {aggregate}",
        {
            "eventlane.aggregate.type": aggregate,
            "messaging.destination.name": topic,
            "eventlane.aggregate.version": version,
        },
    )


def stored(span: Any, topic: str, partition: int, offset: int, version: int | None) -> None:
    """Note where a command's events were stored on its span."""
    if span is None:
        return
    span.set_attribute(PARTITION, str(partition))
    span.set_attribute("eventlane.offset", offset)
    if version is not None:
        span.set_attribute("eventlane.aggregate.version", version)


@contextmanager
def handler_span(
    projector: str, event_type: str, topic: str, partition: int, offset: int, headers: Any
) -> Iterator[Any]:
    """``handle <EventType>``, a child of the span that appended the record."""
    t = tracer()
    if t is None:
        yield None
        return
    with _span(
        t,
        f"handle {event_type}",
        {
            "eventlane.projector": projector,
            "eventlane.event.type": event_type,
            "messaging.destination.name": topic,
            PARTITION: str(partition),
            "eventlane.offset": offset,
        },
        context=_context_of(headers),
    ) as span:
        yield span


@contextmanager
def batch_span(projector: str, records: Sequence[Any]) -> Iterator[Any]:
    """``batch <projector>`` with links to the traces of (up to MAX_LINKS) records."""
    t = tracer()
    if t is None:
        yield None
        return
    from opentelemetry.trace import Link, get_current_span  # noqa: PLC0415

    links = []
    for record in records:
        parent = _context_of(record.headers)
        if parent is not None:
            links.append(Link(get_current_span(parent).get_span_context()))
            if len(links) >= MAX_LINKS:
                break
    with _span(
        t,
        f"batch {projector}",
        {"eventlane.projector": projector, "eventlane.batch.records": len(records)},
        links=links,
    ) as span:
        yield span


def configure_from_env() -> None:
    """In an entry point: with ``EVENTLANE_TRACES_FILE`` set, export this process's spans
    as JSON lines to ``<that path>.<pid>`` through the OpenTelemetry SDK (installed with the
    ``tracing`` extra). Does nothing otherwise."""
    path = os.environ.get(TRACES_FILE_ENV)
    if not path:
        return
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    out = open(f"{path}.{os.getpid()}", "a", encoding="utf-8")  # noqa: SIM115 - process-long
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        )
    )
    trace.set_tracer_provider(provider)
