"""User-space instructions per command of N writer processes on one partition (callgrind).

    python benchmarks/instructions_writers.py [--processes 1,4] [--small 40] [--large 160]

Issue 36 item 1 asks for less CPU per command when several processes write one partition.
CPU time on this shared machine moves with the load; valgrind's callgrind counts the
user-space instructions each worker executes, the same at any load. Each worker runs
``bench_peer.py``'s workload (load, decide, durable conditional save; its own accounts,
5 commands each) under callgrind; all start together once every one has opened the
application and run one command. Instructions per command = (large - small) / (N x extra
commands): start-up and the first command cancel out. Kernel time (fsync, flock waits,
context switches) is not counted: this is the Python and SQLite work a command costs.
Under valgrind every worker runs ~50x slower, so which records of others fall between two
of a worker's commands is not what it is at full speed; the count is the per-command
work of the paths taken. Needs ``valgrind``; ~3 minutes for 1 process, ~10 for 4 on two
loaded cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _callgrind import ROOT, VALGRIND, collected

WORKER = r"""
import os, sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[6], sys.argv[6] + "/benchmarks"]
import bench_peer as bp
data, idx, count, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[4]), sys.argv[5]
bp.quiet_logs()
app = bp.el_app(Path(data))
app.execute(bp.Account, f"warm-{idx}", bp.Account.command, create=True)
Path(f"{go}.ready{idx}").touch()
while not os.path.exists(go):
    time.sleep(0.01)
bp.el_commands(app, [f"acc-{idx}-{i}" for i in range(count // 5)], 5)
app.close()
"""
SETUP = r"""
import sys
from pathlib import Path
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/benchmarks"]
import bench_peer as bp
bp.el_app(Path(sys.argv[1])).close()
"""


def instructions(root: Path, processes: int, commands: int) -> int:
    """Instructions of ``processes`` workers running ``commands`` commands each (all of
    each worker's process, start-up included)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    data, go = root / "data", str(root / "go")
    subprocess.run([sys.executable, "-c", SETUP, str(data), str(ROOT)], check=True)
    worker = (*VALGRIND, sys.executable, "-c", WORKER, str(data))
    rest = (str(processes), str(commands), go, str(ROOT))
    procs = [
        subprocess.Popen([*worker, str(i), *rest], stderr=subprocess.PIPE, text=True)
        for i in range(processes)
    ]
    try:
        deadline = time.monotonic() + 600
        while not all(os.path.exists(f"{go}.ready{i}") for i in range(processes)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit("a worker did not start")
            time.sleep(0.05)
        Path(go).touch()
        total = 0
        for p in procs:
            _, err = p.communicate(timeout=3600)
            if p.returncode:
                raise SystemExit(f"no instruction count from valgrind: {err[-500:]}")
            total += collected(err)
        return total
    finally:
        for p in procs:  # stopped by PID if anything above failed
            if p.poll() is None:
                p.kill()
                p.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", default="1,4", help="writer process counts, e.g. 1,4")
    p.add_argument("--small", type=int, default=40, help="commands per worker, small run")
    p.add_argument("--large", type=int, default=160, help="commands per worker, large run")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="instr-writers-") as tmp:
        for n in (int(x) for x in args.processes.split(",") if x):
            small = instructions(Path(tmp) / f"s{n}", n, args.small)
            large = instructions(Path(tmp) / f"l{n}", n, args.large)
            per = (large - small) / (n * (args.large - args.small))
            print(f"{n} writer process(es): {per:,.0f} instructions per command", flush=True)


if __name__ == "__main__":
    main()
