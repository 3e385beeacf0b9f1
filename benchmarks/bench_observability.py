"""What metrics and traces cost (issue 31): durable commands and a projector's batch apply,
per-operation CPU time, with observability off (the baseline), with the metrics instruments
on, with the OpenTelemetry API loaded but no SDK (non-recording spans), and with the SDK
exporting to memory. Each configuration runs in a fresh process (imports are part of the
state), interleaved round by round; figures are medians over the rounds and ratios to "off"
measured in the same run. The bar (issue 31): metrics and tracing enabled but no exporter
<= 1.03x; the SDK exporting to memory is reported.

    python benchmarks/bench_observability.py [--rounds 5] [--commands 300] [--events 4000]
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

CONFIGS = ("off", "metrics", "otel-api", "otel-sdk")

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
config, commands, events = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if config in ("metrics", "otel-api", "otel-sdk"):
    import framework.metrics as m
    m.enable()
if config in ("otel-api", "otel-sdk"):
    from opentelemetry import trace
if config == "otel-sdk":
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
from example_apps.invoicing import app
from example_apps.invoicing.domain import Order
from example_apps.invoicing.events import Address, OrderLine
from framework.projection.applier import BatchApplier
from framework.projection.readmodel import ReadModel
from framework.projection.schema import apply_migrations
data = Path(tempfile.mkdtemp())
line, home = OrderLine("s", 1, 100), Address("a", "b", "c")
with app.open(data / "log") as rt:
    for i in range(20):  # warm up
        rt.execute(Order, f"w{i}", lambda o: o.place("c", [line], home), create=True)
    t0 = time.process_time()
    for i in range(commands):
        rt.execute(Order, f"o{i}", lambda o: o.place("c", [line], home), create=True)
    command_us = (time.process_time() - t0) / commands * 1e6
    for i in range(events // 2):
        rt.execute(Order, f"p{i}", lambda o: o.place("c", [line], home), create=True)
    topic = rt.names.topic("orders")
    records = []
    for p in range(rt.log.partition_count(topic)):
        records.extend(rt.log.read(topic, p, 0, max_bytes=1 << 30)[0])
    cls = app.projector("orders_by_status")
    rm = ReadModel(data / "rm.sqlite")
    apply_migrations(cls.migrations, rm)
    applier = BatchApplier(cls(), rt.codec, rm)
    t0 = time.process_time()
    applier.apply(records)
    apply_us = (time.process_time() - t0) / len(records) * 1e6
    rm.close()
print(json.dumps({"config": config, "command_us": command_us, "apply_us": apply_us}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--commands", type=int, default=300)
    parser.add_argument("--events", type=int, default=4000)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    results: dict[str, dict[str, list[float]]] = {
        c: {"command_us": [], "apply_us": []} for c in CONFIGS
    }
    started = time.monotonic()
    for round_ in range(args.rounds):
        order = CONFIGS if round_ % 2 == 0 else tuple(reversed(CONFIGS))
        for config in order:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, config, str(args.commands), str(args.events)],
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
            for key in ("command_us", "apply_us"):
                results[config][key].append(row[key])
    print(
        f"# bench_observability: {args.rounds} rounds, {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    print("| figure | config | median CPU us/op | min | max | ratio to off |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, label in (
        ("command_us", "durable command (execute)"),
        ("apply_us", "projector apply per event"),
    ):
        base = statistics.median(results["off"][key])
        for config in CONFIGS:
            values = results[config][key]
            med = statistics.median(values)
            print(
                f"| {label} | {config} | {med:.1f} | {min(values):.1f} | {max(values):.1f} |"
                f" {med / base:.3f}x |"
            )


if __name__ == "__main__":
    main()
