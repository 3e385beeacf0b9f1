"""Starting and talking to the child processes of ``store_procs.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

PROCS = Path(__file__).with_name("store_procs.py")
START_TIMEOUT_S = 120.0
"""A child may take long to start on a noisy 2-core machine."""

_STDERR: dict[int, IO[str]] = {}


def spawn(role: str, *, env: dict[str, str] | None = None, **args: Any) -> subprocess.Popen[str]:
    """Start ``store_procs.py ROLE`` with line-buffered text pipes on stdin and stdout; its
    stderr (logs) goes to an unnamed temporary file, read back by :func:`stderr_of`.
    ``env``: extra environment variables (e.g. ``EVENTLANE_PAUSES``)."""
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(
        [sys.executable, str(PROCS), role, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        bufsize=1,
        env={**os.environ, **env} if env else None,
    )
    _STDERR[proc.pid] = err
    return proc


def stderr_of(proc: subprocess.Popen[str]) -> str:
    """The last few KiB the child wrote to stderr."""
    err = _STDERR.get(proc.pid)
    if err is None:
        return ""
    err.seek(0)
    return err.read()[-4000:]


def read_line(proc: subprocess.Popen[str]) -> str:
    """The child's next stdout line; fails with its stderr if it ended instead."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=START_TIMEOUT_S)
        raise AssertionError(f"child ended (rc={proc.returncode}): {stderr_of(proc)}")
    return line.strip()


def send(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def finish(proc: subprocess.Popen[str], timeout: float = 300.0) -> None:
    """Close the child's pipes and wait for it; fail with its stderr on a non-zero status."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    proc.wait(timeout=timeout)
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.returncode != 0:
        raise AssertionError(f"child failed (rc={proc.returncode}): {stderr_of(proc)}")
    close(proc)


def close(proc: subprocess.Popen[str]) -> None:
    """Forget the child's stderr file (after a kill, or once checked)."""
    err = _STDERR.pop(proc.pid, None)
    if err is not None:
        err.close()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None and not stream.closed:
            stream.close()
