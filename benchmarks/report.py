"""Print the results written by ``--json`` runs as markdown, for docs/performance.md.

    .venv/bin/python benchmarks/report.py [bench_append bench_read ...]

For each script (default: every ``benchmarks/results/*.json`` that is not a ``--quick``
run), prints the exact command line, the machine and contention line, the results table and
the notes, in that order.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from _harness import RESULTS_DIR


def section(path: Path) -> str:
    body = json.loads(path.read_text())
    machine = body["machine"]
    load = body.get("contention") or {}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(body["started"]))
    command = " ".join([".venv/bin/python", f"benchmarks/{body['script']}", *body["argv"]])
    lines = [
        f"### {body['script']}",
        "",
        f"`{command}` — {when}, {body['seconds']:.0f} s; {machine['cpus']} CPUs"
        f" ({machine['cpu_model']}), Python {machine['python']},"
        f" native extension {machine['native_extension']},"
        f" calibration `sum(range(1000))` = {machine['calibration_us_sum_range_1000']} µs;"
        f" steal {load.get('steal_percent')} %, other processes busy"
        f" {load.get('others_busy_percent')} % of the machine, load average"
        f" {load.get('loadavg_1min')}.",
        "",
        body["markdown"],
        "",
    ]
    lines += [f"* {note}" for note in body.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    if argv:
        paths = [RESULTS_DIR / f"{name.removesuffix('.py')}.json" for name in argv]
    else:
        paths = sorted(p for p in RESULTS_DIR.glob("*.json") if not p.stem.endswith("-quick"))
    for path in paths:
        print(section(path))


if __name__ == "__main__":
    main(sys.argv[1:])
