"""Traces (issue 31 item 3): one order's spans across the command process (this one), the
invoicing policy's worker and two projector workers share one trace id, with the right
parents (a handler's span is a child of the span that appended its event; the policy's
command a child of its handler) and batch spans linking to the records' traces. Each worker
exports its spans with the OpenTelemetry SDK (``EVENTLANE_TRACES_FILE``); the test merges
them with this process's in-memory export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from example_apps.invoicing import app
from example_apps.invoicing.domain import Order
from example_apps.invoicing.events import Address, OrderLine

APP = "example_apps.invoicing:app"
ROOT = Path(__file__).resolve().parents[2]
PROJECTORS = ("invoicing_policy", "orders_by_status", "invoices")

exporter = InMemorySpanExporter()


_ATTACHED: set[int] = set()


def _provider() -> None:
    """The process's SDK provider (another test module may have set it first: the provider is
    process-wide and set once) with this module's exporter attached, once."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if id(provider) not in _ATTACHED:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _ATTACHED.add(id(provider))


def _hex(value: int) -> str:
    return f"0x{value:016x}"


def _status(data: Path, name: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventlane.cli",
            "--data",
            str(data),
            "project",
            "status",
            APP,
            "-p",
            name,
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    [doc] = json.loads(done.stdout)["projectors"]
    return doc  # type: ignore[no-any-return]


def test_one_order_is_one_trace_across_processes(tmp_path: Path) -> None:
    _provider()
    data = tmp_path / "data"
    traces = tmp_path / "spans"
    with app.open(data):
        pass
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVENTLANE_TRACES_FILE": str(traces)}
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventlane.cli",
                "--data",
                str(data),
                "project",
                "run",
                APP,
                "-p",
                name,
                "--no-live",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in PROJECTORS
    }
    tracer = trace.get_tracer("test")
    try:
        with app.open(data) as runtime, tracer.start_as_current_span("POST /orders") as root:
            line = OrderLine("sku-1", 2, 1250)
            home = Address("1 Main St", "Oslo", "NO")
            runtime.execute(Order, "o-1", lambda o: o.place("c-1", [line], home), create=True)
            runtime.execute(Order, "o-1", lambda o: o.confirm())
        trace_id = root.get_span_context().trace_id
        deadline = time.monotonic() + 180
        while any(
            _status(data, n)["lag"] or not _status(data, n)["partitions"] for n in PROJECTORS
        ):
            assert time.monotonic() < deadline, "projections did not catch up"
            time.sleep(0.5)
        time.sleep(1.0)  # the last batch spans end after the positions commit
    finally:
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=60)

    spans: list[dict[str, Any]] = []
    for span in exporter.get_finished_spans():
        spans.append(json.loads(span.to_json(indent=None)) | {"process": "command"})
    exporter.shutdown()  # the provider is process-wide: later tests' spans are not kept
    files = sorted(tmp_path.glob("spans.*"))
    assert len(files) >= 3, files  # one per worker process (the supervisors trace nothing)
    for path in files:
        for line_ in path.read_text().splitlines():
            spans.append(json.loads(line_) | {"process": path.name})
    mine = [s for s in spans if s["context"]["trace_id"] == f"0x{trace_id:032x}"]
    by_id = {s["context"]["span_id"]: s for s in mine}
    names = sorted(s["name"] for s in mine)

    commands = [s for s in mine if s["name"] == "command Order"]
    assert len(commands) == 2 and all(s["process"] == "command" for s in commands)
    assert {s["attributes"]["eventlane.command"] for s in commands} == {"execute"}

    def parent(span: dict[str, Any]) -> dict[str, Any]:
        return by_id[span["parent_id"]]

    handled = [s for s in mine if s["name"].startswith("handle ")]
    processes = {s["process"] for s in handled}
    assert len(processes) == 3, names  # the policy's worker and two projectors' workers
    # each handler span is a child of the save span that appended its event, a child of
    # its command span (with a load and a decide span beside it)
    for span in handled:
        assert parent(span)["name"] in ("save Order", "save Invoice"), span["name"]
        assert parent(parent(span))["name"] in ("command Order", "command Invoice")
    for command in commands:
        kids = sorted(
            (s for s in mine if s.get("parent_id") == command["context"]["span_id"]),
            key=lambda s: s["start_time"],
        )
        assert [s["name"] for s in kids] == ["load Order", "decide Order", "save Order"]
        assert command["attributes"]["eventlane.command.attempts"] == 1
        assert "eventlane.offset" in command["attributes"]  # execute spans say where, too
    [policy] = [
        s
        for s in handled
        if s["attributes"]["eventlane.projector"] == "invoicing_policy"
        and s["name"] == "handle OrderConfirmed"
    ]
    [invoice_cmd] = [s for s in mine if s["name"] == "command Invoice"]
    assert invoice_cmd["parent_id"] == policy["context"]["span_id"]  # issued by the handler
    assert invoice_cmd["process"] == policy["process"]
    assert invoice_cmd["attributes"]["eventlane.command"] == "issue"
    [issued] = [s for s in handled if s["name"] == "handle InvoiceIssued"]
    assert parent(issued)["parent_id"] == invoice_cmd["context"]["span_id"]
    assert issued["process"] not in (policy["process"], "command")
    assert {
        s["name"] for s in handled if s["attributes"]["eventlane.projector"] == "orders_by_status"
    } >= {"handle OrderPlaced", "handle OrderConfirmed"}
    # batch spans: their own traces, linked to the records' spans
    linked = {
        link["context"]["span_id"]
        for s in spans
        if s["name"].startswith("batch ")
        for link in s.get("links", [])
    }
    saves = [s for s in mine if s["name"].startswith("save ")]
    assert {s["parent_id"] for s in saves} == {
        s["context"]["span_id"] for s in [*commands, invoice_cmd]
    }
    assert {s["context"]["span_id"] for s in saves} <= linked
    # nothing personal in any span: no customer name, address or line values
    text = json.dumps(mine)
    assert "Main St" not in text and "Oslo" not in text
