"""JetStream's instruments (issue 31) count what was done, on the real 3-node cluster: a
child process with metrics on serves ``/metrics`` (prometheus_client's own endpoint) after
appending ``N`` single records, one batch and one conditional append the server refuses;
the test scrapes and parses it with prometheus_client and holds the counts against the
records read back from the cluster. The dashboard's JetStream queries name metrics of
this scrape."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog

ROOT = Path(__file__).resolve().parents[2]
SINGLES = 25
BATCH = 40

CHILD = r"""
import json, sys
from eventlane.errors import ConcurrencyError
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.types import Expect
from eventlane.metrics import enable, serve
url, namespace, singles, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
enable()
endpoint = serve(0)
with JetStreamLog.from_url(url, namespace=namespace) as js:
    js.create_topic("t", 1)
    for i in range(singles):
        js.append("t", 0, [(b"k%d" % i, b"v" * i, (), None)])
    js.append("t", 0, [(b"b", b"x" * 10, (("h", b"1"),), None)] * batch)
    refused = 0
    try:  # k0's last record is at offset 0: expecting none is refused by the server
        js.append("t", 0, [(b"k0", b"late", (), None)], expect=Expect(b"k0", None))
    except ConcurrencyError:
        refused = 1
print(json.dumps({"port": endpoint.port, "refused": refused}), flush=True)
sys.stdin.readline()
endpoint.stop()
"""


def test_appends_publishes_and_refusals_are_counted(cluster: LocalCluster, namespace: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, cluster.url, namespace, str(SINGLES), str(BATCH)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        told = json.loads(line)
        with urllib.request.urlopen(f"http://127.0.0.1:{told['port']}/metrics", timeout=30) as r:
            text = r.read().decode()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + json.dumps(dict(sorted(sample.labels.items())))
            samples[key] = samples.get(key, 0.0) + float(sample.value)

    def get(name: str, **labels: str) -> float:
        return samples.get(name + json.dumps(dict(sorted(labels.items()))), 0.0)

    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        stored = js.read("t", 0, 0, max_bytes=1 << 24)[0]
    assert told["refused"] == 1
    assert len(stored) == SINGLES + BATCH  # the refused one is not there
    payload = sum(len(r.value or b"") for r in stored)

    assert get("eventlane_log_appended_records_total", topic="t") == SINGLES + BATCH
    assert get("eventlane_log_appended_bytes_total", topic="t") == payload
    assert get("eventlane_log_append_seconds_count", topic="t") == SINGLES + 1
    assert get("eventlane_jetstream_publish_seconds_count") == SINGLES + 1
    assert get("eventlane_jetstream_publish_errors_total", outcome="refused") == 1
    assert get("eventlane_jetstream_publish_errors_total", outcome="unknown") == 0

    dashboard = (ROOT / "docs" / "grafana" / "eventlane.json").read_text()
    queried = set(re.findall(r"eventlane_jetstream_[a-z_]+", dashboard))
    exported = {key.split("{")[0] for key in samples}
    assert queried and queried <= exported, queried - exported
