"""Print the results written by ``--json`` runs as markdown, for docs/performance.md.

    .venv/bin/python benchmarks/report.py [--dir DIR] [bench_append bench_read ...]

For each script (default: every ``benchmarks/results/*.json`` that is not a ``--quick``
run), prints the exact command line, the machine and contention line, the results table and
the notes, in that order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _harness import RESULTS_DIR


def section(path: Path) -> str:
    body = json.loads(path.read_text())
    machine = body["machine"]
    load = body.get("contention") or {"steal_percent": body.get("steal_percent")}
    busy = load.get("others_busy_percent")
    context = f"steal {load.get('steal_percent')} %" + (
        ""
        if busy is None
        else f", other processes busy {busy} % of the machine, load"
        f" average {load.get('loadavg_1min', 0):.1f}"
    )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(body["started"]))
    command = " ".join([".venv/bin/python", f"benchmarks/{body['script']}", *body["argv"]])
    lines = [
        f"### {body['script']}",
        "",
        f"`{command}` — {when}, {body['seconds']:.0f} s; {machine['cpus']} CPUs"
        f" ({machine['cpu_model']}), Python {machine['python']},"
        f" native extension {machine['native_extension']},"
        f" calibration `sum(range(1000))` = {machine['calibration_us_sum_range_1000']} µs;"
        f" {context}.",
        "",
        body["markdown"],
        "",
    ]
    lines += [f"* {note}" for note in body.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=RESULTS_DIR, help="where the JSON files are")
    parser.add_argument("scripts", nargs="*", help="script names (default: all)")
    args = parser.parse_args(argv)
    if args.scripts:
        paths = [args.dir / f"{name.removesuffix('.py')}.json" for name in args.scripts]
    else:
        paths = sorted(p for p in args.dir.glob("*.json") if not p.stem.endswith("-quick"))
    for path in paths:
        print(section(path))


if __name__ == "__main__":
    main(sys.argv[1:])
