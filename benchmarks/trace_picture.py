"""The picture of one order's trace in docs/observability.md, drawn from a real run.

Runs the invoicing demo as the tracing test does (tests/projection/test_tracing.py): three
``eventlane project run`` processes (the invoicing policy and two projectors) export their
spans with the OpenTelemetry SDK (``EVENTLANE_TRACES_FILE``); this process places and
confirms one order under a ``POST /orders`` span, waits until every projection caught up,
merges the exports and prints the trace as a tree (stdout, Markdown) with each span's
process, start and duration relative to the request, and writes an SVG timeline.

    python benchmarks/trace_picture.py [--svg docs/img/invoicing-trace.svg]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parents[1]
APP = "example_apps.invoicing:app"
PROJECTORS = ("invoicing_policy", "orders_by_status", "invoices")
_CLI = (sys.executable, "-m", "eventlane.cli")
COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2")


def _cli(data: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "eventlane.cli", "--data", str(data), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return done.stdout


def _caught_up(data: Path) -> bool:
    for name in PROJECTORS:
        [doc] = json.loads(_cli(data, "project", "status", APP, "-p", name, "--json"))["projectors"]
        if doc["lag"] or not doc["partitions"]:
            return False
    return True


def run(tmp: Path) -> tuple[list[dict[str, Any]], str]:
    """One order through the demo; every exported span, and the order's trace id."""
    from example_apps.invoicing import app  # noqa: PLC0415
    from example_apps.invoicing.domain import Order  # noqa: PLC0415
    from example_apps.invoicing.events import Address, OrderLine  # noqa: PLC0415

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    data, spans_file = tmp / "data", tmp / "spans"
    with app.open(data):
        pass
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVENTLANE_TRACES_FILE": str(spans_file)}
    procs = [
        subprocess.Popen(
            [*_CLI, "--data", str(data), "project", "run", APP, "-p", name, "--no-live"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in PROJECTORS
    ]
    try:
        deadline = time.monotonic() + 120
        while not _caught_up(data):  # the workers own their partitions
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.5)
        tracer = trace.get_tracer("invoicing-demo")
        with app.open(data) as runtime, tracer.start_as_current_span("POST /orders") as root:
            line, home = OrderLine("sku-1", 2, 1250), Address("1 Main St", "Oslo", "NO")
            runtime.execute(Order, "o-1", lambda o: o.place("c-1", [line], home), create=True)
            runtime.execute(Order, "o-1", lambda o: o.confirm())
        deadline = time.monotonic() + 180
        while not _caught_up(data):
            assert time.monotonic() < deadline, "the projections did not catch up"
            time.sleep(0.5)
        time.sleep(1.0)  # the last batch spans end after their positions commit
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    spans = [
        json.loads(s.to_json(indent=None)) | {"process": "command process"}
        for s in exporter.get_finished_spans()
    ]
    for path in sorted(tmp.glob("spans.*")):
        mine = [json.loads(text) for text in path.read_text().splitlines()]
        names = sorted(
            {s["attributes"]["eventlane.projector"] for s in mine if s["name"].startswith("batch ")}
        )
        for span in mine:
            spans.append(span | {"process": f"worker {'+'.join(names) or path.suffix[1:]}"})
    return spans, f"0x{root.get_span_context().trace_id:032x}"


def _ms(stamp: str, zero: datetime) -> float:
    return (datetime.fromisoformat(stamp) - zero).total_seconds() * 1000


def _detail(span: dict[str, Any]) -> str:
    a = span["attributes"]
    parts = []
    if "eventlane.projector" in a:
        parts.append(a["eventlane.projector"])
    if "messaging.destination.name" in a:
        where = a["messaging.destination.name"]
        if "messaging.destination.partition.id" in a:
            where += f"[{a['messaging.destination.partition.id']}]"
        if "eventlane.offset" in a:
            where += f"@{a['eventlane.offset']}"
        parts.append(where)
    if "eventlane.aggregate.version" in a:
        parts.append(f"v{a['eventlane.aggregate.version']}")
    if "eventlane.batch.records" in a:
        parts.append(f"{a['eventlane.batch.records']} records")
    return ", ".join(parts)


def picture(spans: list[dict[str, Any]], trace_id: str) -> tuple[list[tuple[int, dict]], Any]:
    """The trace's spans depth-first (depth, span), then the batch spans linking to it."""
    mine = [s for s in spans if s["context"]["trace_id"] == trace_id]
    ids = {s["context"]["span_id"] for s in mine}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in mine:
        parent = span["parent_id"] if span["parent_id"] in ids else None
        children.setdefault(parent, []).append(span)
    rows: list[tuple[int, dict[str, Any]]] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s["start_time"]):
            rows.append((depth, span))
            walk(span["context"]["span_id"], depth + 1)

    walk(None, 0)
    linked = sorted(
        (
            s
            for s in spans
            if s["name"].startswith("batch ")
            and any(link["context"]["span_id"] in ids for link in s.get("links", []))
        ),
        key=lambda s: s["start_time"],
    )
    return rows, linked


def text(rows: list[tuple[int, dict[str, Any]]], linked: list[dict[str, Any]]) -> str:
    zero = datetime.fromisoformat(rows[0][1]["start_time"])
    out = [f"{'span':<52} {'process':<28} {'start ms':>9} {'took ms':>8}  where"]
    for depth, span in rows + [(0, s) for s in linked]:
        label = ("  " * depth + ("└─ " if depth else "")) + span["name"]
        if span in linked:
            label = f"{span['name']} (links {len(span.get('links', []))} trace(s))"
        start = _ms(span["start_time"], zero)
        took = _ms(span["end_time"], zero) - start
        out.append(f"{label:<52} {span['process']:<28} {start:>9.1f} {took:>8.1f}  {_detail(span)}")
    return "\n".join(out)


def svg(rows: list[tuple[int, dict[str, Any]]], linked: list[dict[str, Any]]) -> str:
    everything = [s for _, s in rows] + linked
    zero = datetime.fromisoformat(rows[0][1]["start_time"])
    end = max(_ms(s["end_time"], zero) for s in everything)
    processes = sorted({s["process"] for s in everything}, key=lambda p: p != "command process")
    colour = {p: COLOURS[i % len(COLOURS)] for i, p in enumerate(processes)}
    label_w, bar_w, row_h = 330, 560, 22
    height = row_h * (len(everything) + len(processes) + 3)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 20}"'
        f' height="{height}" font-family="monospace" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for i, (depth, span) in enumerate([*rows, *((0, s) for s in linked)]):
        y = row_h * (i + 1)
        start, stop = _ms(span["start_time"], zero), _ms(span["end_time"], zero)
        x = label_w + start / end * bar_w
        w = max(2.0, (stop - start) / end * bar_w)
        name = span["name"] if span not in linked else f"{span['name']} (linked)"
        parts.append(
            f'<text x="{6 + 12 * depth}" y="{y + 15}">{escape(name)}</text>'
            f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}"'
            f' fill="{colour[span["process"]]}"><title>{escape(_detail(span))}'
            f" ({stop - start:.1f} ms)</title></rect>"
        )
    y = row_h * (len(everything) + 2)
    parts.append(f'<text x="6" y="{y}">0 to {end:.0f} ms</text>')
    for i, process in enumerate(processes):
        y = row_h * (len(everything) + 2 + i) + 6
        parts.append(
            f'<rect x="{label_w}" y="{y}" width="12" height="12" fill="{colour[process]}"/>'
            f'<text x="{label_w + 18}" y="{y + 11}">{escape(process)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--svg", type=Path, help="also write the timeline as SVG here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spans, trace_id = run(Path(tmp))
    rows, linked = picture(spans, trace_id)
    print(text(rows, linked))
    if args.svg:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(svg(rows, linked))


if __name__ == "__main__":
    main()
