"""The hot paths' instruments (issue 31) count what was done: two real processes race
commands on one aggregate with metrics on (prometheus_client's multiprocess mode, as a
supervisor's workers do); one endpoint serves both, and its scrape, parsed by
prometheus_client, is held against independent counts: the commands each process ran (its
command function counts every attempt), the records in the log, the segment bytes on disk.

* appends and append latency: one append per stored command, its records, its bytes (the
  batches the segment files grew by);
* fsyncs and group-commit sizes: every record made durable by exactly one counted fsync;
  at most one fsync per append or refused append;
* conflicts and retries: every attempt that was not stored was a conflict, and each
  conflict was retried (no command ran out of attempts).

The shipped Grafana dashboard's log and store queries name metrics of this scrape (the
projection queries are checked against a projection's endpoint, tests/cli/test_metrics.py).
"""

from __future__ import annotations

import re
import urllib.request
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from store_domain import Counter, make_app, raw_streams
from store_helpers import finish, read_line, send, spawn

from eventlane.metrics import serve

ROOT = Path(__file__).resolve().parents[2]
PER_PROCESS = 100
INITIAL = 3
Samples = dict[str, list[tuple[dict[str, str], float]]]


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return samples


def _sum(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


def _segment_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in (data / "topics").rglob("*.log"))


def test_two_racing_processes_are_counted_exactly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    with make_app(data) as app:  # seeded without metrics: not counted
        counter = Counter("hot")
        for _ in range(INITIAL):
            counter.increment(1, "seed")
        app.save(counter)
        topic = app.names.topic(Counter.topic)
    before = _segment_bytes(data)

    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    procs = [
        spawn(
            "execute",
            env=env,
            data=str(data),
            aggregate="hot",
            count=PER_PROCESS,
            writer=f"p{i}",
            metrics=True,
        )
        for i in (1, 2)
    ]
    for proc in procs:
        assert read_line(proc) == "R"
    for proc in procs:
        send(proc, "GO")
    done = [read_line(proc).split() for proc in procs]
    for proc in procs:
        finish(proc)
    attempts = sum(int(d[1]) for d in done)
    stored = 2 * PER_PROCESS
    conflicts = attempts - stored  # every attempt not stored lost a race
    assert conflicts > 0, "the processes did not race"
    with make_app(data) as app:
        assert len(raw_streams(app.log, Counter.topic)["hot"]) == INITIAL + stored
    grown = _segment_bytes(data) - before

    endpoint = serve(0, multiproc_dir=str(metrics_dir))
    try:
        samples = _scrape(endpoint.port)
    finally:
        endpoint.stop()

    def total(name: str, **labels: str) -> float:
        return _sum(samples, name, topic=topic, **labels)

    assert total("eventlane_log_appended_records_total") == stored
    assert total("eventlane_log_appended_bytes_total") == grown > 0
    assert total("eventlane_log_append_seconds_count") == stored
    assert 0 < total("eventlane_log_append_seconds_sum") < stored * 10.0
    # group commit: each record published by one counted fsync, at most one per append
    assert total("eventlane_log_fsync_records_sum") == stored
    fsyncs = total("eventlane_log_fsync_seconds_count")
    assert 1 <= fsyncs <= stored + conflicts
    assert total("eventlane_log_fsync_records_count") <= fsyncs
    assert total("eventlane_store_append_conflicts_total") == conflicts
    assert total("eventlane_store_command_retries_total", reason="conflict") == conflicts
    assert total("eventlane_store_command_retries_total", reason="unavailable") == 0

    # the dashboard's log and store queries name metrics this endpoint exports
    dashboard = (ROOT / "docs" / "grafana" / "eventlane.json").read_text()
    queried = set(re.findall(r"eventlane_(?:log_append|log_fsync|store_)[a-z_]*", dashboard))
    assert queried, "the dashboard shows no append, fsync or conflict panel"
    assert queried <= set(samples), queried - set(samples)
