"""CLI start-up: wall time and peak memory of ``eventlane topics list`` as whole processes.

Per round, interleaved, each a fresh interpreter started the way a user starts it:

* ``baseline``  ``python -c "import click, rich.console"``: the two libraries every command
                needs (argument parsing and terminal output); nothing of eventlane.
* ``bare``      ``python -c "pass"``: the interpreter alone (context).
* ``topics``    ``eventlane --data DIR topics list`` on a data directory holding 3 topics.
* ``help``      ``eventlane --help`` (lists every command, built-in or installed by an
                application's entry point: imports none of them; issue 36).

Before timing, the ``eventlane`` package the command imports is compiled to bytecode
(``compileall``), as an installed package is: where ``PYTHONDONTWRITEBYTECODE`` is set (as on
the machine these figures come from) every start would otherwise compile eventlane's
modules from source, while click and rich load from the bytecode their installer wrote.

Wall time is measured around the process, CPU time (user + system) from its resource usage
(``os.wait4``); peak memory is its maximum resident set size as GNU ``time -f %M`` reports it
(needs ``/usr/bin/time``: ``apt-get install time``). Not ``os.wait4``'s ``ru_maxrss``: Linux
carries the parent's high-water mark into a forked child across ``exec``, so every child of
this 30 MiB benchmark process would report >= 30 MiB. Targets (issue 15): ``topics`` <= 1.5x
the baseline's wall time and <= 40 MiB.

    .venv/bin/python benchmarks/bench_cli_startup.py [--runs 7] [--json]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from _harness import Target, bench_from_args, parser, scratch_dir

EVENTLANE = shutil.which("eventlane", path=str(Path(sys.executable).parent)) or "eventlane"


GNU_TIME = "/usr/bin/time"


def run(argv: Sequence[str]) -> Mapping[str, float]:
    """Wall milliseconds, CPU milliseconds (user + system) and peak RSS (MiB) of one process
    running ``argv``.

    CPU time comes from ``os.wait4`` on the ``time`` process (a process's usage includes its
    waited-for children): on a machine that other jobs keep busy, wall time swings with
    their load while CPU time stays close to the work the process itself does."""
    with tempfile.NamedTemporaryFile("r") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [GNU_TIME, "-q", "-f", "%M %e", "-o", out.name, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stderr.close()
        if proc.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed: {err.decode()}")
        max_kib = out.read().split()[0]
    return {
        "wall_ms": wall * 1000,
        "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000,
        "rss_mib": int(max_kib) / 1024,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    if not os.access(GNU_TIME, os.X_OK):
        raise SystemExit(f"{GNU_TIME} (GNU time) is needed for peak memory: apt-get install time")
    bench = bench_from_args(__file__, args, default_runs=7)
    bench.notes.append(f"eventlane entry point: {EVENTLANE}; every figure is a whole process")
    package = subprocess.run(
        [sys.executable, "-c", "import eventlane, os; print(os.path.dirname(eventlane.__file__))"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # not the current directory: the one `eventlane` imports
    ).stdout.strip()
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], check=True)
    bench.notes.append(f"bytecode compiled first: {package}")
    with scratch_dir(args.tmp, "cli") as root:
        data = str(root / "data")
        for name in ("orders", "payments", "audit"):
            subprocess.run(
                [EVENTLANE, "--data", data, "topics", "create", name, "--partitions", "3"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        measures = {
            "baseline": lambda: run([sys.executable, "-c", "import click, rich.console"]),
            "bare": lambda: run([sys.executable, "-c", "pass"]),
            "topics": lambda: run([EVENTLANE, "--data", data, "topics", "list"]),
            "help": lambda: run([EVENTLANE, "--help"]),
        }
        bench.rounds(measures, warmup=True)
    bench.add("python -c pass (context)", "ms", "bare.wall_ms")
    bench.add("baseline: import click, rich.console", "ms", "baseline.wall_ms")
    bench.add(
        "eventlane topics list, wall",
        "ms",
        "topics.wall_ms",
        baseline="baseline.wall_ms",
    )
    bench.add("eventlane --help, wall", "ms", "help.wall_ms", baseline="baseline.wall_ms")
    bench.add("baseline: CPU (user + system)", "ms", "baseline.cpu_ms")
    bench.add("eventlane --help, CPU", "ms", "help.cpu_ms", baseline="baseline.cpu_ms")
    bench.add("eventlane --help, peak RSS", "MiB", "help.rss_mib", baseline="baseline.rss_mib")
    bench.add(
        "eventlane topics list, CPU (user + system)",
        "ms",
        "topics.cpu_ms",
        baseline="baseline.cpu_ms",
        note="less sensitive to other jobs' load than wall time",
    )
    bench.add("baseline: peak RSS", "MiB", "baseline.rss_mib")
    bench.add(
        "eventlane topics list, peak RSS",
        "MiB",
        "topics.rss_mib",
        baseline="baseline.rss_mib",
        target=Target("<", 40),
    )
    bench.finish()


if __name__ == "__main__":
    main()
