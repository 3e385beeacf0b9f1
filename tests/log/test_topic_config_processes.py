"""Topic configuration changed by several processes at once loses no acknowledged update.

``alter_topic`` is a read-modify-write of ``topic.json``. Real processes (started together,
each with its own ``LogStore`` on one data directory) apply many updates: each to a config
key of its own, all to one shared key, and one also raises the partition count. The model:
a process's updates are ordered by its counter, so at the end each own key holds its
process's last acknowledged value, the shared key holds the last acknowledged value of one
of the processes, and the partition count is the highest one acknowledged. No call may fail
(a raw ``FileNotFoundError`` from a shared temporary file name was one of the failures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from eventlane.log import LogStore

ROOT = Path(__file__).resolve().parents[2]
CALLS = 150
"""Updates per process (the defect showed with 2 x 300; a few dozen collide already)."""

_CHILD = textwrap.dedent(
    """
    import json, sys
    from eventlane.log import LogStore

    data, proc, own, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    base = (proc + 1) * 1_000_000
    log = LogStore(data)
    sys.stdin.readline()  # start together
    acked = {own: None, "retention_bytes": None, "partitions": None}
    errors, lost = [], 0
    for i in range(calls):
        value = base + i
        partitions = 1 + i // 25 if proc == 0 and i % 25 == 0 else None
        try:
            log.alter_topic(
                "t", partitions=partitions, config={own: value, "retention_bytes": value}
            )
        except Exception as exc:
            errors.append(repr(exc)[:200])
            continue
        acked[own] = acked["retention_bytes"] = value
        if partitions is not None:
            acked["partitions"] = partitions
        seen = getattr(LogStore(data).topic_config("t"), own)
        lost += seen != value  # nobody else writes this key: our update must be there
    log.close()
    print(json.dumps({"acked": acked, "errors": errors, "lost": lost}))
    """
)

OWN_KEYS = ("retention_ms", "segment_ms", "delete_retention_ms")


def test_concurrent_alter_topic_loses_no_acknowledged_update(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with LogStore(data) as log:
        log.create_topic("t", 1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(data), str(i), key, str(CALLS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for i, key in enumerate(OWN_KEYS)
    ]
    results = []
    try:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err.decode()[-2000:]
            results.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for key, result in zip(OWN_KEYS, results, strict=True):
        assert result["errors"] == [], f"{key}: {len(result['errors'])} failed calls"
        assert result["lost"] == 0, f"{key}: {result['lost']} acknowledged updates not visible"
    with LogStore(data) as log:
        final = log.topic_config("t")
        partitions = log.partition_count("t")
    for key, result in zip(OWN_KEYS, results, strict=True):
        assert getattr(final, key) == result["acked"][key], key
    assert final.retention_bytes in {r["acked"]["retention_bytes"] for r in results}
    assert partitions == results[0]["acked"]["partitions"] == 1 + (CALLS - 1) // 25
    assert sorted(p.name for p in (data / "topics" / "t").iterdir() if p.name.isdigit()) == [
        str(p) for p in range(partitions)
    ]
    leftovers = [p.name for p in (data / "topics" / "t").iterdir() if "tmp" in p.name]
    assert leftovers == []
