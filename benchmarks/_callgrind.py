"""Instructions counted by valgrind's callgrind: user-space instructions of a child process,
the same at any load (the ``instructions_*.py`` benchmarks' measure)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALGRIND = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")


def collected(stderr: str) -> int:
    """The instruction count callgrind printed on a child's stderr."""
    found = re.search(r"Collected : (\d+)", stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind: {stderr[-500:]}")
    return int(found.group(1))


def count_child(code: str, *args: str) -> int:
    """Instructions of ``python -c code *args`` under callgrind, run from the repository root
    with a fixed hash seed."""
    done = subprocess.run(
        [*VALGRIND, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)},
    )
    return collected(done.stderr)
