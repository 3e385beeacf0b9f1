"""What metrics and traces cost, counted in instructions (load-independent; issue 31).

    python benchmarks/instructions_observability.py [--figure append command apply ...]
        [--config metrics enabled] [--repeat 3]

CPU-time ratios on a shared machine swing more than the 3 % bar; valgrind's callgrind
counts the user-space instructions a process executes, the same at any load. Each figure
runs in a fresh process under callgrind twice, with ``small`` and ``large`` operations;
instructions per operation = the difference / (large - small), start-up and set-up
cancelled out. The count still moves a little between identical runs (the garbage
collector's full passes fall at other moments when the heap differs, and a command's wait
for its fsync polls), so each figure is measured ``--repeat`` times, configurations
alternating, and the median and range are printed. Configurations:

* ``off``: neither metrics nor the OpenTelemetry API loaded (the baseline);
* ``metrics``: ``eventlane.metrics.enable()`` (the instruments on);
* ``enabled``: metrics on and the OpenTelemetry API loaded with no SDK: **the bar,
  <= 1.03x of off**.

Figures: ``append`` (one 100-byte record to a ``flush_policy="os"`` topic), ``command``
(a durable ``execute`` of the invoicing app's ``Order.place``: its fsync is kernel time,
not counted, so the ratio here is of user-space work only and the real one is smaller)
and ``apply`` (the ``orders_by_status`` projector's :class:`BatchApplier` with
``batch_span`` and the worker's instruments, per event, batches of 500). Needs
``valgrind`` (Debian package). Takes ~10 minutes for all.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from _callgrind import ROOT, count_child

SIZES = {"append": (1000, 6000), "command": (100, 600), "apply": (1000, 3000)}
"""Per figure, the small and the large count of operations."""
CHILD = r"""
import sys, tempfile
from pathlib import Path
figure, config, n, given = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if config in ("metrics", "enabled"):
    import eventlane.metrics as fm
    fm.enable()
if config == "enabled":
    from opentelemetry import trace
data = Path(given or tempfile.mkdtemp())  # apply: the orders written before valgrind
value = b"v" * 100
if figure == "append":
    from eventlane.log import LogStore
    log = LogStore(data)
    log.create_topic("bench", 1, {"flush_policy": "os"})
    for i in range(n):
        log.append("bench", 0, [(b"k%d" % (i % 1000), value, (), None)])
    sys.exit(0)
from example_apps.invoicing import app
from example_apps.invoicing.domain import Order
from example_apps.invoicing.events import Address, OrderLine
line, home = OrderLine("s", 1, 100), Address("a", "b", "c")
place = lambda o: o.place("c", [line], home)
with app.open(data / "log") as rt:
    if figure == "command":
        for i in range(20):  # warm up
            rt.execute(Order, f"w{i}", place, create=True)
        for i in range(n):
            rt.execute(Order, f"o{i}", place, create=True)
        sys.exit(0)
    import time
    from eventlane.metrics import M, batch_applied
    from eventlane.projection.applier import BatchApplier
    from eventlane.projection.readmodel import ReadModel
    from eventlane.projection.schema import apply_migrations
    from eventlane.tracing import batch_span
    topic = rt.names.topic("orders")
    records = []
    for p in range(rt.log.partition_count(topic)):
        records.extend(rt.log.read(topic, p, 0, max_bytes=1 << 30)[0])
    records = records[:n]
    cls = app.projector("orders_by_status")
    rm = ReadModel(Path(tempfile.mkdtemp()) / "rm.sqlite")  # a fresh read model each run
    apply_migrations(cls.migrations, rm)
    applier = BatchApplier(cls(), rt.codec, rm)
    for i in range(0, len(records), 500):
        batch = records[i : i + 500]
        started = time.perf_counter()
        with batch_span("orders_by_status", batch):
            result = applier.apply(batch)
        if M.on:  # as the projector worker counts a batch
            seconds = time.perf_counter() - started
            topics = (r.topic for r in batch)
            batch_applied("orders_by_status", "bench", topics, result.applied, result.dead_lettered, seconds)
    rm.close()
"""


def instructions(figure: str, config: str, n: int, given: str) -> int:
    """User-space instructions of one child process doing ``n`` operations."""
    return count_child(CHILD, figure, config, str(n), given)


def orders(count: int) -> str:
    """A data directory with ``count`` placed orders (the ``apply`` input, written once,
    outside valgrind: only the applying is counted)."""
    script = (
        "import sys\n"
        "from example_apps.invoicing import app\n"
        "from example_apps.invoicing.domain import Order\n"
        "from example_apps.invoicing.events import Address, OrderLine\n"
        "line, home = OrderLine('s', 1, 100), Address('a', 'b', 'c')\n"
        "with app.open(sys.argv[1] + '/log') as rt:\n"
        "    for i in range(int(sys.argv[2])):\n"
        "        rt.execute(Order, f'p{i}', lambda o: o.place('c', [line], home), create=True)\n"
    )
    data = tempfile.mkdtemp(prefix="instructions-")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script, data, str(count)], check=True, cwd=ROOT, env=env)
    return data


def per_operation(figure: str, config: str, given: str) -> float:
    small, large = SIZES[figure]
    counts = [instructions(figure, config, n, given) for n in (large, small)]
    return (counts[0] - counts[1]) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figure", nargs="+", choices=sorted(SIZES), default=sorted(SIZES))
    parser.add_argument("--config", nargs="+", choices=("metrics", "enabled"), default=["enabled"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for figure in args.figure:
        per: dict[str, list[float]] = {config: [] for config in ("off", *args.config)}
        given = orders(max(SIZES[figure])) if figure == "apply" else ""
        for _ in range(args.repeat):
            for config, counts in per.items():
                counts.append(per_operation(figure, config, given))
        if given:
            shutil.rmtree(given)
        off = statistics.median(per["off"])
        print(f"{figure} off: {off:,.0f} instructions an operation", flush=True)
        for config in args.config:
            ratios = [on / base for on, base in zip(per[config], per["off"], strict=True)]
            on = statistics.median(per[config])
            print(
                f"{figure} {config}: {on:,.0f} instructions, {on / off:.3f}x of off"
                f" (+{on - off:,.0f}; paired ratios {min(ratios):.3f}-{max(ratios):.3f},"
                f" {args.repeat} runs)",
                flush=True,
            )


if __name__ == "__main__":
    main()
