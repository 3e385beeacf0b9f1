"""What metrics cost a single-record append, counted in instructions (load-independent).

    python benchmarks/instructions_append.py [--small 1000] [--large 6000]

CPU-time ratios on a shared machine swing more than the 3 % bar (issue 31); valgrind's
callgrind counts the user-space instructions a process executes, the same at any load. Each
mode (metrics ``off``: enabled then switched off, as the in-process toggle of
bench_observability.py; ``on``) runs in a fresh process under callgrind twice, appending
``--small`` and ``--large`` records of 100 bytes to a ``flush_policy="os"`` topic;
instructions per append = the difference / (large - small), start-up cancelled out. Kernel
time (the write syscalls) is not counted, so the ratio here is of user-space work only.
Needs ``valgrind`` (Debian package). Takes ~4 minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALGRIND = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")
CHILD = r"""
import sys, tempfile
import framework.metrics as fm
mode, n = sys.argv[1], int(sys.argv[2])
fm.enable()
fm.M.on = mode == "on"
from framework.log import LogStore
log = LogStore(tempfile.mkdtemp())
log.create_topic("bench", 1, {"flush_policy": "os"})
value = b"v" * 100
for i in range(n):
    log.append("bench", 0, [(b"k%d" % (i % 1000), value, (), None)])
"""


def instructions(mode: str, n: int) -> int:
    done = subprocess.run(
        [*VALGRIND, sys.executable, "-c", CHILD, mode, str(n)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)},
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=6000)
    args = parser.parse_args()
    per = {}
    for mode in ("off", "on"):
        per[mode] = (instructions(mode, args.large) - instructions(mode, args.small)) / (
            args.large - args.small
        )
        print(f"{mode}: {per[mode]:,.0f} instructions an append", flush=True)
    print(f"metrics on / off: {per['on'] / per['off']:.3f}x (+{per['on'] - per['off']:,.0f})")


if __name__ == "__main__":
    main()
