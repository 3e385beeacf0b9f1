"""Stopping by PID across processes: a node restarted by one process (a test) and stopped
by another (``eventlane kafka down``) is a zombie until its parent reaps it; the stopping
process must count it as gone (it waited forever before)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from eventlane.log.processes import alive


def test_another_processs_zombie_child_counts_as_stopped() -> None:
    child = subprocess.Popen(["sleep", "100"])
    try:
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.3)  # exited, not reaped: a zombie of this process
        seen = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from eventlane.log.processes import alive; print(alive({child.pid}))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert seen.stdout.strip() == "False"
    finally:
        child.wait()
    assert not alive(child.pid)
