"""Opening a key index while another process commits to it never reports it damaged.

An index opened with ``auto_repair`` runs its quick check (meta's row count and checksum
against the rows counted). Read in two statements, the meta could come from before another
process's commit and the count from after it: a consistent index was reported as
``the index holds 1 rows ..., its meta data says 0`` and emptied (then rebuilt from the log:
time lost, found in a ``bench_peer`` run of 8 writer processes). Real processes, one
partition, the check run in a loop against a writer committing all the while."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from eventlane.log import LogStore
from eventlane.log.embedded.key_index import INDEX_SUFFIX, KeyIndex

WRITER = r"""
import sys, time
from pathlib import Path
from eventlane.log import Expect, LogStore
data, seconds = sys.argv[1], float(sys.argv[2])
with LogStore(Path(data)) as log:
    heads = {}
    Path(data, "ready").touch()
    stop = time.monotonic() + seconds
    n = 0
    while time.monotonic() < stop and not Path(data, "stop").exists():
        key = b"k%d" % (n % 50)
        r = log.append("t", 0, [(key, b"v", (), None)], expect=Expect(key, heads.get(key)),
                       atomic=True)
        heads[key] = r.base_offset
        n += 1
"""

CHECKS = 3000
SECONDS = 60.0


def test_the_quick_check_never_finds_a_committing_index_damaged(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with LogStore(data) as log:
        log.create_topic("t", 1, {"flush_policy": "os"})
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(data), str(SECONDS)])
    try:
        deadline = time.monotonic() + 60
        while not (data / "ready").exists() or not list(data.rglob("*" + INDEX_SUFFIX)):
            assert writer.poll() is None and time.monotonic() < deadline, "writer never began"
            time.sleep(0.01)
        (path,) = data.rglob("*" + INDEX_SUFFIX)
        with LogStore(data) as log:
            index = KeyIndex(log, "t", 0, path, mode=None, auto_repair=False)
            try:
                problems = []
                for _ in range(CHECKS):
                    assert writer.poll() is None, "the writer stopped before the checks ended"
                    problem = index._quick_check()
                    if problem is not None:
                        problems.append(problem)
            finally:
                index.close()
        assert problems == [], f"{len(problems)} of {CHECKS} checks: {problems[:3]}"
    finally:
        (data / "stop").touch()
        writer.wait(30)
