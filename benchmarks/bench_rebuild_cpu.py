"""Spark rebuild CPU against the local engine, as a data engineer measures it: the CLI.

History: ``--events`` invoicing events on 8 partitions (``bench_rebuild.generate``). Each
round runs, alternating, ``eventlane rebuild example_apps.invoicing.app:app -p
customer_balances --engine local`` (``--projection invoices``: the other read model) and
the same with ``--engine spark --master local[2]`` (a fresh process each: the JVM's start
and exit are in the figure, as they are for whoever runs the command), and, once per
round, Spark's fixed cost alone (start a session, run a one-row job, stop) with the JVM's
defaults and as a rebuild starts it (``REBUILD_JVM_OPTIONS``, the class archive, no data
source registered).

The class archive (``eventlane.replay.class_archive``) lives in a scratch directory: it is
written by a first rebuild session before the rounds (its CPU is printed as a note) and
mapped by every session after, as on a machine where a rebuild ran before.

CPU is the command's and every process it starts (the JVM, its Python workers), counted
by ``perf stat -e task-clock`` (inherited by every descendant; ``/usr/bin/time`` misses the
JVM, which its parent never waits for). Figures: CPU microseconds per event of each engine,
Spark's ratio to the local engine's in the same round (the bar: <= 1.3), and the fixed
costs in CPU seconds.

    .venv/bin/python benchmarks/bench_rebuild_cpu.py [--quick] [--runs 5] [--events N] [--projection P]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import Target, bench_from_args, parser, quiet_logs, scratch_dir
from bench_rebuild import generate

from eventlane.replay.class_archive import ENV as CLASS_ARCHIVE

ROOT = Path(__file__).resolve().parents[1]
EVENTLANE = [sys.executable, "-m", "eventlane.cli"]
FIXED = """
from eventlane.replay.session import spark_session
s = spark_session("local[2]", rebuild={rebuild}); s.range(1).count(); s.stop()
"""


def cpu_s(cmd: list[str]) -> float:
    """CPU seconds of ``cmd`` and all its descendants (``perf stat``), its output dropped."""
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("bench_rebuild_cpu.py needs perf (linux-tools) to count every process")
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
        subprocess.run(
            [perf, "stat", "-e", "task-clock", "-x", ",", "-o", out.name, "--", *cmd],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        for line in out.read().splitlines():
            if "task-clock" in line:
                return float(line.split(",")[0]) / 1000
    raise RuntimeError("perf stat printed no task-clock")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=None, help="history size (default 300k)")
    p.add_argument(
        "--projection",
        default="customer_balances",
        choices=("customer_balances", "invoices"),
        help="the read model rebuilt (default customer_balances)",
    )
    args = p.parse_args()
    quiet_logs()
    events = args.events or (30_000 if args.quick else 300_000)
    bench = bench_from_args(__file__, args)
    with scratch_dir(args.tmp, "rebuild-cpu") as root:
        data = root / "data"
        t0 = time.perf_counter()
        count = generate(data, events, 8)
        bench.notes.append(
            f"history: {count:,} events on 8 partitions ({time.perf_counter() - t0:.0f} s);"
            f" read model {args.projection}"
        )

        def engine(name: str) -> float:
            cmd = [
                *EVENTLANE,
                "--data",
                str(data),
                "rebuild",
                "example_apps.invoicing.app:app",
                "-p",
                args.projection,
                "--engine",
                name,
                "--master",
                "local[2]",
                "--output",
                str(root / f"{name}.sqlite"),
            ]
            return cpu_s(cmd) / count * 1e6

        def fixed(rebuild: bool) -> float:
            return cpu_s([sys.executable, "-c", FIXED.format(rebuild=rebuild)])

        os.environ[CLASS_ARCHIVE] = str(root / "classes")
        bench.notes.append(f"first rebuild session, writing the class archive: {fixed(True):.1f} s")

        bench.rounds(
            {
                "local": lambda: engine("local"),
                "spark": lambda: engine("spark"),
                "fixed_default": lambda: fixed(False),
                "fixed_rebuild": lambda: fixed(True),
            }
        )
    for local, spark in zip(bench.series["local"], bench.series["spark"], strict=True):
        bench.record("ratio", spark / local)
    bench.add("local engine, CLI end to end", "us/ev", "local")
    bench.add("spark local[2], CLI end to end", "us/ev", "spark", baseline="local")
    bench.add("spark / local CPU, per round", "x", "ratio", target=Target("<", 1.3))
    bench.add("Spark fixed cost, JVM defaults (start, 1 job, stop)", "s", "fixed_default")
    bench.add(
        "Spark fixed cost, as a rebuild starts it", "s", "fixed_rebuild", baseline="fixed_default"
    )
    bench.finish()


if __name__ == "__main__":
    main()
