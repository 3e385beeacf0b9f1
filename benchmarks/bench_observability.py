"""What metrics and traces cost (issue 31): CPU time per operation of durable commands, of
single-record appends and of a projector applying batches, in six configurations:

* ``off`` and ``off-again`` (the baseline twice: their ratio is the run's noise, the
  tolerance every other ratio is read against);
* ``metrics``: the instruments on (``eventlane.metrics.enable``);
* ``otel-api``: the OpenTelemetry API loaded, no SDK (non-recording: no span is started);
* ``enabled``: both, metrics and tracing enabled with no exporter: **the bar, <= 1.03x**;
* ``otel-sdk``: the SDK recording every span into an in-memory exporter (reported).

Each configuration runs in a fresh process (imports are part of the state); every round
runs all six, in an order that alternates, so a noisy minute hurts each alike. A process
measures each figure in several blocks (commands, appends and batches interleaved) and
reports the median block; the table gives, per configuration, the median over rounds and
the **median of the per-round ratios to ``off``** with their range. The ``enabled``
process also toggles the instruments (``M.on``) block by block and reports on/off ratios
measured in one process: the metrics' cost with the least noise a loaded machine allows.

The projector figure is a worker's batch as :meth:`ProjectorWorker.apply` runs it:
``batch_span`` around :class:`BatchApplier` (a ``handle`` span per event where tracing
records) and, metrics on, the batch's instruments. Appends go to a topic with
``flush_policy="os"`` (no fsync: the smallest denominator); commands use the default
(``always``: one fsync each, counted by the fsync instruments).

    python benchmarks/bench_observability.py [--rounds 7] [--blocks 4] [--commands 100]
        [--appends 400] [--events 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ("off", "off-again", "metrics", "otel-api", "enabled", "otel-sdk")
FIGURES = (
    ("command_us", "durable command (`execute`)"),
    ("append_us", "append, one record (`LogStore.append`)"),
    ("apply_us", "projector batch, per event"),
)

CHILD = r"""
import json, statistics, sys, tempfile, time
config = sys.argv[1]
blocks, commands, appends, events = (int(a) for a in sys.argv[2:6])
if config in ("metrics", "enabled", "otel-sdk"):
    import eventlane.metrics as m
    m.enable()
if config in ("otel-api", "enabled", "otel-sdk"):
    from opentelemetry import trace
if config == "otel-sdk":
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
from example_apps.invoicing import app
from example_apps.invoicing.domain import Order
from example_apps.invoicing.events import Address, OrderLine
from eventlane.metrics import M, batch_applied
from eventlane.projection.applier import BatchApplier
from eventlane.projection.readmodel import ReadModel
from eventlane.projection.schema import apply_migrations
from eventlane.tracing import batch_span
cpu = time.process_time
data = __import__("pathlib").Path(tempfile.mkdtemp())
line, home = OrderLine("s", 1, 100), Address("a", "b", "c")
place = lambda o: o.place("c", [line], home)
value = b"v" * 100
out = {"command_us": [], "append_us": [], "apply_us": []}
with app.open(data / "log") as rt:
    rt.log.create_topic("bench", 1, {"flush_policy": "os"})
    for i in range(events):  # the projector's input (records carry traceparent under the SDK)
        rt.execute(Order, f"p{i}", place, create=True)
    topic = rt.names.topic("orders")
    records = []
    for p in range(rt.log.partition_count(topic)):
        records.extend(rt.log.read(topic, p, 0, max_bytes=1 << 30)[0])
    batches = [records[i : i + 500] for i in range(0, len(records), 500)]
    cls = app.projector("orders_by_status")
    for i in range(20):  # warm up
        rt.execute(Order, f"w{i}", place, create=True)
        rt.log.append("bench", 0, [(b"w", value, (), None)])
    n = 0
    for block in range(blocks):
        t0 = cpu()
        for _ in range(commands):
            rt.execute(Order, f"o{n}", place, create=True)
            n += 1
        out["command_us"].append((cpu() - t0) / commands * 1e6)
        t0 = cpu()
        for i in range(appends):
            rt.log.append("bench", 0, [(b"k%d" % i, value, (), None)])
        out["append_us"].append((cpu() - t0) / appends * 1e6)
        rm = ReadModel(data / f"rm{block}.sqlite")
        apply_migrations(cls.migrations, rm)
        applier = BatchApplier(cls(), rt.codec, rm)
        t0 = cpu()
        for batch in batches:
            started = time.perf_counter()
            with batch_span("orders_by_status", batch):
                result = applier.apply(batch)
            if M.on:  # as the projector worker counts a batch
                seconds = time.perf_counter() - started
                topics = (r.topic for r in batch)
                batch_applied("orders_by_status", "bench", topics, result.applied, result.dead_lettered, seconds)
        out["apply_us"].append((cpu() - t0) / len(records) * 1e6)
        rm.close()
        if config == "otel-sdk":
            exporter.clear()
    if config == "enabled":  # the instruments toggled in this one process, block by block
        paired = {"command": ([], []), "append": ([], [])}
        for block in range(4 * blocks):
            M.on = block % 4 in (1, 2)  # off, on, on, off: a drift favours neither
            t0 = cpu()
            for _ in range(commands):
                rt.execute(Order, f"o{n}", place, create=True)
                n += 1
            paired["command"][M.on].append((cpu() - t0) / commands * 1e6)
            t0 = cpu()
            for i in range(appends):
                rt.log.append("bench", 0, [(b"k%d" % i, value, (), None)])
            paired["append"][M.on].append((cpu() - t0) / appends * 1e6)
        M.on = True
        for key, (off, on) in paired.items():
            out[f"toggle_{key}"] = [statistics.median(on) / statistics.median(off)]
        # the instruments' own CPU, in a tight loop: what an append (and a command: its
        # append and its fsync) adds, to divide by the operation's CPU without them
        from eventlane.metrics import appended, fsynced
        reps, pc = 20000, time.perf_counter
        t0 = cpu()
        for _ in range(reps):
            started = pc()
            appended("bench", 1, 150, pc() - started)
        out["instr_append_us"] = [(cpu() - t0) / reps * 1e6]
        t0 = cpu()
        for _ in range(reps):
            started = pc()
            fsynced("bench", pc() - started, 1)
        out["instr_fsync_us"] = [(cpu() - t0) / reps * 1e6]
        from eventlane.tracing import command_span, inject  # a command's hooks, no SDK
        t0 = cpu()
        for _ in range(reps):
            with command_span("execute", "Order", "orders"):
                inject()
        out["instr_trace_us"] = [(cpu() - t0) / reps * 1e6]
print(json.dumps({k: statistics.median(v) for k, v in out.items()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--commands", type=int, default=100)
    parser.add_argument("--appends", type=int, default=400)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    results: dict[str, dict[str, list[float]]] = {
        c: {key: [] for key, _ in FIGURES} for c in CONFIGS
    }
    toggles: dict[str, list[float]] = {}
    started = time.monotonic()
    for round_ in range(args.rounds):
        order = CONFIGS if round_ % 2 == 0 else tuple(reversed(CONFIGS))
        for config in order:
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    config,
                    str(args.blocks),
                    str(args.commands),
                    str(args.appends),
                    str(args.events // 2),
                ],
                check=True,
                capture_output=True,
                text=True,
                cwd=root,
                env={
                    "PYTHONPATH": str(root),
                    "PATH": "/usr/bin:/bin",
                    "TMPDIR": tempfile.gettempdir(),
                },
            )
            row = json.loads(done.stdout.splitlines()[-1])
            for key, _ in FIGURES:
                results[config][key].append(row[key])
            for key in (
                "toggle_command",
                "toggle_append",
                "instr_append_us",
                "instr_fsync_us",
                "instr_trace_us",
            ):
                if key in row:
                    toggles.setdefault(key, []).append(row[key])
        print(f"# round {round_ + 1} done, {time.monotonic() - started:.0f} s", file=sys.stderr)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(
        f"# bench_observability: {args.rounds} rounds x {args.blocks} blocks,"
        f" {time.monotonic() - started:.0f} s, load average at the end {' '.join(load)}",
        file=sys.stderr,
    )
    if args.json:
        args.json.write_text(json.dumps({"results": results, "toggles": toggles}, indent=1))
    print(
        "| figure | config | median CPU us/op (min-max) | ratio to off: median of rounds (min-max) |"
    )
    print("| --- | --- | --- | --- |")
    for key, label in FIGURES:
        base = results["off"][key]
        for config in CONFIGS:
            values = results[config][key]
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            print(
                f"| {label} | {config} | {statistics.median(values):.1f}"
                f" ({min(values):.1f}-{max(values):.1f}) | {statistics.median(ratios):.3f}x"
                f" ({min(ratios):.2f}-{max(ratios):.2f}) |"
            )
    print()
    print("Metrics on/off in one process (`enabled`, blocks off, on, on, off...): on/off")
    for key in ("toggle_command", "toggle_append"):
        values = toggles.get(key, [])
        if values:
            print(
                f"* {key.removeprefix('toggle_')}: {statistics.median(values):.3f}x"
                f" ({min(values):.3f}-{max(values):.3f} over {len(values)} rounds)"
            )
    if toggles.get("instr_append_us"):
        append_us = statistics.median(toggles["instr_append_us"])
        fsync_us = statistics.median(toggles["instr_fsync_us"])
        command = statistics.median(results["off"]["command_us"])
        append = statistics.median(results["off"]["append_us"])
        print(
            f"* the instruments' own CPU: {append_us:.2f} us an append, {fsync_us:.2f} us an"
            f" fsync: {(append_us + fsync_us) / command * 100:.2f} % of a command,"
            f" {append_us / append * 100:.2f} % of an append (of the `off` medians)"
        )
        trace_us = statistics.median(toggles["instr_trace_us"])
        print(
            f"* a command's tracing hooks with the API and no SDK: {trace_us:.2f} us,"
            f" {trace_us / command * 100:.2f} % of a command"
        )


if __name__ == "__main__":
    main()
