"""Traces of the command path (issue 31 item 3): one ``execute`` is a ``command <Aggregate>``
span with a ``load``, a ``decide`` and a ``save`` child per attempt, on the sync and the
async face, and nothing personal in any of them.

The conflict is a real one: runtime ``a`` caches the stream, runtime ``b`` (same data
directory) moves it, so ``a``'s first attempt decides on its stale cache and its conditional
append is refused; the second attempt reads the log and is stored. Spans are collected with
the OpenTelemetry SDK's in-memory exporter, in this process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from store_domain import AGGREGATES, Counter

from eventlane.app import App

SECRET = "writer-secret-value"
"""An event field value: it must not appear in any span."""


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the first test of this process to trace
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the provider is process-wide: later tests' spans are not kept


def _increment(counter: Counter) -> None:
    counter.increment(1, SECRET)


def _check_tree(spans: tuple[ReadableSpan, ...], root_id: int) -> None:
    by_id = {s.context.span_id: s for s in spans}

    def children(span: ReadableSpan) -> list[ReadableSpan]:
        found = [
            s for s in spans if s.parent is not None and s.parent.span_id == span.context.span_id
        ]
        return sorted(found, key=lambda s: s.start_time or 0)

    [command] = [
        s for s in spans if s.name == "command Counter" and s.parent and s.parent.span_id == root_id
    ]
    attrs: dict[str, Any] = dict(command.attributes or {})
    assert attrs["eventlane.command"] == "execute"
    assert attrs["eventlane.command.attempts"] == 2
    assert attrs["eventlane.aggregate.version"] == 3
    assert attrs["messaging.destination.name"] == "counters"
    assert attrs["messaging.destination.partition.id"] == "0"
    kids = children(command)
    assert [s.name for s in kids] == [
        "load Counter",
        "decide Counter",
        "save Counter",
        "load Counter",
        "decide Counter",
        "save Counter",
    ], [s.name for s in kids]
    load1, _, save1, load2, _, save2 = kids
    assert dict(load1.attributes or {})["eventlane.load.source"] == "cache"
    assert dict(load1.attributes or {})["eventlane.aggregate.version"] == 1
    assert dict(load2.attributes or {})["eventlane.load.source"] == "log"
    assert dict(load2.attributes or {})["eventlane.aggregate.version"] == 2
    refused = dict(save1.attributes or {})
    assert refused["error.type"] == "ConcurrencyError"
    assert "eventlane.offset" not in refused
    assert not save1.status.is_ok
    assert not save1.events  # no exception event: its message names the aggregate id
    saved = dict(save2.attributes or {})
    assert saved["messaging.destination.partition.id"] == "0"
    assert saved["eventlane.offset"] == 2  # the third record of the one partition
    assert saved["eventlane.aggregate.version"] == 3
    assert attrs["eventlane.offset"] == 2
    assert all(by_id.get(s.parent.span_id) is command for s in kids if s.parent)
    # nothing personal: the event field and the aggregate id appear nowhere
    text = " ".join(s.to_json() for s in spans)
    assert SECRET not in text and "counter-id-7" not in text


def test_execute_with_a_conflict_sync(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    app = App("store-tests", aggregates=AGGREGATES, partitions=1)
    with app.open(tmp_path) as a, app.open(tmp_path) as b:
        a.execute(Counter, "counter-id-7", _increment, create=True)  # a caches v1
        b.execute(Counter, "counter-id-7", _increment)  # b moves it to v2
        exporter.clear()
        with trace.get_tracer("test").start_as_current_span("request") as root:
            assert a.execute(Counter, "counter-id-7", _increment).version == 3
    _check_tree(exporter.get_finished_spans(), root.get_span_context().span_id)


def test_execute_with_a_conflict_async(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    app = App("store-tests", aggregates=AGGREGATES, partitions=1)

    async def main() -> int:
        with app.open(tmp_path) as b:  # opened first: opening bumps the codecs' generation
            async with app.open_async(tmp_path) as a:
                await a.execute(Counter, "counter-id-7", _increment, create=True)
                b.execute(Counter, "counter-id-7", _increment)
                exporter.clear()
                with trace.get_tracer("test").start_as_current_span("request") as root:
                    assert (await a.execute(Counter, "counter-id-7", _increment)).version == 3
        return root.get_span_context().span_id  # type: ignore[no-any-return]

    root_id = asyncio.run(main())
    _check_tree(exporter.get_finished_spans(), root_id)
