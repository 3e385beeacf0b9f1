"""The first event a process logs is never logged while it holds a file lock (issue 26).

Logging loads structlog on first use (seconds on a loaded host); a process that does it
holding a partition's append lock stops every appender of every process meanwhile. A child
process whose first event is logged under the append lock (the truncation of a dead
appender's unacknowledged tail, found by the next open or append) must load structlog only after it
let go of the lock, and still log the event. An import hook of the child observes whether
the lock is held (``/proc/locks``) when structlog is imported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from eventlane.log import LogStore
from eventlane.log.embedded.segment import log_path

CHILD = """
import os, sys
from eventlane.log import LogStore
from eventlane.observability import configure_logging
configure_logging()  # as an entry point does: structlog renders the lines, loaded at the first
LOCK = os.stat(sys.argv[2]).st_ino
seen = []
def holding() -> bool:  # whether this process holds a flock on the append lock's file
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "FLOCK" in fields and str(os.getpid()) in fields:
                if any(x.endswith(":%d" % LOCK) for x in fields):
                    return True
    return False
class Spy:  # sees the import of structlog, and whether the append lock is held then
    def find_spec(self, name, path=None, target=None):
        if name == "structlog":
            seen.append(holding())
        return None
assert "structlog" not in sys.modules
sys.meta_path.insert(0, Spy())
with LogStore(sys.argv[1]) as log:  # the open or the append truncates the tail: a warning
    log.append("t", 0, [(None, b"after", (), None)])
print(seen, flush=True)
"""


def test_the_first_event_is_logged_after_the_lock_is_released(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with LogStore(data) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [(None, b"acked", (), None)])
        segment = log_path(log.partition("t", 0).dir, 0)
        lock = log.partition("t", 0).dir / "lock"
    with segment.open("ab") as f:  # a dead appender's bytes, never acknowledged
        f.write(b"\x00" * 100)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(data), str(lock)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"EVENTLANE_LOG_LEVEL": "warning", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert out.stdout.strip() == "[False]", (out.stdout, out.stderr)
    assert "truncating unacknowledged tail" in out.stderr
    with LogStore(data) as log:
        records, _ = log.read("t", 0, 0)
        assert [r.value for r in records] == [b"acked", b"after"]
